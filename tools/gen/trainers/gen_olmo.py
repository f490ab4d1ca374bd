#!/usr/bin/env python
"""Fixtures written by OLMo itself (ai2-olmo 0.6.0: olmo.train.Trainer + olmo.checkpoint.FullCheckpointer, FSDP1),
for fsdp-run issue 38.

Regenerate everything (about 1 min on 2 CPU cores; deletes and rewrites the output folder except its hand-written
README.md, which is kept):

  # once: OLMo's pure-Python import deps that this machine lacks (never torch), beside /work/seedpkgs/olmo
  /work/torchenv/bin/pip install -q --no-deps --target /work/seedpkgs/olmo-extra omegaconf==2.3.0 \
      antlr4-python3-runtime==4.9.3 boto3 botocore jmespath s3transfer python-dateutil six requests urllib3 \
      certifi charset_normalizer importlib_resources torchmetrics lightning-utilities
  cd /work/main && OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/olmo:/work/seedpkgs/olmo-extra \
      /work/torchenv/bin/python tools/gen/trainers/gen_olmo.py [--out tests/data/trainers/olmo-0.6]

It runs itself under torchrun (gloo) as phases:
  --phase train  --ckdir D : scripts/train.py's setup (seed_all, OLMo(cfg.model), FSDP1 by_block, reset_parameters,
                             build_optimizer, build_scheduler, Trainer), 3 Trainer.train_step()s, then
                             Trainer.save_checkpoint(CheckpointType.unsharded) -> D/step3-unsharded (FullCheckpointer)
  --phase resume --ckdir D : fresh process, same setup, Trainer.restore_checkpoint(D/step3-unsharded) (FullCheckpointer
                             restore + load_trainer_state_dict), 2 steps, records losses / grad norms and the full
                             weights after the first resumed step
  --phase verify           : numeric checks of the fused att_proj / ff_proj row orders and of the RoPE order against a
                             hand-written reference forward and against transformers' LlamaForCausalLM (world 1, no FSDP);
                             the orchestrator stores its output as layout_check.json
Afterwards it also runs the same 5 steps uninterrupted on 1 and 2 ranks (asserting the resumed losses equal them) and
resumes from ws1_safetensors/ (asserting the same numbers as ws1).
The safetensors twins (model.safetensors / optim.safetensors) are what OLMo's scripts/convert_pt_to_safetensors.py and
scripts/unshard.py --safe-tensors write: olmo.safetensors_util.state_dict_to_safetensors_file(torch.load(x.pt)).

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all): `gen_olmo.py
--grid NAME` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py) runs the same phases on 2 ranks with
that shape and the grid's batch, into tests/data/trainers/grid/olmo-0.6/NAME/: ws2/step3-unsharded, config.json,
expected.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "trainers", "olmo-0.6")
PY = sys.executable
TORCHRUN = os.path.join(os.path.dirname(PY), "torchrun")

B, T, V = 4, 32, 256
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
SEED = 6198  # TrainConfig.seed default
STEPS_BEFORE, STEPS_AFTER = 3, 2
CKPT_NAME = "step%d-unsharded" % STEPS_BEFORE


# ----------------------------------------------------------------------------------------------------------------
# Workarounds for this CPU-only, offline machine (see README "Workarounds")
# ----------------------------------------------------------------------------------------------------------------
def _mod(name, **attrs):
    import importlib.machinery

    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)  # importlib.util.find_spec() probes (torch._dynamo)
    sys.modules[name] = m
    return m


def olmo_import_shims():
    """olmo/util.py imports datasets, google.api_core.retry and cached_path at module level, olmo/train.py imports
    wandb, olmo/eval/downstream.py imports sklearn: none of them is used by the code run here (remote storage,
    HF datasets, W&B logging, downstream eval) and datasets / sklearn / google-api-core are not pure Python.
    Placeholders with the names imported are enough; a real package, if installed, is used instead."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        _mod("datasets", DatasetDict=type("DatasetDict", (), {}), Dataset=type("Dataset", (), {}))
    try:
        import google.api_core.retry  # noqa: F401
    except ImportError:
        class Retry:
            def __init__(self, *a, **k):
                pass

        g = sys.modules.get("google") or _mod("google")
        r = _mod("google.api_core.retry", Retry=Retry, if_transient_error=lambda e: False)
        g.api_core = _mod("google.api_core", retry=r)
    try:
        import cached_path  # noqa: F401
    except ImportError:
        from pathlib import Path

        def cached_path(p, *a, **k):
            s = str(p)
            if s.startswith("file://"):
                s = s[7:]
            if "://" in s:
                raise NotImplementedError("stub cached_path: remote path %s" % s)
            return Path(s)

        class SchemeClient:
            scheme = ()
            recoverable_errors = ()

            def __init__(self, resource):
                self.resource = resource

        sc = _mod("cached_path.schemes", SchemeClient=SchemeClient, add_scheme_client=lambda c: None)
        _mod("cached_path", cached_path=cached_path, schemes=sc, get_download_progress=lambda *a, **k: None)
    try:
        import wandb  # noqa: F401
    except ImportError:
        _mod("wandb", run=None)
    try:
        import sklearn.metrics  # noqa: F401
    except ImportError:
        _mod("sklearn")
        _mod("sklearn.metrics", f1_score=None)


