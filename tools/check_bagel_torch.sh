#!/usr/bin/env bash
# Sets up (idempotently, outside the project) the environment tools/check_bagel_torch.py needs and runs
# it: checks a Bagel step-0 checkpoint with ByteDance's own Bagel code and PyTorch 2.11 (CPU, gloo).
# By hand only: not part of the build, CI or the tests.
#
#   tools/check_bagel_torch.sh setup                      # only set up
#   tools/check_bagel_torch.sh --layout dcp|pr240|head --out DIR [--world N] [--tied] [--llm D] [--vit D]
#   tools/check_bagel_torch.sh selftest [--worlds 1,2] [--keep DIR] [--only NAME]   # test the checker
#
# env (all optional):
#   TORCHENV         where the environment goes (default /work/torchenv): a venv with torch==2.11.0,
#                    numpy, safetensors; bagel-pydeps/ (Bagel's pins, transformers 4.49.0 etc., installed
#                    with pip --target --no-deps as the fixture's gen/run.sh does, used via PYTHONPATH);
#                    bagel-056b5fd/ (Bagel at commit 056b5fd); pr240/checkpoint.py (PR #240's, head bd2f046)
#   BAGEL_GIT        a git dir of ByteDance-Seed/Bagel holding 056b5fd and PR #240's head commit
#                    (default /work/.mirror/ByteDance-Seed+Bagel/repo); only read when TORCHENV lacks them
#   TORCH_INDEX_URL  a pip index for a CPU-only torch wheel (default: pip's own index; its torch 2.11.0 is
#                    a CUDA build, which runs on CPU too)
#   BAGEL_FIXTURE    the fixture (default ../shared/fixtures/bagel-056b5fd from the repository root)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TORCHENV=${TORCHENV:-/work/torchenv}
BAGEL_GIT=${BAGEL_GIT:-/work/.mirror/ByteDance-Seed+Bagel/repo}
BAGEL_COMMIT=056b5fd51a88c1eb4547318609e25d40080fcf87
PR240_COMMIT=bd2f046963458a34507f3d25765b3976698ef00c
PY=$TORCHENV/bin/python
PYDEPS=$TORCHENV/bagel-pydeps
export BAGEL_SRC=$TORCHENV/bagel-056b5fd
export PR240_CHECKPOINT_PY=$TORCHENV/pr240/checkpoint.py

log() { echo "check_bagel_torch.sh: $*" >&2; }

setup() {
  if ! "$PY" -c "import torch, numpy, safetensors; assert torch.__version__.split('+')[0] == '2.11.0'" 2>/dev/null; then
    log "creating $TORCHENV (torch 2.11.0, numpy, safetensors)"
    [ -x "$PY" ] || python3 -m venv "$TORCHENV"
    if [ -n "${TORCH_INDEX_URL:-}" ] &&
       "$PY" -m pip install -q "torch==2.11.0" --index-url "$TORCH_INDEX_URL"; then :; else
      [ -n "${TORCH_INDEX_URL:-}" ] && log "TORCH_INDEX_URL failed; using pip's default index"
      "$PY" -m pip install -q "torch==2.11.0"
    fi
    "$PY" -m pip install -q numpy safetensors
  fi
  # Bagel's pins beside the venv, not in it (gen/run.sh of the fixture installs the first ten; Bagel's
  # imports need tqdm, packaging, pyyaml, regex and pillow too)
  if ! PYTHONPATH=$PYDEPS "$PY" -c "
import transformers, tokenizers, huggingface_hub, einops, tqdm, yaml, regex, PIL, requests
assert transformers.__version__ == '4.49.0' and einops.__version__ == '0.8.1'" 2>/dev/null; then
    log "installing Bagel's pinned Python packages into $PYDEPS"
    rm -rf "$PYDEPS"
    "$PY" -m pip install -q --target "$PYDEPS" --no-deps "transformers==4.49.0" \
      "tokenizers>=0.21,<0.22" "huggingface_hub==0.29.1" "einops==0.8.1" requests urllib3 idna certifi \
      charset_normalizer tqdm packaging pyyaml regex pillow
  fi
  if [ ! -f "$BAGEL_SRC/.commit" ] || [ "$(cat "$BAGEL_SRC/.commit")" != "$BAGEL_COMMIT" ] ||
     [ ! -s "$PR240_CHECKPOINT_PY" ]; then
    if ! git -C "$BAGEL_GIT" cat-file -e "$BAGEL_COMMIT^{commit}" 2>/dev/null ||
       ! git -C "$BAGEL_GIT" cat-file -e "$PR240_COMMIT^{commit}" 2>/dev/null; then
      log "BAGEL_GIT=$BAGEL_GIT lacks Bagel commit $BAGEL_COMMIT or PR #240's $PR240_COMMIT"
      log "(clone ByteDance-Seed/Bagel and fetch refs/pull/240/head into it, then set BAGEL_GIT)"
      exit 2
    fi
    log "extracting Bagel ${BAGEL_COMMIT:0:7} and PR #240's train/checkpoint.py into $TORCHENV"
    rm -rf "$BAGEL_SRC"; mkdir -p "$BAGEL_SRC" "$(dirname "$PR240_CHECKPOINT_PY")"
    git -C "$BAGEL_GIT" archive "$BAGEL_COMMIT" | tar -x -C "$BAGEL_SRC"
    git -C "$BAGEL_GIT" show "$PR240_COMMIT:train/checkpoint.py" > "$PR240_CHECKPOINT_PY.tmp"
    mv "$PR240_CHECKPOINT_PY.tmp" "$PR240_CHECKPOINT_PY"
    echo "$BAGEL_COMMIT" > "$BAGEL_SRC/.commit"
  fi
}

setup
export PYTHONPATH=$PYDEPS PYTHONDONTWRITEBYTECODE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
case "${1:-}" in
  setup) log "environment ready in $TORCHENV"; exit 0 ;;
  selftest) shift; exec "$PY" "$HERE/check_bagel_torch_selftest.py" "$@" ;;
  *) exec "$PY" "$HERE/check_bagel_torch.py" "$@" ;;
esac
