/* CUDA kernels: the GPU counterparts of kernels/cpu/kc.h, callable from C.
 *
 * Conventions shared by every entry point:
 * - Pointers are device pointers; shapes, strides and the meaning of every output are those of the
 *   kc_ kernel of the same name (row-major, "n" rows of "dim" elements).
 * - Work is queued on `stream` (a cudaStream_t; NULL is the legacy default stream) of the current
 *   device; nothing is synchronised. A launch failure is FSDP_E_DEVICE naming the kernel and the
 *   CUDA error; a bad size or dtype is FSDP_E_INVALID. Errors of earlier asynchronous work may be
 *   reported by a later call or synchronisation.
 * - `dt` is the storage dtype of activations and weights: FSDP_DT_F32 or FSDP_DT_BF16. Arithmetic
 *   is float32 (double where the CPU kernel uses double); bf16 results are rounded to nearest even.
 *   Per-row statistics (rstd, lse) and weight gradients (dw, dtable, AdamW state) are float32.
 * - Data-dependent indices (token ids, labels) are never used out of range: a bad one leaves a zero
 *   contribution and, when `d_bad` (a device int) is not NULL, sets *d_bad to 1 + its row index
 *   (the caller zeroes it first and reads it back when it wants to check). Callers that have the
 *   ids on the host validate them there (kc_ kernels' checks).
 * In a build without CUDA every function fails with FSDP_E_DEVICE ("built without CUDA"). */
#ifndef FSDP_KERNELS_CUDA_KCU_H
#define FSDP_KERNELS_CUDA_KCU_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "kernels/cpu/kc.h"
#include "runtime/rng_math.h"

/* KCU_EMULATE (tests/kcu_emu.h): the host emulation declares these with C++ linkage, inside the
 * namespace that holds the emulated kernel sources. */
