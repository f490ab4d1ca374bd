#!/usr/bin/env python3
"""PyTorch's side of bench/ckpt_vs_torch (not part of the tests): the same tensors as fsdp-run's
state (names and shapes from --shapes, a JSON list of [name, [rows, cols]] written by the C
benchmark), timed with PyTorch's own APIs. One JSON object per line on stdout (rank 0 only).

  python ckpt_vs_torch.py --shapes shapes.json --part dcp --dir DIR --nproc 1|2 --threads T
      dcp.save of the state (durable: FileSystemWriter fsyncs its files), then dcp.load into a freshly
      allocated state from the page cache; with --nproc 2 the processes (torch.multiprocessing, gloo)
      each hold half of every tensor's rows as a DTensor Shard(0), like FSDP2.
  python ckpt_vs_torch.py --shapes shapes.json --part init --threads T
      meta-device construction + to_empty(cpu) + torchtitan-style init of the same parameters."""
import argparse
import json
import math
import os
import socket
import sys
import time
import warnings

import torch

# dcp.save / dcp.load without a process group (1 process) warn that they assume one process
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def emit(**kw):
    print(json.dumps(kw), flush=True)


def local_rows(rows, rank, nproc):
    """torch.chunk's split of dim 0 (what Shard(0) uses): (start, length)."""
    per = math.ceil(rows / nproc)
    start = min(rows, rank * per)
    return start, min(rows, start + per) - start


def make_state(shapes, rank, nproc, fill):
    sd = {}
    mesh = None
    if nproc > 1:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (nproc,))
    for k, (name, shape) in enumerate(shapes):
        _, n = local_rows(shape[0], rank, nproc)
        t = torch.empty([n] + list(shape[1:]), dtype=torch.float32)
        if fill:
            t.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(k * 31 + rank))
        if mesh is not None:
            from torch.distributed.tensor import DTensor, Shard
            stride = tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))
            t = DTensor.from_local(t, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)
        sd[name] = t
    return sd


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def dcp_worker(rank, a, shapes, port):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    torch.set_num_threads(max(1, a.threads // a.nproc))
    if a.nproc > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    barrier = dist.barrier if a.nproc > 1 else (lambda: None)
    sd = make_state(shapes, rank, a.nproc, True)
    barrier()
    t = time.perf_counter()
    dcp.save(sd, checkpoint_id=a.dir)
    barrier()
    ts = time.perf_counter() - t
    if rank == 0:
        b = dir_bytes(a.dir)
        emit(what="save", nproc=a.nproc, s=ts, bytes=b)
    sd2 = make_state(shapes, rank, a.nproc, False)
    barrier()
    t = time.perf_counter()
    dcp.load(sd2, checkpoint_id=a.dir)
    barrier()
    tl = time.perf_counter() - t
    loc = (lambda x: x.to_local()) if a.nproc > 1 else (lambda x: x)
    equal = all(torch.equal(loc(sd[k]), loc(sd2[k])) for k in sd)
    if rank == 0:
        emit(what="load", nproc=a.nproc, s=tl, bytes=dir_bytes(a.dir), equal=equal)
    if a.nproc > 1:
        dist.destroy_process_group()


def init_std(name, dim):
    parts = name.split(".")
    if name.startswith("tok_embeddings"):
        return None
    if name.startswith("output"):
        return dim ** -0.5
    if len(parts) > 3 and parts[0] == "layers" and parts[-2] in ("wo", "w2", "w3"):
        return 0.02 / math.sqrt(2 * (int(parts[1]) + 1))
    return 0.02


def part_init(a, shapes, warm=True):
    torch.set_num_threads(a.threads)
    if warm:  # PyTorch's one-time costs (meta device, init kernels) out of the timing
        part_init(a, [[n, [min(s[0], 64)] + [min(x, 64) for x in s[1:]]] for n, s in shapes[:12]], False)
    dim = shapes[0][1][1]
    t = time.perf_counter()
    with torch.device("meta"):
        m = torch.nn.Module()
        m.p = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(s)) for _, s in shapes])
    m.to_empty(device="cpu")
    with torch.no_grad():
        for (name, shape), p in zip(shapes, m.p):
            if len(shape) == 1:
                p.fill_(0.0 if name.endswith("bias") else 1.0)
            elif name.startswith("tok_embeddings"):
                torch.nn.init.normal_(p)
            else:
                s = init_std(name, dim)
                a3 = 3 * s if name.startswith("output") else 2.0
                torch.nn.init.trunc_normal_(p, mean=0.0, std=s, a=-a3, b=a3)
    el = time.perf_counter() - t
    if warm:
        emit(what="init", s=el, params=sum(p.numel() for p in m.p), threads=torch.get_num_threads())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--part", choices=["dcp", "init"], required=True)
    ap.add_argument("--dir")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    with open(a.shapes) as f:
        shapes = json.load(f)
    if a.part == "init":
        part_init(a, shapes)
        return
    if not a.dir:
        sys.exit("--dir is required with --part dcp")
    if a.nproc == 1:
        dcp_worker(0, a, shapes, 0)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    import torch.multiprocessing as mp
    mp.spawn(dcp_worker, args=(a, shapes, port), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    main()
