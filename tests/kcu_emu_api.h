// The public kcu_* API (kernels/cuda/kcu.h) as compiled from the kernel sources by
// tests/kcu_emu_kernels.cc on the host emulation of tests/kcu_emu.h: the same host wrappers (argument
// checks, dispatch, launch configuration) and kernels as the nvcc build, in namespace kcu_emu_dev.
#ifndef FSDP_TESTS_KCU_EMU_API_H
#define FSDP_TESTS_KCU_EMU_API_H

#include "tests/kcu_emu.h"
// Shared with the host code (the init kernels use the host's RNG math): global, not emulated.
#include "runtime/rng_math.h"

namespace kcu_emu_dev {
#include "kernels/cuda/kcu.h"
}

#endif
