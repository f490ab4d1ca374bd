/* Reading a Hugging Face config.json into a decoder_config (decoder/hf_config.h). */
#include "decoder/hf_config.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decoder/decoder_arch.h"
#include "runtime/fileio.h"

/* One config.json being read: its name for messages and its root object. */
typedef struct hf_rd {
    const char *what;
    const json_t *root;
    fsdp_err *err;
} hf_rd;

/* The value of key in obj, NULL when absent or JSON null. */
static const json_t *get(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* A positive int at key (absent or null: *out untouched unless required). */
static int get_int(hf_rd *r, const json_t *obj, const char *key, int required, int *out) {
    const json_t *v = get(obj, key);
    if (!v) {
        if (required)
            return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" is missing (expected a positive integer)", r->what,
                                key);
        return FSDP_OK;
    }
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : 0;
    if (!json_is_integer(v) || x < 1 || x > INT_MAX) {
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        int rc = fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" is %s, expected an integer in [1, %d]", r->what, key,
                              text ? text : "?", INT_MAX);
        free(text);
        return rc;
    }
    *out = (int)x;
    return FSDP_OK;
}

/* A finite number > 0 at key (absent or null: *out untouched). */
static int get_pos(hf_rd *r, const json_t *obj, const char *key, double *out) {
    const json_t *v = get(obj, key);
    if (!v) return FSDP_OK;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite(x) || !(x > 0)) {
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        int rc = fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" is %s, expected a finite number > 0", r->what, key,
                              text ? text : "?");
        free(text);
        return rc;
    }
    *out = x;
    return FSDP_OK;
}

/* A number >= 0 at key (absent or null: *out untouched). */
static int get_nonneg(hf_rd *r, const json_t *obj, const char *key, double *out) {
    const json_t *v = get(obj, key);
    if (!v) return FSDP_OK;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite(x) || x < 0) {
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        int rc = fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" is %s, expected a finite number >= 0", r->what, key,
                              text ? text : "?");
        free(text);
        return rc;
    }
    *out = x;
    return FSDP_OK;
}

/* A boolean at key (absent or null: *out untouched). */
static int get_bool(hf_rd *r, const json_t *obj, const char *key, int *out) {
    const json_t *v = get(obj, key);
    if (!v) return FSDP_OK;
    if (!json_is_boolean(v))
        return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" must be true or false", r->what, key);
    *out = json_is_true(v);
    return FSDP_OK;
}

/* The string at key, NULL when absent or null; a non-string is an error. */
static int get_str(hf_rd *r, const json_t *obj, const char *key, const char **out) {
    const json_t *v = get(obj, key);
    *out = NULL;
    if (!v) return FSDP_OK;
    if (!json_is_string(v)) return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" must be a string", r->what, key);
    *out = json_string_value(v);
    return FSDP_OK;
}

/* The architecture from model_type, else architectures[0]; architectures must agree. */
static int pick_arch(hf_rd *r, const decoder_arch_info **out) {
    const char *mt;
    int rc = get_str(r, r->root, "model_type", &mt);
    if (rc) return rc;
    const json_t *archs = get(r->root, "architectures");
    const char *cls = NULL;
    if (archs) {
        if (!json_is_array(archs) || json_array_size(archs) < 1 || !json_is_string(json_array_get(archs, 0)))
            return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"architectures\" must be a list of class names",
                                r->what);
        cls = json_string_value(json_array_get(archs, 0));
    }
    char known[128];
    decoder_arch_list(1, known, sizeof known);
    if (!mt && !cls)
        return fsdp_err_set(r->err, FSDP_E_INVALID,
                            "%s: neither \"model_type\" nor \"architectures\" says which model this is (supported "
                            "model types: %s)",
                            r->what, known);
    const decoder_arch_info *a = mt ? decoder_arch_by_model_type(mt) : decoder_arch_by_class(cls);
    if (!a)
        return fsdp_err_set(r->err, FSDP_E_INVALID,
                            "%s: model_type '%s'%s%s%s is not an architecture fsdp-run trains (supported model types: "
                            "%s)",
                            r->what, mt ? mt : "(none)", cls ? " (" : "", cls ? cls : "", cls ? ")" : "", known);
    if (cls && strcmp(cls, a->hf_class))
        return fsdp_err_set(r->err, FSDP_E_INVALID,
                            "%s: architectures[0] is '%s', but fsdp-run trains model_type '%s' as the causal LM '%s'",
                            r->what, cls, a->model_type, a->hf_class);
    *out = a;
    return FSDP_OK;
}

