#!/usr/bin/env python
"""Load a checkpoint in fms-fsdp's layout with fms-fsdp's own Checkpointer.load (as main_training_llama.py does)
and run the next 2 training steps; prints {"resumed_losses": [...], "resumed_grad_norms": [...], ...} as JSON.

  cd /work/main && OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/fms:/work/fms-fsdp-src \
      /work/torchenv/bin/python tools/gen/trainers/check_fms.py DIR [--world N] [--batch B.safetensors]

DIR is either a Checkpointer save directory (the one holding checkpoints/step_<N>_ckp/, e.g.
tests/data/trainers/fms-1.13/ws1) -- the newest step_*_ckp by ctime is taken, as fms-fsdp does -- or one
step_<N>_ckp directory itself (holding .metadata, __<rank>_0.distcp, metadata.pth).
--world N: number of gloo ranks (default 1); the checkpoint may have been written by any number of ranks.
Exits 1 (with "FAIL: ...") if the load is not complete and strict:
  - Checkpointer.load must resume (is_resuming) and metadata.pth must hold int "step" and "tokens_seen"
    (fms-fsdp itself would silently default both to 0);
  - DCP load_state_dict (DefaultLoadPlanner, no partial load) must find every model_state key, and
    nn.Module.load_state_dict is strict;
  - every parameter must get optimizer state {step, exp_avg, exp_avg_sq} of its shape;
  - the checkpoint's .metadata must hold exactly the keys fms-fsdp would save for this model and optimizer
    (no missing, no extra: DCP ignores extras silently), with the same global shapes and dtypes;
  - the optimizer hyper-parameters loaded from optimizer_state.param_groups must be the fixture's ones.
"""
import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_fms as G  # noqa: E402

import torch  # noqa: E402


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def inner(args):
    import torch.distributed as dist
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    ckdir = args.ckdir
    try:
        s = G.setup_everything(ckdir)
    except BaseException as e:  # DCP (CheckpointException is a BaseException) / load_state_dict errors: missing keys, shape mismatch, ...
        import traceback

        traceback.print_exc()
        fail("Checkpointer.load raised %s: %s" % (type(e).__name__, str(e)[:2000]))
    rank = s["rank"]
    if not s["is_resuming"]:
        fail("Checkpointer.load found no checkpoint under %s/checkpoints/" % ckdir)
    model, opt = s["model"], s["optimizer"]

    # which directory did it load? (same rule as Checkpointer._validate_ckp_path)
    load_path = s["checkpointer"]._validate_ckp_path(os.path.join(ckdir, "checkpoints/"))
    meta = torch.load(os.path.join(load_path, "metadata.pth"))
    for k in ("step", "tokens_seen"):
        if not isinstance(meta.get(k), int):
            fail("metadata.pth lacks int %r: %r" % (k, meta))
    if s["start_step"] != meta["step"]:
        fail("start_step %r != metadata step %r" % (s["start_step"], meta["step"]))

    # every parameter has full AdamW state
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if not st or set(st) != {"step", "exp_avg", "exp_avg_sq"}:
                fail("optimizer state missing/incomplete for a parameter: %r" % (None if not st else sorted(st)))
            if st["exp_avg"].shape != p.shape or st["exp_avg_sq"].shape != p.shape:
                fail("optimizer moment shape mismatch")
            if float(st["step"]) != float(meta["step"]):
                fail("optimizer step %r != metadata step %r" % (float(st["step"]), meta["step"]))

    # the checkpoint holds exactly what fms-fsdp's save would write for this model + optimizer
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        msd = model.state_dict()
        osd = FSDP.sharded_optim_state_dict(model, opt)
    flat, _ = flatten_state_dict({"model_state": msd, "optimizer_state": osd})
    with open(os.path.join(load_path, ".metadata"), "rb") as f:
        md = pickle.load(f)
    have, want = set(md.state_dict_metadata), set(flat)
    if have != want:
        fail("checkpoint keys differ: missing %s; extra %s" % (sorted(want - have)[:20], sorted(have - want)[:20]))
    for k, v in flat.items():
        m = md.state_dict_metadata[k]
        if isinstance(v, torch.Tensor):
            if not hasattr(m, "size"):
                fail("%s: tensor expected, checkpoint has %s" % (k, type(m).__name__))
            if tuple(m.size) != tuple(v.size()) or m.properties.dtype != v.dtype:
                fail("%s: checkpoint %s %s, model %s %s" % (k, tuple(m.size), m.properties.dtype, tuple(v.size()), v.dtype))
        elif hasattr(m, "size"):
            fail("%s: non-tensor expected, checkpoint has a tensor" % k)

    g = opt.param_groups[0]
    hp = {"lr": g["lr"], "betas": list(g["betas"]), "eps": g["eps"], "weight_decay": g["weight_decay"],
          "initial_lr": g.get("initial_lr")}
    want_hp = {"lr": G.LR, "betas": list(G.BETAS), "eps": G.EPS, "weight_decay": G.WD, "initial_lr": G.LR}
    if len(opt.param_groups) != 1 or hp != want_hp:
        fail("loaded optimizer hyper-parameters %r != %r" % (hp, want_hp))

    inp, label = G.local_batch(args.batch, rank, s["world_size"])
    model.train()
    losses, gnorms = [], []
    for _ in range(G.STEPS_AFTER):
        l, gn = G.train_step(model, opt, s["scheduler"], inp, label, s["cfg"], s["world_size"])
        losses.append(l)
        gnorms.append(gn)
    if rank == 0:
        res = {
            "checkpoint": load_path,
            "start_step": s["start_step"],
            "tokens_seen": s["tokens_seen"],
            "resumed_losses": losses,
            "resumed_grad_norms": gnorms,
        }
        with open(args.result, "w") as f:
            json.dump(res, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--batch", default=os.path.join(G.DEFAULT_OUT, "batch.safetensors"))
    ap.add_argument("--inner", action="store_true")
    ap.add_argument("--ckdir")
    ap.add_argument("--result")
    args = ap.parse_args()
    if args.inner:
        inner(args)
        return
    d = os.path.abspath(args.dir)
    tmp = tempfile.mkdtemp(prefix="check_fms_")
    if os.path.exists(os.path.join(d, ".metadata")):
        # a step directory: give Checkpointer a save directory whose checkpoints/ holds only it
        os.makedirs(os.path.join(tmp, "ck", "checkpoints"))
        os.symlink(d, os.path.join(tmp, "ck", "checkpoints", os.path.basename(d.rstrip("/"))))
        ckdir = os.path.join(tmp, "ck")
    elif os.path.isdir(os.path.join(d, "checkpoints")):
        ckdir = d
    else:
        print("FAIL: %s is neither a Checkpointer save dir (with checkpoints/) nor a step dir (with .metadata)" % d,
              file=sys.stderr)
        sys.exit(1)
    result = os.path.join(tmp, "result.json")
    cmd = [G.TORCHRUN, "--nproc_per_node", str(args.world), "--master_port", "29541", os.path.abspath(__file__),
           d, "--inner", "--ckdir", ckdir, "--batch", os.path.abspath(args.batch), "--result", result]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or not os.path.exists(result):
        sys.stderr.write(r.stdout[-6000:])
        print("FAIL: the load/steps did not complete (torchrun exit %d)" % r.returncode, file=sys.stderr)
        sys.exit(1)
    with open(result) as f:
        res = json.load(f)
    print(json.dumps(res))
    sys.exit(0)


if __name__ == "__main__":
    main()
