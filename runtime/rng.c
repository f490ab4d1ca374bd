/* Counter-based random numbers: Philox4x32-10 and the init distributions (see rng.h). */
#include "runtime/rng.h"

#include <math.h>

/* Ranges shorter than this are filled on the calling thread (OpenMP start-up costs more). */
#define RNG_PAR_MIN 16384

/* ---- Philox4x32-10 ------------------------------------------------------------------ */

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

static inline void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(RNG_PHILOX_M0, c[0], &hi0, &lo0);
    mulhilo32(RNG_PHILOX_M1, c[2], &hi1, &lo1);
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

static inline void philox10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) {
            k[0] += RNG_PHILOX_W0;
            k[1] += RNG_PHILOX_W1;
        }
        philox_round(c, k);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    philox10(ctr, key, out);
}

static inline void block(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    philox10(ctr, key, out);
}

void rng_block(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    block(seed, stream, index, out);
}

uint64_t rng_fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- uniform and normal ------------------------------------------------------------- */

/* 53 random bits as a double in (0,1): the odd multiples of 2^-54. */
static inline double u53(uint32_t hi, uint32_t lo) {
    uint64_t x = ((uint64_t)hi << 32 | lo) >> 11;
    return ((double)x + 0.5) * 0x1p-53;
}

static inline double normal_of(const uint32_t x[4]) {
    const double two_pi = 6.283185307179586476925286766559;
    double u1 = u53(x[0], x[1]), u2 = u53(x[2], x[3]);
    return sqrt(-2.0 * log(u1)) * cos(two_pi * u2);
}

double rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t x[4];
    block(seed, stream, index, x);
    return u53(x[0], x[1]);
}

static inline float uf32_of(const uint32_t x[4]) {
    return ((float)(x[0] >> 9) + 0.5f) * 0x1p-23f;
}

float rng_uniform_f32_at(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t x[4];
    block(seed, stream, index, x);
    return uf32_of(x);
}

double rng_normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t x[4];
    block(seed, stream, index, x);
    return normal_of(x);
}

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

/* ---- truncated normal --------------------------------------------------------------- */

int rng_trunc_normal_init(rng_trunc_normal *t, double mean, double std, double a, double b,
                          fsdp_err *err) {
    if (!isfinite(mean) || !isfinite(std) || !(std > 0.0))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "truncated normal: mean must be finite and std finite and > 0 "
                            "(got mean %g, std %g)", mean, std);
    if (isnan(a) || isnan(b) || !(a < b))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "truncated normal: bounds must satisfy a < b (got a %g, b %g)", a, b);
    double l = rng_norm_cdf((a - mean) / std);
    double h = rng_norm_cdf((b - mean) / std);
    t->mean = mean;
    t->std = std;
    t->a = a;
    t->b = b;
    t->lo = 2.0 * l - 1.0;
    t->hi = 2.0 * h - 1.0;
    if (!(t->hi > t->lo))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "truncated normal: [%g, %g] holds no probability mass of N(%g, %g^2) "
                            "in double precision", a, b, mean, std);
    return FSDP_OK;
}

static inline double trunc_of(const rng_trunc_normal *t, const uint32_t x[4]) {
    double v = t->lo + u53(x[0], x[1]) * (t->hi - t->lo);
    double r = rng_erfinv(v) * (t->std * 1.41421356237309504880) + t->mean;
    if (r < t->a) r = t->a; /* clamp_(a, b); NaN cannot occur: v is inside (-1, 1) */
    if (r > t->b) r = t->b;
    return r;
}

double rng_trunc_normal_at(const rng_trunc_normal *t, uint64_t seed, uint64_t stream,
                           uint64_t index) {
    uint32_t x[4];
    block(seed, stream, index, x);
    return trunc_of(t, x);
}

/* ---- fills -------------------------------------------------------------------------- */

void rng_fill_uniform_f32(float *dst, uint64_t seed, uint64_t stream, uint64_t start, size_t n) {
    const int64_t nn = (int64_t)n;
#pragma omp parallel for schedule(static) if (n >= RNG_PAR_MIN)
    for (int64_t k = 0; k < nn; k++) {
        uint32_t x[4];
        block(seed, stream, start + (uint64_t)k, x);
        dst[k] = uf32_of(x);
    }
}

void rng_fill_normal(float *dst, uint64_t seed, uint64_t stream, uint64_t start, size_t n,
                     double mean, double std) {
    const int64_t nn = (int64_t)n;
#pragma omp parallel for schedule(static) if (n >= RNG_PAR_MIN)
    for (int64_t k = 0; k < nn; k++) {
        uint32_t x[4];
        block(seed, stream, start + (uint64_t)k, x);
        dst[k] = (float)(mean + std * normal_of(x));
    }
}

void rng_fill_trunc_normal(float *dst, const rng_trunc_normal *t, uint64_t seed, uint64_t stream,
                           uint64_t start, size_t n) {
    const int64_t nn = (int64_t)n;
#pragma omp parallel for schedule(static) if (n >= RNG_PAR_MIN)
    for (int64_t k = 0; k < nn; k++) {
        uint32_t x[4];
        block(seed, stream, start + (uint64_t)k, x);
        dst[k] = (float)trunc_of(t, x);
    }
}
