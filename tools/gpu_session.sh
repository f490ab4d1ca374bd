#!/bin/bash
# Runs on a lent GPU machine, from the repository root, with build/gpu-kit carried (make gpu-kit
# here first). Unpacks the kit, runs every GPU test (the ones that skip without a GPU), then the
# GPU benchmarks with PyTorch's baseline from ../shared/bench/torch_baseline.py in the same call.
# Everything is logged under $OUT (or ./gpu-out); the last lines printed are a summary.
#
#   bash tools/gpu_session.sh [tests|bench|all|full] [GTEST_FILTER]
#     tests: the GPU test suites (they skip without a GPU elsewhere); bench: build/bench/gpu_*;
#     all: both; full: the whole test suite (runtime.device auto then picks the GPU in the
#     end-to-end tests too)
set -u
what=${1:-all}
filter=${2:-'Cuda*:CommNccl*:Kcu*:LlamaFsdpCuda*:LlamaInitCuda*:StageDevice*:StateDev*'}
[ "$what" = full ] && filter=${2:-'*'}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
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
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
summary="$out/summary.txt"
: >"$summary"
if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = full ]; then
    ./build/tests/fsdp_tests --gtest_filter="$filter" >"$out/gpu_tests.log" 2>&1
    echo "gpu tests ($filter): exit $?" >>"$summary"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$out/gpu_tests.log" | sort | uniq -c | head -40 >>"$summary"
    grep -E "^\[  FAILED  \]" "$out/gpu_tests.log" | head -40 >>"$summary"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    for b in build/bench/gpu_*; do
        [ -x "$b" ] || continue
        n=$(basename "$b")
        timeout 400 "$b" --torch gpu-shared/bench/torch_baseline.py >"$out/$n.log" 2>&1
        echo "$n: exit $?" >>"$summary"
        tail -15 "$out/$n.log" >>"$summary"
    done
fi
cat "$summary"
