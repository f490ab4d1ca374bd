/* The decoder family's backward on the CPU: one transformer block, embedding (the head is in decoder_head.c).
 * The gradient of the residual stream travels in ws->dres; parameter gradients accumulate. */
#include "decoder/decoder_model_internal.h"

#include <string.h>

/* The dense SwiGLU MLP's backward: dxn (overwritten) and w1/w2/w3's gradients from dres = d(out). */
static void dense_ffn_backward(const decoder_config *c, const decoder_model_layer *lw, decoder_model_layer *lg,
                               decoder_model_acts *a, decoder_model_ws *ws, int n, int sel) {
    const int d = c->dim, F = c->ffn_hidden;
    kc_stats *st = ws->stats;
    kc_linear_backward_input(ws->dres, lw->w2, ws->dg, n, F, d, 0.0f, st);
    if (sel) {
        /* g = silu(a)*b recomputed in the SwiGLU backward's pass, then w2's weight gradient */
        kc_swiglu_backward_recompute(a->a, a->b, ws->dg, ws->da, ws->db, a->g, (int64_t)n * F);
        kc_linear_backward_weight(ws->dres, a->g, lg->w2, n, F, d, st);
    } else {
        kc_linear_backward_weight(ws->dres, a->g, lg->w2, n, F, d, st);
        kc_swiglu_backward(a->a, a->b, ws->dg, ws->da, ws->db, (int64_t)n * F);
    }
    kc_linear_backward_input(ws->da, lw->w1, ws->dxn, n, d, F, 0.0f, st);
    kc_linear_backward_input(ws->db, lw->w3, ws->dxn, n, d, F, 1.0f, st);
    if (sel) kc_rmsnorm_apply(a->h, lw->ffn_norm, a->rstd2, a->xn2, n, d);
    kc_linear_backward_weight(ws->da, a->xn2, lg->w1, n, d, F, st);
    kc_linear_backward_weight(ws->db, a->xn2, lg->w3, n, d, F, st);
}

int decoder_bwd_layer(const decoder_config *c, const decoder_model_layer *lw, decoder_model_layer *lg, int layer,
                    decoder_model_ws *ws, fsdp_err *err) {
    int rc = decoder_model_ws_check(c, ws, "decoder backward (layer)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_PHASE_BWD || ws->bwd_next != layer)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder backward: layer %d run out of order (expected layer %d)",
                            layer, ws->phase == DECODER_PHASE_BWD ? ws->bwd_next : -1);
    const int B = ws->B, T = ws->T, n = B * T, d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim,
              qd = H * hd, kvd = KV * hd;
    decoder_model_acts *a = &ws->acts[layer];
    kc_stats *st = ws->stats;

    /* full activation checkpointing: the shared intermediates hold another layer's; recompute this
     * layer's from its saved input (the output it rewrites is no longer needed). Selective
     * checkpointing recomputes g and the norm outputs below, right before their use. */
    const int sel = ws->ac == DECODER_AC_SELECTIVE;
    if (ws->ac == DECODER_AC_FULL) {
        ws->recompute = 1;
        rc = decoder_fwd_layer_compute(c, lw, layer, ws, err);
        ws->recompute = 0;
        if (rc) return fsdp_err_prefix(err, "decoder backward: layer %d recomputation", layer);
    }

    /* out = h + ffn(xn2): dres is d(out); it also flows unchanged into d(h). */
    if (decoder_layer_is_moe(c, layer)) {
        if (sel) kc_rmsnorm_apply(a->h, lw->ffn_norm, a->rstd2, a->xn2, n, d);
        if ((rc = decoder_moe_backward(c, lw, lg, layer, ws, a->xn2, ws->dres, ws->dxn, err))) return rc;
    } else {
        dense_ffn_backward(c, lw, lg, a, ws, n, sel);
    }
    kc_rmsnorm_backward(ws->dxn, a->h, lw->ffn_norm, a->rstd2, ws->dres, lg->ffn_norm, n, d);

    /* h = x + wo(att): dres is now d(h); it flows unchanged into d(x). */
    kc_linear_backward_input(ws->dres, lw->wo, ws->datt, n, qd, d, 0.0f, st);
    kc_linear_backward_weight(ws->dres, a->att, lg->wo, n, qd, d, st);
    rc = kc_attention_backward(a->q, a->k, a->v, a->att, a->lse, ws->datt, ws->dq, ws->dk, ws->dv, B, T, H, KV, hd,
                               st, err);
    if (rc) return fsdp_err_prefix(err, "decoder backward: layer %d", layer);
    kc_rope_backward(ws->dq, ws->rope_cos, ws->rope_sin, B, T, H, hd);
    kc_rope_backward(ws->dk, ws->rope_cos, ws->rope_sin, B, T, KV, hd);
    /* q/k norms: the gradients before them (into zeroed dqr/dkr; the norms' weight gradients +=) */
    float *dq = ws->dq, *dk = ws->dk;
    if (c->qk_norm) {
        const int full = c->qk_norm_full;
        memset(ws->dqr, 0, (size_t)n * (size_t)qd * sizeof(float));
        memset(ws->dkr, 0, (size_t)n * (size_t)kvd * sizeof(float));
        kc_rmsnorm_backward(ws->dq, a->qr, lw->q_norm, a->rstdq, ws->dqr, lg->q_norm, full ? n : (int64_t)n * H,
                            full ? qd : hd);
        kc_rmsnorm_backward(ws->dk, a->kr, lw->k_norm, a->rstdk, ws->dkr, lg->k_norm, full ? n : (int64_t)n * KV,
                            full ? kvd : hd);
        dq = ws->dqr;
        dk = ws->dkr;
    }
    if (c->qkv_bias) {
        kc_bias_backward(dq, lg->wq_b, n, qd);
        kc_bias_backward(dk, lg->wk_b, n, kvd);
        kc_bias_backward(ws->dv, lg->wv_b, n, kvd);
    }
    kc_linear_backward_input(dq, lw->wq, ws->dxn, n, d, qd, 0.0f, st);
    kc_linear_backward_input(dk, lw->wk, ws->dxn, n, d, kvd, 1.0f, st);
    kc_linear_backward_input(ws->dv, lw->wv, ws->dxn, n, d, kvd, 1.0f, st);
    if (sel) kc_rmsnorm_apply(a->x, lw->attention_norm, a->rstd1, a->xn1, n, d);
    kc_linear_backward_weight(dq, a->xn1, lg->wq, n, d, qd, st);
    kc_linear_backward_weight(dk, a->xn1, lg->wk, n, d, kvd, st);
    kc_linear_backward_weight(ws->dv, a->xn1, lg->wv, n, d, kvd, st);
    kc_rmsnorm_backward(ws->dxn, a->x, lw->attention_norm, a->rstd1, ws->dres, lg->attention_norm, n, d);

    ws->bwd_next = layer - 1;
    if (layer == 0) ws->phase = DECODER_PHASE_BWD_LAYERS;
    return FSDP_OK;
}

