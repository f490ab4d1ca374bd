"""The grid of model shapes the trainer generators run with `--grid NAME` (tests/data/trainers/grid/README.md).

Each generator's own code path runs unchanged with these sizes in place of its common model (hidden 64, 4 heads,
2 kv heads, 2 layers, ffn 192, vocab 256): the shapes exercise what a layout conversion depends on -- heads per kv
head (torchtitan 0.3's fused wqkv interleave, fms's qkv_fused, OLMo's att_proj), head_dim (the rotate-half rows of
OLMo-core, OLMo, HF), the number of kv heads, layers, and tensor sizes that cut ZeRO partitions at other places.

The generator children (torchrun) see the grid through the environment variable FSDP_GRID, which `--grid NAME`
sets before anything is launched, so every phase of a job builds the same model.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
ROOT = os.path.join(REPO, "tests", "data", "trainers", "grid")
BATCH = os.path.join(ROOT, "batch.safetensors")

NORM_EPS, ROPE_THETA = 1e-5, 10000.0
CONFIGS = {
    # MHA: as many kv heads as q heads (heads_per_kv 1), head_dim 16, 3 layers
    "mha": dict(dim=48, n_layers=3, n_heads=3, n_kv_heads=3, head_dim=16, ffn_hidden=80, vocab=96),
    # MQA: one kv head for 4 q heads, head_dim 8, 1 layer
    "mqa": dict(dim=32, n_layers=1, n_heads=4, n_kv_heads=1, head_dim=8, ffn_hidden=56, vocab=100),
    # GQA with 3 q heads per kv head, head_dim 8
    "gqa3": dict(dim=48, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=8, ffn_hidden=72, vocab=80),
}
for _c in CONFIGS.values():
    _c.update(norm_eps=NORM_EPS, rope_theta=ROPE_THETA)
    assert _c["dim"] == _c["n_heads"] * _c["head_dim"]  # every system here derives head_dim as dim / heads

# One batch for every grid fixture: 6 rows (1, 2 and 3 ranks take equal rows) of 16 tokens, ids below every
# config's vocab and below vocab - 1 (fms's embedding has padding_idx -1: row vocab-1 never gets a gradient).
B, T = 6, 16
MAX_ID = min(c["vocab"] for c in CONFIGS.values()) - 1  # ids in [0, 79)


# DeepSpeed's saves: 2 ranks for every shape, and 3 ranks for mqa, the one whose partitions are padded at 3 ranks
# (ZeRO-2's flat group of 14432 elements to 14436, a multiple of 2 x 3; ZeRO-3's parameters of 3200, 1024, 256, 32,
# 1792 elements each to a multiple of 3). mha's and gqa3's sizes are all multiples of 6 (hidden 48): at 3 ranks
# they would only be cut elsewhere, for 3 MB more data.
DEEPSPEED_WORLDS = {"mha": (2,), "mqa": (2, 3), "gqa3": (2,)}


def active():
    """The grid config name of this process (FSDP_GRID), or None."""
    n = os.environ.get("FSDP_GRID") or None
    if n is not None and n not in CONFIGS:
        raise SystemExit("FSDP_GRID=%s: not one of %s" % (n, ", ".join(CONFIGS)))
    return n


def select(name):
    """Called by a generator's --grid NAME: every process it launches from now on builds this config."""
    if name not in CONFIGS:
        raise SystemExit("--grid %s: not one of %s" % (name, ", ".join(CONFIGS)))
    os.environ["FSDP_GRID"] = name
    return CONFIGS[name]


def config(name=None):
    return dict(CONFIGS[name or active()])


def batch_file(out):
    """The batch a generator trains on: the grid's one batch under --grid, else its fixture folder's."""
    from pathlib import Path

    return Path(BATCH) if active() else Path(out) / "batch.safetensors"


def out_dir(system, name=None):
    return os.path.join(ROOT, system, name or active())


def write_batch(path=BATCH):
    """tests/data/trainers/grid/batch.safetensors: torch.Generator().manual_seed(0), randint(0, 79, (6, 17)),
    input_ids = seq[:, :16], labels = seq[:, 1:], int32. Written the same by every call."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, MAX_ID, (B, T + 1), generator=g, dtype=torch.int64)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({"input_ids": seq[:, :T].to(torch.int32).contiguous(),
               "labels": seq[:, 1:].to(torch.int32).contiguous()}, path)
    return path


def write_config(out, system, own=None, name=None):
    """config.json: the model in plain terms (the keys the tests read), then what the system was given."""
    name = name or active()
    doc = dict(CONFIGS[name])
    doc.update(grid=name, system=system, tied=False, bias=False, dtype="float32",
               batch={"file": "../../batch.safetensors", "rows": B, "seq_len": T},
               training={"optimizer": "AdamW", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                         "max_grad_norm": 1.0, "schedule": "constant", "steps_before_save": 3,
                         "steps_after_resume": 2})
    if own is not None:
        doc["system_config"] = own
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")


def write_expected(out, runs):
    """expected.json: {"wsN": {losses_before_save, resumed_losses, resumed_grad_norms, ...}} for each save."""
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(runs, f, indent=1)
        f.write("\n")
