/* The float32 transforms of the counter-based RNG (runtime/rng.h), shared by the host (C) and the
 * GPU (CUDA, kernels/cuda/kcu_init.cu): header only, no libm.
 *
 * Every function uses only IEEE-754 operations that are correctly rounded on both sides: float
 * add, sub, mul, div, sqrt, fused multiply-add (RNG_FMA: fmaf / __fmaf_rn), exact integer <-> float
 * conversions and bit manipulation. Under nvcc the operations are spelled with the _rn intrinsics,
 * which the compiler never contracts into other FMAs; the C side is compiled with -std=c11, where
 * gcc does not contract either (-ffp-contract=off). So host and device give the same bits for the
 * same (seed, stream, index).
 *
 * Polynomial coefficients: sin/cos and log use Taylor coefficients (computed in long double and
 * rounded to float); the erfinv coefficients come from a weighted least-squares fit of
 * erfinv(x)/x (w = -ln(1 - x^2)) against a long-double erfinv, each coefficient rounded to float
 * before the higher ones are refitted (max relative fit error 4.1e-8 central, 1.6e-8 tail). */
#ifndef FSDP_RUNTIME_RNG_MATH_H
#define FSDP_RUNTIME_RNG_MATH_H

#include <stdint.h>

#include <math.h>
#include <string.h>

#ifdef __CUDACC__
#define RNG_HD static __host__ __device__ __forceinline__
#else
#define RNG_HD static inline __attribute__((always_inline))
#endif

#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
#define RNG_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define RNG_MUL(a, b) __fmul_rn((a), (b))
#define RNG_ADD(a, b) __fadd_rn((a), (b))
#define RNG_SUB(a, b) __fsub_rn((a), (b))
#define RNG_DIV(a, b) __fdiv_rn((a), (b))
#define RNG_SQRT(a) __fsqrt_rn((a))
#else
#define RNG_FMA(a, b, c) fmaf((a), (b), (c))
#define RNG_MUL(a, b) ((a) * (b))
#define RNG_ADD(a, b) ((a) + (b))
#define RNG_SUB(a, b) ((a) - (b))
#define RNG_DIV(a, b) ((a) / (b))
#define RNG_SQRT(a) __builtin_sqrtf((a))
#endif

/* The Philox4x32 round constants (Salmon et al.). */
#define RNG_PHILOX_M0 0xD2511F53u
#define RNG_PHILOX_M1 0xCD9E8D57u
#define RNG_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define RNG_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

RNG_HD float rng_hd_as_float(uint32_t u) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

RNG_HD uint32_t rng_hd_as_uint(float f) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

RNG_HD uint32_t rng_hd_mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * (uint64_t)b) >> 32);
#endif
}

/* Philox4x32-10 of counter (c0..c3) and key (k0, k1) into o[0..3]. */
RNG_HD void rng_hd_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                          uint32_t o[4]) {
#ifndef __CUDACC__ /* nvcc unrolls the constant loop by itself */
#pragma GCC unroll 10
#endif
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = rng_hd_mulhi(RNG_PHILOX_M0, c0), lo0 = RNG_PHILOX_M0 * c0;
        uint32_t hi1 = rng_hd_mulhi(RNG_PHILOX_M1, c2), lo1 = RNG_PHILOX_M1 * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += RNG_PHILOX_W0;
        k1 += RNG_PHILOX_W1;
    }
    o[0] = c0;
    o[1] = c1;
    o[2] = c2;
    o[3] = c3;
}

/* Uniform float in (0,1) from a 32-bit word: ((x >> 9) + 0.5) * 2^-23, exact, in [2^-24, 1 - 2^-24]. */
RNG_HD float rng_hd_u01(uint32_t x) { return RNG_MUL(RNG_ADD((float)(int32_t)(x >> 9), 0.5f), 0x1p-23f); }

/* Natural log of a positive normal float x (no special values): x = 2^e m, m in [sqrt(1/2), sqrt(2)),
 * ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, by its Taylor series to s^9 (truncation
 * below 2e-9 relative); e ln 2 with ln 2 split in two. Within 2 ulp of the exact value. */
RNG_HD float rng_hd_logf(float x) {
    const uint32_t t = rng_hd_as_uint(x) - 0x3f3504f3u; /* bits of sqrt(1/2) */
    const float e = (float)((int32_t)t >> 23);
    const float m = rng_hd_as_float((t & 0x007fffffu) + 0x3f3504f3u);
    const float f = RNG_SUB(m, 1.0f); /* exact (Sterbenz) */
    const float s = RNG_DIV(f, RNG_ADD(2.0f, f));
    const float z = RNG_MUL(s, s);
    float q = RNG_FMA(z, 0x1.c71c72p-4f, 0x1.24924ap-3f); /* 1/9, 1/7 */
    q = RNG_FMA(z, q, 0x1.99999ap-3f);                    /* 1/5 */
    q = RNG_FMA(z, q, 0x1.555556p-2f);                    /* 1/3 */
    const float s2 = RNG_ADD(s, s);
    const float lnm = RNG_FMA(s2, RNG_MUL(z, q), s2);
    return RNG_FMA(e, 0x1.62e4p-1f, RNG_FMA(e, 0x1.7f7d1cp-20f, lnm)); /* ln 2 = hi + lo */
}

