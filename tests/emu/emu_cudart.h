// The emulated-device build (`make emu`, build-emu/): the parts of the fake CUDA runtime
// (tests/emu/emu_cudart.cc) that the other fakes use: the emulated kernels (tests/kcu_emu.h with
// KCU_EMU_DEVICE), the fake cuBLASLt (tests/emu/emu_cublas.cc) and the fake NCCL
// (tests/emu/emu_nccl.cc) queue their work as deferred operations on a stream through enqueue().
// See tests/emu/emu_cudart.cc for the execution semantics.
#ifndef FSDP_TESTS_EMU_EMU_CUDART_H
#define FSDP_TESTS_EMU_EMU_CUDART_H

#include <cuda_runtime_api.h>

#include <functional>
#include <string>

namespace emucu {

// An operation runs when something forces its stream; it returns "" or what failed (the stream's
// next synchronisation then returns `code` with that message).
typedef std::function<std::string()> Op;

// Appends op to stream s (NULL: the current device's legacy stream). cudaErrorInvalidResourceHandle
// for a stream that does not exist (the last error is set too).
cudaError_t enqueue(cudaStream_t s, const char *what, Op op, cudaError_t code = cudaErrorLaunchFailure);

// Sets this thread's last error (cudaGetLastError / cudaPeekAtLastError) with its message
// (cudaGetErrorString of that code).
void set_error(cudaError_t e, const std::string &detail);

// 1 when [p, p + bytes) lies inside one device allocation (cudaMalloc) that is alive.
bool is_device_range(const void *p, size_t bytes);

}  // namespace emucu

#endif
