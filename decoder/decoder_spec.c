/* The arch form of `model:` -> decoder_config (decoder/decoder_spec.h). */
#include "decoder/decoder_spec.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "decoder/decoder_arch.h"
#include "decoder/hf_config.h"
#include "runtime/nearest.h"

/* ---- the recipe's model: map --------------------------------------------------------- */

typedef enum key_kind { K_INT, K_FLOAT, K_BOOL } key_kind;

typedef struct key_desc {
    const char *name;
    key_kind kind;
    size_t off;   /* offset of the int / double field */
    int nullable; /* null stores 0 (None / same as n_heads / derived) */
} key_desc;

#define KI(n) {#n, K_INT, offsetof(decoder_config, n), 0}
#define KF(n) {#n, K_FLOAT, offsetof(decoder_config, n), 0}
#define KB(n) {#n, K_BOOL, offsetof(decoder_config, n), 0}
static const key_desc KEYS[] = {
    KI(dim),
    KI(n_layers),
    KI(n_heads),
    {"n_kv_heads", K_INT, offsetof(decoder_config, n_kv_heads), 1},
    KI(vocab_size),
    KI(multiple_of),
    {"ffn_dim_multiplier", K_FLOAT, offsetof(decoder_config, ffn_dim_multiplier), 1},
    {"ffn_hidden", K_INT, offsetof(decoder_config, ffn_hidden_set), 1},
    {"head_dim", K_INT, offsetof(decoder_config, head_dim_set), 1},
    KF(norm_eps),
    KF(rope_theta),
    KI(max_seq_len),
    KB(depth_init),
    KF(rope_factor),
    KF(rope_low_freq_factor),
    KF(rope_high_freq_factor),
    KI(rope_original_max_pos),
    KB(qkv_bias),
    KB(qk_norm),
    KB(tie_embeddings),
    {"init_std", K_FLOAT, offsetof(decoder_config, init_std), 1},
    {"n_experts", K_INT, offsetof(decoder_config, n_experts), 1},
    {"top_k", K_INT, offsetof(decoder_config, top_k), 1},
    {"moe_ffn_hidden", K_INT, offsetof(decoder_config, moe_ffn_hidden), 1},
    KB(norm_topk),
    KI(moe_step),
    {"router_aux_coef", K_FLOAT, offsetof(decoder_config, router_aux_coef), 1},
};
#undef KI
#undef KF
#undef KB
#define KNOWN_KEYS                                                                                          \
    "from_hf, arch, preset, dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of, ffn_dim_multiplier, " \
    "ffn_hidden, head_dim, norm_eps, rope_theta, max_seq_len, depth_init, rope_scaling, rope_factor, "         \
    "rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos, qkv_bias, qk_norm, tie_embeddings, "   \
    "init_std, n_experts, top_k, moe_ffn_hidden, norm_topk, moe_step, router_aux_coef, pad_token_id"

static int set_key(decoder_config *cfg, const key_desc *k, const fsdp_value *v, fsdp_err *err) {
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

static int set_rope_scaling(decoder_config *cfg, const fsdp_value *v, fsdp_err *err) {
    const char *text = fsdp_value_text(v);
    if (fsdp_value_type(v) == FSDP_V_NULL || (text && !strcmp(text, "none")))
        cfg->rope_scaling = DECODER_ROPE_NONE;
    else if (text && !strcmp(text, "llama3"))
        cfg->rope_scaling = DECODER_ROPE_LLAMA3;
    else
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model.rope_scaling must be none or llama3, got '%s'",
                           text ? text : "a list or map");
    return FSDP_OK;
}

/* pad_token_id: the embedding's padding_idx (a token id >= 0; null: none); finalize checks it against the
 * vocabulary. */
static int set_pad_token_id(decoder_config *cfg, const fsdp_value *v, fsdp_err *err) {
    if (fsdp_value_type(v) == FSDP_V_NULL) {
        cfg->has_padding_idx = 0;
        cfg->padding_idx = 0;
        return FSDP_OK;
    }
    int64_t x;
    if (fsdp_value_type(v) != FSDP_V_SCALAR || fsdp_value_int(v, &x) != 0 || x < 0 || x > INT32_MAX)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model.pad_token_id must be a token id >= 0 or null, got '%s'",
                           fsdp_value_text(v) ? fsdp_value_text(v) : "a list or map");
    cfg->has_padding_idx = 1;
    cfg->padding_idx = (int)x;
    return FSDP_OK;
}

