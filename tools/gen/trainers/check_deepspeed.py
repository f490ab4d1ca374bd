#!/usr/bin/env python3
"""Load a DeepSpeed 0.19.8 ZeRO-2 / ZeRO-3 checkpoint with DeepSpeed's OWN loader
(DeepSpeedEngine.load_checkpoint, strict) and run the next 2 steps of the fixture recipe;
print the losses and grad norms as JSON.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu PYTHONPATH=/work/seedpkgs/deepspeed \
    /work/torchenv/bin/python tools/gen/trainers/check_deepspeed.py DIR --stage 1|2|3 [--world N] \
        [--tag TAG] [--batch tests/data/trainers/deepspeed-0.19/zero2/batch.safetensors] \
        [--save-weights OUT.safetensors]

DIR is a save_dir as DeepSpeedEngine.save_checkpoint writes it (DIR/latest naming the tag, unless
--tag is given; DIR/<tag>/mp_rank_00_model_states.pt (ZeRO-2) or zero_pp_rank_<r>_mp_rank_00_model_states.pt
(ZeRO-3, one per rank), DIR/<tag>/zero_pp_rank_<r>_mp_rank_00_optim_states.pt, one per rank).
--world N (default: the checkpoint's dp_world_size) runs N gloo ranks under torchrun; DeepSpeed
0.19.8 can only load ZeRO optimizer state on the world size that saved it.  --batch defaults to
DIR/../batch.safetensors; its rows are the job's train_batch_size (split evenly over the ranks).

The engine is built exactly as gen_deepspeed.py builds it (HF LlamaForCausalLM of the fixture
config, torch AdamW, ds config with zero_optimization.stage = --stage, gradient_clipping 1.0), then
engine.load_checkpoint(DIR, tag, load_module_strict=True, load_optimizer_states=True,
load_lr_scheduler_states=True).
Strictness (exit 1 with a message otherwise):
  * DIR/latest (or --tag) names an existing tag directory; it holds exactly the model-state and
    optimizer-state files of that stage and world size (DeepSpeed reads only each rank's own file);
  * model states: dp_world_size == N; every optimizer file's zero_stage == --stage;
  * load_checkpoint itself: module state_dict strict (ZeRO-3: the [0]-shaped placeholders must be
    there and be [0]-shaped), ZeRO optimizer state of this rank, global_steps;
  * afterwards every flat fp32 partition has AdamW step/exp_avg/exp_avg_sq of its own shape;
    ZeRO-2: the saved fp32 partition had its full (unpadded) size -- DeepSpeed would zero-pad a
    short one silently -- and the module weights from model_states equal the fp32 master partition.
Output (rank 0, last line of stdout):
  {"load_path": ..., "client_state_keys": [...], "loaded_global_steps": 3, "loaded_adam_step": 3.0,
   "resumed_losses": [l1, l2], "resumed_grad_norms": [g1, g2]}
"""

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_deepspeed as G  # noqa: E402


def saved_world(d, tag):
    import torch

    d = Path(d)
    if tag is None:
        tag = (d / "latest").read_text().strip()
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        p = d / tag / name
        if p.exists():
            return int(torch.load(p, map_location="cpu", weights_only=False)["dp_world_size"])
    raise G.CheckpointError(f"no model-states file under {d / tag}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--stage", type=int, choices=(1, 2, 3), required=True)
    ap.add_argument("--world", type=int, default=None)
    ap.add_argument("--tag", default=None)
    ap.add_argument("--batch", default=None)
    ap.add_argument("--save-weights", default=None,
                    help="write the full weights after the first resumed step here")
    ap.add_argument("--_inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batch = a.batch or str(Path(a.dir).resolve().parent / "batch.safetensors")

    if not a._inner and "LOCAL_RANK" not in os.environ:
        try:
            world = a.world or saved_world(a.dir, a.tag)
        except Exception:
            traceback.print_exc()
            print("CHECK FAILED: cannot read the checkpoint's world size", file=sys.stderr)
            sys.exit(1)
        cmd = [G.TORCHRUN, "--nproc_per_node", str(world), "--master_port",
               str(29671 + 10 * a.stage + world), str(Path(__file__).resolve()),
               str(Path(a.dir).resolve()), "--stage", str(a.stage), "--world", str(world),
               "--batch", str(Path(batch).resolve()), "--_inner"]
        if a.tag:
            cmd += ["--tag", a.tag]
        if a.save_weights:
            cmd += ["--save-weights", str(Path(a.save_weights).resolve())]
        r = subprocess.run(cmd, env=G.env())
        sys.exit(0 if r.returncode == 0 else 1)

    try:
        import torch.distributed as dist

        # the job's batch is the batch file's rows (4 for the fixtures; e.g. 6 for a 3-rank check of ZeRO's padding)
        G.B = G.load_batch(batch)[0].shape[0]
        r = G.resume_and_run(Path(a.dir), a.stage, batch, a.save_weights, tag=a.tag)
        if dist.get_world_size() != a.world:
            raise RuntimeError(f"world size {dist.get_world_size()} != --world {a.world}")
        if dist.get_rank() == 0:
            print(json.dumps(r), flush=True)
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        print("CHECK FAILED: checkpoint did not load strictly/completely", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
