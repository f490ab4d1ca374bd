/* Llama-3 configuration: presets, the recipe's `model:` map, validation and derived sizes. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "model/llama.h"

/* ---- presets ------------------------------------------------------------------------- */

typedef struct preset {
    const char *name;
    int dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of;
    double ffn_dim_multiplier; /* 0 = None */
    double rope_theta;
    int max_seq_len;
    llama_rope_scaling scaling;
} preset;

/* torchtitan models/llama3/__init__.py (v0.2.2 for debugmodel/8B/70B/405B; the "1B" flavor exists
 * from 2026-04 on HEAD: dim 2048, 16 layers, 32/8 heads, multiple_of 1024, mult 1.5, and RoPE
 * "llama" scaling with RoPE.Config's defaults 8/1/4/8192, not the factor 32 of Meta's
 * Llama-3.2-1B config.json; it also ties output to tok_embeddings, which this table does not). */
static const preset PRESETS[] = {
    {"tiny", 64, 2, 4, 2, 256, 32, 0.0, 10000.0, 64, LLAMA_ROPE_NONE},
    {"debugmodel", 256, 6, 16, 16, 2048, 256, 0.0, 500000.0, 131072, LLAMA_ROPE_LLAMA3},
    {"llama3_1b", 2048, 16, 32, 8, 128256, 256, 1.5, 500000.0, 131072, LLAMA_ROPE_LLAMA3},
    {"llama3_8b", 4096, 32, 32, 8, 128256, 1024, 1.3, 500000.0, 131072, LLAMA_ROPE_LLAMA3},
    {"llama3_70b", 8192, 80, 64, 8, 128256, 4096, 1.3, 500000.0, 131072, LLAMA_ROPE_LLAMA3},
    {"llama3_405b", 16384, 126, 128, 8, 128256, 4096, 1.2, 500000.0, 131072, LLAMA_ROPE_LLAMA3},
};
#define N_PRESETS ((int)(sizeof PRESETS / sizeof *PRESETS))

void llama_config_defaults(llama_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->multiple_of = 256;
    cfg->ffn_dim_multiplier = 0.0;
    cfg->norm_eps = 1e-5;
    cfg->rope_theta = 10000.0;
    cfg->max_seq_len = 131072;
    cfg->depth_init = 1;
    cfg->rope_scaling = LLAMA_ROPE_LLAMA3;
    cfg->rope_factor = 8.0;
    cfg->rope_low_freq_factor = 1.0;
    cfg->rope_high_freq_factor = 4.0;
    cfg->rope_original_max_pos = 8192;
}

const char *llama_config_preset_name(int i) {
    return i >= 0 && i < N_PRESETS ? PRESETS[i].name : NULL;
}

static const preset *find_preset(const char *name) {
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

static void preset_names(char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_PRESETS && len < cap; i++) {
        int k = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", PRESETS[i].name);
        if (k < 0) break;
        len += (size_t)k;
    }
}

/* Overwrites cfg with the preset p (not finalized). */
static void apply_preset(llama_config *cfg, const preset *p) {
    llama_config_defaults(cfg);
    snprintf(cfg->preset, sizeof cfg->preset, "%s", p->name);
    cfg->dim = p->dim;
    cfg->n_layers = p->n_layers;
    cfg->n_heads = p->n_heads;
    cfg->n_kv_heads = p->n_kv_heads;
    cfg->vocab_size = p->vocab_size;
    cfg->multiple_of = p->multiple_of;
    cfg->ffn_dim_multiplier = p->ffn_dim_multiplier;
    cfg->rope_theta = p->rope_theta;
    cfg->max_seq_len = p->max_seq_len;
    cfg->rope_scaling = p->scaling;
}

int llama_config_preset(llama_config *cfg, const char *name, fsdp_err *err) {
    const preset *p = name ? find_preset(name) : NULL;
    if (!p) {
        char names[256];
        preset_names(names, sizeof names);
        return fsdp_err_set(err, FSDP_E_INVALID, "model.preset: unknown preset '%s' (known: %s)",
                            name ? name : "(null)", names);
    }
    apply_preset(cfg, p);
    return llama_config_finalize(cfg, err);
}

/* ---- derived sizes ------------------------------------------------------------------- */

