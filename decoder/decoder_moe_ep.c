/* Expert parallelism of the decoder's MoE layers on the CPU (decoder_model_set_expert_parallel): each
 * rank routes its own tokens, sends every (token, k) row to the ep rank that owns its expert (the slot
 * order of kc_moe_route is expert order, hence destination order), computes its E/P experts on what it
 * receives, and sends the outputs back; the backward sends the output gradients the same way and the
 * input gradients back. Received rows come source-major (source rank, then expert); the experts'
 * GEMMs take them expert-major (expert, then source rank, then the source's slot order), which is the
 * order one rank holding every expert would use for the same tokens. */
#include "decoder/decoder_model_internal.h"
#include "decoder/decoder_ep_order.h"

#include <stdlib.h>
#include <string.h>

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

void decoder_moe_ep_free(decoder_model_ws *ws) {
    for (int l = 0; ws->eps && l < ws->cfg.n_layers; l++) {
        free(ws->eps[l].rows);
        free(ws->eps[l].recvc);
    }
    free(ws->eps);
    free(ws->ep_scratch);
    ws->eps = NULL;
    ws->ep_scratch = NULL;
    ws->ep_scratch_cap = 0;
    ws->ep_size = 1;
}

/* e's row buffers for at least R rows (a quarter more than asked, kept across steps). */
static int grow_saved(decoder_model_ws *ws, decoder_ep_saved *e, size_t R, fsdp_err *err) {
    if (R <= e->cap && e->rows) return FSDP_OK;
    const size_t cap = R + R / 4 + 16, d = (size_t)ws->cfg.dim, F = (size_t)ws->cfg.moe_ffn_hidden;
    const size_t n = round16(cap * d) + 3 * round16(cap * F) + round16(cap);
    float *p = malloc(n * sizeof(float));
    if (!p)
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder: expert parallelism: cannot allocate %zu bytes for the %zu rows "
                            "this rank's experts received", n * sizeof(float), R);
    free(e->rows);
    e->rows = p;
    e->cap = cap;
    e->xr = p;
    e->ar = p + round16(cap * d);
    e->br = e->ar + round16(cap * F);
    e->gr = e->br + round16(cap * F);
    e->perm = (int32_t *)(e->gr + round16(cap * F));
    return FSDP_OK;
}

/* The shared scratch for at least R rows. */
static int grow_scratch(decoder_model_ws *ws, size_t R, fsdp_err *err) {
    if (R <= ws->ep_scratch_cap && ws->ep_scratch) return FSDP_OK;
    const size_t cap = R + R / 4 + 16, d = (size_t)ws->cfg.dim, F = (size_t)ws->cfg.moe_ffn_hidden;
    float *p = malloc((3 * round16(cap * d) + 3 * round16(cap * F)) * sizeof(float));
    if (!p)
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder: expert parallelism: cannot allocate the scratch of %zu rows", R);
    free(ws->ep_scratch);
    ws->ep_scratch = p;
    ws->ep_scratch_cap = cap;
    ws->ep_buf = p;
    ws->ep_dyr = p + round16(cap * d);
    ws->ep_dxr = ws->ep_dyr + round16(cap * d);
    ws->ep_dg = ws->ep_dxr + round16(cap * d);
    ws->ep_da = ws->ep_dg + round16(cap * F);
    ws->ep_db = ws->ep_da + round16(cap * F);
    return FSDP_OK;
}

int decoder_model_set_expert_parallel(decoder_model_ws *ws, comm *ep, fsdp_err *err) {
    const decoder_config *c = &ws->cfg;
    decoder_moe_ep_free(ws);
    if (!ep || comm_size(ep) <= 1) return FSDP_OK;
    const int P = comm_size(ep);
    if (c->n_experts <= 0 || c->n_experts % P)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder: expert parallelism over %d ranks needs a number of experts "
                            "it divides (the model has %d)", P, c->n_experts);
    const int El = c->n_experts / P;
    int ok = (ws->eps = calloc((size_t)c->n_layers, sizeof *ws->eps)) != NULL;
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (!decoder_layer_is_moe(c, l)) continue;
        /* recvc [P * El] and loff [El + 1] in one allocation */
        ok = (ws->eps[l].recvc = malloc(((size_t)P * El + El + 1) * sizeof(int32_t))) != NULL;
        if (ok) ws->eps[l].loff = ws->eps[l].recvc + (size_t)P * El;
    }
    if (!ok) {
        decoder_moe_ep_free(ws);
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder: out of memory (expert parallelism)");
    }
    ws->ep = ep;
    ws->ep_size = P;
    ws->ep_rank = comm_rank(ep);
    ws->ep_experts = El;
    return FSDP_OK;
}

/* The saved buffers of MoE layer `layer`: its own, or under full checkpointing the first MoE layer's
 * (the backward recomputes each layer's forward right before using them). */
static decoder_ep_saved *saved_of(decoder_model_ws *ws, int layer) {
    if (ws->ac != DECODER_AC_FULL) return &ws->eps[layer];
    for (int l = 0; l < ws->cfg.n_layers; l++)
        if (decoder_layer_is_moe(&ws->cfg, l)) return &ws->eps[l];
    return &ws->eps[layer];
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
    decoder_ep_saved *e = saved_of(ws, layer);
    const int P = ws->ep_size, El = ws->ep_experts, d = c->dim;
    int rc = kc_moe_route(&m, xn, lw->router, a, ws->stats, err);
    if (rc) return fsdp_err_prefix(err, "decoder forward: layer %d", layer);
    /* how many rows of each local expert each source sends */
    int32_t sendc[P * El];
    for (int x = 0; x < P * El; x++) sendc[x] = a->offsets[x + 1] - a->offsets[x];
    size_t cb[P], send[P], recv[P];
    for (int q = 0; q < P; q++) cb[q] = (size_t)El * sizeof(int32_t);
    if ((rc = comm_alltoallv(ws->ep, sendc, cb, e->recvc, cb, err))) goto fail;
    row_counts(ws, a, e, send, recv, 1);
    size_t rows = 0;
    for (int q = 0; q < P; q++) rows += recv[q];
    if ((rc = grow_saved(ws, e, rows, err)) || (rc = grow_scratch(ws, rows, err))) return rc;
    row_counts(ws, a, e, send, recv, (size_t)d * sizeof(float));
    if ((rc = comm_alltoallv(ws->ep, a->xs, send, ws->ep_buf, recv, err))) goto fail;
    decoder_ep_order(P, El, e->recvc, e->perm, e->loff);
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
    decoder_ep_saved *e = saved_of(ws, layer);
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
