/* The decoder family's forward and backward on the GPU: the call sequence of decoder/decoder_fwd.c and decoder/decoder_bwd.c
 * with kcu_ kernels and dev_linear_* GEMMs on the compute stream. */
#include "decoder/decoder_cuda_internal.h"

#include <string.h>

#include "runtime/device_gemm.h"

/* Stops at the first failing call, prefixing where it happened. */
#define TRY(call, ...)                                              \
    do {                                                            \
        int try_rc_ = (call);                                       \
        if (try_rc_) return err ? fsdp_err_prefix(err, __VA_ARGS__) : try_rc_; \
    } while (0)

/* ---- forward ------------------------------------------------------------------------------------- */

int decoder_cuda_fwd_embed(const decoder_config *c, const void *tok_embeddings, const int32_t *tokens,
                         const int32_t *labels, int B, int T, decoder_cuda_ws *ws, fsdp_err *err) {
    int rc = decoder_cuda_ws_check(c, ws, "decoder (cuda) forward (embedding)", err);
    if (rc) return rc;
    if (B <= 0 || T <= 0 || B > ws->B_max || T > ws->T_max)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) forward: batch %d x %d does not fit the workspace (at most %d x %d)", B, T,
                            ws->B_max, ws->T_max);
    if (!tokens || !tok_embeddings)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) forward: no input_ids or embedding weights");
    const int64_t n = (int64_t)B * T;
    ws->phase = DECODER_CUDA_EMPTY;
    /* the ids are checked on the host, where they are (the kernels would only flag them) */
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "decoder (cuda) forward: input_ids: token %lld is %d, expected 0 <= id < vocab %d",
                                (long long)i, (int)tokens[i], c->vocab_size);
    int64_t kept = 0;
    if (labels) {
        for (int64_t i = 0; i < n; i++) {
            if (labels[i] == DECODER_MODEL_IGNORE_INDEX) continue;
            if (labels[i] < 0 || labels[i] >= c->vocab_size)
                return fsdp_err_set(err, FSDP_E_INVALID,
                                    "decoder (cuda) forward: labels: label %lld is %d, expected 0 <= label < vocab %d or "
                                    "ignore_index %d",
                                    (long long)i, (int)labels[i], c->vocab_size, DECODER_MODEL_IGNORE_INDEX);
            kept++;
        }
    }
    const size_t tok_bytes = (size_t)n * sizeof(int32_t);
    TRY(dev_copy_h2d(ws->d, ws->tokens, tokens, tok_bytes, DEV_STREAM_COMPUTE, err), "decoder (cuda) forward: input_ids");
    if (labels)
        TRY(dev_copy_h2d(ws->d, ws->labels, labels, tok_bytes, DEV_STREAM_COMPUTE, err), "decoder (cuda) forward: labels");
    TRY(kcu_embedding_forward(ws->dt, tok_embeddings, ws->tokens, ws->acts[0].x, n, c->vocab_size, c->dim, NULL,
                              ws->s, err),
        "decoder (cuda) forward: embedding");
    ws->has_labels = labels != NULL;
    ws->n_valid = kept;
    ws->B = B;
    ws->T = T;
    ws->phase = DECODER_CUDA_FWD;
    ws->fwd_next = 0;
    memset(&ws->loss, 0, sizeof ws->loss);
    return decoder_cuda_moe_reset(ws, err);
}

