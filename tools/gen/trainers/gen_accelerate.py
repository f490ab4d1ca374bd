#!/usr/bin/env python3
"""Generate the accelerate 1.15.0 FSDP2 (SHARDED_STATE_DICT) save_state checkpoint fixtures under
tests/data/trainers/accelerate-1.15/.

Command line (from the repository root, CPU only, about 1 minute):

    OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/accelerate \
    /work/torchenv/bin/python tools/gen/trainers/gen_accelerate.py [OUT_DIR]

Other modes (same environment; they only read the fixtures):
    gen_accelerate.py --describe [DIR]      on-disk report used in the README: every file, every DCP key
                                            (state_dict_metadata with chunks, planner_data, storage_data),
                                            the records inside each .distcp, the pickle globals of
                                            .metadata and of every .pkl / .bin, and the objects they hold
    gen_accelerate.py --verify [DIR]        rebuilds the full weights + exp_avg + exp_avg_sq of ws1 and ws2
                                            from .metadata + .distcp with the README algorithm (plain
                                            zipfile/pickle/numpy, no DCP code) and compares them with
                                            torch's DCP reader (bitwise), and the model folders with
                                            accelerate's own merge_fsdp_weights output (also run by a
                                            normal generation)
    gen_accelerate.py --negative-tests [DIR] mutated copies of ws1/ws2: what check_accelerate.py refuses
                                            and what accelerate's load_state alone silently accepts (~6 min)
DIR defaults to OUT_DIR's default.  torchrun master ports: 29812/29813 (here), 29832/29833 (check).

OUT_DIR defaults to tests/data/trainers/accelerate-1.15.  It (re)writes
    batch.safetensors, config.json, expected.json, ws1/, ws2/, ws1_after_resume_step.safetensors
(README.md is hand written from the --describe output).  For each world size N in (1, 2) it runs,
with `torchrun --nproc_per_node N` (gloo), one process group that trains 3 steps and saves with
Accelerator.save_state("wsN"), then a FRESH process group that builds the same objects and loads with
Accelerator.load_state("wsN") and runs 2 more steps.

Trainer objects (as accelerate's users write them):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT",
                                            auto_wrap_policy="transformer_based_wrap")
             (transformer_cls_names_to_wrap from the model's _no_split_modules = LlamaDecoderLayer;
              reshard_after_forward True; no mixed precision, no cpu offload, no AC)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    per step: loss = CE(model(input_ids).logits, labels); accelerator.backward(loss);
              gn = accelerator.clip_grad_norm_(model.parameters(), 1.0); optimizer.step();
              scheduler.step(); optimizer.zero_grad()
Workaround on this CPU machine: accelerate picks DistributedType.MULTI_CPU and silently ignores the
FSDP plugin, so the script sets accelerator.state.distributed_type = DistributedType.FSDP (and
accelerator.state.fsdp_plugin = plugin) before and after prepare; then prepare runs accelerate's
own fsdp2_prepare_model and save_state / load_state take their FSDP branches (DCP).

Model: transformers LlamaForCausalLM(LlamaConfig(hidden 64, 2 layers, 4 heads, 2 kv heads,
vocab 256, intermediate 192, rms eps 1e-5, rope theta 10000, untied, no biases, float32)),
HF's own init after accelerate.utils.set_seed(0) (seeds random, numpy and torch, so the saved
random_states_*.pkl are reproducible), built whole on every rank.  torch.optim.AdamW(lr 1e-3,
betas (0.9, 0.95), eps 1e-8, weight_decay 0.1, one param group); scheduler
transformers.get_constant_schedule (LambdaLR, factor 1).  Loss = mean cross-entropy of the logits
against the given labels (no shift) over the rank's rows; FSDP2 averages gradients over the ranks,
so the gradient is that of the global mean; the recorded loss is the mean over the ranks.
The grad norm is what accelerator.clip_grad_norm_ returns (the total norm before clipping).

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all):
`gen_accelerate.py --grid NAME` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py) runs the same phases
on 2 ranks with that shape and the grid's batch, into tests/data/trainers/grid/accelerate-1.15/NAME/: ws2/,
config.json, expected.json.
"""

import io
import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "trainers" / "accelerate-1.15"
PYTHONPATH = "/work/seedpkgs/accelerate"
TORCHRUN = "/work/torchenv/bin/torchrun"
PY = "/work/torchenv/bin/python"

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
    """A grid shape in place of the common model, and the grid's batch."""
    global B, T
    MODEL.update({k: v for k, v in _grid.config().items() if k in MODEL})
    B, T = _grid.B, _grid.T


if _grid.active():
    apply_grid()


batch_file = _grid.batch_file


def env():
    return dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1")


# ----------------------------------------------------------------------------------------
# shared with check_accelerate.py
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


PLUGIN_KW = dict(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT",
                 auto_wrap_policy="transformer_based_wrap")


