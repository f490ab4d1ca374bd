/* Counter-based random numbers: Philox4x32-10 and the init distributions (see rng.h). */
#include "runtime/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/tensor.h"
#include "runtime/rng_avx2.h"

/* Ranges shorter than this are filled on the calling thread (OpenMP start-up costs more). */
#define RNG_PAR_MIN 65536
#define RNG_CHUNK_BLOCKS (RNG_CHUNK / 4)

/* The vectorised chunk kernel is compiled for AVX-512, AVX2+FMA and the baseline, picked at load
 * time (the results are the same bits: every operation is correctly rounded, see rng_math.h).
 * The Makefile compiles this file with -fno-math-errno (sqrtf's argument is never negative here;
 * with errno handling gcc does not vectorise the loops). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define RNG_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RNG_CLONES
#endif

/* ---- Philox4x32-10 ------------------------------------------------------------------ */

void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    rng_hd_philox(ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1], out);
}

void rng_block(uint64_t seed, uint64_t stream, uint64_t b, uint32_t out[4]) {
    rng_hd_philox((uint32_t)b, (uint32_t)(b >> 32), (uint32_t)stream, (uint32_t)(stream >> 32), (uint32_t)seed,
                  (uint32_t)(seed >> 32), out);
}

uint64_t rng_fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

float rng_erfinvf(float x) { return rng_hd_erfinvf(x); }
float rng_logf(float x) { return rng_hd_logf(x); }

/* ---- erfinv ------------------------------------------------------------------------- */

double rng_erfinv(double x) {
    if (isnan(x) || x < -1.0 || x > 1.0) return NAN;
    if (x == 1.0) return INFINITY;
    if (x == -1.0) return -INFINITY;
    if (x == 0.0) return x;
    const double ax = fabs(x);
    const double sqrt_pi_2 = 0.88622692545275801364908374167057; /* sqrt(pi)/2 */
    double y;
    if (ax < 0.01) {
        /* Maclaurin series: erfinv(x) = s(x + (pi/12) x^3 + ...), s = sqrt(pi)/2. */
        y = sqrt_pi_2 * (ax + 0.26179938779914943654 * ax * ax * ax);
    } else {
        /* Winitzki's closed form (a = 0.147), relative error below 2e-3. */
        const double a = 0.147, two_over_pi_a = 2.0 / (3.14159265358979323846 * a);
        double w = log((1.0 - ax) * (1.0 + ax)); /* ln(1 - x^2), exact factors */
        double t = two_over_pi_a + 0.5 * w;
        y = sqrt(sqrt(t * t - w / a) - t);
    }
    /* Halley's method on f(y) = erf(y) - ax, cubic convergence: 2e-3 -> 1e-7 -> 1e-16.
     * Near 1, f is evaluated as (1 - ax) - erfc(y): 1 - ax is exact there and erfc keeps
     * full relative precision, so the tail keeps its accuracy. Two steps give <= 1.5 ulp
     * (checked against mpmath) except for 1 - |x| < 1e-12, where the start is worse and a
     * third step is taken. */
    const double two_over_sqrt_pi = 1.12837916709551257390; /* f'(y) = this * exp(-y^2) */
    const int steps = 1.0 - ax < 1e-12 ? 3 : 2;
    for (int it = 0; it < steps; it++) {
        double f = ax > 0.5 ? (1.0 - ax) - erfc(y) : erf(y) - ax;
        double d = two_over_sqrt_pi * exp(-y * y);
        y -= f / (d + y * f);
    }
    return copysign(y, x);
}

double rng_norm_cdf(double x) {
    return (1.0 + erf(x / 1.41421356237309504880)) / 2.0;
}

/* ---- distributions ------------------------------------------------------------------ */

void rng_dist_uniform(rng_dist *d) {
    memset(d, 0, sizeof *d);
    d->kind = RNG_DIST_UNIFORM;
}

void rng_dist_const(rng_dist *d, float value) {
    memset(d, 0, sizeof *d);
    d->kind = RNG_DIST_CONST;
    d->mean = value;
}

static int float_ok(double v) { return isfinite(v) && fabs(v) <= 3.4028234663852886e38; }

int rng_dist_normal(rng_dist *d, double mean, double std, fsdp_err *err) {
    if (!float_ok(mean) || !float_ok(std) || !(std > 0.0) || !((float)std > 0.0f))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "normal: mean must be finite and std finite and > 0 in float32 "
                            "(got mean %g, std %g)", mean, std);
    memset(d, 0, sizeof *d);
    d->kind = RNG_DIST_NORMAL;
    d->mean = (float)mean;
    d->std = (float)std;
    return FSDP_OK;
}

