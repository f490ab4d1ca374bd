// Parameter init on the GPU: the counter-based RNG of runtime/rng.h with the shared float
// transforms of runtime/rng_math.h, so every element has the bits the host computes.
#include "kernels/cuda/kcu_common.cuh"

// One thread per Philox block (four consecutive elements of the stream); elements outside
// [start, start + n) are not written.
__global__ void init_fill_kernel(float *dst, rng_dist d, uint64_t seed, uint64_t stream, uint64_t start, uint64_t n,
                                 uint64_t b0, uint64_t nb) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < nb; i += (uint64_t)gridDim.x * blockDim.x) {
        float v[4];
        rng_hd_dist_block(&d, seed, stream, b0 + i, v);
        const uint64_t e = (b0 + i) * 4;
        KCU_UNROLL
        for (int j = 0; j < 4; j++) {
            const uint64_t ej = e + (uint64_t)j;
            if (ej >= start && ej - start < n) dst[ej - start] = v[j];
        }
    }
}

KCU_API int kcu_init_fill(float *dst, const rng_dist *dist, uint64_t seed, uint64_t stream, uint64_t start,
                          int64_t n, kcu_stream s, fsdp_err *err) {
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_init_fill: negative length %lld", (long long)n);
    if (!dist) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_init_fill: no distribution");
    if (dist->kind < RNG_DIST_UNIFORM || dist->kind > RNG_DIST_UNIFORM_AB)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_init_fill: unknown distribution kind %d", dist->kind);
    if (n == 0) return FSDP_OK;
    if (!dst) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_init_fill: no output buffer");
    if (start > UINT64_MAX - (uint64_t)n)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_init_fill: elements [%llu, +%lld) overflow the stream",
                            (unsigned long long)start, (long long)n);
    const uint64_t b0 = start / 4, b1 = (start + (uint64_t)n - 1) / 4;
    const uint64_t nb = b1 - b0 + 1;
    KCU_LAUNCH(init_fill_kernel, kcu_blocks((int64_t)nb, 256), 256, 0, s)(dst, *dist, seed, stream, start,
                                                                         (uint64_t)n, b0, nb);
    return kcu_launch_check(err, "kcu_init_fill");
}