#if defined(__cplusplus) && !defined(KCU_EMULATE)
extern "C" {
#endif

typedef struct CUstream_st *kcu_stream; /* cudaStream_t */

/* ---- casts and elementwise -------------------------------------------------------------------- */

/* dst = src converted (f32 <-> bf16 with the bit-exact rounding of fsdp_f32_to_bf16, or a copy
 * when the dtypes are equal). */
int kcu_cast(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, int64_t n, kcu_stream stream,
             fsdp_err *err);
/* out = a + b (out may alias a or b). */
int kcu_add(fsdp_dtype dt, const void *a, const void *b, void *out, int64_t n, kcu_stream stream, fsdp_err *err);
/* acc[i] += x[i] in double (a running sum of device statistics). */
int kcu_acc_f64(double *acc, const double *x, int64_t n, kcu_stream stream, fsdp_err *err);
/* x *= s (float32). */
int kcu_scale(float *x, int64_t n, float s, kcu_stream stream, fsdp_err *err);
/* *d_out = sum of x[i]^2 accumulated in double (overwrites the one double at d_out). */
int kcu_sumsq(fsdp_dtype dt, const void *x, int64_t n, double *d_out, kcu_stream stream, fsdp_err *err);

/* ---- bias of a linear layer (Qwen2's q/k/v projections) ---------------------------------------- */

/* y[i,:] += b for every row of y [n, out]; y and b of dtype dt (one rounding per element). */
int kcu_bias_forward(fsdp_dtype dt, void *y, const void *b, int64_t n, int out, kcu_stream stream, fsdp_err *err);
/* db[j] += sum over the rows of dy[:, j] (float32 db; each column summed in double in row order,
 * kc_bias_backward's operations: the same bits from the same float32 dy). */
int kcu_bias_backward(fsdp_dtype dt, const void *dy, float *db, int64_t n, int out, kcu_stream stream, fsdp_err *err);

/* ---- embedding ---------------------------------------------------------------------------------- */

/* out[i,:] = table[tokens[i],:] (a bad token gives a zero row). */
int kcu_embedding_forward(fsdp_dtype dt, const void *table, const int32_t *tokens, void *out, int64_t n, int vocab,
                          int dim, int *d_bad, kcu_stream stream, fsdp_err *err);
/* dtable[tokens[i],:] += dout[i,:] (float32 dtable, atomic adds) for every tokens[i] != padding_idx (no
 * gradient into nn.Embedding's padding row; -1: none). */
int kcu_embedding_backward(fsdp_dtype dt, const void *dout, const int32_t *tokens, float *dtable, int64_t n,
                           int vocab, int dim, int padding_idx, int *d_bad, kcu_stream stream, fsdp_err *err);

/* ---- RMSNorm (a per-head norm, Qwen3's q_norm / k_norm, is the same kernel on [n*heads, head_dim]) -- */

/* y = x * rsqrt(mean(x^2) + eps) * w; rstd[n] (float32) for the backward. w has dtype dt. */
int kcu_rmsnorm_forward(fsdp_dtype dt, const void *x, const void *w, void *y, float *rstd, int64_t n, int dim,
                        float eps, kcu_stream stream, fsdp_err *err);
/* y = (x * rstd[row]) * w from a saved rstd: kcu_rmsnorm_forward's y bit for bit (kc_rmsnorm_apply;
 * selective activation checkpointing recomputes the norm outputs with it). */
int kcu_rmsnorm_apply(fsdp_dtype dt, const void *x, const void *w, const float *rstd, void *y, int64_t n, int dim,
                      kcu_stream stream, fsdp_err *err);
/* dx += d/dx (dtype dt), dw += d/dw (float32). */
int kcu_rmsnorm_backward(fsdp_dtype dt, const void *dy, const void *x, const void *w, const float *rstd, void *dx,
                         float *dw, int64_t n, int dim, kcu_stream stream, fsdp_err *err);

/* ---- RoPE: tables from kc_rope_tables (host, double) uploaded as float [T, head_dim/2] -------- */

int kcu_rope_forward(fsdp_dtype dt, void *x, const float *cos_t, const float *sin_t, int B, int T, int nh,
                     int head_dim, kcu_stream stream, fsdp_err *err);
int kcu_rope_backward(fsdp_dtype dt, void *dx, const float *cos_t, const float *sin_t, int B, int T, int nh,
                      int head_dim, kcu_stream stream, fsdp_err *err);
/* q [B,T,H,hd] and k [B,T,KV,hd] (or dq and dk) in one launch: the values of kcu_rope_forward /
 * kcu_rope_backward on each, bit for bit. */
int kcu_rope_qk_forward(fsdp_dtype dt, void *q, void *k, const float *cos_t, const float *sin_t, int B, int T, int H,
                        int KV, int head_dim, kcu_stream stream, fsdp_err *err);
int kcu_rope_qk_backward(fsdp_dtype dt, void *dq, void *dk, const float *cos_t, const float *sin_t, int B, int T,
                         int H, int KV, int head_dim, kcu_stream stream, fsdp_err *err);

/* ---- causal attention with GQA (fused, FlashAttention-style) ----------------------------------
 * q [B,T,H,hd], k/v [B,T,KV,hd], out [B,T,H,hd], lse [B,H,T] float32, as kc_attention_*. Scores
 * (q.k)/sqrt(hd) and the online softmax are float32 in registers and shared memory; no T x T matrix
 * is stored. The backward recomputes the probabilities from lse. hd <= 256, H % KV == 0.
 * Two implementations:
 * - KCU_ATTN_SIMT (kcu_attention.cu): every product in float32 on CUDA cores; any dtype and hd.
 * - KCU_ATTN_TC (kcu_attention_tc.cu): FlashAttention-2 on tensor cores, bf16 operands (Q, K, V, dO
 *   as stored; P and dS rounded to bf16) with float32 accumulation, for bf16 storage with hd 64 or
 *   128 and every tensor argument 16-byte aligned. dQ is a separate pass (no atomics, no extra
 *   scratch), so both are deterministic.
 * kcu_attention_forward/backward are KCU_ATTN_AUTO: TC when it applies, SIMT otherwise. */
#define KCU_ATTN_MAX_HEAD_DIM 256
typedef enum kcu_attn_impl { KCU_ATTN_AUTO = 0, KCU_ATTN_SIMT = 1, KCU_ATTN_TC = 2 } kcu_attn_impl;
/* 1 when KCU_ATTN_TC handles dtype dt and head_dim hd (alignment aside), 0 otherwise. */
int kcu_attention_tc_supported(fsdp_dtype dt, int hd);
/* As kcu_attention_forward/backward with the implementation chosen: KCU_ATTN_TC on a dtype, head_dim
 * or pointer alignment it does not handle is FSDP_E_INVALID (no fallback). */
int kcu_attention_forward_impl(kcu_attn_impl impl, fsdp_dtype dt, const void *q, const void *k, const void *v,
                               void *out, float *lse, int B, int T, int H, int KV, int hd, kcu_stream stream,
                               fsdp_err *err);
int kcu_attention_backward_impl(kcu_attn_impl impl, fsdp_dtype dt, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, const void *dout, void *dq, void *dk, void *dv,
                                int B, int T, int H, int KV, int hd, float *scratch, kcu_stream stream,
                                fsdp_err *err);
int kcu_attention_forward(fsdp_dtype dt, const void *q, const void *k, const void *v, void *out, float *lse, int B,
                          int T, int H, int KV, int hd, kcu_stream stream, fsdp_err *err);
/* Floats of scratch the backward needs (B*H*T: the row dots dO.O), for both implementations. */
size_t kcu_attention_scratch_floats(int B, int T, int H);
/* Overwrites dq, dk, dv (dtype dt). scratch: kcu_attention_scratch_floats floats of device memory. */
int kcu_attention_backward(fsdp_dtype dt, const void *q, const void *k, const void *v, const void *out,
                           const float *lse, const void *dout, void *dq, void *dk, void *dv, int B, int T, int H,
                           int KV, int hd, float *scratch, kcu_stream stream, fsdp_err *err);

/* ---- SwiGLU ------------------------------------------------------------------------------------- */

int kcu_swiglu_forward(fsdp_dtype dt, const void *a, const void *b, void *out, int64_t n, kcu_stream stream,
                       fsdp_err *err);
/* Overwrites da and db. */
int kcu_swiglu_backward(fsdp_dtype dt, const void *a, const void *b, const void *dout, void *da, void *db, int64_t n,
                        kcu_stream stream, fsdp_err *err);
/* The backward that also rewrites out = silu(a) * b, kcu_swiglu_forward's values bit for bit, in the
 * same pass (kc_swiglu_backward_recompute; selective activation checkpointing). */
int kcu_swiglu_backward_recompute(fsdp_dtype dt, const void *a, const void *b, const void *dout, void *da, void *db,
                                  void *out, int64_t n, kcu_stream stream, fsdp_err *err);

/* ---- cross-entropy fused with softmax ------------------------------------------------------------ */

/* lse[i] (float32, 0 for ignored rows); d_sums[0] = sum over kept rows of lse - logit[label] and
 * d_sums[1] = number of kept rows, both double, overwritten. */
int kcu_xent_forward(fsdp_dtype dt, const void *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index,
                     float *lse, double *d_sums, int *d_bad, kcu_stream stream, fsdp_err *err);
/* dlogits = (softmax - onehot) * scale on kept rows, 0 on ignored rows; may alias logits. */
int kcu_xent_backward(fsdp_dtype dt, const void *logits, const int32_t *labels, const float *lse, void *dlogits,
                      int64_t n, int vocab, int ignore_index, float scale, kcu_stream stream, fsdp_err *err);

/* One chunk of rows of the training head: xent_forward's lse and loss, ADDED to d_sums (zero it
 * before the first chunk), and when dlogits is not NULL xent_backward's gradient with the same
 * float lse (dlogits may alias logits: the chunk's logits become their gradient in place). The
 * results equal kcu_xent_forward followed by kcu_xent_backward. */
int kcu_xent_chunk(fsdp_dtype dt, const void *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index,
                   float scale, float *lse, double *d_sums, int *d_bad, void *dlogits, kcu_stream stream,
                   fsdp_err *err);

/* ---- multi-tensor optimizer ------------------------------------------------------------------------
 * A list of float32 shards (param, grad, exp_avg, exp_avg_sq) copied to the device once; every
 * AdamW step, gradient norm or gradient scaling over the whole list is one kernel launch. */
typedef struct kcu_tensor {
    float *p;  /* parameter shard */
    float *g;  /* its gradient */
    float *m;  /* exp_avg (may be NULL for a list used only for sumsq/scale) */
    float *v;  /* exp_avg_sq (idem) */
    int64_t n; /* elements (0 allowed) */
} kcu_tensor;

typedef struct kcu_tensor_list kcu_tensor_list;

/* Copies the descriptors to device memory (cudaMalloc; done once, outside the step loop). */
int kcu_tensor_list_create(const kcu_tensor *t, int count, kcu_tensor_list **out, fsdp_err *err);
void kcu_tensor_list_free(kcu_tensor_list *l);
/* torch.optim.AdamW on every tensor of the list, with kc_adamw_step's exact float operations
 * (needs m and v). step counts from 1. */
int kcu_adamw_step(const kcu_tensor_list *l, const kc_adamw_hparams *h, int64_t step, kcu_stream stream,
                   fsdp_err *err);
/* *d_out = sum over the list of sum(g^2) in double (overwritten). */
int kcu_list_grad_sumsq(const kcu_tensor_list *l, double *d_out, kcu_stream stream, fsdp_err *err);
/* g *= s over the list (clip_grad_norm_'s scaling; s from kc_clip_coef). */
int kcu_list_grad_scale(const kcu_tensor_list *l, float s, kcu_stream stream, fsdp_err *err);

/* Clipping without a host round trip. d_stats: device double[2] {loss sum, gradient sum of
 * squares}. One thread writes d_clip[0] = kc_clip_coef(sqrt(sumsq), max_norm) as a float (1 when
 * max_norm <= 0) and d_clip[1] = 1.0f when the loss sum or the norm is not finite (the step must
 * not update anything), 0.0f otherwise. */
int kcu_clip_coef(const double *d_stats, double max_norm, float *d_clip, kcu_stream stream, fsdp_err *err);
/* kcu_list_grad_scale by d_clip[0] read on the device, only where d_clip[0] < 1 and d_clip[1] == 0. */
int kcu_list_grad_scale_dev(const kcu_tensor_list *l, const float *d_clip, kcu_stream stream, fsdp_err *err);
/* kcu_adamw_step that changes nothing when d_clip[1] != 0 (a non-finite step); d_clip NULL: always. */
int kcu_adamw_step_guarded(const kcu_tensor_list *l, const kc_adamw_hparams *h, int64_t step, const float *d_clip,
                           kcu_stream stream, fsdp_err *err);

/* ---- parameter init ------------------------------------------------------------------------------- */

/* dst[k] = element start + k of the counter-based stream (seed, stream) under *dist, k = 0..n-1:
 * the functions of runtime/rng_math.h, so the bits equal rng_fill_dist's on the host. dist is
 * read on the host (passed by value to the kernel); dist->kind must be an rng_dist_kind. */
int kcu_init_fill(float *dst, const rng_dist *dist, uint64_t seed, uint64_t stream, uint64_t start, int64_t n,
                  kcu_stream s, fsdp_err *err);


/* ---- mixture of experts (kernels/cpu/kc_moe.h's arithmetic; kcu_moe.cu) --------------------------
 * n tokens, E experts (1 <= E <= KCU_MOE_MAX_EXPERTS), K experts per token (1 <= K <= E); a "pair" is
 * p = t*K + k, a "slot" its row in expert order. Router tensors are float32; x/xs/ys/out/dout/dys of
 * dtype dt. Every sum has a fixed order (no float atomics): results are deterministic. */
#define KCU_MOE_MAX_EXPERTS 1024

/* probs [n,E] = softmax(logits [n,E]) (max subtracted, float); top [n,K] the K most probable experts
 * in descending order (equal probabilities: the lower expert first); topw [n,K] their probabilities,
 * divided by their sum (added in k order) when norm_topk. A row with a non-finite logit gets probs 0,
 * top 0..K-1 and topw 0, and *d_bad (zeroed by the caller; may be NULL) becomes 1 + the LOWEST such
 * token (kc_moe_forward's error names that one). */
int kcu_moe_route(const float *logits, int64_t n, int E, int K, int norm_topk, float *probs, int32_t *top,
                  float *topw, int *d_bad, kcu_stream stream, fsdp_err *err);
/* Ints of scratch kcu_moe_sort needs: E counters per chunk of KCU_MOE_SORT_CHUNK pairs (at least one). */
#define KCU_MOE_SORT_CHUNK 64
static inline size_t kcu_moe_sort_scratch_ints(int64_t n, int E, int K) {
    if (n < 0 || E < 1 || K < 1) return 0;
    const int64_t chunks = (n * K + KCU_MOE_SORT_CHUNK - 1) / KCU_MOE_SORT_CHUNK;
    return (size_t)(chunks < 1 ? 1 : chunks) * (size_t)E;
}
/* The stable counting sort of the n*K pairs by expert (slot order: expert, token, k):
 * offsets [E+1] (expert e's slots are offsets[e] .. offsets[e+1]-1), slot_of [nK] (pair -> slot),
 * pair_of [nK] (slot -> pair). An expert outside 0..E-1 is sorted nowhere (slot_of -1, offsets[E] < nK)
 * and sets *d_bad to 1 + the pair. scratch: kcu_moe_sort_scratch_ints ints. */
int kcu_moe_sort(const int32_t *top, int64_t n, int E, int K, int32_t *offsets, int32_t *slot_of, int32_t *pair_of,
                 int32_t *scratch, int *d_bad, kcu_stream stream, fsdp_err *err);
/* xs[s, :] = x[pair_of[s] / K, :] for the n*K slots (rows of d elements). */
int kcu_moe_gather(fsdp_dtype dt, const void *x, const int32_t *pair_of, int64_t n, int K, int d, void *xs,
                   kcu_stream stream, fsdp_err *err);
/* out[t, :] = (accumulate ? out[t, :] : 0) + the sum over k in k order of w[t,k] * ys[slot_of[t*K+k], :],
 * in float; w NULL: weights 1 (the backward's dx += each token's expert input gradients). */
int kcu_moe_combine(fsdp_dtype dt, const void *ys, const float *w, const int32_t *slot_of, int64_t n, int K, int d,
                    int accumulate, void *out, kcu_stream stream, fsdp_err *err);
/* Backward of kcu_moe_combine with weights: dys[slot_of[p], :] = w[p] * dout[t, :] and
 * dw[p] = dout[t, :] . ys[slot_of[p], :] (float32), both overwritten. */
int kcu_moe_combine_backward(fsdp_dtype dt, const void *dout, const void *ys, const float *w, const int32_t *slot_of,
                             int64_t n, int K, int d, void *dys, float *dw, kcu_stream stream, fsdp_err *err);
/* dp [n,E] = dL/dprobs from dtopw [n,K] = dL/dtopw (through the renormalisation when norm_topk) plus
 * dp_aux [E] (may be NULL) on every token; dlogits [n,E] = the softmax backward of dp. Both
 * overwritten, float32. */
int kcu_moe_router_backward(const float *probs, const int32_t *top, const float *topw, const float *dtopw,
                            const float *dp_aux, int64_t n, int E, int K, int norm_topk, float *dp, float *dlogits,
                            kcu_stream stream, fsdp_err *err);
/* counts[e] += offsets[e+1] - offsets[e]; psum[e] += probs[t, e] for every token in order (double):
 * kc_moe_stats on the device, the same additions (bit-equal from equal probs). */
int kcu_moe_stats(const float *probs, const int32_t *offsets, int64_t n, int E, double *counts, double *psum,
                  kcu_stream stream, fsdp_err *err);

#if defined(__cplusplus) && !defined(KCU_EMULATE)
}
#endif
#endif
