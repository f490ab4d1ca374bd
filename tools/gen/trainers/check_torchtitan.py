#!/usr/bin/env python3
"""Load a torchtitan-layout checkpoint with torchtitan's OWN CheckpointManager and run the next 2 steps.

    OMP_NUM_THREADS=1 /work/torchenv/bin/python tools/gen/trainers/check_torchtitan.py DIR [--world N]
        [--version 0.3|0.2|auto] [--batch batch.safetensors] [--allow-extra] [--expected expected.json --ws ws1]

DIR is a checkpoint folder as torchtitan's CheckpointManager uses it (checkpoint.folder, holding step-N/
subfolders; the highest N with a .metadata is loaded), or one step-N folder itself.
--version auto (default) picks 0.3 when the model keys are layers.L.attention.qkv_linear.w{q,k,v}.weight
(0.3.0's FusedQKVLinear) and 0.2 when they are layers.L.attention.w{q,k,v}.weight with output.weight.
--world defaults to the number of dataloader.dp_rank_* entries (torchtitan's dataloader refuses another world).
The model, optimizer, lr scheduler, dataloader and train state are the same objects gen_torchtitan.py builds
(fresh init with seed 0, FSDP2), then CheckpointManager.load(step) restores them: DCP raises on any key the
trainer needs that the checkpoint lacks, and on shape mismatches; keys in the checkpoint that nothing loads are
silently ignored by torchtitan, so this script fails on them itself unless --allow-extra.
Prints one JSON line {"version", "world", "loaded_step", "resumed_losses", "resumed_grad_norms", ...} (rank 0)
and exits 0; exits 1 (with the exception) on any load problem. With --expected/--ws it also compares the
losses and grad norms with that entry of expected.json (exactly) and exits 1 on a difference.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_torchtitan as G  # noqa: E402


def resolve(d):
    d = os.path.abspath(d)
    m = re.fullmatch(r"step-(\d+)", os.path.basename(d))
    if m and os.path.isfile(os.path.join(d, ".metadata")):
        return os.path.dirname(d), int(m.group(1)), d
    steps = [int(mm.group(1)) for f in os.listdir(d) if (mm := re.fullmatch(r"step-(\d+)", f))
             and os.path.isfile(os.path.join(d, f, ".metadata"))]
    if not steps:
        raise SystemExit(f"{d}: no step-N/.metadata inside")
    return d, -1, os.path.join(d, f"step-{max(steps)}")


def inspect(step_dir):
    import torch.distributed.checkpoint as dcp
    keys = set(dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata)
    if any(".attention.qkv_linear." in k for k in keys):
        version = "0.3"
    elif any(re.fullmatch(r"layers\.\d+\.attention\.wq\.weight", k) for k in keys) and "output.weight" in keys:
        version = "0.2"
    else:
        version = None
    world = len([k for k in keys if re.fullmatch(r"dataloader\.dp_rank_\d+", k)]) or 1
    return version, world


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int)
    ap.add_argument("--version", choices=["0.3", "0.2", "auto"], default="auto")
    ap.add_argument("--batch")
    ap.add_argument("--allow-extra", action="store_true")
    ap.add_argument("--expected")
    ap.add_argument("--ws")
    ap.add_argument("--result")
    a = ap.parse_args()
    folder, step, step_dir = resolve(a.dir)
    if "LOCAL_RANK" not in os.environ:  # launcher: re-run under torchrun with the resolved settings
        version, world = inspect(step_dir)
        version = version if a.version == "auto" else a.version
        if version is None:
            raise SystemExit("cannot tell the torchtitan version from the keys; pass --version")
        world = a.world or world
        batch = a.batch or os.path.join(G.REPO, "tests", "data", "trainers", f"torchtitan-{version}",
                                        "batch.safetensors")
        args = [a.dir, "--world", str(world), "--version", version, "--batch", os.path.abspath(batch)]
        if a.allow_extra:
            args.append("--allow-extra")
        if a.expected:
            args += ["--expected", os.path.abspath(a.expected), "--ws", a.ws or f"ws{world}"]
        if a.result:
            args += ["--result", os.path.abspath(a.result)]
        cmd = [G.TORCHRUN, "--nproc_per_node", str(world), "--master_port", str(29600 + world),
               os.path.abspath(__file__)] + args
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode != 0 or not lines:
            sys.stdout.write(r.stdout)
            print(f"check_torchtitan: FAILED (rc {r.returncode})", file=sys.stderr)
            sys.exit(1)
        print(lines[-1])
        sys.exit(0)

    G.setup_path(a.version)
    import io
    import contextlib
    ns = argparse.Namespace(version=a.version, ckpt=folder, batch=a.batch, result=None, weights=None,
                            allow_extra=a.allow_extra, step=step)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            res = run(ns)
    except BaseException as e:  # noqa: BLE001 -- any load problem is a failure
        sys.stderr.write(buf.getvalue())
        import traceback
        traceback.print_exc()
        print(f"check_torchtitan: load/resume failed: {type(e).__name__}: {e}", file=sys.stderr)
        os._exit(1)
    if res is None:
        return
    res = dict(version=a.version, world=a.world, **res)
    bad = None
    if a.expected:
        exp = json.load(open(a.expected))[a.ws]
        if exp["resumed_losses"] != res["resumed_losses"] or exp["resumed_grad_norms"] != res["resumed_grad_norms"]:
            bad = f"differs from {a.expected}[{a.ws}]: {exp['resumed_losses']} {exp['resumed_grad_norms']}"
        res["matches_expected"] = bad is None
    print(json.dumps(res), flush=True)
    if a.result:
        with open(a.result, "w") as f:
            json.dump(res, f)
    if bad:
        print("check_torchtitan: " + bad, file=sys.stderr)
        os._exit(1)


def run(ns):
    """G.phase_resume, returning rank 0's result (None on other ranks)."""
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    ns.result = path
    import torch.distributed as dist
    G.phase_resume(ns)
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    with open(path) as f:
        res = json.load(f)
    os.unlink(path)
    del dist
    return res


if __name__ == "__main__":
    main()