/* cos and sin of 2 pi U with U = ((x >> 8) + 0.5) 2^-24. The angle is reduced exactly in integers:
 * 4U = k + t, k = round(4U), |t| <= 1/2; sin(pi t / 2) = t S(t^2) and cos(pi t / 2) = C(t^2) are
 * their Taylor series to t^9 and t^10 (truncation below 3e-9); then rotated by k quarter turns. */
RNG_HD void rng_hd_cossin_turn(uint32_t x, float *c, float *s) {
    const uint32_t m = x >> 8;
    const uint32_t k = (m + (1u << 21)) >> 22; /* 0..4 */
    const float t = RNG_MUL(RNG_ADD((float)(int32_t)(m - (k << 22)), 0.5f), 0x1p-22f);
    const float y = RNG_MUL(t, t);
    float sp = RNG_FMA(y, 0x1.507834p-13f, -0x1.32d2ccp-8f);
    sp = RNG_FMA(y, sp, 0x1.466bc6p-4f);
    sp = RNG_FMA(y, sp, -0x1.4abbcep-1f);
    sp = RNG_FMA(y, sp, 0x1.921fb6p+0f);
    sp = RNG_MUL(t, sp);
    float cp = RNG_FMA(y, -0x1.a6d1f2p-16f, 0x1.e1f506p-11f);
    cp = RNG_FMA(y, cp, -0x1.55d3c8p-6f);
    cp = RNG_FMA(y, cp, 0x1.03c1fp-2f);
    cp = RNG_FMA(y, cp, -0x1.3bd3ccp+0f);
    cp = RNG_FMA(y, cp, 1.0f);
    const uint32_t q = k & 3u;
    const float cc = (q & 1u) ? sp : cp, ss = (q & 1u) ? cp : sp;
    *c = rng_hd_as_float(rng_hd_as_uint(cc) ^ (((q + 1u) & 2u) << 30)); /* negated for q = 1, 2 */
    *s = rng_hd_as_float(rng_hd_as_uint(ss) ^ ((q & 2u) << 30));        /* negated for q = 2, 3 */
}

/* Inverse error function in float for x in [-1, 1]: +-inf at +-1, NaN outside or for NaN.
 * w = -ln((1 - |x|)(1 + |x|)); erfinv(x) = x P(w - 2.5) for w < 5 (|x| < 0.99662), else
 * x Q(sqrt(w) - 3); P and Q have degree 9. Within a few ulp of erfinv over all floats in (-1, 1). */
RNG_HD float rng_hd_erfinvf(float x) {
    const float a = rng_hd_as_float(rng_hd_as_uint(x) & 0x7fffffffu);
    float t = RNG_MUL(RNG_SUB(1.0f, a), RNG_ADD(1.0f, a));
    t = t >= 0x1p-126f ? t : 0x1p-126f; /* |x| >= 1 and NaN are answered below */
    const float w = -rng_hd_logf(t);
    /* both polynomials, then a select: branch-free, so that the host loops vectorise */
    const float v = RNG_SUB(w, 2.5f);
    float p = RNG_FMA(v, -0x1.2a9c6ap-27f, 0x1.a0a0aep-26f);
    p = RNG_FMA(v, p, 0x1.f2f1b4p-22f);
    p = RNG_FMA(v, p, -0x1.d2aa2ep-19f);
    p = RNG_FMA(v, p, -0x1.4c93a8p-18f);
    p = RNG_FMA(v, p, 0x1.ca0a3cp-13f);
    p = RNG_FMA(v, p, -0x1.486714p-10f);
    p = RNG_FMA(v, p, -0x1.11c6d2p-8f);
    p = RNG_FMA(v, p, 0x1.f91e8cp-3f);
    p = RNG_FMA(v, p, 0x1.805c5ep+0f);
    const float u = RNG_SUB(RNG_SQRT(w), 3.0f);
    float q = RNG_FMA(u, 0x1.cb5172p-14f, -0x1.3d3be8p-12f);
    q = RNG_FMA(u, q, -0x1.94a6acp-15f);
    q = RNG_FMA(u, q, 0x1.82da1ep-10f);
    q = RNG_FMA(u, q, -0x1.d816a4p-9f);
    q = RNG_FMA(u, q, 0x1.74f6e2p-8f);
    q = RNG_FMA(u, q, -0x1.f47412p-8f);
    q = RNG_FMA(u, q, 0x1.357bf4p-7f);
    q = RNG_FMA(u, q, 0x1.006dc4p+0f);
    q = RNG_FMA(u, q, 0x1.6a9efcp+1f);
    const float g = w < 5.0f ? p : q;
    float r = RNG_MUL(x, g);
    const float inf = rng_hd_as_float((rng_hd_as_uint(x) & 0x80000000u) | 0x7f800000u);
    r = a == 1.0f ? inf : r;
    return a <= 1.0f ? r : rng_hd_as_float(0x7fc00000u);
}