def cpu_workarounds():
    """1) Trainer.trainer_state_dict() calls torch.cuda.get_rng_state(), which raises without a GPU: return None,
    as OLMo's main branch does since 0.6.0 (`"cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else
    None`); restore_rng_state's torch.cuda.set_rng_state(None) becomes a no-op likewise.
    2) OLMo 0.6.0's checkpoint.load_state_dict() calls torch.load(path) without weights_only=False; torch >= 2.6
    defaults to weights_only=True, which refuses train.pt (pathlib.PosixPath, numpy RNG state). OLMo's main branch
    passes weights_only=False: the same through torch's own switch."""
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    fsdp1_cpu_offload_fix()
    if not torch.cuda.is_available():
        torch.cuda.get_rng_state = lambda device="cuda": None
        _set = torch.cuda.set_rng_state
        torch.cuda.set_rng_state = lambda s, device="cuda": None if s is None else _set(s, device)


def fsdp1_cpu_offload_fix():
    """torch FSDP1 bugs that only show with the compute device on the CPU (both are in torch, not OLMo; world 1
    runs as NO_SHARD and meets neither):
    3) FullCheckpointer.save_checkpoint uses FullStateDictConfig(rank0_only=True, offload_to_cpu=True). On 2 CPU
    ranks FlatParamHandle.to_cpu() "moves" the unsharded flat param to the CPU (it is there already, same storage)
    and then frees the unsharded storage: rank 0 segfaults cloning the state dict. Offloading a CPU tensor to the
    CPU is nothing, so to_cpu() becomes an empty context when the compute device is the CPU."""
    import contextlib

    from torch.distributed.fsdp._flat_param import FlatParamHandle

    if getattr(FlatParamHandle.to_cpu, "_fixture_patched", False):
        return
    orig = FlatParamHandle.to_cpu

    @contextlib.contextmanager
    def to_cpu(self):
        if self.device.type == "cpu":
            yield
        else:
            with orig(self):
                yield

    to_cpu._fixture_patched = True
    FlatParamHandle.to_cpu = to_cpu

    # 4) FSDP.optim_state_dict(FullOptimStateDictConfig(offload_to_cpu=True)) all-gathers every state of a
    # FlatParameter (exp_avg, then exp_avg_sq) into ONE reused buffer and relies on value.cpu() to copy it out:
    # on the CPU .cpu() returns the same tensor, so without this exp_avg and exp_avg_sq of every sharded
    # parameter come out as the same (last gathered) values on 2 ranks. With the compute device on the CPU,
    # cpu_offload=False takes torch's own other branch, value.detach().clone().
    from torch.distributed.fsdp import _optim_utils

    orig_unflatten = _optim_utils._unflatten_orig_param_states

    def _unflatten_orig_param_states(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload):
        if cpu_offload and fsdp_param_info.state.compute_device.type == "cpu":
            cpu_offload = False
        return orig_unflatten(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload)

    _optim_utils._unflatten_orig_param_states = _unflatten_orig_param_states


def setup_olmo():
    import torch._dynamo  # noqa: F401  (imported before the placeholders: it probes optional packages by spec)

    olmo_import_shims()
    cpu_workarounds()


# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------
MODEL_FIELDS = dict(
    d_model=64,
    n_heads=4,
    n_kv_heads=2,  # GQA -> fused att_proj [q; k; v] = 64 + 32 + 32 rows
    n_layers=2,
    mlp_hidden_size=384,  # OLMo: ff_proj out features (both SwiGLU halves); ff_out in = 0.5 * 384 = 192
    activation_type="swiglu",
    block_type="sequential",  # "llama" block has separate q/k/v but no GQA (k/v = d_model unless MQA)
    block_group_size=1,
    rope=True,
    rope_full_precision=True,
    rope_theta=10000,
    flash_attention=False,
    attention_dropout=0.0,
    residual_dropout=0.0,
    embedding_dropout=0.0,
    attention_layer_norm=False,  # no qk-norm
    clip_qkv=None,
    layer_norm_type="rms",
    layer_norm_with_affine=True,
    layer_norm_eps=1e-5,
    bias_for_layer_norm=False,
    include_bias=False,
    embedding_layer_norm=False,
    norm_after=False,
    scale_logits=False,
    max_sequence_length=T,
    vocab_size=V,
    embedding_size=V,
    weight_tying=False,
    eos_token_id=0,
    pad_token_id=1,
    init_device="cpu",
    init_fn="normal",
    init_std=0.02,
    init_cutoff_factor=3.0,
    precision="fp32",
)


import grid as _grid  # noqa: E402  (tools/gen/trainers/grid.py: --grid NAME, seen by the children as FSDP_GRID)


def apply_grid():
    """A grid shape in place of the common model, and the grid's batch."""
    global B, T, V
    g = _grid.config()
    B, T, V = _grid.B, _grid.T, g["vocab"]
    MODEL_FIELDS.update(d_model=g["dim"], n_heads=g["n_heads"], n_kv_heads=g["n_kv_heads"], n_layers=g["n_layers"],
                        mlp_hidden_size=2 * g["ffn_hidden"], max_sequence_length=T, vocab_size=V, embedding_size=V)