/* The RoPE dict: transformers 4's rope_scaling when it is set, else transformers 5's
 * rope_parameters (under "full_attention" when nested by layer type); NULL when neither. */
static int rope_dict(hf_rd *r, const json_t **out) {
    const json_t *d = get(r->root, "rope_scaling");
    const char *key = "rope_scaling";
    if (!d) {
        d = get(r->root, "rope_parameters");
        key = "rope_parameters";
        const json_t *fa = d ? get(d, "full_attention") : NULL;
        if (fa) d = fa;
    }
    if (d && !json_is_object(d))
        return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"%s\" must be an object or null", r->what, key);
    *out = d;
    return FSDP_OK;
}

/* partial_rotary_factor (1.0 when absent) and the RoPE type (NULL when absent) of the config. */
static int rope_kind(hf_rd *r, const json_t *d, double *prf, const char **type) {
    int rc;
    *prf = 1.0;
    *type = NULL;
    if ((rc = get_pos(r, r->root, "partial_rotary_factor", prf)) || (d && (rc = get_pos(r, d, "partial_rotary_factor", prf))))
        return rc;
    if (d && (rc = get_str(r, d, "rope_type", type))) return rc;
    if (d && !*type && (rc = get_str(r, d, "type", type))) return rc;
    return FSDP_OK;
}

