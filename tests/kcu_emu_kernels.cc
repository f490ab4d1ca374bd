// Every kernel source of kernels/cuda/ compiled as host C++ on the emulation of tests/kcu_emu.h, in
// namespace kcu_emu_dev (declared by tests/kcu_emu_api.h), for the tests/test_kcu_emu_*.cc tests.
#include "tests/kcu_emu_api.h"

namespace kcu_emu_dev {
#include "kernels/cuda/kcu_elementwise.cu"
#include "kernels/cuda/kcu_rows.cu"
#include "kernels/cuda/kcu_optim.cu"
#include "kernels/cuda/kcu_attention_tc.cu"
#include "kernels/cuda/kcu_attention.cu"
#include "kernels/cuda/kcu_init.cu"
#include "kernels/cuda/kcu_moe.cu"
}
