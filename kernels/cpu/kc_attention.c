/* Causal scaled-dot-product attention with grouped KV heads (GQA).
 *
 * Forward: each (batch, head, query row) is independent; keys are visited in blocks of
 * KC_ATTN_BLOCK with a running max and sum (online softmax), so no T x T matrix is stored.
 * The logsumexp of every row is saved; the backward recomputes the probabilities
 * p_ij = exp(s_ij - lse_i) from q and k (FlashAttention-style recomputation) and uses
 * D_i = dO_i . O_i, so memory stays O(T) per head. */
#include "kernels/cpu/kc.h"

#include <math.h>
#include <string.h>

#define KC_ATTN_BLOCK 64

static int check_shape(int B, int T, int H, int KV, int hd, fsdp_err *err) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "attention: sizes must be positive (B %d, T %d, H %d, KV %d, hd %d)",
                            B, T, H, KV, hd);
    if (H % KV != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "attention: n_heads %d is not a multiple of n_kv_heads %d", H, KV);
    if (hd > KC_ATTN_MAX_HEAD_DIM)
        return fsdp_err_set(err, FSDP_E_INVALID, "attention: head_dim %d exceeds the supported maximum %d", hd,
                            KC_ATTN_MAX_HEAD_DIM);
    return FSDP_OK;
}

static inline float dotf(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

int kc_attention_forward(const float *q, const float *k, const float *v, float *out, float *lse, int B, int T,
                         int H, int KV, int hd, fsdp_err *err) {
    int rc = check_shape(B, T, H, KV, hd, err);
    if (rc) return rc;
    const int rep = H / KV;
    const float sq = (float)sqrt((double)hd); /* scores are (q.k) / sqrt(hd), as the reference */
    const int64_t rows = (int64_t)B * H * T;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        const int i = (int)(r % T);
        const int h = (int)((r / T) % H);
        const int b = (int)(r / ((int64_t)T * H));
        const int kvh = h / rep;
        const float *qi = q + (((size_t)b * T + i) * H + h) * (size_t)hd;
        float acc[KC_ATTN_MAX_HEAD_DIM];
        float s[KC_ATTN_BLOCK];
        for (int d = 0; d < hd; d++) acc[d] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        for (int j0 = 0; j0 <= i; j0 += KC_ATTN_BLOCK) {
            int j1 = j0 + KC_ATTN_BLOCK < i + 1 ? j0 + KC_ATTN_BLOCK : i + 1;
            float bm = -INFINITY;
            for (int j = j0; j < j1; j++) {
                const float *kj = k + (((size_t)b * T + j) * KV + kvh) * (size_t)hd;
                s[j - j0] = dotf(qi, kj, hd) / sq;
                if (s[j - j0] > bm) bm = s[j - j0];
            }
            if (bm > m) {
                float corr = expf(m - bm); /* 0 on the first block */
                l *= corr;
                for (int d = 0; d < hd; d++) acc[d] *= corr;
                m = bm;
            }
            for (int j = j0; j < j1; j++) {
                const float *vj = v + (((size_t)b * T + j) * KV + kvh) * (size_t)hd;
                float p = expf(s[j - j0] - m);
                l += p;
                for (int d = 0; d < hd; d++) acc[d] += p * vj[d];
            }
        }
        float *oi = out + (((size_t)b * T + i) * H + h) * (size_t)hd;
        for (int d = 0; d < hd; d++) oi[d] = acc[d] / l;
        lse[((size_t)b * H + h) * T + i] = m + logf(l);
    }
    return FSDP_OK;
}

int kc_attention_backward(const float *q, const float *k, const float *v, const float *out, const float *lse,
                          const float *dout, float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd,
                          fsdp_err *err) {
    int rc = check_shape(B, T, H, KV, hd, err);
    if (rc) return rc;
    const int rep = H / KV;
    const float sq = (float)sqrt((double)hd);
    const int tasks = B * KV;
    /* One task per (batch, kv head): every query head of the group writes the same dk/dv rows. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < tasks; task++) {
        const int b = task / KV, kvh = task % KV;
        for (int t = 0; t < T; t++) {
            size_t off = (((size_t)b * T + t) * KV + kvh) * (size_t)hd;
            memset(dk + off, 0, (size_t)hd * sizeof(float));
            memset(dv + off, 0, (size_t)hd * sizeof(float));
        }
        float dqa[KC_ATTN_MAX_HEAD_DIM];
        for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
            for (int i = 0; i < T; i++) {
                size_t qoff = (((size_t)b * T + i) * H + h) * (size_t)hd;
                const float *qi = q + qoff, *oi = out + qoff, *doi = dout + qoff;
                const float li = lse[((size_t)b * H + h) * T + i];
                const float Di = dotf(doi, oi, hd);
                for (int d = 0; d < hd; d++) dqa[d] = 0.0f;
                for (int j = 0; j <= i; j++) {
                    size_t koff = (((size_t)b * T + j) * KV + kvh) * (size_t)hd;
                    const float *kj = k + koff, *vj = v + koff;
                    float p = expf(dotf(qi, kj, hd) / sq - li);
                    float ds = p * (dotf(doi, vj, hd) - Di);
                    float dss = ds / sq;
                    float *dkj = dk + koff, *dvj = dv + koff;
                    for (int d = 0; d < hd; d++) {
                        dqa[d] += ds * kj[d];
                        dkj[d] += dss * qi[d];
                        dvj[d] += p * doi[d];
                    }
                }
                float *dqi = dq + qoff;
                for (int d = 0; d < hd; d++) dqi[d] = dqa[d] / sq;
            }
        }
    }
    return FSDP_OK;
}
