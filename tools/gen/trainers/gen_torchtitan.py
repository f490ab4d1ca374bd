#!/usr/bin/env python3
"""Fixtures written by torchtitan's own code (0.3.0 and, for the previous layout, 0.2.2).

Regenerate (from the repository root, 2 CPU cores, no GPU; about 1-2 minutes per version):

    OMP_NUM_THREADS=1 /work/torchenv/bin/python tools/gen/trainers/gen_torchtitan.py --version 0.3
    OMP_NUM_THREADS=1 /work/torchenv/bin/python tools/gen/trainers/gen_torchtitan.py --version 0.2

Each writes tests/data/trainers/torchtitan-<v>/ : batch.safetensors, config.json, ws1/, ws2/ (the
checkpoint folders as torchtitan's CheckpointManager writes them: <folder>/step-3/{.metadata,__R_0.distcp}),
expected.json, ws1_after_resume_step.safetensors (ws2's weights after that step are only compared with
ws1's, the max abs difference goes into expected.json). README.md there is written by hand; --layout FILE
also writes a JSON dump of every key of each .metadata (with the decoded non-tensor values) for it.

The script sets sys.path itself (TORCHTITAN_03 / TORCHTITAN_02 env vars override the seed package
folders, default /work/seedpkgs/torchtitan and /work/seedpkgs/torchtitan-0.2.2); it re-launches itself
under /work/torchenv/bin/torchrun for every phase (world 1 and 2, gloo), and every phase is a fresh process:
  train  : fresh init (seed 0) -> 3 steps -> CheckpointManager.save(3)   (step-3 is an interval save: full state)
  resume : fresh init (seed 0) -> CheckpointManager.load() (latest step-N) -> 2 steps, losses/grad norms
check_torchtitan.py reuses the resume phase of this file.

Workarounds for torch 2.11 on CPU (see /work/shared/seed-systems/README.md):
  0.3.0: torch.distributed.fsdp.DataParallelMeshDims placeholder dataclass (0.3.0 imports it, torch 2.11 lacks it;
         only passed to fully_shard when not None, and it is None here); ScaledDotProductAttention (causal SDPA,
         torchtitan's own class) as inner_attention instead of FlexAttention (no CPU backward; one document per
         row so the mask is the same causal mask); torchdata (a dependency of torchtitan.components.dataloader
         that the 0.3.0 seed folder lacks) is imported from the 0.2.2 seed folder (torchdata 0.11.0).
  both:  FSDPModule.set_force_sum_reduction_for_comms(True) at world 2 (torchtitan's gradient_divide_factor 1.0
         becomes a PREMUL_SUM reduce-scatter, which gloo lacks; SUM gives the same result);
         stub modules for `torch.utils.tensorboard` and `datasets` (not installed; components.metrics and
         hf_datasets import them at module level, pulled in by importing the Trainer class whose
         state_dict/load_state_dict give the train_state entry, and in 0.2.2 by torchtitan.models.llama3).
  0.2.2: attn_type "sdpa" (its own default).

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all):
`gen_torchtitan.py --version 0.3 --grid NAME` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py) runs
the same phases on 2 ranks with that shape and the grid's batch, into
tests/data/trainers/grid/torchtitan-0.3/NAME/: ws2/step-3, config.json, expected.json.
"""
import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SEED03 = os.environ.get("TORCHTITAN_03", "/work/seedpkgs/torchtitan")
SEED02 = os.environ.get("TORCHTITAN_02", "/work/seedpkgs/torchtitan-0.2.2")
TORCHRUN = os.environ.get("TORCHRUN", "/work/torchenv/bin/torchrun")

# ---- the common config -------------------------------------------------------------------------------
DIM, N_LAYERS, N_HEADS, N_KV, VOCAB, FFN, EPS, THETA = 64, 2, 4, 2, 256, 192, 1e-5, 10000.0
HEAD_DIM = DIM // N_HEADS
B, T = 4, 32
LR, BETAS, ADAM_EPS, WD, MAX_NORM = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
STEPS_BEFORE, STEPS_AFTER = 3, 2
TRAINING_STEPS = STEPS_BEFORE + STEPS_AFTER  # training.steps of the job
LR_TOTAL_STEPS = 1_000_000  # lr_scheduler.total_steps: the constant schedule never reaches its (empty) decay phase
INIT_SEED = 0

import grid as _grid  # noqa: E402  (tools/gen/trainers/grid.py: --grid NAME, seen by the children as FSDP_GRID)



def apply_grid():
    """A grid shape in place of the common model (0.3 only), and the grid's batch."""
    global DIM, N_LAYERS, N_HEADS, N_KV, VOCAB, FFN, HEAD_DIM, B, T
    g = _grid.config()
    DIM, N_LAYERS, N_HEADS, N_KV, VOCAB, FFN = (g[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab",
                                                               "ffn_hidden"))
    HEAD_DIM = DIM // N_HEADS
    B, T = _grid.B, _grid.T


if _grid.active():
    apply_grid()


