#!/usr/bin/env python3
"""Load a Megatron-FSDP 0.6.1 DCP checkpoint with Megatron-FSDP's OWN load path (strict) and run
the next 2 steps of the fixture recipe; print the losses and grad norms as JSON.

    OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/megatron \
    /work/torchenv/bin/python tools/gen/trainers/check_megatron_fsdp.py DIR [--world N] \
        [--batch tests/data/trainers/megatron-fsdp-0.6/batch.safetensors] [--save-weights OUT.safetensors]

DIR is a torch.distributed.checkpoint directory as Megatron-FSDP's README writes it
(DIR/.metadata, DIR/__<rank>_0.distcp) holding {"model": fsdp_model.state_dict(),
"optimizer": optimizer.state_dict()}.  --world N (default 1) runs N gloo ranks under torchrun; DCP
reshards, so any world size can load any checkpoint.  --batch defaults to DIR/../batch.safetensors.

The model and optimizer are built exactly as gen_megatron_fsdp.py builds them (HF LlamaForCausalLM of
the fixture config, fully_shard_model over LlamaDecoderLayer units, torch AdamW, fully_shard_optimizer),
then: template = {"model": fsdp_model.state_dict(), "optimizer": optimizer.state_dict()};
torch.distributed.checkpoint.load(template, checkpoint_id=DIR); fsdp_model.load_state_dict(
template["model"], strict=True); optimizer.load_state_dict(template["optimizer"]).
Strictness (exit 1 with a message otherwise), beyond DCP's own (which only refuses a key asked for
and missing):
  * the checkpoint's keys are exactly the union of the keys the ranks ask for (DCP ignores extras);
  * every tensor entry has the asked-for global shape and dtype, and its chunks tile it exactly once
    (DCP silently leaves an uncovered region as it was); non-tensor entries are bytes entries;
  * model load_state_dict(strict=True) reports no missing/unexpected keys;
  * afterwards every parameter with a non-empty local shard has AdamW step/exp_avg/exp_avg_sq of its
    shard's shape and all steps are equal.
Output (rank 0, last line of stdout):
  {"loaded_adam_step": 4.0, "loaded_param_groups": [...], "resumed_losses": [l1, l2],
   "resumed_grad_norms": [g1, g2]}
Set MFSDP_FIXTURE_DCP_ONLY=1 to skip the extra checks (to see what DCP + Megatron-FSDP accept alone).
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
import gen_megatron_fsdp as G  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--batch", default=None)
    ap.add_argument("--save-weights", default=None,
                    help="write the full weights after the first resumed step here")
    ap.add_argument("--_inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batch = a.batch or str(Path(a.dir).resolve().parent / "batch.safetensors")

    if not a._inner and "LOCAL_RANK" not in os.environ:
        cmd = [G.TORCHRUN, "--nproc_per_node", str(a.world), "--master_port",
               str(29771 + a.world), str(Path(__file__).resolve()),
               str(Path(a.dir).resolve()), "--world", str(a.world),
               "--batch", str(Path(batch).resolve()), "--_inner"]
        if a.save_weights:
            cmd += ["--save-weights", str(Path(a.save_weights).resolve())]
        r = subprocess.run(cmd, env=dict(G.env(), **{k: v for k, v in os.environ.items()
                                                     if k.startswith("MFSDP_")}))
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
