// The emulated-device build's kernels: every kernels/cuda/*.cu compiled as host C++ on the CUDA
// emulation of tests/kcu_emu.h in its KCU_EMU_DEVICE mode (launches are deferred operations on the fake
// runtime's streams, tests/emu/emu_cudart.cc), at global scope with C linkage: the kcu_* API of
// kernels/cuda/kcu.h that the nvcc build provides.
#define KCU_EMU_DEVICE 1
#include "tests/kcu_emu.h"

#include "runtime/rng_math.h"

extern "C" {
#include "kernels/cuda/kcu.h"
}

#include "kernels/cuda/kcu_elementwise.cu"
#include "kernels/cuda/kcu_rows.cu"
#include "kernels/cuda/kcu_optim.cu"
#include "kernels/cuda/kcu_attention_tc.cu"
#include "kernels/cuda/kcu_attention.cu"
#include "kernels/cuda/kcu_init.cu"
#include "kernels/cuda/kcu_moe.cu"