int rng_dist_trunc_normal(rng_dist *d, double mean, double std, double a, double b, fsdp_err *err) {
    if (!float_ok(mean) || !float_ok(std) || !(std > 0.0) || !((float)(std * 1.4142135623730951) > 0.0f) ||
        !float_ok(std * 1.4142135623730951))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "truncated normal: mean must be finite and std finite and > 0 in float32 "
                            "(got mean %g, std %g)", mean, std);
    if (isnan(a) || isnan(b) || !(a < b))
        return fsdp_err_set(err, FSDP_E_INVALID, "truncated normal: bounds must satisfy a < b (got a %g, b %g)",
                            a, b);
    double lo = 2.0 * rng_norm_cdf((a - mean) / std) - 1.0;
    double hi = 2.0 * rng_norm_cdf((b - mean) / std) - 1.0;
    float flo = (float)lo, fspan = (float)(hi - lo);
    if (!(fspan > 0.0f) || !((float)hi > flo))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "truncated normal: [%g, %g] holds no probability mass of N(%g, %g^2) in float32", a, b,
                            mean, std);
    memset(d, 0, sizeof *d);
    d->kind = RNG_DIST_TRUNC_NORMAL;
    d->mean = (float)mean;
    d->std = (float)std;
    d->lo = flo;
    d->span = fspan;
    d->scale = (float)(std * 1.4142135623730951);
    /* clamp_(a, b) in float: bounds outside float's range clamp nothing */
    d->a = a < -3.4028234663852886e38 ? -INFINITY : (float)a;
    d->b = b > 3.4028234663852886e38 ? INFINITY : (float)b;
    return FSDP_OK;
}

int rng_dist_uniform_ab(rng_dist *d, double a, double b, fsdp_err *err) {
    if (!float_ok(a) || !float_ok(b) || !(a < b) || !float_ok((double)(float)b - (double)(float)a) ||
        !((float)b > (float)a))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "uniform: the bounds must be finite float32 values with a < b (got a %g, b %g)", a, b);
    memset(d, 0, sizeof *d);
    d->kind = RNG_DIST_UNIFORM_AB;
    d->lo = d->a = (float)a;
    d->b = (float)b;
    d->span = (float)((double)d->b - (double)d->a);
    if (!isfinite(d->span))
        return fsdp_err_set(err, FSDP_E_INVALID, "uniform: b - a overflows float32 (a %g, b %g)", a, b);
    return FSDP_OK;
}

float rng_dist_at(const rng_dist *d, uint64_t seed, uint64_t stream, uint64_t index) {
    float out[4];
    rng_hd_dist_block(d, seed, stream, index >> 2, out);
    return out[index & 3];
}

/* ---- vectorised fills --------------------------------------------------------------- */

/* Elements 4 blk0 .. 4 blk0 + RNG_CHUNK - 1 into out. Loops over lanes with fixed trip counts so
 * that gcc vectorises them. */
RNG_CLONES static void chunk_f32(const rng_dist *dp, uint64_t seed, uint64_t stream, uint64_t blk0, float *out) {
    const rng_dist d = *dp;
    uint32_t w[RNG_CHUNK];
    const uint32_t lo0 = (uint32_t)blk0, hi0 = (uint32_t)(blk0 >> 32);
    const uint32_t s0 = (uint32_t)stream, s1 = (uint32_t)(stream >> 32);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (uint32_t i = 0; i < RNG_CHUNK_BLOCKS; i++) {
        const uint32_t lo = lo0 + i, hi = hi0 + (lo < lo0);
        uint32_t o[4];
        rng_hd_philox(lo, hi, s0, s1, k0, k1, o);
        w[4 * i] = o[0];
        w[4 * i + 1] = o[1];
        w[4 * i + 2] = o[2];
        w[4 * i + 3] = o[3];
    }
    switch (d.kind) {
    case RNG_DIST_UNIFORM:
        for (int e = 0; e < RNG_CHUNK; e++) out[e] = rng_hd_u01(w[e]);
        break;
    case RNG_DIST_NORMAL:
#pragma omp simd
        for (int p = 0; p < RNG_CHUNK / 2; p++) {
            float z0, z1;
            rng_hd_normal_pair(w[2 * p], w[2 * p + 1], &z0, &z1);
            out[2 * p] = RNG_FMA(z0, d.std, d.mean);
            out[2 * p + 1] = RNG_FMA(z1, d.std, d.mean);
        }
        break;
    case RNG_DIST_TRUNC_NORMAL:
#pragma omp simd
        for (int e = 0; e < RNG_CHUNK; e++) out[e] = rng_hd_trunc_of(&d, w[e]);
        break;
    case RNG_DIST_UNIFORM_AB:
#pragma omp simd
        for (int e = 0; e < RNG_CHUNK; e++) out[e] = rng_hd_uniform_ab_of(&d, w[e]);
        break;
    default:
        for (int e = 0; e < RNG_CHUNK; e++) out[e] = d.mean;
        break;
    }
}

