/* Token embedding: gather rows of the table; backward scatter-adds into the table's gradient, except
 * into the padding row. */
#include "kernels/cpu/kc.h"

#include <string.h>

static int check_tokens(const int32_t *tokens, int64_t n, int vocab, const char *what, fsdp_err *err) {
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: token %lld is %d, expected 0 <= token < vocab %d",
                                what, (long long)i, (int)tokens[i], vocab);
    }
    return FSDP_OK;
}

int kc_embedding_forward(const float *table, const int32_t *tokens, float *out, int64_t n, int vocab, int dim,
                         fsdp_err *err) {
    int rc = check_tokens(tokens, n, vocab, "embedding forward", err);
    if (rc) return rc;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * (size_t)dim, table + (size_t)tokens[i] * (size_t)dim, (size_t)dim * sizeof(float));
    return FSDP_OK;
}

#define KC_EMB_COLS 64

int kc_embedding_backward(const float *dout, const int32_t *tokens, float *dtable, int64_t n, int vocab, int dim,
                          int padding_idx, fsdp_err *err) {
    int rc = check_tokens(tokens, n, vocab, "embedding backward", err);
    if (rc) return rc;
    if (padding_idx < -1 || padding_idx >= vocab)
        return fsdp_err_set(err, FSDP_E_INVALID, "embedding backward: padding_idx %d, expected -1 (none) or 0 <= it < "
                            "vocab %d", padding_idx, vocab);
    /* Threads own disjoint column blocks, so repeated tokens never race; rows are added in order. */
    int nblk = (dim + KC_EMB_COLS - 1) / KC_EMB_COLS;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * KC_EMB_COLS;
        int j1 = j0 + KC_EMB_COLS < dim ? j0 + KC_EMB_COLS : dim;
        for (int64_t i = 0; i < n; i++) {
            if (tokens[i] == padding_idx) continue;
            float *dst = dtable + (size_t)tokens[i] * (size_t)dim;
            const float *src = dout + (size_t)i * (size_t)dim;
            for (int j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
    return FSDP_OK;
}
