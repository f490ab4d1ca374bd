/* The decoder family's mixture-of-experts layers on the CPU: their workspace, their feed-forward
 * through kc_moe.h, and the load-balancing loss (decoder_model.h). */
#include "decoder/decoder_model_internal.h"

#include <stdlib.h>
#include <string.h>

kc_moe_dims decoder_moe_dims(const decoder_model_ws *ws) {
    const decoder_config *c = &ws->cfg;
    kc_moe_dims m = {ws->B * ws->T, c->dim, c->moe_ffn_hidden, c->n_experts, c->top_k, c->norm_topk};
    return m;
}

/* The dims of the workspace's largest batch (what the buffers are sized for). */
static kc_moe_dims max_dims(const decoder_model_ws *ws) {
    kc_moe_dims m = decoder_moe_dims(ws);
    m.n = ws->B_max * ws->T_max;
    return m;
}

int decoder_moe_ws_alloc(decoder_model_ws *ws, fsdp_err *err) {
    const decoder_config *c = &ws->cfg;
    if (c->n_experts <= 0) return FSDP_OK;
    const kc_moe_dims m = max_dims(ws);
    const int sets = ws->ac == DECODER_AC_FULL ? 1 : decoder_moe_layers(c);
    const size_t per = kc_moe_acts_floats(&m), scratch = kc_moe_scratch_floats(&m), E = (size_t)c->n_experts;
    ws->moe_floats = per * (size_t)sets + scratch;
    ws->moe = calloc((size_t)c->n_layers, sizeof *ws->moe);
    ws->moe_arena = aligned_alloc(64, ws->moe_floats * sizeof(float));
    ws->aux_counts = calloc(2 * E, sizeof(double));
    ws->dp_aux = calloc(E, sizeof(float));
    ws->load = calloc((size_t)c->n_layers * E, sizeof(int64_t));
    if (!ws->moe || !ws->moe_arena || !ws->aux_counts || !ws->dp_aux || !ws->load)
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder workspace: cannot allocate %zu bytes of expert activations for "
                            "batch %d x %d", ws->moe_floats * sizeof(float), ws->B_max, ws->T_max);
    ws->aux_psum = ws->aux_counts + E;
    int k = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!decoder_layer_is_moe(c, l)) continue;
        kc_moe_acts_bind(&m, ws->moe_arena + per * (size_t)(ws->ac == DECODER_AC_FULL ? 0 : k++), &ws->moe[l]);
    }
    kc_moe_scratch_bind(&m, ws->moe_arena + per * (size_t)sets, &ws->moe_s);
    return FSDP_OK;
}

void decoder_moe_ws_free(decoder_model_ws *ws) {
    free(ws->moe);
    free(ws->moe_arena);
    free(ws->aux_counts);
    free(ws->dp_aux);
    free(ws->load);
}

void decoder_moe_ws_reset(decoder_model_ws *ws) {
    const decoder_config *c = &ws->cfg;
    if (c->n_experts <= 0) return;
    memset(ws->aux_counts, 0, 2 * (size_t)c->n_experts * sizeof(double));
    memset(ws->dp_aux, 0, (size_t)c->n_experts * sizeof(float));
    ws->aux_rows = 0;
}

int decoder_moe_forward(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                        const float *xn, float *out, fsdp_err *err) {
    const kc_moe_dims m = decoder_moe_dims(ws);
    kc_moe_acts *a = &ws->moe[layer];
    int rc = kc_moe_forward(&m, xn, lw->router, lw->ew1, lw->ew2, lw->ew3, a, out, ws->stats, err);
    if (rc) return fsdp_err_prefix(err, "decoder forward: layer %d", layer);
    if (ws->recompute) return FSDP_OK;
    kc_moe_stats(&m, a, ws->aux_counts, ws->aux_psum);
    ws->aux_rows += m.n;
    for (int e = 0; e < c->n_experts; e++)
        ws->load[(size_t)layer * (size_t)c->n_experts + (size_t)e] = a->offsets[e + 1] - a->offsets[e];
    return FSDP_OK;
}

int decoder_moe_backward(const decoder_config *c, const decoder_model_layer *lw, decoder_model_layer *lg, int layer,
                         decoder_model_ws *ws, const float *xn, const float *dout, float *dxn, fsdp_err *err) {
    (void)c;
    const kc_moe_dims m = decoder_moe_dims(ws);
    int rc = kc_moe_backward(&m, dout, xn, lw->router, lw->ew1, lw->ew2, lw->ew3, &ws->moe[layer], ws->dp_aux,
                             &ws->moe_s, dxn, lg->router, lg->ew1, lg->ew2, lg->ew3, ws->stats, err);
    return rc ? fsdp_err_prefix(err, "decoder backward: layer %d", layer) : FSDP_OK;
}

int decoder_model_aux_stats(const decoder_model_ws *ws, double *stats, fsdp_err *err) {
    const decoder_config *c = ws ? &ws->cfg : NULL;
    if (!c || c->n_experts <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder: the model has no experts, hence no load-balancing loss");
    const size_t E = (size_t)c->n_experts;
    memcpy(stats, ws->aux_counts, 2 * E * sizeof(double));
    stats[2 * E] = ws->aux_rows;
    return FSDP_OK;
}

int decoder_model_aux_apply(decoder_model_ws *ws, const double *sums, double scale, double *aux, fsdp_err *err) {
    const decoder_config *c = ws ? &ws->cfg : NULL;
    if (!c || c->n_experts <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder: the model has no experts, hence no load-balancing loss");
    const int E = c->n_experts;
    *aux = kc_moe_aux(E, sums, sums + E, sums[2 * E], scale * c->router_aux_coef, ws->dp_aux);
    return FSDP_OK;
}

int decoder_model_expert_load(const decoder_model_ws *ws, int layer, int64_t *counts, fsdp_err *err) {
    const decoder_config *c = ws ? &ws->cfg : NULL;
    if (!c || !decoder_layer_is_moe(c, layer))
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder: layer %d has no experts", layer);
    memcpy(counts, ws->load + (size_t)layer * (size_t)c->n_experts, (size_t)c->n_experts * sizeof(int64_t));
    return FSDP_OK;
}

int decoder_model_expert_choices(const decoder_model_ws *ws, int layer, int32_t *top, fsdp_err *err) {
    const decoder_config *c = ws ? &ws->cfg : NULL;
    if (!c || !decoder_layer_is_moe(c, layer) || ws->ac == DECODER_AC_FULL)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder: layer %d keeps no routing choices (a dense layer, or full "
                            "activation checkpointing)", layer);
    memcpy(top, ws->moe[layer].top, (size_t)ws->B * (size_t)ws->T * (size_t)c->top_k * sizeof(int32_t));
    return FSDP_OK;
}