/* ffn_hidden as torchtitan computes it; -1 when it does not fit an int. */
static int64_t ffn_hidden_of(const llama_config *cfg) {
    double h = (double)(2 * (4 * (int64_t)cfg->dim)) / 3.0; /* Python: int(2 * h / 3) */
    int64_t hi = (int64_t)h;
    if (cfg->ffn_dim_multiplier > 0) {
        double m = cfg->ffn_dim_multiplier * (double)hi;
        if (!(m < 0x1p62)) return -1;
        hi = (int64_t)m;
    }
    int64_t mo = cfg->multiple_of;
    if (mo <= 0 || hi > INT32_MAX) return -1;
    int64_t f = mo * ((hi + mo - 1) / mo);
    return f > INT32_MAX ? -1 : f;
}

/* Sum of the parameter sizes of cfg (derived fields filled); -1 on int64 overflow. */
static int64_t count_params(const llama_config *c) {
    const int64_t d = c->dim, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads;
    const int64_t F = c->ffn_hidden, V = c->vocab_size, L = c->n_layers;
    int64_t layer = 0, t, total = 0;
    /* wq [H*hd, d], wk/wv [KV*hd, d], wo [d, H*hd], w1/w3 [F, d], w2 [d, F], 2 norms [d] */
    const int64_t terms[][3] = {{H * hd, d, 2}, {KV * hd, d, 2}, {F, d, 3}, {d, 1, 2}};
    for (size_t i = 0; i < sizeof terms / sizeof *terms; i++) {
        if (__builtin_mul_overflow(terms[i][0], terms[i][1], &t) ||
            __builtin_mul_overflow(t, terms[i][2], &t) || __builtin_add_overflow(layer, t, &layer))
            return -1;
    }
    if (__builtin_mul_overflow(layer, L, &total)) return -1;
    if (__builtin_mul_overflow(V, d, &t)) return -1; /* tok_embeddings and output */
    if (__builtin_add_overflow(total, t, &total) || __builtin_add_overflow(total, t, &total) ||
        __builtin_add_overflow(total, d, &total)) /* final norm */
        return -1;
    return total;
}

/* Sum over the parameters of ceil(rows / world) * cols: what rank 0 (the largest shard) holds. */
static int64_t count_shard(const llama_config *c, int64_t world) {
    const int64_t d = c->dim, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads;
    const int64_t F = c->ffn_hidden, V = c->vocab_size, L = c->n_layers;
    /* {rows, cols, how many}: wq, wk/wv, wo, w1/w3, w2, the two norms; then tok_embeddings/output, norm */
    const int64_t layer_terms[][3] = {{H * hd, d, 1}, {KV * hd, d, 2}, {d, H * hd, 1}, {F, d, 2}, {d, F, 1}, {d, 1, 2}};
    const int64_t model_terms[][3] = {{V, d, 2}, {d, 1, 1}};
    int64_t layer = 0, total = 0, t;
    for (size_t i = 0; i < sizeof layer_terms / sizeof *layer_terms; i++) {
        int64_t rows = (layer_terms[i][0] + world - 1) / world;
        if (__builtin_mul_overflow(rows, layer_terms[i][1], &t) ||
            __builtin_mul_overflow(t, layer_terms[i][2], &t) || __builtin_add_overflow(layer, t, &layer))
            return -1;
    }
    if (__builtin_mul_overflow(layer, L, &total)) return -1;
    for (size_t i = 0; i < sizeof model_terms / sizeof *model_terms; i++) {
        int64_t rows = (model_terms[i][0] + world - 1) / world;
        if (__builtin_mul_overflow(rows, model_terms[i][1], &t) ||
            __builtin_mul_overflow(t, model_terms[i][2], &t) || __builtin_add_overflow(total, t, &total))
            return -1;
    }
    return total;
}

int64_t llama_param_count_shard(const llama_config *cfg, int world) {
    if (world < 1 || llama_param_count(cfg) < 0) return -1;
    return count_shard(cfg, world);
}

int64_t llama_param_count(const llama_config *cfg) {
    if (!cfg || cfg->dim <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 ||
        cfg->vocab_size <= 0 || cfg->head_dim <= 0 || cfg->ffn_hidden <= 0 ||
        cfg->head_dim * cfg->n_heads != cfg->dim)
        return -1;
    return count_params(cfg);
}

double llama_flops_per_token(const llama_config *cfg, int64_t seq_len) {
    int64_t n = llama_param_count(cfg);
    if (n < 0 || seq_len < 0) return -1.0;
    double emb = (double)cfg->vocab_size * (double)cfg->dim;
    return 6.0 * ((double)n - emb) +
           12.0 * cfg->n_layers * (double)cfg->n_heads * cfg->head_dim * (double)seq_len;
}

