/* Llama model: config checks, the flat parameter layout and parameter enumeration. */
#include "model/llama_model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int llama_model_check(const llama_config *c, fsdp_err *err) {
    if (!c) return fsdp_err_set(err, FSDP_E_INVALID, "llama model: no config");
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->vocab_size <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "llama model: dim %d, n_layers %d, n_heads %d, n_kv_heads %d and vocab_size %d must "
                            "all be positive",
                            c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size);
    if (c->n_heads % c->n_kv_heads != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: n_heads %d is not a multiple of n_kv_heads %d",
                            c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "llama model: head_dim %d must be positive and even (is the config finalized?)",
                            c->head_dim);
    if (c->ffn_hidden <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: ffn_hidden %d must be positive (is the config finalized?)",
                            c->ffn_hidden);
    if ((int64_t)c->n_heads * c->head_dim > INT_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: n_heads*head_dim = %lld does not fit in int",
                            (long long)c->n_heads * c->head_dim);
    if (!(c->norm_eps > 0.0) || !isfinite(c->norm_eps))
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: norm_eps %g must be a positive number", c->norm_eps);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: rope_theta %g must be a positive number", c->rope_theta);
    if (c->rope_scaling != LLAMA_ROPE_NONE && c->rope_scaling != LLAMA_ROPE_LLAMA3)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: unknown rope_scaling %d", (int)c->rope_scaling);
    if (c->rope_scaling == LLAMA_ROPE_LLAMA3 &&
        (!(c->rope_factor > 0.0) || !(c->rope_low_freq_factor > 0.0) || !(c->rope_high_freq_factor > 0.0) ||
         c->rope_original_max_pos <= 0 || c->rope_low_freq_factor == c->rope_high_freq_factor))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "llama model: llama3 rope scaling needs factor %g, low_freq_factor %g, high_freq_factor "
                            "%g and original_max_pos %d positive, with low != high",
                            c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                            c->rope_original_max_pos);
    if (llama_model_numel(c) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: the parameter count overflows int64");
    return FSDP_OK;
}

/* Sizes of the nine tensors of a layer, in layout order. */
static void layer_sizes(const llama_config *c, int64_t sz[9]) {
    int64_t d = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim,
            F = c->ffn_hidden;
    sz[0] = qd * d;  /* wq */
    sz[1] = kvd * d; /* wk */
    sz[2] = kvd * d; /* wv */
    sz[3] = d * qd;  /* wo */
    sz[4] = F * d;   /* w1 */
    sz[5] = d * F;   /* w2 */
    sz[6] = F * d;   /* w3 */
    sz[7] = d;       /* attention_norm */
    sz[8] = d;       /* ffn_norm */
}

int64_t llama_model_layer_numel(const llama_config *c) {
    if (!c || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || c->ffn_hidden <= 0)
        return -1;
    int64_t sz[9], total = 0;
    layer_sizes(c, sz);
    for (int i = 0; i < 9; i++)
        if (__builtin_add_overflow(total, sz[i], &total)) return -1;
    return total;
}

int64_t llama_model_numel(const llama_config *c) {
    int64_t layer = llama_model_layer_numel(c);
    if (layer < 0 || c->n_layers <= 0 || c->vocab_size <= 0) return -1;
    int64_t layers, total;
    if (__builtin_mul_overflow(layer, (int64_t)c->n_layers, &layers)) return -1;
    /* vocab_size, dim < 2^31: 2*V*d + d < 2^63 */
    if (__builtin_add_overflow(layers, 2 * (int64_t)c->vocab_size * c->dim + c->dim, &total)) return -1;
    return total;
}

void llama_model_layer_bind(const llama_config *c, float *flat_layer, llama_model_layer *lw) {
    int64_t sz[9];
    layer_sizes(c, sz);
    float **slots[9] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w1, &lw->w2, &lw->w3, &lw->attention_norm,
                        &lw->ffn_norm};
    float *p = flat_layer;
    for (int i = 0; i < 9; i++) {
        *slots[i] = p;
        p += sz[i];
    }
}

