#!/usr/bin/env python3
"""Generate the DeepSpeed 0.19.8 ZeRO-2 / ZeRO-3 checkpoint fixtures under
tests/data/trainers/deepspeed-0.19/zero2/ and .../zero3/.

Command line (from the repository root, CPU only, about 75 s for both stages):

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu PYTHONPATH=/work/seedpkgs/deepspeed \
    /work/torchenv/bin/python tools/gen/trainers/gen_deepspeed.py [--stage 2|3|both] [OUT_DIR]

Other modes (same environment; they only read the fixtures):
    gen_deepspeed.py --describe DIR/zeroS   on-disk report used in the READMEs: files, zip records,
                                            pickle GLOBAL/STACK_GLOBAL names, full key trees, and
                                            every tensor record (storage key, offset, size, stride)
    gen_deepspeed.py --verify DIR/zeroS     rebuilds fp32 weights + exp_avg + exp_avg_sq from the
                                            flat partitions with the README algorithm (no DeepSpeed
                                            code) and compares with wsN_fp32.safetensors bitwise
    gen_deepspeed.py --padding-demo         toy model with odd sizes on 2 ranks (ZeRO-2 and -3):
                                            where the alignment padding goes (not in the fixtures)
    gen_deepspeed.py --negative-tests [DIR] mutated copies: what check_deepspeed.py refuses and
                                            what DeepSpeed alone would silently accept (~3 min)

OUT_DIR defaults to tests/data/trainers/deepspeed-0.19.  For each stage S in (2, 3) it (re)writes
OUT_DIR/zeroS/:
    batch.safetensors, config.json, expected.json, ws1/, ws2/,
    ws1_after_resume_step.safetensors, ws1_fp32.safetensors, ws2_fp32.safetensors
(README.md is hand written from the --describe output).  For each world size N in (1, 2) it runs,
with `torchrun --nproc_per_node N` (gloo), one process group that trains 3 steps and saves with
DeepSpeedEngine.save_checkpoint("wsN", tag="global_step3"), then a FRESH process group that builds
the same engine and loads with DeepSpeedEngine.load_checkpoint("wsN", load_module_strict=True,
load_optimizer_states=True, load_lr_scheduler_states=True) and runs 2 more steps.  wsN_fp32.safetensors
is what the checkpoint's own wsN/zero_to_fp32.py writes when run as its users run it
(`cd wsN && python zero_to_fp32.py . OUT --safe_serialization` -> OUT/model.safetensors).

Model: transformers LlamaForCausalLM(LlamaConfig(hidden 64, 2 layers, 4 heads, 2 kv heads,
vocab 256, intermediate 192, rms eps 1e-5, rope theta 10000, untied, no biases, float32)),
HF's own init under torch.manual_seed(0), built whole on every rank (no zero.Init) and handed to
deepspeed.initialize together with torch.optim.AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8,
weight_decay 0.1, one param group); ds config: fp32 (no fp16/bf16 section), ZeRO stage S,
gradient_clipping 1.0, zero_allow_untested_optimizer true, train_batch_size 4,
micro batch 4/N, no scheduler.  Loss = mean cross-entropy of the logits against the given labels
(no shift) over the rank's rows; DeepSpeed averages gradients over the ranks, so the gradient is
that of the global mean; the recorded loss is the mean over the ranks (= the global mean).
The grad norm is engine.get_global_grad_norm() (the norm before clipping).

On this machine a rerun reproduces every file byte for byte (the .pt zips included).

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all):
`gen_deepspeed.py --grid NAME [--stage 2|3|both]` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py)
runs the same phases on 2 ranks with that shape and the grid's batch, into
tests/data/trainers/grid/deepspeed-0.19-zero{2,3}/NAME/: ws2/ (and ws3/ for mqa), config.json, expected.json.
"""

import json
import os
import pickletools
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "trainers" / "deepspeed-0.19"
PYTHONPATH = "/work/seedpkgs/deepspeed"
TORCHRUN = "/work/torchenv/bin/torchrun"
PY = "/work/torchenv/bin/python"
TAG = "global_step3"

# Common model / training settings (fsdp-run issue 38).
MODEL = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab=256, ffn_hidden=192,
             norm_eps=1e-5, rope_theta=10000.0, tied=False, head_dim=16)
OPTIM = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MAX_GRAD_NORM = 1.0
B, T = 4, 32
STEPS_BEFORE, STEPS_AFTER = 3, 2
INIT_SEED = 0

import grid as _grid  # noqa: E402  (tools/gen/trainers/grid.py: --grid NAME, seen by the children as FSDP_GRID)


def apply_grid():
    """A grid shape in place of the common model, and the grid's batch (6 rows: 2 and 3 ranks)."""
    global B, T
    MODEL.update({k: v for k, v in _grid.config().items() if k in MODEL})
    B, T = _grid.B, _grid.T


if _grid.active():
    apply_grid()


batch_file = _grid.batch_file


def env():
    return dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
                PYTHONFAULTHANDLER="1")


