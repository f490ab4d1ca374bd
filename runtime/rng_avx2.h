/* The SIMD generators of the init fills: rng_math.h's code written with 8-lane AVX2+FMA intrinsics
 * (runtime/rng_avx2.c) and 16-lane AVX-512 ones (runtime/rng_avx512.c), giving the same bits as the
 * portable path (rng.c's chunk, the shared header); rng.c picks one at run time (rng_path_default,
 * rng.h). Internal to runtime/rng*.c. */
#ifndef FSDP_RUNTIME_RNG_AVX2_H
#define FSDP_RUNTIME_RNG_AVX2_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/rng.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RNG_HAVE_AVX2 1
#else
#define RNG_HAVE_AVX2 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the CPU runs AVX2, FMA and F16C (and this build has the code), else 0. */
int rng_avx2_supported(void);
/* 1 when the CPU runs AVX-512F (runtime/rng_avx512.c, the same code on 16 lanes), else 0. */
int rng_avx512_supported(void);

#if RNG_HAVE_AVX2
/* Elements 4 blk0 .. 4 blk0 + RNG_CHUNK - 1 of (seed, stream) under d into out (any alignment).
 * Only when rng_avx2_supported(). */
void rng_avx2_chunk(const rng_dist *d, uint64_t seed, uint64_t stream, uint64_t blk0, float *out);
/* The same on 16 lanes; only when rng_avx512_supported(). */
void rng_avx512_chunk(const rng_dist *d, uint64_t seed, uint64_t stream, uint64_t blk0, float *out);
/* rng_to_half_path / rng_round_half_path (rng.h) on each path. */
void rng_avx2_to_half(const float *src, uint16_t *dst, size_t n, int bf16);
void rng_avx2_round_half(float *x, size_t n, int bf16);
void rng_avx512_to_half(const float *src, uint16_t *dst, size_t n, int bf16);
void rng_avx512_round_half(float *x, size_t n, int bf16);
#endif

#ifdef __cplusplus
}
#endif
#endif
