/* Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11), and the distributions the model init needs.
 *
 * Every value is a pure function of (seed, stream, index). Element i of a stream lies in Philox
 * block b = i / 4, word j = i % 4, with
 *   key     = { seed & 0xffffffff, seed >> 32 }
 *   counter = { b & 0xffffffff, b >> 32, stream & 0xffffffff, stream >> 32 }
 * so any element can be generated alone, in any order, on any number of threads or ranks, on the
 * host or on the GPU, and always gives the same bits. For parameter init the stream is
 * rng_fnv1a64(name) and the index is the element's flat (row-major) index in the full, unsharded
 * parameter.
 *
 * The transforms are float32 and use only correctly rounded IEEE operations (runtime/rng_math.h,
 * shared with the CUDA kernel), so the host and the GPU give identical bits:
 *   uniform u(x) in (0,1) from a word x: ((x >> 9) + 0.5) * 2^-23, exact, in [2^-24, 1 - 2^-24].
 *   uniform:          element 4b+j = u(x_j).
 *   standard normal:  Box-Muller on the word pairs (x0, x1) -> elements 4b, 4b+1 and
 *                     (x2, x3) -> elements 4b+2, 4b+3:
 *                       r = sqrt(-2 ln u(x_even)), angle = 2 pi ((x_odd >> 8) + 0.5) 2^-24,
 *                       element 4b+2p = r cos(angle), element 4b+2p+1 = r sin(angle);
 *                     normal(mean, std) = fmaf(z, std, mean) with float mean and std.
 *   truncated normal: torch.nn.init.trunc_normal_'s inverse-CDF algorithm:
 *                       lo = 2 Phi((a-mean)/std) - 1, span = 2 Phi((b-mean)/std) - 1 - lo
 *                       (in double on the host, then rounded to float), element 4b+j =
 *                       clamp(fmaf(erfinv(fmaf(u(x_j), span, lo)), std sqrt(2), mean), a, b).
 *   uniform(a, b):    element 4b+j = clamp(fmaf(u(x_j), b - a, a), a, b).
 *   constant:         every element is the value.
 * ln, cos/sin and erfinv are our own float implementations (rng_math.h: Taylor series for ln,
 * cos and sin after exact reductions, fitted polynomials in ln(1-x^2) for erfinv), within a few
 * float ulp of the exact functions. The largest |z| reachable is about 5.8 (normal) and 5.3 std
 * (truncated normal, where the bounds allow it). */
#ifndef FSDP_RUNTIME_RNG_H
#define FSDP_RUNTIME_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "runtime/rng_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block: out = philox(ctr, key). */
void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Block b of (seed, stream): philox({b lo, b hi, stream lo, stream hi}, {seed lo, seed hi}). */
void rng_block(uint64_t seed, uint64_t stream, uint64_t b, uint32_t out[4]);

/* 64-bit FNV-1a of a NUL-terminated string (offset basis 0xcbf29ce484222325,
 * prime 0x100000001b3): the stream id of a parameter name. */
uint64_t rng_fnv1a64(const char *s);

/* Inverse error function in double for x in (-1, 1), within 1.5 ulp of double (checked against
 * mpmath on 20000 points over the whole range and tails); +-inf at +-1, NaN outside [-1, 1] or
 * for NaN. The reference the float transforms are tested against. */
double rng_erfinv(double x);

/* Standard normal CDF, 0.5 * (1 + erf(x / sqrt(2))) (the formula torch's trunc_normal_ uses). */
double rng_norm_cdf(double x);

/* The float implementations of rng_math.h, as functions (tests, benchmarks). */
float rng_erfinvf(float x); /* x in [-1, 1] */
float rng_logf(float x);    /* x positive and normal */

/* Distributions (rng_dist, rng_math.h). Each checks its arguments and fills d. */
void rng_dist_uniform(rng_dist *d);
void rng_dist_const(rng_dist *d, float value);
/* normal(mean, std): finite mean, finite std > 0, both representable in float. */
int rng_dist_normal(rng_dist *d, double mean, double std, fsdp_err *err);
/* N(mean, std^2) restricted to [a, b], torch's parametrisation: finite mean, std > 0, a < b, and
 * [a, b] must hold probability mass in float (else FSDP_E_INVALID). */
int rng_dist_trunc_normal(rng_dist *d, double mean, double std, double a, double b, fsdp_err *err);

/* U(a, b): lo + u (b - a) in float32 with u in (0, 1), clamped to [a, b] (torch.nn.init.uniform_'s
 * distribution): finite float32 bounds with a < b and b - a finite. */
int rng_dist_uniform_ab(rng_dist *d, double a, double b, fsdp_err *err);

/* Element `index` of (seed, stream) under d, one at a time (the reference of the fills). */
float rng_dist_at(const rng_dist *d, uint64_t seed, uint64_t stream, uint64_t index);

/* dst[k] = element start + k of (seed, stream) under d, k = 0..n-1: vectorised, on all OpenMP
 * threads when n is large enough. The bits never depend on how a range is split into calls nor on
 * the number of threads. rng_fill_dist_serial does the same on the calling thread only (for
 * callers that run their own parallel region). */
void rng_fill_dist(const rng_dist *d, float *dst, uint64_t seed, uint64_t stream, uint64_t start, size_t n);
void rng_fill_dist_serial(const rng_dist *d, float *dst, uint64_t seed, uint64_t stream, uint64_t start,
                          size_t n);

/* The generator's code paths, which give the same bits: RNG_PATH_PORTABLE runs rng_math.h's code
 * vectorised by the compiler (clones for x86-64-v4, v3 and the baseline); RNG_PATH_AVX2 and
 * RNG_PATH_AVX512 are the hand-written AVX2+FMA and AVX-512 codes of runtime/rng_avx2.c and
 * runtime/rng_avx512.c. */
typedef enum rng_path { RNG_PATH_PORTABLE = 0, RNG_PATH_AVX2 = 1, RNG_PATH_AVX512 = 2 } rng_path;

/* 1 when path p runs on this CPU and build. */
int rng_path_supported(rng_path p);

/* The path the fills take: the widest SIMD path the CPU runs (AVX-512, else AVX2), unless the
 * environment sets FSDP_RNG_SIMD=0 (the portable path, e.g. to compare or to rule the SIMD code
 * out) or FSDP_RNG_SIMD=avx2 (AVX2 even where AVX-512 runs). */
rng_path rng_path_default(void);

/* rng_fill_dist_serial on path p, which must be one rng_path_supported accepts (rng_path_default
 * is): the CPU is not checked again here. */
void rng_fill_dist_path(rng_path p, const rng_dist *d, float *dst, uint64_t seed, uint64_t stream, uint64_t start,
                        size_t n);

/* The bf16 / f16 rounding of init values on path p, the same bits as fsdp_f32_to_bf16 /
 * fsdp_f32_to_f16 (round to nearest even): rng_to_half_path stores the half bits of src[0..n) in dst;
 * rng_round_half_path replaces x[k] by its value rounded to bf16 (bf16 != 0) or f16 precision.
 * p must be supported, as for rng_fill_dist_path. */
void rng_to_half_path(rng_path p, const float *src, uint16_t *dst, size_t n, int bf16);
void rng_round_half_path(rng_path p, float *x, size_t n, int bf16);

/* Elements handled per vectorised step: fills of chunks aligned to this many elements of the
 * stream (start % RNG_CHUNK == 0) avoid a copy; any range is allowed. */
#define RNG_CHUNK 256

#ifdef __cplusplus
}
#endif
#endif
