/* AdamW as torch.optim.AdamW's single-tensor path defines it, evaluated in double and rounded once to float,
 * plus global-norm clipping helpers. */
#include "kernels/cpu/kc.h"

#include <math.h>

void kc_adamw_step(float *p, const float *g, float *m, float *v, int64_t n, const kc_adamw_hparams *h,
                   int64_t step) {
    /* torch's float32 path rounds each intermediate to float: param.mul_(1 - lr*wd), then addcdiv_ of the
     * step. Rounding the decayed weight before the step is added biases the result toward a shorter step
     * (by 2-5% of an ulp on average over normal weights and a +-lr step; one rounding has no bias), and
     * summed over every weight that moved the next loss of tests/data/hf-grid-5.24's configs by up to
     * 1.3e-7 relative, all in the same direction. Here p*(1 - lr*wd) - lr/bc1 * m / (sqrt(v)/sqrt(bc2) +
     * eps), with m and v updated first, is evaluated in double and p, m, v are each rounded once
     * (kcu_optim.cu's adamw_kernel: the same operations in the same order). */
    const double decay = 1.0 - h->lr * h->weight_decay, b1 = h->beta1, b2 = h->beta2, eps = h->eps;
    const double bc2_sqrt = sqrt(1.0 - pow(b2, (double)step));
    const double neg_step = -(h->lr / (1.0 - pow(b1, (double)step)));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double gi = g[i];
        const double mi = b1 * (double)m[i] + (1.0 - b1) * gi;
        const double vi = b2 * (double)v[i] + (1.0 - b2) * gi * gi;
        const double denom = sqrt(vi) / bc2_sqrt + eps;
        p[i] = (float)((double)p[i] * decay + neg_step * mi / denom);
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

double kc_sumsq(const float *x, int64_t n) {
    double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

double kc_clip_coef(double total_norm, double max_norm) {
    double c = max_norm / (total_norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

void kc_scale(float *x, int64_t n, float s) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}