if _grid.active():
    apply_grid()


def train_config(ckdir, world_size):
    from torch.distributed.fsdp import ShardingStrategy

    from olmo.config import (
        DistributedStrategy,
        FSDPConfig,
        FSDPPrecision,
        FSDPWrapStrategy,
        ModelConfig,
        OptimizerConfig,
        OptimizerType,
        SchedulerConfig,
        SchedulerType,
        TrainConfig,
    )

    return TrainConfig(
        run_name="fsdp-run-fixture",
        seed=SEED,
        model=ModelConfig(**MODEL_FIELDS),
        optimizer=OptimizerConfig(
            name=OptimizerType.adamw,
            learning_rate=LR,
            weight_decay=WD,
            betas=BETAS,
            eps=EPS,
            decay_norm_and_bias=True,  # weight decay on every parameter -> one param group
            decay_embeddings=True,
        ),
        scheduler=SchedulerConfig(name=SchedulerType.constant, t_warmup=0),
        save_folder=ckdir,
        save_overwrite=False,
        save_interval=None,
        save_interval_unsharded=STEPS_BEFORE,
        save_data_indices=False,
        max_duration=STEPS_BEFORE + STEPS_AFTER,
        global_train_batch_size=B,
        device_train_batch_size=B // world_size,
        device_train_microbatch_size=B // world_size,
        device_train_grad_accum=1,
        max_grad_norm=CLIP,
        precision="fp32",
        distributed_strategy=DistributedStrategy.fsdp,
        fsdp=FSDPConfig(
            use_orig_params=True,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            wrapping_strategy=FSDPWrapStrategy.by_block,
            precision=FSDPPrecision.pure,
        ),
    )


def make_batch():
    if _grid.active():
        from safetensors.torch import load_file

        b = load_file(_grid.BATCH)
        return b["input_ids"], b["labels"]
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    return seq[:, :T].to(torch.int32).contiguous(), seq[:, 1:].to(torch.int32).contiguous()


# ----------------------------------------------------------------------------------------------------------------
# Setup as scripts/train.py (v0.6.0) main()
# ----------------------------------------------------------------------------------------------------------------
def make_trainer_class():
    from olmo.train import Trainer

    class FixtureTrainer(Trainer):
        """Trainer with ONE change: model_forward takes the labels from batch["labels"] and scores every position.
        OLMo's own model_forward scores logits[:, :-1] against input_ids[:, 1:] and train_micro_batch divides the
        summed CE by input_ids.numel() (B*(T+1) for T+1 input tokens, not B*T): with that, the loss would be
        32/33 of the mean CE the fixture spec asks for. Everything else (train_batch, train_micro_batch,
        train_step: global loss reduce, clip_grads_and_collect_metrics, scheduler lr, optim.step) is OLMo's."""

        def model_forward(self, batch, loss_reduction="mean", compute_z_loss=False):
            logits = self.dist_model(input_ids=batch["input_ids"]).logits
            logits_for_loss = logits.reshape(-1, logits.size(-1))
            labels = batch["labels"].reshape(-1)
            ce_loss, z_loss = self.loss_fn(
                logits_for_loss, labels, ignore_index=-100, reduction=loss_reduction, compute_z_loss=compute_z_loss
            )
            return ce_loss, z_loss, logits

    return FixtureTrainer


def setup_everything(ckdir):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.utils.data import DataLoader

    from olmo.data import IterableDataset
    from olmo.model import OLMo
    from olmo.optim import build_optimizer, build_scheduler
    from olmo.torch_util import get_default_device, seed_all

    dist.init_process_group("gloo")  # scripts/train.py: "nccl"
    world_size = dist.get_world_size()
    cfg = train_config(ckdir, world_size)
    device = torch.device("cpu")

    # as scripts/train.py
    seed_all(cfg.seed)
    # train_loader: the Trainer needs one for restore bookkeeping (load_trainer_state_dict sets dataset.start_index
    # / reshuffles); batches are fed directly (one fixed batch every step), never from it.
    inp, lab = make_batch()
    rows = [{"input_ids": inp[i].long(), "labels": lab[i].long()} for i in range(B)]
    train_loader = DataLoader(
        IterableDataset(rows, B, seed=cfg.seed, shuffle=False, drop_last=True), batch_size=B // world_size
    )
    olmo_model = OLMo(cfg.model)
    olmo_model.set_activation_checkpointing(cfg.activation_checkpointing)
    wrap_policy = olmo_model.get_fsdp_wrap_policy(cfg.fsdp.wrapping_strategy)

    def dummy_init_fn(module):
        module.to_empty(device=get_default_device())

    dist_model = FSDP(
        olmo_model,
        sharding_strategy=cfg.fsdp.sharding_strategy,
        mixed_precision=cfg.fsdp_precision,
        auto_wrap_policy=wrap_policy,
        use_orig_params=cfg.fsdp.use_orig_params,
        limit_all_gathers=True,
        device_id=torch.device("cpu"),  # scripts/train.py: get_local_rank() (a CUDA device)
        param_init_fn=dummy_init_fn,
    )
    # as scripts/train.py: "when param_init_fn is None, FSDP will call reset_parameters() automatically"
    olmo_model.reset_parameters()

    optim = build_optimizer(cfg, dist_model)
    scheduler = build_scheduler(cfg)
    trainer = make_trainer_class()(
        cfg=cfg,
        epoch=cfg.epoch,
        model=olmo_model,
        dist_model=dist_model,
        optim=optim,
        scheduler=scheduler,
        train_loader=train_loader,
        device=device,
        evaluators=[],
        indices_file=None,
    )
    return trainer


