/* The AVX2+FMA generator (see rng_avx2.h): rng_math.h's operations on 8 lanes, in the same order.
 *
 * Each lane of a vector is one Philox block (8 consecutive blocks at a time), so the four output
 * words of a block are four vectors; the distribution transforms run on those vectors and a 4 x 8
 * transpose puts element 4b + j at its place. The transforms run on several vectors in lockstep
 * (RNG_EACH: their chains are long, a divide, a square root and Horner's FMAs one after another, and
 * interleaved they keep the vector units busy; one vector at a time, normals ran 1.4-1.5x and
 * truncated normals 1.3-2x slower on Zen 3). Every operation is the correctly rounded IEEE one of
 * the scalar code (add, sub, mul, div, sqrt, fmadd = fmaf, exact int <-> float conversions, bit
 * operations, compares and selects with the scalar code's NaN behaviour), so the bits are equal. */
#include "runtime/rng_avx2.h"

#if RNG_HAVE_AVX2

#include <cpuid.h>
#include <immintrin.h>

#include "fsdp/tensor.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* Each j < n (n <= RNG_MAXN, a constant once inlined): one statement on n vectors, unrolled. */
#define RNG_MAXN 8
#define RNG_EACH _Pragma("GCC unroll 8") for (int j = 0; j < n; j++)

typedef struct v4 {
    __m256i x[4];
} v4;

AVX2 static inline __m256i u32(uint32_t v) { return _mm256_set1_epi32((int)v); }
AVX2 static inline __m256 f32(float v) { return _mm256_set1_ps(v); }
AVX2 static inline __m256 as_ps(__m256i v) { return _mm256_castsi256_ps(v); }
AVX2 static inline __m256i as_si(__m256 v) { return _mm256_castps_si256(v); }

/* (hi, lo) of the 32 x 32 -> 64-bit products a * m, lane by lane. */
AVX2 static inline void mul_wide(__m256i a, __m256i m, __m256i *hi, __m256i *lo) {
    const __m256i ev = _mm256_mul_epu32(a, m);                          /* lanes 0, 2, 4, 6 */
    const __m256i od = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m); /* lanes 1, 3, 5, 7 */
    *lo = _mm256_blend_epi32(ev, _mm256_slli_epi64(od, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(ev, 32), od, 0xAA);
}

/* Philox blocks interleaved per call: one round's multiplies have a latency of several cycles, so
 * independent vectors of blocks keep the vector units busy. The loops over them are unrolled, so
 * that the blocks' words stay in registers (as a loop, each round stored and reloaded them: 1.1-1.2x
 * slower on Zen 3). */
#define PHILOX_GROUPS 4

/* Philox4x32-10 (rng_hd_philox on each lane) of blocks blk0 .. blk0 + 8 PHILOX_GROUPS - 1:
 * w[g].x[j] holds word j of block blk0 + 8 g + lane. */
AVX2 static void philox_groups(uint64_t blk0, uint32_t s0, uint32_t s1, uint32_t k0, uint32_t k1,
                               v4 w[PHILOX_GROUPS]) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i bias = u32(0x80000000u);
    const __m256i m0 = u32(RNG_PHILOX_M0), m1 = u32(RNG_PHILOX_M1);
    __m256i c0[PHILOX_GROUPS], c1[PHILOX_GROUPS], c2[PHILOX_GROUPS], c3[PHILOX_GROUPS];
    for (int g = 0; g < PHILOX_GROUPS; g++) {
        const uint64_t b = blk0 + 8u * (uint64_t)g;
        const uint32_t lo0 = (uint32_t)b, hi0 = (uint32_t)(b >> 32);
        c0[g] = _mm256_add_epi32(u32(lo0), lane);
        /* carry into the high word where lo0 + lane wrapped: unsigned c0 < lo0 */
        const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(u32(lo0), bias), _mm256_xor_si256(c0[g], bias));
        c1[g] = _mm256_sub_epi32(u32(hi0), carry);
        c2[g] = u32(s0);
        c3[g] = u32(s1);
    }
    uint32_t ka = k0, kb = k1;
