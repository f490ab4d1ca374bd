#!/usr/bin/env python
"""Load an OLMo (ai2-olmo 0.6.0) unsharded checkpoint with OLMo's OWN loader (Trainer.restore_checkpoint ->
FullCheckpointer.restore_checkpoint + Trainer.load_trainer_state_dict) and run the next 2 steps of the fixture recipe
on batch.safetensors; print the losses and grad norms as JSON (rank 0, last line of stdout).

    cd /work/main && OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/olmo:/work/seedpkgs/olmo-extra \
        /work/torchenv/bin/python tools/gen/trainers/check_olmo.py DIR [--world N] \
        [--batch tests/data/trainers/olmo-0.6/batch.safetensors] [--save-weights OUT.safetensors]

DIR is either a checkpoint directory (model.pt / optim.pt / train.pt / config.yaml, or the safetensors twins
model.safetensors / optim.safetensors, which OLMo's loader prefers when present), e.g.
tests/data/trainers/olmo-0.6/ws1/step3-unsharded, or a save folder holding latest-unsharded (or exactly one
step*-unsharded), e.g. tests/data/trainers/olmo-0.6/ws1. --world N (default 1) runs N gloo ranks under torchrun with
OLMo's FSDP1 wrapping (by_block, use_orig_params, FULL_SHARD); an unsharded checkpoint loads on any world size
(expected.json's numbers are for the world it was written with). Nothing is written into DIR.

Strictness (exit 1 with a FAIL message otherwise):
  * model.pt keys == the model's parameter names exactly (OLMo's FSDP restore raises on a missing key or a NaN left
    in any parameter, but ignores extra keys);
  * optim.pt: state keys == parameter names, each with exactly {step, exp_avg, exp_avg_sq}, moment shapes == the
    parameter's; one param group (OLMo's fix_optim_state_dict asserts the group count);
  * train.pt must exist (FullCheckpointer falls back to other.pt) and load_trainer_state_dict reads
    global_step / global_train_examples_seen_this_epoch / global_train_tokens_seen / checkpoints / rng from it;
  * after the restore every non-empty local parameter shard has its AdamW state.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_olmo as G  # noqa: E402


def find_ckpt(d):
    d = os.path.abspath(d)
    if any(os.path.isfile(os.path.join(d, f)) for f in ("model.pt", "model.safetensors")):
        return d
    latest = os.path.join(d, "latest-unsharded")
    if os.path.isdir(latest):
        return os.path.realpath(latest)
    steps = sorted(glob.glob(os.path.join(d, "step*-unsharded")))
    if len(steps) == 1:
        return steps[0]
    raise SystemExit("FAIL: %s is neither a checkpoint directory nor a save folder with one step*-unsharded" % d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--batch", default=os.path.join(G.DEFAULT_OUT, "batch.safetensors"))
    ap.add_argument("--save-weights", default=None, help="write the full weights after the first resumed step here")
    a = ap.parse_args()
    ck = find_ckpt(a.dir)
    if not os.path.isfile(os.path.join(ck, "train.pt")):
        raise SystemExit("FAIL: %s has no train.pt" % ck)
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        try:
            G.run_torchrun(
                a.world, "resume", os.path.join(tmp, "save_folder"), os.path.abspath(a.batch), result,
                weights=os.path.abspath(a.save_weights) if a.save_weights else None, port=29561 + a.world,
                load_path=ck,
            )
        except subprocess.CalledProcessError as e:
            print("FAIL: OLMo's restore / resumed steps failed (exit %s)" % e.returncode, file=sys.stderr)
            sys.exit(1)
        if not os.path.isfile(result):
            print("FAIL: no result written", file=sys.stderr)
            sys.exit(1)
        res = json.load(open(result))
    res["checkpoint"] = ck
    print(json.dumps(res))


if __name__ == "__main__":
    main()
