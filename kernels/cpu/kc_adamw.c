/* AdamW exactly as torch.optim.AdamW's single-tensor path, plus global-norm clipping helpers. */
#include "kernels/cpu/kc.h"

#include <math.h>

void kc_adamw_step(float *p, const float *g, float *m, float *v, int64_t n, const kc_adamw_hparams *h,
                   int64_t step) {
    /* Python scalars are doubles; each in-place tensor op converts its scalar to float. */
    const float decay = (float)(1.0 - h->lr * h->weight_decay);         /* param.mul_(1 - lr*wd) */
    const float w1 = (float)(1.0 - h->beta1);                           /* exp_avg.lerp_(g, 1-b1) */
    const float b2 = (float)h->beta2;                                   /* exp_avg_sq.mul_(b2) */
    const float w2 = (float)(1.0 - h->beta2);                           /* .addcmul_(g, g, 1-b2) */
    const double bc1 = 1.0 - pow(h->beta1, (double)step);
    const double bc2 = 1.0 - pow(h->beta2, (double)step);
    const float bc2_sqrt = (float)sqrt(bc2);                            /* exp_avg_sq.sqrt() / bc2_sqrt */
    const float eps = (float)h->eps;                                    /* .add_(eps) */
    const float neg_step = (float)(-(h->lr / bc1));                     /* addcdiv_(m, denom, -step_size) */
    const int lerp_low = (1.0 - h->beta1) < 0.5;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float pi = p[i] * decay;
        float mi = m[i];
        /* at::lerp: weight < 0.5 ? self + w*(end-self) : end - (end-self)*(1-w) */
        mi = lerp_low ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1.0f - w1);
        float vi = v[i] * b2;
        vi = vi + w2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi + neg_step * mi / denom;
        m[i] = mi;
        v[i] = vi;
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
