/* The AVX-512 generator (see rng_avx2.h): rng_math.h's operations on 16 lanes, in the same order
 * (the structure of rng_avx2.c; compares give masks and selects are mask blends).
 *
 * Each lane of a vector is one Philox block (16 consecutive blocks at a time), so the four output
 * words of a block are four vectors; the distribution transforms run on those vectors and a 4 x 16
 * transpose puts element 4b + j at its place. Every operation is the correctly rounded IEEE one of
 * the scalar code (add, sub, mul, div, sqrt, fmadd = fmaf, exact int <-> float conversions, bit
 * operations, compares and selects with the scalar code's NaN behaviour), so the bits are equal. */
#include "runtime/rng_avx2.h"

#if RNG_HAVE_AVX2 /* the same compilers and targets */

#include <immintrin.h>

#include "fsdp/tensor.h"

#define AVX512 __attribute__((target("avx512f")))

typedef struct v4 {
    __m512i x[4];
} v4;

AVX512 static inline __m512i u32(uint32_t v) { return _mm512_set1_epi32((int)v); }
AVX512 static inline __m512 f32(float v) { return _mm512_set1_ps(v); }
AVX512 static inline __m512 as_ps(__m512i v) { return _mm512_castsi512_ps(v); }
AVX512 static inline __m512i as_si(__m512 v) { return _mm512_castps_si512(v); }

/* (hi, lo) of the 32 x 32 -> 64-bit products a * m, lane by lane. */
AVX512 static inline void mul_wide(__m512i a, __m512i m, __m512i *hi, __m512i *lo) {
    const __m512i ev = _mm512_mul_epu32(a, m);                          /* even lanes */
    const __m512i od = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m); /* odd lanes */
    *lo = _mm512_mask_blend_epi32(0xAAAA, ev, _mm512_slli_epi64(od, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(ev, 32), od);
}

/* Philox blocks interleaved per call: one round's multiplies have a latency of several cycles, so
 * independent vectors of blocks keep the vector units busy. The loops are unrolled, so that the
 * blocks' words stay in registers (rng_avx2.c). */
#define PHILOX_GROUPS 4 /* all 64 blocks of a chunk */

/* Philox4x32-10 (rng_hd_philox on each lane) of blocks blk0 .. blk0 + 16 PHILOX_GROUPS - 1:
 * w[g].x[j] holds word j of block blk0 + 16 g + lane. */
AVX512 static void philox_groups(uint64_t blk0, uint32_t s0, uint32_t s1, uint32_t k0, uint32_t k1,
                               v4 w[PHILOX_GROUPS]) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i m0 = u32(RNG_PHILOX_M0), m1 = u32(RNG_PHILOX_M1);
    __m512i c0[PHILOX_GROUPS], c1[PHILOX_GROUPS], c2[PHILOX_GROUPS], c3[PHILOX_GROUPS];
    for (int g = 0; g < PHILOX_GROUPS; g++) {
        const uint64_t b = blk0 + 16u * (uint64_t)g;
        const uint32_t lo0 = (uint32_t)b, hi0 = (uint32_t)(b >> 32);
        c0[g] = _mm512_add_epi32(u32(lo0), lane);
        /* carry into the high word where lo0 + lane wrapped: unsigned c0 < lo0 */
        const __mmask16 carry = _mm512_cmplt_epu32_mask(c0[g], u32(lo0));
        c1[g] = _mm512_mask_add_epi32(u32(hi0), carry, u32(hi0), u32(1u));
        c2[g] = u32(s0);
        c3[g] = u32(s1);
    }
    uint32_t ka = k0, kb = k1;
#pragma GCC unroll 10
    for (int r = 0; r < 10; r++) {
        const __m512i vka = u32(ka), vkb = u32(kb);
#pragma GCC unroll 4
        for (int g = 0; g < PHILOX_GROUPS; g++) {
            __m512i h0, l0, h1, l1;
            mul_wide(c0[g], m0, &h0, &l0);
            mul_wide(c2[g], m1, &h1, &l1);
            c0[g] = _mm512_xor_si512(_mm512_xor_si512(h1, c1[g]), vka);
            c2[g] = _mm512_xor_si512(_mm512_xor_si512(h0, c3[g]), vkb);
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

/* rng_hd_u01 */
AVX512 static inline __m512 u01(__m512i x) {
    const __m512 m = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 9));
    return _mm512_mul_ps(_mm512_add_ps(m, f32(0.5f)), f32(0x1p-23f));
}

