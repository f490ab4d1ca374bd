#!/usr/bin/env python3
"""Generate the Megatron-FSDP 0.6.1 checkpoint fixtures under tests/data/trainers/megatron-fsdp-0.6/.

Command line (from the repository root, CPU only, about a minute):

    OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/megatron \
    /work/torchenv/bin/python tools/gen/trainers/gen_megatron_fsdp.py [OUT_DIR]

Other modes (same environment; they only read the fixtures):
    gen_megatron_fsdp.py --describe DIR/wsN   on-disk report used in the README: files, every DCP
                                              key (type, global shape, dtype, chunks, file/offset/
                                              length), planner_data, pickle globals of .metadata and
                                              of every torch.save record, the values of the non-tensor
                                              (bytes) entries, and the optimizer id -> name mapping
    gen_megatron_fsdp.py --verify DIR         rebuilds the full weights of DIR/ws1 and DIR/ws2 from the
                                              raw .distcp bytes with the README algorithm (zip records at
                                              metadata offsets, chunks pasted at their offsets; no DCP
                                              code), compares with DCP's own load, and runs the numeric
                                              rotate-half check of q_proj/k_proj
    gen_megatron_fsdp.py --negative-tests DIR mutated copies of DIR/ws1 / ws2: what check_megatron_fsdp.py
                                              refuses and what DCP alone would accept

OUT_DIR defaults to tests/data/trainers/megatron-fsdp-0.6.  It (re)writes
    batch.safetensors, config.json, expected.json, ws1/, ws2/, ws1_after_resume_step.safetensors
(README.md is hand written from the --describe / --verify output).  For each world size N in (1, 2)
it runs, with `torchrun --nproc_per_node N` (gloo), one process group that trains 3 steps and saves
with torch.distributed.checkpoint.save({"model": fsdp_model.state_dict(), "optimizer":
optimizer.state_dict()}, checkpoint_id="wsN") -- exactly Megatron-FSDP's README -- then a FRESH
process group that builds the same model/optimizer, makes the same state-dict template, calls
torch.distributed.checkpoint.load(template, checkpoint_id="wsN"), fsdp_model.load_state_dict(
template["model"], strict=True) and optimizer.load_state_dict(template["optimizer"]) and runs 2 more
steps.

Model: transformers LlamaForCausalLM(LlamaConfig(hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim
16, vocab 256, intermediate 192, rms eps 1e-5, rope theta 10000, untied, no biases, float32)), HF's own
init under torch.manual_seed(0), built whole on every rank, then
megatron_fsdp.fully_shard_model(model, device_mesh=init_device_mesh("cpu", (N, 1), ("fsdp", "tp")),
dp_shard_dim="fsdp", tp_dim="tp", fsdp_unit_modules=[LlamaDecoderLayer], zero_dp_strategy=3 (default),
device=cpu) and megatron_fsdp.fully_shard_optimizer(torch.optim.AdamW(fsdp_model.parameters(),
lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1)).  Loss = mean cross-entropy of the logits
against the given labels (no shift) over the rank's rows; Megatron-FSDP scales gradients by 1/N
before its reduce-scatter, so the gradient is that of the global mean; the recorded loss is the
mean over the ranks (= the global mean).  Gradient clipping: Megatron-FSDP has no clipping of its
own and torch.nn.utils.clip_grad_norm_ deadlocks on 2 ranks (a rank whose shard of a parameter is
empty has grad None there, so the ranks' foreach collectives differ), so it is done as Megatron-LM's
clip_grad_norm_fp32 does it on the sharded gradients: total = sqrt(all_reduce_sum(sum of squares of
the local gradient shards)), coef = 1.0 / (total + 1e-6), gradients scaled by coef if coef < 1.
The grad norm recorded is that total (before clipping).

Workarounds for this CPU machine (see /work/shared/seed-systems/README.md): cuda_stubs.install()
before importing megatron_fsdp; the DeviceMesh is built by hand on "cpu" (fully_shard_model's own
default mesh is a "cuda" one); device=torch.device("cpu"); fsdp_model.ddp_config.
gradient_reduce_div_fusion = False right after fully_shard_model (gloo has no PREMUL_SUM).

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all):
`gen_megatron_fsdp.py --grid NAME` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py) runs the same
phases on 2 ranks with that shape and the grid's batch, into tests/data/trainers/grid/megatron-fsdp-0.6/NAME/:
ws2/, config.json, expected.json.
"""

