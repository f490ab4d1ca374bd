/* The AVX2+FMA generator (see rng_avx2.h): the ISA's operations for runtime/rng_simd_body.h, which
 * writes rng_math.h's Philox and transforms once for 8 (here) and 16 lanes (rng_avx512.c), and the
 * 8-lane half-precision conversions. */
#include "runtime/rng_avx2.h"

#if RNG_HAVE_AVX2

#include <cpuid.h>
#include <immintrin.h>

#include "fsdp/tensor.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

typedef __m256 rv_f;
typedef __m256i rv_i;
typedef __m256 rv_m; /* all-ones lanes where true */

#define RV_TARGET AVX2
#define RV_W 8
#define RV_OP(x) _mm256_##x
#define RV_SI(x) _mm256_##x##_si256
#define RV_CMP(a, b, pred) _mm256_cmp_ps(a, b, pred)
#define RV_CHUNK_FN rng_avx2_chunk

AVX2 static inline rv_i rv_lane(void) { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
AVX2 static inline rv_f rv_as_ps(rv_i v) { return _mm256_castsi256_ps(v); }
AVX2 static inline rv_i rv_as_si(rv_f v) { return _mm256_castps_si256(v); }
/* unsigned a < b: the signed compare of both with the top bit flipped */
AVX2 static inline rv_m rv_ltu(rv_i a, rv_i b) {
    const rv_i bias = _mm256_set1_epi32(INT32_MIN);
    return rv_as_ps(_mm256_cmpgt_epi32(_mm256_xor_si256(b, bias), _mm256_xor_si256(a, bias)));
}
AVX2 static inline rv_f rv_sel(rv_m m, rv_f t, rv_f f) { return _mm256_blendv_ps(f, t, m); }
AVX2 static inline rv_i rv_seli(rv_m m, rv_i t, rv_i f) { return rv_as_si(_mm256_blendv_ps(rv_as_ps(f), rv_as_ps(t), m)); }
AVX2 static inline int rv_all(rv_m m) { return _mm256_movemask_ps(m) == 0xFF; }
AVX2 static inline rv_m rv_odd(rv_i q) { return rv_as_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(1))); }

/* (hi, lo) of the 32 x 32 -> 64-bit products a * m, lane by lane. */
AVX2 static inline void rv_mul_wide(rv_i a, rv_i m, rv_i *hi, rv_i *lo) {
    const rv_i ev = _mm256_mul_epu32(a, m);                          /* lanes 0, 2, 4, 6 */
    const rv_i od = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m); /* lanes 1, 3, 5, 7 */
    *lo = _mm256_blend_epi32(ev, _mm256_slli_epi64(od, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(ev, 32), od, 0xAA);
}

/* Element 4 b + j of the 8 blocks from y[j] (lane b): 32 consecutive floats. */
AVX2 static inline void rv_store_blocks(float *out, rv_f y0, rv_f y1, rv_f y2, rv_f y3) {
    const rv_f t0 = _mm256_unpacklo_ps(y0, y1), t1 = _mm256_unpackhi_ps(y0, y1);
    const rv_f t2 = _mm256_unpacklo_ps(y2, y3), t3 = _mm256_unpackhi_ps(y2, y3);
    const rv_f b04 = _mm256_shuffle_ps(t0, t2, 0x44), b15 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const rv_f b26 = _mm256_shuffle_ps(t1, t3, 0x44), b37 = _mm256_shuffle_ps(t1, t3, 0xEE);
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(b04, b15, 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(b26, b37, 0x20));
    _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(b04, b15, 0x31));
    _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(b26, b37, 0x31));
}

#include "runtime/rng_simd_body.h"

/* fsdp_f32_to_bf16 of 8 floats: round to nearest even, NaN quieted as (u >> 16) | 0x40 (in the low
 * 16 bits of each lane). */
AVX2 static inline __m256i bf16_8(__m256 x) {
    const __m256i u = rv_as_si(x);
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(rv_u32(0x7fffu), _mm256_and_si256(_mm256_srli_epi32(u, 16), rv_u32(1u)))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, rv_u32(0x7fffffffu)), rv_u32(0x7f800000u));
    return _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), rv_u32(0x40u)), nan);
}

/* fsdp_f32_to_f16 of 8 floats: F16C's conversion rounds to nearest even with IEEE subnormals and
 * overflow to infinity, as the scalar code does; NaNs become sign | 0x7e00 as there. */
AVX2 static inline __m128i f16_8(__m256 x) {
    const __m256i u = rv_as_si(x);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan32 = _mm256_cmpgt_epi32(_mm256_and_si256(u, rv_u32(0x7fffffffu)), rv_u32(0x7f800000u));
    const __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    const __m256i q32 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), rv_u32(0x8000u)), rv_u32(0x7e00u));
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
        if (bf16) r = rv_as_ps(_mm256_slli_epi32(bf16_8(v), 16));
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