def _force_fsdp(accelerator, plugin):
    """What AcceleratorState.__init__ does on a GPU machine when an fsdp_plugin is given (the
    MULTI_GPU branch): distributed_type = FSDP, fsdp_plugin = plugin, and (its last line) the
    same distributed_type into PartialState's shared state -- every later AcceleratorState()
    call (e.g. AcceleratedScheduler.step) copies PartialState's value back."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def build():
    """HF init (seed 0) of the whole model on every rank, torch AdamW, constant LambdaLR,
    Accelerator(fsdp_plugin=FSDP2 sharded) and accelerator.prepare."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin, set_seed
    from transformers import LlamaForCausalLM, get_constant_schedule

    torch.set_num_threads(1)
    plugin = FullyShardedDataParallelPlugin(**PLUGIN_KW)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    _force_fsdp(accelerator, plugin)
    set_seed(INIT_SEED)  # random, numpy, torch (as accelerate's examples do): reproducible random_states_*.pkl
    model = LlamaForCausalLM(hf_config()).float()
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=OPTIM["lr"], betas=OPTIM["betas"],
                              eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"])
    sched = get_constant_schedule(optim)
    model, optim, sched = accelerator.prepare(model, optim, sched)
    _force_fsdp(accelerator, plugin)
    assert accelerator.is_fsdp2, "accelerate did not take its FSDP2 path"
    from torch.distributed.fsdp import FSDPModule
    assert isinstance(model, FSDPModule), type(model)
    return accelerator, model, optim, sched


def load_batch(path):
    from safetensors.torch import load_file

    d = load_file(str(path))
    return d["input_ids"], d["labels"]


def local_rows(x, rank, ws):
    n = x.shape[0] // ws
    return x[rank * n:(rank + 1) * n]


def train_step(accelerator, model, optim, sched, inp, lab):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    logits = model(input_ids=inp.long()).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.long().reshape(-1))
    accelerator.backward(loss)
    gn = accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    if gn is None:
        raise RuntimeError("accelerator.clip_grad_norm_ returned None")
    if hasattr(gn, "full_tensor"):
        gn = gn.full_tensor()
    optim.step()
    sched.step()
    optim.zero_grad()
    l = loss.detach().clone()
    dist.all_reduce(l)
    l /= dist.get_world_size()
    return float(l.item()), float(gn.item())


def full_weights(model):
    """Full fp32 weights (HF names) of the FSDP2 model, gathered on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone().contiguous().float() for k, v in sd.items()}


class CheckpointError(RuntimeError):
    pass


MODEL_DIR, OPTIM_DIR, SCHED_FILE = "pytorch_model_fsdp_0", "optimizer_0", "scheduler.bin"
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
PARAM_GROUP_FIELDS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
                      "capturable", "differentiable", "fused", "decoupled_weight_decay",
                      "initial_lr", "params")
RNG_KEYS = ("step", "random_state", "numpy_random_seed", "torch_manual_seed")


def param_shapes():
    """HF parameter fqns and shapes, in model.named_parameters() order (no torch.distributed)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        m = LlamaForCausalLM(hf_config())
    return {n: tuple(p.shape) for n, p in m.named_parameters()}


def expected_dcp_keys():
    shapes = param_shapes()
    model = {f"model.{n}": s for n, s in shapes.items()}
    optim = {}
    for n, s in shapes.items():
        optim[f"optimizer.state.{n}.step"] = ()
        optim[f"optimizer.state.{n}.exp_avg"] = s
        optim[f"optimizer.state.{n}.exp_avg_sq"] = s
    for f in PARAM_GROUP_FIELDS:
        optim[f"optimizer.param_groups.0.{f}"] = None  # bytes entry
    return model, optim


def read_metadata(dcp_dir):
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(dcp_dir)).read_metadata()


def _check_dcp(dcp_dir, want):
    """Exact key set, kinds, dtypes, global shapes, chunk tiling and record ranges of one DCP dir
    (DCP itself raises on a missing key but silently ignores an extra one and never checks that
    the saved chunks cover the tensor)."""
    import numpy as np
    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    dcp_dir = Path(dcp_dir)
    if not (dcp_dir / ".metadata").is_file():
        raise CheckpointError(f"{dcp_dir}/.metadata missing")
    md = read_metadata(dcp_dir)
    have = md.state_dict_metadata
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if missing or extra:
        raise CheckpointError(f"{dcp_dir.name}: keys missing {missing[:8]}{'...' if len(missing) > 8 else ''} "
                              f"extra {extra[:8]}{'...' if len(extra) > 8 else ''}")
    for k, shape in want.items():
        m = have[k]
        if shape is None:
            if not isinstance(m, BytesStorageMetadata):
                raise CheckpointError(f"{dcp_dir.name}: {k} should be a bytes entry, is {type(m).__name__}")
            continue
        if not isinstance(m, TensorStorageMetadata):
            raise CheckpointError(f"{dcp_dir.name}: {k} should be a tensor, is {type(m).__name__}")
        if tuple(m.size) != tuple(shape) or m.properties.dtype != torch.float32:
            raise CheckpointError(f"{dcp_dir.name}: {k} is {m.properties.dtype} {list(m.size)}, "
                                  f"want float32 {list(shape)}")
        cover = np.zeros(shape, dtype=np.int32)
        for c in m.chunks:
            sl = tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))
            if any(o < 0 or o + s > n for o, s, n in zip(c.offsets, c.sizes, shape)):
                raise CheckpointError(f"{dcp_dir.name}: {k} chunk {c} out of bounds")
            cover[sl] += 1
        if not (cover == 1).all():
            raise CheckpointError(f"{dcp_dir.name}: chunks of {k} do not tile {list(shape)} exactly once")
    for idx, info in md.storage_data.items():
        p = dcp_dir / info.relative_path
        if not p.is_file() or info.offset + info.length > p.stat().st_size:
            raise CheckpointError(f"{dcp_dir.name}: record {idx.fqn} -> {info.relative_path}"
                                  f"[{info.offset}:+{info.length}] missing / truncated")
    stored = {i.fqn for i in md.storage_data}
    if stored != set(want):
        raise CheckpointError(f"{dcp_dir.name}: storage_data has records for {len(stored)} keys, want {len(want)}")
    return md


