/* Bias of a linear layer (Qwen2's q/k/v projections): the add and its gradient. */
#include "kernels/cpu/kc.h"

void kc_bias_forward(float *y, const float *b, int64_t n, int out) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *yr = y + (size_t)i * (size_t)out;
        for (int j = 0; j < out; j++) yr[j] += b[j];
    }
}

#define KC_BIAS_COLS 64

void kc_bias_backward(const float *dy, float *db, int64_t n, int out) {
    /* column blocks: each thread sums its columns over every row, in row order */
    int nblk = (out + KC_BIAS_COLS - 1) / KC_BIAS_COLS;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * KC_BIAS_COLS, j1 = j0 + KC_BIAS_COLS < out ? j0 + KC_BIAS_COLS : out;
        double acc[KC_BIAS_COLS] = {0};
        for (int64_t i = 0; i < n; i++) {
            const float *r = dy + (size_t)i * (size_t)out;
            for (int j = j0; j < j1; j++) acc[j - j0] += (double)r[j];
        }
        for (int j = j0; j < j1; j++) db[j] += (float)acc[j - j0];
    }
}
