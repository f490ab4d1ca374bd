#!/usr/bin/env bash
# By hand (needs the seed systems: ../shared/seed-systems/install.sh): a checkpoint fsdp-run trained itself (the tiny
# preset, 3 AdamW steps on the trainer fixtures' batch) written in each trainer's layout with `fsdp-run ckpt convert
# --to LAYOUT` (DeepSpeed ZeRO-1/2/3 and OLMo 0.6 included), loaded by that trainer's own strict loader (tools/gen/trainers/check_*.py: weights, moments, train
# state) on WORLD ranks, and its next two steps printed beside fsdp-run's own next two steps.
#   PY=/work/torchenv/bin/python SEEDPKGS=/work/seedpkgs FMS_SRC=/work/fms-fsdp-src [GRID=mha|mqa|gqa3] \
#       bash tools/check_trainer_layouts.sh [WORLD]
set -euo pipefail
WORLD=${1:-1}
: "${PY:?set PY to a Python with torch 2.11}" "${SEEDPKGS:?set SEEDPKGS}"
BIN=${BIN:-build/fsdp-run}
STUBS=${STUBS:-../shared/seed-systems/stubs}
D=$(mktemp -d /tmp/fsdp-trainer-check.XXXXXX)
trap 'rm -rf "$D"' EXIT
# GRID=mha|mqa|gqa3: the shape of tests/data/trainers/grid (tools/gen/trainers/grid.py) and its batch, instead of the
# tiny preset (the checkers build the same shape from FSDP_GRID)
GRID=${GRID:-}
BATCH=tests/data/trainers/torchtitan-0.3/batch.safetensors MODEL="{preset: tiny}" HEADS=(4 2) BS=4 SEQ=32
grid_model() { # DIM LAYERS HEADS KV HEAD_DIM FFN VOCAB
  MODEL="{arch: llama3, dim: $1, n_layers: $2, n_heads: $3, n_kv_heads: $4, head_dim: $5, ffn_hidden: $6, vocab_size: $7, norm_eps: 1e-5, rope_theta: 10000, tie_embeddings: false}"
  HEADS=($3 $4) BATCH=tests/data/trainers/grid/batch.safetensors BS=6 SEQ=16
}
case "$GRID" in
  "") ;;
  mha) grid_model 48 3 3 3 16 80 96 ;;
  mqa) grid_model 32 1 4 1 8 56 100 ;;
  gqa3) grid_model 48 2 6 2 8 72 80 ;;
  *) echo "GRID=$GRID: mha, mqa or gqa3" >&2; exit 2 ;;
