/* The decoder family's parameter table (see decoder_params.h), and the parameter counts. */
#include "decoder/decoder_params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[DECODER_P_KIND_COUNT] = {
    "tok_embeddings.weight",  "attention.wq.weight",     "attention.wk.weight",    "attention.wv.weight",
    "attention.wo.weight",    "feed_forward.w1.weight",  "feed_forward.w2.weight", "feed_forward.w3.weight",
    "attention_norm.weight",  "ffn_norm.weight",         "norm.weight",            "output.weight",
    "attention.wq.bias",      "attention.wk.bias",       "attention.wv.bias",      "attention.q_norm.weight",
    "attention.k_norm.weight", "moe.experts.w1",         "moe.experts.w2",         "moe.experts.w3",
    "moe.router.gate.weight",
};

const char *decoder_param_kind_name(decoder_param_kind kind) {
    return kind >= 0 && kind < DECODER_P_KIND_COUNT ? KIND_NAMES[kind] : NULL;
}

int decoder_param_kind_is_layer(decoder_param_kind kind) {
    return kind >= 0 && kind < DECODER_P_KIND_COUNT && kind != DECODER_P_TOK_EMBEDDINGS && kind != DECODER_P_NORM &&
           kind != DECODER_P_OUTPUT;
}

int decoder_params_layer_kinds(const decoder_config *c, int layer, decoder_param_kind *k) {
    int n = 0;
    k[n++] = DECODER_P_WQ;
    if (c->qkv_bias) k[n++] = DECODER_P_WQ_BIAS;
    k[n++] = DECODER_P_WK;
    if (c->qkv_bias) k[n++] = DECODER_P_WK_BIAS;
    k[n++] = DECODER_P_WV;
    if (c->qkv_bias) k[n++] = DECODER_P_WV_BIAS;
    k[n++] = DECODER_P_WO;
    if (c->qk_norm) {
        k[n++] = DECODER_P_Q_NORM;
        k[n++] = DECODER_P_K_NORM;
    }
    if (decoder_layer_is_moe(c, layer)) {
        k[n++] = DECODER_P_EXPERTS_W1;
        k[n++] = DECODER_P_EXPERTS_W2;
        k[n++] = DECODER_P_EXPERTS_W3;
        k[n++] = DECODER_P_ROUTER;
    } else {
        k[n++] = DECODER_P_W1;
        k[n++] = DECODER_P_W2;
        k[n++] = DECODER_P_W3;
    }
    k[n++] = DECODER_P_ATTENTION_NORM;
    k[n++] = DECODER_P_FFN_NORM;
    return n;
}

static init_rule trunc_rule(double std, double a, double b) {
    init_rule r;
    init_rule_default(INIT_TRUNC_NORMAL, &r);
    r.std = std;
    r.a = a;
    r.b = b;
    return r;
}

/* Global shape of kind: shape[0..2] (the unused dims 1) and *ndim. */
static void shape_of(const decoder_config *c, decoder_param_kind kind, int64_t *shape, int *ndim) {
    const int64_t d = c->dim, hd = c->head_dim, F = c->ffn_hidden, V = c->vocab_size, E = c->n_experts,
                  Fm = c->moe_ffn_hidden;
    const int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
    int64_t r = 0, cl = 1, z = 1;
    *ndim = 2;
    switch (kind) {
    case DECODER_P_TOK_EMBEDDINGS:
    case DECODER_P_OUTPUT: r = V, cl = d; break;
    case DECODER_P_WQ: r = qd, cl = d; break;
    case DECODER_P_WK:
    case DECODER_P_WV: r = kvd, cl = d; break;
    case DECODER_P_WO: r = d, cl = qd; break;
    case DECODER_P_W1:
    case DECODER_P_W3: r = F, cl = d; break;
    case DECODER_P_W2: r = d, cl = F; break;
    case DECODER_P_WQ_BIAS: r = qd, *ndim = 1; break;
    case DECODER_P_WK_BIAS:
    case DECODER_P_WV_BIAS: r = kvd, *ndim = 1; break;
    case DECODER_P_Q_NORM: r = c->qk_norm_full ? qd : hd, *ndim = 1; break;
    case DECODER_P_K_NORM: r = c->qk_norm_full ? kvd : hd, *ndim = 1; break;
    case DECODER_P_EXPERTS_W1:
    case DECODER_P_EXPERTS_W3: r = E, cl = Fm, z = d, *ndim = 3; break;
    case DECODER_P_EXPERTS_W2: r = E, cl = d, z = Fm, *ndim = 3; break;
    case DECODER_P_ROUTER: r = E, cl = d; break;
    default: r = d, *ndim = 1; break; /* the RMSNorm weights */
    }
    shape[0] = r;
    shape[1] = cl;
    shape[2] = z;
}