/* rng_hd_logf */
AVX512 static inline __m512 logf8(__m512 x) {
    const __m512i t = _mm512_sub_epi32(as_si(x), u32(0x3f3504f3u));
    const __m512 e = _mm512_cvtepi32_ps(_mm512_srai_epi32(t, 23));
    const __m512 m = as_ps(_mm512_add_epi32(_mm512_and_si512(t, u32(0x007fffffu)), u32(0x3f3504f3u)));
    const __m512 f = _mm512_sub_ps(m, f32(1.0f));
    const __m512 s = _mm512_div_ps(f, _mm512_add_ps(f32(2.0f), f));
    const __m512 z = _mm512_mul_ps(s, s);
    __m512 q = _mm512_fmadd_ps(z, f32(0x1.c71c72p-4f), f32(0x1.24924ap-3f));
    q = _mm512_fmadd_ps(z, q, f32(0x1.99999ap-3f));
    q = _mm512_fmadd_ps(z, q, f32(0x1.555556p-2f));
    const __m512 s2 = _mm512_add_ps(s, s);
    const __m512 lnm = _mm512_fmadd_ps(s2, _mm512_mul_ps(z, q), s2);
    return _mm512_fmadd_ps(e, f32(0x1.62e4p-1f), _mm512_fmadd_ps(e, f32(0x1.7f7d1cp-20f), lnm));
}

/* rng_hd_cossin_turn */
AVX512 static inline void cossin8(__m512i x, __m512 *c, __m512 *s) {
    const __m512i m = _mm512_srli_epi32(x, 8);
    const __m512i k = _mm512_srli_epi32(_mm512_add_epi32(m, u32(1u << 21)), 22);
    const __m512 ti = _mm512_cvtepi32_ps(_mm512_sub_epi32(m, _mm512_slli_epi32(k, 22)));
    const __m512 t = _mm512_mul_ps(_mm512_add_ps(ti, f32(0.5f)), f32(0x1p-22f));
    const __m512 y = _mm512_mul_ps(t, t);
    __m512 sp = _mm512_fmadd_ps(y, f32(0x1.507834p-13f), f32(-0x1.32d2ccp-8f));
    sp = _mm512_fmadd_ps(y, sp, f32(0x1.466bc6p-4f));
    sp = _mm512_fmadd_ps(y, sp, f32(-0x1.4abbcep-1f));
    sp = _mm512_fmadd_ps(y, sp, f32(0x1.921fb6p+0f));
    sp = _mm512_mul_ps(t, sp);
    __m512 cp = _mm512_fmadd_ps(y, f32(-0x1.a6d1f2p-16f), f32(0x1.e1f506p-11f));
    cp = _mm512_fmadd_ps(y, cp, f32(-0x1.55d3c8p-6f));
    cp = _mm512_fmadd_ps(y, cp, f32(0x1.03c1fp-2f));
    cp = _mm512_fmadd_ps(y, cp, f32(-0x1.3bd3ccp+0f));
    cp = _mm512_fmadd_ps(y, cp, f32(1.0f));
    const __m512i q = _mm512_and_si512(k, u32(3u));
    const __mmask16 odd = _mm512_test_epi32_mask(q, u32(1u));
    const __m512 cc = _mm512_mask_blend_ps(odd, cp, sp), ss = _mm512_mask_blend_ps(odd, sp, cp);
    const __m512i cneg = _mm512_slli_epi32(_mm512_and_si512(_mm512_add_epi32(q, u32(1u)), u32(2u)), 30);
    const __m512i sneg = _mm512_slli_epi32(_mm512_and_si512(q, u32(2u)), 30);
    *c = as_ps(_mm512_xor_si512(as_si(cc), cneg));
    *s = as_ps(_mm512_xor_si512(as_si(ss), sneg));
}

/* rng_hd_erfinvf's polynomial for w >= 5 (the tails) */
AVX512 static inline __m512 erfinv_tail16(__m512 w) {
    const __m512 u = _mm512_sub_ps(_mm512_sqrt_ps(w), f32(3.0f));
    __m512 q = _mm512_fmadd_ps(u, f32(0x1.cb5172p-14f), f32(-0x1.3d3be8p-12f));
    q = _mm512_fmadd_ps(u, q, f32(-0x1.94a6acp-15f));
    q = _mm512_fmadd_ps(u, q, f32(0x1.82da1ep-10f));
    q = _mm512_fmadd_ps(u, q, f32(-0x1.d816a4p-9f));
    q = _mm512_fmadd_ps(u, q, f32(0x1.74f6e2p-8f));
    q = _mm512_fmadd_ps(u, q, f32(-0x1.f47412p-8f));
    q = _mm512_fmadd_ps(u, q, f32(0x1.357bf4p-7f));
    q = _mm512_fmadd_ps(u, q, f32(0x1.006dc4p+0f));
    return _mm512_fmadd_ps(u, q, f32(0x1.6a9efcp+1f));
}