#pragma GCC unroll 10
    for (int r = 0; r < 10; r++) {
        const __m256i vka = u32(ka), vkb = u32(kb);
#pragma GCC unroll 4
        for (int g = 0; g < PHILOX_GROUPS; g++) {
            __m256i h0, l0, h1, l1;
            mul_wide(c0[g], m0, &h0, &l0);
            mul_wide(c2[g], m1, &h1, &l1);
            c0[g] = _mm256_xor_si256(_mm256_xor_si256(h1, c1[g]), vka);
            c2[g] = _mm256_xor_si256(_mm256_xor_si256(h0, c3[g]), vkb);
            c1[g] = l1;
            c3[g] = l0;
        }
        ka += RNG_PHILOX_W0;
        kb += RNG_PHILOX_W1;
    }
    for (int g = 0; g < PHILOX_GROUPS; g++) {
        w[g].x[0] = c0[g];
        w[g].x[1] = c1[g];
        w[g].x[2] = c2[g];
        w[g].x[3] = c3[g];
    }
}

/* rng_hd_u01, (m + 1/2) 2^-23 with m = x >> 9, in two operations: 1 + m 2^-23 (m as the mantissa of
 * a float in [1, 2)) minus 1 - 2^-24. The difference is exact (Sterbenz: 1 - 2^-24 <= 1 + m 2^-23 <=
 * 2 (1 - 2^-24)) and is (2m + 1) 2^-24, a float (2m + 1 < 2^24), as the scalar code's add and
 * multiply by a power of two are: the same bits. */
AVX2 static inline __m256 u01(__m256i x) {
    const __m256 one_m = as_ps(_mm256_or_si256(_mm256_srli_epi32(x, 9), u32(0x3f800000u)));
    return _mm256_sub_ps(one_m, f32(0x1.fffffep-1f));
}

/* rng_hd_logf of x[j] into out[j], j < n */
AVX2 static inline void logf_n(int n, const __m256 *x, __m256 *out) {
    __m256 e[RNG_MAXN], f[RNG_MAXN], s[RNG_MAXN], z[RNG_MAXN], q[RNG_MAXN];
    RNG_EACH {
        const __m256i t = _mm256_sub_epi32(as_si(x[j]), u32(0x3f3504f3u));
        e[j] = _mm256_cvtepi32_ps(_mm256_srai_epi32(t, 23));
        const __m256 m = as_ps(_mm256_add_epi32(_mm256_and_si256(t, u32(0x007fffffu)), u32(0x3f3504f3u)));
        f[j] = _mm256_sub_ps(m, f32(1.0f));
    }
    RNG_EACH s[j] = _mm256_div_ps(f[j], _mm256_add_ps(f32(2.0f), f[j]));
    RNG_EACH z[j] = _mm256_mul_ps(s[j], s[j]);
    RNG_EACH q[j] = _mm256_fmadd_ps(z[j], f32(0x1.c71c72p-4f), f32(0x1.24924ap-3f));
    RNG_EACH q[j] = _mm256_fmadd_ps(z[j], q[j], f32(0x1.99999ap-3f));
    RNG_EACH q[j] = _mm256_fmadd_ps(z[j], q[j], f32(0x1.555556p-2f));
    RNG_EACH {
        const __m256 s2 = _mm256_add_ps(s[j], s[j]);
        const __m256 lnm = _mm256_fmadd_ps(s2, _mm256_mul_ps(z[j], q[j]), s2);
        out[j] = _mm256_fmadd_ps(e[j], f32(0x1.62e4p-1f), _mm256_fmadd_ps(e[j], f32(0x1.7f7d1cp-20f), lnm));
    }
}