import io
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
DEFAULT_OUT = REPO / "tests" / "data" / "trainers" / "megatron-fsdp-0.6"
PYTHONPATH = "/work/seedpkgs/megatron"
STUBS = "/work/shared/seed-systems"
TORCHRUN = "/work/torchenv/bin/torchrun"
PY = "/work/torchenv/bin/python"

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


class CheckpointError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------
# shared with check_megatron_fsdp.py
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


def init_dist():
    """cuda stubs, gloo process group. Returns (rank, world)."""
    import torch

    if STUBS not in sys.path:
        sys.path.insert(0, STUBS)
    import cuda_stubs

    cuda_stubs.install()
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def build():
    """HF init (seed 0) of the whole model on every rank, fully_shard_model, torch AdamW,
    fully_shard_optimizer.  Returns (fsdp_model, optimizer, id_to_name)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from megatron_fsdp import fully_shard_model, fully_shard_optimizer

    ws = dist.get_world_size()
    torch.manual_seed(INIT_SEED)
    model = LlamaForCausalLM(hf_config()).float()
    model.train()
    mesh = init_device_mesh("cpu", (ws, 1), mesh_dim_names=("fsdp", "tp"))
    fsdp_model = fully_shard_model(module=model, device_mesh=mesh, dp_shard_dim="fsdp",
                                   tp_dim="tp", fsdp_unit_modules=[LlamaDecoderLayer],
                                   zero_dp_strategy=3, device=torch.device("cpu"))
    fsdp_model.ddp_config.gradient_reduce_div_fusion = False
    assert fsdp_model.param_and_grad_buffer.ddp_config is fsdp_model.ddp_config
    optim = torch.optim.AdamW(fsdp_model.parameters(), lr=OPTIM["lr"], betas=OPTIM["betas"],
                              eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"])
    optim = fully_shard_optimizer(optim)
    # torch.optim.Optimizer.state_dict() numbers the parameters 0.. in param_groups order; map them
    # to the names of fsdp_model.state_dict() (which are "module." + HF names).
    names = {id(p): "module." + n for n, p in fsdp_model.module.named_parameters()}
    id_to_name = []
    for g in optim.param_groups:
        for p in g["params"]:
            id_to_name.append(names[id(p)])
    return fsdp_model, optim, id_to_name


def load_batch(path):
    from safetensors.torch import load_file

    d = load_file(str(path))
    return d["input_ids"], d["labels"]


def local_rows(x, rank, ws):
    n = x.shape[0] // ws
    return x[rank * n:(rank + 1) * n]


def clip_grad_norm(params, max_norm):
    """Megatron-LM clip_grad_norm_fp32 on Megatron-FSDP's sharded (uneven DTensor) gradients."""
    import torch
    import torch.distributed as dist

    sq = torch.zeros((), dtype=torch.float32)
    grads = []
    for p in params:
        if p.grad is None:
            continue
        g = p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad
        if g.numel():
            grads.append(g)
            sq += torch.linalg.vector_norm(g.float()) ** 2
    dist.all_reduce(sq)
    total = sq.sqrt()
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return float(total.item())


def train_step(fsdp_model, optim, inp, lab):
    import torch.distributed as dist
    import torch.nn.functional as F

    logits = fsdp_model(input_ids=inp.long()).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.long().reshape(-1))
    loss.backward()
    gn = clip_grad_norm(list(fsdp_model.parameters()), MAX_GRAD_NORM)
    optim.step()
    optim.zero_grad()
    l = loss.detach().clone()
    dist.all_reduce(l)
    l /= dist.get_world_size()
    return float(l.item()), gn


def full_weights(fsdp_model):
    """Full fp32 weights, under the names of fsdp_model.state_dict() ("module." + HF name).
    (megatron_fsdp.uneven_dtensor.uneven_dtensor_to_full_tensor all-gathers unequal sizes, which
    gloo refuses, so the shards and their DCP chunk offsets go through all_gather_object.)"""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    mine = {}
    sd = fsdp_model.state_dict()  # the DCP hook attaches __create_chunk_list__ to the shards
    for k, v in sd.items():
        if isinstance(v, DTensor):
            loc = v._local_tensor
            chunks = loc.__create_chunk_list__() if hasattr(loc, "__create_chunk_list__") else []
            mine[k] = [(list(c.offsets), loc.detach().clone()) for c in chunks if loc.numel()]
        else:
            mine[k] = [([0] * v.dim(), v.detach().clone())]
    allr = [None] * dist.get_world_size()
    dist.all_gather_object(allr, mine)
    out = {}
    for k, v in sd.items():
        full = torch.full(tuple(v.shape), float("nan"), dtype=torch.float32)
        for r in allr:
            for off, t in r[k]:
                full[tuple(slice(o, o + s) for o, s in zip(off, t.shape))] = t.float()
        assert not bool(full.isnan().any()), k
        out[k] = full.contiguous()
    return out