int rng_path_supported(rng_path p) {
    switch (p) {
    case RNG_PATH_PORTABLE: return 1;
    case RNG_PATH_AVX2: return rng_avx2_supported();
    case RNG_PATH_AVX512: return rng_avx512_supported();
    default: return 0;
    }
}

rng_path rng_path_default(void) {
    const char *e = getenv("FSDP_RNG_SIMD");
    if (e && !strcmp(e, "0")) return RNG_PATH_PORTABLE;
    if (rng_avx512_supported() && !(e && !strcmp(e, "avx2"))) return RNG_PATH_AVX512;
    return rng_avx2_supported() ? RNG_PATH_AVX2 : RNG_PATH_PORTABLE;
}

typedef void (*chunk_fn)(const rng_dist *d, uint64_t seed, uint64_t stream, uint64_t blk0, float *out);

/* The *_path functions do not check the CPU again (a CPUID instruction can cost microseconds in a
 * virtual machine, more than a chunk): their callers pass a supported path (rng.h). */
static chunk_fn chunk_of(rng_path p) {
#if RNG_HAVE_AVX2
    if (p == RNG_PATH_AVX512) return rng_avx512_chunk;
    if (p == RNG_PATH_AVX2) return rng_avx2_chunk;
#else
    (void)p;
#endif
    return chunk_f32;
}

void rng_fill_dist_path(rng_path p, const rng_dist *d, float *dst, uint64_t seed, uint64_t stream, uint64_t start,
                        size_t n) {
    if (d->kind == RNG_DIST_CONST) {
        for (size_t k = 0; k < n; k++) dst[k] = d->mean;
        return;
    }
    const chunk_fn chunk = chunk_of(p);
    float buf[RNG_CHUNK];
    size_t k = 0;
    while (k < n) {
        const uint64_t e = start + k;
        const uint64_t c0 = e - e % RNG_CHUNK; /* chunk of the stream holding e */
        const size_t off = (size_t)(e - c0);
        size_t m = RNG_CHUNK - off;
        if (m > n - k) m = n - k;
        if (off == 0 && m == RNG_CHUNK) {
            chunk(d, seed, stream, c0 / 4, dst + k);
        } else {
            chunk(d, seed, stream, c0 / 4, buf);
            memcpy(dst + k, buf + off, m * sizeof *dst);
        }
        k += m;
    }
}

void rng_to_half_path(rng_path p, const float *src, uint16_t *dst, size_t n, int bf16) {
#if RNG_HAVE_AVX2
    if (p == RNG_PATH_AVX512) {
        rng_avx512_to_half(src, dst, n, bf16);
        return;
    }
    if (p == RNG_PATH_AVX2) {
        rng_avx2_to_half(src, dst, n, bf16);
        return;
    }
#else
    (void)p;
#endif
    if (bf16)
        for (size_t k = 0; k < n; k++) dst[k] = fsdp_f32_to_bf16(src[k]);
    else
        for (size_t k = 0; k < n; k++) dst[k] = fsdp_f32_to_f16(src[k]);
}

void rng_round_half_path(rng_path p, float *x, size_t n, int bf16) {
#if RNG_HAVE_AVX2
    if (p == RNG_PATH_AVX512) {
        rng_avx512_round_half(x, n, bf16);
        return;
    }
    if (p == RNG_PATH_AVX2) {
        rng_avx2_round_half(x, n, bf16);
        return;
    }
#else
    (void)p;
#endif
    if (bf16)
        for (size_t k = 0; k < n; k++) x[k] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(x[k]));
    else
        for (size_t k = 0; k < n; k++) x[k] = fsdp_f16_to_f32(fsdp_f32_to_f16(x[k]));
}

void rng_fill_dist_serial(const rng_dist *d, float *dst, uint64_t seed, uint64_t stream, uint64_t start,
                          size_t n) {
    rng_fill_dist_path(rng_path_default(), d, dst, seed, stream, start, n);
}

void rng_fill_dist(const rng_dist *d, float *dst, uint64_t seed, uint64_t stream, uint64_t start, size_t n) {
    const rng_path path = rng_path_default();
    if (n < RNG_PAR_MIN) {
        rng_fill_dist_path(path, d, dst, seed, stream, start, n);
        return;
    }
    /* pieces of whole chunks of the stream (the first and last may be partial) */
    const uint64_t first = start - start % RNG_CHUNK;
    const int64_t pieces = (int64_t)((start + n - first + RNG_CHUNK * 16 - 1) / (RNG_CHUNK * 16));
#pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < pieces; q++) {
        uint64_t a = first + (uint64_t)q * RNG_CHUNK * 16, b = a + RNG_CHUNK * 16;
        if (a < start) a = start;
        if (b > start + n) b = start + n;
        rng_fill_dist_path(path, d, dst + (a - start), seed, stream, a, (size_t)(b - a));
    }
}
