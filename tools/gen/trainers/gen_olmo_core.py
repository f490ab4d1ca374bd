#!/usr/bin/env python3
"""Generate the OLMo-core 3.0.0 checkpoint fixtures under tests/data/trainers/olmo-core-3.0/.

Command line (from the repository root, CPU only, takes about a minute):

    OMP_NUM_THREADS=1 \
    PYTHONPATH=/work/shared/seed-systems/stubs:/work/seedpkgs/olmocore \
    /work/torchenv/bin/python tools/gen/trainers/gen_olmo_core.py [OUT_DIR]

OUT_DIR defaults to tests/data/trainers/olmo-core-3.0.  It (re)writes
    batch.safetensors, config.json, ws1/, ws2/, expected.json,
    ws1_after_resume_step.safetensors, hf/
(README.md is hand written).  For each world size N in (1, 2) it runs, with
`torchrun --nproc_per_node N` (gloo), one process group that trains 3 steps and saves with
olmo_core.distributed.checkpoint.save_model_and_optim_state, then a FRESH process group that
loads with load_model_and_optim_state(strict=True) and runs 2 more steps.

The model is OLMo-core's own TransformerConfig.llama_like(...) built on the meta device,
Transformer.apply_fsdp(dp_mesh) (FSDP2, world 1 and 2), Transformer.init_weights (seed 0);
the optimizer is OLMo-core's AdamWConfig(...).build(model) (a torch.optim.AdamW with an extra
'initial_lr' field in its param group), gradient clipping exactly as
TransformerTrainModule._clip_grad_norm, loss exactly as TransformerTrainModule.train_batch
(loss_reduction="sum", loss_div_factor=#local label tokens, FSDP averages the gradients).

Byte-for-byte the .distcp files differ between runs (torch.save zip records, the save_id uuid
inside .metadata); every tensor value and every key/shape/offset is reproduced exactly.

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all):
`gen_olmo_core.py --grid NAME` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py) runs the same phases
on 2 ranks with that shape and the grid's batch, into tests/data/trainers/grid/olmo-core-3.0/NAME/: ws2/,
config.json, expected.json.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "trainers" / "olmo-core-3.0"
PYTHONPATH = "/work/shared/seed-systems/stubs:/work/seedpkgs/olmocore"
TORCHRUN = "/work/torchenv/bin/torchrun"
PY = "/work/torchenv/bin/python"

# Common model / training settings (fsdp-run issue 38).
MODEL = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab=256, ffn_hidden=192,
             norm_eps=1e-5, rope_theta=10000.0, tied=False, head_dim=16)
OPTIM = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MAX_GRAD_NORM = 1.0
B, T = 4, 32
STEPS_BEFORE, STEPS_AFTER = 3, 2
# RemoteFileSystemWriter writes `thread_count` files per rank (default min(16, cpu_count+4),
# i.e. machine dependent); fixed here so the layout is reproducible: __{rank}_{0..3}.distcp.
SAVE_THREADS = 4

import grid as _grid  # noqa: E402  (tools/gen/trainers/grid.py: --grid NAME, seen by the children as FSDP_GRID)


def apply_grid():
    """A grid shape in place of the common model, and the grid's batch."""
    global B, T
    MODEL.update({k: v for k, v in _grid.config().items() if k in MODEL})
    B, T = _grid.B, _grid.T


if _grid.active():
    apply_grid()


batch_file = _grid.batch_file


# ----------------------------------------------------------------------------------------
# shared with check_olmo_core.py
# ----------------------------------------------------------------------------------------
def model_config():
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.nn.feed_forward import FeedForwardConfig

    return TransformerConfig.llama_like(
        d_model=MODEL["dim"],
        vocab_size=MODEL["vocab"],
        n_layers=MODEL["n_layers"],
        n_heads=MODEL["n_heads"],
        n_kv_heads=MODEL["n_kv_heads"],
        rope_theta=int(MODEL["rope_theta"]),
        layer_norm_eps=MODEL["norm_eps"],
        feed_forward=FeedForwardConfig(hidden_size=MODEL["ffn_hidden"], bias=False),
    )


def optim_config():
    from olmo_core.optim import AdamWConfig

    return AdamWConfig(lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"],
                       weight_decay=OPTIM["weight_decay"])


def init_dist():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    ws = dist.get_world_size()
    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("dp",))
    return dist.get_rank(), ws, mesh


def build(mesh):
    """OLMo-core's usual order (train_module.common.parallelize_model): meta build, FSDP, init."""
    import torch

    model = model_config().build(init_device="meta")
    model.apply_fsdp(dp_mesh=mesh)
    model.init_weights(max_seq_len=T, device=torch.device("cpu"))
    optim = optim_config().build(model)
    return model, optim


