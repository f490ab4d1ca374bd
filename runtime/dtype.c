/* Tensor dtypes (include/fsdp/tensor.h): sizes, names in PyTorch, safetensors and recipes, conversions. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fsdp/tensor.h"
#include "runtime/err_local.h"

typedef struct {
    const char *shortname, *torch, *st;
    size_t size;
    int is_float;
} dtype_info;

static const dtype_info DT[FSDP_DT_COUNT] = {
    [FSDP_DT_INVALID] = {"invalid", "invalid", NULL, 0, 0},
    [FSDP_DT_F32] = {"f32", "float32", "F32", 4, 1},
    [FSDP_DT_F64] = {"f64", "float64", "F64", 8, 1},
    [FSDP_DT_F16] = {"f16", "float16", "F16", 2, 1},
    [FSDP_DT_BF16] = {"bf16", "bfloat16", "BF16", 2, 1},
    [FSDP_DT_I8] = {"i8", "int8", "I8", 1, 0},
    [FSDP_DT_U8] = {"u8", "uint8", "U8", 1, 0},
    [FSDP_DT_I16] = {"i16", "int16", "I16", 2, 0},
    [FSDP_DT_I32] = {"i32", "int32", "I32", 4, 0},
    [FSDP_DT_I64] = {"i64", "int64", "I64", 8, 0},
    [FSDP_DT_BOOL] = {"bool", "bool", "BOOL", 1, 0},
    [FSDP_DT_U16] = {"u16", "uint16", "U16", 2, 0},
    [FSDP_DT_U32] = {"u32", "uint32", "U32", 4, 0},
    [FSDP_DT_U64] = {"u64", "uint64", "U64", 8, 0},
    [FSDP_DT_C64] = {"c64", "complex64", "C64", 8, 0},
    [FSDP_DT_C128] = {"c128", "complex128", NULL, 16, 0},
    [FSDP_DT_F8_E4M3FN] = {"f8_e4m3fn", "float8_e4m3fn", "F8_E4M3", 1, 0},
    [FSDP_DT_F8_E5M2] = {"f8_e5m2", "float8_e5m2", "F8_E5M2", 1, 0},
};

static int valid(fsdp_dtype dt) { return dt > FSDP_DT_INVALID && dt < FSDP_DT_COUNT; }

size_t fsdp_dtype_size(fsdp_dtype dt) { return valid(dt) ? DT[dt].size : 0; }
const char *fsdp_dtype_name(fsdp_dtype dt) { return valid(dt) ? DT[dt].shortname : "invalid"; }
const char *fsdp_dtype_torch_name(fsdp_dtype dt) { return valid(dt) ? DT[dt].torch : "invalid"; }
const char *fsdp_dtype_st_name(fsdp_dtype dt) { return valid(dt) ? DT[dt].st : NULL; }
int fsdp_dtype_is_float(fsdp_dtype dt) { return valid(dt) && DT[dt].is_float; }

fsdp_dtype fsdp_dtype_from_name(const char *name) {
    if (!name) return FSDP_DT_INVALID;
    for (int i = 1; i < FSDP_DT_COUNT; i++) {
        if (!strcmp(name, DT[i].shortname) || !strcmp(name, DT[i].torch) ||
            (DT[i].st && !strcmp(name, DT[i].st)))
            return (fsdp_dtype)i;
    }
    if (!strcmp(name, "float") || !strcmp(name, "fp32")) return FSDP_DT_F32;
    if (!strcmp(name, "double") || !strcmp(name, "fp64")) return FSDP_DT_F64;
    if (!strcmp(name, "half") || !strcmp(name, "fp16")) return FSDP_DT_F16;
    return FSDP_DT_INVALID;
}

int64_t fsdp_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

char *fsdp_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t off = 0;
    if (cap == 0 || !buf) return buf;
    if (!shape) ndim = 0;
    buf[0] = '\0';
    off += (size_t)snprintf(buf + off, cap - off, "[");
    for (int i = 0; i < ndim && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (off < cap) snprintf(buf + off, cap - off, "]");
    return buf;
}

float fsdp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fsdp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                         /* RNE */
    return (uint16_t)(u >> 16);
}

/* An 8-bit float with `mbits` mantissa bits and exponent bias `bias`, decoded exactly (every fp8 value
 * is a float32). e4m3fn (1-4-3, bias 7) has no infinities: S.1111.111 is its only NaN; e5m2 (1-5-2,
 * bias 15) is IEEE-like: exponent 31 holds infinities and NaNs. */