esac
[ -n "$GRID" ] && export FSDP_GRID=$GRID
train() { # STEPS LOAD(or "") OUT METRICS
  {
    echo "model: $MODEL"
    echo "data: {kind: safetensors, path: $BATCH, batch_size: $BS, seq_len: $SEQ}"
    echo "stages:"
    if [ -n "$2" ]; then echo "  - {id: l, uses: load-ckpt, with: {path: $2}}"; else echo "  - {id: i, uses: init-meta}"; fi
    echo "  - {id: t, uses: train-steps, with: {steps: $1, lr: 1e-3, decay: none, betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0, metrics: $4}}"
    [ -n "$3" ] && echo "  - {id: s, uses: save-dcp, with: {path: $3}}"
  } > "$D/r.yaml"
  "$BIN" -q "$D/r.yaml"
}
train 3 "" "$D/ff" "$D/m0.jsonl"
train 5 "$D/ff" "" "$D/m1.jsonl"
echo "fsdp-run's next two steps:"
grep -o '"step": [0-9]*, "loss": [0-9.e-]*, "grad_norm": [0-9.e-]*' "$D/m1.jsonl"
# chk NAME CMD...: the checker's last line (its JSON), or why it failed; the other systems are checked either way
chk() {
  local name=$1 out rc=0
  shift
  echo "$name:"
  out=$(env "$@" 2>/dev/null) || rc=$?
  if [ "$rc" = 0 ]; then printf '%s\n' "$out" | tail -1; else echo "  FAILED (exit $rc)"; fi
}
conv() { "$BIN" ckpt convert "$D/ff" "$1" --to "$2" --n-heads "${HEADS[0]}" --n-kv-heads "${HEADS[1]}" --world "$WORLD" "${@:3}" > /dev/null; }
export OMP_NUM_THREADS=1
mkdir -p "$D/tt3" "$D/tt2" "$D/fms/checkpoints"
conv "$D/tt3/step-3" torchtitan-0.3
conv "$D/tt2/step-3" torchtitan-0.2
conv "$D/oc" olmo-core-3
conv "$D/fms/checkpoints/step_3_ckp" fms-1.13
conv "$D/meg" megatron-fsdp-0.6
conv "$D/acc" accelerate-1.15
# DeepSpeed's load takes clip_grad from the checkpoint: its ds_config's gradient_clipping (the fixtures' 1.0)
conv "$D/ds2" deepspeed-zero2 --option gradient_clipping=1.0
conv "$D/ds1" deepspeed-zero1 --option gradient_clipping=1.0
conv "$D/ds3" deepspeed-zero3
# OLMo's clipping reads max_grad_norm from the loaded param groups: its TrainConfig's (the fixtures' 1.0)
conv "$D/olmo/step3-unsharded" olmo-0.6 --option max_grad_norm=1.0
conv "$D/olmo-st/step3-unsharded" olmo-0.6-st --option max_grad_norm=1.0 # its safetensors twins
chk "torchtitan 0.3.0" "$PY" tools/gen/trainers/check_torchtitan.py "$D/tt3" --batch "$BATCH"
if [ -n "$GRID" ]; then echo "torchtitan 0.2.2: not at the grid's shapes (its FFN width is rounded to a multiple of 64)"; else
  chk "torchtitan 0.2.2" "$PY" tools/gen/trainers/check_torchtitan.py "$D/tt2" --batch "$BATCH"
fi
chk "OLMo-core 3.0.0" PYTHONPATH="$STUBS:$SEEDPKGS/olmocore" "$PY" tools/gen/trainers/check_olmo_core.py "$D/oc" --world "$WORLD" --batch "$BATCH"
chk "Megatron-FSDP 0.6.1" PYTHONPATH="$SEEDPKGS/megatron" "$PY" tools/gen/trainers/check_megatron_fsdp.py "$D/meg" --world "$WORLD" --batch "$BATCH"
chk "accelerate 1.15.0" MASTER_PORT=29611 PYTHONPATH="$SEEDPKGS/accelerate" "$PY" tools/gen/trainers/check_accelerate.py "$D/acc" --no-rng-states --world "$WORLD" --batch "$BATCH"
chk "fms-fsdp + ibm-fms 1.13.1" PYTHONPATH="$SEEDPKGS/fms:${FMS_SRC:-/work/fms-fsdp-src}" "$PY" tools/gen/trainers/check_fms.py "$D/fms" --world "$WORLD" --batch "$BATCH"
chk "OLMo 0.6.0" PYTHONPATH="$SEEDPKGS/olmo:$SEEDPKGS/olmo-extra" "$PY" tools/gen/trainers/check_olmo.py "$D/olmo/step3-unsharded" --world "$WORLD" --batch "$BATCH"
chk "OLMo 0.6.0 (safetensors twins)" PYTHONPATH="$SEEDPKGS/olmo:$SEEDPKGS/olmo-extra" "$PY" tools/gen/trainers/check_olmo.py "$D/olmo-st/step3-unsharded" --world "$WORLD" --batch "$BATCH"
for st in 1 2 3; do
  chk "DeepSpeed 0.19.8 ZeRO-$st" DS_ACCELERATOR=cpu PYTHONPATH="$SEEDPKGS/deepspeed" "$PY" tools/gen/trainers/check_deepspeed.py "$D/ds$st" --stage "$st" --world "$WORLD" --batch "$BATCH"
done