/* rng_hd_cossin_turn of x[j] into c[j], s[j], j < n */
AVX2 static inline void cossin_n(int n, const __m256i *x, __m256 *c, __m256 *s) {
    __m256i k[RNG_MAXN];
    __m256 t[RNG_MAXN], y[RNG_MAXN], sp[RNG_MAXN], cp[RNG_MAXN];
    RNG_EACH {
        const __m256i m = _mm256_srli_epi32(x[j], 8);
        k[j] = _mm256_srli_epi32(_mm256_add_epi32(m, u32(1u << 21)), 22);
        const __m256 ti = _mm256_cvtepi32_ps(_mm256_sub_epi32(m, _mm256_slli_epi32(k[j], 22)));
        t[j] = _mm256_mul_ps(_mm256_add_ps(ti, f32(0.5f)), f32(0x1p-22f));
        y[j] = _mm256_mul_ps(t[j], t[j]);
    }
    RNG_EACH sp[j] = _mm256_fmadd_ps(y[j], f32(0x1.507834p-13f), f32(-0x1.32d2ccp-8f));
    RNG_EACH cp[j] = _mm256_fmadd_ps(y[j], f32(-0x1.a6d1f2p-16f), f32(0x1.e1f506p-11f));
    RNG_EACH sp[j] = _mm256_fmadd_ps(y[j], sp[j], f32(0x1.466bc6p-4f));
    RNG_EACH cp[j] = _mm256_fmadd_ps(y[j], cp[j], f32(-0x1.55d3c8p-6f));
    RNG_EACH sp[j] = _mm256_fmadd_ps(y[j], sp[j], f32(-0x1.4abbcep-1f));
    RNG_EACH cp[j] = _mm256_fmadd_ps(y[j], cp[j], f32(0x1.03c1fp-2f));
    RNG_EACH sp[j] = _mm256_fmadd_ps(y[j], sp[j], f32(0x1.921fb6p+0f));
    RNG_EACH cp[j] = _mm256_fmadd_ps(y[j], cp[j], f32(-0x1.3bd3ccp+0f));
    RNG_EACH sp[j] = _mm256_mul_ps(t[j], sp[j]);
    RNG_EACH cp[j] = _mm256_fmadd_ps(y[j], cp[j], f32(1.0f));
    RNG_EACH {
        const __m256i q = _mm256_and_si256(k[j], u32(3u));
        const __m256 odd = as_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, u32(1u)), u32(1u)));
        const __m256 cc = _mm256_blendv_ps(cp[j], sp[j], odd), ss = _mm256_blendv_ps(sp[j], cp[j], odd);
        const __m256i cneg = _mm256_slli_epi32(_mm256_and_si256(_mm256_add_epi32(q, u32(1u)), u32(2u)), 30);
        const __m256i sneg = _mm256_slli_epi32(_mm256_and_si256(q, u32(2u)), 30);
        c[j] = as_ps(_mm256_xor_si256(as_si(cc), cneg));
        s[j] = as_ps(_mm256_xor_si256(as_si(ss), sneg));
    }
}

/* rng_hd_erfinvf's polynomial for w >= 5 (the tails) */
AVX2 static inline __m256 erfinv_tail8(__m256 w) {
    const __m256 u = _mm256_sub_ps(_mm256_sqrt_ps(w), f32(3.0f));
    __m256 q = _mm256_fmadd_ps(u, f32(0x1.cb5172p-14f), f32(-0x1.3d3be8p-12f));
    q = _mm256_fmadd_ps(u, q, f32(-0x1.94a6acp-15f));
    q = _mm256_fmadd_ps(u, q, f32(0x1.82da1ep-10f));
    q = _mm256_fmadd_ps(u, q, f32(-0x1.d816a4p-9f));
    q = _mm256_fmadd_ps(u, q, f32(0x1.74f6e2p-8f));
    q = _mm256_fmadd_ps(u, q, f32(-0x1.f47412p-8f));
    q = _mm256_fmadd_ps(u, q, f32(0x1.357bf4p-7f));
    q = _mm256_fmadd_ps(u, q, f32(0x1.006dc4p+0f));
    return _mm256_fmadd_ps(u, q, f32(0x1.6a9efcp+1f));
}

