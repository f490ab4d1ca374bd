/* Rotary position embedding on interleaved pairs, as torchtitan's apply_rotary_emb / refmodel.rope. */
#include "kernels/cpu/kc.h"

#include <math.h>

/* llama3.1 frequency scaling (torchtitan precompute_freqs_cis, applied per frequency). */
static double llama3_scale(double freq, const kc_rope_params *p) {
    double low_wavelen = p->original_max_pos / p->low_freq_factor;
    double high_wavelen = p->original_max_pos / p->high_freq_factor;
    double wavelen = 2.0 * M_PI / freq;
    if (wavelen < high_wavelen) return freq;
    if (wavelen > low_wavelen) return freq / p->factor;
    double s = (p->original_max_pos / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
    return (1.0 - s) * freq / p->factor + s * freq;
}

int kc_rope_tables(int head_dim, int t_max, const kc_rope_params *p, float *cos_out, float *sin_out,
                   fsdp_err *err) {
    if (head_dim <= 0 || head_dim % 2 != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "rope: head_dim %d must be positive and even", head_dim);
    if (t_max <= 0) return fsdp_err_set(err, FSDP_E_INVALID, "rope: sequence length %d must be positive", t_max);
    if (!(p->theta > 0.0) || !isfinite(p->theta))
        return fsdp_err_set(err, FSDP_E_INVALID, "rope: theta %g must be a positive number", p->theta);
    if (p->llama3_scaling) {
        if (!(p->factor > 0.0) || !(p->low_freq_factor > 0.0) || !(p->high_freq_factor > 0.0) ||
            !(p->original_max_pos > 0.0) || p->high_freq_factor == p->low_freq_factor)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "rope: llama3 scaling needs factor, low_freq_factor, high_freq_factor and "
                                "original_max_pos > 0 with high != low (got %g, %g, %g, %g)",
                                p->factor, p->low_freq_factor, p->high_freq_factor, p->original_max_pos);
    }
    int half = head_dim / 2;
    for (int j = 0; j < half; j++) {
        double freq = 1.0 / pow(p->theta, (double)(2 * j) / (double)head_dim);
        if (p->llama3_scaling) freq = llama3_scale(freq, p);
        for (int t = 0; t < t_max; t++) {
            double ang = (double)t * freq;
            cos_out[(size_t)t * half + j] = (float)cos(ang);
            sin_out[(size_t)t * half + j] = (float)sin(ang);
        }
    }
    return FSDP_OK;
}

static void rope_apply(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int head_dim,
                       float sign) {
    int half = head_dim / 2;
    int64_t rows = (int64_t)B * T;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int t = (int)(r % T);
        const float *c = cos_t + (size_t)t * half;
        const float *s = sin_t + (size_t)t * half;
        for (int h = 0; h < nh; h++) {
            float *xh = x + ((size_t)r * nh + h) * (size_t)head_dim;
            for (int j = 0; j < half; j++) {
                float a = xh[2 * j], b = xh[2 * j + 1];
                float sj = sign * s[j];
                xh[2 * j] = a * c[j] - b * sj;
                xh[2 * j + 1] = a * sj + b * c[j];
            }
        }
    }
}

void kc_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int head_dim) {
    rope_apply(x, cos_t, sin_t, B, T, nh, head_dim, 1.0f);
}

void kc_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int head_dim) {
    rope_apply(dx, cos_t, sin_t, B, T, nh, head_dim, -1.0f);
}
