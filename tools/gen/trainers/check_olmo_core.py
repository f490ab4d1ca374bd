#!/usr/bin/env python3
"""Load an OLMo-core 3.0.0 model+optimizer DCP checkpoint with OLMo-core's OWN strict loader and
run the next 2 steps of the fixture recipe; print the losses and grad norms as JSON.

    OMP_NUM_THREADS=1 \
    PYTHONPATH=/work/shared/seed-systems/stubs:/work/seedpkgs/olmocore \
    /work/torchenv/bin/python tools/gen/trainers/check_olmo_core.py DIR [--world N] \
        [--batch tests/data/trainers/olmo-core-3.0/batch.safetensors] [--save-weights OUT.safetensors]

DIR is a directory as olmo_core.distributed.checkpoint.save_model_and_optim_state writes it
(.metadata + __{rank}_{i}.distcp), with the optimizer unflattened (the default, as in
ws1/ ws2/) or flattened (flatten_optimizer_state=True, as the Trainer's Checkpointer writes
its step*/model_and_optim/ folder); the form is detected from the keys.  --world N (default 1) runs N gloo ranks under torchrun with
OLMo-core's FSDP (Transformer.apply_fsdp); any world size can load any saved world size.

Strictness (exit 1 with a message otherwise):
  * the set of keys in DIR/.metadata must equal exactly the keys the model + AdamW need
    (model.<fqn>, optim.state.<fqn>.{step,exp_avg,exp_avg_sq}, optim.param_groups.0.<field>
    or, flattened, optim.param_groups.<fqn>.<field>)
    -- DCP itself would raise on a missing key but silently ignore an extra one;
  * load_model_and_optim_state(..., strict=True) (DCP load + set_model_state_dict /
    set_optimizer_state_dict strict);
  * afterwards every parameter has step, exp_avg and exp_avg_sq.
The checkpoint has no other state (save_model_and_optim_state saves model + optimizer only).
Output (rank 0, last line of stdout):
  {"loaded_step": 3.0, "flattened_optim": false, "resumed_losses": [l1, l2], "resumed_grad_norms": [g1, g2]}
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
import gen_olmo_core as G  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--batch", default=str(G.DEFAULT_OUT / "batch.safetensors"))
    ap.add_argument("--save-weights", default=None,
                    help="write the full weights after the first resumed step here")
    ap.add_argument("--_inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if not a._inner and "LOCAL_RANK" not in os.environ:
        env = dict(os.environ, PYTHONPATH=G.PYTHONPATH, OMP_NUM_THREADS="1")
        cmd = [G.TORCHRUN, "--nproc_per_node", str(a.world), "--master_port",
               str(29631 + a.world), str(Path(__file__).resolve()),
               str(Path(a.dir).resolve()), "--world", str(a.world), "--batch",
               str(Path(a.batch).resolve()), "--_inner"]
        if a.save_weights:
            cmd += ["--save-weights", str(Path(a.save_weights).resolve())]
        r = subprocess.run(cmd, env=env)
        sys.exit(0 if r.returncode == 0 else 1)

    try:
        import torch.distributed as dist

        r = G.resume_and_run(a.dir, a.batch, a.save_weights)
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
