/* RMSNorm as nn.RMSNorm / torchtitan: y = (x * rsqrt(mean(x^2) + eps)) * w. */
#include "kernels/cpu/kc.h"

#include <math.h>

void kc_rmsnorm_forward(const float *x, const float *w, float *y, float *rstd, int64_t n, int dim, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * (size_t)dim;
        float *yr = y + (size_t)i * (size_t)dim;
        double ss = 0.0;
        for (int j = 0; j < dim; j++) ss += (double)xr[j] * (double)xr[j];
        float ms = (float)(ss / dim);
        float r = 1.0f / sqrtf(ms + eps);
        rstd[i] = r;
        for (int j = 0; j < dim; j++) yr[j] = (xr[j] * r) * w[j];
    }
}

void kc_rmsnorm_apply(const float *x, const float *w, const float *rstd, float *y, int64_t n, int dim) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * (size_t)dim;
        float *yr = y + (size_t)i * (size_t)dim;
        const float r = rstd[i];
        for (int j = 0; j < dim; j++) yr[j] = (xr[j] * r) * w[j];
    }
}

#define KC_NORM_COLS 64

void kc_rmsnorm_backward(const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                         int64_t n, int dim) {
    /* With u = x*r: dx = r*(dy*w) - x * r^3/dim * sum_j(dy_j*w_j*x_j); dw = sum_rows dy*x*r. */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * (size_t)dim;
        const float *dyr = dy + (size_t)i * (size_t)dim;
        float *dxr = dx + (size_t)i * (size_t)dim;
        double dot = 0.0;
        for (int j = 0; j < dim; j++) dot += (double)dyr[j] * (double)w[j] * (double)xr[j];
        double r = rstd[i];
        float c = (float)(dot * r * r * r / dim);
        float rf = rstd[i];
        for (int j = 0; j < dim; j++) dxr[j] += rf * (dyr[j] * w[j]) - xr[j] * c;
    }
    int nblk = (dim + KC_NORM_COLS - 1) / KC_NORM_COLS;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * KC_NORM_COLS;
        int j1 = j0 + KC_NORM_COLS < dim ? j0 + KC_NORM_COLS : dim;
        double acc[KC_NORM_COLS] = {0};
        for (int64_t i = 0; i < n; i++) {
            const float *xr = x + (size_t)i * (size_t)dim;
            const float *dyr = dy + (size_t)i * (size_t)dim;
            double r = rstd[i];
            for (int j = j0; j < j1; j++) acc[j - j0] += (double)dyr[j] * (double)xr[j] * r;
        }
        for (int j = j0; j < j1; j++) dw[j] += (float)acc[j - j0];
    }
}
