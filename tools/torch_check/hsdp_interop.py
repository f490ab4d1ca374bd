#!/usr/bin/env python3
"""Hand check: a DCP checkpoint written by fsdp-run from an HSDP mesh loads in PyTorch.

    python tools/torch_check/hsdp_interop.py CKPT_DIR REFERENCE.safetensors

(a) 4 gloo CPU processes, FSDP2 fully_shard on a 2-D mesh (replicate=2, shard=2); dcp.load of the
    model's own state_dict (DTensors, a subset of the checkpoint's keys); every param's full_tensor()
    compared bitwise with the reference.
(b) one process, no process group: dcp.load into plain tensors, compared bitwise with the reference.
(c) same plain load for optimizer.state.<name>.exp_avg (and exp_avg_sq): loads without error, max abs printed.
Run by hand, not by CI (PyTorch is not a dependency of fsdp-run)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WORLD, MESH = 4, (2, 2)


def build_module(ref):
    """Nested nn.Modules so that named_parameters() gives exactly the reference's names/shapes."""
    root = torch.nn.Module()
    for name, t in ref.items():
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if not hasattr(mod, p):
                mod.add_module(p, torch.nn.Module())
            mod = getattr(mod, p)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros_like(t)))
    return root


def same_bits(a, b):
    """Bitwise equality (dtype, shape and raw bytes; NaN-safe)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def compare(sd, ref, what):
    bad = [n for n, t in sd.items() if not same_bits(t.full_tensor() if hasattr(t, "full_tensor") else t, ref[n])]
    for n in bad:
        print(f"[{what}] MISMATCH {n}")
    print(f"[{what}] {len(sd) - len(bad)}/{len(sd)} tensors bitwise equal -> {'PASS' if not bad else 'FAIL'}")
    return not bad


def hsdp_worker(rank, ckpt, ref_path, port, result):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    ref = load_file(ref_path)
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("replicate", "shard"))
    model = fully_shard(build_module(ref), mesh=mesh)  # 2-D mesh: replicate dim 0, shard dim 1
    sd = model.state_dict()  # DTensors with placements (Replicate(), Shard(0))
    if rank == 0:
        p = sd["layers.0.attention.wq.weight"]
        print(f"[a] wq placements={p.placements} local={tuple(p.to_local().shape)}")
    dcp.load(sd, checkpoint_id=ckpt)  # only model keys requested; optimizer/train_state/... ignored
    ok = compare(sd, ref, f"a rank{rank}")  # full_tensor() is collective: every rank runs it
    result[rank] = int(ok)
    dist.destroy_process_group()


def main():
    ckpt, ref_path = sys.argv[1], sys.argv[2]
    ref = load_file(ref_path)

    # (a) HSDP 2x2 load on 4 gloo processes
    result = mp.get_context("spawn").Array("i", WORLD)
    mp.spawn(hsdp_worker, args=(ckpt, ref_path, 29500 + os.getpid() % 1000, result), nprocs=WORLD)
    ok_a = all(result)

    # (b) plain single-process load, no process group (DCP falls back to no_dist)
    assert not dist.is_initialized()
    plain = {n: torch.empty_like(t) for n, t in ref.items()}
    dcp.load(plain, checkpoint_id=ckpt)
    ok_b = compare(plain, ref, "b plain")

    # (c) optimizer moments, flattened keys as in the checkpoint, into plain tensors of the param's shape
    opt = {f"optimizer.state.{n}.{m}": torch.full_like(t, float("nan"))
           for n, t in ref.items() for m in ("exp_avg", "exp_avg_sq")}
    dcp.load(opt, checkpoint_id=ckpt)
    nan = [k for k, t in opt.items() if torch.isnan(t).any()]
    for k, t in opt.items():
        print(f"[c] {k} max|x|={t.abs().max().item():.6g}")
    print(f"[c] {len(opt)} optimizer moments loaded, {len(nan)} left unfilled -> {'PASS' if not nan else 'FAIL'}")

    print(f"SUMMARY a={'PASS' if ok_a else 'FAIL'} b={'PASS' if ok_b else 'FAIL'} c={'PASS' if not nan else 'FAIL'}")
    sys.exit(0 if ok_a and ok_b and not nan else 1)


if __name__ == "__main__":
    main()