def local_batch(batch_path, rank, world_size):
    from safetensors.torch import load_file

    b = load_file(batch_path)
    n = B // world_size
    return {
        "input_ids": b["input_ids"][rank * n:(rank + 1) * n].long(),
        "labels": b["labels"][rank * n:(rank + 1) * n].long(),
    }


def fit_step(trainer, batch):
    """One iteration of Trainer.fit()'s loop body (bookkeeping + train_step); returns (loss, total_grad_norm)."""
    from olmo.torch_util import get_world_size

    batch_size, seq_len = batch["input_ids"].shape
    assert seq_len == trainer.cfg.model.max_sequence_length
    assert batch_size == trainer.cfg.device_train_batch_size
    global_batch_size = batch_size * get_world_size()
    trainer.global_step += 1
    trainer.global_train_examples_seen_this_epoch += global_batch_size
    trainer.global_train_tokens_seen += global_batch_size * seq_len
    metrics = trainer.train_step(batch, reduce_global_loss=True)
    # loss: dist.reduce(..., 0) / world -> right on rank 0; total_grad_norm: all-reduced (sharded param group)
    return metrics["train/CrossEntropyLoss"], metrics["optim/total_grad_norm"]


def full_weights(trainer):
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.state_dict_type(
        trainer.dist_model, StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
    ):
        sd = trainer.dist_model.state_dict()
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def phase_train(args):
    import torch.distributed as dist

    from olmo.config import CheckpointType

    trainer = setup_everything(args.ckdir)
    batch = local_batch(args.batch, dist.get_rank(), dist.get_world_size())
    trainer.dist_model.train()
    losses, gnorms = [], []
    for _ in range(STEPS_BEFORE):
        l, g = fit_step(trainer, batch)
        losses.append(l)
        gnorms.append(g)
    # as Trainer.fit: save_interval_unsharded hit -> save_checkpoint(CheckpointType.unsharded)
    assert trainer.global_step % trainer.cfg.save_interval_unsharded == 0
    path, _ = trainer.save_checkpoint(CheckpointType.unsharded)
    if dist.get_rank() == 0:
        with open(args.result, "w") as f:
            json.dump({"losses_before_save": losses, "grad_norms_before_save": gnorms, "path": str(path)}, f)
    dist.barrier()
    dist.destroy_process_group()


def strict_checks(trainer, load_path):
    """OLMo's FullCheckpointer.restore_checkpoint (FSDP) fills every flat param with NaN, copies each parameter it
    finds by name (KeyError if one is missing) and raises if a NaN is left: complete, but extra keys in model.pt
    would be ignored silently. Check the other direction too, and the optimizer state, so a bad file fails loudly."""
    from olmo.checkpoint import load_state_dict

    names = [k.replace("_fsdp_wrapped_module.", "") for k, _ in trainer.model.named_parameters()]
    sd = load_state_dict(load_path, "model.pt", map_location="cpu")
    extra, missing = sorted(set(sd) - set(names)), sorted(set(names) - set(sd))
    if extra or missing:
        raise SystemExit("FAIL: model.pt keys differ from the model's: extra %s missing %s" % (extra, missing))
    osd = load_state_dict(load_path, "optim.pt", map_location="cpu")
    if len(osd["param_groups"]) != 1:
        raise SystemExit("FAIL: optim.pt has %d param groups, the optimizer 1" % len(osd["param_groups"]))
    g0 = osd["param_groups"][0]
    if "param_names" not in g0 or len(g0["param_names"]) != len(g0["params"]):
        raise SystemExit("FAIL: optim.pt param group needs param_names parallel to params")
    if g0["params"] and isinstance(g0["params"][0], int):
        # the integer-id form (torch's optimizer.state_dict(), as OLMo's DDP path writes): OLMo maps the ids to
        # names through param_names; do the same for the checks
        id2name = {i: n.replace("_fsdp_wrapped_module.", "") for i, n in zip(g0["params"], g0["param_names"])}
        osd = {"state": {id2name[i]: v for i, v in osd["state"].items()}, "param_groups": osd["param_groups"]}
    elif [n.replace("_fsdp_wrapped_module.", "") for n in g0["param_names"]] != list(g0["params"]):
        raise SystemExit("FAIL: optim.pt param_names (less _fsdp_wrapped_module.) != params")
    st_keys = set(osd["state"])
    if st_keys != set(names):
        raise SystemExit("FAIL: optim.pt state keys %s != params %s" % (sorted(st_keys), sorted(names)))
    for k in names:
        s = osd["state"][k]
        if set(s) != {"step", "exp_avg", "exp_avg_sq"}:
            raise SystemExit("FAIL: optim.pt state[%s] has %s" % (k, sorted(s)))
        if tuple(s["exp_avg"].shape) != tuple(sd[k].shape) or tuple(s["exp_avg_sq"].shape) != tuple(sd[k].shape):
            raise SystemExit("FAIL: optim.pt state[%s] moment shapes %s" % (k, tuple(s["exp_avg"].shape)))


