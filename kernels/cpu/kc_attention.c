/* Causal scaled-dot-product attention with grouped KV heads (GQA), on GEMMs.
 *
 * For every (batch, head) and block of up to KC_ATTN_QBLOCK query rows [i0, i1), only keys
 * [0, i1) can be attended to (causal), so the block's scores S = Q K^T are one GEMM of
 * rows x i1. The softmax runs row-parallel; then out = P V is another GEMM. The forward keeps
 * only the logsumexp per row; the backward recomputes P = exp(s - lse) from a fresh Q K^T and uses
 *   dP = dO V^T,  D_i = dO_i . O_i,  dS = P * (dP - D) / sqrt(hd),
 *   dQ = dS K,    dK += dS^T Q,      dV += P^T dO
 * (FlashAttention's recomputation). dK and dV of a kv head gather every query head of its group. */
#include "kernels/cpu/kc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int check_shape(int B, int T, int H, int KV, int hd, fsdp_err *err) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "attention: sizes must be positive (B %d, T %d, H %d, KV %d, hd %d)",
                            B, T, H, KV, hd);
    if (H % KV != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "attention: n_heads %d is not a multiple of n_kv_heads %d", H, KV);
    if ((int64_t)H * hd > INT32_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "attention: n_heads*head_dim %lld does not fit in int",
                            (long long)H * hd);
    return FSDP_OK;
}

static float *alloc_scratch(int T, int nbuf, fsdp_err *err) {
    size_t qb = (size_t)(T < KC_ATTN_QBLOCK ? T : KC_ATTN_QBLOCK);
    size_t n = qb * (size_t)T * (size_t)nbuf; /* <= 2*128*INT_MAX: no overflow in 64-bit size_t */
    float *p = malloc(n * sizeof(float));
    if (!p) fsdp_err_set(err, FSDP_E_NOMEM, "attention: cannot allocate %zu bytes of scratch for T %d", n * 4, T);
    return p;
}

int kc_attention_forward(const float *q, const float *k, const float *v, float *out, float *lse, int B, int T,
                         int H, int KV, int hd, kc_stats *st, fsdp_err *err) {
    int rc = check_shape(B, T, H, KV, hd, err);
    if (rc) return rc;
    float *P = alloc_scratch(T, 1, err);
    if (!P) return FSDP_E_NOMEM;
    const int rep = H / KV, ldq = H * hd, ldk = KV * hd, qb = T < KC_ATTN_QBLOCK ? T : KC_ATTN_QBLOCK;
    const float sq = (float)sqrt((double)hd); /* scores are (q.k) / sqrt(hd), as the reference */
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *kb = k + (size_t)b * T * ldk + (size_t)(h / rep) * hd;
            const float *vb = v + (size_t)b * T * ldk + (size_t)(h / rep) * hd;
            float *lse_bh = lse + ((size_t)b * H + h) * T;
            for (int i0 = 0; i0 < T; i0 += qb) {
                const int rows = T - i0 < qb ? T - i0 : qb, nk = i0 + rows;
                size_t qoff = ((size_t)b * T + i0) * ldq + (size_t)h * hd;
                kc_gemm(0, 1, rows, nk, hd, q + qoff, ldq, kb, ldk, 0.0f, P, nk, st);
#pragma omp parallel for schedule(static)
                for (int r = 0; r < rows; r++) {
                    const int i = i0 + r;
                    float *pr = P + (size_t)r * nk;
                    float m = -INFINITY;
                    for (int j = 0; j <= i; j++) {
                        pr[j] = pr[j] / sq;
                        m = pr[j] > m ? pr[j] : m;
                    }
                    float sum = 0.0f;
                    for (int j = 0; j <= i; j++) {
                        pr[j] = expf(pr[j] - m);
                        sum += pr[j];
                    }
                    for (int j = 0; j <= i; j++) pr[j] = pr[j] / sum;
                    for (int j = i + 1; j < nk; j++) pr[j] = 0.0f;
                    lse_bh[i] = m + logf(sum);
                }
                kc_gemm(0, 0, rows, hd, nk, P, nk, vb, ldk, 0.0f, out + qoff, ldq, st);
            }
        }
    }
    free(P);
    return FSDP_OK;
}

int kc_attention_backward(const float *q, const float *k, const float *v, const float *out, const float *lse,
                          const float *dout, float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd,
                          kc_stats *st, fsdp_err *err) {
    int rc = check_shape(B, T, H, KV, hd, err);
    if (rc) return rc;
    float *P = alloc_scratch(T, 2, err);
    if (!P) return FSDP_E_NOMEM;
    const int rep = H / KV, ldq = H * hd, ldk = KV * hd, qb = T < KC_ATTN_QBLOCK ? T : KC_ATTN_QBLOCK;
    float *dS = P + (size_t)qb * T;
    const float sq = (float)sqrt((double)hd);
    memset(dk, 0, (size_t)B * T * ldk * sizeof(float));
    memset(dv, 0, (size_t)B * T * ldk * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t kvoff = (size_t)b * T * ldk + (size_t)(h / rep) * hd;
            const float *lse_bh = lse + ((size_t)b * H + h) * T;
            for (int i0 = 0; i0 < T; i0 += qb) {
                const int rows = T - i0 < qb ? T - i0 : qb, nk = i0 + rows;
                size_t qoff = ((size_t)b * T + i0) * ldq + (size_t)h * hd;
                kc_gemm(0, 1, rows, nk, hd, q + qoff, ldq, k + kvoff, ldk, 0.0f, P, nk, st);
                kc_gemm(0, 1, rows, nk, hd, dout + qoff, ldq, v + kvoff, ldk, 0.0f, dS, nk, st);
#pragma omp parallel for schedule(static)
                for (int r = 0; r < rows; r++) {
                    const int i = i0 + r;
                    const float *oi = out + qoff + (size_t)r * ldq, *doi = dout + qoff + (size_t)r * ldq;
                    float Di = 0.0f;
                    for (int d = 0; d < hd; d++) Di += doi[d] * oi[d];
                    float *pr = P + (size_t)r * nk, *dr = dS + (size_t)r * nk;
                    const float li = lse_bh[i];
                    for (int j = 0; j <= i; j++) {
                        float p = expf(pr[j] / sq - li);
                        pr[j] = p;
                        dr[j] = p * (dr[j] - Di) / sq;
                    }
                    for (int j = i + 1; j < nk; j++) pr[j] = dr[j] = 0.0f;
                }
                kc_gemm(0, 0, rows, hd, nk, dS, nk, k + kvoff, ldk, 0.0f, dq + qoff, ldq, st);
                kc_gemm(1, 0, nk, hd, rows, dS, nk, q + qoff, ldq, 1.0f, dk + kvoff, ldk, st);
                kc_gemm(1, 0, nk, hd, rows, P, nk, dout + qoff, ldq, 1.0f, dv + kvoff, ldk, st);
            }
        }
    }
    free(P);
    return FSDP_OK;
}
