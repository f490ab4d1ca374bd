/* The decoder family's model/model_blocks.h on the GPU (decoder/decoder_blocks.h): the description of
 * decoder_blocks.c and the pieces of decoder/decoder_cuda.h on a workspace of its own (a config copy,
 * the weights' dtype and a decoder_cuda_ws). */
#include "decoder/decoder_blocks.h"

#include <stdlib.h>

#include "decoder/decoder_cuda.h"

typedef struct decoder_blocks_cuda_ws {
    decoder_config cfg;
    fsdp_dtype dt;
    decoder_cuda_ws *ws;
} decoder_blocks_cuda_ws;

static void *cuda_ws_create(const void *impl, dev_ctx *d, int B, int T, fsdp_dtype dt, const model_blocks_ws_opts *o,
                            fsdp_err *err) {
    decoder_blocks_cuda_ws *w = calloc(1, sizeof *w);
    if (!w) {
        fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (model workspace)");
        return NULL;
    }
    w->cfg = *(const decoder_config *)impl;
    w->dt = dt;
    decoder_model_ws_opts wo = {o->ac, o->head_chunk_rows};
    w->ws = decoder_cuda_ws_create_opts(d, &w->cfg, B, T, dt, &wo, err);
    if (!w->ws) {
        free(w);
        return NULL;
    }
    return w;
}

static void cuda_ws_free(void *ws) {
    decoder_blocks_cuda_ws *w = ws;
    if (!w) return;
    decoder_cuda_ws_free(w->ws);
    free(w);
}

static size_t cuda_ws_bytes(const void *ws) {
    const decoder_blocks_cuda_ws *w = ws;
    return w ? decoder_cuda_ws_bytes(w->ws) : 0;
}

static int cuda_fwd_embed(void *ws, const void *embed, const int32_t *tokens, const int32_t *labels, int B, int T,
                          fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_fwd_embed(&w->cfg, embed, tokens, labels, B, T, w->ws, err);
}

static int cuda_fwd_block(void *ws, int block, const void *wb, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    decoder_cuda_layer lw;
    decoder_cuda_layer_bind(&w->cfg, block, wb, w->dt, &lw);
    return decoder_cuda_fwd_layer(&w->cfg, &lw, block, w->ws, err);
}

static int cuda_head_train(void *ws, const void *norm, const void *output, float *d_norm, float *d_output,
                           double loss_denom, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_head_train(&w->cfg, norm, output, d_norm, d_output, loss_denom, w->ws, err);
}

static const double *cuda_loss_sums(const void *ws) {
    const decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_ws_loss_sums(w->ws);
}

static int cuda_bwd_block(void *ws, int block, const void *wb, float *g, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    decoder_cuda_layer lw;
    decoder_model_layer lg;
    decoder_cuda_layer_bind(&w->cfg, block, wb, w->dt, &lw);
    decoder_model_layer_bind(&w->cfg, block, g, &lg);
    return decoder_cuda_bwd_layer(&w->cfg, &lw, &lg, block, w->ws, err);
}

static int cuda_bwd_embed(void *ws, float *d_embed, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_bwd_embed(&w->cfg, d_embed, w->ws, err);
}

static int cuda_aux_stats(void *ws, double *stats, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_aux_stats(w->ws, stats, err);
}

static int cuda_aux_apply(void *ws, const double *sums, double scale, model_blocks_aux *out, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    int rc = decoder_cuda_aux_apply(w->ws, sums, scale, &out->loss, err);
    out->weighted = rc ? 0.0 : w->cfg.router_aux_coef * out->loss;
    return rc;
}

static int cuda_set_ep(void *ws, comm *ep, fsdp_err *err) {
    decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_set_expert_parallel(w->ws, ep, err);
}

static int cuda_expert_load(void *ws, int block, int64_t *counts) {
    decoder_blocks_cuda_ws *w = ws;
    return decoder_cuda_expert_load(w->ws, block, counts);
}

model_blocks_cuda decoder_blocks_cuda(const decoder_config *cfg) {
    model_blocks_cuda m = {
        .host = decoder_blocks_cpu(cfg),
        .ws_create = cuda_ws_create,
        .ws_free = cuda_ws_free,
        .ws_bytes = cuda_ws_bytes,
        .fwd_embed = cuda_fwd_embed,
        .fwd_block = cuda_fwd_block,
        .head_train = cuda_head_train,
        .loss_sums = cuda_loss_sums,
        .bwd_block = cuda_bwd_block,
        .bwd_embed = cuda_bwd_embed,
    };
    if (cfg && cfg->n_experts > 0) {
        m.aux_stats = cuda_aux_stats;
        m.aux_apply = cuda_aux_apply;
        m.expert_load = cuda_expert_load;
        m.set_expert_parallel = cuda_set_ep;
    }
    return m;
}
