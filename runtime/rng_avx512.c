/* The AVX-512 generator (see rng_avx2.h): the ISA's operations for runtime/rng_simd_body.h on 16
 * lanes (compares give masks, selects are mask blends), and the 16-lane half-precision conversions. */
#include "runtime/rng_avx2.h"

#if RNG_HAVE_AVX2 /* the same compilers and targets */

#include <immintrin.h>

#include "fsdp/tensor.h"

#define AVX512 __attribute__((target("avx512f")))

typedef __m512 rv_f;
typedef __m512i rv_i;
typedef __mmask16 rv_m;

#define RV_TARGET AVX512
#define RV_W 16
#define RV_OP(x) _mm512_##x
#define RV_SI(x) _mm512_##x##_si512
#define RV_CMP(a, b, pred) _mm512_cmp_ps_mask(a, b, pred)
#define RV_CHUNK_FN rng_avx512_chunk

AVX512 static inline rv_i rv_lane(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
AVX512 static inline rv_f rv_as_ps(rv_i v) { return _mm512_castsi512_ps(v); }
AVX512 static inline rv_i rv_as_si(rv_f v) { return _mm512_castps_si512(v); }
AVX512 static inline rv_m rv_ltu(rv_i a, rv_i b) { return _mm512_cmplt_epu32_mask(a, b); }
AVX512 static inline rv_f rv_sel(rv_m m, rv_f t, rv_f f) { return _mm512_mask_blend_ps(m, f, t); }
AVX512 static inline rv_i rv_seli(rv_m m, rv_i t, rv_i f) { return _mm512_mask_blend_epi32(m, f, t); }
AVX512 static inline int rv_all(rv_m m) { return m == 0xFFFF; }
AVX512 static inline rv_m rv_odd(rv_i q) { return _mm512_test_epi32_mask(q, _mm512_set1_epi32(1)); }

/* (hi, lo) of the 32 x 32 -> 64-bit products a * m, lane by lane. */
AVX512 static inline void rv_mul_wide(rv_i a, rv_i m, rv_i *hi, rv_i *lo) {
    const rv_i ev = _mm512_mul_epu32(a, m);                          /* even lanes */
    const rv_i od = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m); /* odd lanes */
    *lo = _mm512_mask_blend_epi32(0xAAAA, ev, _mm512_slli_epi64(od, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(ev, 32), od);
}

/* Element 4 b + j of the 16 blocks from y[j] (lane b): 64 consecutive floats. Within each 128-bit
 * lane L the unpacks and shuffles give blocks 4L .. 4L + 3 whole (a, b, c, d); then a 4 x 4
 * transpose of the 128-bit lanes. */
AVX512 static inline void rv_store_blocks(float *out, rv_f y0, rv_f y1, rv_f y2, rv_f y3) {
    const rv_f t0 = _mm512_unpacklo_ps(y0, y1), t1 = _mm512_unpackhi_ps(y0, y1);
    const rv_f t2 = _mm512_unpacklo_ps(y2, y3), t3 = _mm512_unpackhi_ps(y2, y3);
    const rv_f ba = _mm512_shuffle_ps(t0, t2, 0x44), bb = _mm512_shuffle_ps(t0, t2, 0xEE);
    const rv_f bc = _mm512_shuffle_ps(t1, t3, 0x44), bd = _mm512_shuffle_ps(t1, t3, 0xEE);
    const rv_f p0 = _mm512_shuffle_f32x4(ba, bb, 0x44), p1 = _mm512_shuffle_f32x4(bc, bd, 0x44);
    const rv_f p2 = _mm512_shuffle_f32x4(ba, bb, 0xEE), p3 = _mm512_shuffle_f32x4(bc, bd, 0xEE);
    _mm512_storeu_ps(out, _mm512_shuffle_f32x4(p0, p1, 0x88));
    _mm512_storeu_ps(out + 16, _mm512_shuffle_f32x4(p0, p1, 0xDD));
    _mm512_storeu_ps(out + 32, _mm512_shuffle_f32x4(p2, p3, 0x88));
    _mm512_storeu_ps(out + 48, _mm512_shuffle_f32x4(p2, p3, 0xDD));
}

#include "runtime/rng_simd_body.h"

/* fsdp_f32_to_bf16 of 16 floats (rng_avx2.c's bf16_8). */
AVX512 static inline __m512i bf16_16(__m512 x) {
    const __m512i u = rv_as_si(x);
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(rv_u32(0x7fffu), _mm512_and_si512(_mm512_srli_epi32(u, 16), rv_u32(1u)))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, rv_u32(0x7fffffffu)), rv_u32(0x7f800000u));
    return _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(_mm512_srli_epi32(u, 16), rv_u32(0x40u)));
}

/* fsdp_f32_to_f16 of 16 floats (rng_avx2.c's f16_8), in 16-bit lanes. */
AVX512 static inline __m256i f16_16(__m512 x) {
    const __m512i u = rv_as_si(x);
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, rv_u32(0x7fffffffu)), rv_u32(0x7f800000u));
    const __m512i q32 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), rv_u32(0x8000u)), rv_u32(0x7e00u));
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
        const __m512 r = bf16 ? rv_as_ps(_mm512_slli_epi32(bf16_16(v), 16)) : _mm512_cvtph_ps(f16_16(v));
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
