/* The mixture-of-experts feed-forward on the CPU (module prefix kc_moe_): a top-K softmax router and E
 * SwiGLU experts stored grouped, as torchtitan's GroupedExperts holds them, computed as a loop over the
 * experts, each on its own group of tokens through OpenBLAS.
 *
 * Shapes (n tokens of d features; E experts of width F; K experts per token):
 *   x       [n, d]      the input (the layer's ffn_norm output)
 *   router  [E, d]      the gate: logits = x router^T
 *   w1, w3  [E, F, d]   gate_proj and up_proj of every expert
 *   w2      [E, d, F]   down_proj of every expert
 *
 * Forward, the arithmetic of transformers' Qwen3-MoE / OLMoE / Mixtral:
 *   logits[t]  = x[t] router^T                          (float32)
 *   p[t]       = softmax(logits[t])                     (max subtracted, sums in float)
 *   top[t]     = the K largest p[t][e], in descending order (equal values: the lower expert first)
 *   w[t][k]    = p[t][top[t][k]], divided by sum_k p[t][top[t][k]] when norm_topk
 *   out[t]     = sum_k w[t][k] * w2_e (silu(w1_e x[t]) * (w3_e x[t])),  e = top[t][k]
 * The (token, k) pairs are sorted by expert with a stable counting sort (slot order: expert, then
 * token, then k), so an expert's rows are its tokens in increasing order and no result depends on how
 * the tokens were split across ranks. No capacity factor: no token is dropped.
 *
 * The load-balancing loss (Switch / transformers' load_balancing_loss_func) is a function of every MoE
 * layer's routing on every rank: kc_moe_stats adds one layer's counts and probability sums, the caller
 * sums them over the layers and ranks, and the backward takes the resulting constant gradient of the
 * loss with respect to each probability (kc_moe_aux below). */
#ifndef FSDP_KERNELS_CPU_KC_MOE_H
#define FSDP_KERNELS_CPU_KC_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "kernels/cpu/kc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kc_moe_dims {
    int n;         /* tokens */
    int d;         /* model width */
    int F;         /* expert width (moe_intermediate_size) */
    int E;         /* experts */
    int K;         /* experts per token, 1 <= K <= E */
    int norm_topk; /* renormalise the K chosen probabilities to sum to 1 */
} kc_moe_dims;

/* What the forward saves for the backward (all [rows, cols] row-major; nK = n*K). */
typedef struct kc_moe_acts {
    float *probs;     /* [n, E]  softmax of the router logits */
    int32_t *top;     /* [n, K]  chosen experts, descending probability */
    float *topw;      /* [n, K]  their weights (renormalised when norm_topk) */
    int32_t *slot_of; /* [nK]    pair t*K+k -> its slot in expert order */
    int32_t *pair_of; /* [nK]    slot -> pair t*K+k */
    int32_t *offsets; /* [E+1]   expert e's slots are offsets[e] .. offsets[e+1]-1 */
    float *xs;        /* [nK, d] the input rows in slot order */
    float *a, *b;     /* [nK, F] w1 and w3 outputs */
    float *g;         /* [nK, F] silu(a) * b */
    float *y;         /* [nK, d] expert outputs before the routing weight */
} kc_moe_acts;

/* Scratch of the backward, overwritten by every call. */
typedef struct kc_moe_scratch {
    float *dys;     /* [nK, d] */
    float *dg;      /* [nK, F] */
    float *da, *db; /* [nK, F] */
    float *dxs;     /* [nK, d] */
    float *dp;      /* [n, E] */
} kc_moe_scratch;

/* Floats of the saved activations (int32 arrays counted as one float each) and of the scratch. */
size_t kc_moe_acts_floats(const kc_moe_dims *m);
size_t kc_moe_scratch_floats(const kc_moe_dims *m);
/* Points a (or s) into `base`, which holds kc_moe_acts_floats (kc_moe_scratch_floats) floats. */
void kc_moe_acts_bind(const kc_moe_dims *m, float *base, kc_moe_acts *a);
void kc_moe_scratch_bind(const kc_moe_dims *m, float *base, kc_moe_scratch *s);

/* out[n, d] = the MoE feed-forward of x (overwritten); fills a. FSDP_E_INVALID on bad dims; FSDP_E_NUMERIC
 * on a router logit that is not finite (the error names the lowest such token). */
