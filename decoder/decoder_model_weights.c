/* The decoder model: config checks, the flat parameter layout and parameter enumeration. */
#include "decoder/decoder_model.h"
#include "decoder/decoder_params.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int decoder_model_check(const decoder_config *c, fsdp_err *err) {
    if (!c) return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: no config");
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->vocab_size <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder model: dim %d, n_layers %d, n_heads %d, n_kv_heads %d and vocab_size %d must "
                            "all be positive",
                            c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size);
    if (c->n_heads % c->n_kv_heads != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: n_heads %d is not a multiple of n_kv_heads %d",
                            c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder model: head_dim %d must be positive and even (is the config finalized?)",
                            c->head_dim);
    if (c->ffn_hidden <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: ffn_hidden %d must be positive (is the config finalized?)",
                            c->ffn_hidden);
    if ((int64_t)c->n_heads * c->head_dim > INT_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: n_heads*head_dim = %lld does not fit in int",
                            (long long)c->n_heads * c->head_dim);
    if (!(c->norm_eps > 0.0) || !isfinite(c->norm_eps))
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: norm_eps %g must be a positive number", c->norm_eps);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: rope_theta %g must be a positive number", c->rope_theta);
    if (c->rope_scaling != DECODER_ROPE_NONE && c->rope_scaling != DECODER_ROPE_LLAMA3)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: unknown rope_scaling %d", (int)c->rope_scaling);
    if (c->rope_scaling == DECODER_ROPE_LLAMA3 &&
        (!(c->rope_factor > 0.0) || !(c->rope_low_freq_factor > 0.0) || !(c->rope_high_freq_factor > 0.0) ||
         c->rope_original_max_pos <= 0 || c->rope_low_freq_factor == c->rope_high_freq_factor))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder model: llama3 rope scaling needs factor %g, low_freq_factor %g, high_freq_factor "
                            "%g and original_max_pos %d positive, with low != high",
                            c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                            c->rope_original_max_pos);
    if ((c->qkv_bias | c->qk_norm | c->tie_embeddings) & ~1)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: qkv_bias %d, qk_norm %d and tie_embeddings %d must be 0 or 1",
                            c->qkv_bias, c->qk_norm, c->tie_embeddings);
    int rc = decoder_config_check_moe(c, err);
    if (rc) return fsdp_err_prefix(err, "decoder model");
    if (decoder_model_numel(c) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: the parameter count overflows int64");
    return FSDP_OK;
}

float **decoder_model_layer_slot(decoder_model_layer *l, int kind) {
    switch (kind) {
    case DECODER_P_WQ: return &l->wq;
    case DECODER_P_WK: return &l->wk;
    case DECODER_P_WV: return &l->wv;
    case DECODER_P_WO: return &l->wo;
    case DECODER_P_W1: return &l->w1;
    case DECODER_P_W2: return &l->w2;
    case DECODER_P_W3: return &l->w3;
    case DECODER_P_ATTENTION_NORM: return &l->attention_norm;
    case DECODER_P_FFN_NORM: return &l->ffn_norm;
    case DECODER_P_WQ_BIAS: return &l->wq_b;
    case DECODER_P_WK_BIAS: return &l->wk_b;
    case DECODER_P_WV_BIAS: return &l->wv_b;
    case DECODER_P_Q_NORM: return &l->q_norm;
    case DECODER_P_K_NORM: return &l->k_norm;
    case DECODER_P_EXPERTS_W1: return &l->ew1;
    case DECODER_P_EXPERTS_W2: return &l->ew2;
    case DECODER_P_EXPERTS_W3: return &l->ew3;
    case DECODER_P_ROUTER: return &l->router;
    default: return NULL;
    }
}

/* The sizes of a layer's tensors in table order; returns their number. */
static int layer_sizes(const decoder_config *c, int layer, decoder_param_kind *kinds, int64_t *sz) {
    int n = decoder_params_layer_kinds(c, layer, kinds);
    for (int i = 0; i < n; i++) {
        decoder_param p;
        decoder_param_describe(c, kinds[i], layer, &p);
        sz[i] = p.numel;
    }
    return n;
}

int64_t decoder_model_layer_numel(const decoder_config *c, int layer) {
    if (!c || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || c->ffn_hidden <= 0)
        return -1;
    decoder_param_kind k[DECODER_PARAMS_PER_LAYER_MAX];
    int64_t sz[DECODER_PARAMS_PER_LAYER_MAX], total = 0;
    int n = layer_sizes(c, layer, k, sz);
    for (int i = 0; i < n; i++)
        if (__builtin_add_overflow(total, sz[i], &total)) return -1;
    return total;
}