/* rng_hd_erfinvf of x[j] into out[j], j < n */
AVX2 static inline void erfinv_n(int n, const __m256 *x, __m256 *out) {
    __m256 a[RNG_MAXN], t[RNG_MAXN], w[RNG_MAXN], v[RNG_MAXN], p[RNG_MAXN];
    /* Every lane of every vector inside (-1, 1), as the truncated normal's arguments nearly always are:
     * 1 - |x| >= 2^-24, so t0 >= 2^-24 keeps its value below, and the result is x g with neither the
     * infinities of +-1 nor NaN: the blends would select exactly these values (1.04-1.15x on Zen 3). */
    int inside = 1;
    RNG_EACH {
        a[j] = as_ps(_mm256_and_si256(as_si(x[j]), u32(0x7fffffffu)));
        inside &= _mm256_movemask_ps(_mm256_cmp_ps(a[j], f32(1.0f), _CMP_LT_OQ)) == 0xFF;
    }
    RNG_EACH {
        const __m256 t0 = _mm256_mul_ps(_mm256_sub_ps(f32(1.0f), a[j]), _mm256_add_ps(f32(1.0f), a[j]));
        t[j] = inside ? t0 : _mm256_blendv_ps(f32(0x1p-126f), t0, _mm256_cmp_ps(t0, f32(0x1p-126f), _CMP_GE_OQ));
    }
    logf_n(n, t, w);
    RNG_EACH {
        w[j] = as_ps(_mm256_xor_si256(as_si(w[j]), u32(0x80000000u))); /* -log */
        v[j] = _mm256_sub_ps(w[j], f32(2.5f));
    }
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], f32(-0x1.2a9c6ap-27f), f32(0x1.a0a0aep-26f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(0x1.f2f1b4p-22f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(-0x1.d2aa2ep-19f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(-0x1.4c93a8p-18f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(0x1.ca0a3cp-13f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(-0x1.486714p-10f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(-0x1.11c6d2p-8f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(0x1.f91e8cp-3f));
    RNG_EACH p[j] = _mm256_fmadd_ps(v[j], p[j], f32(0x1.805c5ep+0f));
    RNG_EACH {
        /* the tails' polynomial only when a lane takes it (rng_avx512.c's erfinv8) */
        const __m256 central = _mm256_cmp_ps(w[j], f32(5.0f), _CMP_LT_OQ);
        __m256 g = p[j];
        if (_mm256_movemask_ps(central) != 0xFF) g = _mm256_blendv_ps(erfinv_tail8(w[j]), p[j], central);
        __m256 r = _mm256_mul_ps(x[j], g);
        if (inside) {
            out[j] = r;
            continue;
        }
        const __m256 inf = as_ps(_mm256_or_si256(_mm256_and_si256(as_si(x[j]), u32(0x80000000u)), u32(0x7f800000u)));
        r = _mm256_blendv_ps(r, inf, _mm256_cmp_ps(a[j], f32(1.0f), _CMP_EQ_OQ));
        out[j] = _mm256_blendv_ps(as_ps(u32(0x7fc00000u)), r, _mm256_cmp_ps(a[j], f32(1.0f), _CMP_LE_OQ));
    }
}

/* clamp as the scalar code: r < a ? a : r, then r > b ? b : r (a NaN r stays NaN). max_ps(A, B) is
 * A > B ? A : B and min_ps(A, B) is A < B ? A : B, the second operand when unordered. */
AVX2 static inline __m256 clamp8(__m256 r, __m256 a, __m256 b) { return _mm256_min_ps(b, _mm256_max_ps(a, r)); }

/* Element 4 b + j of the 8 blocks from y[j] (lane b): 32 consecutive floats. */
AVX2 static inline void store_blocks(float *out, __m256 y0, __m256 y1, __m256 y2, __m256 y3) {
    const __m256 t0 = _mm256_unpacklo_ps(y0, y1), t1 = _mm256_unpackhi_ps(y0, y1);
    const __m256 t2 = _mm256_unpacklo_ps(y2, y3), t3 = _mm256_unpackhi_ps(y2, y3);
    const __m256 b04 = _mm256_shuffle_ps(t0, t2, 0x44), b15 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 b26 = _mm256_shuffle_ps(t1, t3, 0x44), b37 = _mm256_shuffle_ps(t1, t3, 0xEE);
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(b04, b15, 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(b26, b37, 0x20));
    _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(b04, b15, 0x31));
    _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(b26, b37, 0x31));
}

/* rng_hd_normal_pair of the words (xu[j], xa[j]): r (cos, sin), into (z0[j], z1[j]), j < n */
AVX2 static inline void normal_n(int n, const __m256i *xu, const __m256i *xa, __m256 std, __m256 mean, __m256 *z0,
                                 __m256 *z1) {
    __m256 u[RNG_MAXN], l[RNG_MAXN], c[RNG_MAXN], s[RNG_MAXN];
    RNG_EACH u[j] = u01(xu[j]);
    logf_n(n, u, l);
    cossin_n(n, xa, c, s);
    RNG_EACH {
        const __m256 r = _mm256_sqrt_ps(_mm256_mul_ps(f32(-2.0f), l[j]));
        z0[j] = _mm256_fmadd_ps(_mm256_mul_ps(r, c[j]), std, mean);
        z1[j] = _mm256_fmadd_ps(_mm256_mul_ps(r, s[j]), std, mean);
    }
}

/* The normals of groups w[0] and w[1] (block words 0, 1 and 2, 3 are a pair each): four pairs at once. */
AVX2 static inline void normal_groups(const v4 *w, __m256 std, __m256 mean, float *out) {
    const __m256i xu[4] = {w[0].x[0], w[0].x[2], w[1].x[0], w[1].x[2]};
    const __m256i xa[4] = {w[0].x[1], w[0].x[3], w[1].x[1], w[1].x[3]};
    __m256 z0[4], z1[4];
    normal_n(4, xu, xa, std, mean, z0, z1);
    store_blocks(out, z0[0], z1[0], z0[1], z1[1]);
    store_blocks(out + 32, z0[2], z1[2], z0[3], z1[3]);
}

/* rng_hd_trunc_of on the words of groups w[0] and w[1]: eight vectors at once (1.2-1.4x faster than four
 * on Zen 3). */
AVX2 static inline void trunc_groups(const v4 *w, const rng_dist *d, float *out) {
    const int n = 8;
    const __m256 span = f32(d->span), lo = f32(d->lo), scale = f32(d->scale), mean = f32(d->mean);
    const __m256 a = f32(d->a), b = f32(d->b);
    __m256 v[8], e[8], y[8];
    RNG_EACH v[j] = _mm256_fmadd_ps(u01(w[j / 4].x[j % 4]), span, lo);
    erfinv_n(n, v, e);
    RNG_EACH y[j] = clamp8(_mm256_fmadd_ps(e[j], scale, mean), a, b);
    store_blocks(out, y[0], y[1], y[2], y[3]);
    store_blocks(out + 32, y[4], y[5], y[6], y[7]);
}

AVX2 void rng_avx2_chunk(const rng_dist *dp, uint64_t seed, uint64_t stream, uint64_t blk0, float *out) {
    const rng_dist d = *dp;
    const uint32_t s0 = (uint32_t)stream, s1 = (uint32_t)(stream >> 32);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const __m256 mean = f32(d.mean), std = f32(d.std), lo = f32(d.lo), span = f32(d.span);
    const __m256 a = f32(d.a), b = f32(d.b);
    for (int g0 = 0; g0 < RNG_CHUNK / 32; g0 += PHILOX_GROUPS) {
        v4 ws[PHILOX_GROUPS];
        philox_groups(blk0 + 8u * (uint64_t)g0, s0, s1, k0, k1, ws);
        if (d.kind == RNG_DIST_NORMAL || d.kind == RNG_DIST_TRUNC_NORMAL) {
            /* two groups a step (PHILOX_GROUPS is even) */
            for (int g = 0; g < PHILOX_GROUPS; g += 2) {
                if (d.kind == RNG_DIST_NORMAL) normal_groups(ws + g, std, mean, out + 32 * (g0 + g));
                else trunc_groups(ws + g, &d, out + 32 * (g0 + g));
            }
            continue;
        }
        for (int g = 0; g < PHILOX_GROUPS; g++) {
            const v4 w = ws[g];
            __m256 y[4];
            /* the loops over the 4 words unrolled: as loops, GCC kept the words on the stack (uniform 1.4-1.5x
             * slower on Zen 3) */
            switch (d.kind) {
            case RNG_DIST_UNIFORM:
                #pragma GCC unroll 4
                for (int j = 0; j < 4; j++) y[j] = u01(w.x[j]);
                break;
            case RNG_DIST_UNIFORM_AB:
                #pragma GCC unroll 4
                for (int j = 0; j < 4; j++) y[j] = clamp8(_mm256_fmadd_ps(u01(w.x[j]), span, lo), a, b);
                break;
            default:
                #pragma GCC unroll 4
                for (int j = 0; j < 4; j++) y[j] = mean;
                break;
            }
            store_blocks(out + 32 * (g0 + g), y[0], y[1], y[2], y[3]);
        }
    }
}

/* fsdp_f32_to_bf16 of 8 floats: round to nearest even, NaN quieted as (u >> 16) | 0x40 (in the low
 * 16 bits of each lane). */
AVX2 static inline __m256i bf16_8(__m256 x) {
    const __m256i u = as_si(x);
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(u32(0x7fffu), _mm256_and_si256(_mm256_srli_epi32(u, 16), u32(1u)))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, u32(0x7fffffffu)), u32(0x7f800000u));
    return _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), u32(0x40u)), nan);
}