# ----------------------------------------------------------------------------------------
# shared with check_deepspeed.py
# ----------------------------------------------------------------------------------------
def hf_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=MODEL["vocab"], hidden_size=MODEL["dim"],
                       intermediate_size=MODEL["ffn_hidden"],
                       num_hidden_layers=MODEL["n_layers"],
                       num_attention_heads=MODEL["n_heads"],
                       num_key_value_heads=MODEL["n_kv_heads"], head_dim=MODEL["head_dim"],
                       rms_norm_eps=MODEL["norm_eps"], rope_theta=MODEL["rope_theta"],
                       max_position_embeddings=T, tie_word_embeddings=False,
                       attention_bias=False, mlp_bias=False, hidden_act="silu",
                       torch_dtype="float32")


def ds_config(stage, world):
    return {
        "train_batch_size": B,
        "train_micro_batch_size_per_gpu": B // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": MAX_GRAD_NORM,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
    }


def init_dist():
    import torch
    import deepspeed

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def build(stage, world):
    """HF init (seed 0) of the whole model on every rank, torch AdamW, deepspeed.initialize."""
    import torch
    import deepspeed
    from transformers import LlamaForCausalLM

    torch.manual_seed(INIT_SEED)
    model = LlamaForCausalLM(hf_config()).float()
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=OPTIM["lr"], betas=OPTIM["betas"],
                              eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"])
    engine, optimizer, _, sched = deepspeed.initialize(model=model, optimizer=optim,
                                                       config=ds_config(stage, world))
    assert sched is None
    return engine


def load_batch(path):
    from safetensors.torch import load_file

    d = load_file(str(path))
    return d["input_ids"], d["labels"]


def local_rows(x, rank, ws):
    n = x.shape[0] // ws
    return x[rank * n:(rank + 1) * n]


def train_step(engine, inp, lab):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    out = engine(input_ids=inp.long())
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.long().reshape(-1))
    engine.backward(loss)
    engine.step()
    gn = engine.get_global_grad_norm()
    gn = float(gn.item() if torch.is_tensor(gn) else gn)
    l = loss.detach().clone()
    dist.all_reduce(l)
    l /= dist.get_world_size()
    return float(l.item()), gn


def full_weights(engine):
    """Full fp32 weights of the (possibly ZeRO-3 partitioned) module, HF names."""
    import deepspeed

    params = list(engine.module.named_parameters())
    out = {}
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        for n, p in params:
            out[n] = p.detach().clone().contiguous().float()
    return out


class CheckpointError(RuntimeError):
    pass


def preflight(ckpt_dir, stage, ws, tag=None):
    """What DeepSpeed's loader does not check itself (it reads only the caller's own rank file and
    zero-pads a short ZeRO-2 fp32 partition silently): the file set and the saved sizes."""
    import torch

    ckpt_dir = Path(ckpt_dir)
    if tag is None:
        if not (ckpt_dir / "latest").is_file():
            raise CheckpointError(f"{ckpt_dir}/latest missing (DeepSpeed would load nothing)")
        tag = (ckpt_dir / "latest").read_text().strip()
    d = ckpt_dir / tag
    if not d.is_dir():
        raise CheckpointError(f"tag directory {d} missing")
    optim = sorted(p.name for p in d.glob("*_optim_states.pt"))
    want = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ws)]
    if optim != sorted(want):
        raise CheckpointError(f"optimizer files {optim}, want exactly {want}")
    model = sorted(p.name for p in d.glob("*_model_states.pt"))
    want_m = (["mp_rank_00_model_states.pt"] if stage <= 2 else
              [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ws)])
    if model != sorted(want_m):
        raise CheckpointError(f"model-state files {model}, want exactly {want_m}")
    ms = torch.load(d / want_m[0], map_location="cpu", weights_only=False)
    if ms.get("dp_world_size") != ws:
        raise CheckpointError(f"checkpoint dp_world_size {ms.get('dp_world_size')} != world {ws} "
                              "(DeepSpeed cannot re-partition ZeRO optimizer state)")
    for r in range(ws):
        o = torch.load(d / want[r], map_location="cpu", weights_only=False)["optimizer_state_dict"]
        if int(o["zero_stage"]) != stage:
            raise CheckpointError(f"{want[r]}: zero_stage {int(o['zero_stage'])}, want {stage}")
    return tag


def postload_checks(engine, ckpt_dir, tag):
    """After engine.load_checkpoint: every flat partition has its full AdamW state, the saved fp32
    partition had the full size, and (ZeRO-2) the module weights equal the fp32 master."""
    import torch
    import torch.distributed as dist

    stage = engine.zero_optimization_stage()
    rank = dist.get_rank()
    base = engine.optimizer.optimizer
    zo = engine.optimizer
    o = torch.load(Path(ckpt_dir) / tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                   map_location="cpu", weights_only=False)["optimizer_state_dict"]
    if stage <= 2:
        flats = zo.single_partition_of_fp32_groups
        for g, f in enumerate(flats):
            saved = o["single_partition_of_fp32_groups"][g]
            if saved.numel() != f.numel() - zo.groups_padding[g]:
                raise CheckpointError(f"rank {rank}: saved fp32 partition {g} has {saved.numel()} elements, "
                                      f"want {f.numel() - zo.groups_padding[g]} (DeepSpeed would zero-pad it)")
    else:
        flats = zo.fp32_partitioned_groups_flat
    for f in flats:
        st = base.state.get(f, {})
        for k in ("step", "exp_avg", "exp_avg_sq"):
            if k not in st:
                raise CheckpointError(f"rank {rank}: AdamW state '{k}' missing after load")
        for k in ("exp_avg", "exp_avg_sq"):
            if st[k].shape != f.shape:
                raise CheckpointError(f"rank {rank}: {k} shape {list(st[k].shape)} != partition {list(f.shape)}")
    if stage <= 2:
        for g, f in enumerate(flats):
            lp = zo.parallel_partitioned_bit16_groups[g][dist.get_rank(group=zo.real_dp_process_group[g])]
            if not torch.equal(lp.detach(), f.detach()):
                raise CheckpointError(f"rank {rank}: model_states 'module' weights differ from the fp32 "
                                      f"partition of group {g}")
    return float(base.state[flats[0]]["step"])