def phase_resume(args):
    """Also used by check_olmo.py. Returns the result dict on rank 0."""
    import torch.distributed as dist

    from olmo.config import CheckpointType

    trainer = setup_everything(args.ckdir)
    load_path = args.load_path or os.path.join(args.ckdir, CKPT_NAME)
    if not os.path.isdir(load_path):
        raise SystemExit("FAIL: no checkpoint directory %s" % load_path)
    strict_checks(trainer, load_path)
    # as scripts/train.py: cfg.load_path -> trainer.restore_checkpoint(...) (the "-unsharded" suffix -> FullCheckpointer)
    trainer.restore_checkpoint(load_path, checkpoint_type=CheckpointType.unsharded)
    # every local (non-empty) parameter shard has its AdamW state after the load
    for group in trainer.optim.param_groups:
        for name, p in zip(group["param_names"], group["params"]):
            if p.numel() > 0 and set(trainer.optim.state[p]) != {"step", "exp_avg", "exp_avg_sq"}:
                raise SystemExit("FAIL: %s has optimizer state %s after restore" % (name, sorted(trainer.optim.state[p])))
    batch = local_batch(args.batch, dist.get_rank(), dist.get_world_size())
    trainer.dist_model.train()
    start_step, tokens_seen = trainer.global_step, trainer.global_train_tokens_seen
    losses, gnorms = [], []
    weights = None
    for i in range(STEPS_AFTER):
        l, g = fit_step(trainer, batch)
        losses.append(l)
        gnorms.append(g)
        if i == 0 and args.weights:
            weights = full_weights(trainer)
    res = {
        "start_step": start_step,
        "tokens_seen": tokens_seen,
        "resumed_losses": losses,
        "resumed_grad_norms": gnorms,
    }
    rank = dist.get_rank()
    if rank == 0:
        if args.weights:
            from safetensors.torch import save_file

            save_file(weights, args.weights)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
    return res if rank == 0 else None


