/* The decoder's mixture-of-experts layers on the GPU: their workspace, the feed-forward through
 * decoder_moe_cuda.h, and the load-balancing loss's statistics and gradient (decoder_cuda.h). The
 * statistics stay on the device during the forward; decoder_cuda_aux_stats brings them to the host
 * once per forward (the trainer sums them over the ranks), decoder_cuda_aux_apply uploads the gradient. */
#include "decoder/decoder_cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* The MoE dims of ws's current batch (n) or its largest (n_max). */
static kc_moe_dims dims_of(const decoder_cuda_ws *ws, int n) {
    const decoder_config *c = &ws->cfg;
    kc_moe_dims m = {n, c->dim, c->moe_ffn_hidden, c->n_experts, c->top_k, c->norm_topk};
    return m;
}

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

int decoder_cuda_moe_alloc(decoder_cuda_ws *ws, fsdp_err *err) {
    const decoder_config *c = &ws->cfg;
    if (c->n_experts <= 0) return FSDP_OK;
    const int n_max = ws->B_max * ws->T_max, E = c->n_experts;
    const kc_moe_dims m = dims_of(ws, n_max);
    const int sets = ws->ac == DECODER_AC_FULL ? 1 : decoder_moe_layers(c);
    const size_t acts = up256(decoder_moe_cuda_acts_bytes(&m, ws->dt)),
                 scratch = up256(decoder_moe_cuda_scratch_bytes(&m, ws->dt)),
                 out = up256((size_t)n_max * (size_t)c->dim * fsdp_dtype_size(ws->dt)),
                 aux = up256(2 * (size_t)E * sizeof(double)), dp = up256((size_t)E * sizeof(float));
    if (!acts || !scratch) return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda): invalid mixture-of-experts sizes");
    ws->moe_bytes = acts * (size_t)sets + scratch + out + aux + dp;
    ws->moe = calloc((size_t)c->n_layers, sizeof *ws->moe);
    ws->moe_host_offsets = calloc((size_t)sets * ((size_t)E + 2), sizeof(int32_t));
    ws->h_aux = calloc(2 * (size_t)E, sizeof(double));
    ws->h_dp_aux = calloc((size_t)E, sizeof(float));
    ws->load = calloc((size_t)c->n_layers * (size_t)E, sizeof(int64_t));
    if (!ws->moe || !ws->moe_host_offsets || !ws->h_aux || !ws->h_dp_aux || !ws->load)
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder (cuda) workspace: out of host memory (experts)");
    if (dev_alloc(ws->d, ws->moe_bytes, &ws->moe_arena, err))
        return fsdp_err_prefix(err, "decoder (cuda) workspace: %zu bytes of expert activations for batch %d x %d",
                               ws->moe_bytes, ws->B_max, ws->T_max);
    unsigned char *at = ws->moe_arena;
    for (int l = 0, k = 0; l < c->n_layers; l++) {
        if (!decoder_layer_is_moe(c, l)) continue;
        const int set = ws->ac == DECODER_AC_FULL ? 0 : k++;
        int rc = decoder_moe_cuda_acts_bind(&m, ws->dt, at + acts * (size_t)set,
                                            ws->moe_host_offsets + (size_t)set * ((size_t)E + 2), &ws->moe[l], err);
        if (rc) return fsdp_err_prefix(err, "decoder (cuda) workspace: layer %d", l);
    }
    at += acts * (size_t)sets;
    int rc = decoder_moe_cuda_scratch_bind(&m, ws->dt, at, &ws->moe_s, err);
    if (rc) return fsdp_err_prefix(err, "decoder (cuda) workspace");
    at += scratch;
    ws->moe_out = at;
    ws->d_aux = (double *)(at + out);
    ws->d_dp_aux = (float *)(at + out + aux);
    return FSDP_OK;
}

void decoder_cuda_moe_free(decoder_cuda_ws *ws) {
    decoder_cuda_moe_ep_free(ws);
    if (ws->moe_arena) {
        fsdp_err err;
        dev_stream_sync(ws->d, DEV_STREAM_COMPUTE, &err);
        dev_free(ws->d, ws->moe_arena, &err);
    }
    free(ws->moe);
    free(ws->moe_host_offsets);
    free(ws->h_aux);
    free(ws->h_dp_aux);
    free(ws->load);
}

int decoder_cuda_moe_reset(decoder_cuda_ws *ws, fsdp_err *err) {
    const int E = ws->cfg.n_experts;
    if (E <= 0) return FSDP_OK;
    ws->aux_rows = 0;
    int rc = dev_memset0(ws->d, ws->d_aux, 2 * (size_t)E * sizeof(double), DEV_STREAM_COMPUTE, err);
    if (!rc) rc = dev_memset0(ws->d, ws->d_dp_aux, (size_t)E * sizeof(float), DEV_STREAM_COMPUTE, err);
    return rc ? fsdp_err_prefix(err, "decoder (cuda) forward: expert statistics") : FSDP_OK;
}