def preflight(ckpt_dir, world):
    """What accelerate's load_state does not check itself."""
    from accelerate.utils import load as acc_load

    d = Path(ckpt_dir)
    if not d.is_dir():
        raise CheckpointError(f"{d} is not a directory")
    want_model, want_optim = expected_dcp_keys()
    _check_dcp(d / MODEL_DIR, want_model)
    _check_dcp(d / OPTIM_DIR, want_optim)
    if not (d / SCHED_FILE).is_file():
        raise CheckpointError(f"{d}/{SCHED_FILE} missing")
    rng = sorted(p.name for p in d.glob("random_states_*.pkl"))
    k = len(rng)
    if k == 0 and os.environ.get("ACC_CHECK_NO_RNG") == "1":
        return  # a checkpoint another tool wrote without RNG states (fsdp-run's): load_state keeps the job's own
    if k == 0 or rng != sorted(f"random_states_{r}.pkl" for r in range(k)):
        raise CheckpointError(f"random state files {rng}: want random_states_0..K-1.pkl "
                              "(accelerate silently skips a missing or unreadable one)")
    for name in rng:
        try:
            st = acc_load(d / name)  # exactly how load_accelerator_state reads it (weights_only + its globals)
        except Exception as e:
            raise CheckpointError(f"{name}: accelerate's load (weights_only) fails -- load_state would skip "
                                  f"it silently: {type(e).__name__}: {str(e).splitlines()[-1][:200]}") from e
        if not isinstance(st, dict) or any(key not in st for key in RNG_KEYS):
            raise CheckpointError(f"{name}: keys {sorted(st) if isinstance(st, dict) else type(st)}, "
                                  f"need {list(RNG_KEYS)}")
    custom = sorted(p.name for p in d.glob("custom_checkpoint_*.pkl"))
    if custom:
        raise CheckpointError(f"unexpected {custom} (no objects registered for checkpointing)")
    return k


def postload_checks(model, optim, sched):
    import torch

    base = optim.optimizer
    names = {id(p): n for n, p in model.named_parameters()}
    steps = set()
    for g in base.param_groups:
        for p in g["params"]:
            st = base.state.get(p, {})
            for key in ADAM_STATE:
                if key not in st:
                    raise CheckpointError(f"AdamW state {key} of {names.get(id(p))} missing after load")
            for key in ("exp_avg", "exp_avg_sq"):
                if st[key].shape != p.shape:
                    raise CheckpointError(f"{key} of {names.get(id(p))}: {list(st[key].shape)} != {list(p.shape)}")
            steps.add(float(st["step"]))
        for f, v in (("lr", OPTIM["lr"]), ("betas", OPTIM["betas"]), ("eps", OPTIM["eps"]),
                     ("weight_decay", OPTIM["weight_decay"])):
            if tuple(g[f]) != tuple(v) if f == "betas" else g[f] != v:
                raise CheckpointError(f"param group {f} = {g[f]!r}, want {v!r}")
    if len(steps) != 1:
        raise CheckpointError(f"AdamW steps differ between parameters: {sorted(steps)}")
    s = sched.scheduler
    return steps.pop(), int(s.last_epoch), int(s._step_count)


def resume_and_run(ckpt_dir, batch_path, after_weights_path=None):
    """Load with accelerate's own Accelerator.load_state (DCP, strict set_*_state_dict), run
    STEPS_AFTER steps.  Returns dict (all ranks)."""
    import torch.distributed as dist

    # ACC_FIXTURE_ACC_ONLY=1: only accelerate's own checks (to see what accelerate itself tolerates)
    extra = os.environ.get("ACC_FIXTURE_ACC_ONLY") != "1"
    accelerator, model, optim, sched = build()
    rank, ws = dist.get_rank(), dist.get_world_size()
    rng_files = preflight(ckpt_dir, ws) if extra else None
    accelerator.load_state(str(ckpt_dir))
    adam_step, last_epoch, step_count = postload_checks(model, optim, sched) if extra else (None, None, None)
    inp, lab = load_batch(batch_path)
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    losses, norms = [], []
    for i in range(STEPS_AFTER):
        l, g = train_step(accelerator, model, optim, sched, inp, lab)
        losses.append(l)
        norms.append(g)
        if i == 0 and after_weights_path is not None:
            w = full_weights(model)
            if rank == 0:
                from safetensors.torch import save_file
                save_file(w, str(after_weights_path))
    dist.barrier()
    return dict(loaded_adam_step=adam_step, loaded_scheduler_last_epoch=last_epoch,
                loaded_scheduler_step_count=step_count, loaded_accelerator_step=accelerator.step,
                random_state_files=rng_files, world=ws,
                resumed_losses=losses, resumed_grad_norms=norms)