int llama_config_finalize(llama_config *c, fsdp_err *err) {
    const struct {
        const char *key;
        int v;
    } pos[] = {{"dim", c->dim},
               {"n_layers", c->n_layers},
               {"n_heads", c->n_heads},
               {"vocab_size", c->vocab_size},
               {"multiple_of", c->multiple_of},
               {"max_seq_len", c->max_seq_len}};
    for (size_t i = 0; i < sizeof pos / sizeof *pos; i++)
        if (pos[i].v <= 0)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "model.%s must be > 0 (got %d); set it or choose a model.preset",
                                pos[i].key, pos[i].v);
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->n_kv_heads < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.n_kv_heads must be > 0 (got %d)",
                            c->n_kv_heads);
    if (c->dim % c->n_heads)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.dim (%d) must be divisible by model.n_heads (%d)", c->dim,
                            c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.n_heads (%d) must be divisible by model.n_kv_heads (%d)",
                            c->n_heads, c->n_kv_heads);
    if ((c->dim / c->n_heads) % 2)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: head_dim = dim / n_heads = %d / %d = %d must be even (RoPE "
                            "rotates pairs)", c->dim, c->n_heads, c->dim / c->n_heads);
    if (!isfinite(c->norm_eps) || !(c->norm_eps > 0))
        return fsdp_err_set(err, FSDP_E_INVALID, "model.norm_eps must be finite and > 0 (got %g)",
                            c->norm_eps);
    if (!isfinite(c->rope_theta) || !(c->rope_theta > 0))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.rope_theta must be finite and > 0 (got %g)", c->rope_theta);
    if (isnan(c->ffn_dim_multiplier) || isinf(c->ffn_dim_multiplier) || c->ffn_dim_multiplier < 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.ffn_dim_multiplier must be null or finite and > 0 (got %g)",
                            c->ffn_dim_multiplier);
    if (c->depth_init != 0 && c->depth_init != 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.depth_init must be true or false");
    if (c->rope_scaling == LLAMA_ROPE_LLAMA3) {
        if (!isfinite(c->rope_factor) || !(c->rope_factor > 0))
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "model.rope_factor must be finite and > 0 (got %g)",
                                c->rope_factor);
        if (!isfinite(c->rope_low_freq_factor) || !(c->rope_low_freq_factor > 0) ||
            !isfinite(c->rope_high_freq_factor) ||
            !(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "model.rope_high_freq_factor (%g) must be > "
                                "model.rope_low_freq_factor (%g) > 0",
                                c->rope_high_freq_factor, c->rope_low_freq_factor);
        if (c->rope_original_max_pos <= 0)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "model.rope_original_max_pos must be > 0 (got %d)",
                                c->rope_original_max_pos);
    } else if (c->rope_scaling != LLAMA_ROPE_NONE) {
        return fsdp_err_set(err, FSDP_E_INVALID, "model.rope_scaling: unknown value %d",
                            (int)c->rope_scaling);
    }
    c->head_dim = c->dim / c->n_heads;
    int64_t f = ffn_hidden_of(c);
    if (f <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: FFN hidden size from dim %d, ffn_dim_multiplier %g and "
                            "multiple_of %d is %s",
                            c->dim, c->ffn_dim_multiplier, c->multiple_of,
                            f == 0 ? "0" : "too large for a 32-bit int");
    c->ffn_hidden = (int)f;
    if (count_params(c) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: the parameter count overflows a 64-bit integer");
    return FSDP_OK;
}

/* ---- the recipe's model: map --------------------------------------------------------- */

typedef enum key_kind { K_INT, K_FLOAT, K_BOOL } key_kind;

typedef struct key_desc {
    const char *name;
    key_kind kind;
    size_t off;   /* offset of the int / double field */
    int nullable; /* null stores 0 (None / same as n_heads) */
} key_desc;

#define KI(n) {#n, K_INT, offsetof(llama_config, n), 0}
#define KF(n) {#n, K_FLOAT, offsetof(llama_config, n), 0}
static const key_desc KEYS[] = {
    KI(dim),
    KI(n_layers),
    KI(n_heads),
    {"n_kv_heads", K_INT, offsetof(llama_config, n_kv_heads), 1},
    KI(vocab_size),
    KI(multiple_of),
    {"ffn_dim_multiplier", K_FLOAT, offsetof(llama_config, ffn_dim_multiplier), 1},
    KF(norm_eps),
    KF(rope_theta),
    KI(max_seq_len),
    {"depth_init", K_BOOL, offsetof(llama_config, depth_init), 0},
    KF(rope_factor),
    KF(rope_low_freq_factor),
    KF(rope_high_freq_factor),
    KI(rope_original_max_pos),
};
#undef KI
#undef KF

