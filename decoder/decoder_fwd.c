/* The decoder family's forward on the CPU: embedding, one transformer block (the head is in decoder_head.c). */
#include "decoder/decoder_model_internal.h"

#include <string.h>

int decoder_fwd_embed(const decoder_config *c, const float *tok_embeddings, const int32_t *tokens,
                    const int32_t *labels, int B, int T, decoder_model_ws *ws, fsdp_err *err) {
    int rc = decoder_model_ws_check(c, ws, "decoder forward (embedding)", err);
    if (rc) return rc;
    if (B <= 0 || T <= 0 || B > ws->B_max || T > ws->T_max)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder forward: batch %d x %d does not fit the workspace (at most %d x %d)", B, T,
                            ws->B_max, ws->T_max);
    size_t n = (size_t)B * (size_t)T;
    ws->phase = DECODER_PHASE_EMPTY;
    rc = kc_embedding_forward(tok_embeddings, tokens, ws->acts[0].x, (int64_t)n, c->vocab_size, c->dim, err);
    if (rc) return fsdp_err_prefix(err, "decoder forward: input_ids");
    memcpy(ws->tokens, tokens, n * sizeof(int32_t));
    ws->has_labels = labels != NULL;
    if (labels) memcpy(ws->labels, labels, n * sizeof(int32_t));
    ws->B = B;
    ws->T = T;
    ws->phase = DECODER_PHASE_FWD;
    ws->fwd_next = 0;
    memset(&ws->loss, 0, sizeof ws->loss);
    decoder_moe_ws_reset(ws);
    return FSDP_OK;
}

int decoder_fwd_layer_compute(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                            fsdp_err *err) {
    int rc;
    const int B = ws->B, T = ws->T, n = B * T, d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim,
              F = c->ffn_hidden, qd = H * hd, kvd = KV * hd;
    decoder_model_acts *a = &ws->acts[layer];
    float *out = layer + 1 < c->n_layers ? ws->acts[layer + 1].x : ws->x_final;
    kc_stats *st = ws->stats;
    const float eps = (float)c->norm_eps;

    kc_rmsnorm_forward(a->x, lw->attention_norm, a->xn1, a->rstd1, n, d, eps);
    /* with q/k norms the projections land in qr/kr and the per-head norms write q/k */
    float *qp = c->qk_norm ? a->qr : a->q, *kp = c->qk_norm ? a->kr : a->k;
    kc_linear_forward(a->xn1, lw->wq, qp, n, d, qd, st);
    kc_linear_forward(a->xn1, lw->wk, kp, n, d, kvd, st);
    kc_linear_forward(a->xn1, lw->wv, a->v, n, d, kvd, st);
    if (c->qkv_bias) {
        kc_bias_forward(qp, lw->wq_b, n, qd);
        kc_bias_forward(kp, lw->wk_b, n, kvd);
        kc_bias_forward(a->v, lw->wv_b, n, kvd);
    }
    if (c->qk_norm && c->qk_norm_full) {
        kc_rmsnorm_forward(a->qr, lw->q_norm, a->q, a->rstdq, n, qd, eps);
        kc_rmsnorm_forward(a->kr, lw->k_norm, a->k, a->rstdk, n, kvd, eps);
    } else if (c->qk_norm) {
        kc_rmsnorm_forward(a->qr, lw->q_norm, a->q, a->rstdq, (int64_t)n * H, hd, eps);
        kc_rmsnorm_forward(a->kr, lw->k_norm, a->k, a->rstdk, (int64_t)n * KV, hd, eps);
    }
    kc_rope_forward(a->q, ws->rope_cos, ws->rope_sin, B, T, H, hd);
    kc_rope_forward(a->k, ws->rope_cos, ws->rope_sin, B, T, KV, hd);
    rc = kc_attention_forward(a->q, a->k, a->v, a->att, a->lse, B, T, H, KV, hd, st, err);
    if (rc) return fsdp_err_prefix(err, "decoder forward: layer %d", layer);
    kc_linear_forward(a->att, lw->wo, a->h, n, qd, d, st);
    size_t nd = (size_t)n * (size_t)d;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nd; i++) a->h[i] = a->x[i] + a->h[i];

    kc_rmsnorm_forward(a->h, lw->ffn_norm, a->xn2, a->rstd2, n, d, eps);
    if (decoder_layer_is_moe(c, layer)) {
        if ((rc = decoder_moe_forward(c, lw, layer, ws, a->xn2, out, err))) return rc;
    } else {
        kc_linear_forward(a->xn2, lw->w1, a->a, n, d, F, st);
        kc_linear_forward(a->xn2, lw->w3, a->b, n, d, F, st);
        kc_swiglu_forward(a->a, a->b, a->g, (int64_t)n * F);
        kc_linear_forward(a->g, lw->w2, out, n, F, d, st);
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nd; i++) out[i] = a->h[i] + out[i];
    return FSDP_OK;
}

int decoder_fwd_layer(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                    fsdp_err *err) {
    int rc = decoder_model_ws_check(c, ws, "decoder forward (layer)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_PHASE_FWD || ws->fwd_next != layer)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder forward: layer %d run out of order (expected layer %d)", layer,
                            ws->phase == DECODER_PHASE_FWD ? ws->fwd_next : -1);
    if ((rc = decoder_fwd_layer_compute(c, lw, layer, ws, err))) return rc;
    ws->fwd_next = layer + 1;
    return FSDP_OK;
}

int decoder_model_forward(const decoder_config *c, const decoder_model_weights *w, const int32_t *tokens,
                        const int32_t *labels, int B, int T, decoder_model_ws *ws, decoder_model_loss *loss,
                        fsdp_err *err) {
    if (!w || !c || w->n_layers != c->n_layers || !w->layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder forward: weights do not match the config's %d layers",
                            c ? c->n_layers : -1);
    int rc = decoder_fwd_embed(c, w->tok_embeddings, tokens, labels, B, T, ws, err);
    for (int l = 0; !rc && l < c->n_layers; l++) rc = decoder_fwd_layer(c, &w->layers[l], l, ws, err);
    if (!rc) rc = decoder_fwd_head(c, w->norm, w->output, ws, loss, err);
    return rc;
}
