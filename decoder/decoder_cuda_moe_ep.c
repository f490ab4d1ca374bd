/* Expert parallelism of the decoder's MoE layers on the GPU (decoder_cuda_set_expert_parallel): the CPU
 * scheme of decoder_moe_ep.c with device buffers. Each rank routes its tokens (decoder_moe_cuda_route,
 * whose one host copy of the offsets gives the rows for each ep rank), the per-expert counts go by MPI,
 * the rows by NCCL (comm_dev_alltoallv), the received rows are put in expert-major order on the device
 * (kcu_moe_gather with the host-computed permutation, decoder_ep_order.h), this rank's experts run on
 * them, and the outputs go back the same way; the backward mirrors it. */
#include "decoder/decoder_cuda_internal.h"
#include "decoder/decoder_ep_order.h"

#include <stdlib.h>
#include <string.h>

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

void decoder_cuda_moe_ep_free(decoder_cuda_ws *ws) {
    fsdp_err err;
    for (int l = 0; ws->eps && l < ws->cfg.n_layers; l++) {
        decoder_cuda_ep *e = &ws->eps[l];
        if (e->rows) dev_free(ws->d, e->rows, &err);
        free(e->h_recvc);
        free(e->h_perm);
    }
    if (ws->ep_scratch) dev_free(ws->d, ws->ep_scratch, &err);
    free(ws->eps);
    ws->eps = NULL;
    ws->ep_scratch = NULL;
    ws->ep_scratch_cap = 0;
    ws->ep_size = 1;
}

int decoder_cuda_set_expert_parallel(decoder_cuda_ws *ws, comm *ep, fsdp_err *err) {
    const decoder_config *c = &ws->cfg;
    decoder_cuda_moe_ep_free(ws);
    if (!ep || comm_size(ep) <= 1) return FSDP_OK;
    const int P = comm_size(ep);
    if (c->n_experts <= 0 || c->n_experts % P)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda): expert parallelism over %d ranks needs a number of "
                            "experts it divides (the model has %d)", P, c->n_experts);
    if (!comm_dev_ready(ep))
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda): the expert-parallel group has no device communicator");
    const int El = c->n_experts / P;
    int ok = (ws->eps = calloc((size_t)c->n_layers, sizeof *ws->eps)) != NULL;
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (!decoder_layer_is_moe(c, l)) continue;
        decoder_cuda_ep *e = &ws->eps[l];
        ok = (e->h_recvc = malloc(((size_t)P * El + El + 1) * sizeof(int32_t))) != NULL;
        if (ok) e->h_loff = e->h_recvc + (size_t)P * El;
    }
    if (!ok) {
        decoder_cuda_moe_ep_free(ws);
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder (cuda): out of memory (expert parallelism)");
    }
    ws->ep = ep;
    ws->ep_size = P;
    ws->ep_rank = comm_rank(ep);
    ws->ep_experts = El;
    return FSDP_OK;
}

/* e's buffers for at least R received rows (a quarter more, kept across steps). */
static int grow_saved(decoder_cuda_ws *ws, decoder_cuda_ep *e, size_t R, fsdp_err *err) {
    if (R <= e->cap && e->rows) return FSDP_OK;
    const size_t cap = R + R / 4 + 16, es = fsdp_dtype_size(ws->dt), d = (size_t)ws->cfg.dim,
                 F = (size_t)ws->cfg.moe_ffn_hidden;
    const size_t xr = up256(cap * d * es), f = up256(cap * F * es), ix = up256(cap * sizeof(int32_t));
    void *p;
    int32_t *h = malloc(2 * ix); /* h_perm, h_inv laid out as perm, inv: one upload moves both */
    if (!h || dev_alloc(ws->d, xr + 3 * f + 2 * ix, &p, err)) {
        free(h);
        return h ? fsdp_err_prefix(err, "decoder (cuda): expert parallelism: %zu received rows", R)
                 : fsdp_err_set(err, FSDP_E_NOMEM, "decoder (cuda): out of host memory (expert parallelism)");
    }
    fsdp_err e2;
    if (e->rows) dev_free(ws->d, e->rows, &e2);
    free(e->h_perm);
    unsigned char *b = p;
    e->rows = p;
    e->cap = cap;
    e->xr = b;
    e->ar = b + xr;
    e->br = b + xr + f;
    e->gr = b + xr + 2 * f;
    e->perm = (int32_t *)(b + xr + 3 * f);
    e->inv = (int32_t *)(b + xr + 3 * f + ix);
    e->h_perm = h;
    e->h_inv = h + ix / sizeof(int32_t);
    return FSDP_OK;
}

