#!/bin/bash
# Runs on a lent GPU machine, from the repository root, with build/gpu-kit carried (make gpu-kit
# here first). Unpacks the kit, then runs its phases in this order, each within a fixed time budget
# (seconds; the environment variables override them):
#   smoke  (GPU_BUDGET_SMOKE, 45)   the GPU is seen, fsdp-run is a CUDA build and trains 3 steps on it
#   tests  (GPU_BUDGET_TESTS, 180)  the GPU test suites (they skip without a GPU elsewhere)
#   train  (GPU_BUDGET_TRAIN, 120)  build/bench/gpu_train against PyTorch (../shared/bench/torch_baseline.py)
#   io     (GPU_BUDGET_IO, 75)      build/bench/gpu_io against PyTorch
# A phase still running at its budget is cut off cleanly: the benchmarks stop what runs at their own
# --budget and print the figures measured so far; the test binary is stopped by timeout (its log holds
# every test that finished). Everything is logged under $OUT (or ./gpu-out); the kit's summary is the
# last thing printed. With the defaults `all` takes about 7 minutes at most, inside one 10-minute call.
#
#   bash tools/gpu_session.sh [tests|bench|all|full] [GTEST_FILTER]
#     tests: smoke + tests; bench: smoke + train + io; all: every phase; full: the whole test suite
#     (runtime.device auto then picks the GPU in the end-to-end tests too) instead of the GPU suites.
#   GPU_SESSION_DRY_RUN=1 prints the phases, their budgets and commands without running them.
set -u
what=${1:-all}
filter=${2:-'Cuda*:FreezeGpu*:PluginHooksGpu*:CommNccl*:Kcu*:LlamaFsdpCuda*:LlamaInitCuda*:StageDevice*:StateDev*'}
[ "$what" = full ] && filter=${2:-'*'}
case "$what" in tests | bench | all | full) ;; *) echo "gpu_session: unknown mode '$what' (tests|bench|all|full)"; exit 2 ;; esac
b_smoke=${GPU_BUDGET_SMOKE:-45}
b_tests=${GPU_BUDGET_TESTS:-180}
b_train=${GPU_BUDGET_TRAIN:-120}
b_io=${GPU_BUDGET_IO:-75}
dry=${GPU_SESSION_DRY_RUN:-0}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
t_start=$(date +%s)

note() { echo "$*" >>"$summary"; }

# phase NAME BUDGET LOG CMD...: runs CMD (line-buffered output into LOG) under timeout at BUDGET
# seconds (+15 s for a benchmark to print what it measured after stopping at its own --budget);
# notes its exit status, whether it was cut off, and its seconds.
phase() {
    local name=$1 budget=$2 log=$3
    shift 3
    if [ "$dry" = 1 ]; then
        echo "phase $name: budget ${budget}s: $*"
        note "$name: dry run"
        return 0
    fi
    local t0 rc
    t0=$(date +%s)
    timeout -k 10 "$budget" stdbuf -oL -eL "$@" >"$log" 2>&1
    rc=$?
    local el=$(($(date +%s) - t0))
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        note "$name: cut off at its budget of ${budget}s (what it measured so far: $log)"
    else
        note "$name: exit $rc in ${el}s (budget ${budget}s)"
    fi
    return $rc
}

if [ "$dry" != 1 ]; then
    kit=build/gpu-kit/kit.tar.xz
    [ -f "$kit" ] || { echo "gpu_session: $kit is missing (make gpu-kit, and carry build/gpu-kit)"; exit 1; }
    tmp=$(mktemp -d)
    tar -C "$tmp" -xJf "$kit"
    mkdir -p build
    cp -R "$tmp/build/." build/
    if [ -d "$tmp/shared" ]; then
        export FSDP_FIXTURES="$PWD/gpu-shared/fixtures"
        rm -rf gpu-shared && mv "$tmp/shared" gpu-shared
    fi
    rm -rf "$tmp"
    FSDP_BUNDLE_DIR="$PWD/build" . build/env.sh
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    note "unpacked in $(($(date +%s) - t_start))s"
fi

# ---- smoke: the GPU, the build, three training steps on the device ----
smoke_recipe="$out/smoke.yaml"
cat >"$smoke_recipe" <<'EOF'
model: {preset: tiny}
runtime: {device: cuda, seed: 0}
data: {kind: synthetic, batch_size: 2, seq_len: 32}
stages:
  - {id: init, uses: init-meta}
  - {id: train, uses: train-steps, with: {steps: 3}}
EOF
phase smoke "$b_smoke" "$out/smoke.log" bash -c \
    'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader &&
     ./build/fsdp-run --version | grep -q CUDA && ./build/fsdp-run --version &&
     ./build/fsdp-run "$0"' "$smoke_recipe"
smoke_rc=$?
[ "$dry" = 1 ] || head -3 "$out/smoke.log" >>"$summary"
[ "$dry" = 1 ] || [ $smoke_rc = 0 ] || { note "smoke check failed: the other phases are not run"; tail -20 "$out/smoke.log" >>"$summary"; }

if [ $smoke_rc = 0 ] && { [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = full ]; }; then
    phase "gpu tests ($filter)" "$b_tests" "$out/gpu_tests.log" ./build/tests/fsdp_tests --gtest_filter="$filter"
    if [ "$dry" != 1 ]; then
        grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$out/gpu_tests.log" | sort | uniq -c | head -40 >>"$summary"
        grep -E "^\[  FAILED  \]" "$out/gpu_tests.log" | head -40 >>"$summary"
        echo "  $(grep -c '^\[       OK \]' "$out/gpu_tests.log") tests passed before the end" >>"$summary"
    fi
fi
if [ $smoke_rc = 0 ] && { [ "$what" = bench ] || [ "$what" = all ]; }; then
    torch=gpu-shared/bench/torch_baseline.py
    # the benchmark stops at its own --budget (15 s before the phase's) and prints its table
    phase gpu_train "$b_train" "$out/gpu_train.log" ./build/bench/gpu_train --torch "$torch" --budget $((b_train - 15))
    [ "$dry" = 1 ] || tail -8 "$out/gpu_train.log" >>"$summary"
    phase gpu_io "$b_io" "$out/gpu_io.log" ./build/bench/gpu_io --torch "$torch" --budget $((b_io - 15))
    [ "$dry" = 1 ] || tail -8 "$out/gpu_io.log" >>"$summary"
fi
note "gpu_session $what: $(($(date +%s) - t_start))s in all"
cat "$summary"
