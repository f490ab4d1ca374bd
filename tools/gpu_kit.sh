#!/bin/sh
# Packs what a lent GPU machine needs to run fsdp-run's GPU tests and benchmarks into one archive
# small enough to travel (the device tool carries at most 64 MiB): the binary, the test binary, the
# MPI helper programs, the plugins and the benchmarks, with their non-system libraries (not the CUDA
# toolkit: the GPU machine has its own; see tools/bundle.sh), stripped, in a `build/` layout, plus
# the shared fixtures and PyTorch baseline (../shared/fixtures, ../shared/bench), which do not
# travel with the repository.
#
#   sh tools/gpu_kit.sh [BUILD]      (make gpu-kit) -> BUILD/gpu-kit/kit.tar.xz
#
# On the GPU machine: sh tools/gpu_session.sh (it unpacks the kit and runs everything).
set -eu
build=${1:-build}
die() {
    echo "gpu_kit: $*" >&2
    exit 1
}
[ -x "$build/fsdp-run" ] || die "$build/fsdp-run is missing (run make first)"
[ -x "$build/tests/fsdp_tests" ] || die "$build/tests/fsdp_tests is missing (run make build/tests/fsdp_tests)"
kit="$build/gpu-kit"
stage="$kit/stage"
rm -rf "$kit"
mkdir -p "$stage"
extra=""
for f in "$build"/tests/fsdp_tests; do extra="$extra $f=tests"; done
for f in "$build"/tests/mpi/*; do [ -x "$f" ] && extra="$extra $f=tests/mpi"; done
for f in "$build"/tests/plugins/*.so; do [ -f "$f" ] && extra="$extra $f=tests/plugins"; done
for f in "$build"/plugins/*.so; do [ -f "$f" ] && extra="$extra $f=plugins"; done
for f in "$build"/bench/*; do [ -x "$f" ] && extra="$extra $f=bench"; done
FSDP_BUNDLE_STRIP=1 FSDP_BUNDLE_EXTRA="$extra" sh tools/bundle.sh "$build/fsdp-run" "$stage/build"
if [ -d ../shared/fixtures ]; then
    mkdir -p "$stage/shared"
    cp -R ../shared/fixtures "$stage/shared/"
    [ -d ../shared/bench ] && cp -R ../shared/bench "$stage/shared/"
fi
tar -C "$stage" -cJf "$kit/kit.tar.xz" .
rm -rf "$stage"
size=$(wc -c <"$kit/kit.tar.xz")
echo "gpu_kit: $kit/kit.tar.xz ($((size / 1048576)) MiB)"
[ "$size" -lt 60000000 ] || die "the kit is $size bytes: over what the device tool carries"