int64_t decoder_model_numel(const decoder_config *c) {
    if (decoder_model_layer_numel(c, 0) < 0 || c->n_layers <= 0 || c->vocab_size <= 0) return -1;
    return decoder_param_count(c);
}

int64_t decoder_model_layer_offset(const decoder_config *c, int layer, int kind) {
    decoder_param_kind k[DECODER_PARAMS_PER_LAYER_MAX];
    int64_t sz[DECODER_PARAMS_PER_LAYER_MAX], at = 0;
    int n = layer_sizes(c, layer, k, sz);
    for (int i = 0; i < n; i++) {
        if ((int)k[i] == kind) return at;
        at += sz[i];
    }
    return -1;
}

void decoder_model_layer_bind(const decoder_config *c, int layer, float *flat_layer, decoder_model_layer *lw) {
    decoder_param_kind k[DECODER_PARAMS_PER_LAYER_MAX];
    int64_t sz[DECODER_PARAMS_PER_LAYER_MAX];
    int n = layer_sizes(c, layer, k, sz);
    memset(lw, 0, sizeof *lw);
    float *p = flat_layer;
    for (int i = 0; i < n; i++) {
        *decoder_model_layer_slot(lw, k[i]) = p;
        p += sz[i];
    }
}

int decoder_model_weights_bind(const decoder_config *c, float *flat, decoder_model_weights *w, fsdp_err *err) {
    int rc = decoder_model_check(c, err);
    if (rc) return rc;
    memset(w, 0, sizeof *w);
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers)
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder model: cannot allocate %d layer views", c->n_layers);
    w->n_layers = c->n_layers;
    int64_t vd = (int64_t)c->vocab_size * c->dim;
    float *p = flat;
    w->tok_embeddings = p;
    p += vd;
    for (int i = 0; i < c->n_layers; i++) {
        decoder_model_layer_bind(c, i, p, &w->layers[i]);
        p += decoder_model_layer_numel(c, i);
    }
    w->norm = p;
    p += c->dim;
    w->output = c->tie_embeddings ? w->tok_embeddings : p;
    return FSDP_OK;
}

void decoder_model_weights_unbind(decoder_model_weights *w) {
    if (!w) return;
    free(w->layers);
    memset(w, 0, sizeof *w);
}

int decoder_model_param_count(const decoder_config *c) {
    if (!c || c->n_layers <= 0) return 0;
    decoder_param_kind k[DECODER_PARAMS_PER_LAYER_MAX];
    int n = 1 + (c->tie_embeddings ? 1 : 2);
    for (int l = 0; l < c->n_layers; l++) n += decoder_params_layer_kinds(c, l, k);
    return n;
}

int decoder_model_param_at(const decoder_config *c, const decoder_model_weights *w, int index, decoder_model_param *o,
                         fsdp_err *err) {
    int n = decoder_model_param_count(c);
    if (index < 0 || index >= n)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: parameter index %d out of range 0..%d", index, n - 1);
    if (!w || w->n_layers != c->n_layers || !w->layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder model: weights have %d layers, config has %d",
                            w ? w->n_layers : -1, c->n_layers);
    decoder_param_kind k[DECODER_PARAMS_PER_LAYER_MAX];
    decoder_param p;
    float *data = NULL;
    int at = index - 1, layer = 0;
    if (index == 0) {
        decoder_param_describe(c, DECODER_P_TOK_EMBEDDINGS, -1, &p);
        data = w->tok_embeddings;
    } else {
        for (; layer < c->n_layers; layer++) {
            int per = decoder_params_layer_kinds(c, layer, k);
            if (at < per) break;
            at -= per;
        }
        if (layer < c->n_layers) {
            decoder_param_describe(c, k[at], layer, &p);
            data = *decoder_model_layer_slot(&w->layers[layer], p.kind);
        } else {
            decoder_param_describe(c, at == 0 ? DECODER_P_NORM : DECODER_P_OUTPUT, -1, &p);
            data = at == 0 ? w->norm : w->output;
        }
    }
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", p.name);
    o->ndim = p.ndim;
    for (int d = 0; d < 3; d++) o->shape[d] = d < p.ndim ? p.shape[d] : 0;
    o->numel = p.numel;
    o->data = data;
    return FSDP_OK;
}