def setup_path(version):
    """Put the right torchtitan first on sys.path and install the import workarounds. Call before torch imports."""
    seed = SEED03 if version == "0.3" else SEED02
    sys.path = [p for p in sys.path if p not in (SEED03, SEED02)]
    sys.path.insert(0, seed)
    import torch.distributed.fsdp as fsdp_mod

    if version == "0.3":
        if not hasattr(fsdp_mod, "DataParallelMeshDims"):
            @dataclasses.dataclass
            class DataParallelMeshDims:  # placeholder: torch 2.11 lacks it; only used when not None
                shard: object = None
                replicate: object = None

            fsdp_mod.DataParallelMeshDims = DataParallelMeshDims
        if "torchdata" not in sys.modules:
            try:
                import torchdata  # noqa: F401
            except ImportError:
                spec = importlib.util.spec_from_file_location(
                    "torchdata", os.path.join(SEED02, "torchdata", "__init__.py"),
                    submodule_search_locations=[os.path.join(SEED02, "torchdata")])
                mod = importlib.util.module_from_spec(spec)
                sys.modules["torchdata"] = mod
                spec.loader.exec_module(mod)
    try:  # both versions' components.metrics import SummaryWriter at module level (the Trainer class needs it)
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        m = types.ModuleType("torch.utils.tensorboard")
        m.SummaryWriter = None
        sys.modules["torch.utils.tensorboard"] = m
    if True:  # both: torchtitan.hf_datasets imports `datasets` at module level (pulled in by the Trainer class)
        for name in ("datasets", "datasets.distributed"):
            if name not in sys.modules:
                try:
                    __import__(name)
                except ImportError:
                    m = types.ModuleType(name)
                    m.Dataset = m.load_dataset = m.split_dataset_by_node = None
                    sys.modules[name] = m


def make_batch():
    import torch
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, VOCAB, (B, T + 1), generator=g, dtype=torch.int64)
    return seq[:, :-1].to(torch.int32).contiguous(), seq[:, 1:].to(torch.int32).contiguous()


# ---- data: torchtitan's ParallelAwareDataloader over a dataset that yields this rank's rows ---------------
def make_dataset_class():
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.utils.data import IterableDataset

    class FixedBatchDataset(IterableDataset, Stateful):
        """Yields ({"input": row}, label_row) for this rank's rows, cyclically, forever (like HuggingFaceTextDataset
        with infinite=True). State: {"sample_idx": samples yielded so far}."""

        def __init__(self, inputs, labels):
            self.inputs, self.labels = inputs.long(), labels.long()
            self._sample_idx = 0

        def __iter__(self):
            while True:
                i = self._sample_idx % self.inputs.shape[0]
                self._sample_idx += 1
                yield {"input": self.inputs[i]}, self.labels[i]

        def state_dict(self):
            return {"sample_idx": self._sample_idx}

        def load_state_dict(self, sd):
            self._sample_idx = sd["sample_idx"]

    return FixedBatchDataset


# ---- model / optimizer / scheduler / checkpointer, version by version ---------------------------------------
def model_config_03(fuse_qkv=True):
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (Llama3Model, _EMBEDDING_INIT, _NORM_INIT, _build_llama3_layers,
                                          _output_linear_init)

    # int(8*64/3)=170 -> 192; a grid shape gives its hidden size as it is
    hidden = FFN if _grid.active() else compute_ffn_hidden_dim(DIM, multiple_of=64)
    assert hidden == FFN, hidden
    rope = ComplexRoPE.Config(dim=HEAD_DIM, max_seq_len=T, theta=THETA, scaling="none")
    layers = _build_llama3_layers(n_layers=N_LAYERS, dim=DIM, n_heads=N_HEADS, n_kv_heads=N_KV, hidden_dim=hidden,
                                  rope=rope, fuse_qkv=fuse_qkv, attn_backend="flex")
    for lc in layers:  # workaround: flex_attention has no CPU backward -> torchtitan's causal SDPA
        lc.attention.inner_attention = ScaledDotProductAttention.Config()
    return Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, eps=EPS, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)),
        layers=layers)


def model_args_02():
    from torchtitan.models.llama3 import TransformerModelArgs
    from torchtitan.models.llama3.model.args import RoPEScalingArgs
    # 0.2.2 always applies Llama-3.1 rope scaling; with these args every band has wavelen < high_freq_wavelen
    # (= 131072/4 = 32768 > 2*pi*10000**(14/16) = 19869), so torch.where keeps every frequency unchanged
    # (verified bit-exactly against the unscaled frequencies in verify_rope_02).
    return TransformerModelArgs(
        dim=DIM, n_layers=N_LAYERS, n_heads=N_HEADS, n_kv_heads=N_KV, vocab_size=VOCAB, multiple_of=64,
        ffn_dim_multiplier=None, norm_eps=EPS, rope_theta=THETA,
        rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=131072),
        max_seq_len=T, depth_init=True, attn_type="sdpa", attn_mask_type="causal")


