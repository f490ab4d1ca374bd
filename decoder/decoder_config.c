/* The decoder family's configuration: defaults per architecture, presets, validation and derived sizes
 * (the recipe's `model:` map is decoder_spec.c). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "decoder/decoder_config.h"
#include "decoder/decoder_arch.h"
#include "runtime/nearest.h"

/* ---- presets ------------------------------------------------------------------------- */

typedef struct preset {
    const char *name;
    decoder_arch arch;
    int dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of;
    double ffn_dim_multiplier; /* 0 = None */
    int ffn_hidden;            /* 0: torchtitan's formula */
    int head_dim;              /* 0: dim / n_heads */
    double rope_theta;
    int max_seq_len;
    decoder_rope_scaling scaling;
    double rope_factor;
    int tie;
} preset;

/* torchtitan models/llama3/__init__.py (v0.2.2) for debugmodel/8B/70B/405B, checked against Meta's
 * published config.json files: Llama-3.1-8B/70B/405B (intermediate_size 14336/28672/53248, llama3
 * RoPE scaling factor 8, untied). llama3_1b and llama3_3b are Meta's Llama-3.2-1B and -3B
 * (intermediate_size 8192, factor 32, tie_word_embeddings true; torchtitan's "1B" flavor has the
 * same sizes through multiple_of 256 and multiplier 1.5). The Qwen presets are the published
 * Qwen/Qwen2.5-0.5B and Qwen/Qwen3-0.6B config.json files (norm_eps 1e-6 from the arch). */
static const preset PRESETS[] = {
    {"tiny", DECODER_ARCH_LLAMA3, 64, 2, 4, 2, 256, 32, 0.0, 0, 0, 10000.0, 64, DECODER_ROPE_NONE, 8.0, 0},
    {"debugmodel", DECODER_ARCH_LLAMA3, 256, 6, 16, 16, 2048, 256, 0.0, 0, 0, 500000.0, 131072, DECODER_ROPE_LLAMA3, 8.0, 0},
    {"llama3_1b", DECODER_ARCH_LLAMA3, 2048, 16, 32, 8, 128256, 256, 1.5, 0, 0, 500000.0, 131072, DECODER_ROPE_LLAMA3, 32.0,
     1},
    {"llama3_3b", DECODER_ARCH_LLAMA3, 3072, 28, 24, 8, 128256, 256, 0.0, 0, 0, 500000.0, 131072, DECODER_ROPE_LLAMA3, 32.0,
     1},
    {"llama3_8b", DECODER_ARCH_LLAMA3, 4096, 32, 32, 8, 128256, 1024, 1.3, 0, 0, 500000.0, 131072, DECODER_ROPE_LLAMA3, 8.0,
     0},
    {"llama3_70b", DECODER_ARCH_LLAMA3, 8192, 80, 64, 8, 128256, 4096, 1.3, 0, 0, 500000.0, 131072, DECODER_ROPE_LLAMA3, 8.0,
     0},
    {"llama3_405b", DECODER_ARCH_LLAMA3, 16384, 126, 128, 8, 128256, 4096, 1.2, 0, 0, 500000.0, 131072,
     DECODER_ROPE_LLAMA3, 8.0, 0},
    {"qwen2.5_0.5b", DECODER_ARCH_QWEN2, 896, 24, 14, 2, 151936, 256, 0.0, 4864, 0, 1000000.0, 32768, DECODER_ROPE_NONE,
     8.0, 1},
    {"qwen3_0.6b", DECODER_ARCH_QWEN3, 1024, 28, 16, 8, 151936, 256, 0.0, 3072, 128, 1000000.0, 40960, DECODER_ROPE_NONE,
     8.0, 1},
};
#define N_PRESETS ((int)(sizeof PRESETS / sizeof *PRESETS))

void decoder_config_defaults(decoder_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = DECODER_ARCH_LLAMA3;
    cfg->multiple_of = 256;
    cfg->ffn_dim_multiplier = 0.0;
    cfg->norm_eps = 1e-5;
    cfg->rope_theta = 10000.0;
    cfg->max_seq_len = 131072;
    cfg->depth_init = 1;
    cfg->rope_scaling = DECODER_ROPE_LLAMA3;
    cfg->rope_factor = 8.0;
    cfg->rope_low_freq_factor = 1.0;
    cfg->rope_high_freq_factor = 4.0;
    cfg->rope_original_max_pos = 8192;
    cfg->moe_step = 1;
}

