#!/usr/bin/env python3
"""Load an accelerate 1.15.0 FSDP2 SHARDED_STATE_DICT save_state checkpoint with accelerate's OWN
loader (Accelerator.load_state) and run the next 2 steps of the fixture recipe; print the losses and
grad norms as JSON.

    OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/accelerate \
    /work/torchenv/bin/python tools/gen/trainers/check_accelerate.py DIR [--world N] \
        [--batch tests/data/trainers/accelerate-1.15/batch.safetensors] [--save-weights OUT.safetensors]

DIR is a folder as Accelerator.save_state writes it: DIR/pytorch_model_fsdp_0/ (DCP), DIR/optimizer_0/
(DCP), DIR/scheduler.bin, DIR/random_states_<rank>.pkl.  --world N (default 1) runs N gloo ranks
under torchrun; DCP re-shards, so any world size can load any saved world size.  --batch defaults
to DIR/../batch.safetensors.

The objects are built exactly as gen_accelerate.py builds them (HF LlamaForCausalLM of the fixture
config, torch AdamW, constant LambdaLR, Accelerator(cpu=True, fsdp_plugin=FSDP2 SHARDED_STATE_DICT,
transformer_based_wrap) + prepare, with the CPU workaround that makes accelerate take its FSDP path),
then accelerator.load_state(DIR).
Strictness (exit 1 with a message otherwise):
  * both DCP folders: the .metadata key set is exactly the one the model / AdamW need
    (model.<fqn>; optimizer.state.<fqn>.{step,exp_avg,exp_avg_sq}; optimizer.param_groups.0.<13 fields>)
    -- DCP raises on a missing key but silently ignores an extra one; every tensor is float32 of the
    right global shape and its chunks tile it exactly once (DCP would leave an uncovered region
    untouched); every storage_data record lies inside its file;
  * scheduler.bin present (load_state would raise anyway); random_states_0..K-1.pkl present and readable by
    accelerate's own `load` with the keys step/random_state/numpy_random_seed/torch_manual_seed
    (load_state swallows any error there and just logs "Could not load random states");
    no custom_checkpoint_*.pkl (none registered);
  * load_state itself: DCP load of both folders, set_model_state_dict / set_optimizer_state_dict (strict),
    scheduler.load_state_dict, RNG states;
  * afterwards every parameter has AdamW step/exp_avg/exp_avg_sq of its shape, one common step,
    and the param group hyper-parameters are the recipe's.
Output (rank 0, last line of stdout):
  {"loaded_adam_step": 3.0, "loaded_scheduler_last_epoch": 3*W, "loaded_scheduler_step_count": ..,
   "loaded_accelerator_step": 0, "random_state_files": K, "world": N,
   "resumed_losses": [l1, l2], "resumed_grad_norms": [g1, g2]}
Environment ACC_FIXTURE_ACC_ONLY=1 skips this script's own checks (accelerate's alone).
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
import gen_accelerate as G  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--batch", default=None)
    ap.add_argument("--save-weights", default=None,
                    help="write the full weights after the first resumed step here")
    ap.add_argument("--no-rng-states", action="store_true",
                    help="accept a checkpoint without random_states_<r>.pkl (one another tool wrote: accelerate's "
                         "load_state then keeps the job's own RNG states, as it does for a missing file)")
    ap.add_argument("--_inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.no_rng_states:
        os.environ["ACC_CHECK_NO_RNG"] = "1"
    batch = a.batch or str(Path(a.dir).resolve().parent / "batch.safetensors")

    if not a._inner and "LOCAL_RANK" not in os.environ:
        env = G.env()
        cmd = [G.TORCHRUN, "--nproc_per_node", str(a.world), "--master_port",
               str(29831 + a.world), str(Path(__file__).resolve()),
               str(Path(a.dir).resolve()), "--world", str(a.world), "--batch",
               str(Path(batch).resolve()), "--_inner"]
        if a.save_weights:
            cmd += ["--save-weights", str(Path(a.save_weights).resolve())]
        r = subprocess.run(cmd, env=env)
        sys.exit(0 if r.returncode == 0 else 1)

    try:
        import torch.distributed as dist

        r = G.resume_and_run(Path(a.dir), batch, a.save_weights)
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
