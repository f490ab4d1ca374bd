/* Expert parallelism of the decoder's MoE layers on the CPU (decoder_model_set_expert_parallel): each
 * rank routes its own tokens, sends every (token, k) row to the ep rank that owns its expert (the slot
 * order of kc_moe_route is expert order, hence destination order), computes its E/P experts on what it
 * receives, and sends the outputs back; the backward sends the output gradients the same way and the
 * input gradients back. Received rows come source-major (source rank, then expert); the experts'
 * GEMMs take them expert-major (expert, then source rank, then the source's slot order), which is the
 * order one rank holding every expert would use for the same tokens. */
#include "decoder/decoder_model_internal.h"

#include <stdlib.h>
#include <string.h>

/* Rows the largest forward may receive over P ep ranks: every token of every ep rank routed here, K times. */
static size_t rows_max(const decoder_model_ws *ws, int P) {
    return (size_t)P * (size_t)ws->B_max * (size_t)ws->T_max * (size_t)ws->cfg.top_k;
}

void decoder_moe_ep_free(decoder_model_ws *ws) {
    free(ws->ep_arena);
    free(ws->eps);
    ws->ep_arena = NULL;
    ws->eps = NULL;
    ws->ep_size = 1;
}

static float *take(float **at, size_t n) {
    float *p = *at;
    *at += (n + 15) & ~(size_t)15;
    return p;
}

int decoder_model_set_expert_parallel(decoder_model_ws *ws, comm *ep, fsdp_err *err) {
    const decoder_config *c = &ws->cfg;
    decoder_moe_ep_free(ws);
    if (!ep || comm_size(ep) <= 1) return FSDP_OK;
    const int P = comm_size(ep);
    if (c->n_experts <= 0 || c->n_experts % P)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder: expert parallelism over %d ranks needs a number of experts "
                            "it divides (the model has %d)", P, c->n_experts);
    const int El = c->n_experts / P, sets = ws->ac == DECODER_AC_FULL ? 1 : decoder_moe_layers(c);
    const size_t R = rows_max(ws, P), d = (size_t)c->dim, F = (size_t)c->moe_ffn_hidden;
    const size_t saved = R * d + 3 * R * F + R + (size_t)P * El + El + 1 + 7 * 16;
    const size_t scratch = 3 * R * d + 3 * R * F + 6 * 16;
    ws->ep_floats = saved * (size_t)sets + scratch;
    ws->ep_arena = malloc(ws->ep_floats * sizeof(float));
    ws->eps = calloc((size_t)c->n_layers, sizeof *ws->eps);
    if (!ws->ep_arena || !ws->eps) {
        decoder_moe_ep_free(ws);
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder: cannot allocate %zu bytes for expert parallelism over %d "
                            "ranks", ws->ep_floats * sizeof(float), P);
    }
    float *at = ws->ep_arena;
    decoder_ep_saved first;
    for (int l = 0, k = 0; l < c->n_layers; l++) {
        if (!decoder_layer_is_moe(c, l)) continue;
        decoder_ep_saved *e = &ws->eps[l];
        if (k++ && sets == 1) {
            *e = first;
            continue;
        }
        e->xr = take(&at, R * d);
        e->ar = take(&at, R * F);
        e->br = take(&at, R * F);
        e->gr = take(&at, R * F);
        e->perm = (int32_t *)take(&at, R);
        e->recvc = (int32_t *)take(&at, (size_t)P * El);
        e->loff = (int32_t *)take(&at, (size_t)El + 1);
        first = *e;
    }
    ws->ep_buf = take(&at, R * d);
    ws->ep_dyr = take(&at, R * d);
    ws->ep_dxr = take(&at, R * d);
    ws->ep_dg = take(&at, R * F);
    ws->ep_da = take(&at, R * F);
    ws->ep_db = take(&at, R * F);
    ws->ep = ep;
    ws->ep_size = P;
    ws->ep_rank = comm_rank(ep);
    ws->ep_experts = El;
    return FSDP_OK;
}

/* Rows this rank sends to each ep rank (its slots of that rank's experts) and receives from each. */
static void row_counts(const decoder_model_ws *ws, const kc_moe_acts *a, const decoder_ep_saved *e, size_t *send,
                       size_t *recv, size_t unit) {
    const int P = ws->ep_size, El = ws->ep_experts;
    for (int q = 0; q < P; q++) {
        send[q] = (size_t)(a->offsets[(q + 1) * El] - a->offsets[q * El]) * unit;
        size_t r = 0;
        for (int j = 0; j < El; j++) r += (size_t)e->recvc[q * El + j];
        recv[q] = r * unit;
    }
}