def load_batch(path):
    from safetensors.torch import load_file

    d = load_file(str(path))
    return d["input_ids"], d["labels"]


def local_rows(x, rank, ws):
    n = x.shape[0] // ws
    return x[rank * n:(rank + 1) * n]


def train_step(model, optim, inp, lab):
    """One step as TransformerTrainModule.train_batch + optim_step (no scheduler: constant lr)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.tensor import DTensor

    optim.zero_grad(set_to_none=True)
    n_tok = (lab != -100).sum()
    out = model(inp.long(), labels=lab.long(), loss_reduction="sum", loss_div_factor=n_tok,
                return_logits=False)
    out.loss.backward()
    # TransformerTrainModule._clip_grad_norm
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    total = nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    nn.utils.clip_grads_with_norm_(params, MAX_GRAD_NORM, total)
    optim.step()
    loss = out.ce_loss.detach().clone()
    dist.all_reduce(loss)  # ReduceType.mean over ranks, as the trainer records it
    loss /= dist.get_world_size()
    return float(loss.item()), float(total.item())


def full_weights(model):
    from torch.distributed.tensor import DTensor

    out = {}
    for n, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[n] = t.detach().clone().contiguous().float()
    return out


def expected_keys(model, optim, flatten=False):
    """The flat DCP keys load_model_and_optim_state asks for (to check completeness)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from olmo_core.distributed.checkpoint import _prepare_state_dict

    sd = _prepare_state_dict(model, optim, flatten_optimizer_state=flatten)
    flat, _ = flatten_state_dict(sd)
    return set(flat.keys())


def resume_and_run(ckpt_dir, batch_path, after_weights_path=None):
    """Load strictly with OLMo-core's loader, run STEPS_AFTER steps. Returns dict (rank 0)."""
    import torch
    import torch.distributed as dist
    from olmo_core.distributed.checkpoint import (get_checkpoint_metadata,
                                                  load_model_and_optim_state)

    rank, ws, mesh = init_dist()
    model, optim = build(mesh)
    # completeness: the checkpoint must hold exactly the keys the model+optim need
    have = set(get_checkpoint_metadata(ckpt_dir).state_dict_metadata.keys())
    # save_model_and_optim_state's default writes the optimizer unflattened
    # (optim.param_groups.0.<field>); the Trainer's Checkpointer (TransformerTrainModule)
    # writes it flattened (optim.param_groups.<fqn>.<field>).  Detect it as
    # TransformerTrainModule.state_dict_to_load does.
    flatten = not any(k.startswith("optim.param_groups.0.") for k in have)
    want = expected_keys(model, optim, flatten)
    if want != have:
        raise RuntimeError(f"checkpoint keys differ: missing {sorted(want - have)}, "
                           f"unexpected {sorted(have - want)}")
    load_model_and_optim_state(ckpt_dir, model, optim, strict=True,
                               flatten_optimizer_state=flatten)
    # every parameter must have its full AdamW state after the load
    for p in model.parameters():
        st = optim.state.get(p, {})
        for k in ("step", "exp_avg", "exp_avg_sq"):
            if k not in st:
                raise RuntimeError(f"optimizer state '{k}' missing after load")
    step0 = float(next(iter(optim.state.values()))["step"])
    inp, lab = load_batch(batch_path)
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    losses, norms = [], []
    for i in range(STEPS_AFTER):
        l, g = train_step(model, optim, inp, lab)
        losses.append(l)
        norms.append(g)
        if i == 0 and after_weights_path is not None:
            w = full_weights(model)
            if rank == 0:
                from safetensors.torch import save_file
                save_file(w, str(after_weights_path))
    dist.barrier()
    return dict(loaded_step=step0, flattened_optim=flatten, resumed_losses=losses, resumed_grad_norms=norms)


# ----------------------------------------------------------------------------------------
# workers (run under torchrun)
# ----------------------------------------------------------------------------------------
def worker_train(out, ws_name):
    import torch.distributed as dist
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    rank, ws, mesh = init_dist()
    model, optim = build(mesh)
    inp, lab = load_batch(batch_file(out))
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    losses = [train_step(model, optim, inp, lab)[0] for _ in range(STEPS_BEFORE)]
    # checkpoint path is given relative to OUT so .metadata's storage_meta.checkpoint_id is "wsN"
    os.chdir(out)
    save_model_and_optim_state(ws_name, model, optim, save_overwrite=True,
                               thread_count=SAVE_THREADS)
    if rank == 0:
        (out / f".{ws_name}_before.json").write_text(json.dumps(losses))
    dist.barrier()
    dist.destroy_process_group()


