/* The decoder family's model/model_blocks.h on the CPU (decoder/decoder_blocks.h): the description
 * of the model (layout, each layer's parameters and their offsets in the layer's flat block) and the
 * pieces of decoder/decoder_model.h on a workspace of its own (a config copy and a decoder_model_ws). */
#include "decoder/decoder_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "decoder/decoder_model.h"
#include "decoder/decoder_params.h"

_Static_assert(DECODER_AC_NONE == (int)MODEL_BLOCKS_AC_NONE && DECODER_AC_FULL == (int)MODEL_BLOCKS_AC_FULL &&
                   DECODER_AC_SELECTIVE == (int)MODEL_BLOCKS_AC_SELECTIVE,
               "decoder_ac and model_blocks_ac must agree");
_Static_assert(DECODER_PARAMS_PER_LAYER_MAX <= MODEL_BLOCKS_PARAMS_MAX, "a layer's parameters must fit a block");
_Static_assert(DECODER_PARAM_NAME_MAX == MODEL_BLOCKS_NAME_MAX, "parameter names must fit");

typedef struct decoder_blocks_ws {
    decoder_config cfg;
    decoder_model_ws *ws;
} decoder_blocks_ws;

static int blocks_check(const void *impl, fsdp_err *err) { return decoder_model_check(impl, err); }

static int blocks_check_opts(const void *impl, const model_blocks_ws_opts *o, const char *what, fsdp_err *err) {
    (void)impl;
    return decoder_head_chunk_check(o->head_chunk_rows, what, err) ? FSDP_E_INVALID : 0;
}

static void tensor(model_blocks_tensor *t, const char *name, int64_t numel) {
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->numel = numel;
}

static void blocks_layout(const void *impl, model_blocks_layout *out) {
    const decoder_config *cfg = impl;
    decoder_param_kind kinds[DECODER_PARAMS_PER_LAYER_MAX];
    const int64_t V = cfg->vocab_size, d = cfg->dim;
    memset(out, 0, sizeof *out);
    out->n_blocks = cfg->n_layers;
    for (int l = 0; l < cfg->n_layers; l++) {
        int per = decoder_params_layer_kinds(cfg, l, kinds);
        int64_t numel = decoder_model_layer_numel(cfg, l);
        if (per > out->per_block) out->per_block = per;
        if (numel > out->block_numel) out->block_numel = numel;
    }
    tensor(&out->embed, "tok_embeddings.weight", V * d);
    tensor(&out->norm, "norm.weight", d);
    tensor(&out->output, "output.weight", V * d);
    out->tied = cfg->tie_embeddings;
    out->n_params = decoder_model_param_count(cfg);
    out->ignore_index = DECODER_MODEL_IGNORE_INDEX;
    out->n_aux = DECODER_MODEL_AUX_STATS(cfg);
    out->n_experts = cfg->n_experts;
}

static void blocks_block_shape(const void *impl, int block, int *n_params, int64_t *numel) {
    const decoder_config *cfg = impl;
    decoder_param_kind kinds[DECODER_PARAMS_PER_LAYER_MAX];
    *n_params = decoder_params_layer_kinds(cfg, block, kinds);
    *numel = decoder_model_layer_numel(cfg, block);
}

/* Name and size from the parameter table, the offset from the model's own layout of a block
 * (decoder_model_layer_offset: the same sizes decoder_model_layer_bind binds with). */
static void blocks_block_param(const void *impl, int block, int k, model_blocks_tensor *out) {
    const decoder_config *cfg = impl;
    decoder_param_kind kinds[DECODER_PARAMS_PER_LAYER_MAX];
    decoder_params_layer_kinds(cfg, block, kinds);
    decoder_param p;
    decoder_param_describe(cfg, kinds[k], block, &p);
    memset(out, 0, sizeof *out);
    memcpy(out->name, p.name, sizeof out->name);
    out->numel = p.numel;
    out->offset = decoder_model_layer_offset(cfg, block, kinds[k]);
}