int decoder_bwd_embed(const decoder_config *c, float *d_tok_embeddings, decoder_model_ws *ws, fsdp_err *err) {
    int rc = decoder_model_ws_check(c, ws, "decoder backward (embedding)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_PHASE_BWD_LAYERS)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder backward: embedding backward run before every layer's backward");
    rc = kc_embedding_backward(ws->dres, ws->tokens, d_tok_embeddings, (int64_t)ws->B * ws->T, c->vocab_size, c->dim,
                               decoder_padding_idx(c), err);
    if (rc) return fsdp_err_prefix(err, "decoder backward");
    ws->phase = DECODER_PHASE_EMPTY;
    return FSDP_OK;
}

int decoder_model_backward(const decoder_config *c, const decoder_model_weights *w, decoder_model_weights *g,
                         double loss_denom, decoder_model_ws *ws, fsdp_err *err) {
    if (!c || !w || !g || w->n_layers != c->n_layers || g->n_layers != c->n_layers || !w->layers || !g->layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder backward: weights or gradients do not match the config's %d layers",
                            c ? c->n_layers : -1);
    int rc = decoder_bwd_head(c, w->norm, w->output, g->norm, g->output, loss_denom, ws, err);
    for (int l = c->n_layers - 1; !rc && l >= 0; l--) rc = decoder_bwd_layer(c, &w->layers[l], &g->layers[l], l, ws, err);
    if (!rc) rc = decoder_bwd_embed(c, g->tok_embeddings, ws, err);
    return rc;
}

int decoder_model_forward_backward(const decoder_config *c, const decoder_model_weights *w, decoder_model_weights *g,
                                 const int32_t *tokens, const int32_t *labels, int B, int T, double loss_denom,
                                 decoder_model_ws *ws, decoder_model_loss *loss, fsdp_err *err) {
    if (!c || !w || !g || w->n_layers != c->n_layers || g->n_layers != c->n_layers || !w->layers || !g->layers)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder forward/backward: weights or gradients do not match the config's %d layers",
                            c ? c->n_layers : -1);
    if (!labels) return fsdp_err_set(err, FSDP_E_INVALID, "decoder forward/backward: no labels, there is no loss");
    int rc = decoder_fwd_embed(c, w->tok_embeddings, tokens, labels, B, T, ws, err);
    for (int l = 0; !rc && l < c->n_layers; l++) rc = decoder_fwd_layer(c, &w->layers[l], l, ws, err);
    if (!rc) rc = decoder_head_train(c, w->norm, w->output, g->norm, g->output, loss_denom, ws, loss, err);
    for (int l = c->n_layers - 1; !rc && l >= 0; l--) rc = decoder_bwd_layer(c, &w->layers[l], &g->layers[l], l, ws, err);
    if (!rc) rc = decoder_bwd_embed(c, g->tok_embeddings, ws, err);
    return rc;
}