def _flat_keys(sd, prefix=""):
    """The keys DCP's flatten_state_dict makes (dicts and lists joined with '.')."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(sd)
    return flat


def preflight(ckpt_dir, template):
    """What DCP's load does not check itself: the checkpoint holds exactly the keys the ranks ask
    for (DCP ignores extra keys), every tensor has the global shape and dtype asked for, and its
    chunks tile it completely (DCP leaves the uncovered part of a tensor as it was)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
    from torch.distributed.tensor import DTensor

    if not (Path(ckpt_dir) / ".metadata").is_file():
        raise CheckpointError(f"{ckpt_dir}/.metadata missing")
    md = FileSystemReader(str(ckpt_dir)).read_metadata().state_dict_metadata
    flat = _flat_keys(template)
    mine = {}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            mine[k] = ("tensor", tuple(v.shape), str(v.dtype))
        else:
            mine[k] = ("bytes", None, None)
    allk = [None] * dist.get_world_size()
    dist.all_gather_object(allk, mine)
    want = {}
    for d in allk:
        for k, v in d.items():
            if k in want and want[k] != v:
                raise CheckpointError(f"ranks disagree about {k}: {want[k]} vs {v}")
            want[k] = v
    have = set(md)
    missing = sorted(set(want) - have)
    extra = sorted(have - set(want))
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} keys, e.g. {missing[:5]}")
    if extra:
        raise CheckpointError(f"checkpoint has {len(extra)} keys nobody loads, e.g. {extra[:5]}")
    for k, (kind, shape, dtype) in want.items():
        m = md[k]
        if kind == "bytes":
            if not isinstance(m, BytesStorageMetadata):
                raise CheckpointError(f"{k}: want a bytes (torch.save'd object) entry, got {type(m).__name__}")
            continue
        if not isinstance(m, TensorStorageMetadata):
            raise CheckpointError(f"{k}: want a tensor entry, got {type(m).__name__}")
        if tuple(m.size) != shape:
            raise CheckpointError(f"{k}: saved global shape {tuple(m.size)}, want {shape}")
        if str(m.properties.dtype) != dtype:
            raise CheckpointError(f"{k}: saved dtype {m.properties.dtype}, want {dtype}")
        cover = torch.zeros(shape, dtype=torch.int32)
        for c in m.chunks:
            sl = tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))
            if any(o + s > n for o, s, n in zip(c.offsets, c.sizes, shape)):
                raise CheckpointError(f"{k}: chunk {tuple(c.offsets)}+{tuple(c.sizes)} outside {shape}")
            cover[sl] += 1
        if not bool((cover == 1).all()):
            raise CheckpointError(f"{k}: chunks do not tile the tensor exactly once "
                                  f"(min {int(cover.min())}, max {int(cover.max())} cover)")
    return md


def postload_checks(fsdp_model, optim, id_to_name):
    """After load: every parameter with a non-empty local shard has AdamW step/exp_avg/exp_avg_sq
    of its shard's shape, all steps are equal (on all ranks), param_groups has the 21 ids."""
    import torch
    import torch.distributed as dist

    steps = set()
    for i, (g_p) in enumerate(p for g in optim.param_groups for p in g["params"]):
        loc = g_p._local_tensor if hasattr(g_p, "_local_tensor") else g_p
        if loc.numel() == 0:
            continue
        st = optim.state.get(g_p, {})
        for k in ("step", "exp_avg", "exp_avg_sq"):
            if k not in st:
                raise CheckpointError(f"AdamW state '{k}' of {id_to_name[i]} missing after load")
        for k in ("exp_avg", "exp_avg_sq"):
            s = st[k]._local_tensor if hasattr(st[k], "_local_tensor") else st[k]
            if s.shape != loc.shape:
                raise CheckpointError(f"{k} of {id_to_name[i]}: shard {list(s.shape)} != {list(loc.shape)}")
        steps.add(float(st["step"]))
    alls = [None] * dist.get_world_size()
    dist.all_gather_object(alls, sorted(steps))
    u = sorted({s for l in alls for s in l})
    if len(u) != 1:
        raise CheckpointError(f"AdamW steps differ between parameters: {u}")
    n = sum(len(g["params"]) for g in optim.param_groups)
    if n != len(id_to_name):
        raise CheckpointError(f"{n} params in param_groups, want {len(id_to_name)}")
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optim.param_groups]
    return u[0], groups