/* torchtitan's init rule of (kind, layer) (decoder_params.h). */
static init_rule torchtitan_rule(const decoder_config *c, decoder_param_kind kind, int layer) {
    /* torchtitan: 0.02 / (2 * (layer_id + 1)) ** 0.5, and dim ** -0.5 for output (Python's float ** is C pow) */
    const double layer_std = c->depth_init ? 0.02 / pow(2.0 * (layer + 1), 0.5) : 0.02 / pow(2.0 * c->n_layers, 0.5);
    init_rule r;
    switch (kind) {
    case DECODER_P_TOK_EMBEDDINGS:
        if (c->tie_embeddings) return torchtitan_rule(c, DECODER_P_OUTPUT, layer); /* the head's (torchtitan skips it) */
        init_rule_default(INIT_NORMAL, &r); /* normal(0, 1) */
        return r;
    case DECODER_P_WQ:
    case DECODER_P_WK:
    case DECODER_P_WV:
    case DECODER_P_W1:
    case DECODER_P_EXPERTS_W1: return trunc_rule(0.02, -2.0, 2.0);
    case DECODER_P_WO:
    case DECODER_P_W2:
    case DECODER_P_W3:
    case DECODER_P_EXPERTS_W2:
    case DECODER_P_EXPERTS_W3:
    case DECODER_P_ROUTER: return trunc_rule(layer_std, -2.0, 2.0);
    case DECODER_P_OUTPUT: {
        double s = pow((double)c->dim, -0.5);
        return trunc_rule(s, -3.0 * s, 3.0 * s);
    }
    case DECODER_P_WQ_BIAS:
    case DECODER_P_WK_BIAS:
    case DECODER_P_WV_BIAS: init_rule_default(INIT_ZEROS, &r); return r;
    default: init_rule_default(INIT_ONES, &r); return r; /* the RMSNorm weights */
    }
}

/* Hugging Face's _init_weights: normal(0, init_std) for matrices and the embedding, whose padding row
 * (padding_idx = pad_token_id) it zeroes. */
static init_rule hf_rule(const decoder_config *c, decoder_param_kind kind, int ndim) {
    init_rule r;
    if (kind == DECODER_P_WQ_BIAS || kind == DECODER_P_WK_BIAS || kind == DECODER_P_WV_BIAS) {
        init_rule_default(INIT_ZEROS, &r);
    } else if (ndim == 1) {
        init_rule_default(INIT_ONES, &r);
    } else {
        init_rule_default(INIT_NORMAL, &r);
        r.std = c->init_std;
    }
    if (kind == DECODER_P_TOK_EMBEDDINGS && c->has_padding_idx) {
        r.has_zero_row = 1;
        r.zero_row = c->padding_idx;
    }
    return r;
}

void decoder_param_describe(const decoder_config *c, decoder_param_kind kind, int layer, decoder_param *p) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->layer = decoder_param_kind_is_layer(kind) ? layer : -1;
    if (p->layer >= 0)
        snprintf(p->name, sizeof p->name, "layers.%d.%s", layer, KIND_NAMES[kind]);
    else
        snprintf(p->name, sizeof p->name, "%s", KIND_NAMES[kind]);
    shape_of(c, kind, p->shape, &p->ndim);
    p->init = c->init_std > 0 ? hf_rule(c, kind, p->ndim) : torchtitan_rule(c, kind, p->layer);
    p->row_numel = p->shape[1] * p->shape[2];
    p->numel = p->shape[0] * p->row_numel;
}

/* The parameters outside the layers: tok_embeddings first, then norm (and output unless tied). */
static int head_kinds(const decoder_config *c, decoder_param_kind *k) {
    k[0] = DECODER_P_NORM;
    if (c->tie_embeddings) return 1;
    k[1] = DECODER_P_OUTPUT;
    return 2;
}

/* ceil(rows / world) * row elements of kind, added to *total; 0 on overflow. */
static int add_rows(const decoder_config *c, decoder_param_kind kind, int64_t world, int64_t *total) {
    int64_t sh[3], t, row;
    int ndim;
    shape_of(c, kind, sh, &ndim);
    return !__builtin_mul_overflow(sh[1], sh[2], &row) && !__builtin_mul_overflow((sh[0] + world - 1) / world, row, &t) &&
           !__builtin_add_overflow(*total, t, total);
}

/* Sum over the parameters of ceil(rows / world) * row elements (world 1: the parameter count); -1 on
 * overflow. The derived sizes of c must be set. A dense and a MoE layer are each counted once and
 * multiplied by their numbers. */
static int64_t count_rows(const decoder_config *c, int64_t world) {
    decoder_param_kind k[DECODER_PARAMS_PER_LAYER_MAX];
    const int n_moe = decoder_moe_layers(c), n_dense = c->n_layers - n_moe;
    int64_t total = 0, t;
    for (int moe = 0; moe < 2; moe++) {
        int count = moe ? n_moe : n_dense, layer = -1;
        for (int l = 0; l < c->n_layers && layer < 0; l++)
            if (decoder_layer_is_moe(c, l) == moe) layer = l;
        if (!count) continue;
        int64_t block = 0;
        int nk = decoder_params_layer_kinds(c, layer, k);
        for (int i = 0; i < nk; i++)
            if (!add_rows(c, k[i], world, &block)) return -1;
        if (__builtin_mul_overflow(block, (int64_t)count, &t) || __builtin_add_overflow(total, t, &total)) return -1;
    }
    decoder_param_kind g[3] = {DECODER_P_TOK_EMBEDDINGS};
    int ng = 1 + head_kinds(c, g + 1);
    for (int i = 0; i < ng; i++)
        if (!add_rows(c, g[i], world, &total)) return -1;
    return total;
}

