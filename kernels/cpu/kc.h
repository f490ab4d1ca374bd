/* CPU reference kernels: float32, row-major, OpenMP across rows/heads, GEMM through OpenBLAS.
 *
 * Conventions shared by every kernel:
 * - "n" is the number of rows (tokens, B*T); "dim" the row length. Tensors are dense and C-ordered.
 * - Backward kernels say for each output whether they overwrite it or accumulate (+=) into it.
 * - Sizes are validated by the caller (the model checks its config and batch shape once); kernels
 *   that read data-dependent indices (token ids, labels) validate them and return an fsdp error.
 * - No kernel keeps state between calls. GEMM timing goes to a caller-owned kc_stats (NULL: off). */
#ifndef FSDP_KERNELS_CPU_KC_H
#define FSDP_KERNELS_CPU_KC_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- timing hook --------------------------------------------------------------------------- */

/* Counters filled by the GEMM wrappers when a kc_stats is passed (a NULL pointer costs one branch). */
typedef struct kc_stats {
    uint64_t gemm_calls;
    double gemm_seconds; /* wall time inside cblas_sgemm */
    double gemm_flops;   /* 2*M*N*K summed over calls */
} kc_stats;

void kc_stats_reset(kc_stats *st);
/* Monotonic wall clock in seconds (for benchmarks and the hook). */
double kc_now(void);

/* ---- GEMM ---------------------------------------------------------------------------------- */

/* Row-major C[M,N] = op(A) op(B) + beta*C through cblas_sgemm (op = transpose when trans_* != 0),
 * timed into st when it is not NULL. */
void kc_gemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
             float beta, float *C, int ldc, kc_stats *st);

/* ---- linear: y = x W^T, W [out, in] (PyTorch nn.Linear layout, no bias) ------------------- */

/* y[n,out] = x[n,in] W^T (overwrites y). */
void kc_linear_forward(const float *x, const float *w, float *y, int n, int in, int out, kc_stats *st);
/* dx[n,in] = beta*dx + dy[n,out] W (beta 0: overwrite, 1: accumulate). */
void kc_linear_backward_input(const float *dy, const float *w, float *dx, int n, int in, int out,
                              float beta, kc_stats *st);
/* dw[out,in] += dy^T x (always accumulates). */
void kc_linear_backward_weight(const float *dy, const float *x, float *dw, int n, int in, int out,
                               kc_stats *st);

/* ---- bias of a linear layer: y = x W^T + b ---------------------------------------------------- */

/* y[i,:] += b for every row i of y[n,out]. */
void kc_bias_forward(float *y, const float *b, int64_t n, int out);
/* db[j] += sum over rows of dy[:, j] (summed in double per column, always accumulates). */
void kc_bias_backward(const float *dy, float *db, int64_t n, int out);

/* ---- embedding ------------------------------------------------------------------------------ */

/* out[i,:] = table[tokens[i],:]. Fails (FSDP_E_INVALID) on a token outside [0, vocab). */
int kc_embedding_forward(const float *table, const int32_t *tokens, float *out, int64_t n, int vocab,
                         int dim, fsdp_err *err);
/* dtable[tokens[i],:] += dout[i,:] (scatter-add, accumulates) for every i with tokens[i] != padding_idx
 * (nn.Embedding's padding_idx: that row gets no gradient; -1: none). Same token check. */
int kc_embedding_backward(const float *dout, const int32_t *tokens, float *dtable, int64_t n, int vocab,
                          int dim, int padding_idx, fsdp_err *err);

/* ---- RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w ------------------------------------------- *
 * A per-head norm (Qwen3's q_norm / k_norm over head_dim) is the same kernel on [n*heads, head_dim]. */

/* Overwrites y[n,dim]; rstd[n] receives rsqrt(mean(x^2)+eps) for the backward. */
void kc_rmsnorm_forward(const float *x, const float *w, float *y, float *rstd, int64_t n, int dim, float eps);
/* y = (x * rstd[i]) * w with a saved rstd: the second half of kc_rmsnorm_forward, bit for bit
 * (selective activation checkpointing recomputes the norm output from x and rstd). */
void kc_rmsnorm_apply(const float *x, const float *w, const float *rstd, float *y, int64_t n, int dim);
/* dx[n,dim] += d/dx, dw[dim] += d/dw (both accumulate). */
void kc_rmsnorm_backward(const float *dy, const float *x, const float *w, const float *rstd, float *dx,
                         float *dw, int64_t n, int dim);

/* ---- RoPE on interleaved pairs (x[2j], x[2j+1]) --------------------------------------------- */

typedef struct kc_rope_params {
    double theta;
    int llama3_scaling; /* 0: none; 1: llama3.1 frequency scaling with the fields below */
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    double original_max_pos;
} kc_rope_params;