/* "; " between the findings of check_unsupported. */
static void add_finding(char *buf, size_t cap, size_t *off, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add_finding(char *buf, size_t cap, size_t *off, const char *fmt, ...) {
    if (*off >= cap) return;
    if (*off) *off += (size_t)snprintf(buf + *off, cap - *off, "; ");
    if (*off >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *off, cap - *off, fmt, ap);
    va_end(ap);
    if (k > 0) *off += (size_t)k;
}

/* The keys of a mixture-of-experts family the rows cannot honour, added to buf. */
static int check_unsupported_moe(hf_rd *r, const decoder_arch_info *a, char *buf, size_t cap, size_t *off) {
    double jitter = 0.0;
    int rc = get_nonneg(r, r->root, "router_jitter_noise", &jitter);
    if (rc) return rc;
    if (jitter > 0)
        add_finding(buf, cap, off, "router_jitter_noise %g is not supported (deterministic routing only)", jitter);
    if (get(r->root, "clip_qkv")) add_finding(buf, cap, off, "clip_qkv is not supported (it must be null)");
    if (a->arch == DECODER_ARCH_MIXTRAL && get(r->root, "sliding_window"))
        add_finding(buf, cap, off, "sliding_window is not supported for model_type 'mixtral' (it must be null)");
    const char *rz[] = {"router_z_loss_coef", "moe_layer_freq", "shared_expert_intermediate_size", "n_shared_experts",
                        "first_k_dense_replace"};
    for (size_t i = 0; i < sizeof rz / sizeof *rz; i++) {
        const json_t *v = get(r->root, rz[i]);
        if (v && !(json_is_number(v) && json_number_value(v) == 0))
            add_finding(buf, cap, off, "\"%s\" is not supported for model_type '%s'", rz[i], a->model_type);
    }
    return FSDP_OK;
}

/* What the model computes that fsdp-run does not: one error naming every such key. */
static int check_unsupported(hf_rd *r, const decoder_arch_info *a) {
    char buf[1536] = "";
    size_t off = 0;
    const char *act;
    int rc = get_str(r, r->root, "hidden_act", &act);
    if (rc) return rc;
    if (act && strcmp(act, "silu"))
        add_finding(buf, sizeof buf, &off, "hidden_act '%s' is not supported (fsdp-run's MLP is SwiGLU: silu)", act);
    /* Qwen2 hard-codes its q/k/v biases and has no such keys; in Llama and Qwen3 attention_bias adds
     * o_proj's too, which the model does not have */
    const char *flags[] = {a->arch == DECODER_ARCH_QWEN2 ? NULL : "attention_bias", "mlp_bias", "use_sliding_window"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        int on = 0;
        if (!flags[i]) continue;
        if ((rc = get_bool(r, r->root, flags[i], &on))) return rc;
        if (on)
            add_finding(buf, sizeof buf, &off, "\"%s\": true is not supported for model_type '%s'", flags[i],
                        a->model_type);
    }
    if (a->moe && (rc = check_unsupported_moe(r, a, buf, sizeof buf, &off))) return rc;
    const json_t *lt = get(r->root, "layer_types");
    size_t bad = 0, first = 0;
    for (size_t i = 0; lt && i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        if (!t || strcmp(t, "full_attention")) first = bad++ ? first : i;
    }
    if (bad) {
        const char *t = json_string_value(json_array_get(lt, first));
        add_finding(buf, sizeof buf, &off, "layer_types[%zu] is '%s'%s: only full_attention layers are supported",
                    first, t ? t : "not a string", bad > 1 ? " (and more)" : "");
    }
    const json_t *d;
    double prf;
    const char *type;
    if ((rc = rope_dict(r, &d)) || (rc = rope_kind(r, d, &prf, &type))) return rc;
    if (prf != 1.0)
        add_finding(buf, sizeof buf, &off, "partial_rotary_factor %g is not supported (RoPE on the whole head only)",
                    prf);
    if (type && strcmp(type, "default") && strcmp(type, "llama3"))
        add_finding(buf, sizeof buf, &off, "RoPE type '%s' is not supported (supported: default, llama3)", type);
    return off ? fsdp_err_set(r->err, FSDP_E_INVALID, "%s: %s", r->what, buf) : FSDP_OK;
}

static int read_rope(hf_rd *r, decoder_config *c) {
    const json_t *d;
    int rc = rope_dict(r, &d);
    if (!rc) rc = get_pos(r, r->root, "rope_theta", &c->rope_theta);
    if (!rc && d) rc = get_pos(r, d, "rope_theta", &c->rope_theta);
    if (rc) return rc;
    double prf;
    const char *type;
    if ((rc = rope_kind(r, d, &prf, &type))) return rc;
    if (prf != 1.0) /* check_unsupported reported it first, with every other unsupported key */
        return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: partial_rotary_factor %g is not supported (RoPE on the whole "
                            "head only)", r->what, prf);
    c->rope_scaling = DECODER_ROPE_NONE;
    if (!type || !strcmp(type, "default")) return FSDP_OK;
    if (strcmp(type, "llama3"))
        return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: RoPE type '%s' is not supported (supported: default, llama3)",
                            r->what, type);
    c->rope_scaling = DECODER_ROPE_LLAMA3;
    const char *need[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        if (!get(d, need[i]))
            return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: llama3 RoPE scaling needs \"%s\"", r->what, need[i]);
    if ((rc = get_pos(r, d, "factor", &c->rope_factor)) || (rc = get_pos(r, d, "low_freq_factor", &c->rope_low_freq_factor)) ||
        (rc = get_pos(r, d, "high_freq_factor", &c->rope_high_freq_factor)))
        return rc;
    return get_int(r, d, "original_max_position_embeddings", 1, &c->rope_original_max_pos);
}

