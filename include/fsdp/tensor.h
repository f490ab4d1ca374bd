/* fsdp-run public API: dtypes and host tensors. */
#ifndef FSDP_TENSOR_H
#define FSDP_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_dtype {
    FSDP_DT_INVALID = 0,
    FSDP_DT_F32,
    FSDP_DT_F64,
    FSDP_DT_F16,
    FSDP_DT_BF16,
    FSDP_DT_I8,
    FSDP_DT_U8,
    FSDP_DT_I16,
    FSDP_DT_I32,
    FSDP_DT_I64,
    FSDP_DT_BOOL,
    FSDP_DT_U16,
    FSDP_DT_U32,
    FSDP_DT_U64,
    FSDP_DT_C64,
    FSDP_DT_C128,
    FSDP_DT_F8_E4M3FN,
    FSDP_DT_F8_E5M2,
    FSDP_DT_COUNT
} fsdp_dtype;

#define FSDP_MAX_DIMS 8

/* A dense, C-ordered host tensor. `data` is owned by whoever created it. */
typedef struct fsdp_tensor {
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    void *data;
} fsdp_tensor;

size_t fsdp_dtype_size(fsdp_dtype dt);
/* Short name used in recipes and the CLI: f32, f64, f16, bf16, i8, u8, ..., bool. */
const char *fsdp_dtype_name(fsdp_dtype dt);
/* PyTorch name: float32, bfloat16, int64, bool, ... */
const char *fsdp_dtype_torch_name(fsdp_dtype dt);
/* safetensors name: F32, BF16, I64, BOOL, ...; NULL when safetensors has none. */
const char *fsdp_dtype_st_name(fsdp_dtype dt);
/* Accepts any of the three spellings; FSDP_DT_INVALID when unknown. */
fsdp_dtype fsdp_dtype_from_name(const char *name);
int fsdp_dtype_is_float(fsdp_dtype dt);

/* Product of the dims (1 for a 0-d tensor); -1 on negative dims or int64 overflow. */
int64_t fsdp_numel(int ndim, const int64_t *shape);
/* "[256, 64]" into buf; returns buf. */
char *fsdp_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* Element conversion between dtypes (float <-> float with round-to-nearest-even for
 * bf16/f16, ints by value). fp8 (e4m3fn, e5m2) converts to any wider float (exactly, as its value);
 * nothing converts to fp8; complex converts only to itself. */
int fsdp_convert(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, size_t n,
                 fsdp_err *err);

float fsdp_bf16_to_f32(uint16_t h);
uint16_t fsdp_f32_to_bf16(float f);
float fsdp_f16_to_f32(uint16_t h);
/* The value of an fp8 e4m3fn / e5m2 byte (exact). */
float fsdp_f8e4m3_to_f32(uint8_t v);
float fsdp_f8e5m2_to_f32(uint8_t v);
uint16_t fsdp_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif
#endif
