/* SwiGLU gate: out = silu(a) * b with silu(a) = a / (1 + exp(-a)). */
#include "kernels/cpu/kc.h"

#include <math.h>

void kc_swiglu_forward(const float *a, const float *b, float *out, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = (a[i] / (1.0f + expf(-a[i]))) * b[i];
}

void kc_swiglu_backward(const float *a, const float *b, const float *dout, float *da, float *db, int64_t n) {
    /* d silu/da = sig * (1 + a * (1 - sig)) */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-a[i]));
        float go = dout[i];
        float bi = b[i];
        da[i] = go * bi * sig * (1.0f + a[i] * (1.0f - sig));
        db[i] = go * (a[i] * sig);
    }
}

void kc_swiglu_backward_recompute(const float *a, const float *b, const float *dout, float *da, float *db, float *out,
                                  int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float den = 1.0f + expf(-a[i]);
        float sig = 1.0f / den;
        float go = dout[i];
        float bi = b[i];
        out[i] = (a[i] / den) * bi; /* the forward's silu(a) * b */
        da[i] = go * bi * sig * (1.0f + a[i] * (1.0f - sig));
        db[i] = go * (a[i] * sig);
    }
}