void decoder_config_arch_defaults(const decoder_arch_info *a, decoder_config *cfg) {
    decoder_config_defaults(cfg);
    cfg->arch = a->arch;
    cfg->qkv_bias = a->qkv_bias;
    cfg->qk_norm = a->qk_norm;
    cfg->norm_eps = a->norm_eps;
    cfg->rope_theta = a->rope_theta;
    cfg->rope_scaling = a->rope_scaling;
    cfg->init_std = a->init_std;
    cfg->qk_norm_full = a->qk_norm_full;
    cfg->moe_step = 1;
    cfg->norm_topk = a->norm_topk_fixed > 0;
    cfg->router_aux_coef = a->hf_aux_coef;
}

const char *decoder_config_preset_name(int i) {
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
static void apply_preset(decoder_config *cfg, const preset *p) {
    decoder_config_arch_defaults(decoder_arch_get(p->arch), cfg);
    snprintf(cfg->preset, sizeof cfg->preset, "%s", p->name);
    cfg->dim = p->dim;
    cfg->n_layers = p->n_layers;
    cfg->n_heads = p->n_heads;
    cfg->n_kv_heads = p->n_kv_heads;
    cfg->vocab_size = p->vocab_size;
    cfg->multiple_of = p->multiple_of;
    cfg->ffn_dim_multiplier = p->ffn_dim_multiplier;
    cfg->ffn_hidden_set = p->ffn_hidden;
    cfg->head_dim_set = p->head_dim;
    cfg->rope_theta = p->rope_theta;
    cfg->max_seq_len = p->max_seq_len;
    cfg->rope_scaling = p->scaling;
    cfg->rope_factor = p->rope_factor;
    cfg->tie_embeddings = p->tie;
}

int decoder_config_apply_preset(decoder_config *cfg, const char *name, const char *null_text, fsdp_err *err) {
    const preset *p = name ? find_preset(name) : NULL;
    if (!p) {
        char names[512];
        preset_names(names, sizeof names);
        char hint[300];
        return fsdp_err_set(err, FSDP_E_INVALID, "model.preset: unknown preset '%s'%s (known: %s)",
                            name ? name : null_text, nearest_hint(name, names, hint, sizeof hint), names);
    }
    apply_preset(cfg, p);
    return FSDP_OK;
}

int decoder_config_preset(decoder_config *cfg, const char *name, fsdp_err *err) {
    int rc = decoder_config_apply_preset(cfg, name, "(null)", err);
    return rc ? rc : decoder_config_finalize(cfg, err);
}

/* ---- derived sizes ------------------------------------------------------------------- */

/* ffn_hidden as torchtitan computes it; -1 when it does not fit an int. */
static int64_t ffn_hidden_of(const decoder_config *cfg) {
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

double decoder_flops_per_token(const decoder_config *cfg, int64_t seq_len) {
    int64_t n = decoder_param_count(cfg);
    if (n < 0 || seq_len < 0) return -1.0;
    double emb = (double)cfg->vocab_size * (double)cfg->dim;
    /* a tied embedding is one parameter in n, but the output projection's FLOPs are spent all the
     * same: count them as if output.weight were separate */
    double nonemb = (double)n - (cfg->tie_embeddings ? 0.0 : emb);
    /* a mixture of experts counts its active parameters only (torchtitan's MoE MFU): top_k of n_experts */
    nonemb -= (double)decoder_moe_layers(cfg) * (double)(cfg->n_experts - cfg->top_k) * 3.0 *
              (double)cfg->moe_ffn_hidden * (double)cfg->dim;
    return 6.0 * nonemb + 12.0 * cfg->n_layers * (double)cfg->n_heads * cfg->head_dim * (double)seq_len;
}

/* The architecture switches and explicit sizes (finalize's second half of checks). */
static int check_switches(const decoder_config *c, fsdp_err *err) {
    if (!decoder_arch_get(c->arch))
        return fsdp_err_set(err, FSDP_E_INVALID, "model.arch: unknown architecture %d", (int)c->arch);
    const struct {
        const char *key;
        int v;
    } bools[] = {{"qkv_bias", c->qkv_bias}, {"qk_norm", c->qk_norm}, {"tie_embeddings", c->tie_embeddings},
                 {"depth_init", c->depth_init}};
    for (size_t i = 0; i < sizeof bools / sizeof *bools; i++)
        if (bools[i].v != 0 && bools[i].v != 1)
            return fsdp_err_set(err, FSDP_E_INVALID, "model.%s must be true or false", bools[i].key);
    if (c->head_dim_set < 0 || c->ffn_hidden_set < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.%s must be > 0 (got %d)",
                            c->head_dim_set < 0 ? "head_dim" : "ffn_hidden",
                            c->head_dim_set < 0 ? c->head_dim_set : c->ffn_hidden_set);
    if (!isfinite(c->init_std) || c->init_std < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.init_std must be null (torchtitan init) or finite and > 0 "
                            "(got %g)", c->init_std);
    return FSDP_OK;
}

/* The sizes every model needs are > 0; n_kv_heads defaults to n_heads. */
static int check_sizes(decoder_config *c, fsdp_err *err) {
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
    return FSDP_OK;
}

/* The heads divide the model: dim by n_heads (unless head_dim is given), n_heads by n_kv_heads,
 * and the head dimension is even (RoPE rotates pairs). */
static int check_heads(const decoder_config *c, fsdp_err *err) {
    if (!c->head_dim_set && c->dim % c->n_heads)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.dim (%d) must be divisible by model.n_heads (%d)", c->dim,
                            c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.n_heads (%d) must be divisible by model.n_kv_heads (%d)",
                            c->n_heads, c->n_kv_heads);
    if (c->head_dim_set % 2)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.head_dim %d must be even (RoPE rotates pairs)",
                            c->head_dim_set);
    if (!c->head_dim_set && (c->dim / c->n_heads) % 2)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: head_dim = dim / n_heads = %d / %d = %d must be even (RoPE "
                            "rotates pairs)", c->dim, c->n_heads, c->dim / c->n_heads);
    return FSDP_OK;
}