/* The derived fields are set and every size is positive. */
static int counts_valid(const decoder_config *c) {
    return c && c->dim > 0 && c->n_layers > 0 && c->n_heads > 0 && c->n_kv_heads > 0 && c->vocab_size > 0 &&
           c->head_dim > 0 && c->ffn_hidden > 0 && (c->n_experts == 0 || (c->n_experts > 0 && c->moe_ffn_hidden > 0));
}

int64_t decoder_param_count(const decoder_config *cfg) { return counts_valid(cfg) ? count_rows(cfg, 1) : -1; }

int64_t decoder_param_count_shard(const decoder_config *cfg, int world) {
    if (world < 1 || decoder_param_count(cfg) < 0) return -1;
    return count_rows(cfg, world);
}

int decoder_params_build(const decoder_config *cfg, decoder_params *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    if (decoder_param_count(cfg) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder parameter table: the model config is invalid or not finalized");
    decoder_param_kind lk[DECODER_PARAMS_PER_LAYER_MAX], hk[2];
    const int nh = head_kinds(cfg, hk);
    if (cfg->n_layers > (INT32_MAX - 3) / DECODER_PARAMS_PER_LAYER_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder parameter table: n_layers %d is too large",
                            cfg->n_layers);
    out->layer_start = calloc((size_t)cfg->n_layers + 1, sizeof *out->layer_start);
    out->layer_moe = calloc((size_t)cfg->n_layers, sizeof *out->layer_moe);
    int n = 1 + nh;
    for (int i = 0; i < cfg->n_layers; i++) n += decoder_params_layer_kinds(cfg, i, lk);
    decoder_param *p = calloc((size_t)n, sizeof *p);
    if (!p || !out->layer_start || !out->layer_moe) {
        free(p);
        decoder_params_free(out);
        return fsdp_err_set(err, FSDP_E_NOMEM, "decoder parameter table: out of memory (%d entries)", n);
    }
    for (int m = 0; m < 2; m++)
        for (int j = 0; j < DECODER_P_KIND_COUNT; j++) out->slot[m][j] = -1;
    int k = 0;
    decoder_param_describe(cfg, DECODER_P_TOK_EMBEDDINGS, -1, &p[k++]);
    for (int i = 0; i < cfg->n_layers; i++) {
        const int moe = decoder_layer_is_moe(cfg, i), per = decoder_params_layer_kinds(cfg, i, lk);
        out->layer_start[i] = k;
        out->layer_moe[i] = moe;
        for (int j = 0; j < per; j++) {
            out->slot[moe][lk[j]] = j;
            decoder_param_describe(cfg, lk[j], i, &p[k++]);
        }
    }
    out->layer_start[cfg->n_layers] = k;
    for (int j = 0; j < nh; j++) decoder_param_describe(cfg, hk[j], -1, &p[k++]);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        p[i].offset = off;
        off += p[i].numel; /* cannot overflow: decoder_param_count succeeded */
    }
    out->p = p;
    out->n = n;
    out->total = off;
    out->n_layers = cfg->n_layers;
    out->tied = cfg->tie_embeddings;
    return FSDP_OK;
}

void decoder_params_free(decoder_params *t) {
    if (!t) return;
    free(t->p);
    free(t->layer_start);
    free(t->layer_moe);
    memset(t, 0, sizeof *t);
}

int decoder_params_index(const decoder_params *t, decoder_param_kind kind, int layer) {
    if (!t || !t->p || kind < 0 || kind >= DECODER_P_KIND_COUNT) return -1;
    const int norm = t->layer_start[t->n_layers];
    switch (kind) {
    case DECODER_P_TOK_EMBEDDINGS: return 0;
    case DECODER_P_NORM: return norm;
    case DECODER_P_OUTPUT: return t->tied ? -1 : norm + 1;
    default:
        if (layer < 0 || layer >= t->n_layers) return -1;
        int slot = t->slot[t->layer_moe[layer]][kind];
        return slot < 0 ? -1 : t->layer_start[layer] + slot;
    }
}

/* O(1) in the number of layers: the name's layer and kind give its index (decoder_params_index),
 * and the entry there must carry exactly that name. */
int decoder_params_find(const decoder_params *t, const char *name) {
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
    for (int k = 0; k < DECODER_P_KIND_COUNT; k++) {
        if (strcmp(rest, KIND_NAMES[k])) continue;
        if (decoder_param_kind_is_layer((decoder_param_kind)k) != (layer >= 0)) return -1;
        int i = decoder_params_index(t, (decoder_param_kind)k, layer);
        return i >= 0 && !strcmp(t->p[i].name, name) ? i : -1;
    }
    return -1;
}