/* cos/sin tables [t_max, head_dim/2]: freq_j = 1/theta^(2j/head_dim) and angle t*freq_j computed in
 * double (scaled as llama3.1 when asked), then rounded to float. head_dim must be even. */
int kc_rope_tables(int head_dim, int t_max, const kc_rope_params *p, float *cos_out, float *sin_out,
                   fsdp_err *err);
/* In place on x [B, T, nh, head_dim], position of row (b,t) = t: rotation by +angle. */
void kc_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int head_dim);
/* In place on dx: rotation by -angle (the transpose of the forward rotation). */
void kc_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int head_dim);

/* ---- causal attention with GQA -------------------------------------------------------------- */

/* Query rows are processed in blocks of this many rows: scratch is 2 * KC_ATTN_QBLOCK * T floats. */
#define KC_ATTN_QBLOCK 64

/* q [B,T,H,hd], k/v [B,T,KV,hd], out [B,T,H,hd], lse [B,H,T] (logsumexp of each scaled score row).
 * Head h reads kv head h / (H/KV); scores are (q.k) / sqrt(hd) with a causal mask. For each head
 * and block of query rows, the scores against the keys up to the block's last row come from one
 * GEMM, the softmax runs row-parallel in float (max-subtracted), and out = P V is a second GEMM.
 * Only the logsumexp per row is kept (no T x T matrix): the backward recomputes P = exp(s - lse)
 * (FlashAttention-style recomputation). Scratch is allocated per call (FSDP_E_NOMEM on failure).
 * Fails on non-positive sizes or H % KV != 0. GEMMs are timed into st when it is not NULL. */
int kc_attention_forward(const float *q, const float *k, const float *v, float *out, float *lse, int B, int T,
                         int H, int KV, int hd, kc_stats *st, fsdp_err *err);
/* Overwrites dq [B,T,H,hd], dk and dv [B,T,KV,hd]. */
int kc_attention_backward(const float *q, const float *k, const float *v, const float *out, const float *lse,
                          const float *dout, float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd,
                          kc_stats *st, fsdp_err *err);

/* ---- SwiGLU: out = silu(a) * b ---------------------------------------------------------------- */

void kc_swiglu_forward(const float *a, const float *b, float *out, int64_t n);
/* Overwrites da and db. */
void kc_swiglu_backward(const float *a, const float *b, const float *dout, float *da, float *db, int64_t n);
/* kc_swiglu_backward that also rewrites out = silu(a) * b with kc_swiglu_forward's operations (bit for
 * bit): selective activation checkpointing recomputes the product in the same pass over a and b. */
void kc_swiglu_backward_recompute(const float *a, const float *b, const float *dout, float *da, float *db, float *out,
                                  int64_t n);

/* ---- cross-entropy fused with softmax --------------------------------------------------------- */

/* Per row: lse[i] = logsumexp(logits[i,:]); rows whose label == ignore_index are skipped (lse 0).
 * *loss_sum = sum over kept rows of lse - logit[label] (double), *n_valid = number of kept rows.
 * Fails (FSDP_E_INVALID) on a label outside [0, vocab) that is not ignore_index. */
int kc_xent_forward(const float *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index,
                    float *lse, double *loss_sum, int64_t *n_valid, fsdp_err *err);
/* dlogits = (softmax(logits) - onehot(label)) * scale for kept rows, 0 for ignored rows (overwrites;
 * dlogits may alias logits). scale is 1/N for a mean over N tokens. */
void kc_xent_backward(const float *logits, const int32_t *labels, const float *lse, float *dlogits, int64_t n,
                      int vocab, int ignore_index, float scale);

/* ---- optimizer --------------------------------------------------------------------------------- */

typedef struct kc_adamw_hparams {
    double lr;
    double beta1;
    double beta2;
    double eps;
    double weight_decay;
} kc_adamw_hparams;

/* torch.optim.AdamW (amsgrad=False, maximize=False) for float32 params: its update evaluated in double
 * from the float32 p, g, m, v, and p, m, v each rounded once to float (within half a float32 ulp of a
 * float64 AdamW step from the same state; torch's float32 path rounds each intermediate and its
 * float32 decay constant biases every weight); step is the step count after the increment (1 first). */
void kc_adamw_step(float *p, const float *g, float *m, float *v, int64_t n, const kc_adamw_hparams *h,
                   int64_t step);

/* Sum of squares in double (for the global gradient norm). */
double kc_sumsq(const float *x, int64_t n);
/* torch.nn.utils.clip_grad_norm_ coefficient: max_norm / (norm + 1e-6), clamped to at most 1. */
double kc_clip_coef(double total_norm, double max_norm);
/* x *= s. */
void kc_scale(float *x, int64_t n, float s);

#ifdef __cplusplus
}
#endif
#endif