static int set_key(llama_config *cfg, const key_desc *k, const fsdp_value *v, fsdp_err *err) {
    char *base = (char *)cfg;
    fsdp_value_kind t = fsdp_value_type(v);
    if (t == FSDP_V_NULL) {
        if (!k->nullable)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "model.%s must not be null", k->name);
        if (k->kind == K_INT)
            *(int *)(base + k->off) = 0;
        else
            *(double *)(base + k->off) = 0.0;
        return FSDP_OK;
    }
    if (t != FSDP_V_SCALAR)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model.%s must be a scalar, not a %s", k->name,
                           t == FSDP_V_MAP ? "map" : "list");
    const char *text = fsdp_value_text(v);
    if (k->kind == K_INT) {
        int64_t x;
        if (fsdp_value_int(v, &x) != 0 || x < 1 || x > INT32_MAX)
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "model.%s must be an integer in [1, %d]%s, got '%s'", k->name,
                               INT32_MAX, k->nullable ? " or null" : "", text);
        *(int *)(base + k->off) = (int)x;
    } else if (k->kind == K_FLOAT) {
        double x;
        if (fsdp_value_float(v, &x) != 0 || !isfinite(x) || !(x > 0))
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "model.%s must be a finite number > 0%s, got '%s'", k->name,
                               k->nullable ? " or null" : "", text);
        *(double *)(base + k->off) = x;
    } else {
        int b;
        if (fsdp_value_bool(v, &b) != 0)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "model.%s must be true or false, got '%s'",
                               k->name, text);
        *(int *)(base + k->off) = b;
    }
    return FSDP_OK;
}

static int set_text_key(llama_config *cfg, const char *key, const fsdp_value *v, fsdp_err *err) {
    const char *text = fsdp_value_text(v);
    if (!strcmp(key, "arch")) {
        if (!text || strcmp(text, "llama3"))
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "model.arch: unsupported architecture '%s' (supported: llama3)",
                               text ? text : "null");
        return FSDP_OK;
    }
    if (!strcmp(key, "rope_scaling")) {
        if (fsdp_value_type(v) == FSDP_V_NULL || (text && !strcmp(text, "none")))
            cfg->rope_scaling = LLAMA_ROPE_NONE;
        else if (text && !strcmp(text, "llama3"))
            cfg->rope_scaling = LLAMA_ROPE_LLAMA3;
        else
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "model.rope_scaling must be none or llama3, got '%s'",
                               text ? text : "a list or map");
        return FSDP_OK;
    }
    /* preset */
    const preset *p = text ? find_preset(text) : NULL;
    if (!p) {
        char names[256];
        preset_names(names, sizeof names);
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model.preset: unknown preset '%s' (known: %s)",
                           text ? text : "null", names);
    }
    apply_preset(cfg, p);
    return FSDP_OK;
}

static const key_desc *find_key(const char *name) {
    for (size_t i = 0; i < sizeof KEYS / sizeof *KEYS; i++)
        if (!strcmp(KEYS[i].name, name)) return &KEYS[i];
    return NULL;
}

int llama_config_from_value(llama_config *cfg, const fsdp_value *model, fsdp_err *err) {
    llama_config_defaults(cfg);
    fsdp_value_kind t = fsdp_value_type(model);
    if (t != FSDP_V_NULL && t != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, model, "model must be a map of model settings");
    int rc;
    const fsdp_value *pv = fsdp_value_get(model, "preset");
    if (pv && (rc = set_text_key(cfg, "preset", pv, err))) return rc;
    size_t n = fsdp_value_size(model);
    for (size_t i = 0; i < n; i++) {
        const char *key = fsdp_value_key(model, i);
        const fsdp_value *v = fsdp_value_item(model, i);
        if (!key) continue;
        if (!strcmp(key, "preset")) continue;
        if (!strcmp(key, "arch") || !strcmp(key, "rope_scaling")) {
            if ((rc = set_text_key(cfg, key, v, err))) return rc;
            continue;
        }
        const key_desc *k = find_key(key);
        if (!k)
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "model: unknown key '%s' (known: arch, preset, dim, n_layers, "
                               "n_heads, n_kv_heads, vocab_size, multiple_of, ffn_dim_multiplier, "
                               "norm_eps, rope_theta, max_seq_len, depth_init, rope_scaling, "
                               "rope_factor, rope_low_freq_factor, rope_high_freq_factor, "
                               "rope_original_max_pos)",
                               key);
        if ((rc = set_key(cfg, k, v, err))) return rc;
    }
    rc = llama_config_finalize(cfg, err);
    if (rc && err && model) {
        char msg[FSDP_ERR_MSG_MAX - 512];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, model, "%s", msg);
    }
    return rc;
}
