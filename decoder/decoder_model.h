/* The decoder family's forward and backward on given float32 weights, with the CPU kernels (kernels/cpu/kc.h).
 *
 * The math is torchtitan's llama3 (see ../shared/fixtures/torch-2.11/gen/refmodel.py):
 *   h   = x + wo(attn(rope(wq(n1)), rope(wk(n1)), wv(n1)))   with n1 = attention_norm(x)
 *   out = h + w2(silu(w1(n2)) * w3(n2))                        with n2 = ffn_norm(h)
 *   logits = output(norm(x_L)); loss = mean cross-entropy over tokens whose label != -100.
 *
 * The model is run piece by piece so that FSDP can gather one layer's weights right before its
 * forward or backward:
 *   decoder_fwd_embed -> decoder_fwd_layer(0..L-1) -> decoder_fwd_head
 *   decoder_bwd_head -> decoder_bwd_layer(L-1..0) -> decoder_bwd_embed
 * decoder_model_forward / decoder_model_backward run the whole sequence on full weights. The workspace
 * keeps the activations every backward piece needs and checks that the pieces come in this order.
 *
 * Gradients are ACCUMULATED (+=) into the gradient buffers (like PyTorch's .grad): zero them before
 * the first micro-batch of a step. */
#ifndef FSDP_DECODER_DECODER_MODEL_H
#define FSDP_DECODER_DECODER_MODEL_H

#include <stdint.h>

#include "fsdp/error.h"
#include "kernels/cpu/kc.h"
#include "decoder/decoder_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DECODER_MODEL_IGNORE_INDEX (-100)

/* One transformer block's parameters (torchtitan names under layers.{i}.). Also used for gradients.
 * The optional ones are NULL when the config has none (qkv_bias, qk_norm). */
typedef struct decoder_model_layer {
    float *wq;             /* attention.wq.weight       [H*hd, d] */
    float *wk;             /* attention.wk.weight       [KV*hd, d] */
    float *wv;             /* attention.wv.weight       [KV*hd, d] */
    float *wo;             /* attention.wo.weight       [d, H*hd] */
    float *w1;             /* feed_forward.w1.weight    [F, d] */
    float *w2;             /* feed_forward.w2.weight    [d, F] */
    float *w3;             /* feed_forward.w3.weight    [F, d] */
    float *attention_norm; /* attention_norm.weight     [d] */
    float *ffn_norm;       /* ffn_norm.weight           [d] */
    float *wq_b, *wk_b, *wv_b; /* attention.w{q,k,v}.bias [H*hd], [KV*hd], [KV*hd] (qkv_bias) */
    float *q_norm, *k_norm;    /* attention.{q,k}_norm.weight [hd] (qk_norm; [H*hd], [KV*hd] qk_norm_full) */
    /* a MoE layer (decoder_layer_is_moe) has these instead of w1, w2, w3 */
    float *ew1, *ew2, *ew3;    /* moe.experts.w1 [E, Fm, d], w2 [E, d, Fm], w3 [E, Fm, d] */
    float *router;             /* moe.router.gate.weight [E, d] */
} decoder_model_layer;

/* All parameters (or all gradients, or an optimizer moment) of the model. With tied embeddings
 * output == tok_embeddings: the head reads (and its gradient accumulates into) the same buffer. */
typedef struct decoder_model_weights {
    float *tok_embeddings; /* tok_embeddings.weight [V, d] */
    int n_layers;
    decoder_model_layer *layers; /* n_layers entries (owned when made by decoder_model_weights_bind) */
    float *norm;               /* norm.weight [d] */
    float *output;             /* output.weight [V, d], or tok_embeddings when tied */
} decoder_model_weights;

/* The pointer of a layer kind (decoder_params.h's decoder_param_kind) in l, NULL for a non-layer kind. */
float **decoder_model_layer_slot(decoder_model_layer *l, int kind);

/* Checks that cfg describes a model these kernels can run (positive sizes, H % KV == 0, even
 * head_dim, eps and theta > 0, valid rope scaling, GEMM sizes that fit in int, a parameter count
 * that fits in int64). Needs the derived fields head_dim and ffn_hidden to be set. */
