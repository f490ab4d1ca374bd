"""torch's side of bench/scale_plan: the same steps on the same `.metadata`, with torch's own code.

Run by build/bench/scale_plan (one process per checkpoint); prints nothing, writes one JSON object to --out.
The layouts' boxes follow the same rule as scale_plan.c's sp_box: rows over the shard group as FSDP2's
Shard(0) (ceil(rows / group) per rank), the stacked experts (`.moe.experts.`) as a grid of --ep groups on
dim 0 by world / ep ranks on dim 1.
"""
import argparse
import json
import os
import pickle
import resource
import time

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list


def shard_rows(rows, world, rank):
    per = -(-rows // world)
    start = min(rank * per, rows)
    return start, max(0, min(per, rows - start))


def box(name, shape, world, rank, ep, replicas):
    off, size = [0] * len(shape), list(shape)
    if ".moe.experts." in name:
        per = world // ep
        off[0], size[0] = shard_rows(shape[0], ep, rank // per)
        off[1], size[1] = shard_rows(shape[1], per, rank % per)
    elif shape:
        group = world // replicas
        off[0], size[0] = shard_rows(shape[0], group, rank % group)
    return ChunkStorageMetadata(offsets=tuple(off), sizes=tuple(size))


def plan(md, world, ranks, ep, replicas):
    """read items for the given ranks of a world of that size, per tensor in one call (torch's sweep)"""
    items = 0
    for fqn, tm in md.state_dict_metadata.items():
        if not isinstance(tm, TensorStorageMetadata):
            continue
        local = [box(fqn, list(tm.size), world, r, ep, replicas) for r in ranks]
        local = [c for c in local if all(s > 0 for s in c.sizes)]
        items += len(create_read_items_for_chunk_list(fqn, tm, local))
    return items


def timed(fn):
    t0 = time.perf_counter()
    v = fn()
    return time.perf_counter() - t0, v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--dir")
    ap.add_argument("--world", type=int)
    ap.add_argument("--ep", type=int)
    ap.add_argument("--replicas", type=int)
    ap.add_argument("--out")
    ap.add_argument("--no-all-ranks", action="store_true", help="leave out the reshard plan and the diff walk")
    a = ap.parse_args()
    res = {}
    res["parse"], md = timed(lambda: FileSystemReader(a.dir).read_metadata())

    def write():
        path = os.path.join(a.dir, ".metadata.torch")
        with open(path, "wb") as f:
            pickle.dump(md, f)
            f.flush()
            os.fsync(f.fileno())

    res["write"], _ = timed(write)
    os.unlink(os.path.join(a.dir, ".metadata.torch"))
    small, big = a.world * 3 // 4, a.world * 2
    res["plan_small"], res["plan_small_items"] = timed(lambda: plan(md, small, [small // 2], a.ep, a.replicas))
    res["plan_big"], res["plan_big_items"] = timed(lambda: plan(md, big, [big // 2], a.ep, a.replicas))
    if not a.no_all_ranks:
        res["reshard"], res["reshard_items"] = timed(lambda: plan(md, small, range(small), a.ep, a.replicas))

    def inspect():
        out = []
        for fqn, tm in md.state_dict_metadata.items():
            if isinstance(tm, TensorStorageMetadata):
                numel = 1
                for s in tm.size:
                    numel *= s
                out.append(f"{fqn} {tm.properties.dtype} {len(tm.chunks)} chunks {numel * tm.properties.dtype.itemsize} bytes")
        return len(out)

    res["inspect"], _ = timed(inspect)

    def diff():
        other = md  # fsdp-run walks a second open of the same checkpoint: the walk alone is timed
        items = 0
        for fqn, tm in md.state_dict_metadata.items():
            if isinstance(tm, TensorStorageMetadata):
                om = other.state_dict_metadata[fqn]
                assert om.size == tm.size and om.properties.dtype == tm.properties.dtype
                local = [c for c in tm.chunks if all(s > 0 for s in c.sizes)]
                items += len(create_read_items_for_chunk_list(fqn, om, local))
        return items

    if not a.no_all_ranks:
        res["diff"], res["diff_items"] = timed(diff)
    res["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(a.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
