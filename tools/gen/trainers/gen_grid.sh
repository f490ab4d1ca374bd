#!/bin/sh
# Writes the trainer grid, tests/data/trainers/grid/ (README.md there): every grid shape of
# tools/gen/trainers/grid.py (mha, mqa, gqa3) saved by each system's own code, one generator at a time.
#
#   tools/gen/trainers/gen_grid.sh [SYSTEM...]      from the repository root; SYSTEM one of
#       torchtitan olmo-core fms olmo deepspeed megatron accelerate   (default: all of them)
#   GRID_CONFIGS="mqa gqa3" tools/gen/trainers/gen_grid.sh fms        only some shapes
#
# torchtitan 0.3, OLMo-core, fms and OLMo write every shape (their fused or permuted rows depend on heads per kv
# head, kv heads and head_dim); DeepSpeed (ZeRO-2 and ZeRO-3), Megatron-FSDP and accelerate, whose checkpoints hold
# Hugging Face Llama names, mqa and gqa3 only (mha's head_dim 16 is the common fixtures' one, and it would add
# 4.5 MB): `GRID_CONFIGS=mha` writes it for them too.
#
# Needs the machine of /work/shared/seed-systems/README.md: /work/torchenv (torch 2.11.0, transformers 5.24), the
# systems under /work/seedpkgs, fms-fsdp's source in /work/fms-fsdp-src. About 20 s (torchtitan, OLMo-core, fms,
# OLMo, Megatron-FSDP, accelerate) to 2 min (DeepSpeed, both stages, 2 and 3 ranks) per shape on 2 CPU cores.
# A gloo rank sometimes aborts at exit on this machine ("terminate called without an active exception") after
# its work is done: each generator is run a second time when the first run fails.
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-/work/torchenv/bin/python}
SEED=${SEED:-/work/seedpkgs}
STUBS=${STUBS:-/work/shared/seed-systems/stubs}
FMS_SRC=${FMS_SRC:-/work/fms-fsdp-src}
configs() { # SYSTEM: the shapes it writes
    case $1 in
    deepspeed | megatron | accelerate) echo "${GRID_CONFIGS:-mqa gqa3}" ;;
    *) echo "${GRID_CONFIGS:-mha mqa gqa3}" ;;
    esac
}
SYSTEMS=${*:-torchtitan olmo-core fms olmo deepspeed megatron accelerate}
export OMP_NUM_THREADS=1

run() { # SYSTEM CONFIG: one generator run, with the system's environment
    case $1 in
    torchtitan) env "$PY" tools/gen/trainers/gen_torchtitan.py --version 0.3 --grid "$2" ;;
    olmo-core) env PYTHONPATH="$STUBS:$SEED/olmocore" "$PY" tools/gen/trainers/gen_olmo_core.py --grid "$2" ;;
    fms) env PYTHONPATH="$SEED/fms:$FMS_SRC" "$PY" tools/gen/trainers/gen_fms.py --grid "$2" ;;
    olmo) env PYTHONPATH="$SEED/olmo:$SEED/olmo-extra" "$PY" tools/gen/trainers/gen_olmo.py --grid "$2" ;;
    deepspeed) env DS_ACCELERATOR=cpu PYTHONPATH="$SEED/deepspeed" "$PY" tools/gen/trainers/gen_deepspeed.py --grid "$2" ;;
    megatron) env PYTHONPATH="$SEED/megatron" "$PY" tools/gen/trainers/gen_megatron_fsdp.py --grid "$2" ;;
    accelerate) env PYTHONPATH="$SEED/accelerate" "$PY" tools/gen/trainers/gen_accelerate.py --grid "$2" ;;
    *) echo "gen_grid.sh: unknown system $1" >&2; exit 2 ;;
    esac
}

for s in $SYSTEMS; do
    for c in $(configs "$s"); do
        log=$(mktemp)
        echo "== $s $c"
        if ! run "$s" "$c" >"$log" 2>&1; then
            echo "   first run failed (tail of its log below); running it again" >&2
            tail -5 "$log" >&2
            if ! run "$s" "$c" >"$log" 2>&1; then
                tail -40 "$log" >&2
                rm -f "$log"
                echo "gen_grid.sh: $s $c failed twice" >&2
                exit 1
            fi
        fi
        rm -f "$log"
    done
done
du -sh tests/data/trainers/grid