static int set_preset(decoder_config *cfg, const fsdp_value *v, fsdp_err *err) {
    int rc = decoder_config_apply_preset(cfg, fsdp_value_text(v), "null", err);
    if (!rc) return FSDP_OK;
    char msg[FSDP_ERR_MSG_MAX - 256];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return fsdp_err_at(err, rc, v, "%s", msg);
}

static const key_desc *find_key(const char *name) {
    for (size_t i = 0; i < sizeof KEYS / sizeof *KEYS; i++)
        if (!strcmp(KEYS[i].name, name)) return &KEYS[i];
    return NULL;
}

/* The model's base: from_hf's config.json, else a preset, else an arch's defaults (llama3 when
 * none is named). `arch` next to from_hf or a preset must agree with theirs. */
static int apply_base(decoder_config *cfg, const fsdp_value *model, fsdp_err *err) {
    const fsdp_value *hv = fsdp_value_get(model, "from_hf"), *pv = fsdp_value_get(model, "preset"),
                     *av = fsdp_value_get(model, "arch");
    int rc;
    if (hv && pv)
        return fsdp_err_at(err, FSDP_E_INVALID, pv, "model: from_hf and preset both give the whole model; keep one");
    const decoder_arch_info *a = NULL;
    if (av) {
        const char *text = fsdp_value_text(av);
        if (!(a = decoder_arch_by_name(text))) {
            char names[128];
            decoder_arch_list(0, names, sizeof names);
            return fsdp_err_at(err, FSDP_E_INVALID, av, "model.arch: unsupported architecture '%s' (supported: %s)",
                               text ? text : "null", names);
        }
    }
    if (hv) {
        const char *dir = fsdp_value_text(hv);
        if (fsdp_value_type(hv) != FSDP_V_SCALAR || !dir || !*dir)
            return fsdp_err_at(err, FSDP_E_INVALID, hv, "model.from_hf must be the path of a Hugging Face model "
                                                        "directory (or its config.json)");
        if ((rc = hf_config_read(dir, cfg, err))) {
            char msg[FSDP_ERR_MSG_MAX - 512];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return fsdp_err_at(err, rc, hv, "model.from_hf: %s", msg);
        }
    } else if (pv) {
        if ((rc = set_preset(cfg, pv, err))) return rc;
    } else {
        decoder_config_arch_defaults(a ? a : decoder_arch_get(DECODER_ARCH_LLAMA3), cfg);
    }
    if (a && a->arch != cfg->arch)
        return fsdp_err_at(err, FSDP_E_INVALID, av, "model.arch is %s but the %s is %s", a->name,
                           hv ? "config.json of from_hf" : "preset", decoder_arch_get(cfg->arch)->name);
    return FSDP_OK;
}

int decoder_spec_from_value(decoder_config *cfg, const fsdp_value *model, fsdp_err *err) {
    decoder_config_defaults(cfg);
    fsdp_value_kind t = fsdp_value_type(model);
    if (t != FSDP_V_NULL && t != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, model, "model must be a map of model settings");
    int rc = apply_base(cfg, model, err);
    if (rc) return rc;
    size_t n = fsdp_value_size(model);
    for (size_t i = 0; i < n; i++) {
        const char *key = fsdp_value_key(model, i);
        const fsdp_value *v = fsdp_value_item(model, i);
        if (!key || !strcmp(key, "preset") || !strcmp(key, "arch") || !strcmp(key, "from_hf")) continue;
        if (!strcmp(key, "rope_scaling")) {
            if ((rc = set_rope_scaling(cfg, v, err))) return rc;
            continue;
        }
        if (!strcmp(key, "pad_token_id")) {
            if ((rc = set_pad_token_id(cfg, v, err))) return rc;
            continue;
        }
        const key_desc *k = find_key(key);
        char hint[300];
        if (!k)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "model: unknown key '%s'%s (known: " KNOWN_KEYS ")", key,
                               nearest_hint(key, KNOWN_KEYS, hint, sizeof hint));
        if ((rc = set_key(cfg, k, v, err))) return rc;
    }
    rc = decoder_config_finalize(cfg, err);
    if (rc && err && model) {
        char msg[FSDP_ERR_MSG_MAX - 512];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, model, "%s", msg);
    }
    return rc;
}