def resume_and_run(ckpt_dir, stage, batch_path, after_weights_path=None, tag=None):
    """Load with DeepSpeed's own loader (strict), run STEPS_AFTER steps. Returns dict."""
    import torch.distributed as dist

    rank, ws = init_dist()
    # DS_FIXTURE_DS_ONLY=1: only DeepSpeed's own checks (to see what DeepSpeed itself tolerates)
    extra = os.environ.get("DS_FIXTURE_DS_ONLY") != "1"
    if extra:
        tag = preflight(ckpt_dir, stage, ws, tag)
    engine = build(stage, ws)
    load_path, client = engine.load_checkpoint(str(ckpt_dir), tag=tag, load_module_strict=True,
                                               load_optimizer_states=True,
                                               load_lr_scheduler_states=True)
    if load_path is None:
        raise CheckpointError(f"load_checkpoint({ckpt_dir}) found no checkpoint")
    adam_step = postload_checks(engine, ckpt_dir, tag or "global_step3") if extra else None
    loaded_steps = engine.global_steps
    inp, lab = load_batch(batch_path)
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    losses, norms = [], []
    for i in range(STEPS_AFTER):
        l, g = train_step(engine, inp, lab)
        losses.append(l)
        norms.append(g)
        if i == 0 and after_weights_path is not None:
            w = full_weights(engine)
            if rank == 0:
                from safetensors.torch import save_file
                save_file(w, str(after_weights_path))
    dist.barrier()
    return dict(load_path=str(load_path), client_state_keys=sorted(client.keys()),
                loaded_global_steps=loaded_steps, loaded_adam_step=adam_step,
                resumed_losses=losses, resumed_grad_norms=norms)


# ----------------------------------------------------------------------------------------
# workers (run under torchrun)
# ----------------------------------------------------------------------------------------
def worker_train(out, ws_name, stage):
    import torch.distributed as dist

    rank, ws = init_dist()
    engine = build(stage, ws)
    inp, lab = load_batch(batch_file(out))
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    res = [train_step(engine, inp, lab) for _ in range(STEPS_BEFORE)]
    os.chdir(out)  # save_dir relative, as users pass it
    engine.save_checkpoint(ws_name, tag=TAG)
    if rank == 0:
        (out / f".{ws_name}_before.json").write_text(json.dumps([r[0] for r in res]))
    dist.barrier()
    dist.destroy_process_group()


def worker_resume(out, ws_name, stage):
    import torch.distributed as dist

    after = (f"{ws_name}_after_resume_step.safetensors" if ws_name == "ws1"
             else f".{ws_name}_after_resume_step.safetensors")
    os.chdir(out)
    r = resume_and_run(ws_name, stage, batch_file(out), None if _grid.active() else out / after)
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