/* norm_eps, rope_theta and ffn_dim_multiplier are finite and in range; depth_init a boolean. */
static int check_scalars(const decoder_config *c, fsdp_err *err) {
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
    return FSDP_OK;
}

/* RoPE scaling: none, or Llama 3's with its factor, low < high frequency factors and original
 * context length. */
static int check_rope_scaling(const decoder_config *c, fsdp_err *err) {
    if (c->rope_scaling == DECODER_ROPE_LLAMA3) {
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
    } else if (c->rope_scaling != DECODER_ROPE_NONE) {
        return fsdp_err_set(err, FSDP_E_INVALID, "model.rope_scaling: unknown value %d",
                            (int)c->rope_scaling);
    }
    return FSDP_OK;
}

/* The derived sizes (head_dim, ffn_hidden), each within a 32-bit int, and a parameter count that
 * fits 64 bits. */
static int derive_sizes(decoder_config *c, fsdp_err *err) {
    c->head_dim = c->head_dim_set ? c->head_dim_set : c->dim / c->n_heads;
    if ((int64_t)c->n_heads * c->head_dim > INT32_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: n_heads * head_dim = %d * %d does not fit a 32-bit int",
                            c->n_heads, c->head_dim);
    int64_t f = c->ffn_hidden_set ? c->ffn_hidden_set : ffn_hidden_of(c);
    if (f <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: FFN hidden size from dim %d, ffn_dim_multiplier %g and "
                            "multiple_of %d is %s",
                            c->dim, c->ffn_dim_multiplier, c->multiple_of,
                            f == 0 ? "0" : "too large for a 32-bit int");
    c->ffn_hidden = (int)f;
    if (decoder_param_count(c) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: the parameter count overflows a 64-bit integer");
    return FSDP_OK;
}

/* The embedding's padding row is a row of the vocabulary. */
static int check_padding(const decoder_config *c, fsdp_err *err) {
    if (c->has_padding_idx != 0 && c->has_padding_idx != 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: has_padding_idx must be 0 or 1 (got %d)", c->has_padding_idx);
    if (c->has_padding_idx && (c->padding_idx < 0 || c->padding_idx >= c->vocab_size))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model.pad_token_id %d is not a token of the vocabulary (expected 0 <= pad_token_id < "
                            "vocab_size %d)", c->padding_idx, c->vocab_size);
    return FSDP_OK;
}

int decoder_padding_idx(const decoder_config *c) {
    return c && c->has_padding_idx ? c->padding_idx : -1;
}

int decoder_config_finalize(decoder_config *c, fsdp_err *err) {
    int rc;
    if ((rc = check_sizes(c, err)) || (rc = check_switches(c, err)) || (rc = check_heads(c, err)) ||
        (rc = check_scalars(c, err)) || (rc = check_rope_scaling(c, err)) || (rc = decoder_config_check_moe(c, err)) ||
        (rc = check_padding(c, err)))
        return rc;
    return derive_sizes(c, err);
}