def resume_and_run(ckpt_dir, batch_path, after_weights_path=None):
    """Load with DCP + Megatron-FSDP's own load_state_dict (strict), run STEPS_AFTER steps."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank, ws = init_dist()
    # MFSDP_FIXTURE_DCP_ONLY=1: only DCP's / Megatron-FSDP's own checks (what they tolerate alone)
    extra = os.environ.get("MFSDP_FIXTURE_DCP_ONLY") != "1"
    fsdp_model, optim, id_to_name = build()
    ckpt = {"model": fsdp_model.state_dict(), "optimizer": optim.state_dict()}
    if extra:
        preflight(ckpt_dir, ckpt)
    dcp.load(state_dict=ckpt, checkpoint_id=str(ckpt_dir))
    res = fsdp_model.load_state_dict(ckpt["model"], strict=True)
    if res.missing_keys or res.unexpected_keys:
        raise CheckpointError(f"model load_state_dict: {res}")
    optim.load_state_dict(ckpt["optimizer"])
    step, groups = postload_checks(fsdp_model, optim, id_to_name) if extra else (None, None)
    inp, lab = load_batch(batch_path)
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    losses, norms = [], []
    for i in range(STEPS_AFTER):
        l, g = train_step(fsdp_model, optim, inp, lab)
        losses.append(l)
        norms.append(g)
        if i == 0 and after_weights_path is not None:
            w = full_weights(fsdp_model)
            if rank == 0:
                from safetensors.torch import save_file
                save_file(w, str(after_weights_path))
    dist.barrier()
    return dict(loaded_adam_step=step, loaded_param_groups=groups,
                resumed_losses=losses, resumed_grad_norms=norms)


# ----------------------------------------------------------------------------------------
# workers (run under torchrun)
# ----------------------------------------------------------------------------------------
def worker_train(out, ws_name):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank, ws = init_dist()
    fsdp_model, optim, id_to_name = build()
    inp, lab = load_batch(batch_file(out))
    inp, lab = local_rows(inp, rank, ws), local_rows(lab, rank, ws)
    res = [train_step(fsdp_model, optim, inp, lab) for _ in range(STEPS_BEFORE)]
    os.chdir(out)  # checkpoint_id relative, as users pass it
    dcp.save({"model": fsdp_model.state_dict(), "optimizer": optim.state_dict()},
             checkpoint_id=ws_name)
    if rank == 0:
        (out / f".{ws_name}_before.json").write_text(json.dumps(
            {"losses": [r[0] for r in res], "norms": [r[1] for r in res], "id_to_name": id_to_name}))
    dist.barrier()
    dist.destroy_process_group()


def worker_resume(out, ws_name):
    import torch.distributed as dist

    after = (f"{ws_name}_after_resume_step.safetensors" if ws_name == "ws1"
             else f".{ws_name}_after_resume_step.safetensors")
    os.chdir(out)
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


def write_config(out, id_to_name):
    import torch
    import transformers
    import importlib.metadata as im

    doc = {
        "trainer": "megatron-fsdp",
        "trainer_version": im.version("megatron_fsdp") if _has_dist("megatron_fsdp") else "0.6.1",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "model": dict(MODEL),
        "rope_order": "rotate_half",
        "rope_order_source": "transformers/models/llama/modeling_llama.py rotate_half + "
                             "apply_rotary_pos_emb; LlamaRotaryEmbedding emb = cat(freqs, freqs): "
                             "pairs (x[j], x[j+hd/2]); checked numerically by --verify",
        "block": "HF LlamaDecoderLayer, pre-norm: h = x + self_attn(input_layernorm(x)); "
                 "out = h + mlp(post_attention_layernorm(h)); mlp = down_proj(silu(gate_proj x) * up_proj x)",
        "final_norm": "model.norm, then lm_head",
        "attn_implementation": "sdpa (transformers default; causal, scale 1/sqrt(16))",
        "hf_config": hf_config().to_dict(),
        "wrapping": {"function": "megatron_fsdp.fully_shard_model",
                     "fsdp_unit_modules": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
                     "zero_dp_strategy": "optim_grads_params (3)",
                     "device_mesh": "init_device_mesh('cpu', (N, 1), mesh_dim_names=('fsdp', 'tp'))",
                     "mixed_precision_policy": "default MixedPrecisionPolicy (main_params_dtype float32)",
                     "state_dict_key_prefix": "module."},
        "optimizer": {"class": "torch.optim.AdamW wrapped in place by megatron_fsdp.fully_shard_optimizer",
                      "lr": OPTIM["lr"], "betas": list(OPTIM["betas"]), "eps": OPTIM["eps"],
                      "weight_decay": OPTIM["weight_decay"], "weight_decay_on": "all parameters",
                      "max_grad_norm": MAX_GRAD_NORM, "schedule": "constant (no scheduler)",
                      "foreach": None, "fused": None, "amsgrad": False,
                      "note": "fully_shard_optimizer runs one optimizer.step() with zero gradients "
                              "to create the state: AdamW step 1, exp_avg = exp_avg_sq = 0, and the "
                              "main weights decayed once by (1 - lr*wd); so after 3 training steps "
                              "the saved step is 4.0",
                      "param_id_to_name": {str(i): n for i, n in enumerate(id_to_name)}},
        "clipping": "Megatron-LM clip_grad_norm_fp32 on the sharded grads: total = sqrt(allreduce_sum("
                    "sum_i |g_i|^2)), coef = 1/(total + 1e-6), scale if coef < 1",
        "training": {"batch": [B, T], "steps_before_save": STEPS_BEFORE,
                     "steps_after_resume": STEPS_AFTER,
                     "loss": "mean CE over all B*T tokens of the global batch (logits vs labels, no shift)",
                     "init": f"HF _init_weights under torch.manual_seed({INIT_SEED}), whole model on every rank"},
        "save": {"function": "torch.distributed.checkpoint.save",
                 "state_dict": "{'model': fsdp_model.state_dict(), 'optimizer': optimizer.state_dict()}",
                 "checkpoint_id": "wsN", "storage_writer": "FileSystemWriter defaults (one file per rank, "
                 "SerializationFormat.TORCH_SAVE)"},
        "load": {"function": "torch.distributed.checkpoint.load(template, checkpoint_id) then "
                             "fsdp_model.load_state_dict(template['model'], strict=True), "
                             "optimizer.load_state_dict(template['optimizer'])"},
    }
    (out / "config.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def _has_dist(name):
    import importlib.metadata as im
    try:
        im.version(name)
        return True
    except im.PackageNotFoundError:
        return False


def torchrun(n, mode, out, ws_name):
    cmd = [TORCHRUN, "--nproc_per_node", str(n), "--master_port", str(29751 + n),
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
    import torch
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    write_batch(out)
    expected = {}
    id_to_name = None
    for n in (1, 2):
        name = f"ws{n}"
        shutil.rmtree(out / name, ignore_errors=True)
        torchrun(n, "train", out, name)
        torchrun(n, "resume", out, name)
        before = json.loads((out / f".{name}_before.json").read_text())
        res = json.loads((out / f".{name}_resume.json").read_text())
        (out / f".{name}_before.json").unlink()
        (out / f".{name}_resume.json").unlink()
        if id_to_name is None:
            id_to_name = before["id_to_name"]
        assert id_to_name == before["id_to_name"]
        expected[name] = {"losses_before_save": before["losses"],
                          "grad_norms_before_save": before["norms"],
                          "resumed_losses": res["resumed_losses"],
                          "resumed_grad_norms": res["resumed_grad_norms"],
                          "loaded_adam_step": res["loaded_adam_step"]}
    a = load_file(str(out / "ws1_after_resume_step.safetensors"))
    b = load_file(str(out / ".ws2_after_resume_step.safetensors"))
    expected["ws2"]["after_resume_step_max_abs_diff_vs_ws1"] = max(
        float((a[k] - b[k]).abs().max()) for k in a)
    (out / ".ws2_after_resume_step.safetensors").unlink()
    write_config(out, id_to_name)
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected, indent=2))


# ----------------------------------------------------------------------------------------
# --describe / --verify
# ----------------------------------------------------------------------------------------
class _Any(dict):
    """Stands in for every class a pickle names (so nothing is imported or run)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass

    def append(self, x):
        pass

    def extend(self, x):
        pass


