/* Cross-entropy fused with softmax (mean over kept tokens is taken by the caller). */
#include "kernels/cpu/kc.h"

#include <math.h>

int kc_xent_forward(const float *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index, float *lse,
                    double *loss_sum, int64_t *n_valid, fsdp_err *err) {
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] == ignore_index) continue;
        if (labels[i] < 0 || labels[i] >= vocab)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "cross-entropy: label %lld is %d, expected 0 <= label < vocab %d or ignore_index %d",
                                (long long)i, (int)labels[i], vocab, ignore_index);
        kept++;
    }
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] == ignore_index) {
            lse[i] = 0.0f;
            continue;
        }
        const float *x = logits + (size_t)i * (size_t)vocab;
        float mx = x[0];
        for (int j = 1; j < vocab; j++) mx = x[j] > mx ? x[j] : mx;
        double s = 0.0;
        for (int j = 0; j < vocab; j++) s += (double)expf(x[j] - mx);
        double l = (double)mx + log(s);
        lse[i] = (float)l;
        total += l - (double)x[labels[i]];
    }
    *loss_sum = total;
    *n_valid = kept;
    return FSDP_OK;
}

void kc_xent_backward(const float *logits, const int32_t *labels, const float *lse, float *dlogits, int64_t n,
                      int vocab, int ignore_index, float scale) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * (size_t)vocab;
        float *d = dlogits + (size_t)i * (size_t)vocab;
        if (labels[i] == ignore_index) {
            for (int j = 0; j < vocab; j++) d[j] = 0.0f;
            continue;
        }
        float l = lse[i];
        for (int j = 0; j < vocab; j++) d[j] = expf(x[j] - l) * scale;
        d[labels[i]] -= scale;
    }
}
