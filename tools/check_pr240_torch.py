#!/usr/bin/env python3
"""Loads a PR #240-layout DCP (model.<key>, ema_model.<key>, a fresh AdamW's param group, metadata.pt)
the way Bagel PR #240's load_checkpoint does, on N gloo ranks with every tensor a Shard(0) DTensor:
    dcp.load({"model": sd, "ema_model": sd2, "optimizer": opt.state_dict()}, checkpoint_id=CKPT)
and compares every tensor (full_tensor) with REF.safetensors, the optimizer's group with the expected
values (Python types included), and metadata.pt (torch.load weights_only=True) with {"train_step": 0}.

    python3 tools/check_pr240_torch.py CKPT REF.safetensors N

CKPT: e.g. recipes/bagel_pr240_step0.yaml's output; REF: the model it was made from. Not part of the
build or the tests (PyTorch is not a dependency of fsdp-run)."""
import os, sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.tensor import distribute_tensor, Shard, DeviceMesh
from safetensors.torch import load_file


def run(rank, world, ckpt, ref_path, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = DeviceMesh("cpu", list(range(world)))
    ref = load_file(ref_path)
    md = dcp.FileSystemReader(ckpt).read_metadata()
    names = [k[len("model."):] for k, m in md.state_dict_metadata.items() if k.startswith("model.") and hasattr(m, "size")]
    def shard(n):
        t = torch.zeros(ref[n].shape, dtype=ref[n].dtype)
        return distribute_tensor(t, mesh, [Shard(0)]) if t.dim() > 0 else distribute_tensor(t, mesh, [])
    sd = {n: shard(n) for n in names}
    sd2 = {n: shard(n) for n in names}
    params = [torch.nn.Parameter(v) for v in sd.values()]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-15, weight_decay=0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 2000))
    state = {"model": sd, "ema_model": sd2, "optimizer": opt.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    opt.load_state_dict(state["optimizer"])
    bad = 0
    for which, d in (("model", sd), ("ema_model", sd2)):
        for n, t in d.items():
            full = t.full_tensor()
            if full.dtype != ref[n].dtype or not torch.equal(full, ref[n]):
                print(f"rank {rank}: {which}.{n} differs"); bad += 1
    g = opt.param_groups[0]
    want = {"lr": 0.0, "betas": (0.9, 0.95), "eps": 1e-15, "weight_decay": 0, "initial_lr": 1e-4,
            "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": None, "decoupled_weight_decay": True}
    for k, v in want.items():
        if g[k] != v or type(g[k]) is not type(v):
            print(f"rank {rank}: param group {k} = {g[k]!r} ({type(g[k]).__name__}), want {v!r}"); bad += 1
    meta = torch.load(os.path.join(ckpt, "metadata.pt"), weights_only=True)
    if meta != {"train_step": 0}:
        print(f"rank {rank}: metadata.pt = {meta!r}"); bad += 1
    print(f"rank {rank}/{world}: {len(names)} model + {len(names)} ema_model tensors, param group and metadata.pt "
          f"checked, {bad} problem(s)")
    dist.destroy_process_group()
    if bad: sys.exit(1)


if __name__ == "__main__":
    ckpt, ref, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    port = 29500 + os.getpid() % 1000
    mp.spawn(run, args=(world, ckpt, ref, port), nprocs=world)