static int read_sizes(hf_rd *r, const decoder_arch_info *a, decoder_config *c) {
    int rc;
    if ((rc = get_int(r, r->root, "hidden_size", 1, &c->dim)) ||
        (rc = get_int(r, r->root, "num_hidden_layers", 1, &c->n_layers)) ||
        (rc = get_int(r, r->root, "num_attention_heads", 1, &c->n_heads)) ||
        (rc = get_int(r, r->root, "vocab_size", 1, &c->vocab_size)) ||
        (rc = get_int(r, r->root, "intermediate_size", 1, &c->ffn_hidden_set)))
        return rc;
    c->n_kv_heads = c->n_heads;
    c->head_dim_set = a->hf_head_dim;
    c->max_seq_len = 2048; /* transformers' default max_position_embeddings */
    if ((rc = get_int(r, r->root, "num_key_value_heads", 0, &c->n_kv_heads)) ||
        (rc = get_int(r, r->root, "head_dim", 0, &c->head_dim_set)) ||
        (rc = get_int(r, r->root, "max_position_embeddings", 0, &c->max_seq_len)))
        return rc;
    if ((rc = get_pos(r, r->root, "rms_norm_eps", &c->norm_eps)) ||
        (rc = get_pos(r, r->root, "initializer_range", &c->init_std)))
        return rc;
    return get_bool(r, r->root, "tie_word_embeddings", &c->tie_embeddings);
}

/* pad_token_id: the embedding's padding_idx (absent: the config class's default; null: none). Like
 * nn.Embedding, a negative id counts from the end of the vocabulary; outside [-vocab, vocab) it is an
 * error (transformers cannot build the model). */
static int read_padding(hf_rd *r, const decoder_arch_info *a, decoder_config *c) {
    const json_t *v = json_object_get(r->root, "pad_token_id");
    c->has_padding_idx = 0;
    c->padding_idx = 0;
    if (!v) {
        if (a->hf_pad_token_id < 0) return FSDP_OK;
        if (a->hf_pad_token_id >= c->vocab_size)
            return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"pad_token_id\" is missing and model_type '%s''s default, %d, "
                                "is outside the vocabulary (vocab_size %d): set it (null for none)",
                                r->what, a->model_type, a->hf_pad_token_id, c->vocab_size);
        c->has_padding_idx = 1;
        c->padding_idx = a->hf_pad_token_id;
        return FSDP_OK;
    }
    if (json_is_null(v)) return FSDP_OK;
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : 0;
    if (!json_is_integer(v) || x < -(json_int_t)c->vocab_size || x >= c->vocab_size) {
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        int rc = fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"pad_token_id\" is %s, expected null or a token id in "
                              "[-%d, %d) (vocab_size %d; the embedding's padding_idx)", r->what, text ? text : "?",
                              c->vocab_size, c->vocab_size, c->vocab_size);
        free(text);
        return rc;
    }
    c->has_padding_idx = 1;
    c->padding_idx = (int)(x < 0 ? x + c->vocab_size : x);
    return FSDP_OK;
}

/* mlp_only_layers: a list of layer indices within the model. */
static int read_dense_layers(hf_rd *r, decoder_config *c) {
    const json_t *v = get(r->root, "mlp_only_layers");
    if (!v) return FSDP_OK;
    if (!json_is_array(v))
        return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: \"mlp_only_layers\" must be a list of layer indices", r->what);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        json_int_t l = json_is_integer(e) ? json_integer_value(e) : -1;
        if (l < 0 || l >= c->n_layers)
            return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: mlp_only_layers[%zu] must be a layer index in 0..%d "
                                "(num_hidden_layers %d)", r->what, i, c->n_layers - 1, c->n_layers);
        int rc = decoder_config_set_dense_layer(c, (int)l, r->err);
        if (rc) return fsdp_err_prefix(r->err, "%s", r->what);
    }
    return FSDP_OK;
}

/* The experts of a mixture-of-experts family: their number (num_experts or num_local_experts), top-k,
 * width, renormalisation, the layers that have them and the load-balancing loss's weight in the
 * objective (0 unless output_router_logits, as transformers adds it to outputs.loss only then). */