/* The layer's forward from acts[layer].x (also the recomputation of full activation checkpointing). */
static int layer_forward(const decoder_config *c, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                         fsdp_err *err) {
    const int B = ws->B, T = ws->T, n = B * T, d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim,
              F = c->ffn_hidden, qd = H * hd, kvd = KV * hd;
    const fsdp_dtype dt = ws->dt;
    decoder_cuda_acts *a = &ws->acts[layer];
    void *out = layer + 1 < c->n_layers ? ws->acts[layer + 1].x : ws->x_final;
    dev_ctx *dc = ws->d;
    kcu_stream s = ws->s;
    const float eps = (float)c->norm_eps;

    TRY(kcu_rmsnorm_forward(dt, a->x, lw->attention_norm, a->xn1, a->rstd1, n, d, eps, s, err),
        "decoder (cuda) forward: layer %d attention_norm", layer);
    /* with q/k norms the projections land in qr/kr and the per-head norms write q/k */
    void *qp = c->qk_norm ? a->qr : a->q, *kp = c->qk_norm ? a->kr : a->k;
    TRY(dev_linear_forward(dc, dt, a->xn1, lw->wq, qp, n, d, qd, err), "decoder (cuda) forward: layer %d wq", layer);
    TRY(dev_linear_forward(dc, dt, a->xn1, lw->wk, kp, n, d, kvd, err), "decoder (cuda) forward: layer %d wk", layer);
    TRY(dev_linear_forward(dc, dt, a->xn1, lw->wv, a->v, n, d, kvd, err), "decoder (cuda) forward: layer %d wv", layer);
    if (c->qkv_bias) {
        TRY(kcu_bias_forward(dt, qp, lw->wq_b, n, qd, s, err), "decoder (cuda) forward: layer %d wq bias", layer);
        TRY(kcu_bias_forward(dt, kp, lw->wk_b, n, kvd, s, err), "decoder (cuda) forward: layer %d wk bias", layer);
        TRY(kcu_bias_forward(dt, a->v, lw->wv_b, n, kvd, s, err), "decoder (cuda) forward: layer %d wv bias", layer);
    }
    if (c->qk_norm) { /* per head, or (qk_norm_full, OLMoE) over the whole projection */
        const int full = c->qk_norm_full;
        TRY(kcu_rmsnorm_forward(dt, a->qr, lw->q_norm, a->q, a->rstdq, full ? n : (int64_t)n * H, full ? qd : hd, eps,
                                s, err),
            "decoder (cuda) forward: layer %d q_norm", layer);
        TRY(kcu_rmsnorm_forward(dt, a->kr, lw->k_norm, a->k, a->rstdk, full ? n : (int64_t)n * KV, full ? kvd : hd, eps,
                                s, err),
            "decoder (cuda) forward: layer %d k_norm", layer);
    }
    TRY(kcu_rope_qk_forward(dt, a->q, a->k, ws->rope_cos, ws->rope_sin, B, T, H, KV, hd, s, err),
        "decoder (cuda) forward: layer %d rope", layer);
    TRY(kcu_attention_forward(dt, a->q, a->k, a->v, a->att, a->lse, B, T, H, KV, hd, s, err),
        "decoder (cuda) forward: layer %d attention", layer);
    /* h = x + wo(att): the residual add in the GEMM's epilogue */
    TRY(dev_linear_forward_residual(dc, dt, a->att, lw->wo, a->x, a->h, n, qd, d, err),
        "decoder (cuda) forward: layer %d wo", layer);

    TRY(kcu_rmsnorm_forward(dt, a->h, lw->ffn_norm, a->xn2, a->rstd2, n, d, eps, s, err),
        "decoder (cuda) forward: layer %d ffn_norm", layer);
    if (decoder_layer_is_moe(c, layer)) return decoder_cuda_moe_forward(c, lw, layer, ws, out, err);
    TRY(dev_linear_forward(dc, dt, a->xn2, lw->w1, a->a, n, d, F, err), "decoder (cuda) forward: layer %d w1", layer);
    TRY(dev_linear_forward(dc, dt, a->xn2, lw->w3, a->b, n, d, F, err), "decoder (cuda) forward: layer %d w3", layer);
    TRY(kcu_swiglu_forward(dt, a->a, a->b, a->g, (int64_t)n * F, s, err), "decoder (cuda) forward: layer %d swiglu",
        layer);
    /* out = h + w2(g), likewise */
    TRY(dev_linear_forward_residual(dc, dt, a->g, lw->w2, a->h, out, n, F, d, err),
        "decoder (cuda) forward: layer %d w2", layer);
    return FSDP_OK;
}

int decoder_cuda_fwd_layer(const decoder_config *c, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                         fsdp_err *err) {
    int rc = decoder_cuda_ws_check(c, ws, "decoder (cuda) forward (layer)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_CUDA_FWD || ws->fwd_next != layer)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) forward: layer %d run out of order (expected layer %d)",
                            layer, ws->phase == DECODER_CUDA_FWD ? ws->fwd_next : -1);
    if (!lw) return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) forward: no weights for layer %d", layer);
    if ((rc = layer_forward(c, lw, layer, ws, err))) return rc;
    ws->fwd_next = layer + 1;
    return FSDP_OK;
}