# ----------------------------------------------------------------------------------------
# workers (run under torchrun)
# ----------------------------------------------------------------------------------------
def worker_train(out, ws_name):
    import torch.distributed as dist

    accelerator, model, optim, sched = build()
    rank, ws = dist.get_rank(), dist.get_world_size()
    inp, lab = load_batch(batch_file(out))
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    res = [train_step(accelerator, model, optim, sched, inp, lab) for _ in range(STEPS_BEFORE)]
    os.chdir(out)  # output_dir relative, as users pass it
    accelerator.save_state(ws_name)
    if rank == 0:
        (out / f".{ws_name}_before.json").write_text(json.dumps([r[0] for r in res]))
    accelerator.wait_for_everyone()
    dist.destroy_process_group()


def worker_resume(out, ws_name):
    import torch.distributed as dist

    os.chdir(out)
    # ws2's weights only for the ws1-vs-ws2 comparison (not committed: size budget)
    after = (f"{ws_name}_after_resume_step.safetensors" if ws_name == "ws1"
             else f".{ws_name}_after_resume_step.safetensors")
    r = resume_and_run(ws_name, batch_file(out), None if _grid.active() else out / after)
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
    import accelerate
    import torch
    import transformers

    doc = {
        "trainer": "accelerate",
        "trainer_version": accelerate.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
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
        "optimizer": {"class": "torch.optim.AdamW (wrapped by accelerate.optimizer.AcceleratedOptimizer)",
                      "lr": OPTIM["lr"], "betas": list(OPTIM["betas"]), "eps": OPTIM["eps"],
                      "weight_decay": OPTIM["weight_decay"], "weight_decay_on": "all parameters",
                      "max_grad_norm": MAX_GRAD_NORM,
                      "grad_clip": "accelerator.clip_grad_norm_(model.parameters(), 1.0) "
                                   "(DTensor-aware torch.nn.utils.clip_grad_norm_, returns the norm before clipping)",
                      "foreach": None, "fused": None, "amsgrad": False},
        "scheduler": {"class": "torch.optim.lr_scheduler.LambdaLR from transformers.get_constant_schedule "
                               "(factor 1.0), wrapped by accelerate.scheduler.AcceleratedScheduler",
                      "note": "AcceleratedScheduler (split_batches=False) calls scheduler.step() num_processes "
                              "times per optimizer step: last_epoch = 3 * world after 3 steps"},
        "training": {"batch": [B, T], "steps_before_save": STEPS_BEFORE,
                     "steps_after_resume": STEPS_AFTER,
                     "loss": "mean CE over all B*T tokens of the global batch (logits vs labels, no shift)",
                     "init": f"HF _init_weights after accelerate.utils.set_seed({INIT_SEED}) (= torch.manual_seed({INIT_SEED}) "
                             "+ random.seed + np.random.seed), whole model on every rank"},
        "accelerate": {
            "Accelerator": {"cpu": True, "fsdp_plugin": "see fsdp_plugin", "mixed_precision": "no",
                            "gradient_accumulation_steps": 1, "split_batches": False},
            "fsdp_plugin": dict(PLUGIN_KW, transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                reshard_after_forward=True, cpu_offload=False,
                                activation_checkpointing=False, cpu_ram_efficient_loading=False),
            "fsdp2_units": "fully_shard on each LlamaDecoderLayer, on model.embed_tokens, on the group "
                           "[model.norm, lm_head] (reshard_after_forward False), then on the root "
                           "(accelerate.utils.fsdp_utils.fsdp2_prepare_model); 1-D mesh, Shard(0)",
            "cpu_workaround": "accelerator.state.distributed_type = DistributedType.FSDP, "
                              "accelerator.state.fsdp_plugin = plugin, "
                              "PartialState._shared_state['distributed_type'] = FSDP, before and after prepare",
        },
        "save": {"function": "Accelerator.save_state", "output_dir": "wsN (relative, cwd = this folder)",
                 "safe_serialization": True},
        "load": {"function": "Accelerator.load_state", "input_dir": "wsN"},
    }
    (out / "config.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def torchrun(n, mode, out, ws_name):
    cmd = [TORCHRUN, "--nproc_per_node", str(n), "--master_port", str(29811 + n),
           str(Path(__file__).resolve()), "_worker", mode, str(out), ws_name]
    for attempt in (1, 2):
        r = subprocess.run(cmd, env=env())
        if r.returncode == 0:
            return
        print(f"torchrun {mode} {ws_name} failed (rc {r.returncode}), attempt {attempt}",
              file=sys.stderr, flush=True)
        if mode == "train":
            shutil.rmtree(out / ws_name, ignore_errors=True)
    raise RuntimeError(f"torchrun {mode} {ws_name} failed twice")


def generate(out):
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
        print(f"{name}: loaded AdamW step {res['loaded_adam_step']}, scheduler last_epoch "
              f"{res['loaded_scheduler_last_epoch']} (_step_count {res['loaded_scheduler_step_count']}), "
              f"accelerator.step {res['loaded_accelerator_step']}, random_states files {res['random_state_files']}")
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected, indent=2))
    from safetensors.torch import load_file
    w1 = load_file(str(out / "ws1_after_resume_step.safetensors"))
    w2p = out / ".ws2_after_resume_step.safetensors"
    w2 = load_file(str(w2p))
    assert set(w1) == set(w2) == set(param_shapes())
    print("max |ws1 - ws2| weights after the first resumed step:",
          max(float((w1[k] - w2[k]).abs().max()) for k in w1))
    w2p.unlink()
    verify(out)