/* ---- distributions ------------------------------------------------------------------------- */

typedef enum rng_dist_kind {
    RNG_DIST_UNIFORM = 0,  /* u in (0,1) */
    RNG_DIST_NORMAL,       /* mean + std z */
    RNG_DIST_TRUNC_NORMAL, /* inverse CDF, clamped to [a, b] */
    RNG_DIST_CONST,        /* mean */
    RNG_DIST_UNIFORM_AB    /* clamp(fma(u, span, lo), lo, hi) with u in (0,1): U(lo, hi) */
} rng_dist_kind;

/* A distribution with its float32 parameters (rng_dist_* in rng.h build and check it). */
typedef struct rng_dist {
    int kind;          /* rng_dist_kind */
    float mean, std;   /* NORMAL, TRUNC_NORMAL (CONST: the value is mean) */
    float lo, span;    /* TRUNC_NORMAL: v = lo + u span, lo = 2 Phi(alpha) - 1, span = 2 Phi(beta) - 1 - lo;
                        * UNIFORM_AB: x = lo + u span (span = hi - lo) */
    float scale, a, b; /* TRUNC_NORMAL: x = clamp(erfinv(v) scale + mean, a, b), scale = std sqrt(2);
                        * UNIFORM_AB: x clamped to [a, b] = [lo, hi] */
} rng_dist;

/* Standard normals from two words: r = sqrt(-2 ln u(xu)), (z0, z1) = r (cos, sin)(2 pi U(xa)). */
RNG_HD void rng_hd_normal_pair(uint32_t xu, uint32_t xa, float *z0, float *z1) {
    const float r = RNG_SQRT(RNG_MUL(-2.0f, rng_hd_logf(rng_hd_u01(xu))));
    float c, s;
    rng_hd_cossin_turn(xa, &c, &s);
    *z0 = RNG_MUL(r, c);
    *z1 = RNG_MUL(r, s);
}

/* U(lo, hi) from one word: lo + u (hi - lo), clamped so that rounding never leaves [lo, hi]. */
RNG_HD float rng_hd_uniform_ab_of(const rng_dist *d, uint32_t x) {
    float r = RNG_FMA(rng_hd_u01(x), d->span, d->lo);
    r = r < d->a ? d->a : r;
    r = r > d->b ? d->b : r;
    return r;
}

RNG_HD float rng_hd_trunc_of(const rng_dist *d, uint32_t x) {
    const float v = RNG_FMA(rng_hd_u01(x), d->span, d->lo);
    float r = RNG_FMA(rng_hd_erfinvf(v), d->scale, d->mean);
    r = r < d->a ? d->a : r;
    r = r > d->b ? d->b : r;
    return r;
}

/* The four elements 4 blk .. 4 blk + 3 of stream (seed, stream) (see rng.h for the layout). */
RNG_HD void rng_hd_dist_block(const rng_dist *d, uint64_t seed, uint64_t stream, uint64_t blk, float out[4]) {
    uint32_t x[4];
    rng_hd_philox((uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)stream, (uint32_t)(stream >> 32), (uint32_t)seed,
                  (uint32_t)(seed >> 32), x);
    switch (d->kind) {
    case RNG_DIST_UNIFORM:
        for (int j = 0; j < 4; j++) out[j] = rng_hd_u01(x[j]);
        break;
    case RNG_DIST_NORMAL: {
        float z[4];
        rng_hd_normal_pair(x[0], x[1], &z[0], &z[1]);
        rng_hd_normal_pair(x[2], x[3], &z[2], &z[3]);
        for (int j = 0; j < 4; j++) out[j] = RNG_FMA(z[j], d->std, d->mean);
        break;
    }
    case RNG_DIST_TRUNC_NORMAL:
        for (int j = 0; j < 4; j++) out[j] = rng_hd_trunc_of(d, x[j]);
        break;
    case RNG_DIST_UNIFORM_AB:
        for (int j = 0; j < 4; j++) out[j] = rng_hd_uniform_ab_of(d, x[j]);
        break;
    default:
        for (int j = 0; j < 4; j++) out[j] = d->mean;
        break;
    }
}

#endif