static float f8_to_f32(uint8_t v, int mbits, int bias, int ieee_top) {
    int ebits = 7 - mbits;
    uint32_t sign = (uint32_t)(v >> 7) << 31, exp = (v >> mbits) & ((1u << ebits) - 1u), man = v & ((1u << mbits) - 1u);
    uint32_t u;
    float f;
    if (ieee_top && exp == (1u << ebits) - 1u) {
        u = sign | 0x7f800000u | (man ? 0x400000u : 0u);
    } else if (!ieee_top && exp == (1u << ebits) - 1u && man == (1u << mbits) - 1u) {
        u = 0x7fc00000u | sign;
    } else if (exp == 0) { /* zero or subnormal: man x 2^(1 - bias - mbits) */
        f = ldexpf((float)man, 1 - bias - mbits);
        return sign ? -f : f;
    } else {
        u = sign | ((exp - (uint32_t)bias + 127u) << 23) | (man << (23 - mbits));
    }
    memcpy(&f, &u, 4);
    return f;
}

float fsdp_f8e4m3_to_f32(uint8_t v) { return f8_to_f32(v, 3, 7, 0); }
float fsdp_f8e5m2_to_f32(uint8_t v) { return f8_to_f32(v, 2, 15, 1); }

float fsdp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fsdp_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (absu >= 0x477ff000u) return sign | 0x7c00u; /* overflow (incl. rounding) -> inf */
    if (absu < 0x38800000u) {                       /* subnormal or zero in f16 */
        if (absu < 0x33000000u) return sign;        /* < 2^-25 rounds to 0 */
        uint32_t e = absu >> 23, man = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = 1u << (shift - 1), rem = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rem > half || (rem == half && (r & 1u))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - 0x38000000u;
    return sign | (uint16_t)(r >> 13);
}

/* Load element i of src as double (floats) or int64 (ints); which is set in *is_int. */
static void load_elem(const void *src, fsdp_dtype dt, size_t i, double *d, int64_t *q, uint64_t *uq,
                      int *kind) {
    const unsigned char *p = (const unsigned char *)src;
    *kind = 1; /* 0 float, 1 signed int, 2 unsigned */
    switch (dt) {
    case FSDP_DT_F32: { float v; memcpy(&v, p + 4 * i, 4); *d = v; *kind = 0; break; }
    case FSDP_DT_F64: { memcpy(d, p + 8 * i, 8); *kind = 0; break; }
    case FSDP_DT_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); *d = fsdp_f16_to_f32(h); *kind = 0; break; }
    case FSDP_DT_BF16: { uint16_t h; memcpy(&h, p + 2 * i, 2); *d = fsdp_bf16_to_f32(h); *kind = 0; break; }
    case FSDP_DT_I8: *q = ((const int8_t *)src)[i]; break;
    case FSDP_DT_U8: *uq = p[i]; *kind = 2; break;
    case FSDP_DT_BOOL: *uq = p[i] != 0; *kind = 2; break;
    case FSDP_DT_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); *q = v; break; }
    case FSDP_DT_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); *uq = v; *kind = 2; break; }
    case FSDP_DT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); *q = v; break; }
    case FSDP_DT_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); *uq = v; *kind = 2; break; }
    case FSDP_DT_I64: { memcpy(q, p + 8 * i, 8); break; }
    case FSDP_DT_U64: { memcpy(uq, p + 8 * i, 8); *kind = 2; break; }
    default: *d = 0; *kind = 0; break;
    }
}