/* fsdp_f32_to_f16 of 8 floats: F16C's conversion rounds to nearest even with IEEE subnormals and
 * overflow to infinity, as the scalar code does; NaNs become sign | 0x7e00 as there. */
AVX2 static inline __m128i f16_8(__m256 x) {
    const __m256i u = as_si(x);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan32 = _mm256_cmpgt_epi32(_mm256_and_si256(u, u32(0x7fffffffu)), u32(0x7f800000u));
    const __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    const __m256i q32 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), u32(0x8000u)), u32(0x7e00u));
    const __m128i q = _mm_packus_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
    return _mm_blendv_epi8(h, q, nan);
}

AVX2 void rng_avx2_to_half(const float *src, uint16_t *dst, size_t n, int bf16) {
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 x = _mm256_loadu_ps(src + k);
        __m128i h;
        if (bf16) {
            const __m256i b = bf16_8(x);
            h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        } else {
            h = f16_8(x);
        }
        _mm_storeu_si128((__m128i *)(dst + k), h);
    }
    for (; k < n; k++) dst[k] = bf16 ? fsdp_f32_to_bf16(src[k]) : fsdp_f32_to_f16(src[k]);
}

AVX2 void rng_avx2_round_half(float *x, size_t n, int bf16) {
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_loadu_ps(x + k);
        __m256 r;
        if (bf16) r = as_ps(_mm256_slli_epi32(bf16_8(v), 16));
        else r = _mm256_cvtph_ps(f16_8(v));
        _mm256_storeu_ps(x + k, r);
    }
    for (; k < n; k++)
        x[k] = bf16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(x[k])) : fsdp_f16_to_f32(fsdp_f32_to_f16(x[k]));
}

int rng_avx2_supported(void) {
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1, ECX: gcc 12's __builtin_cpu_supports("f16c") answers 0 on CPUs that
     * have it, and clang 14's does not know the name */
    unsigned a = 0, b = 0, c = 0, d = 0;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

#else

int rng_avx2_supported(void) { return 0; }

#endif