static void *blocks_ws_create(const void *impl, int B, int T, const model_blocks_ws_opts *o, fsdp_err *err) {
    decoder_blocks_ws *w = calloc(1, sizeof *w);
    if (!w) {
        fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (model workspace)");
        return NULL;
    }
    w->cfg = *(const decoder_config *)impl;
    decoder_model_ws_opts wo = {o->ac, o->head_chunk_rows};
    w->ws = decoder_model_ws_create_opts(&w->cfg, B, T, &wo, err);
    if (!w->ws) {
        free(w);
        return NULL;
    }
    return w;
}

static void blocks_ws_free(void *ws) {
    decoder_blocks_ws *w = ws;
    if (!w) return;
    decoder_model_ws_free(w->ws);
    free(w);
}

static int blocks_fwd_embed(void *ws, const float *embed, const int32_t *tokens, const int32_t *labels, int B, int T,
                            fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    return decoder_fwd_embed(&w->cfg, embed, tokens, labels, B, T, w->ws, err);
}

static int blocks_fwd_block(void *ws, int block, const float *wb, fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    decoder_model_layer lw;
    decoder_model_layer_bind(&w->cfg, block, (float *)(uintptr_t)wb, &lw);
    return decoder_fwd_layer(&w->cfg, &lw, block, w->ws, err);
}

static int blocks_head_train(void *ws, const float *norm, const float *output, float *d_norm, float *d_output,
                             double loss_denom, double *loss_sum, fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    decoder_model_loss loss;
    int rc = decoder_head_train(&w->cfg, norm, output, d_norm, d_output, loss_denom, w->ws, &loss, err);
    if (!rc) *loss_sum = loss.loss_sum;
    return rc;
}

static int blocks_bwd_block(void *ws, int block, const float *wb, float *g, fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    decoder_model_layer lw, lg;
    decoder_model_layer_bind(&w->cfg, block, (float *)(uintptr_t)wb, &lw);
    decoder_model_layer_bind(&w->cfg, block, g, &lg);
    return decoder_bwd_layer(&w->cfg, &lw, &lg, block, w->ws, err);
}

static int blocks_bwd_embed(void *ws, float *d_embed, fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    return decoder_bwd_embed(&w->cfg, d_embed, w->ws, err);
}

static int blocks_aux_stats(void *ws, double *stats, fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    return decoder_model_aux_stats(w->ws, stats, err);
}

static int blocks_aux_apply(void *ws, const double *sums, double scale, model_blocks_aux *out, fsdp_err *err) {
    decoder_blocks_ws *w = ws;
    int rc = decoder_model_aux_apply(w->ws, sums, scale, &out->loss, err);
    out->weighted = rc ? 0.0 : w->cfg.router_aux_coef * out->loss;
    return rc;
}

static int blocks_expert_load(void *ws, int block, int64_t *counts) {
    decoder_blocks_ws *w = ws;
    return decoder_model_expert_load(w->ws, block, counts, NULL) == 0;
}

model_blocks decoder_blocks_cpu(const decoder_config *cfg) {
    model_blocks m = {
        .impl = cfg,
        .check = blocks_check,
        .check_opts = blocks_check_opts,
        .layout = blocks_layout,
        .block_param = blocks_block_param,
        .block_shape = blocks_block_shape,
        .ws_create = blocks_ws_create,
        .ws_free = blocks_ws_free,
        .fwd_embed = blocks_fwd_embed,
        .fwd_block = blocks_fwd_block,
        .head_train = blocks_head_train,
        .bwd_block = blocks_bwd_block,
        .bwd_embed = blocks_bwd_embed,
    };
    if (cfg && cfg->n_experts > 0) {
        m.aux_stats = blocks_aux_stats;
        m.aux_apply = blocks_aux_apply;
        m.expert_load = blocks_expert_load;
    }
    return m;
}