static int read_moe(hf_rd *r, const decoder_arch_info *a, decoder_config *c) {
    int rc, both = get(r->root, "num_experts") && get(r->root, "num_local_experts");
    c->n_experts = a->hf_n_experts;
    c->top_k = a->hf_top_k;
    c->router_aux_coef = a->hf_aux_coef;
    c->moe_ffn_hidden = c->ffn_hidden_set;
    c->norm_topk = a->norm_topk_fixed >= 0 ? a->norm_topk_fixed : 0;
    int out_logits = 0, e1 = 0, e2 = 0;
    if ((rc = get_int(r, r->root, "num_experts", 0, &e1)) || (rc = get_int(r, r->root, "num_local_experts", 0, &e2)))
        return rc;
    if (both && e1 != e2)
        return fsdp_err_set(r->err, FSDP_E_INVALID, "%s: num_experts (%d) and num_local_experts (%d) disagree",
                            r->what, e1, e2);
    if (e1 || e2) c->n_experts = e1 ? e1 : e2;
    if ((rc = get_int(r, r->root, "num_experts_per_tok", 0, &c->top_k)) ||
        (rc = get_int(r, r->root, "moe_intermediate_size", 0, &c->moe_ffn_hidden)) ||
        (rc = get_nonneg(r, r->root, "router_aux_loss_coef", &c->router_aux_coef)) ||
        (rc = get_bool(r, r->root, "output_router_logits", &out_logits)))
        return rc;
    if (a->norm_topk_fixed < 0 && (rc = get_bool(r, r->root, "norm_topk_prob", &c->norm_topk))) return rc;
    if (!out_logits) c->router_aux_coef = 0.0;
    if (a->moe_every_layer) return FSDP_OK;
    if ((rc = get_int(r, r->root, "decoder_sparse_step", 0, &c->moe_step))) return rc;
    return read_dense_layers(r, c);
}

static int parse_root(const json_t *root, const char *what, decoder_config *cfg, fsdp_err *err) {
    if (!json_is_object(root)) return fsdp_err_set(err, FSDP_E_INVALID, "%s: not a JSON object", what);
    hf_rd r = {what, root, err};
    const decoder_arch_info *a = NULL;
    int rc = pick_arch(&r, &a);
    if (!rc) rc = check_unsupported(&r, a);
    if (rc) return rc;
    decoder_config_arch_defaults(a, cfg);
    cfg->norm_eps = a->hf_norm_eps;
    cfg->rope_theta = a->hf_rope_theta;
    cfg->init_std = 0.02;
    cfg->tie_embeddings = 0;
    cfg->depth_init = 0;
    if ((rc = read_sizes(&r, a, cfg)) || (rc = read_rope(&r, cfg)) || (rc = read_padding(&r, a, cfg)) ||
        (a->moe && (rc = read_moe(&r, a, cfg))))
        return rc;
    if ((rc = decoder_config_finalize(cfg, err))) return fsdp_err_prefix(err, "%s", what);
    return FSDP_OK;
}

int hf_config_parse(const char *text, size_t len, const char *what, decoder_config *cfg, fsdp_err *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: not valid JSON (line %d, column %d): %s", what, je.line, je.column,
                            je.text);
    int rc = parse_root(root, what, cfg, err);
    json_decref(root);
    return rc;
}

int hf_config_read(const char *path, decoder_config *cfg, fsdp_err *err) {
    if (!path || !*path) return fsdp_err_set(err, FSDP_E_INVALID, "no Hugging Face model directory given");
    size_t n = strlen(path);
    int is_json = n >= 5 && !strcmp(path + n - 5, ".json");
    char file[4200];
    if (snprintf(file, sizeof file, "%s%s", path, is_json ? "" : "/config.json") >= (int)sizeof file)
        return fsdp_err_set(err, FSDP_E_INVALID, "path too long: %s", path);
    int fd;
    int rc = fio_open_read(file, NULL, &fd, err); /* never blocks on a FIFO */
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!root)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: not valid JSON (line %d, column %d): %s", file, je.line, je.column,
                            je.text);
    rc = parse_root(root, file, cfg, err);
    json_decref(root);
    return rc;
}
