#!/usr/bin/env python3
"""Writes a small PyTorch-made HSDP checkpoint for fsdp-run's tests.

    python tools/torch_check/gen_hsdp_fixture.py OUT_DIR LAYOUT.safetensors

LAYOUT.safetensors only supplies parameter names/shapes/dtypes (e.g. a tiny model exported by fsdp-run).
4 gloo CPU processes; every full parameter filled with torch.randn after torch.manual_seed(0) (identical
on every rank), then FSDP2 fully_shard on a 2-D mesh (replicate=2, shard=2), then
  OUT_DIR/dcp_hsdp_2x2       dcp.save of ONLY the model's state_dict (DTensors, (Replicate(), Shard(0)))
  OUT_DIR/expected.safetensors  rank 0's full_tensor() of every parameter.
Run by hand, not by CI (PyTorch is not a dependency of fsdp-run)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WORLD, MESH = 4, (2, 2)


def build_module(layout):
    """Nested nn.Modules whose named_parameters() are the layout's names, filled deterministically."""
    torch.manual_seed(0)
    root = torch.nn.Module()
    for name, (shape, dtype) in layout.items():
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if not hasattr(mod, p):
                mod.add_module(p, torch.nn.Module())
            mod = getattr(mod, p)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.randn(shape).to(dtype)))
    return root


def worker(rank, out, layout, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("replicate", "shard"))
    model = fully_shard(build_module(layout), mesh=mesh)  # replicate over dim 0, shard over dim 1
    sd = model.state_dict()
    dcp.save(sd, checkpoint_id=os.path.join(out, "dcp_hsdp_2x2"))
    full = {n: t.full_tensor().contiguous() for n, t in sd.items()}  # collective: all ranks
    if rank == 0:
        save_file(full, os.path.join(out, "expected.safetensors"))
    dist.destroy_process_group()


def main():
    out, layout_path = sys.argv[1], sys.argv[2]
    with safe_open(layout_path, "pt") as f:  # sorted names -> the same seed stream everywhere
        layout = {k: (tuple(f.get_slice(k).get_shape()), f.get_tensor(k).dtype) for k in sorted(f.keys())}
    os.makedirs(out, exist_ok=True)
    mp.spawn(worker, args=(out, layout, 29500 + os.getpid() % 1000), nprocs=WORLD)
    print(f"wrote {out}/dcp_hsdp_2x2 and {out}/expected.safetensors ({len(layout)} params)")


if __name__ == "__main__":
    main()
