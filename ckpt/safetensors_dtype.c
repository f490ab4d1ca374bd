/* safetensors dtype strings and the writer's dtype order. */
#include <string.h>

#include "ckpt/safetensors.h"

/* safetensors' Dtype enum order (increasing alignment), restricted to the dtypes fsdp-run has. */
static const fsdp_dtype ORDER[] = {
    FSDP_DT_BOOL, FSDP_DT_U8,  FSDP_DT_I8,  FSDP_DT_F8_E5M2, FSDP_DT_F8_E4M3FN, FSDP_DT_I16,
    FSDP_DT_U16,  FSDP_DT_F16, FSDP_DT_BF16, FSDP_DT_I32,    FSDP_DT_U32,       FSDP_DT_F32,
    FSDP_DT_C64,  FSDP_DT_F64, FSDP_DT_I64,  FSDP_DT_U64,
};

static const char *const FOREIGN[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ",
                                      "F8_E5M2FNUZ"};

fsdp_dtype st_dtype_parse(const char *s) {
    if (!s) return FSDP_DT_INVALID;
    for (size_t i = 0; i < sizeof ORDER / sizeof ORDER[0]; i++) {
        const char *n = fsdp_dtype_st_name(ORDER[i]);
        if (n && !strcmp(n, s)) return ORDER[i];
    }
    return FSDP_DT_INVALID;
}

int st_dtype_is_foreign(const char *s) {
    if (!s) return 0;
    for (size_t i = 0; i < sizeof FOREIGN / sizeof FOREIGN[0]; i++)
        if (!strcmp(FOREIGN[i], s)) return 1;
    return 0;
}

int st_dtype_rank(fsdp_dtype dt) {
    for (size_t i = 0; i < sizeof ORDER / sizeof ORDER[0]; i++)
        if (ORDER[i] == dt) return fsdp_dtype_st_name(dt) ? (int)i : -1;
    return -1;
}