def worker_resume(out, ws_name):
    import torch.distributed as dist

    # ws2's weights go to a hidden file: compared with ws1's, then deleted (size budget)
    after = (f"{ws_name}_after_resume_step.safetensors" if ws_name == "ws1"
             else f".{ws_name}_after_resume_step.safetensors")
    r = resume_and_run(out / ws_name, batch_file(out), None if _grid.active() else out / after)
    if dist.get_rank() == 0:
        (out / f".{ws_name}_resume.json").write_text(json.dumps(r))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------
# orchestration (plain process)
# ----------------------------------------------------------------------------------------
def write_batch(out):
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, MODEL["vocab"], (B, T + 1), generator=g, dtype=torch.int64)
    save_file({"input_ids": seq[:, :T].to(torch.int32).contiguous(),
               "labels": seq[:, 1:].to(torch.int32).contiguous()}, str(out / "batch.safetensors"))


def write_config(out):
    cfg = model_config()
    import olmo_core.version as v
    import torch

    doc = {
        "trainer": "ai2-olmo-core",
        "trainer_version": v.VERSION,
        "torch_version": torch.__version__,
        "model": dict(MODEL),
        "rope_order": "rotate_half",
        "rope_order_source": "olmo_core/nn/rope.py RotaryEmbedding._rotate_half + "
                             "_get_rotary_embedding (cat(freqs, freqs)): pairs (x[j], x[j+hd/2])",
        "block": "pre-norm Llama (TransformerBlockType.default: h = x + attn(attention_norm(x)); "
                 "out = h + ffn(feed_forward_norm(h))), no q/k norm, SwiGLU w2(silu(w1 x) * w3 x)",
        "final_norm": "lm_head.norm (RMSNorm inside the LM head), then lm_head.w_out",
        "optimizer": {"class": "torch.optim.AdamW via olmo_core.optim.AdamWConfig.build",
                      "lr": OPTIM["lr"], "betas": list(OPTIM["betas"]), "eps": OPTIM["eps"],
                      "weight_decay": OPTIM["weight_decay"], "weight_decay_on": "all parameters",
                      "max_grad_norm": MAX_GRAD_NORM, "schedule": "constant (no scheduler)",
                      "foreach": None, "fused": None, "amsgrad": False},
        "training": {"batch": [B, T], "steps_before_save": STEPS_BEFORE,
                     "steps_after_resume": STEPS_AFTER,
                     "loss": "mean CE over all B*T tokens of the global batch"},
        "fsdp": "Transformer.apply_fsdp(dp_mesh=1-D 'dp' mesh of world size) = FSDP2 fully_shard "
                "on each block, embeddings, lm_head, then the root; Shard(0) placements",
        "save": {"function": "olmo_core.distributed.checkpoint.save_model_and_optim_state",
                 "flatten_optimizer_state": False, "thread_count": SAVE_THREADS},
        "olmo_core_config": cfg.as_config_dict() if hasattr(cfg, "as_config_dict") else str(cfg),
    }
    (out / "config.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def torchrun(n, mode, out, ws_name):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1")
    cmd = [TORCHRUN, "--nproc_per_node", str(n), "--master_port", str(29611 + n),
           str(Path(__file__).resolve()), "_worker", mode, str(out), ws_name]
    subprocess.run(cmd, check=True, env=env)