int decoder_model_check(const decoder_config *cfg, fsdp_err *err);

/* ---- flat parameter layout ------------------------------------------------------------------
 * Parameters in the order of the parameter table (decoder_params.h, torchtitan's named_parameters()),
 * back to back: tok_embeddings, then each layer's block (wq, wk, wv, wo, w1, w2, w3,
 * attention_norm, ffn_norm, with the biases and q/k norms of the config where the table puts
 * them), then norm and output (none when tied). */
int64_t decoder_model_numel(const decoder_config *cfg);       /* all parameters; -1 on a bad config */
int64_t decoder_model_layer_numel(const decoder_config *cfg, int layer); /* layer `layer`'s block */
/* Points lw at layer `layer`'s block that starts at flat_layer. */
void decoder_model_layer_bind(const decoder_config *cfg, int layer, float *flat_layer, decoder_model_layer *lw);
/* Where parameter kind `kind` (decoder_params.h) starts in layer `layer`'s flat block, in elements; -1
 * when that layer has no such parameter. */
int64_t decoder_model_layer_offset(const decoder_config *cfg, int layer, int kind);
/* Points w at the whole flat layout (decoder_model_numel floats); allocates w->layers. */
int decoder_model_weights_bind(const decoder_config *cfg, float *flat, decoder_model_weights *w, fsdp_err *err);
/* Frees w->layers (not the data) and clears w. */
void decoder_model_weights_unbind(decoder_model_weights *w);

/* One parameter of a decoder_model_weights, by index in named_parameters() order. */
typedef struct decoder_model_param {
    char name[64]; /* "layers.0.attention.wq.weight" */
    int ndim;      /* 1, 2 or 3 */
    int64_t shape[3];
    int64_t numel;
    float *data;
} decoder_model_param;

int decoder_model_param_count(const decoder_config *cfg); /* the table's: 3 + 9 * n_layers for Llama 3 */
int decoder_model_param_at(const decoder_config *cfg, const decoder_model_weights *w, int index, decoder_model_param *out,
                         fsdp_err *err);

/* ---- workspace ----------------------------------------------------------------------------- */

/* Saved activations for batches up to B_max x T_max, the RoPE tables for T_max positions and the
 * backward scratch. Size per layer about BT*(4d + 2(H+KV)hd + 3F) floats, plus one head chunk of logits
 * (at most BT*V, see head_chunk_rows below). */
typedef struct decoder_model_ws decoder_model_ws;

/* Activation checkpointing: what each layer keeps from its forward for its backward.
 * - NONE: every activation below, per layer.
 * - FULL: only the layer's input x per layer; one set of intermediates is shared by all layers and
 *   the backward recomputes the layer's whole forward from x before differentiating it.
 * - SELECTIVE: per layer everything that is expensive to recompute -- the residual stream x and h,
 *   the norms' rstd, the GEMM outputs q and k (after RoPE), v, a = w1(.) and b = w3(.), and the
 *   attention output att with its logsumexp -- but not the cheap elementwise results: the RMSNorm
 *   outputs xn1 = attention_norm(x) and xn2 = ffn_norm(h) (one buffer shared by both norms and all
 *   layers) and SwiGLU's g = silu(a)*b (one buffer shared by all layers). The backward recomputes
 *   xn from x or h and the saved rstd (kc_rmsnorm_apply) and g from a and b (in the SwiGLU
 *   backward's own pass, kc_swiglu_backward_recompute) right before the weight gradients that
 *   read them: no GEMM and no attention is run twice.
 * The three give bit-identical results (the same kernels on the same inputs); the workspace is
 * largest with NONE and smallest with FULL. The values are those of train_fsdp_ac. */
typedef enum decoder_ac { DECODER_AC_NONE = 0, DECODER_AC_FULL = 1, DECODER_AC_SELECTIVE = 2 } decoder_ac;

