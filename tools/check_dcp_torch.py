#!/usr/bin/env python3
"""Loads a DCP checkpoint written by fsdp-run into PyTorch, the way a training script does, and checks
every parameter against a reference file (a safetensors export of the same checkpoint).

    python3 tools/check_dcp_torch.py CKPT_DIR REFERENCE.safetensors [--world N] [--prefix model.]

1. a plain state dict: {name: torch.empty(shape, dtype)} filled by dcp.load on one process;
2. an FSDP2 model on N CPU processes (gloo): a module tree with one parameter per checkpoint key,
   fully_shard(...) on it (every parameter a DTensor Shard(0) over N ranks), then
   dcp.load(model.state_dict(), checkpoint_id=CKPT_DIR) - each rank reads only its own rows - and
   every parameter's full_tensor() compared with the reference.
With --prefix model. the keys are under "model." and the state dict is passed as {"model": sd}.
Not part of the build or the tests (PyTorch is not a dependency of fsdp-run)."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file


def param_specs(ckpt, prefix):
    """(name, shape, dtype) of every model tensor in the checkpoint's metadata."""
    md = dcp.FileSystemReader(ckpt).read_metadata()
    out = []
    for key, m in md.state_dict_metadata.items():
        if not hasattr(m, "size") or key.startswith(("optimizer.", "train_state.")):
            continue
        if prefix and not key.startswith(prefix):
            continue
        out.append((key[len(prefix):], tuple(m.size), m.properties.dtype))
    return out


def build_module(specs):
    """A module tree with a parameter at every dotted name."""
    root = torch.nn.Module()
    for name, shape, dtype in specs:
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if not hasattr(mod, p):
                mod.add_module(p, torch.nn.Module())
            mod = getattr(mod, p)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=dtype)))
    return root


def check(sd, ref, what):
    bad = 0
    for name, t in sd.items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        r = ref[name]
        if full.dtype != r.dtype or full.shape != r.shape or not torch.equal(full, r):
            print(f"{what}: {name} differs ({full.dtype} {tuple(full.shape)} vs {r.dtype} {tuple(r.shape)})")
            bad += 1
    return bad


def plain(args, specs, ref):
    sd = {n: torch.empty(s, dtype=d) for n, s, d in specs}
    dcp.load({"model": sd} if args.prefix else sd, checkpoint_id=args.ckpt, no_dist=True)
    bad = check(sd, ref, "plain")
    print(f"plain state dict: {len(sd)} tensors, {bad} differ")
    return bad


def worker(rank, args, specs, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (args.world,))
    model = build_module(specs)
    fully_shard(model, mesh=mesh)
    sd = model.state_dict()
    dcp.load({"model": sd} if args.prefix else sd, checkpoint_id=args.ckpt)
    model.load_state_dict(sd)
    ref = load_file(args.ref)
    bad = check(dict(model.state_dict()), ref, f"fsdp2 rank {rank}")
    local = sum(p.to_local().numel() for p in model.parameters())
    print(f"FSDP2 rank {rank}/{args.world}: {len(sd)} DTensor parameters, {local} local elements, {bad} differ")
    result[rank] = bad
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("ref")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    specs = param_specs(args.ckpt, args.prefix)
    ref = load_file(args.ref)
    bad = plain(args, specs, ref)
    result = mp.Manager().dict()
    mp.spawn(worker, args=(args, specs, result), nprocs=args.world, join=True)
    bad += sum(result.values())
    print("OK" if bad == 0 else f"FAILED: {bad} mismatches")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