# ----------------------------------------------------------------------------------------
# --describe: the layout report for the README
# ----------------------------------------------------------------------------------------
def _recording_unpickler(data, torch_stub=False):
    """Unpickle `data`, recording every (module, name) find_class resolves (first-use order).
    torch_stub: data.pkl of a torch.save zip -- storages become _Stor records."""
    found = []

    class R(pickle.Unpickler):
        def find_class(self, mod, name):
            if (mod, name) not in found:
                found.append((mod, name))
            if torch_stub and (mod, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return lambda st, off, size, stride, rg, hooks, *a: _TRec(st, off, size, stride, rg)
            return super().find_class(mod, name)

        def persistent_load(self, pid):
            return pid  # ('storage', <class torch.XStorage>, key, location, numel)

    obj = R(io.BytesIO(data)).load()
    return obj, found


class _TRec:
    """What a pickled torch tensor record says (no data read)."""

    def __init__(self, storage, offset, size, stride, requires_grad):
        self.stype, self.key, self.loc, self.numel = storage[1], storage[2], storage[3], storage[4]
        self.offset, self.size, self.stride, self.requires_grad = offset, tuple(size), tuple(stride), requires_grad

    def __repr__(self):
        return (f"tensor(storage data/{self.key} {getattr(self.stype, '__name__', self.stype)} numel {self.numel} "
                f"{self.loc}, storage_offset {self.offset}, size {list(self.size)}, stride {list(self.stride)}, "
                f"requires_grad {self.requires_grad})")


def _zip_info(blob):
    """(names, data.pkl bytes, {name: payload offset inside blob}) of a torch.save zip."""
    import struct

    z = zipfile.ZipFile(io.BytesIO(blob))
    names = z.namelist()
    offs = {}
    for zi in z.infolist():
        h = zi.header_offset
        n, e = struct.unpack("<HH", blob[h + 26:h + 30])
        offs[zi.filename] = (h + 30 + n + e, zi.file_size, zi.compress_type)
    pk = [n for n in names if n.endswith("/data.pkl")][0]
    return z, names, z.read(pk), offs


def _fmt_globals(found):
    return ", ".join(f"{m}.{n}" for m, n in found)


def _tree(x, ind="", name="", lines=None):
    import numpy as np
    import torch

    if lines is None:
        lines = []
    pre = f"{ind}{name}: " if name != "" else ind
    if torch.is_tensor(x):
        lines.append(f"{pre}Tensor{list(x.shape)} {str(x.dtype).replace('torch.', '')}"
                     + (f" = {x.tolist()!r}" if x.numel() <= 4 else ""))
    elif isinstance(x, np.ndarray):
        lines.append(f"{pre}numpy.ndarray{list(x.shape)} {x.dtype}")
    elif isinstance(x, dict):
        lines.append(f"{pre}{type(x).__name__} ({len(x)} keys)")
        for k, v in x.items():
            _tree(v, ind + "  ", repr(k), lines)
    elif isinstance(x, (list, tuple)):
        if len(x) > 8 and all(isinstance(e, (int, float)) for e in x):
            lines.append(f"{pre}{type(x).__name__}[{len(x)}] of {sorted({type(e).__name__ for e in x})} "
                         f"(first {x[:3]!r})")
        else:
            lines.append(f"{pre}{type(x).__name__}[{len(x)}]")
            for i, v in enumerate(x):
                _tree(v, ind + "  ", f"[{i}]", lines)
    elif isinstance(x, (int, float, bool, str, type(None))):
        lines.append(f"{pre}{type(x).__name__} = {x!r}")
    else:
        t = type(x)
        lines.append(f"{pre}<{t.__module__}.{t.__qualname__}> = {x!r}"[:300])
    return lines


def describe_dcp(dcp_dir):
    dcp_dir = Path(dcp_dir)
    raw = (dcp_dir / ".metadata").read_bytes()
    proto = next(pickletools.genops(raw))[1] if raw[:1] == b"\x80" else 0
    md, found = _recording_unpickler(raw)
    print(f"  .metadata: {len(raw)} bytes, pickle protocol {proto}, class {type(md).__module__}.{type(md).__name__}")
    print(f"  .metadata pickle globals (find_class, first use): {_fmt_globals(found)}")
    print(f"  Metadata.version = {md.version!r}; storage_meta = {md.storage_meta!r}")
    print(f"  state_dict_metadata ({len(md.state_dict_metadata)} keys, in order):")
    for k, m in md.state_dict_metadata.items():
        if hasattr(m, "chunks"):
            ch = "; ".join(f"off {list(c.offsets)} size {list(c.sizes)}" for c in m.chunks)
            p = m.properties
            print(f"    {k}: Tensor {str(p.dtype).replace('torch.', '')} {list(m.size)} "
                  f"(layout {p.layout}, requires_grad {p.requires_grad}, memory_format {p.memory_format}, "
                  f"pin_memory {p.pin_memory}) chunks [{ch}]")
        else:
            print(f"    {k}: {type(m).__name__}")
    print(f"  planner_data ({len(md.planner_data)}):")
    for k, v in md.planner_data.items():
        print(f"    {k!r}: {v!r}")
    print(f"  storage_data ({len(md.storage_data)}), record contents:")
    files = {}
    for idx, info in md.storage_data.items():
        files.setdefault(info.relative_path, []).append((info.offset, info.length, idx))
    for f in sorted(files):
        blob_all = (dcp_dir / f).read_bytes()
        print(f"   file {f} ({len(blob_all)} bytes, {len(files[f])} records):")
        end = 0
        for off, ln, idx in sorted(files[f], key=lambda t: t[0]):
            assert off == end, (f, off, end)  # records are back to back
            end = off + ln
            blob = blob_all[off:off + ln]
            z, names, pk, offs = _zip_info(blob)
            obj, g = _recording_unpickler(pk, torch_stub=True)
            pay = [(n, o) for n, o in offs.items() if "/data/" in n]
            pays = ", ".join(f"{n} at +{o[0]} ({o[1]} B, compress {o[2]})" for n, o in pay)
            if isinstance(obj, _TRec):
                what = repr(obj)
            else:
                what = f"bytes record = {obj!r}"[:400]
            print(f"    [{off}:+{ln}] MetadataIndex(fqn={idx.fqn!r}, offset={idx.offset!r}, index={idx.index!r}) "
                  f"-> {what}; payload {pays or 'none'}; globals {_fmt_globals(g)}")
        assert end == len(blob_all), (f, end, len(blob_all))
    # zip layout of one record (all records share it)
    idx, info = next(iter(md.storage_data.items()))
    blob = (dcp_dir / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
    z, names, pk, offs = _zip_info(blob)
    print(f"  zip entries of the first record ({idx.fqn}): " +
          ", ".join(f"{n} ({offs[n][1]} B at +{offs[n][0]})" for n in names))
    for n in names:
        if not n.endswith((".pkl",)) and "/data/" not in n:
            print(f"    {n} = {z.read(n)!r}")


def describe_pt(path):
    import torch

    blob = Path(path).read_bytes()
    z, names, pk, offs = _zip_info(blob)
    proto = next(pickletools.genops(pk))[1]
    _, found = _recording_unpickler(pk, torch_stub=True)
    print(f"  {Path(path).name}: {len(blob)} bytes, torch.save zip, entries {names}; data.pkl protocol {proto}")
    print(f"    pickle globals (find_class, first use): {_fmt_globals(found)}")
    from accelerate.utils import load as acc_load
    obj = acc_load(path)  # accelerate's own reader (weights_only=True + its extra safe globals)
    print("\n".join("    " + l for l in _tree(obj)))
    if isinstance(obj, dict) and "torch_manual_seed" in obj:
        r = obj["random_state"]
        n = obj["numpy_random_seed"]
        print(f"    random_state = (version {r[0]!r}, tuple[{len(r[1])}] of int, gauss_next {r[2]!r})")
        print(f"    numpy_random_seed = ({n[0]!r}, ndarray{list(n[1].shape)} {n[1].dtype}, pos {n[2]!r}, "
              f"has_gauss {n[3]!r}, cached_gaussian {n[4]!r})")
    return obj


def describe(root):
    root = Path(root)
    for ws in ("ws1", "ws2"):
        d = root / ws
        print(f"==================== {ws} ====================")
        for p in sorted(d.rglob("*")):
            if p.is_file():
                print(f"  {p.relative_to(d)}  {p.stat().st_size} bytes")
        for sub in (MODEL_DIR, OPTIM_DIR):
            print(f"---------- {ws}/{sub} (DCP) ----------")
            describe_dcp(d / sub)
        print(f"---------- {ws}: pickled files ----------")
        for p in sorted(d.glob("*.pkl")) + sorted(d.glob("*.bin")):
            describe_pt(p)


# ----------------------------------------------------------------------------------------
# --verify: the README reconstruction algorithm against torch's DCP reader and accelerate's merge
# ----------------------------------------------------------------------------------------
def reconstruct_dcp(dcp_dir):
    """Full tensors / values of a DCP folder with the README algorithm: .metadata (pickle) ->
    storage_data byte ranges -> each record is a torch.save zip; tensor payload = archive/data/<key>
    raw little-endian float32 at (storage_offset, size, stride); placed at the chunk offsets."""
    import numpy as np

    dcp_dir = Path(dcp_dir)
    md, _ = _recording_unpickler((dcp_dir / ".metadata").read_bytes())
    out = {}
    for k, m in md.state_dict_metadata.items():
        if hasattr(m, "chunks"):
            out[k] = np.full(tuple(m.size), np.nan, dtype=np.float32)
    blobs = {}
    for idx, info in md.storage_data.items():
        if info.relative_path not in blobs:
            blobs[info.relative_path] = (dcp_dir / info.relative_path).read_bytes()
        blob = blobs[info.relative_path][info.offset:info.offset + info.length]
        z, names, pk, offs = _zip_info(blob)
        obj, _ = _recording_unpickler(pk, torch_stub=True)
        if not isinstance(obj, _TRec):
            out[idx.fqn] = obj
            continue
        dname = [n for n in names if n.endswith(f"/data/{obj.key}")][0]
        po, plen, comp = offs[dname]
        assert comp == 0 and plen == obj.numel * 4
        flat = np.frombuffer(blob, dtype="<f4", count=obj.numel, offset=po)
        t = np.lib.stride_tricks.as_strided(flat[obj.offset:], shape=obj.size,
                                            strides=tuple(4 * s for s in obj.stride)) if obj.size else flat[obj.offset]
        chunk_off = tuple(idx.offset)
        sl = tuple(slice(o, o + s) for o, s in zip(chunk_off, obj.size))
        out[idx.fqn][sl] = t
    for k, v in out.items():
        if isinstance(v, np.ndarray):
            assert not np.isnan(v).any(), f"{k} not fully covered"
    return md, out


def verify(root):
    import tempfile
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.format_utils as fu
    from safetensors.torch import load_file

    root = Path(root)
    recs = {}
    for ws in ("ws1", "ws2"):
        for sub in (MODEL_DIR, OPTIM_DIR):
            md, rec = reconstruct_dcp(root / ws / sub)
            recs[(ws, sub)] = rec
            sd = {}
            fu._load_state_dict(sd, storage_reader=dcp.FileSystemReader(str(root / ws / sub)),
                                planner=fu._EmptyStateDictLoadPlanner(), no_dist=True)
            # flatten torch's nested result with planner_data paths
            bad, n = [], 0
            for k, path in md.planner_data.items():
                v = sd
                for p in path:
                    v = v[p]
                r = rec[k]
                n += 1
                if torch.is_tensor(v):
                    if not (tuple(v.shape) == r.shape and np.array_equal(v.numpy(), r)):
                        bad.append(k)
                elif v != r:
                    bad.append(k)
            print(f"{ws}/{sub}: README reconstruction == torch DCP reader for {n - len(bad)}/{n} keys",
                  "" if not bad else f"MISMATCH {bad}")
    for sub in (MODEL_DIR, OPTIM_DIR):
        a, b = recs[("ws1", sub)], recs[("ws2", sub)]
        diffs = [float(np.abs(a[k] - b[k]).max()) for k in a if isinstance(a[k], np.ndarray)]
        same_bytes = all(a[k] == b[k] for k in a if not isinstance(a[k], np.ndarray))
        print(f"{sub}: max |ws1 - ws2| over tensors {max(diffs):.3g}; bytes entries equal: {same_bytes}")
    # accelerate's own merge_fsdp_weights of the model folder
    from accelerate.utils import merge_fsdp_weights
    for ws in ("ws1", "ws2"):
        with tempfile.TemporaryDirectory() as tmp:
            merge_fsdp_weights(str(root / ws / MODEL_DIR), tmp, safe_serialization=True)
            merged = load_file(str(Path(tmp) / "model.safetensors"))
        rec = recs[(ws, MODEL_DIR)]
        ok = set(merged) == {k[len("model."):] for k in rec} and all(
            np.array_equal(merged[k].numpy(), rec["model." + k]) for k in merged)
        print(f"{ws}: accelerate merge_fsdp_weights -> model.safetensors keys {len(merged)} "
              f"(names without the 'model.' DCP prefix) == README reconstruction: {ok}")
    # the optimizer moments belong to the same fqns as the model
    r1 = recs[("ws1", OPTIM_DIR)]
    steps = sorted({float(v) for k, v in r1.items() if k.endswith(".step")})
    print(f"optimizer step values: {steps}; params list: {r1['optimizer.param_groups.0.params']}")
    w = load_file(str(root / "ws1_after_resume_step.safetensors"))
    print(f"ws1_after_resume_step.safetensors: {len(w)} tensors, names == HF fqns: {set(w) == set(param_shapes())}")


# ----------------------------------------------------------------------------------------
# --negative-tests: what check_accelerate.py refuses / what load_state alone accepts
# ----------------------------------------------------------------------------------------
def _edit_metadata(dcp_dir, fn):
    p = Path(dcp_dir) / ".metadata"
    md = pickle.loads(p.read_bytes())
    fn(md)
    p.write_bytes(pickle.dumps(md))


def negative_tests(root):
    import re
    import tempfile
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    root = Path(root)
    check = [PY, str(HERE / "check_accelerate.py")]

    def run(d, *extra, acc_only=False):
        e = dict(env(), ACC_FIXTURE_ACC_ONLY="1" if acc_only else "0")
        r = subprocess.run(check + [str(d), *extra], env=e, capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        err = [l for l in r.stderr.splitlines()
               if re.match(r"^(\[rank\d\]: )?[A-Za-z_.]*(Error|Exception)\b", l)
               and "ChildFailedError" not in l]
        return r.returncode, last, (err[-1] if err else "")

    def drop_key(key):
        def f(md):
            md.state_dict_metadata.pop(key)
            for i in [i for i in md.storage_data if i.fqn == key]:
                md.storage_data.pop(i)
            md.planner_data.pop(key, None)
        return f

    def add_key(key):
        def f(md):
            md.state_dict_metadata[key] = BytesStorageMetadata()
        return f

    def drop_chunk(key, index):
        def f(md):
            m = md.state_dict_metadata[key]
            m.chunks = [c for i, c in enumerate(m.chunks) if i != index]
            for i in [i for i in md.storage_data if i.fqn == key and i.index == index]:
                md.storage_data.pop(i)
        return f

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(root / "batch.safetensors", Path(tmp) / "batch.safetensors")
        exp_all = json.loads((root / "expected.json").read_text())

        def case(name, ws, mutate, *extra, both=True):
            d = Path(tmp) / name
            shutil.copytree(root / ws, d)
            mutate(d)
            world = int(extra[extra.index("--world") + 1]) if "--world" in extra else 1
            exp = exp_all[f"ws{world}"]  # the numbers of a run ON that world size
            for acc_only in ((False, True) if both else (False,)):
                rc, last, err = run(d, *extra, acc_only=acc_only)
                same = None
                if rc == 0:
                    got = json.loads(last)
                    same = got["resumed_losses"] == exp["resumed_losses"]
                    err = f"losses {got['resumed_losses']}"
                who = "accelerate alone " if acc_only else "check_accelerate "
                cases.append((name, acc_only, rc, same, err[:300]))
                print(f"{name}: {who}rc={rc} same_losses={same} {err[:300]}", flush=True)

        case("model_missing_key", "ws1", lambda d: _edit_metadata(d / MODEL_DIR, drop_key("model.lm_head.weight")))
        case("model_extra_key", "ws1", lambda d: _edit_metadata(d / MODEL_DIR, add_key("model.extra.weight")))
        case("optim_missing_exp_avg_sq", "ws1", lambda d: _edit_metadata(
            d / OPTIM_DIR, drop_key("optimizer.state.lm_head.weight.exp_avg_sq")))
        case("optim_missing_step", "ws1", lambda d: _edit_metadata(
            d / OPTIM_DIR, drop_key("optimizer.state.model.norm.weight.step")))
        case("optim_no_initial_lr", "ws1", lambda d: _edit_metadata(
            d / OPTIM_DIR, drop_key("optimizer.param_groups.0.initial_lr")))
        case("ws2_model_rank1_chunk_missing", "ws2", lambda d: _edit_metadata(
            d / MODEL_DIR, drop_chunk("model.lm_head.weight", 1)), "--world", "2")
        case("no_scheduler_bin", "ws1", lambda d: (d / SCHED_FILE).unlink())
        case("no_random_states", "ws1", lambda d: (d / "random_states_0.pkl").unlink())
        case("no_optimizer_dir", "ws1", lambda d: shutil.rmtree(d / OPTIM_DIR))
        def numpy1_globals(d):
            # random_states written under numpy 1.x name numpy.core.multiarray._reconstruct; accelerate's
            # weights_only load under numpy 2.x allows only numpy._core.multiarray._reconstruct
            p = d / "random_states_0.pkl"
            z = zipfile.ZipFile(io.BytesIO(p.read_bytes()))
            with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as w:
                for zi in z.infolist():
                    b = z.read(zi.filename)
                    if zi.filename.endswith("/data.pkl"):
                        b = b.replace(b"numpy._core.multiarray\n_reconstruct", b"numpy.core.multiarray\n_reconstruct")
                    w.writestr(zi.filename, b)
        case("random_states_numpy1_global", "ws1", numpy1_globals)

        def no_storage_meta(md):
            md.storage_meta = None
            md.version = None
        # variants a writer may produce (accepted)
        case("OK_metadata_storage_meta_and_version_None", "ws2", lambda d: [
            _edit_metadata(d / s, no_storage_meta) for s in (MODEL_DIR, OPTIM_DIR)], "--world", "2", both=False)
        case("OK_metadata_empty_planner_data", "ws1", lambda d: [
            _edit_metadata(d / s, lambda md: md.planner_data.clear()) for s in (MODEL_DIR, OPTIM_DIR)], both=False)
        # resharding: DCP re-partitions on load
        case("OK_ws2_loaded_on_world1", "ws2", lambda d: None, "--world", "1", both=False)
        case("OK_ws1_loaded_on_world2", "ws1", lambda d: None, "--world", "2", both=False)
    return cases


def generate_grid(name):
    """--grid NAME: the same train and resume workers on 2 ranks with the grid's shape and batch, into
    tests/data/trainers/grid/accelerate-1.15/NAME/ (ws2/, config.json, expected.json)."""
    _grid.select(name)
    apply_grid()
    out = Path(_grid.out_dir("accelerate-1.15"))
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
    _grid.write_config(out, "accelerate 1.15.0 (Accelerator.save_state, FSDP2 SHARDED_STATE_DICT), transformers "
                            "LlamaForCausalLM", {"hf_config": hf_config().to_dict(), "fsdp_plugin": PLUGIN_KW})
    print(json.dumps(expected, indent=2))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--grid":
        generate_grid(args[1])
        return
    if args and args[0] == "--describe":
        describe(args[1] if len(args) > 1 else DEFAULT_OUT)
        return
    if args and args[0] == "--verify":
        verify(args[1] if len(args) > 1 else DEFAULT_OUT)
        return
    if args and args[0] == "--negative-tests":
        negative_tests(args[1] if len(args) > 1 else DEFAULT_OUT)
        return
    root = Path(args[0]).resolve() if args else DEFAULT_OUT
    generate(root)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        mode, out, ws_name = sys.argv[2], Path(sys.argv[3]), sys.argv[4]
        {"train": worker_train, "resume": worker_resume}[mode](out, ws_name)
    else:
        main()