def pickle_globals(data):
    """The (module, name) pairs a pickle's GLOBAL / STACK_GLOBAL opcodes name, in order of first use."""
    import pickle

    names = []

    class U(pickle.Unpickler):
        def find_class(self, mod, name):
            if f"{mod}.{name}" not in names:
                names.append(f"{mod}.{name}")
            return _Any

        def persistent_load(self, pid):
            return None

    U(io.BytesIO(data)).load()
    return names


def zip_record(blob):
    """One torch.save record (a zip archive) -> (entries, data.pkl bytes, {name: bytes})."""
    z = zipfile.ZipFile(io.BytesIO(blob))
    files = {i.filename: z.read(i.filename) for i in z.infolist()}
    ents = [(i.filename, i.file_size, i.compress_type) for i in z.infolist()]
    pkl = [k for k in files if k.endswith("/data.pkl")][0]
    return ents, files[pkl], files


def describe(d):
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    d = Path(d)
    print(f"== {d}")
    for p in sorted(d.iterdir()):
        print(f"file {p.name} {p.stat().st_size} bytes")
    raw = (d / ".metadata").read_bytes()
    print(".metadata pickle globals:", sorted(set(pickle_globals(raw))))
    md = FileSystemReader(str(d)).read_metadata()
    print("Metadata fields:", sorted(vars(md)))
    print("storage_meta:", md.storage_meta)
    print("planner_data:")
    for k, v in md.planner_data.items():
        print(f"  {k!r}: {v!r}")
    by_fqn = {}
    for idx, info in md.storage_data.items():
        by_fqn.setdefault(idx.fqn, []).append((idx, info))
    files = {p.name: p.read_bytes() for p in d.glob("*.distcp")}
    rec_globals = set()
    print("keys:")
    for k, m in md.state_dict_metadata.items():
        recs = sorted(by_fqn.get(k, []), key=lambda x: (x[1].relative_path, x[1].offset))
        if isinstance(m, TensorStorageMetadata):
            p = m.properties
            print(f"  {k}: tensor {list(m.size)} {p.dtype} (requires_grad {p.requires_grad}, "
                  f"memory_format {p.memory_format}, layout {p.layout}, pin {p.pin_memory})")
            for c in m.chunks:
                print(f"      chunk offsets {list(c.offsets)} sizes {list(c.sizes)}")
        else:
            print(f"  {k}: {type(m).__name__}")
        for idx, info in recs:
            blob = files[info.relative_path][info.offset:info.offset + info.length]
            ents, pkl, zf = zip_record(blob)
            rec_globals.update(pickle_globals(pkl))
            val = torch.load(io.BytesIO(blob), weights_only=False)
            if isinstance(val, torch.Tensor):
                vs = f"tensor {list(val.shape)} {val.dtype}" + (f" = {val.item()!r}" if val.numel() == 1 else "")
            else:
                vs = f"{type(val).__name__} {val!r}"
            print(f"      record index offset={None if idx.offset is None else list(idx.offset)} "
                  f"index={idx.index} -> {info.relative_path} @{info.offset} len {info.length} "
                  f"transforms {info.transform_descriptors}: {vs}")
            print(f"        zip entries {[(n, s) for n, s, _ in ents]} (compress types "
                  f"{sorted({c for _, _, c in ents})})")
    print("record pickle globals:", sorted(rec_globals))


