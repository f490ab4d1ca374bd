/* Dim permutations (see tensor_permute.h). */
#include "ckpt/tensor_permute.h"

void tperm_f32(const float *in, const int64_t *shape, const int *perm, int nd, float *out) {
    int64_t stride[8], od[8], idx[8] = {0}, numel = 1, st = 1;
    for (int k = nd - 1; k >= 0; k--) {
        stride[k] = st;
        st *= shape[k];
    }
    for (int k = 0; k < nd; k++) {
        od[k] = shape[perm[k]];
        numel *= od[k];
    }
    if (numel == 0) return;
    if (nd == 0) {
        out[0] = in[0];
        return;
    }
    int64_t off = 0; /* offset in `in` of the output element idx */
    for (int64_t o = 0; o < numel; o++) {
        out[o] = in[off];
        for (int k = nd - 1; k >= 0; k--) { /* odometer over the output's dims */
            idx[k]++;
            off += stride[perm[k]];
            if (idx[k] < od[k]) break;
            off -= stride[perm[k]] * od[k];
            idx[k] = 0;
        }
    }
}

int tperm_keeps_rows(const int *perm, int nd) { return nd >= 1 && perm[0] == 0; }