decoder_model_ws *decoder_model_ws_create(const decoder_config *cfg, int B_max, int T_max, fsdp_err *err);
/* The same with activation checkpointing `ac` (a decoder_ac; another value is FSDP_E_INVALID). */
decoder_model_ws *decoder_model_ws_create_ac(const decoder_config *cfg, int B_max, int T_max, int ac, fsdp_err *err);
/* Output head in chunks (training memory): the head computes logits, cross-entropy and their
 * gradient head_chunk_rows rows at a time, so at most that many rows of logits exist at once.
 * head_chunk_rows 0: automatic, DECODER_HEAD_CHUNK_BYTES of logits per chunk; rows beyond the batch
 * mean one chunk (the whole [B*T, V] logits, as without chunking). */
#define DECODER_HEAD_CHUNK_BYTES ((size_t)256 << 20)
typedef struct decoder_model_ws_opts {
    int ac;              /* activation checkpointing mode (decoder_ac: none, full, selective) */
    int head_chunk_rows; /* >= 0; 0 = auto */
} decoder_model_ws_opts;
/* The rows per head chunk for a batch of `rows` rows, logits of elem_size bytes (head_chunk_rows
 * resolved as above; between 1 and rows). */
int decoder_head_chunk_resolve(const decoder_config *cfg, int64_t rows, int head_chunk_rows, size_t elem_size);
/* FSDP_E_INVALID (naming `what`) unless head_chunk_rows >= 0. */
int decoder_head_chunk_check(int64_t head_chunk_rows, const char *what, fsdp_err *err);
/* opts NULL: no checkpointing, automatic chunks. */
decoder_model_ws *decoder_model_ws_create_opts(const decoder_config *cfg, int B_max, int T_max,
                                           const decoder_model_ws_opts *opts, fsdp_err *err);
/* Bytes decoder_model_ws_create_opts allocates for B_max x T_max (activations, backward scratch, RoPE
 * tables, tokens and labels), without allocating; -1 when the sizes are invalid or overflow. For
 * checking a recipe against the host's memory before anything runs. */
int decoder_model_ws_size(const decoder_config *cfg, int B_max, int T_max, const decoder_model_ws_opts *opts,
                        size_t *bytes);
/* The rows per head chunk of this workspace (for B_max x T_max). */
int decoder_model_ws_head_chunk(const decoder_model_ws *ws);
void decoder_model_ws_free(decoder_model_ws *ws);
/* GEMM timing hook: every GEMM of the following calls adds to st (NULL turns it off). */
void decoder_model_ws_set_stats(decoder_model_ws *ws, kc_stats *st);
/* Logits [B*T, V] of the last decoder_fwd_head; NULL before it, after decoder_bwd_head (which
 * overwrites them with their gradient) and when the batch is larger than one head chunk (the
 * logits of the whole batch are never held then). */
const float *decoder_model_ws_logits(const decoder_model_ws *ws);
/* Bytes the workspace holds. */
size_t decoder_model_ws_bytes(const decoder_model_ws *ws);

typedef struct decoder_model_loss {
    double loss;     /* loss_sum / n_valid (0 when n_valid == 0) */
    double loss_sum; /* sum of per-token cross-entropy over tokens with label != -100 */
    int64_t n_valid; /* number of those tokens */
} decoder_model_loss;

/* ---- forward pieces ---------------------------------------------------------------------------
 * tokens and labels are [B, T] row-major int32 (copied into the workspace); labels may be NULL
 * (no loss, no backward); a label of -100 is ignored. B <= B_max, T <= T_max. */
int decoder_fwd_embed(const decoder_config *cfg, const float *tok_embeddings, const int32_t *tokens,
                    const int32_t *labels, int B, int T, decoder_model_ws *ws, fsdp_err *err);
int decoder_fwd_layer(const decoder_config *cfg, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                    fsdp_err *err);
/* Final norm, logits and (with labels) the loss, chunk by chunk (forward only: when the batch is
 * larger than a chunk, the logits are not kept and decoder_bwd_head computes them again). loss may
 * be NULL. */
int decoder_fwd_head(const decoder_config *cfg, const float *norm_w, const float *output_w, decoder_model_ws *ws,
                   decoder_model_loss *loss, fsdp_err *err);