def read_raw(d):
    """README algorithm, no DCP code: read .metadata (pickle), then for every key paste each
    chunk (a torch.save zip record at file/offset/length) at its offsets.
    Returns {fqn: tensor or object}."""
    import pickle
    import torch

    d = Path(d)
    md = pickle.loads((d / ".metadata").read_bytes())
    files = {p.name: p.read_bytes() for p in d.glob("*.distcp")}
    out = {}
    for k, m in md.state_dict_metadata.items():
        if type(m).__name__ == "TensorStorageMetadata":
            out[k] = torch.full(tuple(m.size), float("nan"), dtype=m.properties.dtype)
    for idx, info in md.storage_data.items():
        blob = files[info.relative_path][info.offset:info.offset + info.length]
        val = torch.load(io.BytesIO(blob), weights_only=False)
        if idx.offset is None and not isinstance(val, torch.Tensor):
            out[idx.fqn] = val
            continue
        t = out[idx.fqn]
        if t.dim() == 0:
            t.copy_(val)
        else:
            sl = tuple(slice(o, o + s) for o, s in zip(idx.offset, val.shape))
            t[sl] = val
    return out, md


def verify(root):
    import torch
    from safetensors.torch import load_file

    root = Path(root)
    cfg = json.loads((root / "config.json").read_text())
    id_to_name = cfg["optimizer"]["param_id_to_name"]
    raws = {}
    for ws in ("ws1", "ws2"):
        raw, md = read_raw(root / ws)
        raws[ws] = raw
        nan = [k for k, v in raw.items() if isinstance(v, torch.Tensor) and bool(v.isnan().any())]
        print(f"{ws}: {len(raw)} keys rebuilt from raw records; not fully covered: {nan or 'none'}")
        # DCP's own full load (no resharding: plain tensors of the global shape) for comparison
        import torch.distributed.checkpoint as dcp
        tmpl = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
                for k, m in md.state_dict_metadata.items() if type(m).__name__ == "TensorStorageMetadata"}
        dcp.load(tmpl, checkpoint_id=str(root / ws), no_dist=True)
        bad = [k for k in tmpl if not torch.equal(tmpl[k], raw[k])]
        print(f"{ws}: raw rebuild == dcp.load (bitwise) for {len(tmpl) - len(bad)}/{len(tmpl)} tensors"
              + (f" MISMATCH {bad}" if bad else ""))
        steps = sorted({float(v) for k, v in raw.items() if k.endswith(".step")})
        print(f"{ws}: optimizer steps {steps}; param_groups.0.params = {raw['optimizer.param_groups.0.params']}")
        for i, n in id_to_name.items():
            assert raw[f"optimizer.state.{i}.exp_avg"].shape == raw[f"model.{n}"].shape, (i, n)
        print(f"{ws}: optimizer.state.<i>.* shapes match model.<param_id_to_name[i]> for all {len(id_to_name)} ids")
    for k in raws["ws1"]:
        if isinstance(raws["ws1"][k], torch.Tensor):
            diff = float((raws["ws1"][k] - raws["ws2"][k]).abs().max())
            if diff > 1e-5:
                print(f"  ws1 vs ws2 {k}: max |diff| {diff:.3g}")
    print("ws1 vs ws2: max |diff| over all tensors "
          f"{max(float((raws['ws1'][k] - raws['ws2'][k]).abs().max()) for k in raws['ws1'] if isinstance(raws['ws1'][k], torch.Tensor)):.3g}")
    rope_check(raws["ws1"])