int llama_model_weights_bind(const llama_config *c, float *flat, llama_model_weights *w, fsdp_err *err) {
    int rc = llama_model_check(c, err);
    if (rc) return rc;
    memset(w, 0, sizeof *w);
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers)
        return fsdp_err_set(err, FSDP_E_NOMEM, "llama model: cannot allocate %d layer views", c->n_layers);
    w->n_layers = c->n_layers;
    int64_t vd = (int64_t)c->vocab_size * c->dim, layer = llama_model_layer_numel(c);
    float *p = flat;
    w->tok_embeddings = p;
    p += vd;
    for (int i = 0; i < c->n_layers; i++) {
        llama_model_layer_bind(c, p, &w->layers[i]);
        p += layer;
    }
    w->norm = p;
    p += c->dim;
    w->output = p;
    return FSDP_OK;
}

void llama_model_weights_unbind(llama_model_weights *w) {
    if (!w) return;
    free(w->layers);
    memset(w, 0, sizeof *w);
}

int llama_model_param_count(const llama_config *c) {
    return c && c->n_layers > 0 ? 3 + 9 * c->n_layers : 0;
}

static void set2(llama_model_param *o, int64_t a, int64_t b) {
    o->ndim = 2;
    o->shape[0] = a;
    o->shape[1] = b;
    o->numel = a * b;
}

static void set1(llama_model_param *o, int64_t a) {
    o->ndim = 1;
    o->shape[0] = a;
    o->shape[1] = 0;
    o->numel = a;
}

int llama_model_param_at(const llama_config *c, const llama_model_weights *w, int index, llama_model_param *o,
                         fsdp_err *err) {
    int n = llama_model_param_count(c);
    if (index < 0 || index >= n)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: parameter index %d out of range 0..%d", index, n - 1);
    if (!w || w->n_layers != c->n_layers || !w->layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama model: weights have %d layers, config has %d",
                            w ? w->n_layers : -1, c->n_layers);
    memset(o, 0, sizeof *o);
    int64_t d = c->dim, V = c->vocab_size, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn_hidden;
    if (index == 0) {
        snprintf(o->name, sizeof o->name, "tok_embeddings.weight");
        set2(o, V, d);
        o->data = w->tok_embeddings;
        return FSDP_OK;
    }
    if (index == n - 2) {
        snprintf(o->name, sizeof o->name, "norm.weight");
        set1(o, d);
        o->data = w->norm;
        return FSDP_OK;
    }
    if (index == n - 1) {
        snprintf(o->name, sizeof o->name, "output.weight");
        set2(o, V, d);
        o->data = w->output;
        return FSDP_OK;
    }
    int layer = (index - 1) / 9, k = (index - 1) % 9;
    const llama_model_layer *l = &w->layers[layer];
    static const char *const names[9] = {"attention.wq",      "attention.wk",      "attention.wv",
                                         "attention.wo",      "feed_forward.w1",   "feed_forward.w2",
                                         "feed_forward.w3",   "attention_norm",    "ffn_norm"};
    snprintf(o->name, sizeof o->name, "layers.%d.%s.weight", layer, names[k]);
    switch (k) {
    case 0: set2(o, qd, d); o->data = l->wq; break;
    case 1: set2(o, kvd, d); o->data = l->wk; break;
    case 2: set2(o, kvd, d); o->data = l->wv; break;
    case 3: set2(o, d, qd); o->data = l->wo; break;
    case 4: set2(o, F, d); o->data = l->w1; break;
    case 5: set2(o, d, F); o->data = l->w2; break;
    case 6: set2(o, F, d); o->data = l->w3; break;
    case 7: set1(o, d); o->data = l->attention_norm; break;
    default: set1(o, d); o->data = l->ffn_norm; break;
    }
    return FSDP_OK;
}