static void store_elem(void *dst, fsdp_dtype dt, size_t i, double d, int64_t q, uint64_t uq, int kind) {
    unsigned char *p = (unsigned char *)dst;
    double dv = kind == 0 ? d : kind == 1 ? (double)q : (double)uq;
    /* float -> int saturates (NaN -> 0), as a defined stand-in for C's undefined overflow */
    int64_t iv = kind == 1 ? q : kind == 2 ? (int64_t)uq
                 : (d != d)                ? 0
                 : d >= 9.2233720368547758e18 ? INT64_MAX
                 : d <= -9.2233720368547758e18 ? INT64_MIN
                                              : (int64_t)d;
    switch (dt) {
    case FSDP_DT_F32: { float v = (float)dv; memcpy(p + 4 * i, &v, 4); break; }
    case FSDP_DT_F64: memcpy(p + 8 * i, &dv, 8); break;
    case FSDP_DT_F16: { uint16_t h = fsdp_f32_to_f16((float)dv); memcpy(p + 2 * i, &h, 2); break; }
    case FSDP_DT_BF16: { uint16_t h = fsdp_f32_to_bf16((float)dv); memcpy(p + 2 * i, &h, 2); break; }
    case FSDP_DT_I8: ((int8_t *)dst)[i] = (int8_t)iv; break;
    case FSDP_DT_U8: p[i] = (uint8_t)iv; break;
    case FSDP_DT_BOOL: p[i] = kind == 0 ? (d != 0.0) : (iv != 0); break;
    case FSDP_DT_I16: { int16_t v = (int16_t)iv; memcpy(p + 2 * i, &v, 2); break; }
    case FSDP_DT_U16: { uint16_t v = (uint16_t)iv; memcpy(p + 2 * i, &v, 2); break; }
    case FSDP_DT_I32: { int32_t v = (int32_t)iv; memcpy(p + 4 * i, &v, 4); break; }
    case FSDP_DT_U32: { uint32_t v = (uint32_t)iv; memcpy(p + 4 * i, &v, 4); break; }
    case FSDP_DT_I64: memcpy(p + 8 * i, &iv, 8); break;
    case FSDP_DT_U64: { uint64_t v = kind == 2 ? uq : (uint64_t)iv; memcpy(p + 8 * i, &v, 8); break; }
    default: break;
    }
}

int fsdp_convert(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, size_t n,
                 fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    if (!valid(dst_dt) || !valid(src_dt))
        return fsdp_err_set(err, FSDP_E_INVALID, "convert: invalid dtype");
    if (dst_dt == src_dt) {
        memmove(dst, src, n * DT[dst_dt].size);
        return FSDP_OK;
    }
    if ((src_dt == FSDP_DT_F8_E4M3FN || src_dt == FSDP_DT_F8_E5M2) && dst_dt != FSDP_DT_C64 && dst_dt != FSDP_DT_C128 &&
        dst_dt != FSDP_DT_F8_E4M3FN && dst_dt != FSDP_DT_F8_E5M2 && fsdp_dtype_is_float(dst_dt)) {
        /* fp8 -> any wider float: exact to float32, then as float32 converts */
        const uint8_t *s = (const uint8_t *)src;
        float buf[256];
        for (size_t i = 0; i < n; i += 256) {
            size_t k = n - i < 256 ? n - i : 256;
            for (size_t j = 0; j < k; j++)
                buf[j] = src_dt == FSDP_DT_F8_E4M3FN ? fsdp_f8e4m3_to_f32(s[i + j]) : fsdp_f8e5m2_to_f32(s[i + j]);
            int rc = fsdp_convert((char *)dst + i * DT[dst_dt].size, dst_dt, buf, FSDP_DT_F32, k, err);
            if (rc) return rc;
        }
        return FSDP_OK;
    }
    int special_src = src_dt == FSDP_DT_C64 || src_dt == FSDP_DT_C128 || src_dt == FSDP_DT_F8_E4M3FN ||
                      src_dt == FSDP_DT_F8_E5M2;
    int special_dst = dst_dt == FSDP_DT_C64 || dst_dt == FSDP_DT_C128 || dst_dt == FSDP_DT_F8_E4M3FN ||
                      dst_dt == FSDP_DT_F8_E5M2;
    if (special_src || special_dst)
        return fsdp_err_set(err, FSDP_E_INVALID, "cannot convert %s to %s", DT[src_dt].torch,
                            DT[dst_dt].torch);
    if (src_dt == FSDP_DT_F32 && dst_dt == FSDP_DT_BF16) {
        const float *s = (const float *)src;
        uint16_t *d = (uint16_t *)dst;
        for (size_t i = 0; i < n; i++) d[i] = fsdp_f32_to_bf16(s[i]);
        return FSDP_OK;
    }
    if (src_dt == FSDP_DT_BF16 && dst_dt == FSDP_DT_F32) {
        const uint16_t *s = (const uint16_t *)src;
        float *d = (float *)dst;
        for (size_t i = 0; i < n; i++) d[i] = fsdp_bf16_to_f32(s[i]);
        return FSDP_OK;
    }
    for (size_t i = 0; i < n; i++) {
        double d = 0;
        int64_t q = 0;
        uint64_t uq = 0;
        int kind;
        load_elem(src, src_dt, i, &d, &q, &uq, &kind);
        store_elem(dst, dst_dt, i, d, q, uq, kind);
    }
    return FSDP_OK;
}