int decoder_cuda_model_forward(const decoder_config *c, const decoder_cuda_weights *w, const int32_t *tokens,
                             const int32_t *labels, int B, int T, decoder_cuda_ws *ws, decoder_model_loss *loss,
                             fsdp_err *err) {
    if (!w || !c || w->n_layers != c->n_layers || !w->layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) forward: weights do not match the config's %d layers",
                            c ? c->n_layers : -1);
    int rc = decoder_cuda_fwd_embed(c, w->tok_embeddings, tokens, labels, B, T, ws, err);
    for (int l = 0; !rc && l < c->n_layers; l++) rc = decoder_cuda_fwd_layer(c, &w->layers[l], l, ws, err);
    if (!rc) rc = decoder_cuda_fwd_head(c, w->norm, w->output, ws, loss, err);
    return rc;
}

/* ---- backward ------------------------------------------------------------------------------------ */

/* After RoPE's backward: the gradients before the q/k norms (into zeroed dqr/dkr; the norms' weight
 * gradients accumulate) and the q/k/v bias gradients. *dq / *dk: the q/k gradients the projections'
 * backward reads. */
static int qk_pre_grads(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg, decoder_cuda_acts *a,
                        int layer, decoder_cuda_ws *ws, void **dq, void **dk, fsdp_err *err) {
    const int n = ws->B * ws->T, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, qd = H * hd, kvd = KV * hd;
    const fsdp_dtype dt = ws->dt;
    const size_t es = fsdp_dtype_size(dt);
    kcu_stream s = ws->s;
    if (c->qk_norm) {
        TRY(dev_memset0(ws->d, ws->dqr, (size_t)n * qd * es, DEV_STREAM_COMPUTE, err), "decoder (cuda) backward");
        TRY(dev_memset0(ws->d, ws->dkr, (size_t)n * kvd * es, DEV_STREAM_COMPUTE, err), "decoder (cuda) backward");
        const int full = c->qk_norm_full;
        TRY(kcu_rmsnorm_backward(dt, ws->dq, a->qr, lw->q_norm, a->rstdq, ws->dqr, lg->q_norm,
                                 full ? n : (int64_t)n * H, full ? qd : hd, s, err),
            "decoder (cuda) backward: layer %d q_norm", layer);
        TRY(kcu_rmsnorm_backward(dt, ws->dk, a->kr, lw->k_norm, a->rstdk, ws->dkr, lg->k_norm,
                                 full ? n : (int64_t)n * KV, full ? kvd : hd, s, err),
            "decoder (cuda) backward: layer %d k_norm", layer);
        *dq = ws->dqr;
        *dk = ws->dkr;
    }
    if (c->qkv_bias) {
        TRY(kcu_bias_backward(dt, *dq, lg->wq_b, n, qd, s, err), "decoder (cuda) backward: layer %d wq bias", layer);
        TRY(kcu_bias_backward(dt, *dk, lg->wk_b, n, kvd, s, err), "decoder (cuda) backward: layer %d wk bias", layer);
        TRY(kcu_bias_backward(dt, ws->dv, lg->wv_b, n, kvd, s, err), "decoder (cuda) backward: layer %d wv bias", layer);
    }
    return FSDP_OK;
}

/* The feed-forward block's backward: out = h + w2(g), so dres (d(out)) also flows unchanged into
 * d(h); ends with dres = d(h). sel: selective checkpointing recomputes g and the norm output right
 * before the weight gradients that read them. */