int kc_moe_forward(const kc_moe_dims *m, const float *x, const float *router, const float *w1, const float *w2,
                   const float *w3, kc_moe_acts *a, float *out, kc_stats *st, fsdp_err *err);

/* Adds this layer's routing statistics: counts[e] += number of (token, k) pairs routed to e,
 * psum[e] += sum over tokens of p[t][e]. */
void kc_moe_stats(const kc_moe_dims *m, const kc_moe_acts *a, double *counts, double *psum);

/* The Switch load-balancing loss over all MoE layers and ranks, from the summed statistics (rows =
 * the number of (layer, token) rows they cover: MoE layers x global tokens):
 *   aux = E * sum_e (counts[e] / rows) * (psum[e] / rows)
 * (transformers' load_balancing_loss_func with no attention mask: its tokens_per_expert summed over
 * the K slots times router_prob_per_expert). Its gradient with respect to every p[t][e] of every
 * layer is the constant E * counts[e] / rows^2; dp_aux[e] receives that times `scale` (the loss
 * coefficient over the number of micro-batches). Returns aux. */
double kc_moe_aux(int E, const double *counts, const double *psum, double rows, double scale, float *dp_aux);

/* Backward of kc_moe_forward for the loss whose gradient with respect to out is dout [n, d]:
 *   dx [n, d] overwritten; drouter, dw1, dw2, dw3 accumulated (+=);
 *   dp_aux [E] (may be NULL) is added to dL/dp[t][e] for every token (the load-balancing loss).
 * Routing choices are not differentiated (as in PyTorch: topk's indices carry no gradient). */
int kc_moe_backward(const kc_moe_dims *m, const float *dout, const float *x, const float *router, const float *w1,
                    const float *w2, const float *w3, const kc_moe_acts *a, const float *dp_aux, kc_moe_scratch *s,
                    float *dx, float *drouter, float *dw1, float *dw2, float *dw3, kc_stats *st, fsdp_err *err);

/* ---- the phases the two calls above run, for expert parallelism to move rows between them -------
 * kc_moe_forward = route, experts_forward (every expert, slot order), combine;
 * kc_moe_backward = combine_backward, experts_backward, router_backward. */

/* probs, top, topw, the sort (slot_of, pair_of, offsets) and xs (the input rows in slot order). */
int kc_moe_route(const kc_moe_dims *m, const float *x, const float *router, kc_moe_acts *a, kc_stats *st,
                 fsdp_err *err);
/* n_experts experts (w1, w3 [n_experts, F, d], w2 [n_experts, d, F]) on their rows offsets[e] ..
 * offsets[e+1]-1 of xs [rows, d]: a, b, g [rows, F] and y [rows, d] overwritten. */
void kc_moe_experts_forward(int n_experts, const int32_t *offsets, int d, int F, const float *xs, const float *w1,
                            const float *w2, const float *w3, float *a, float *b, float *g, float *y, kc_stats *st);
/* out[t] = sum_k topw[t][k] * a->y[slot of (t, k)] (overwritten). */
void kc_moe_combine(const kc_moe_dims *m, const kc_moe_acts *a, float *out);
/* From dout [n, d]: dys [nK, d] (slot order, overwritten) and dlogits [n, E] (overwritten), with dp_aux
 * (may be NULL) added to every dL/dp. */
void kc_moe_combine_backward(const kc_moe_dims *m, const kc_moe_acts *a, const float *dout, const float *dp_aux,
                             float *dys, float *dlogits);
/* The experts' backward on their rows: dg, da, db [rows, F] and dxs [rows, d] overwritten; dw1, dw2, dw3
 * accumulated. */
void kc_moe_experts_backward(int n_experts, const int32_t *offsets, int d, int F, const float *dys, const float *xs,
                             const float *w1, const float *w2, const float *w3, const float *a, const float *b,
                             const float *g, float *dg, float *da, float *db, float *dxs, float *dw1, float *dw2,
                             float *dw3, kc_stats *st);
/* dx [n, d] = dlogits router + each token's K rows of dxs (slot order) (overwritten); drouter += dlogits^T x. */
void kc_moe_router_backward(const kc_moe_dims *m, const kc_moe_acts *a, const float *dlogits, const float *dxs,
                            const float *x, const float *router, float *dx, float *drouter, kc_stats *st);

#ifdef __cplusplus
}
#endif
#endif