/* rng_hd_erfinvf */
AVX512 static inline __m512 erfinv8(__m512 x) {
    const __m512 a = as_ps(_mm512_and_si512(as_si(x), u32(0x7fffffffu)));
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(f32(1.0f), a), _mm512_add_ps(f32(1.0f), a));
    t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, f32(0x1p-126f), _CMP_GE_OQ), f32(0x1p-126f), t);
    const __m512 w = as_ps(_mm512_xor_si512(as_si(logf8(t)), u32(0x80000000u))); /* -log */
    const __m512 v = _mm512_sub_ps(w, f32(2.5f));
    __m512 p = _mm512_fmadd_ps(v, f32(-0x1.2a9c6ap-27f), f32(0x1.a0a0aep-26f));
    p = _mm512_fmadd_ps(v, p, f32(0x1.f2f1b4p-22f));
    p = _mm512_fmadd_ps(v, p, f32(-0x1.d2aa2ep-19f));
    p = _mm512_fmadd_ps(v, p, f32(-0x1.4c93a8p-18f));
    p = _mm512_fmadd_ps(v, p, f32(0x1.ca0a3cp-13f));
    p = _mm512_fmadd_ps(v, p, f32(-0x1.486714p-10f));
    p = _mm512_fmadd_ps(v, p, f32(-0x1.11c6d2p-8f));
    p = _mm512_fmadd_ps(v, p, f32(0x1.f91e8cp-3f));
    p = _mm512_fmadd_ps(v, p, f32(0x1.805c5ep+0f));
    /* the tails' polynomial only when a lane takes it (w >= 5: |x| >= 0.9966, or w NaN): over the whole of (-1, 1)
     * one vector in 19 has such a lane, inside torch's common bounds of 2 or 3 std none; every lane gets the bits
     * of the scalar code (p where w < 5, else the tails') */
    const __mmask16 central = _mm512_cmp_ps_mask(w, f32(5.0f), _CMP_LT_OQ);
    __m512 g = p;
    if (central != 0xFFFF) g = _mm512_mask_blend_ps(central, erfinv_tail16(w), p);
    __m512 r = _mm512_mul_ps(x, g);
    const __m512 inf = as_ps(_mm512_or_si512(_mm512_and_si512(as_si(x), u32(0x80000000u)), u32(0x7f800000u)));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, f32(1.0f), _CMP_EQ_OQ), r, inf);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, f32(1.0f), _CMP_LE_OQ), as_ps(u32(0x7fc00000u)), r);
}

/* clamp as the scalar code: r < a ? a : r, then r > b ? b : r (a NaN r stays NaN). max_ps(A, B) is
 * A > B ? A : B and min_ps(A, B) is A < B ? A : B, the second operand when unordered. */
AVX512 static inline __m512 clamp8(__m512 r, __m512 a, __m512 b) { return _mm512_min_ps(b, _mm512_max_ps(a, r)); }

/* Element 4 b + j of the 16 blocks from y[j] (lane b): 64 consecutive floats. Within each 128-bit
 * lane L the unpacks and shuffles give blocks 4L .. 4L + 3 whole (a, b, c, d); then a 4 x 4
 * transpose of the 128-bit lanes. */
AVX512 static inline void store_blocks(float *out, __m512 y0, __m512 y1, __m512 y2, __m512 y3) {
    const __m512 t0 = _mm512_unpacklo_ps(y0, y1), t1 = _mm512_unpackhi_ps(y0, y1);
    const __m512 t2 = _mm512_unpacklo_ps(y2, y3), t3 = _mm512_unpackhi_ps(y2, y3);
    const __m512 ba = _mm512_shuffle_ps(t0, t2, 0x44), bb = _mm512_shuffle_ps(t0, t2, 0xEE);
    const __m512 bc = _mm512_shuffle_ps(t1, t3, 0x44), bd = _mm512_shuffle_ps(t1, t3, 0xEE);
    const __m512 p0 = _mm512_shuffle_f32x4(ba, bb, 0x44), p1 = _mm512_shuffle_f32x4(bc, bd, 0x44);
    const __m512 p2 = _mm512_shuffle_f32x4(ba, bb, 0xEE), p3 = _mm512_shuffle_f32x4(bc, bd, 0xEE);
    _mm512_storeu_ps(out, _mm512_shuffle_f32x4(p0, p1, 0x88));
    _mm512_storeu_ps(out + 16, _mm512_shuffle_f32x4(p0, p1, 0xDD));
    _mm512_storeu_ps(out + 32, _mm512_shuffle_f32x4(p2, p3, 0x88));
    _mm512_storeu_ps(out + 48, _mm512_shuffle_f32x4(p2, p3, 0xDD));
}