static int bwd_ffn(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg, int layer,
                   decoder_cuda_ws *ws, int sel, fsdp_err *err) {
    const int n = ws->B * ws->T, d = c->dim, F = c->ffn_hidden;
    const fsdp_dtype dt = ws->dt;
    decoder_cuda_acts *a = &ws->acts[layer];
    dev_ctx *dc = ws->d;
    kcu_stream s = ws->s;
    TRY(dev_linear_backward_input(dc, dt, ws->dres, lw->w2, ws->dg, n, F, d, 0.0f, err),
        "decoder (cuda) backward: layer %d w2", layer);
    if (sel) {
        /* g = silu(a)*b recomputed in the SwiGLU backward's pass, then w2's weight gradient */
        TRY(kcu_swiglu_backward_recompute(dt, a->a, a->b, ws->dg, ws->da, ws->db, a->g, (int64_t)n * F, s, err),
            "decoder (cuda) backward: layer %d swiglu", layer);
        TRY(dev_linear_backward_weight(dc, dt, ws->dres, a->g, lg->w2, n, F, d, err),
            "decoder (cuda) backward: layer %d w2", layer);
    } else {
        TRY(dev_linear_backward_weight(dc, dt, ws->dres, a->g, lg->w2, n, F, d, err),
            "decoder (cuda) backward: layer %d w2", layer);
        TRY(kcu_swiglu_backward(dt, a->a, a->b, ws->dg, ws->da, ws->db, (int64_t)n * F, s, err),
            "decoder (cuda) backward: layer %d swiglu", layer);
    }
    TRY(dev_linear_backward_input(dc, dt, ws->da, lw->w1, ws->dxn, n, d, F, 0.0f, err),
        "decoder (cuda) backward: layer %d w1", layer);
    TRY(dev_linear_backward_input(dc, dt, ws->db, lw->w3, ws->dxn, n, d, F, 1.0f, err),
        "decoder (cuda) backward: layer %d w3", layer);
    if (sel)
        TRY(kcu_rmsnorm_apply(dt, a->h, lw->ffn_norm, a->rstd2, a->xn2, n, d, s, err),
            "decoder (cuda) backward: layer %d ffn_norm recomputation", layer);
    TRY(dev_linear_backward_weight(dc, dt, ws->da, a->xn2, lg->w1, n, d, F, err), "decoder (cuda) backward: layer %d w1",
        layer);
    TRY(dev_linear_backward_weight(dc, dt, ws->db, a->xn2, lg->w3, n, d, F, err), "decoder (cuda) backward: layer %d w3",
        layer);
    TRY(kcu_rmsnorm_backward(dt, ws->dxn, a->h, lw->ffn_norm, a->rstd2, ws->dres, lg->ffn_norm, n, d, s, err),
        "decoder (cuda) backward: layer %d ffn_norm", layer);
    return FSDP_OK;
}

/* The attention block's backward: h = x + wo(att), so dres (d(h)) also flows unchanged into d(x);
 * ends with dres = d(x). sel: the attention norm's output is recomputed before the q/k/v weight
 * gradients. */
static int bwd_attention(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg, int layer,
                         decoder_cuda_ws *ws, int sel, fsdp_err *err) {
    const int B = ws->B, T = ws->T, n = B * T, d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim,
              qd = H * hd, kvd = KV * hd;
    const fsdp_dtype dt = ws->dt;
    decoder_cuda_acts *a = &ws->acts[layer];
    dev_ctx *dc = ws->d;
    kcu_stream s = ws->s;
    int rc;
    TRY(dev_linear_backward_input(dc, dt, ws->dres, lw->wo, ws->datt, n, qd, d, 0.0f, err),
        "decoder (cuda) backward: layer %d wo", layer);
    TRY(dev_linear_backward_weight(dc, dt, ws->dres, a->att, lg->wo, n, qd, d, err),
        "decoder (cuda) backward: layer %d wo", layer);
    TRY(kcu_attention_backward(dt, a->q, a->k, a->v, a->att, a->lse, ws->datt, ws->dq, ws->dk, ws->dv, B, T, H, KV, hd,
                               ws->attn_scratch, s, err),
        "decoder (cuda) backward: layer %d attention", layer);
    TRY(kcu_rope_qk_backward(dt, ws->dq, ws->dk, ws->rope_cos, ws->rope_sin, B, T, H, KV, hd, s, err),
        "decoder (cuda) backward: layer %d rope", layer);
    void *dq = ws->dq, *dk = ws->dk;
    if ((rc = qk_pre_grads(c, lw, lg, a, layer, ws, &dq, &dk, err))) return rc;
    TRY(dev_linear_backward_input(dc, dt, dq, lw->wq, ws->dxn, n, d, qd, 0.0f, err),
        "decoder (cuda) backward: layer %d wq", layer);
    TRY(dev_linear_backward_input(dc, dt, dk, lw->wk, ws->dxn, n, d, kvd, 1.0f, err),
        "decoder (cuda) backward: layer %d wk", layer);
    TRY(dev_linear_backward_input(dc, dt, ws->dv, lw->wv, ws->dxn, n, d, kvd, 1.0f, err),
        "decoder (cuda) backward: layer %d wv", layer);
    if (sel)
        TRY(kcu_rmsnorm_apply(dt, a->x, lw->attention_norm, a->rstd1, a->xn1, n, d, s, err),
            "decoder (cuda) backward: layer %d attention_norm recomputation", layer);
    TRY(dev_linear_backward_weight(dc, dt, dq, a->xn1, lg->wq, n, d, qd, err), "decoder (cuda) backward: layer %d wq",
        layer);
    TRY(dev_linear_backward_weight(dc, dt, dk, a->xn1, lg->wk, n, d, kvd, err), "decoder (cuda) backward: layer %d wk",
        layer);
    TRY(dev_linear_backward_weight(dc, dt, ws->dv, a->xn1, lg->wv, n, d, kvd, err),
        "decoder (cuda) backward: layer %d wv", layer);
    TRY(kcu_rmsnorm_backward(dt, ws->dxn, a->x, lw->attention_norm, a->rstd1, ws->dres, lg->attention_norm, n, d, s,
                             err),
        "decoder (cuda) backward: layer %d attention_norm", layer);
    return FSDP_OK;
}