int decoder_cuda_moe_forward(const decoder_config *c, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                             void *out, fsdp_err *err) {
    const kc_moe_dims m = dims_of(ws, ws->B * ws->T);
    decoder_cuda_acts *a = &ws->acts[layer];
    decoder_moe_cuda_acts *ma = &ws->moe[layer];
    int rc = ws->ep_size > 1 ? decoder_cuda_moe_ep_forward(c, lw, layer, ws, err)
                             : decoder_moe_cuda_forward(ws->d, ws->dt, &m, a->xn2, lw->router, lw->ew1, lw->ew2,
                                                        lw->ew3, ma, ws->moe_out, err);
    if (!rc) rc = kcu_add(ws->dt, a->h, ws->moe_out, out, (int64_t)m.n * m.d, ws->s, err);
    if (rc) return fsdp_err_prefix(err, "decoder (cuda) forward: layer %d experts", layer);
    if (ws->recompute) return FSDP_OK;
    if ((rc = decoder_moe_cuda_stats(ws->d, &m, ma, ws->d_aux, ws->d_aux + c->n_experts, err)))
        return fsdp_err_prefix(err, "decoder (cuda) forward: layer %d expert statistics", layer);
    ws->aux_rows += m.n;
    const int32_t *off = ma->host_offsets; /* the forward brought them to the host */
    for (int e = 0; e < c->n_experts; e++)
        ws->load[(size_t)layer * (size_t)c->n_experts + (size_t)e] = off[e + 1] - off[e];
    return FSDP_OK;
}

int decoder_cuda_moe_backward(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg, int layer,
                              decoder_cuda_ws *ws, fsdp_err *err) {
    const kc_moe_dims m = dims_of(ws, ws->B * ws->T);
    decoder_cuda_acts *a = &ws->acts[layer];
    int rc = 0;
    if (ws->ac == DECODER_AC_SELECTIVE)
        rc = kcu_rmsnorm_apply(ws->dt, a->h, lw->ffn_norm, a->rstd2, a->xn2, m.n, m.d, ws->s, err);
    if (!rc && ws->ep_size > 1) rc = decoder_cuda_moe_ep_backward(c, lw, lg, layer, ws, err);
    else if (!rc)
        rc = decoder_moe_cuda_backward(ws->d, ws->dt, &m, ws->dres, a->xn2, lw->router, lw->ew1, lw->ew2, lw->ew3,
                                       &ws->moe[layer], ws->d_dp_aux, &ws->moe_s, ws->dxn, lg->router, lg->ew1,
                                       lg->ew2, lg->ew3, err);
    if (!rc)
        rc = kcu_rmsnorm_backward(ws->dt, ws->dxn, a->h, lw->ffn_norm, a->rstd2, ws->dres, lg->ffn_norm, m.n, m.d, ws->s,
                                  err);
    return rc ? fsdp_err_prefix(err, "decoder (cuda) backward: layer %d experts", layer) : FSDP_OK;
}

int decoder_cuda_aux_stats(decoder_cuda_ws *ws, double *stats, fsdp_err *err) {
    const int E = ws ? ws->cfg.n_experts : 0;
    if (E <= 0) return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda): the model has no experts");
    int rc = dev_copy_d2h(ws->d, ws->h_aux, ws->d_aux, 2 * (size_t)E * sizeof(double), DEV_STREAM_COMPUTE, err);
    if (!rc) rc = dev_stream_sync(ws->d, DEV_STREAM_COMPUTE, err);
    if (rc) return fsdp_err_prefix(err, "decoder (cuda): reading the expert statistics");
    memcpy(stats, ws->h_aux, 2 * (size_t)E * sizeof(double));
    stats[2 * E] = ws->aux_rows;
    return FSDP_OK;
}

int decoder_cuda_aux_apply(decoder_cuda_ws *ws, const double *sums, double scale, double *aux, fsdp_err *err) {
    const int E = ws ? ws->cfg.n_experts : 0;
    if (E <= 0) return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda): the model has no experts");
    *aux = kc_moe_aux(E, sums, sums + E, sums[2 * E], scale * ws->cfg.router_aux_coef, ws->h_dp_aux);
    int rc = dev_copy_h2d(ws->d, ws->d_dp_aux, ws->h_dp_aux, (size_t)E * sizeof(float), DEV_STREAM_COMPUTE, err);
    return rc ? fsdp_err_prefix(err, "decoder (cuda): the load-balancing gradient") : FSDP_OK;
}

int decoder_cuda_expert_load(const decoder_cuda_ws *ws, int layer, int64_t *counts) {
    const decoder_config *c = ws ? &ws->cfg : NULL;
    if (!c || !decoder_layer_is_moe(c, layer)) return 0;
    memcpy(counts, ws->load + (size_t)layer * (size_t)c->n_experts, (size_t)c->n_experts * sizeof(int64_t));
    return 1;
}