# ----------------------------------------------------------------------------------------------------------------
# Numeric layout checks (no FSDP)
# ----------------------------------------------------------------------------------------------------------------
def reference_forward(sd, x, rope="rotate_half", swap_ff=False):
    """Plain-torch forward from the OLMo state dict with the row orders claimed in README:
    att_proj = [q (n_heads*hd) ; k (n_kv*hd) ; v (n_kv*hd)] rows, head-major inside each;
    ff_proj = [up (first 192 rows, the linear half) ; gate (last 192 rows, through SiLU)];
    RoPE rotate_half (x[j], x[j+hd/2]) pairs (Hugging Face order)."""
    D, H, KV, L, eps = 64, 4, 2, 2, 1e-5
    hd = D // H
    hid = 192
    bsz, t = x.shape

    def rms(h, w):
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(t).float(), inv)  # t, hd/2
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

    def rope_fn(q):  # b t h hd
        if rope == "rotate_half":
            a, b_ = q[..., : hd // 2], q[..., hd // 2:]
            return torch.cat([a * cos - b_ * sin, a * sin + b_ * cos], -1)
        q2 = q.view(*q.shape[:-1], hd // 2, 2)
        a, b_ = q2[..., 0], q2[..., 1]
        return torch.stack([a * cos - b_ * sin, a * sin + b_ * cos], -1).flatten(-2)

    h = sd["transformer.wte.weight"][x]
    for i in range(L):
        p = "transformer.blocks.%d." % i
        a = rms(h, sd[p + "attn_norm.weight"])
        W = sd[p + "att_proj.weight"]
        wq, wk, wv = W[: H * hd], W[H * hd: H * hd + KV * hd], W[H * hd + KV * hd:]
        q = rope_fn((a @ wq.T).view(bsz, t, H, hd))
        k = rope_fn((a @ wk.T).view(bsz, t, KV, hd))
        v = (a @ wv.T).view(bsz, t, KV, hd)
        k = k.repeat_interleave(H // KV, dim=2)  # q head j uses kv head j // (H/KV)
        v = v.repeat_interleave(H // KV, dim=2)
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2).reshape(bsz, t, H * hd)
        h = h + att @ sd[p + "attn_out.weight"].T
        f = rms(h, sd[p + "ff_norm.weight"])
        Wf = sd[p + "ff_proj.weight"]
        up, gate = (Wf[hid:], Wf[:hid]) if swap_ff else (Wf[:hid], Wf[hid:])
        g = torch.nn.functional.silu(f @ gate.T) * (f @ up.T)
        h = h + g @ sd[p + "ff_out.weight"].T
    h = rms(h, sd["transformer.ln_f.weight"])
    return h @ sd["transformer.ff_out.weight"].T


def olmo_to_hf_llama(sd):
    """OLMo names -> transformers LlamaForCausalLM names, splitting the fused tensors as README says."""
    out = {
        "model.embed_tokens.weight": sd["transformer.wte.weight"],
        "model.norm.weight": sd["transformer.ln_f.weight"],
        "lm_head.weight": sd["transformer.ff_out.weight"],
    }
    for i in range(2):
        p, q = "transformer.blocks.%d." % i, "model.layers.%d." % i
        W = sd[p + "att_proj.weight"]
        out[q + "self_attn.q_proj.weight"] = W[:64]
        out[q + "self_attn.k_proj.weight"] = W[64:96]
        out[q + "self_attn.v_proj.weight"] = W[96:128]
        out[q + "self_attn.o_proj.weight"] = sd[p + "attn_out.weight"]
        Wf = sd[p + "ff_proj.weight"]
        out[q + "mlp.up_proj.weight"] = Wf[:192]
        out[q + "mlp.gate_proj.weight"] = Wf[192:]
        out[q + "mlp.down_proj.weight"] = sd[p + "ff_out.weight"]
        out[q + "input_layernorm.weight"] = sd[p + "attn_norm.weight"]
        out[q + "post_attention_layernorm.weight"] = sd[p + "ff_norm.weight"]
    return out


def phase_verify(args):
    # transformers first: it probes optional packages (sklearn, datasets) by import spec, which the
    # placeholders of olmo_import_shims() do not have
    from transformers import LlamaConfig, LlamaForCausalLM

    setup_olmo()
    from olmo.config import ModelConfig
    from olmo.model import OLMo
    from olmo.safetensors_util import decode_key, encode_key, STKey

    torch.manual_seed(SEED)
    m = OLMo(ModelConfig(**MODEL_FIELDS))
    m.eval()
    # perturb the norm weights (init 1.0) so that a norm swapped with another would be caught too
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight") or n.endswith("ln_f.weight"):
                p.add_(0.1 * torch.randn_like(p))
    inp, _ = make_batch()
    x = inp.long()
    sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    res = {}
    with torch.no_grad():
        out = m(input_ids=x).logits
        res["max_abs_olmo_vs_reference_rotate_half"] = (out - reference_forward(sd, x)).abs().max().item()
        res["max_abs_olmo_vs_reference_interleaved_rope"] = (
            out - reference_forward(sd, x, rope="interleaved")).abs().max().item()
        res["max_abs_olmo_vs_reference_ff_halves_swapped"] = (
            out - reference_forward(sd, x, swap_ff=True)).abs().max().item()
        # OLMo's own split of the fused tensors: att_proj output .split(fused_dims), SwiGLU .chunk(2) -> (x, gate)
        blk = m.transformer.blocks[0]
        res["olmo_fused_dims"] = list(blk.fused_dims)
        h = torch.randn(3, 64)
        q, k, v = blk.att_proj(h).split(blk.fused_dims, dim=-1)
        W = sd["transformer.blocks.0.att_proj.weight"]
        res["att_proj_split_q64_k32_v32"] = bool(
            torch.allclose(q, h @ W[:64].T) and torch.allclose(k, h @ W[64:96].T) and torch.allclose(v, h @ W[96:].T)
        )
        Wf = sd["transformer.blocks.0.ff_proj.weight"]
        y = blk.act(blk.ff_proj(h))
        res["ff_proj_first_half_up_second_half_gate"] = bool(
            torch.allclose(y, torch.nn.functional.silu(h @ Wf[192:].T) * (h @ Wf[:192].T), atol=1e-6)
        )
        # transformers LlamaForCausalLM (rotate_half RoPE) with the split weights gives the same logits
        try:
            hc = LlamaConfig(
                vocab_size=V, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                max_position_embeddings=T, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                hidden_act="silu",
            )
            hc._attn_implementation = "eager"
            hf = LlamaForCausalLM(hc).eval()
            missing = hf.load_state_dict(olmo_to_hf_llama(sd), strict=False)
            res["hf_llama_load_missing_unexpected"] = [list(missing.missing_keys), list(missing.unexpected_keys)]
            res["max_abs_olmo_vs_hf_llama"] = (out - hf(input_ids=x).logits).abs().max().item()
        except Exception as e:  # noqa: BLE001
            res["hf_llama_error"] = repr(e)
    # safetensors_util key encoding examples
    ex = {}
    for key in [STKey(("transformer.wte.weight",), False), STKey(("state", "transformer.wte.weight", "exp_avg"), False),
                STKey(("param_groups",), True)]:
        e = encode_key(key)
        assert decode_key(e) == key
        ex[repr((key.keys, key.value_is_pickled))] = e
    res["safetensors_key_examples"] = ex
    res["state_dict_keys"] = {k: [list(v.shape), str(v.dtype)] for k, v in sd.items()}
    print(json.dumps(res, indent=1))
    return res


# ----------------------------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------------------------
def run_torchrun(nproc, phase, ckdir, batch, result, weights=None, port=29541, load_path=None, script=None,
                 steps=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        TORCHRUN, "--nproc_per_node", str(nproc), "--master_port", str(port),
        script or os.path.abspath(__file__), "--phase", phase, "--ckdir", ckdir, "--batch", batch,
        "--result", result,
    ]
    if weights:
        cmd += ["--weights", weights]
    if load_path:
        cmd += ["--load-path", load_path]
    if steps:
        cmd += ["--steps", str(steps)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def make_safetensors_twin(src, dst):
    """What OLMo's scripts/unshard.py --safe-tensors writes (model.safetensors, optim.safetensors, train.pt,
    config.yaml) from the FullCheckpointer's .pt files, via olmo.safetensors_util; scripts/convert_pt_to_safetensors.py
    is the same call per file."""
    setup_olmo()
    from olmo.safetensors_util import state_dict_to_safetensors_file

    os.makedirs(dst)
    for name in ("model", "optim"):
        state_dict_to_safetensors_file(torch.load(os.path.join(src, name + ".pt"), weights_only=False),
                                       os.path.join(dst, name + ".safetensors"))
    for name in ("train.pt", "config.yaml"):
        shutil.copy(os.path.join(src, name), os.path.join(dst, name))


def orchestrate(out):
    from safetensors.torch import load_file, save_file

    readme = os.path.join(out, "README.md")  # hand-written: kept across regeneration
    keep = open(readme).read() if os.path.exists(readme) else None
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    if keep is not None:
        with open(readme, "w") as f:
            f.write(keep)
    inp, lab = make_batch()
    batch = os.path.join(out, "batch.safetensors")
    save_file({"input_ids": inp, "labels": lab}, batch)
    tmp = os.path.join(out, "_tmp")
    os.makedirs(tmp)
    expected = {}
    for ws in (1, 2):
        ck = os.path.join(out, "ws%d" % ws)
        r1, r2 = os.path.join(tmp, "t%d.json" % ws), os.path.join(tmp, "r%d.json" % ws)
        # ws2's weights are not kept (size)
        w = os.path.join(out if ws == 1 else tmp, "ws%d_after_resume_step.safetensors" % ws)
        run_torchrun(ws, "train", ck, batch, r1)
        run_torchrun(ws, "resume", ck, batch, r2, weights=w)
        a, b = json.load(open(r1)), json.load(open(r2))
        expected["ws%d" % ws] = {
            "losses_before_save": a["losses_before_save"],
            "grad_norms_before_save": a["grad_norms_before_save"],
            "resumed_losses": b["resumed_losses"],
            "resumed_grad_norms": b["resumed_grad_norms"],
            "resumed_start_step": b["start_step"],
            "resumed_tokens_seen": b["tokens_seen"],
        }
        # the same 5 steps without the save / restore: the resumed steps must give the same numbers
        r0 = os.path.join(tmp, "u%d.json" % ws)
        run_torchrun(ws, "train", os.path.join(tmp, "u%d" % ws), batch, r0, steps=STEPS_BEFORE + STEPS_AFTER)
        u = json.load(open(r0))
        expected["ws%d" % ws]["uninterrupted_5_step_losses"] = u["losses_before_save"]
        expected["ws%d" % ws]["uninterrupted_5_step_grad_norms"] = u["grad_norms_before_save"]
        assert u["losses_before_save"][STEPS_BEFORE:] == b["resumed_losses"], (u, b)
        if ws == 2:
            w1 = load_file(os.path.join(out, "ws1_after_resume_step.safetensors"))
            w2 = load_file(w)
            assert set(w1) == set(w2)
            expected["ws2"]["after_resume_step_max_abs_diff_vs_ws1_file"] = max(
                (w1[k] - w2[k]).abs().max().item() for k in w1
            )
    # safetensors twin of ws1's checkpoint; resuming from it must give the same numbers
    st_dir = os.path.join(out, "ws1_safetensors", CKPT_NAME)
    make_safetensors_twin(os.path.join(out, "ws1", CKPT_NAME), st_dir)
    r3 = os.path.join(tmp, "st.json")
    scratch = os.path.join(tmp, "scratch")
    run_torchrun(1, "resume", scratch, batch, r3, load_path=st_dir)
    c = json.load(open(r3))
    assert c["resumed_losses"] == expected["ws1"]["resumed_losses"], (c, expected["ws1"])
    expected["ws1_safetensors"] = {"resumed_losses": c["resumed_losses"], "resumed_grad_norms": c["resumed_grad_norms"]}
    # numeric layout checks (fused row orders, RoPE order, HF Llama equivalence) -> layout_check.json
    v = subprocess.run([PY, os.path.abspath(__file__), "--phase", "verify"], check=True, capture_output=True,
                       text=True, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    v = json.loads(v[v.index("{"):])
    v.pop("state_dict_keys")
    with open(os.path.join(out, "layout_check.json"), "w") as f:
        json.dump(v, f, indent=1)
        f.write("\n")
    shutil.rmtree(tmp)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    conf = {
        "trainer": "ai2-olmo 0.6.0 (olmo.train.Trainer + olmo.checkpoint.FullCheckpointer), FSDP1 by_block, "
                   "use_orig_params=True, FULL_SHARD",
        "olmo_ModelConfig": MODEL_FIELDS,
        "olmo_TrainConfig": {
            "seed": SEED, "precision": "fp32", "max_grad_norm": CLIP, "max_grad_norm_ratio": None,
            "global_train_batch_size": B, "device_train_batch_size": "4 / world",
            "device_train_microbatch_size": "4 / world", "max_duration": STEPS_BEFORE + STEPS_AFTER,
            "save_interval_unsharded": STEPS_BEFORE, "distributed_strategy": "fsdp",
            "fsdp": {"use_orig_params": True, "sharding_strategy": "FULL_SHARD", "wrapping_strategy": "by_block",
                     "precision": "pure"},
            "optimizer": {"name": "adamw", "learning_rate": LR, "weight_decay": WD, "betas": list(BETAS),
                          "eps": EPS, "decay_norm_and_bias": True, "decay_embeddings": True},
            "scheduler": {"name": "constant", "t_warmup": 0},
        },
        "plain": {
            "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab": V,
            "ffn_hidden": 192, "norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "tied": False,
            "bias": False, "dtype": "float32",
        },
        "rope_order": "rotate_half",
        "fused": {
            "att_proj": "[q (n_heads*head_dim=64 rows); k (n_kv*head_dim=32); v (32)], each head-major",
            "ff_proj": "[up (192 rows, linear half = Llama w3 / HF up_proj); gate (192 rows, through SiLU = Llama w1 "
                       "/ HF gate_proj)]",
        },
        "optimizer": {
            "type": "olmo.optim.AdamW (subclass of torch.optim.AdamW) from olmo.optim.build_optimizer",
            "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD,
            "weight_decay_on": "every parameter (one param group)",
            "grad_clip_total_norm": CLIP, "grad_clip": "Optimizer.clip_grads_and_collect_metrics, coef = "
            "max_norm / (total_norm + 1e-6) clamped to 1",
            "lr_schedule": "olmo.optim.ConstantScheduler",
        },
        "loss": "mean CE over the B*T labels (Trainer.model_forward overridden: see README)",
        "batch": {"B": B, "T": T, "seed": 0, "ranks": "contiguous halves of the batch rows"},
        "steps_before_save": STEPS_BEFORE, "steps_after_resume": STEPS_AFTER,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
        f.write("\n")
    print(json.dumps(expected, indent=1))


def orchestrate_grid(out):
    """--grid NAME: the same train and resume phases on 2 ranks with the grid's shape and batch, into
    tests/data/trainers/grid/olmo-0.6/NAME/ (ws2/step3-unsharded, config.json, expected.json)."""
    os.makedirs(out, exist_ok=True)
    batch = _grid.write_batch()
    tmp = os.path.join(out, "_tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    expected = {}
    for ws in (2,):
        ck = os.path.join(out, "ws%d" % ws)
        shutil.rmtree(ck, ignore_errors=True)
        r1, r2 = os.path.join(tmp, "t%d.json" % ws), os.path.join(tmp, "r%d.json" % ws)
        run_torchrun(ws, "train", ck, batch, r1)
        run_torchrun(ws, "resume", ck, batch, r2)
        a, b = json.load(open(r1)), json.load(open(r2))
        expected["ws%d" % ws] = {
            "losses_before_save": a["losses_before_save"], "grad_norms_before_save": a["grad_norms_before_save"],
            "resumed_losses": b["resumed_losses"], "resumed_grad_norms": b["resumed_grad_norms"],
            "resumed_start_step": b["start_step"], "resumed_tokens_seen": b["tokens_seen"],
        }
    shutil.rmtree(tmp)
    _grid.write_expected(out, expected)
    _grid.write_config(out, "ai2-olmo 0.6.0 (Trainer + FullCheckpointer), FSDP1 by_block", {
        "olmo_ModelConfig": MODEL_FIELDS,
        "att_proj_rows": "[q (n_heads*head_dim); k (n_kv_heads*head_dim); v (n_kv_heads*head_dim)]",
        "ff_proj_rows": "[up (ffn_hidden); gate (ffn_hidden)] (mlp_hidden_size = 2 * ffn_hidden)",
        "rope_order": "rotate_half"})
    print(json.dumps(expected, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--grid", choices=sorted(_grid.CONFIGS), help="a grid shape (tools/gen/trainers/grid.py)")
    ap.add_argument("--phase", choices=["train", "resume", "verify"])
    ap.add_argument("--ckdir")
    ap.add_argument("--load-path", dest="load_path")
    ap.add_argument("--batch")
    ap.add_argument("--result")
    ap.add_argument("--weights")
    ap.add_argument("--steps", type=int, help="train phase: steps before the save (default 3)")
    args = ap.parse_args()
    if args.grid:
        _grid.select(args.grid)
        apply_grid()
        if args.out == DEFAULT_OUT:
            args.out = _grid.out_dir("olmo-0.6")
    if args.steps:
        global STEPS_BEFORE, CKPT_NAME
        STEPS_BEFORE, CKPT_NAME = args.steps, "step%d-unsharded" % args.steps
    if args.phase in ("train", "resume"):
        setup_olmo()
        import logging

        logging.basicConfig(level=logging.WARNING)
        (phase_train if args.phase == "train" else phase_resume)(args)
        # gloo teardown on this machine sometimes aborts a rank at interpreter exit after all work is done
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    elif args.phase == "verify":
        phase_verify(args)
    elif _grid.active():
        orchestrate_grid(os.path.abspath(args.out))
    else:
        orchestrate(os.path.abspath(args.out))


if __name__ == "__main__":
    main()