int decoder_cuda_bwd_layer(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg, int layer,
                         decoder_cuda_ws *ws, fsdp_err *err) {
    int rc = decoder_cuda_ws_check(c, ws, "decoder (cuda) backward (layer)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_CUDA_BWD || ws->bwd_next != layer)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) backward: layer %d run out of order (expected layer %d)",
                            layer, ws->phase == DECODER_CUDA_BWD ? ws->bwd_next : -1);
    if (!lw || !lg)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) backward: no weights or gradients for layer %d", layer);

    /* full activation checkpointing: the shared intermediates hold another layer's; recompute this
     * layer's from its saved input (same kernels, same values; the output it rewrites is no
     * longer needed by the backward). Selective checkpointing recomputes g and the norm outputs
     * below, right before the weight gradients that read them. */
    const int sel = ws->ac == DECODER_AC_SELECTIVE;
    if (ws->ac == DECODER_AC_FULL) {
        ws->recompute = 1;
        rc = layer_forward(c, lw, layer, ws, err);
        ws->recompute = 0;
        if (rc) return fsdp_err_prefix(err, "decoder (cuda) backward: layer %d recomputation", layer);
    }
    if (decoder_layer_is_moe(c, layer))
        rc = decoder_cuda_moe_backward(c, lw, lg, layer, ws, err);
    else
        rc = bwd_ffn(c, lw, lg, layer, ws, sel, err);
    if (rc) return rc;
    if ((rc = bwd_attention(c, lw, lg, layer, ws, sel, err))) return rc;

    ws->bwd_next = layer - 1;
    if (layer == 0) ws->phase = DECODER_CUDA_BWD_LAYERS;
    return FSDP_OK;
}

int decoder_cuda_bwd_embed(const decoder_config *c, float *d_tok_embeddings, decoder_cuda_ws *ws, fsdp_err *err) {
    int rc = decoder_cuda_ws_check(c, ws, "decoder (cuda) backward (embedding)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_CUDA_BWD_LAYERS)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) backward: embedding backward run before every layer's backward");
    TRY(kcu_embedding_backward(ws->dt, ws->dres, ws->tokens, d_tok_embeddings, (int64_t)ws->B * ws->T, c->vocab_size,
                               c->dim, decoder_padding_idx(c), NULL, ws->s, err),
        "decoder (cuda) backward: embedding");
    ws->phase = DECODER_CUDA_EMPTY;
    return FSDP_OK;
}

int decoder_cuda_model_backward(const decoder_config *c, const decoder_cuda_weights *w, decoder_model_weights *g,
                              double loss_denom, decoder_cuda_ws *ws, fsdp_err *err) {
    if (!c || !w || !g || w->n_layers != c->n_layers || g->n_layers != c->n_layers || !w->layers || !g->layers)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) backward: weights or gradients do not match the config's %d layers",
                            c ? c->n_layers : -1);
    int rc = decoder_cuda_bwd_head(c, w->norm, w->output, g->norm, g->output, loss_denom, ws, err);
    for (int l = c->n_layers - 1; !rc && l >= 0; l--)
        rc = decoder_cuda_bwd_layer(c, &w->layers[l], &g->layers[l], l, ws, err);
    if (!rc) rc = decoder_cuda_bwd_embed(c, g->tok_embeddings, ws, err);
    return rc;
}