def build_model(version, mesh, world, fuse_qkv=True):
    """As the trainer does: build on meta, parallelize (FSDP2), to_empty, init_weights -- except that the init
    runs on the full (unsharded) CPU model before fully_shard, so world 1 and 2 start from the same weights."""
    import torch
    torch.manual_seed(INIT_SEED)
    if version == "0.3":
        from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
        cfg = model_config_03(fuse_qkv)
        with torch.device("meta"):
            model = cfg.build()
        model.verify_module_protocol()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        # 0.3.0's parallelize_llama always runs apply_fsdp_to_decoder (also with shard degree 1)
        apply_fsdp_to_decoder(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    else:
        from torchtitan.models.llama3 import Transformer
        from torchtitan.models.llama3.infra.parallelize import apply_fsdp
        args = model_args_02()
        with torch.device("meta"):
            model = Transformer(args)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        if world > 1:  # 0.2.2's parallelize_llama applies FSDP only when parallel_dims.fsdp_enabled (dp_shard > 1)
            apply_fsdp(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    if world > 1:
        # workaround: torchtitan sets gradient_divide_factor 1.0 (loss is already / global tokens), which FSDP2 runs
        # as a PREMUL_SUM(1.0) reduce-scatter that gloo lacks; forcing SUM collectives gives the same numbers
        # (post-divide by 1.0 is skipped)
        from torch.distributed.fsdp import FSDPModule
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    model.train()
    return model


def build_optim_sched(version, model):
    import torch
    if version == "0.3":
        from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, default_adamw
        cfg = default_adamw(lr=LR)  # AdamW, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on every param (r".*")
        cfg = dataclasses.replace(cfg, implementation="fused")
        assert cfg.param_groups[0].optimizer_kwargs == {"lr": LR, "betas": BETAS, "eps": ADAM_EPS,
                                                        "weight_decay": WD}
        optimizers = cfg.build(model_parts=[model])
        sched_cfg = LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=0.0, total_steps=LR_TOTAL_STEPS)
        lr_schedulers = sched_cfg.build(optimizers=optimizers, training_steps=TRAINING_STEPS)
    else:
        from torchtitan.components.lr_scheduler import build_lr_schedulers
        from torchtitan.components.optimizer import build_optimizers
        from torchtitan.config.job_config import LRScheduler, Optimizer
        ocfg = Optimizer(name="AdamW", lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=ADAM_EPS, weight_decay=WD,
                         implementation="fused")
        pd = types.SimpleNamespace(ep_enabled=False, pp_enabled=False)  # build_optimizers only reads these
        optimizers = build_optimizers([model], ocfg, pd)
        lr_schedulers = build_lr_schedulers(
            optimizers, LRScheduler(warmup_steps=0, decay_ratio=0.0, total_steps=LR_TOTAL_STEPS), TRAINING_STEPS)
    return optimizers, lr_schedulers


class TrainState:
    """The trainer object's checkpointed state (Trainer.state_dict / load_state_dict of either version)."""

    def __init__(self, version):
        if version == "0.3":
            from torchtitan.trainer import Trainer
        else:
            from torchtitan.train import Trainer
        self._sd, self._lsd = Trainer.state_dict, Trainer.load_state_dict
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return self._sd(self)

    def load_state_dict(self, sd):
        self._lsd(self, sd)


def build_checkpointer(version, folder, dataloader, model, optimizers, lr_schedulers, train_state):
    if version == "0.3":
        from torchtitan.components.checkpoint import CheckpointManager
        cfg = CheckpointManager.Config(enable=True, folder=folder, interval=STEPS_BEFORE, keep_latest_k=0,
                                       last_save_model_only=True, async_mode="disabled")
        return cfg.build(dataloader=dataloader, model_parts=[model], optimizers=optimizers,
                         lr_schedulers=lr_schedulers, states={"train_state": train_state}, sd_adapter=None,
                         base_folder="")
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config.job_config import Checkpoint
    cfg = Checkpoint(enable=True, folder=folder, interval=STEPS_BEFORE, keep_latest_k=0, last_save_model_only=True,
                     async_mode="disabled")
    return CheckpointManager(dataloader=dataloader, model_parts=[model], optimizers=optimizers,
                             lr_schedulers=lr_schedulers, states={"train_state": train_state},
                             checkpoint_config=cfg, sd_adapter=None, base_folder="", ft_manager=None)


def loss_and_clip(version):
    if version == "0.3":
        from torchtitan.components.loss import CrossEntropyLoss
        from torchtitan.distributed.utils import clip_grad_norm_
        lf = CrossEntropyLoss.Config().build()

        def loss_fn(pred, labels, gvt):
            return lf(pred, labels, gvt)[0]
    else:
        from torchtitan.components.loss import cross_entropy_loss
        from torchtitan.distributed.utils import clip_grad_norm_

        def loss_fn(pred, labels, gvt):
            return cross_entropy_loss(pred, labels) / gvt
    return loss_fn, clip_grad_norm_


class Job:
    """One process of one torchtitan job (world 1 or 2)."""

    def __init__(self, version, folder, batch_path, fuse_qkv=True):
        import torch
        import torch.distributed as dist
        from safetensors.torch import load_file
        from torch.distributed.device_mesh import init_device_mesh
        self.version = version
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        assert B % self.world == 0
        self.mesh = init_device_mesh("cpu", (self.world,), mesh_dim_names=("fsdp",))
        batch = load_file(batch_path)
        per = B // self.world
        rows = slice(self.rank * per, (self.rank + 1) * per)
        if version == "0.3":
            from torchtitan.components.dataloader import ParallelAwareDataloader
        else:
            from torchtitan.components.dataloader import ParallelAwareDataloader
        ds = make_dataset_class()(batch["input_ids"][rows], batch["labels"][rows])
        self.dataloader = ParallelAwareDataloader(ds, dp_rank=self.rank, dp_world_size=self.world, batch_size=per,
                                                  num_workers=0)
        self.model = build_model(version, self.mesh, self.world, fuse_qkv)
        self.optimizers, self.lr_schedulers = build_optim_sched(version, self.model)
        self.train_state = TrainState(version)
        self.checkpointer = build_checkpointer(version, folder, self.dataloader, self.model, self.optimizers,
                                               self.lr_schedulers, self.train_state) if folder else None
        self.loss_fn, self.clip = loss_and_clip(version)
        self.data_iter = None
        self.torch, self.dist = torch, dist

    def train_step(self):
        """Trainer.train_step without PP / grad accumulation: zero_grad, global valid-token count, fwd+bwd with
        loss = local CE sum / global tokens (FSDP gradient division disabled), clip, optimizer and lr step."""
        torch, dist = self.torch, self.dist
        if self.data_iter is None:
            self.data_iter = iter(self.dataloader)
        self.optimizers.zero_grad()
        input_dict, labels = next(self.data_iter)
        local_valid = (labels != -100).sum()
        gvt = local_valid.clone()
        if self.world > 1:
            dist.all_reduce(gvt)
        if self.version == "0.2":
            gvt = gvt.float()
        self.train_state.ntokens_seen += labels.numel()
        pred = self.model(input_dict["input"])
        loss = self.loss_fn(pred, labels, gvt)
        del pred
        loss.backward()
        params = [p for p in self.model.parameters()]
        if self.version == "0.3":
            gn = self.clip(params, MAX_NORM, foreach=True, pp_mesh=None, ep_enabled=False)
        else:
            gn = self.clip(params, MAX_NORM, foreach=True, pp_mesh=None, ep_enabled=False)
        self.optimizers.step()
        self.lr_schedulers.step()
        self.train_state.step += 1
        gl = loss.detach().clone()
        if self.world > 1:
            dist.all_reduce(gl)  # sum over ranks of (local sum / global tokens) = global mean
        return gl.item(), gn.item()

    def full_state_dict(self):
        """Unsharded float32 model state_dict under the checkpoint's (state_dict) names."""
        from torch.distributed.tensor import DTensor
        out = {}
        for k, v in self.model.state_dict().items():
            if isinstance(v, DTensor):
                v = v.full_tensor()
            out[k] = v.detach().clone().contiguous()
        return out


# ---- phases ----------------------------------------------------------------------------------------------------
def phase_train(a):
    job = Job(a.version, a.ckpt, a.batch)
    losses, gns = [], []
    for _ in range(STEPS_BEFORE):
        l, g = job.train_step()
        losses.append(l)
        gns.append(g)
        job.checkpointer.save(job.train_state.step, last_step=(job.train_state.step == TRAINING_STEPS))
    job.checkpointer.close()
    if job.rank == 0 and a.result:
        with open(a.result, "w") as f:
            json.dump({"losses_before_save": losses, "grad_norms_before_save": gns}, f)
    job.dist.barrier()
    job.dist.destroy_process_group()


def phase_resume(a):
    """Fresh process: trainer init, CheckpointManager.load() (strict for missing keys: DCP raises), optional check
    for keys in the checkpoint that nothing loaded (torchtitan ignores those silently), then 2 steps."""
    import torch.distributed.checkpoint as dcp
    job = Job(a.version, a.ckpt, a.batch)
    ckm = job.checkpointer
    step = ckm._find_load_step() if getattr(a, "step", -1) in (None, -1) else a.step
    if step < 0:
        raise SystemExit(f"no step-N checkpoint with a .metadata under {a.ckpt}")
    ckpt_id = ckm._create_checkpoint_id(step)
    requested = set(_flat_keys(ckm._states_to_load(model_only=False)))
    stored = set(dcp.FileSystemReader(ckpt_id).read_metadata().state_dict_metadata.keys())
    job.dist.barrier()
    ok = ckm.load(step=step)
    if not ok:
        raise SystemExit("CheckpointManager.load() found nothing to load")
    if job.train_state.step != step:
        raise SystemExit(f"train_state.step {job.train_state.step} != folder step-{step}")
    extra = sorted(stored - _all_rank_keys(job, requested))
    if extra and not a.allow_extra:
        raise SystemExit(f"checkpoint has {len(extra)} keys that nothing loaded (torchtitan would ignore them): "
                         f"{extra[:10]}")
    losses, gns = [], []
    for i in range(STEPS_AFTER):
        l, g = job.train_step()
        losses.append(l)
        gns.append(g)
        if i == 0 and a.weights:
            sd = job.full_state_dict()
            if job.rank == 0:
                from safetensors.torch import save_file
                save_file(sd, a.weights)
    res = {"loaded_step": step, "resumed_losses": losses, "resumed_grad_norms": gns,
           "lr_after": [g["lr"] for o in job.optimizers for g in o.param_groups][:1]}
    if job.rank == 0:
        if a.result:
            with open(a.result, "w") as f:
                json.dump(res, f)
        print(json.dumps(res))
    ckm.close()
    job.dist.barrier()
    job.dist.destroy_process_group()


def _flat_keys(sd, prefix=""):
    """DCP's flattening of nested dicts (torch.distributed.checkpoint._nested_dict.flatten_state_dict)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict
    flat, _ = flatten_state_dict(_stateful_to_state_dict(sd))
    return flat.keys()


def _all_rank_keys(job, keys):
    if job.world == 1:
        return set(keys)
    out = [None] * job.world
    job.dist.all_gather_object(out, sorted(keys))
    return set(k for ks in out for k in ks)


def phase_verify(a):
    """World 1, 0.3.0 only: numeric checks of the fused wqkv row order and of the optimizer moments' order.
    (1) state_dict's split wq/wk/wv == the rule applied to the wqkv parameter;
    (2) the fused QKV projection == standard GQA projections with the split wq/wk/wv;
    (3) a second job with fuse_qkv=False (separate wq/wk/wv parameters, same init draws) trained 3 steps: its
        wq/wk/wv exp_avg/exp_avg_sq == the fused job's wqkv moments split by the same rule."""
    import torch
    res = {}
    fused = Job("0.3", None, a.batch, fuse_qkv=True)
    sep = Job("0.3", None, a.batch, fuse_qkv=False)
    hpk, r = N_HEADS // N_KV, N_HEADS // N_KV + 2

    def split(w):
        w4 = w.reshape(N_KV, r, HEAD_DIM, -1)
        return (w4[:, :hpk].reshape(-1, w.shape[-1]), w4[:, hpk].reshape(-1, w.shape[-1]),
                w4[:, hpk + 1].reshape(-1, w.shape[-1]))

    def local(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    sd = fused.full_state_dict()
    wqkv = local(fused.model.layers["0"].attention.qkv_linear.wqkv.weight).detach()
    q, k, v = split(wqkv)
    pre = "layers.0.attention.qkv_linear."
    res["state_dict_split_rule"] = bool(torch.equal(q, sd[pre + "wq.weight"]) and torch.equal(
        k, sd[pre + "wk.weight"]) and torch.equal(v, sd[pre + "wv.weight"]))
    sd_sep = sep.full_state_dict()
    res["same_init_as_unfused"] = all(torch.equal(sd[kk], sd_sep[kk]) for kk in sd)
    # (2) projection semantics
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    attn = fused.model.layers["0"].attention
    with torch.no_grad():
        qkv_mod = attn.qkv_linear
        from torch.distributed.tensor import DTensor
        W = wqkv
        xq = (x @ W.T).view(2, 5, N_KV, r, HEAD_DIM)
        fq = xq[:, :, :, :hpk].reshape(2, 5, N_HEADS, HEAD_DIM)  # the module's own split (FusedQKVLinear.forward)
        fk = xq[:, :, :, hpk]
        fv = xq[:, :, :, hpk + 1]
        sq = (x @ sd[pre + "wq.weight"].T).view(2, 5, N_HEADS, HEAD_DIM)
        sk = (x @ sd[pre + "wk.weight"].T).view(2, 5, N_KV, HEAD_DIM)
        sv = (x @ sd[pre + "wv.weight"].T).view(2, 5, N_KV, HEAD_DIM)
        res["projection_matches_standard_gqa"] = bool(torch.allclose(fq, sq, atol=1e-6) and torch.allclose(
            fk, sk, atol=1e-6) and torch.allclose(fv, sv, atol=1e-6))
        del qkv_mod, DTensor
    # (3) moments
    for _ in range(STEPS_BEFORE):
        lf, _ = fused.train_step()
        ls, _ = sep.train_step()
    res["losses_fused_vs_separate"] = [lf, ls]
    fo = fused.optimizers.state_dict()
    so = sep.optimizers.state_dict()
    ok = True
    maxdiff = 0.0
    for li in range(N_LAYERS):
        p = f"layers.{li}.attention.qkv_linear."
        for mom in ("exp_avg", "exp_avg_sq"):
            parts = split(local(fo[f"state.{p}wqkv.weight.{mom}"]))
            for name, t in zip(("wq", "wk", "wv"), parts):
                ref = local(so[f"state.{p}{name}.weight.{mom}"])
                d = (t - ref).abs().max().item()
                maxdiff = max(maxdiff, d / (ref.abs().max().item() + 1e-30))
                ok = ok and torch.allclose(t, ref, rtol=1e-4, atol=1e-12)
    res["moments_split_rule_matches_unfused_optimizer"] = bool(ok)
    res["moments_max_rel_diff"] = maxdiff
    res["optimizer_keys_fused"] = sorted(k for k in fo if "layers.0." in k)
    res["optimizer_keys_unfused"] = sorted(k for k in so if "layers.0.attention" in k)
    print(json.dumps(res, indent=1))
    if a.result:
        with open(a.result, "w") as f:
            json.dump(res, f, indent=1)
    fused.dist.destroy_process_group()


def verify_rope_02():
    import torch
    from torchtitan.models.llama3.model.model import precompute_freqs_cis
    args = model_args_02()
    got = precompute_freqs_cis(HEAD_DIM, T, THETA, args.rope_scaling_args)
    freqs = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2)[: (HEAD_DIM // 2)].float() / HEAD_DIM))
    f = torch.outer(torch.arange(T), freqs).float()
    return bool(torch.equal(got, torch.polar(torch.ones_like(f), f)))


# ---- orchestration ---------------------------------------------------------------------------------------------
def torchrun(world, args, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    cmd = [TORCHRUN, "--nproc_per_node", str(world), "--master_port", str(29500 + world + (7 if "0.2" in args else 0)),
           os.path.abspath(__file__)] + args
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def dump_layout(ckpt_step_dir):
    """Every key of the .metadata: tensors with global shape/dtype/chunks, byte entries; and each rank file's
    non-tensor entries (DCP torch.save's them) with their values."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
    md = dcp.FileSystemReader(ckpt_step_dir).read_metadata()
    out = {}
    for k in sorted(md.state_dict_metadata):
        m = md.state_dict_metadata[k]
        if isinstance(m, TensorStorageMetadata):
            out[k] = {"tensor": list(m.size), "dtype": str(m.properties.dtype).replace("torch.", ""),
                      "chunks": [[list(c.offsets), list(c.sizes)] for c in m.chunks]}
        else:
            assert isinstance(m, BytesStorageMetadata)
            out[k] = {"bytes": True}
    storage = {}
    for idx, si in md.storage_data.items():
        storage.setdefault(si.relative_path, []).append([idx.fqn, list(idx.offset) if idx.offset else None,
                                                         si.offset, si.length])
    # decode the byte entries
    for rel, items in storage.items():
        with open(os.path.join(ckpt_step_dir, rel), "rb") as f:
            blob = f.read()
        for fqn, off, o, n in items:
            if out[fqn].get("bytes"):
                import io
                v = torch.load(io.BytesIO(blob[o:o + n]), weights_only=False)
                out[fqn]["value"] = repr(v) if not isinstance(v, bytes) else "bytes(%d): pickle of %r" % (
                    len(v), __import__("pickle").loads(v))
                out[fqn]["file"] = rel
                out[fqn]["blob_prefix_hex"] = blob[o:o + 4].hex()
    return {"keys": out, "files": {rel: sorted((x[2], x[3], x[0]) for x in items) for rel, items in storage.items()},
            "planner_data_count": len(md.planner_data or {}),
            "storage_meta": repr(md.storage_meta)}


def orchestrate(a):
    import torch
    from safetensors.torch import save_file
    out = os.path.abspath(a.out or os.path.join(REPO, "tests", "data", "trainers", "torchtitan-" + a.version))
    os.makedirs(out, exist_ok=True)
    inp, lab = make_batch()
    bpath = os.path.join(out, "batch.safetensors")
    save_file({"input_ids": inp, "labels": lab}, bpath)
    tmp = os.path.join(out, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    expected, layout = {}, {}
    verify = None
    if a.version == "0.3":
        vj = os.path.join(tmp, "verify.json")
        torchrun(1, ["--version", a.version, "--phase", "verify", "--batch", bpath, "--result", vj])
        verify = json.load(open(vj))
    for ws in (1, 2):
        ck = os.path.join(out, f"ws{ws}")
        if os.path.exists(ck):
            import shutil
            shutil.rmtree(ck)
        r1 = os.path.join(tmp, f"train{ws}.json")
        torchrun(ws, ["--version", a.version, "--phase", "train", "--ckpt", ck, "--batch", bpath, "--result", r1])
        r2 = os.path.join(tmp, f"resume{ws}.json")
        # ws2's weights after the step are compared to ws1's (the file would take the folder over 5 MB)
        wpath = os.path.join(out if ws == 1 else tmp, f"ws{ws}_after_resume_step.safetensors")
        torchrun(ws, ["--version", a.version, "--phase", "resume", "--ckpt", ck, "--batch", bpath, "--result", r2,
                      "--weights", wpath])
        t1, t2 = json.load(open(r1)), json.load(open(r2))
        expected[f"ws{ws}"] = {"losses_before_save": t1["losses_before_save"],
                               "grad_norms_before_save": t1["grad_norms_before_save"],
                               "resumed_losses": t2["resumed_losses"],
                               "resumed_grad_norms": t2["resumed_grad_norms"],
                               "checkpoint_dir": f"ws{ws}/step-{STEPS_BEFORE}"}
        layout[f"ws{ws}"] = dump_layout(os.path.join(ck, f"step-{STEPS_BEFORE}"))
    from safetensors.torch import load_file
    w1 = load_file(os.path.join(out, "ws1_after_resume_step.safetensors"))
    w2 = load_file(os.path.join(tmp, "ws2_after_resume_step.safetensors"))
    assert sorted(w1) == sorted(w2)
    expected["ws2"]["after_resume_step_vs_ws1_max_abs_diff"] = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    expected["ws1"]["after_resume_step_weights"] = "ws1_after_resume_step.safetensors"
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    if a.layout:
        with open(a.layout, "w") as f:
            json.dump(layout, f, indent=1)
    write_config(out, a.version, verify)
    import shutil
    shutil.rmtree(tmp)


def orchestrate_grid(a):
    """--grid NAME: the same train and resume phases on 2 ranks with the grid's shape and batch, into
    tests/data/trainers/grid/torchtitan-0.3/NAME/ (ws2/step-3, config.json, expected.json)."""
    import shutil
    if a.version != "0.3":
        raise SystemExit("--grid: torchtitan 0.3 only (0.2.2 is fsdp-run's own layout, its ffn is rounded to 64)")
    out = os.path.abspath(a.out or _grid.out_dir("torchtitan-0.3"))
    os.makedirs(out, exist_ok=True)
    bpath = _grid.write_batch()
    tmp = os.path.join(out, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    expected = {}
    for ws in (2,):
        ck = os.path.join(out, f"ws{ws}")
        if os.path.exists(ck):
            shutil.rmtree(ck)
        r1, r2 = os.path.join(tmp, f"train{ws}.json"), os.path.join(tmp, f"resume{ws}.json")
        torchrun(ws, ["--version", a.version, "--phase", "train", "--ckpt", ck, "--batch", bpath, "--result", r1])
        torchrun(ws, ["--version", a.version, "--phase", "resume", "--ckpt", ck, "--batch", bpath, "--result", r2])
        t1, t2 = json.load(open(r1)), json.load(open(r2))
        expected[f"ws{ws}"] = {"losses_before_save": t1["losses_before_save"],
                               "grad_norms_before_save": t1["grad_norms_before_save"],
                               "resumed_losses": t2["resumed_losses"], "resumed_grad_norms": t2["resumed_grad_norms"],
                               "checkpoint_dir": f"ws{ws}/step-{STEPS_BEFORE}"}
    _grid.write_expected(out, expected)
    hpk = N_HEADS // N_KV
    _grid.write_config(out, "torchtitan 0.3.0 (CheckpointManager, FSDP2, fused-QKV Llama3Model)", {
        "Llama3Model": {"dim": DIM, "vocab_size": VOCAB, "n_layers": N_LAYERS, "n_heads": N_HEADS,
                        "n_kv_heads": N_KV, "hidden_dim": FFN, "fuse_qkv": True, "rope": "ComplexRoPE (interleaved)",
                        "norm_eps": EPS, "theta": THETA},
        "wqkv_rows": f"[n_kv={N_KV}, heads_per_kv+2={hpk + 2}, head_dim={HEAD_DIM}] x dim {DIM}",
        "init": "as the common fixture (torch.manual_seed(0), init_weights on the unsharded model)"})
    shutil.rmtree(tmp)
    print(json.dumps(expected, indent=1))


def write_config(out, version, verify):
    import torch
    setup_path(version)
    import importlib.metadata as im
    plain = {"dim": DIM, "n_layers": N_LAYERS, "n_heads": N_HEADS, "n_kv_heads": N_KV, "head_dim": HEAD_DIM,
             "vocab": VOCAB, "ffn_hidden": FFN, "norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
             "tied": False, "bias": False, "dtype": "float32"}
    if version == "0.3":
        cfg = model_config_03()
        rope = cfg.layers[0].attention.rope
        own = {
            "class": "torchtitan.models.llama3.Llama3Model (Decoder), layers built by "
                     "torchtitan.models.llama3._build_llama3_layers(fuse_qkv=True)",
            "dim": cfg.dim, "vocab_size": cfg.vocab_size, "enable_weight_tying": cfg.enable_weight_tying,
            "n_layers": len(cfg.layers),
            "attention": {"class": "GQAttention", "n_heads": cfg.layers[0].attention.n_heads,
                          "n_kv_heads": cfg.layers[0].attention.n_kv_heads,
                          "qkv_linear": "FusedQKVLinear (wqkv: Linear(64 -> (4+2*2)*16=128, bias=False))",
                          "inner_attention": "ScaledDotProductAttention (is_causal=True) [workaround for flex]"},
            "ffn_hidden_dim": "compute_ffn_hidden_dim(64, multiple_of=64) = %d" % FFN,
            "norm": "RMSNorm.Config(eps=%g)" % cfg.norm.eps,
            "rope": {"class": "ComplexRoPE", "dim": rope.dim, "theta": rope.theta, "scaling": rope.scaling,
                     "max_seq_len": rope.max_seq_len,
                     "note": "scaling='none': freqs = 1/theta**(arange(0,16,2)/16), no llama/yarn scaling"},
            "init": "Module.init_states with the llama3 param_init dicts (embedding normal std 1; wqkv/w1 trunc_normal "
                    "std 0.02 drawn as separate wq,wk,wv; wo/w2/w3 trunc_normal std 0.02/sqrt(2*(layer+1)); lm_head "
                    "trunc_normal std dim**-0.5 cut at 3 std; norms ones), torch.manual_seed(0), on the unsharded "
                    "CPU model before fully_shard",
        }
    else:
        args = model_args_02()
        own = {"class": "torchtitan.models.llama3.Transformer", "TransformerModelArgs": {
            k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
            for k, v in dataclasses.asdict(args).items()},
            "rope_note": "0.2.2 always applies llama3.1 rope scaling; these rope_scaling_args make it the identity "
                         "(all wavelengths < original_max_position_embeddings/high_freq_factor = 32768), verified "
                         "bit-exact: %s" % verify_rope_02(),
            "init": "Transformer.init_weights (embedding normal std 1; wq/wk/wv/w1 trunc_normal std 0.02; wo/w2/w3 "
                    "std 0.02/sqrt(2*(layer+1)); output trunc_normal std dim**-0.5 cut at 3 std; norms ones), "
                    "torch.manual_seed(0), unsharded CPU model before fully_shard"}
    conf = {
        "trainer": "torchtitan", "version": im.version("torchtitan"), "torch": torch.__version__,
        "model_plain": plain, "model_trainer": own, "rope_order": "interleaved",
        "rope_order_note": "ComplexRoPE/apply_rotary_emb: view_as_complex(x.reshape(..., -1, 2)) -> pairs "
                           "(x[2j], x[2j+1]) of each head rotated by position*freq[j]",
        "optimizer": {"name": "AdamW", "lr": LR, "betas": list(BETAS), "eps": ADAM_EPS, "weight_decay": WD,
                      "weight_decay_on": "every parameter", "implementation": "fused (torch CPU fused AdamW)",
                      "grad_clip_max_norm": MAX_NORM},
        "lr_scheduler": {"warmup_steps": 0, "decay_ratio": 0.0, "total_steps": LR_TOTAL_STEPS,
                         "note": "LambdaLR factor 1.0 at every step (constant)"},
        "training": {"steps_before_save": STEPS_BEFORE, "steps_after_resume": STEPS_AFTER,
                     "training.steps": TRAINING_STEPS, "checkpoint.interval": STEPS_BEFORE, "seq_len": T,
                     "global_batch": B, "loss": "sum CE over local tokens / global valid tokens; FSDP grad divide "
                                                 "factor 1.0 (sum-reduce): the global mean over B*T tokens",
                     "mixed_precision_param": "float32", "mixed_precision_reduce": "float32"},
        "fsdp": ("0.3.0 apply_fsdp_to_decoder: fully_shard(tok_embeddings), fully_shard([norm, lm_head]), "
                 "fully_shard(each layer), fully_shard(model), over a 1-D mesh ('fsdp',) of world size (also 1)")
        if version == "0.3" else
        ("0.2.2 apply_fsdp (world 2 only; world 1 is unwrapped as 0.2.2 does when dp_shard == 1): "
         "fully_shard(tok_embeddings), each layer, [norm, output], model"),
    }
    if version == "0.3":
        hpk = N_HEADS // N_KV
        blocks = []
        for g in range(N_KV):
            blocks += [f"q{g * hpk + j}" for j in range(hpk)] + [f"k{g}", f"v{g}"]
        conf["fused_qkv"] = {
            "parameter": "layers.L.attention.qkv_linear.wqkv.weight (only in the optimizer state; the model entries "
                         "are the split layers.L.attention.qkv_linear.w{q,k,v}.weight)",
            "shape": [(N_HEADS + 2 * N_KV) * HEAD_DIM, DIM],
            "view": f"[n_kv_heads={N_KV}, heads_per_kv+2={hpk + 2}, head_dim={HEAD_DIM}, dim={DIM}]",
            "row_blocks_of_head_dim": blocks,
            "split": "wq = W.view(n_kv, r, hd, dim)[:, :hpk].reshape(-1, dim); wk = [:, hpk]; wv = [:, hpk+1]",
            "gqa": "q head h attends with kv head h // heads_per_kv",
        }
    if verify is not None:
        conf["fused_qkv_verification"] = verify
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", choices=["0.3", "0.2"], required=True)
    ap.add_argument("--phase", choices=["all", "train", "resume", "verify"], default="all")
    ap.add_argument("--out")
    ap.add_argument("--ckpt")
    ap.add_argument("--batch")
    ap.add_argument("--result")
    ap.add_argument("--weights")
    ap.add_argument("--allow-extra", action="store_true")
    ap.add_argument("--layout", help="also write a JSON dump of every checkpoint key (not committed)")
    ap.add_argument("--grid", choices=sorted(_grid.CONFIGS), help="a grid shape (tools/gen/trainers/grid.py)")
    a = ap.parse_args(argv)
    if a.grid:
        _grid.select(a.grid)
        apply_grid()
    setup_path(a.version)
    if a.phase == "all" and _grid.active():
        orchestrate_grid(a)
    elif a.phase == "all":
        orchestrate(a)
    elif a.phase == "train":
        phase_train(a)
    elif a.phase == "resume":
        phase_resume(a)
    else:
        phase_verify(a)


if __name__ == "__main__":
    main()