def write_hf(out):
    """OLMo-core's own HF conversion (olmo_core.nn.hf.convert.convert_state_to_hf with a Llama
    config) of the ws1 checkpoint, plus a numeric check that HF Llama gives the same loss."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from olmo_core.distributed.checkpoint import load_model_and_optim_state
    from olmo_core.nn.hf.convert import convert_state_to_hf

    model = model_config().build(init_device="cpu")
    load_model_and_optim_state(out / "ws1", model, None, strict=True)
    hf_cfg = LlamaConfig(vocab_size=MODEL["vocab"], hidden_size=MODEL["dim"],
                         intermediate_size=MODEL["ffn_hidden"],
                         num_hidden_layers=MODEL["n_layers"],
                         num_attention_heads=MODEL["n_heads"],
                         num_key_value_heads=MODEL["n_kv_heads"], head_dim=MODEL["head_dim"],
                         rms_norm_eps=MODEL["norm_eps"], rope_theta=MODEL["rope_theta"],
                         max_position_embeddings=T, tie_word_embeddings=False,
                         attention_bias=False, mlp_bias=False, torch_dtype="float32")
    hf_sd = convert_state_to_hf(hf_cfg, {k: v.detach().clone() for k, v in
                                         model.state_dict().items()})
    hf = LlamaForCausalLM(hf_cfg)
    missing, unexpected = hf.load_state_dict(hf_sd, strict=True), None
    hf.eval()
    model.eval()
    inp, lab = load_batch(out / "batch.safetensors")
    with torch.no_grad():
        a = model(inp.long(), labels=lab.long()).ce_loss.item()
        logits = hf(inp.long()).logits
        b = torch.nn.functional.cross_entropy(logits.view(-1, MODEL["vocab"]),
                                              lab.long().view(-1)).item()
    if abs(a - b) > 1e-5:
        raise RuntimeError(f"HF conversion mismatch: olmo-core loss {a} vs HF {b}")
    shutil.rmtree(out / "hf", ignore_errors=True)
    hf.save_pretrained(str(out / "hf"))
    return a, b


def main_grid(name):
    """--grid NAME: the same train and resume workers on 2 ranks with the grid's shape and batch, into
    tests/data/trainers/grid/olmo-core-3.0/NAME/ (ws2/, config.json, expected.json)."""
    _grid.select(name)
    apply_grid()
    out = Path(_grid.out_dir("olmo-core-3.0")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    _grid.write_batch()
    expected = {}
    for n in (2,):
        ws = f"ws{n}"
        shutil.rmtree(out / ws, ignore_errors=True)
        torchrun(n, "train", out, ws)
        torchrun(n, "resume", out, ws)
        before = json.loads((out / f".{ws}_before.json").read_text())
        res = json.loads((out / f".{ws}_resume.json").read_text())
        (out / f".{ws}_before.json").unlink()
        (out / f".{ws}_resume.json").unlink()
        expected[ws] = {"losses_before_save": before, "resumed_losses": res["resumed_losses"],
                        "resumed_grad_norms": res["resumed_grad_norms"]}
    _grid.write_expected(out, expected)
    cfg = model_config()
    _grid.write_config(out, "ai2-olmo-core 3.0.0 (save_model_and_optim_state, FSDP2)", {
        "TransformerConfig.llama_like": dict(d_model=MODEL["dim"], vocab_size=MODEL["vocab"],
                                             n_layers=MODEL["n_layers"], n_heads=MODEL["n_heads"],
                                             n_kv_heads=MODEL["n_kv_heads"], rope_theta=int(MODEL["rope_theta"]),
                                             layer_norm_eps=MODEL["norm_eps"],
                                             feed_forward="FeedForwardConfig(hidden_size=%d, bias=False)"
                                             % MODEL["ffn_hidden"]),
        "rope_order": "rotate_half", "save_thread_count": SAVE_THREADS,
        "olmo_core_config": cfg.as_config_dict() if hasattr(cfg, "as_config_dict") else str(cfg)})
    print(json.dumps(expected, indent=2))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--grid":
        return main_grid(sys.argv[2])
    out = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    write_batch(out)
    write_config(out)
    expected = {}
    for n in (1, 2):
        name = f"ws{n}"
        shutil.rmtree(out / name, ignore_errors=True)
        torchrun(n, "train", out, name)
        torchrun(n, "resume", out, name)
        before = json.loads((out / f".{name}_before.json").read_text())
        res = json.loads((out / f".{name}_resume.json").read_text())
        (out / f".{name}_before.json").unlink()
        (out / f".{name}_resume.json").unlink()
        expected[name] = {"losses_before_save": before,
                          "resumed_losses": res["resumed_losses"],
                          "resumed_grad_norms": res["resumed_grad_norms"]}
        print(f"{name}: AdamW step after load = {res['loaded_step']}")
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected, indent=2))
    from safetensors.torch import load_file
    w1 = load_file(str(out / "ws1_after_resume_step.safetensors"))
    w2p = out / ".ws2_after_resume_step.safetensors"
    w2 = load_file(str(w2p))
    assert set(w1) == set(w2)
    print("max |ws1 - ws2| weights after the first resumed step:",
          max(float((w1[k] - w2[k]).abs().max()) for k in w1))
    w2p.unlink()
    a, b = write_hf(out)
    print(f"hf check (ws1 checkpoint, full batch): olmo-core loss {a!r}, HF Llama loss {b!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        mode, out, ws_name = sys.argv[2], Path(sys.argv[3]), sys.argv[4]
        {"train": worker_train, "resume": worker_resume}[mode](out, ws_name)
    else:
        main()
