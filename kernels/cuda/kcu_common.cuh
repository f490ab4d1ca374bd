// Shared by kernels/cuda/*.cu: bf16 storage, loads and stores in float, warp and block reductions,
// launch checks and dtype dispatch.
#ifndef FSDP_KERNELS_CUDA_KCU_COMMON_CUH
#define FSDP_KERNELS_CUDA_KCU_COMMON_CUH

#ifdef KCU_EMULATE
// Host emulation (tests only): tests/kcu_emu.h, included first at global scope, supplies the CUDA
// surface and the macros below.
#ifndef FSDP_TESTS_KCU_EMU_H
#error "KCU_EMULATE: include tests/kcu_emu.h before the kernel sources"
#endif
#else
#include <cuda_runtime.h>
// Spelled through macros so that the same source also compiles as host C++ under tests/kcu_emu.h.
#define KCU_API extern "C"
#define KCU_UNROLL _Pragma("unroll")
// kernel<<<grid, block, smem, stream>>>(args...); a template-id with commas goes in parentheses.
#define KCU_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define KCU_SHARED(T, name, n) __shared__ T name[n]
#define KCU_DYN_SHARED(T, name) extern __shared__ T name[]
#endif
#include <stdint.h>

#include "kernels/cuda/kcu.h"

// bfloat16 as its raw bits; conversions are those of runtime/dtype.c (fsdp_f32_to_bf16).
struct kcu_bf16 {
    uint16_t bits;
};

__device__ __forceinline__ float kcu_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t kcu_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float kcu_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float kcu_ld(const kcu_bf16 *p, size_t i) { return kcu_bf2f(p[i].bits); }
__device__ __forceinline__ void kcu_st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void kcu_st(kcu_bf16 *p, size_t i, float v) { p[i].bits = kcu_f2bf(v); }

#define KCU_FULL_MASK 0xffffffffu

template <class V>
__device__ __forceinline__ V kcu_warp_sum(V v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KCU_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float kcu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(KCU_FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// sh: 32 elements of shared memory.
template <class V>
__device__ __forceinline__ V kcu_block_sum(V v, V *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kcu_warp_sum(v);
    __syncthreads(); // sh may still be read by a previous reduction
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : V(0);
        v = kcu_warp_sum(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float kcu_block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kcu_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        v = kcu_warp_max(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// Records a bad index (1 + row) once.
__device__ __forceinline__ void kcu_set_bad(int *d_bad, int64_t row) {
    if (d_bad) atomicCAS(d_bad, 0, row < 0x7ffffffe ? (int)(row + 1) : 0x7fffffff);
}

// ---- host side ----------------------------------------------------------------------------------

static inline int kcu_launch_check(fsdp_err *err, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return fsdp_err_set(err, FSDP_E_DEVICE, "%s: kernel launch failed: %s: %s", kernel, cudaGetErrorName(e),
                            cudaGetErrorString(e));
    return FSDP_OK;
}

static inline int kcu_cuda_fail(fsdp_err *err, cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static inline int kcu_check_dt(fsdp_dtype dt, const char *what, fsdp_err *err) {
    if (dt != FSDP_DT_F32 && dt != FSDP_DT_BF16)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: dtype %s is not supported (f32 or bf16)", what,
                            fsdp_dtype_name(dt));
    return FSDP_OK;
}

// Blocks for a grid-stride loop over n items with `threads` threads per block.
static inline unsigned kcu_blocks(int64_t n, int threads, unsigned cap = 1u << 16) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > (int64_t)cap ? cap : (unsigned)b;
}

// Runs the statements with T = float or kcu_bf16 according to dt (checked before).
#define KCU_DISPATCH(dt, T, ...)         \
    do {                                 \
        if ((dt) == FSDP_DT_F32) {       \
            typedef float T;             \
            __VA_ARGS__;                 \
        } else {                         \
            typedef kcu_bf16 T;          \
            __VA_ARGS__;                 \
        }                                \
    } while (0)

// Asks for more than 48 KiB of dynamic shared memory when a launch needs it.
template <class K>
static inline int kcu_smem_optin(K kernel, size_t bytes, const char *what, fsdp_err *err) {
    if (bytes <= 48 * 1024) return FSDP_OK;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return kcu_cuda_fail(err, e, what);
    return FSDP_OK;
}

#endif