def rope_check(raw):
    """q_proj/k_proj rows are HF rotate-half order: with the checkpoint's weights, HF's own
    attention q/k after RoPE == rotate-half formula on rows h*16 + j (pairs j, j+8), != interleaved."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    m = LlamaForCausalLM(hf_config()).float()
    m.load_state_dict({k[len("model.module."):]: v for k, v in raw.items() if k.startswith("model.")})
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, T, MODEL["dim"], generator=g)
    pos = torch.arange(T)[None]
    cos, sin = m.model.rotary_emb(x, pos)
    att = m.model.layers[0].self_attn
    hd = MODEL["head_dim"]
    q = att.q_proj(x).view(1, T, -1, hd).transpose(1, 2)
    k = att.k_proj(x).view(1, T, -1, hd).transpose(1, 2)
    qh, kh = apply_rotary_pos_emb(q, k, cos, sin)
    inv = 1.0 / (MODEL["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    ang = pos[0].float()[:, None] * inv[None]  # [T, hd/2]
    c, s = ang.cos(), ang.sin()

    def rot_half(t):
        a, b = t[..., :hd // 2], t[..., hd // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    def rot_inter(t):
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)

    for nm, raw_t, hf in (("q", q, qh), ("k", k, kh)):
        e1 = float((rot_half(raw_t) - hf).abs().max())
        e2 = float((rot_inter(raw_t) - hf).abs().max())
        print(f"rope {nm}: |HF - rotate_half| = {e1:.3g}, |HF - interleaved| = {e2:.3g}")


# ----------------------------------------------------------------------------------------
# --negative-tests
# ----------------------------------------------------------------------------------------
def negative_tests(root):
    import pickle
    import re
    import tempfile

    root = Path(root)
    check = [PY, str(HERE / "check_megatron_fsdp.py")]
    exp = json.loads((root / "expected.json").read_text())

    def run(d, *extra, dcp_only=False):
        e = dict(env(), MFSDP_FIXTURE_DCP_ONLY="1" if dcp_only else "0")
        r = subprocess.run(check + [str(d), *extra], env=e, capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        err = [l for l in r.stderr.splitlines()
               if re.match(r"^(\[rank\d\]: )?[A-Za-z_.]*(Error|Exception)\b", l)
               and "ChildFailedError" not in l]
        return r.returncode, last, (err[-1] if err else "")

    def edit_md(d, fn):
        md = pickle.loads((d / ".metadata").read_bytes())
        fn(md)
        (d / ".metadata").write_bytes(pickle.dumps(md))

    def drop_key(key):
        def f(md):
            md.state_dict_metadata.pop(key)
            for idx in [i for i in md.storage_data if i.fqn == key]:
                md.storage_data.pop(idx)
            md.planner_data.pop(key, None)
        return f

    def drop_chunk(key):
        def f(md):
            m = md.state_dict_metadata[key]
            c = m.chunks.pop()
            for idx in [i for i in md.storage_data if i.fqn == key and list(i.offset) == list(c.offsets)]:
                md.storage_data.pop(idx)
        return f

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(root / "batch.safetensors", Path(tmp) / "batch.safetensors")

        def case(name, ws, mutate, *extra):
            d = Path(tmp) / name
            shutil.copytree(root / ws, d)
            mutate(d)
            for dcp_only in (False, True):
                rc, last, err = run(d, *extra, dcp_only=dcp_only)
                same = None
                if rc == 0:
                    got = json.loads(last)["resumed_losses"]
                    same = got == exp[ws]["resumed_losses"] or (
                        "max |dloss| %.2g" % max(abs(a - b) for a, b in zip(got, exp[ws]["resumed_losses"])))
                who = "DCP alone " if dcp_only else "check      "
                cases.append((name, dcp_only, rc, same, err[:300]))
                print(f"{name}: {who}rc={rc} same_losses={same} {err[:300]}", flush=True)

        case("missing_model_key", "ws1", lambda d: edit_md(d, drop_key("model.module.model.norm.weight")))
        case("missing_exp_avg_sq", "ws1", lambda d: edit_md(d, drop_key("optimizer.state.3.exp_avg_sq")))
        case("missing_step", "ws1", lambda d: edit_md(d, drop_key("optimizer.state.3.step")))
        case("extra_key", "ws1", lambda d: edit_md(d, lambda md: md.state_dict_metadata.__setitem__(
            "model.module.extra.weight", md.state_dict_metadata["model.module.model.norm.weight"])))
        case("ws2_missing_rank1_chunk", "ws2",
             lambda d: edit_md(d, drop_chunk("model.module.lm_head.weight")))
        case("ws2_missing_rank1_file", "ws2", lambda d: (d / "__1_0.distcp").unlink())
        case("OK_ws1_loaded_on_world2", "ws1", lambda d: None, "--world", "2")
        case("OK_ws2_loaded_on_world1", "ws2", lambda d: None, "--world", "1")
    return cases


def generate_grid(name):
    """--grid NAME: the same train and resume workers on 2 ranks with the grid's shape and batch, into
    tests/data/trainers/grid/megatron-fsdp-0.6/NAME/ (ws2/, config.json, expected.json)."""
    _grid.select(name)
    apply_grid()
    out = Path(_grid.out_dir("megatron-fsdp-0.6"))
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
        expected[ws] = {"losses_before_save": before["losses"], "grad_norms_before_save": before["norms"],
                        "resumed_losses": res["resumed_losses"], "resumed_grad_norms": res["resumed_grad_norms"],
                        "loaded_adam_step": res["loaded_adam_step"]}
    _grid.write_expected(out, expected)
    _grid.write_config(out, "Megatron-FSDP 0.6.1 (fully_shard_model / fully_shard_optimizer, DCP), transformers "
                            "LlamaForCausalLM", {"hf_config": hf_config().to_dict(),
                                                 "param_id_to_name": before["id_to_name"],
                                                 "note": "fully_shard_optimizer's own zero-gradient step: the saved "
                                                         "AdamW step is 4"})
    print(json.dumps(expected, indent=2))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--grid":
        generate_grid(args[1])
        return
    if args and args[0] == "--describe":
        describe(args[1])
        return
    if args and args[0] == "--verify":
        verify(args[1])
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