/* The shared device scratch for at least R rows: recv, dyr, dxr [cap, d], dg, da, db [cap, F]. */
static int grow_scratch(decoder_cuda_ws *ws, size_t R, void **parts, fsdp_err *err) {
    const size_t es = fsdp_dtype_size(ws->dt), d = (size_t)ws->cfg.dim, F = (size_t)ws->cfg.moe_ffn_hidden;
    if (R > ws->ep_scratch_cap || !ws->ep_scratch) {
        const size_t cap = R + R / 4 + 16;
        void *p;
        if (dev_alloc(ws->d, 3 * up256(cap * d * es) + 3 * up256(cap * F * es), &p, err))
            return fsdp_err_prefix(err, "decoder (cuda): expert parallelism scratch of %zu rows", R);
        fsdp_err e2;
        if (ws->ep_scratch) dev_free(ws->d, ws->ep_scratch, &e2);
        ws->ep_scratch = p;
        ws->ep_scratch_cap = cap;
    }
    const size_t cap = ws->ep_scratch_cap, xd = up256(cap * d * es), xf = up256(cap * F * es);
    unsigned char *b = ws->ep_scratch;
    for (int k = 0; k < 3; k++) parts[k] = b + (size_t)k * xd;
    for (int k = 0; k < 3; k++) parts[3 + k] = b + 3 * xd + (size_t)k * xf;
    return FSDP_OK;
}

static decoder_cuda_ep *saved_of(decoder_cuda_ws *ws, int layer) {
    if (ws->ac != DECODER_AC_FULL) return &ws->eps[layer];
    for (int l = 0; l < ws->cfg.n_layers; l++)
        if (decoder_layer_is_moe(&ws->cfg, l)) return &ws->eps[l];
    return &ws->eps[layer];
}

/* Bytes of rows this rank sends to each ep rank (its slots of their experts) and receives from each. */
static void row_bytes(const decoder_cuda_ws *ws, const int32_t *off, const decoder_cuda_ep *e, size_t *send,
                      size_t *recv) {
    const int P = ws->ep_size, El = ws->ep_experts;
    const size_t row = (size_t)ws->cfg.dim * fsdp_dtype_size(ws->dt);
    for (int q = 0; q < P; q++) {
        send[q] = (size_t)(off[(q + 1) * El] - off[q * El]) * row;
        size_t r = 0;
        for (int j = 0; j < El; j++) r += (size_t)e->h_recvc[q * El + j];
        recv[q] = r * row;
    }
}

int decoder_cuda_moe_ep_forward(const decoder_config *c, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                                fsdp_err *err) {
    const int P = ws->ep_size, El = ws->ep_experts, n = ws->B * ws->T;
    const kc_moe_dims m = {n, c->dim, c->moe_ffn_hidden, c->n_experts, c->top_k, c->norm_topk};
    decoder_cuda_acts *a = &ws->acts[layer];
    decoder_moe_cuda_acts *ma = &ws->moe[layer];
    decoder_cuda_ep *e = saved_of(ws, layer);
    int rc = decoder_moe_cuda_route(ws->d, ws->dt, &m, a->xn2, lw->router, ma, err);
    if (rc) return fsdp_err_prefix(err, "decoder (cuda) forward: layer %d", layer);
    const int32_t *off = ma->host_offsets;
    int32_t sendc[P * El];
    for (int x = 0; x < P * El; x++) sendc[x] = off[x + 1] - off[x];
    size_t cb[P], send[P], recv[P];
    for (int q = 0; q < P; q++) cb[q] = (size_t)El * sizeof(int32_t);
    if ((rc = comm_alltoallv(ws->ep, sendc, cb, e->h_recvc, cb, err))) goto fail;
    size_t rows = 0;
    for (int x = 0; x < P * El; x++) rows += (size_t)e->h_recvc[x];
    void *sc[6];
    if ((rc = grow_saved(ws, e, rows, err)) || (rc = grow_scratch(ws, rows, sc, err))) return rc;
    e->rows_in = decoder_ep_order(P, El, e->h_recvc, e->h_perm, e->h_loff);
    for (int32_t r = 0; r < e->rows_in; r++) e->h_inv[e->h_perm[r]] = r;
    const size_t ib = (size_t)e->rows_in * sizeof(int32_t), gap = (size_t)((char *)e->inv - (char *)e->perm);
    if (ib && (rc = dev_upload(ws->d, e->perm, e->h_perm, gap + ib, err))) /* perm, then inv at the same gap */
        return fsdp_err_prefix(err, "decoder (cuda) forward: layer %d: expert order", layer);
    row_bytes(ws, off, e, send, recv);
    dev_stream st = dev_ctx_stream(ws->d, DEV_STREAM_COMPUTE);
    if ((rc = comm_dev_alltoallv(ws->ep, ma->xs, send, sc[0], recv, st, err))) goto fail;
    const int d = c->dim;
    if (e->rows_in && (rc = kcu_moe_gather(ws->dt, sc[0], e->perm, e->rows_in, 1, d, e->xr, ws->s, err))) goto kern;
    if ((rc = decoder_moe_cuda_experts_forward(ws->d, ws->dt, d, m.F, El, e->h_loff, e->xr, lw->ew1, lw->ew2, lw->ew3,
                                               e->ar, e->br, e->gr, sc[1], err)))
        goto kern;
    if (e->rows_in && (rc = kcu_moe_gather(ws->dt, sc[1], e->inv, e->rows_in, 1, d, sc[0], ws->s, err))) goto kern;
    if ((rc = comm_dev_alltoallv(ws->ep, sc[0], recv, ma->y, send, st, err))) goto fail;
    if ((rc = kcu_moe_combine(ws->dt, ma->y, ma->topw, ma->slot_of, n, m.K, d, 0, ws->moe_out, ws->s, err))) goto kern;
    return FSDP_OK;
fail:
    return fsdp_err_prefix(err, "decoder (cuda) forward: layer %d: expert-parallel all-to-all over %d ranks", layer, P);
kern:
    return fsdp_err_prefix(err, "decoder (cuda) forward: layer %d: expert parallelism", layer);
}

