/* Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11), and the distributions the model init needs.
 *
 * Every value is a pure function of (seed, stream, index):
 *   key     = { seed & 0xffffffff, seed >> 32 }
 *   counter = { index & 0xffffffff, index >> 32, stream & 0xffffffff, stream >> 32 }
 * so element i of any stream can be generated alone, in any order, on any number of threads or
 * ranks, and always gives the same bits. For parameter init the stream is rng_fnv1a64(name) and the
 * index is the element's flat (row-major) index in the full, unsharded parameter.
 *
 * Each element uses exactly one Philox block (four 32-bit words x0..x3):
 *   uniform double in (0,1): u(a,b) = ((((uint64)a << 32 | b) >> 11) + 0.5) * 2^-53
 *                            rng_uniform_at uses u(x0, x1)
 *   uniform float in (0,1):  ((x0 >> 9) + 0.5) * 2^-23 (exact in float, never 0 or 1)
 *   standard normal:         Box-Muller, cosine branch, in double:
 *                            z = sqrt(-2 ln u(x0,x1)) * cos(2 pi u(x2,x3))
 *   truncated normal:        torch.nn.init.trunc_normal_'s inverse-CDF algorithm, in double:
 *                            l = Phi((a-mean)/std), h = Phi((b-mean)/std),
 *                            v = (2l-1) + u(x0,x1) * ((2h-1) - (2l-1)),
 *                            x = clamp(erfinv(v) * std * sqrt(2) + mean, a, b)
 * Values are computed in double and rounded to float (round to nearest even) at the end.
 * Results are bit-identical for a given libm (erf/erfc/log/cos/exp come from the C library). */
#ifndef FSDP_RUNTIME_RNG_H
#define FSDP_RUNTIME_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The Philox4x32 round constants (Salmon et al.). */
#define RNG_PHILOX_M0 0xD2511F53u
#define RNG_PHILOX_M1 0xCD9E8D57u
#define RNG_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define RNG_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/* One Philox4x32-10 block: out = philox(ctr, key). */
void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The block for (seed, stream, index) with the counter/key layout described above. */
void rng_block(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);

/* 64-bit FNV-1a of a NUL-terminated string (offset basis 0xcbf29ce484222325,
 * prime 0x100000001b3): the stream id of a parameter name. */
uint64_t rng_fnv1a64(const char *s);

/* Single values (see the header comment for the exact transforms). */
double rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index);   /* in (0,1) */
float rng_uniform_f32_at(uint64_t seed, uint64_t stream, uint64_t index); /* in (0,1) */
double rng_normal_at(uint64_t seed, uint64_t stream, uint64_t index);    /* N(0,1) */

/* Inverse error function for x in (-1, 1), within 1.5 ulp of double (checked against mpmath
 * on 20000 points over the whole range and tails); +-inf at +-1,
 * NaN outside [-1, 1] or for NaN. */
double rng_erfinv(double x);

/* Standard normal CDF, 0.5 * (1 + erf(x / sqrt(2))) (the formula torch's trunc_normal_ uses). */
double rng_norm_cdf(double x);

/* A truncated normal N(mean, std^2) restricted to [a, b], with torch's parametrisation. */
typedef struct rng_trunc_normal {
    double mean, std, a, b;
    double lo, hi; /* 2*Phi((a-mean)/std) - 1 and 2*Phi((b-mean)/std) - 1 */
} rng_trunc_normal;

/* Checks (finite mean, std > 0, a < b, [a,b] not far outside the distribution) and fills t. */
int rng_trunc_normal_init(rng_trunc_normal *t, double mean, double std, double a, double b,
                          fsdp_err *err);
double rng_trunc_normal_at(const rng_trunc_normal *t, uint64_t seed, uint64_t stream,
                           uint64_t index);

/* Fill dst[k] with element start+k of the stream, k = 0..n-1. The result does not depend on
 * how a range is split into calls, nor on the number of OpenMP threads. */
void rng_fill_uniform_f32(float *dst, uint64_t seed, uint64_t stream, uint64_t start, size_t n);
void rng_fill_normal(float *dst, uint64_t seed, uint64_t stream, uint64_t start, size_t n,
                     double mean, double std);
void rng_fill_trunc_normal(float *dst, const rng_trunc_normal *t, uint64_t seed, uint64_t stream,
                           uint64_t start, size_t n);

#ifdef __cplusplus
}
#endif
#endif