/* rng_hd_normal_pair: r (cos, sin) */
AVX512 static inline void normal8(__m512i xu, __m512i xa, __m512 std, __m512 mean, __m512 *z0, __m512 *z1) {
    const __m512 r = _mm512_sqrt_ps(_mm512_mul_ps(f32(-2.0f), logf8(u01(xu))));
    __m512 c, s;
    cossin8(xa, &c, &s);
    *z0 = _mm512_fmadd_ps(_mm512_mul_ps(r, c), std, mean);
    *z1 = _mm512_fmadd_ps(_mm512_mul_ps(r, s), std, mean);
}

AVX512 void rng_avx512_chunk(const rng_dist *dp, uint64_t seed, uint64_t stream, uint64_t blk0, float *out) {
    const rng_dist d = *dp;
    const uint32_t s0 = (uint32_t)stream, s1 = (uint32_t)(stream >> 32);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const __m512 mean = f32(d.mean), std = f32(d.std), lo = f32(d.lo), span = f32(d.span);
    const __m512 scale = f32(d.scale), a = f32(d.a), b = f32(d.b);
    for (int g0 = 0; g0 < RNG_CHUNK / 64; g0 += PHILOX_GROUPS) {
        v4 ws[PHILOX_GROUPS];
        philox_groups(blk0 + 16u * (uint64_t)g0, s0, s1, k0, k1, ws);
        for (int g = 0; g < PHILOX_GROUPS; g++) {
            const v4 w = ws[g];
            __m512 y[4];
            switch (d.kind) {
            case RNG_DIST_UNIFORM:
                for (int j = 0; j < 4; j++) y[j] = u01(w.x[j]);
                break;
            case RNG_DIST_NORMAL:
                normal8(w.x[0], w.x[1], std, mean, &y[0], &y[1]);
                normal8(w.x[2], w.x[3], std, mean, &y[2], &y[3]);
                break;
            case RNG_DIST_TRUNC_NORMAL:
                for (int j = 0; j < 4; j++) {
                    const __m512 v = _mm512_fmadd_ps(u01(w.x[j]), span, lo);
                    y[j] = clamp8(_mm512_fmadd_ps(erfinv8(v), scale, mean), a, b);
                }
                break;
            case RNG_DIST_UNIFORM_AB:
                for (int j = 0; j < 4; j++) y[j] = clamp8(_mm512_fmadd_ps(u01(w.x[j]), span, lo), a, b);
                break;
            default:
                for (int j = 0; j < 4; j++) y[j] = mean;
                break;
            }
            store_blocks(out + 64 * (g0 + g), y[0], y[1], y[2], y[3]);
        }
    }
}

/* fsdp_f32_to_bf16 of 16 floats (rng_avx2.c's bf16_8). */
AVX512 static inline __m512i bf16_16(__m512 x) {
    const __m512i u = as_si(x);
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(u32(0x7fffu), _mm512_and_si512(_mm512_srli_epi32(u, 16), u32(1u)))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, u32(0x7fffffffu)), u32(0x7f800000u));
    return _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(_mm512_srli_epi32(u, 16), u32(0x40u)));
}

/* fsdp_f32_to_f16 of 16 floats (rng_avx2.c's f16_8), in 16-bit lanes. */
AVX512 static inline __m256i f16_16(__m512 x) {
    const __m512i u = as_si(x);
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, u32(0x7fffffffu)), u32(0x7f800000u));
    const __m512i q32 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), u32(0x8000u)), u32(0x7e00u));
    const __m256i q = _mm512_cvtepi32_epi16(q32);
    const __m512i h32 = _mm512_mask_blend_epi32(nan, _mm512_cvtepu16_epi32(h), _mm512_cvtepu16_epi32(q));
    return _mm512_cvtepi32_epi16(h32);
}

AVX512 void rng_avx512_to_half(const float *src, uint16_t *dst, size_t n, int bf16) {
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 x = _mm512_loadu_ps(src + k);
        const __m256i h = bf16 ? _mm512_cvtepi32_epi16(bf16_16(x)) : f16_16(x);
        _mm256_storeu_si256((__m256i *)(dst + k), h);
    }
    for (; k < n; k++) dst[k] = bf16 ? fsdp_f32_to_bf16(src[k]) : fsdp_f32_to_f16(src[k]);
}

AVX512 void rng_avx512_round_half(float *x, size_t n, int bf16) {
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        const __m512 r = bf16 ? as_ps(_mm512_slli_epi32(bf16_16(v), 16)) : _mm512_cvtph_ps(f16_16(v));
        _mm512_storeu_ps(x + k, r);
    }
    for (; k < n; k++)
        x[k] = bf16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(x[k])) : fsdp_f16_to_f32(fsdp_f32_to_f16(x[k]));
}

int rng_avx512_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

#else

int rng_avx512_supported(void) { return 0; }

#endif