/* ---- backward pieces (all accumulate into the given gradients) -------------------------------
 * The loss being differentiated is loss_sum / loss_denom; loss_denom <= 0 means the forward's
 * n_valid (the mean over this batch). Data-parallel callers pass the global token count. */
int decoder_bwd_head(const decoder_config *cfg, const float *norm_w, const float *output_w, float *d_norm,
                   float *d_output, double loss_denom, decoder_model_ws *ws, fsdp_err *err);
/* Training head in one pass, instead of decoder_fwd_head + decoder_bwd_head, after the last layer's
 * forward (labels needed): per chunk of rows, logits = xnf W_out^T, the loss and dlogits in place
 * (the scale 1/loss_denom is known before: loss_denom <= 0 means this batch's labelled tokens),
 * dxnf = dlogits W_out and d_output += dlogits^T xnf; then the final norm's backward. Same results
 * as the two calls (the chunks change only the order of the d_output and loss sums). loss may be
 * NULL. decoder_bwd_layer(L-1) follows. */
int decoder_head_train(const decoder_config *cfg, const float *norm_w, const float *output_w, float *d_norm,
                     float *d_output, double loss_denom, decoder_model_ws *ws, decoder_model_loss *loss, fsdp_err *err);
int decoder_bwd_layer(const decoder_config *cfg, const decoder_model_layer *lw, decoder_model_layer *lg, int layer,
                    decoder_model_ws *ws, fsdp_err *err);
int decoder_bwd_embed(const decoder_config *cfg, float *d_tok_embeddings, decoder_model_ws *ws, fsdp_err *err);

/* ---- mixture of experts: the load-balancing loss ------------------------------------------------
 * A model with experts keeps the routing statistics of its forward (every MoE layer's). After the
 * last layer's forward and before the first layer's backward, decoder_model_aux_stats gives them
 * (DECODER_MODEL_AUX_STATS(cfg) doubles: counts[E], probability sums[E], rows), the caller sums them over
 * the data-parallel ranks and decoder_model_aux_apply sets the loss's gradient (router_aux_coef x
 * scale) and returns its value (kc_moe_aux). Without it the backward takes no aux gradient. */
#define DECODER_MODEL_AUX_STATS(cfg) ((cfg)->n_experts > 0 ? 2 * (cfg)->n_experts + 1 : 0)
int decoder_model_aux_stats(const decoder_model_ws *ws, double *stats, fsdp_err *err);
int decoder_model_aux_apply(decoder_model_ws *ws, const double *sums, double scale, double *aux, fsdp_err *err);
/* Tokens each expert of MoE layer `layer` received in the last forward (counts[E]); FSDP_E_INVALID for a
 * dense layer or before a forward. */
int decoder_model_expert_load(const decoder_model_ws *ws, int layer, int64_t *counts, fsdp_err *err);
/* The experts MoE layer `layer` chose for each token of the last forward, top[B*T][top_k] in descending
 * probability; FSDP_E_INVALID for a dense layer, and under full activation checkpointing (the layers
 * share one set of routing buffers). */
int decoder_model_expert_choices(const decoder_model_ws *ws, int layer, int32_t *top, fsdp_err *err);

/* ---- whole model ------------------------------------------------------------------------------- */

int decoder_model_forward(const decoder_config *cfg, const decoder_model_weights *w, const int32_t *tokens,
                        const int32_t *labels, int B, int T, decoder_model_ws *ws, decoder_model_loss *loss,
                        fsdp_err *err);
/* Gradients of every parameter, accumulated into g (same layout as w). */
int decoder_model_backward(const decoder_config *cfg, const decoder_model_weights *w, decoder_model_weights *g,
                         double loss_denom, decoder_model_ws *ws, fsdp_err *err);
/* Training: forward and backward in one call, the head as decoder_head_train (each chunk's logits
 * computed once); the same results as decoder_model_forward + decoder_model_backward. */
int decoder_model_forward_backward(const decoder_config *cfg, const decoder_model_weights *w, decoder_model_weights *g,
                                 const int32_t *tokens, const int32_t *labels, int B, int T, double loss_denom,
                                 decoder_model_ws *ws, decoder_model_loss *loss, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