int decoder_cuda_moe_ep_backward(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg,
                                 int layer, decoder_cuda_ws *ws, fsdp_err *err) {
    const int P = ws->ep_size, El = ws->ep_experts, n = ws->B * ws->T, d = c->dim;
    const kc_moe_dims m = {n, d, c->moe_ffn_hidden, c->n_experts, c->top_k, c->norm_topk};
    decoder_cuda_acts *a = &ws->acts[layer];
    decoder_moe_cuda_acts *ma = &ws->moe[layer];
    decoder_moe_cuda_scratch *s = &ws->moe_s;
    decoder_cuda_ep *e = saved_of(ws, layer);
    int rc = decoder_moe_cuda_backward_router(ws->d, ws->dt, &m, ws->dres, a->xn2, lw->router, ma, ws->d_dp_aux, s,
                                              ws->dxn, lg->router, err);
    if (rc) return fsdp_err_prefix(err, "decoder (cuda) backward: layer %d", layer);
    void *sc[6];
    if ((rc = grow_scratch(ws, (size_t)e->rows_in, sc, err))) return rc;
    size_t send[P], recv[P];
    row_bytes(ws, ma->host_offsets, e, send, recv);
    dev_stream st = dev_ctx_stream(ws->d, DEV_STREAM_COMPUTE);
    if ((rc = comm_dev_alltoallv(ws->ep, s->dys, send, sc[0], recv, st, err))) goto fail;
    if (e->rows_in && (rc = kcu_moe_gather(ws->dt, sc[0], e->perm, e->rows_in, 1, d, sc[1], ws->s, err))) goto kern;
    if ((rc = decoder_moe_cuda_experts_backward(ws->d, ws->dt, d, m.F, El, e->h_loff, sc[1], e->xr, lw->ew1, lw->ew2,
                                                lw->ew3, e->ar, e->br, e->gr, sc[3], sc[4], sc[5], sc[2], lg->ew1,
                                                lg->ew2, lg->ew3, err)))
        goto kern;
    if (e->rows_in && (rc = kcu_moe_gather(ws->dt, sc[2], e->inv, e->rows_in, 1, d, sc[0], ws->s, err))) goto kern;
    if ((rc = comm_dev_alltoallv(ws->ep, sc[0], recv, s->dxs, send, st, err))) goto fail;
    if ((rc = kcu_moe_combine(ws->dt, s->dxs, NULL, ma->slot_of, n, m.K, d, 1, ws->dxn, ws->s, err))) goto kern;
    return FSDP_OK;
fail:
    return fsdp_err_prefix(err, "decoder (cuda) backward: layer %d: expert-parallel all-to-all over %d ranks", layer, P);
kern:
    return fsdp_err_prefix(err, "decoder (cuda) backward: layer %d: expert parallelism", layer);
}