def write_config(out, stage):
    import deepspeed
    import torch
    import transformers

    doc = {
        "trainer": "deepspeed",
        "trainer_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "zero_stage": stage,
        "model": dict(MODEL),
        "rope_order": "rotate_half",
        "rope_order_source": "transformers/models/llama/modeling_llama.py rotate_half + "
                             "apply_rotary_pos_emb; LlamaRotaryEmbedding emb = cat(freqs, freqs): "
                             "pairs (x[j], x[j+hd/2])",
        "block": "HF LlamaDecoderLayer, pre-norm: h = x + self_attn(input_layernorm(x)); "
                 "out = h + mlp(post_attention_layernorm(h)); mlp = down_proj(silu(gate_proj x) * up_proj x)",
        "final_norm": "model.norm, then lm_head",
        "attn_implementation": "sdpa (transformers default; causal, scale 1/sqrt(16))",
        "hf_config": hf_config().to_dict(),
        "optimizer": {"class": "torch.optim.AdamW (client optimizer wrapped by DeepSpeed ZeRO, "
                               "zero_allow_untested_optimizer)",
                      "lr": OPTIM["lr"], "betas": list(OPTIM["betas"]), "eps": OPTIM["eps"],
                      "weight_decay": OPTIM["weight_decay"], "weight_decay_on": "all parameters",
                      "max_grad_norm": MAX_GRAD_NORM, "schedule": "constant (no scheduler)",
                      "foreach": None, "fused": None, "amsgrad": False},
        "training": {"batch": [B, T], "steps_before_save": STEPS_BEFORE,
                     "steps_after_resume": STEPS_AFTER,
                     "loss": "mean CE over all B*T tokens of the global batch (logits vs labels, no shift)",
                     "init": f"HF _init_weights under torch.manual_seed({INIT_SEED}), whole model on every rank"},
        "ds_config_ws1": ds_config(stage, 1),
        "ds_config_ws2": ds_config(stage, 2),
        "save": {"function": "DeepSpeedEngine.save_checkpoint", "save_dir": "wsN", "tag": TAG},
        "load": {"function": "DeepSpeedEngine.load_checkpoint", "load_module_strict": True,
                 "load_optimizer_states": True, "load_lr_scheduler_states": True},
    }
    (out / "config.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def torchrun(n, mode, out, ws_name, stage):
    cmd = [TORCHRUN, "--nproc_per_node", str(n), "--master_port", str(29651 + 10 * stage + n),
           str(Path(__file__).resolve()), "_worker", mode, str(out), ws_name, str(stage)]
    # In ~1 of 3 full runs the ZeRO-3 world-2 *training* torchrun had a rank abort a few seconds in
    # with "terminate called without an active exception" (SIGABRT in a native thread, no Python
    # frame; PYTHONFAULTHANDLER is on to show it); a rerun from scratch is then bitwise identical.
    for attempt in (1, 2):
        r = subprocess.run(cmd, env=env())
        if r.returncode == 0:
            return
        print(f"torchrun {mode} {ws_name} zero{stage} failed (rc {r.returncode}), attempt {attempt}",
              file=sys.stderr, flush=True)
        if mode == "train":
            shutil.rmtree(out / ws_name, ignore_errors=True)
    raise RuntimeError(f"torchrun {mode} {ws_name} zero{stage} failed twice")


def run_zero_to_fp32(out, ws_name):
    """Run the checkpoint's own copy of zero_to_fp32.py (the file DeepSpeed wrote in wsN/) as its
    users do: `python zero_to_fp32.py . OUT --safe_serialization` from wsN/ (tag from `latest`)."""
    script = out / ws_name / "zero_to_fp32.py"
    assert script.exists(), script
    tmp = out / f".{ws_name}_fp32_out"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([PY, "zero_to_fp32.py", ".", str(tmp), "--safe_serialization"], check=True,
                   env=env(), cwd=str(out / ws_name))
    files = sorted(p.name for p in tmp.iterdir())
    assert files == ["model.safetensors"], files
    shutil.move(str(tmp / "model.safetensors"), str(out / f"{ws_name}_fp32.safetensors"))
    tmp.rmdir()


def gen_stage(root, stage):
    out = root / f"zero{stage}"
    out.mkdir(parents=True, exist_ok=True)
    write_batch(out)
    write_config(out, stage)
    expected = {}
    for n in (1, 2):
        name = f"ws{n}"
        shutil.rmtree(out / name, ignore_errors=True)
        torchrun(n, "train", out, name, stage)
        torchrun(n, "resume", out, name, stage)
        before = json.loads((out / f".{name}_before.json").read_text())
        res = json.loads((out / f".{name}_resume.json").read_text())
        (out / f".{name}_before.json").unlink()
        (out / f".{name}_resume.json").unlink()
        expected[name] = {"losses_before_save": before,
                          "resumed_losses": res["resumed_losses"],
                          "resumed_grad_norms": res["resumed_grad_norms"]}
        print(f"zero{stage} {name}: loaded {res['load_path']}, AdamW step after load = "
              f"{res['loaded_adam_step']}, client_state keys {res['client_state_keys']}")
        run_zero_to_fp32(out, name)
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected, indent=2))
    from safetensors.torch import load_file
    w1 = load_file(str(out / "ws1_after_resume_step.safetensors"))
    w2p = out / ".ws2_after_resume_step.safetensors"
    w2 = load_file(str(w2p))
    assert set(w1) == set(w2)
    print(f"zero{stage}: max |ws1 - ws2| weights after the first resumed step:",
          max(float((w1[k] - w2[k]).abs().max()) for k in w1))
    w2p.unlink()
    f1 = load_file(str(out / "ws1_fp32.safetensors"))
    f2 = load_file(str(out / "ws2_fp32.safetensors"))
    assert set(f1) == set(f2) == set(w1), (sorted(f1), sorted(w1))
    print(f"zero{stage}: max |ws1_fp32 - ws2_fp32|:",
          max(float((f1[k] - f2[k]).abs().max()) for k in f1))
    verify(out)