/* The expert-major order of the received rows: perm and the local experts' offsets. */
static void expert_major(const decoder_model_ws *ws, decoder_ep_saved *e) {
    const int P = ws->ep_size, El = ws->ep_experts;
    int32_t start[P];
    int32_t at = 0;
    for (int q = 0; q < P; q++) {
        start[q] = at;
        for (int j = 0; j < El; j++) at += e->recvc[q * El + j];
    }
    int32_t row = 0;
    e->loff[0] = 0;
    for (int j = 0; j < El; j++) {
        for (int q = 0; q < P; q++) {
            int32_t from = start[q];
            for (int jj = 0; jj < j; jj++) from += e->recvc[q * El + jj];
            for (int32_t i = 0; i < e->recvc[q * El + j]; i++) e->perm[row++] = from + i;
        }
        e->loff[j + 1] = row;
    }
}

/* dst[r] = src[perm[r]] (gather: to expert-major) or dst[perm[r]] = src[r] (scatter: back), rows of w floats. */
static void permute(const int32_t *perm, int32_t rows, int w, const float *src, float *dst, int scatter) {
#pragma omp parallel for schedule(static)
    for (int32_t r = 0; r < rows; r++) {
        const float *s = scatter ? src + (size_t)r * w : src + (size_t)perm[r] * w;
        float *o = scatter ? dst + (size_t)perm[r] * w : dst + (size_t)r * w;
        memcpy(o, s, (size_t)w * sizeof(float));
    }
}

int decoder_moe_ep_forward(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                           const float *xn, float *out, fsdp_err *err) {
    const kc_moe_dims m = decoder_moe_dims(ws);
    kc_moe_acts *a = &ws->moe[layer];
    decoder_ep_saved *e = &ws->eps[layer];
    const int P = ws->ep_size, El = ws->ep_experts, d = c->dim;
    int rc = kc_moe_route(&m, xn, lw->router, a, ws->stats, err);
    if (rc) return fsdp_err_prefix(err, "decoder forward: layer %d", layer);
    /* how many rows of each local expert each source sends */
    int32_t sendc[P * El];
    for (int x = 0; x < P * El; x++) sendc[x] = a->offsets[x + 1] - a->offsets[x];
    size_t cb[P], send[P], recv[P];
    for (int q = 0; q < P; q++) cb[q] = (size_t)El * sizeof(int32_t);
    if ((rc = comm_alltoallv(ws->ep, sendc, cb, e->recvc, cb, err))) goto fail;
    row_counts(ws, a, e, send, recv, (size_t)d * sizeof(float));
    if ((rc = comm_alltoallv(ws->ep, a->xs, send, ws->ep_buf, recv, err))) goto fail;
    expert_major(ws, e);
    const int32_t R = e->loff[El];
    permute(e->perm, R, d, ws->ep_buf, e->xr, 0);
    kc_moe_experts_forward(El, e->loff, d, m.F, e->xr, lw->ew1, lw->ew2, lw->ew3, e->ar, e->br, e->gr, ws->ep_dyr,
                           ws->stats);
    permute(e->perm, R, d, ws->ep_dyr, ws->ep_buf, 1);
    if ((rc = comm_alltoallv(ws->ep, ws->ep_buf, recv, a->y, send, err))) goto fail;
    kc_moe_combine(&m, a, out);
    return FSDP_OK;
fail:
    return fsdp_err_prefix(err, "decoder forward: layer %d: expert-parallel all-to-all over %d ranks", layer, P);
}

int decoder_moe_ep_backward(const decoder_config *c, const decoder_model_layer *lw, decoder_model_layer *lg, int layer,
                            decoder_model_ws *ws, const float *xn, const float *dout, float *dxn, fsdp_err *err) {
    const kc_moe_dims m = decoder_moe_dims(ws);
    const kc_moe_acts *a = &ws->moe[layer];
    decoder_ep_saved *e = &ws->eps[layer];
    const int P = ws->ep_size, El = ws->ep_experts, d = c->dim;
    kc_moe_scratch *s = &ws->moe_s;
    kc_moe_combine_backward(&m, a, dout, ws->dp_aux, s->dys, s->dp);
    size_t send[P], recv[P];
    row_counts(ws, a, e, send, recv, (size_t)d * sizeof(float));
    int rc = comm_alltoallv(ws->ep, s->dys, send, ws->ep_buf, recv, err);
    if (rc) goto fail;
    const int32_t R = e->loff[El];
    permute(e->perm, R, d, ws->ep_buf, ws->ep_dyr, 0);
    kc_moe_experts_backward(El, e->loff, d, m.F, ws->ep_dyr, e->xr, lw->ew1, lw->ew2, lw->ew3, e->ar, e->br, e->gr,
                            ws->ep_dg, ws->ep_da, ws->ep_db, ws->ep_dxr, lg->ew1, lg->ew2, lg->ew3, ws->stats);
    permute(e->perm, R, d, ws->ep_dxr, ws->ep_buf, 1);
    if ((rc = comm_alltoallv(ws->ep, ws->ep_buf, recv, s->dxs, send, err))) goto fail;
    kc_moe_router_backward(&m, a, s->dp, s->dxs, xn, lw->router, dxn, lg->router, ws->stats);
    return FSDP_OK;
fail:
    return fsdp_err_prefix(err, "decoder backward: layer %d: expert-parallel all-to-all over %d ranks", layer, P);
}
