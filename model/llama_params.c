/* The Llama-3 parameter table (see llama_params.h). */
#include "model/llama_params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[LLAMA_P_KIND_COUNT] = {
    "tok_embeddings.weight",     "attention.wq.weight",       "attention.wk.weight",
    "attention.wv.weight",       "attention.wo.weight",       "feed_forward.w1.weight",
    "feed_forward.w2.weight",    "feed_forward.w3.weight",    "attention_norm.weight",
    "ffn_norm.weight",           "norm.weight",               "output.weight",
};

const char *llama_param_kind_name(llama_param_kind kind) {
    return kind >= 0 && kind < LLAMA_P_KIND_COUNT ? KIND_NAMES[kind] : NULL;
}

static init_rule trunc_rule(double std, double a, double b) {
    init_rule r;
    init_rule_default(INIT_TRUNC_NORMAL, &r);
    r.std = std;
    r.a = a;
    r.b = b;
    return r;
}

/* Fills p's name, shape and init for (kind, layer). */
static void describe(const llama_config *c, llama_param_kind kind, int layer, llama_param *p) {
    const int64_t d = c->dim, hd = c->head_dim, F = c->ffn_hidden, V = c->vocab_size;
    const int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
    /* torchtitan: 0.02 / (2 * (layer_id + 1)) ** 0.5, and dim ** -0.5 for output (Python's
     * float ** is C pow) */
    const double layer_std = c->depth_init ? 0.02 / pow(2.0 * (layer + 1), 0.5)
                                           : 0.02 / pow(2.0 * c->n_layers, 0.5);
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->layer = layer;
    p->ndim = 2;
    if (layer >= 0)
        snprintf(p->name, sizeof p->name, "layers.%d.%s", layer, KIND_NAMES[kind]);
    else
        snprintf(p->name, sizeof p->name, "%s", KIND_NAMES[kind]);
    int64_t r = 0, cols = 1;
    switch (kind) {
    case LLAMA_P_TOK_EMBEDDINGS:
        r = V, cols = d;
        init_rule_default(INIT_NORMAL, &p->init); /* normal(0, 1) */
        break;
    case LLAMA_P_WQ: r = qd, cols = d, p->init = trunc_rule(0.02, -2.0, 2.0); break;
    case LLAMA_P_WK:
    case LLAMA_P_WV: r = kvd, cols = d, p->init = trunc_rule(0.02, -2.0, 2.0); break;
    case LLAMA_P_WO: r = d, cols = qd, p->init = trunc_rule(layer_std, -2.0, 2.0); break;
    case LLAMA_P_W1: r = F, cols = d, p->init = trunc_rule(0.02, -2.0, 2.0); break;
    case LLAMA_P_W2: r = d, cols = F, p->init = trunc_rule(layer_std, -2.0, 2.0); break;
    case LLAMA_P_W3: r = F, cols = d, p->init = trunc_rule(layer_std, -2.0, 2.0); break;
    case LLAMA_P_ATTENTION_NORM:
    case LLAMA_P_FFN_NORM:
    case LLAMA_P_NORM:
        r = d, p->ndim = 1;
        init_rule_default(INIT_ONES, &p->init);
        break;
    case LLAMA_P_OUTPUT: {
        double s = pow((double)d, -0.5);
        r = V, cols = d, p->init = trunc_rule(s, -3.0 * s, 3.0 * s);
        break;
    }
    default: break;
    }
    p->shape[0] = r;
    p->shape[1] = cols;
    p->row_numel = cols;
    p->numel = r * cols;
}

int llama_params_build(const llama_config *cfg, llama_params *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    if (llama_param_count(cfg) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "llama parameter table: the model config is invalid or not finalized");
    if (cfg->n_layers > (INT32_MAX - 3) / LLAMA_PARAMS_PER_LAYER)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama parameter table: n_layers %d is too large",
                            cfg->n_layers);
    int n = 3 + LLAMA_PARAMS_PER_LAYER * cfg->n_layers;
    llama_param *p = calloc((size_t)n, sizeof *p);
    if (!p)
        return fsdp_err_set(err, FSDP_E_NOMEM, "llama parameter table: out of memory (%d entries)",
                            n);
    int k = 0;
    describe(cfg, LLAMA_P_TOK_EMBEDDINGS, -1, &p[k++]);
    for (int i = 0; i < cfg->n_layers; i++)
        for (int j = LLAMA_P_WQ; j <= LLAMA_P_FFN_NORM; j++)
            describe(cfg, (llama_param_kind)j, i, &p[k++]);
    describe(cfg, LLAMA_P_NORM, -1, &p[k++]);
    describe(cfg, LLAMA_P_OUTPUT, -1, &p[k++]);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        p[i].offset = off;
        off += p[i].numel; /* cannot overflow: llama_param_count succeeded */
    }
    out->p = p;
    out->n = n;
    out->total = off;
    return FSDP_OK;
}

void llama_params_free(llama_params *t) {
    if (!t) return;
    free(t->p);
    t->p = NULL;
    t->n = 0;
    t->total = 0;
}

int llama_params_index(const llama_params *t, llama_param_kind kind, int layer) {
    if (!t || t->n < 3) return -1;
    int n_layers = (t->n - 3) / LLAMA_PARAMS_PER_LAYER;
    switch (kind) {
    case LLAMA_P_TOK_EMBEDDINGS: return 0;
    case LLAMA_P_NORM: return t->n - 2;
    case LLAMA_P_OUTPUT: return t->n - 1;
    default:
        if (kind < LLAMA_P_WQ || kind > LLAMA_P_FFN_NORM || layer < 0 || layer >= n_layers)
            return -1;
        return 1 + layer * LLAMA_PARAMS_PER_LAYER + (kind - LLAMA_P_WQ);
    }
}

/* O(1) in the number of layers: the name's layer and kind give its index (llama_params_index),
 * and the entry there must carry exactly that name. */
int llama_params_find(const llama_params *t, const char *name) {
    if (!t || !name) return -1;
    int layer = -1;
    const char *rest = name;
    if (!strncmp(name, "layers.", 7)) {
        const char *d = name + 7;
        long v = 0;
        while (*d >= '0' && *d <= '9' && v <= INT32_MAX) v = v * 10 + (*d++ - '0');
        if (d == name + 7 || *d != '.' || v > INT32_MAX) return -1;
        layer = (int)v;
        rest = d + 1;
    }
    for (int k = 0; k < LLAMA_P_KIND_COUNT; k++) {
        if (strcmp(rest, KIND_NAMES[k])) continue;
        int i = llama_params_index(t, (llama_param_kind)k, layer);
        return i >= 0 && !strcmp(t->p[i].name, name) ? i : -1;
    }
    return -1;
}