def gen_stage_grid(stage):
    """--grid NAME: the same train and resume workers on 2 ranks (and 3 for mqa: grid.DEEPSPEED_WORLDS) with the
    grid's shape and batch, into tests/data/trainers/grid/deepspeed-0.19-zeroS/NAME/ (ws2/, [ws3/,] config.json,
    expected.json). The copy of
    zero_to_fp32.py / zero_to_torch.py that save_checkpoint puts beside each checkpoint is removed (its
    scripts, not data)."""
    worlds = _grid.DEEPSPEED_WORLDS[_grid.active()]
    out = Path(_grid.out_dir(f"deepspeed-0.19-zero{stage}"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    _grid.write_batch()
    expected = {}
    for n in worlds:
        name = f"ws{n}"
        shutil.rmtree(out / name, ignore_errors=True)
        torchrun(n, "train", out, name, stage)
        torchrun(n, "resume", out, name, stage)
        before = json.loads((out / f".{name}_before.json").read_text())
        res = json.loads((out / f".{name}_resume.json").read_text())
        (out / f".{name}_before.json").unlink()
        (out / f".{name}_resume.json").unlink()
        for f in ("zero_to_fp32.py", "zero_to_torch.py"):
            (out / name / f).unlink(missing_ok=True)
        expected[name] = {"losses_before_save": before, "resumed_losses": res["resumed_losses"],
                          "resumed_grad_norms": res["resumed_grad_norms"]}
    _grid.write_expected(out, expected)
    _grid.write_config(out, f"deepspeed {__import__('deepspeed').__version__} ZeRO-{stage} (save_checkpoint), "
                            "transformers LlamaForCausalLM", {
                                "hf_config": hf_config().to_dict(),
                                **{f"ds_config_ws{n}": ds_config(stage, n) for n in worlds}})
    print(json.dumps(expected, indent=2))


# ----------------------------------------------------------------------------------------
# --describe: the layout report for the README
# ----------------------------------------------------------------------------------------
def _tree(x, ind="", name="", lines=None, depth=0):
    import torch

    if lines is None:
        lines = []
    pre = f"{ind}{name}: " if name != "" else ind
    if torch.is_tensor(x):
        lines.append(f"{pre}Tensor{list(x.shape)} {str(x.dtype).replace('torch.', '')}")
    elif isinstance(x, torch.Size):
        lines.append(f"{pre}torch.Size({list(x)})")
    elif isinstance(x, dict):
        lines.append(f"{pre}{type(x).__name__} ({len(x)} keys)")
        for k, v in x.items():
            _tree(v, ind + "  ", repr(k), lines, depth + 1)
    elif isinstance(x, (list, tuple)):
        if x and all(isinstance(e, (int, float, bool, str)) or e is None for e in x) and len(x) > 8:
            lines.append(f"{pre}{type(x).__name__}[{len(x)}] of {sorted({type(e).__name__ for e in x})} = {list(x)!r}")
        else:
            lines.append(f"{pre}{type(x).__name__}[{len(x)}]")
            for i, v in enumerate(x):
                _tree(v, ind + "  ", f"[{i}]", lines, depth + 1)
    elif isinstance(x, (int, float, bool, str, type(None))):
        lines.append(f"{pre}{type(x).__name__} = {x!r}")
    else:
        t = type(x)
        lines.append(f"{pre}<{t.__module__}.{t.__qualname__}> = {x!r}"[:400])
    return lines


def pickle_globals(path):
    """GLOBAL / STACK_GLOBAL references of data.pkl inside the torch.save zip."""
    with zipfile.ZipFile(path) as z:
        pk = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        data = z.read(pk)
        names = z.namelist()
    found, strings = [], []
    for op, arg, pos in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(arg)
        elif op.name == "MEMOIZE":
            pass
        if op.name == "GLOBAL":
            found.append(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            found.append(f"{strings[-2]}.{strings[-1]}")
    uniq = []
    for g in found:
        if g not in uniq:
            uniq.append(g)
    return pk, names, uniq


class _TRec:
    """What a pickled torch tensor record says (no data read)."""

    def __init__(self, storage, offset, size, stride, requires_grad, attrs=None):
        self.key, self.dtype, self.storage_numel = storage[2], storage[1], storage[4]
        self.offset, self.size, self.stride = offset, tuple(size), tuple(stride)
        self.requires_grad, self.attrs = requires_grad, attrs

    def __repr__(self):
        a = f" python attrs {self.attrs}" if self.attrs else ""
        return (f"data/{self.key} ({self.dtype}, storage numel {self.storage_numel}) offset {self.offset} "
                f"size {list(self.size)} stride {list(self.stride)} requires_grad {self.requires_grad}{a}")


def tensor_records(path):
    """Unpickle data.pkl without torch: every tensor becomes a _TRec (storage key, offset, ...)."""
    import pickle

    class U(pickle.Unpickler):
        def find_class(self, mod, name):
            if (mod, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return lambda st, off, size, stride, rg, hooks, *a: _TRec(st, off, size, stride, rg)
            if (mod, name) == ("torch._tensor", "_rebuild_from_type_v2"):
                def rft(func, typ, args, state):
                    t = func(*args)
                    t.attrs = state
                    return t
                return rft
            if mod == "torch" and name.endswith("Storage"):
                return name
            if (mod, name) == ("torch", "Tensor"):
                return "torch.Tensor"
            return super().find_class(mod, name)

        def persistent_load(self, pid):
            return pid  # ('storage', 'FloatStorage', key, 'cpu', numel)

    with zipfile.ZipFile(path) as z:
        pk = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        import io
        return U(io.BytesIO(z.read(pk))).load()


def _walk_trecs(x, path=""):
    if isinstance(x, _TRec):
        yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _walk_trecs(v, f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _walk_trecs(v, f"{path}[{i}]")


def describe(stage_dir):
    import torch

    stage_dir = Path(stage_dir)
    for ws in ("ws1", "ws2"):
        d = stage_dir / ws
        print(f"==================== {d.relative_to(stage_dir)} ====================")
        for p in sorted(d.rglob("*")):
            if p.is_file():
                print(f"  {p.relative_to(d)}  {p.stat().st_size} bytes")
        print("latest =", repr((d / "latest").read_text()))
        for p in sorted((d / TAG).glob("*.pt")):
            print(f"---------- {p.relative_to(stage_dir)} ----------")
            pk, names, gl = pickle_globals(p)
            print(f"zip records ({len(names)}): {names}")
            print("pickle globals:", gl)
            sd = torch.load(p, map_location="cpu", weights_only=False)
            print("\n".join(_tree(sd)))
            print("tensor records (path: zip record, storage numel, storage_offset, size, stride):")
            for path, r in _walk_trecs(tensor_records(p)):
                print(f"  {path}: {r!r}")


def _ceil_div(a, b):
    return -(-a // b)


def reconstruct(ws_dir):
    """Rebuild the full fp32 weights AND the full exp_avg / exp_avg_sq of a DeepSpeed ZeRO-2/3
    checkpoint with the algorithm the READMEs describe (plain torch.load, no DeepSpeed code).
    Returns (stage, {name: {"fp32": t, "exp_avg": t, "exp_avg_sq": t}})."""
    import math
    import torch

    ws_dir = Path(ws_dir)
    tag = (ws_dir / "latest").read_text().strip()
    d = ws_dir / tag
    optim = sorted(d.glob("zero_pp_rank_*_mp_rank_00_optim_states.pt"),
                   key=lambda p: int(p.name.split("_")[3]))
    osd = [torch.load(p, map_location="cpu", weights_only=False)["optimizer_state_dict"] for p in optim]
    stage = int(osd[0]["zero_stage"])
    ws = len(osd)
    if stage <= 2:
        ms = torch.load(d / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    else:
        ms = torch.load(d / "zero_pp_rank_0_mp_rank_00_model_states.pt", map_location="cpu",
                        weights_only=False)
    out = {}
    for g, shapes in enumerate(ms["param_shapes"]):
        if stage <= 2:
            assert osd[0]["partition_count"][g] == ws
            pads = osd[0]["param_alignment_paddings"][g]
            # full flat vector = cat over ranks (fp32 partitions are saved without their tail padding)
            flat = {"fp32": torch.cat([o["single_partition_of_fp32_groups"][g] for o in osd])}
            for k in ("exp_avg", "exp_avg_sq"):
                # the AdamW moments are saved WITH the tail padding (group_paddings[g] elements)
                parts = [o["base_optimizer_state"]["state"][g][k] for o in osd]
                parts = [t[:t.numel() - o["group_paddings"][g]] for t, o in zip(parts, osd)]
                flat[k] = torch.cat(parts)
            off = 0
            for (name, shape), pad in zip(shapes.items(), pads):
                n = math.prod(shape)
                out[name] = {k: v[off:off + n].view(*shape).detach().clone() for k, v in flat.items()}
                off += n + pad
            assert _ceil_div(off, 2 * ws) * 2 * ws == _ceil_div(flat["fp32"].numel(), 2 * ws) * 2 * ws
        else:
            assert osd[0]["partition_count"] == ws
            # one flat group per sub group; with the default sub_group_size (1e9) one per param group
            flats = {"fp32": [torch.cat(list(o["fp32_flat_groups"])) for o in osd]}
            for k in ("exp_avg", "exp_avg_sq"):
                flats[k] = [torch.cat([o["optimizer_state_dict"]["state"][i][k]
                                       for i in sorted(o["optimizer_state_dict"]["state"])])
                            for o in osd]
            off = 0
            for name, shape in shapes.items():
                n = math.prod(shape)
                pn = _ceil_div(n, ws)
                out[name] = {k: torch.cat([f[r][off:off + pn] for r in range(ws)])[:n].view(*shape).detach().clone()
                             for k, f in flats.items()}
                off += pn
            assert off == flats["fp32"][0].numel(), (off, flats["fp32"][0].numel())
    return stage, out, ms


def verify(stage_dir):
    """Check the README algorithm against zero_to_fp32's output and the module state."""
    from safetensors.torch import load_file

    stage_dir = Path(stage_dir)
    for ws in ("ws1", "ws2"):
        stage, rec, ms = reconstruct(stage_dir / ws)
        ref = load_file(str(stage_dir / f"{ws}_fp32.safetensors"))
        assert set(ref) == set(rec), (sorted(ref), sorted(rec))
        bad = [k for k in ref if not (ref[k].shape == rec[k]["fp32"].shape and
                                      bool((ref[k] == rec[k]["fp32"]).all()))]
        print(f"zero{stage} {ws}: README reconstruction == {ws}_fp32.safetensors (bitwise) for "
              f"{len(ref) - len(bad)}/{len(ref)} tensors", "" if not bad else f"MISMATCH {bad}")
        if stage <= 2:
            bad = [k for k in ref if not bool((ms["module"][k] == ref[k]).all())]
            print(f"zero{stage} {ws}: model_states['module'] == fp32 master (bitwise) for "
                  f"{len(ref) - len(bad)}/{len(ref)} tensors", "" if not bad else f"MISMATCH {bad}")
        else:
            print(f"zero{stage} {ws}: model_states['module'] shapes: "
                  f"{sorted({tuple(v.shape) for v in ms['module'].values()})}")
        import math
        print(f"zero{stage} {ws}: exp_avg / exp_avg_sq rebuilt for {len(rec)} params "
              f"(numel {sum(math.prod(v['exp_avg'].shape) for v in rec.values())})")
    # ws1 vs ws2 moments (same training, different partitioning)
    _, r1, _ = reconstruct(stage_dir / "ws1")
    _, r2, _ = reconstruct(stage_dir / "ws2")
    for k in ("fp32", "exp_avg", "exp_avg_sq"):
        print(f"  max |ws1 - ws2| {k}: {max(float((r1[n][k] - r2[n][k]).detach().abs().max()) for n in r1):.3g}")


# ----------------------------------------------------------------------------------------
# --padding-demo: where ZeRO puts its padding (the fixture model needs none on 1 or 2 ranks)
# ----------------------------------------------------------------------------------------
def worker_pad(out, stage):
    """A toy module with odd sizes (a [5,3], b [7], c [3]: 25 elements) on 2 ranks, 1 step, save,
    print what is on disk, reload strictly."""
    import torch
    import torch.distributed as dist
    import deepspeed

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.a = torch.nn.Parameter(torch.randn(5, 3, generator=g))
            self.b = torch.nn.Parameter(torch.randn(7, generator=g))
            self.c = torch.nn.Parameter(torch.randn(3, generator=g))

        def forward(self, x):
            return (self.a.sum(1) * x).sum() + (self.b ** 2).sum() * x.mean() + (self.c ** 3).sum()

    def make():
        m = Toy()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=OPTIM["betas"], eps=OPTIM["eps"],
                                weight_decay=OPTIM["weight_decay"])
        cfg = ds_config(stage, dist.get_world_size())
        cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"] = dist.get_world_size(), 1
        return deepspeed.initialize(model=m, optimizer=opt, config=cfg)[0]

    rank, ws = init_dist()
    eng = make()
    x = torch.full((5,), 1.0 + rank)
    loss = eng(x)
    eng.backward(loss)
    eng.step()
    os.chdir(out)
    eng.save_checkpoint(f"pad_zero{stage}", tag="t")
    dist.barrier()
    eng2 = make()
    eng2.load_checkpoint(f"pad_zero{stage}", load_module_strict=True)
    dist.barrier()
    if rank == 0:
        d = out / f"pad_zero{stage}" / "t"
        for p in sorted(d.glob("*optim_states.pt")):
            o = torch.load(p, map_location="cpu", weights_only=False)["optimizer_state_dict"]
            if stage <= 2:
                st = o["base_optimizer_state"]["state"][0]
                print(f"{p.name}: single_partition_of_fp32_groups[0] numel "
                      f"{o['single_partition_of_fp32_groups'][0].numel()}, exp_avg numel "
                      f"{st['exp_avg'].numel()}, group_paddings {o['group_paddings']}, "
                      f"param_alignment_paddings {o['param_alignment_paddings']}, "
                      f"param_slice_mappings {dict(o['param_slice_mappings'][0])}")
            else:
                st = o["optimizer_state_dict"]["state"][0]
                f = o["fp32_flat_groups"][0]
                print(f"{p.name}: fp32_flat_groups[0] numel {f.numel()} = {f.detach().tolist()}, "
                      f"exp_avg numel {st['exp_avg'].numel()} = {st['exp_avg'].tolist()}")
        ms = sorted(d.glob("*model_states.pt"))
        m = torch.load(ms[0], map_location="cpu", weights_only=False)
        print(f"{ms[0].name}: module {{k: shape}} = "
              f"{ {k: list(v.shape) for k, v in m['module'].items()} }, param_shapes {m['param_shapes']}")
        _, rec, _ = reconstruct(out / f"pad_zero{stage}")
        full = {k: v["fp32"] for k, v in rec.items()}
        print("README reconstruction:", {k: v.flatten().tolist() for k, v in full.items()})
    dist.barrier()
    dist.destroy_process_group()


def padding_demo():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for stage in (2, 3):
            print(f"---- ZeRO-{stage}, 2 ranks, toy a[5,3] b[7] c[3] ----", flush=True)
            cmd = [TORCHRUN, "--nproc_per_node", "2", "--master_port", str(29691 + stage),
                   str(Path(__file__).resolve()), "_worker", "pad", tmp, "-", str(stage)]
            subprocess.run(cmd, check=True, env=env())
            code = ("import sys, zero_to_fp32 as z; sd = z.get_fp32_state_dict_from_zero_checkpoint('.');"
                    "print('zero_to_fp32:', {k: v.flatten().tolist() for k, v in sd.items()})")
            subprocess.run([PY, "-c", code], check=True, env=env(), cwd=f"{tmp}/pad_zero{stage}")


# ----------------------------------------------------------------------------------------
# --negative-tests: what check_deepspeed.py refuses / accepts (run on copies in a temp dir)
# ----------------------------------------------------------------------------------------
def negative_tests(root):
    import tempfile
    import torch

    root = Path(root)
    check = [PY, str(HERE / "check_deepspeed.py")]

    import re

    def run(d, stage, *extra, ds_only=False):
        e = dict(env(), DS_FIXTURE_DS_ONLY="1" if ds_only else "0")
        r = subprocess.run(check + [str(d), "--stage", str(stage), *extra], env=e,
                           capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        err = [l for l in r.stderr.splitlines()
               if re.match(r"^(\[rank\d\]: )?[A-Za-z_.]*(Error|Exception)\b", l)
               and "ChildFailedError" not in l]
        return r.returncode, last, (err[-1] if err else "")

    def resave(path, fn):
        sd = torch.load(path, map_location="cpu", weights_only=False)
        fn(sd)
        torch.save(sd, path)

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        def case(name, stage, ws, mutate, *extra):
            d = Path(tmp) / name
            shutil.copytree(root / f"zero{stage}" / ws, d)
            shutil.copy(root / f"zero{stage}" / "batch.safetensors", Path(tmp) / "batch.safetensors")
            mutate(d / TAG)
            exp = json.loads((root / f"zero{stage}" / "expected.json").read_text())[ws]
            for ds_only in (False, True):
                rc, last, err = run(d, stage, *extra, ds_only=ds_only)
                same = None
                if rc == 0:
                    got = json.loads(last)
                    same = got["resumed_losses"] == exp["resumed_losses"]
                who = "DeepSpeed alone " if ds_only else "check_deepspeed "
                cases.append((name, ds_only, rc, same, err[:300]))
                print(f"{name}: {who}rc={rc} same_losses={same} {err[:300]}", flush=True)

        o2 = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        case("z2_ws2_missing_rank1_optim", 2, "ws2",
             lambda d: (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink())
        case("z2_ws1_loaded_on_world2", 2, "ws1", lambda d: None, "--world", "2")
        case("z2_module_missing_key", 2, "ws1", lambda d: resave(
            d / "mp_rank_00_model_states.pt", lambda sd: sd["module"].pop("lm_head.weight")))
        case("z2_fp32_partition_short", 2, "ws1", lambda d: resave(
            d / o2, lambda sd: sd["optimizer_state_dict"]["single_partition_of_fp32_groups"].__setitem__(
                0, sd["optimizer_state_dict"]["single_partition_of_fp32_groups"][0][:-64].clone())))
        case("z2_adam_state_empty", 2, "ws1", lambda d: resave(
            d / o2, lambda sd: sd["optimizer_state_dict"]["base_optimizer_state"]["state"].clear()))
        case("z2_module_differs_from_fp32", 2, "ws1", lambda d: resave(
            d / "mp_rank_00_model_states.pt", lambda sd: sd["module"]["model.norm.weight"].add_(1e-3)))
        # accepted variants a writer may produce
        case("z2_OK_module_tensors_own_storages", 2, "ws2", lambda d: resave(
            d / "mp_rank_00_model_states.pt",
            lambda sd: sd.__setitem__("module", type(sd["module"])(
                (k, v.clone()) for k, v in sd["module"].items()))))
        case("z2_OK_no_param_slice_mappings", 2, "ws2", lambda d: [resave(
            d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt",
            lambda sd: sd["optimizer_state_dict"].pop("param_slice_mappings")) for r in range(2)])
        o3 = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        m3 = "zero_pp_rank_0_mp_rank_00_model_states.pt"
        case("z3_placeholder_replaced_by_full_tensor", 3, "ws1", lambda d: resave(
            d / m3, lambda sd: sd["module"].__setitem__("model.norm.weight", torch.ones(64))))
        case("z3_module_missing_key", 3, "ws1", lambda d: resave(
            d / m3, lambda sd: sd["module"].pop("model.norm.weight")))
        case("z3_ws2_missing_rank1_model_states", 3, "ws2",
             lambda d: (d / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink())
        case("z3_adam_state_empty", 3, "ws1", lambda d: resave(
            d / o3, lambda sd: sd["optimizer_state_dict"]["optimizer_state_dict"]["state"].clear()))

        def plain_flat(sd):
            f = sd["optimizer_state_dict"]["fp32_flat_groups"]
            sd["optimizer_state_dict"]["fp32_flat_groups"] = [torch.Tensor(t.detach().clone()) for t in f]
        case("z3_OK_fp32_flat_plain_tensor_no_ds_id", 3, "ws2", lambda d: [resave(
            d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", plain_flat) for r in range(2)])
    return cases


def main():
    args = sys.argv[1:]
    if args and args[0] == "--describe":
        describe(args[1])
        return
    if args and args[0] == "--padding-demo":
        padding_demo()
        return
    if args and args[0] == "--negative-tests":
        negative_tests(args[1] if len(args) > 1 else DEFAULT_OUT)
        return
    if args and args[0] == "--verify":
        verify(args[1])
        return
    stages = (2, 3)
    if args and args[0] == "--grid":
        _grid.select(args[1])
        apply_grid()
        args = args[2:]
    if args and args[0] == "--stage":
        stages = {"2": (2,), "3": (3,), "both": (2, 3)}[args[1]]
        args = args[2:]
    root = Path(args[0]).resolve() if args else DEFAULT_OUT
    root.mkdir(parents=True, exist_ok=True)
    for s in stages:
        if _grid.active():
            gen_stage_grid(s)
        else:
            gen_stage(root, s)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        mode, out, ws_name, stage = sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        if mode == "pad":
            worker_pad(out, stage)
        else:
            {"train": worker_train, "resume": worker_resume}[mode](out, ws_name, stage)
    else:
        main()
