/* Writing a Hugging Face config.json from a decoder_config (decoder/hf_config.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decoder/hf_config.h"
#include "decoder/decoder_arch.h"
#include "runtime/tmpfile.h"

static const char *dtype_name(fsdp_dtype dt) {
    switch (dt) {
    case FSDP_DT_BF16: return "bfloat16";
    case FSDP_DT_F16: return "float16";
    case FSDP_DT_F32: return "float32";
    default: return NULL;
    }
}

/* Sets key to v (taking the reference); 0 when it worked. */
static int put(json_t *o, const char *key, json_t *v) { return !v || json_object_set_new(o, key, v); }

static json_t *rope_scaling_of(const decoder_config *c) {
    if (c->rope_scaling != DECODER_ROPE_LLAMA3) return json_null();
    json_t *d = json_object();
    if (!d) return NULL;
    if (put(d, "rope_type", json_string("llama3")) || put(d, "factor", json_real(c->rope_factor)) ||
        put(d, "low_freq_factor", json_real(c->rope_low_freq_factor)) ||
        put(d, "high_freq_factor", json_real(c->rope_high_freq_factor)) ||
        put(d, "original_max_position_embeddings", json_integer(c->rope_original_max_pos))) {
        json_decref(d);
        return NULL;
    }
    return d;
}

/* The experts' keys of a mixture-of-experts family (those hf_config.c reads back); 1 when out of memory.
 * The load-balancing loss is part of the objective when router_aux_coef > 0 (output_router_logits). */
static int put_moe(json_t *o, const decoder_config *c, const decoder_arch_info *a) {
    int bad = put(o, a->arch == DECODER_ARCH_MIXTRAL ? "num_local_experts" : "num_experts", json_integer(c->n_experts)) ||
              put(o, "num_experts_per_tok", json_integer(c->top_k)) ||
              put(o, "router_aux_loss_coef", json_real(c->router_aux_coef > 0 ? c->router_aux_coef : a->hf_aux_coef)) ||
              put(o, "output_router_logits", json_boolean(c->router_aux_coef > 0));
    if (a->norm_topk_fixed < 0) bad = bad || put(o, "norm_topk_prob", json_boolean(c->norm_topk));
    if (a->arch == DECODER_ARCH_MIXTRAL) bad = bad || put(o, "sliding_window", json_null());
    if (a->arch == DECODER_ARCH_OLMOE) bad = bad || put(o, "clip_qkv", json_null());
    if (a->moe_every_layer) return bad;
    json_t *dense = json_array();
    for (int l = 0; dense && l < c->n_layers && !bad; l++)
        if (!decoder_layer_is_moe(c, l) && (l + 1) % c->moe_step == 0) bad = json_array_append_new(dense, json_integer(l));
    return bad || !dense || put(o, "mlp_only_layers", dense) ||
           put(o, "moe_intermediate_size", json_integer(c->moe_ffn_hidden)) ||
           put(o, "decoder_sparse_step", json_integer(c->moe_step));
}

/* The config object; NULL when out of memory. */
static json_t *config_object(const decoder_config *c, const decoder_arch_info *a, const char *dt) {
    json_t *o = json_object(), *archs = json_array();
    int bad = !o || !archs || json_array_append_new(archs, json_string(a->hf_class));
    bad = bad || put(o, "architectures", archs);
    archs = NULL;
    bad = bad || put(o, "model_type", json_string(a->model_type)) || put(o, "hidden_size", json_integer(c->dim)) ||
          put(o, "intermediate_size", json_integer(c->ffn_hidden)) ||
          put(o, "num_hidden_layers", json_integer(c->n_layers)) ||
          put(o, "num_attention_heads", json_integer(c->n_heads)) ||
          put(o, "num_key_value_heads", json_integer(c->n_kv_heads)) || put(o, "head_dim", json_integer(c->head_dim)) ||
          put(o, "vocab_size", json_integer(c->vocab_size)) ||
          put(o, "max_position_embeddings", json_integer(c->max_seq_len)) ||
          put(o, "rms_norm_eps", json_real(c->norm_eps)) || put(o, "rope_theta", json_real(c->rope_theta)) ||
          put(o, "rope_scaling", rope_scaling_of(c)) ||
          put(o, "tie_word_embeddings", json_boolean(c->tie_embeddings)) ||
          /* always written: null is no padding row even where the class's default is a token (OLMoE's 1) */
          put(o, "pad_token_id", c->has_padding_idx ? json_integer(c->padding_idx) : json_null()) ||
          put(o, "hidden_act", json_string("silu")) ||
          put(o, "initializer_range", json_real(c->init_std > 0 ? c->init_std : 0.02)) ||
          put(o, "attention_dropout", json_real(0.0)) || put(o, "use_cache", json_true()) ||
          put(o, "torch_dtype", json_string(dt));
    if (a->arch == DECODER_ARCH_QWEN2 || a->arch == DECODER_ARCH_QWEN3 || a->arch == DECODER_ARCH_QWEN3_MOE)
        bad = bad || put(o, "use_sliding_window", json_false());
    if (a->arch == DECODER_ARCH_LLAMA3 || a->arch == DECODER_ARCH_QWEN3 || a->arch == DECODER_ARCH_QWEN3_MOE ||
        a->arch == DECODER_ARCH_OLMOE)
        bad = bad || put(o, "attention_bias", json_false());
    if (a->arch == DECODER_ARCH_LLAMA3) bad = bad || put(o, "mlp_bias", json_false());
    if (a->moe) bad = bad || put_moe(o, c, a);
    json_decref(archs);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The fewest significant digits (%.Ng) that give x back when parsed. */
static int digits_of(double x) {
    for (int p = 1; p < 17; p++) {
        char buf[40];
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x) return p;
    }
    return 17;
}

/* The precision that prints every real of the config exactly and as short as it can (1e-06, not
 * 9.9999999999999995e-07, as Python's json writes them). */
static int real_precision(const decoder_config *c) {
    const double xs[] = {c->norm_eps, c->rope_theta, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                         c->init_std > 0 ? c->init_std : 0.02, c->router_aux_coef};
    int p = 1;
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
        int d = digits_of(xs[i]);
        if (d > p) p = d;
    }
    return p;
}

int hf_config_to_json(const decoder_config *c, fsdp_dtype dtype, char **text, fsdp_err *err) {
    *text = NULL;
    const decoder_arch_info *a = c ? decoder_arch_get(c->arch) : NULL;
    const char *dt = dtype_name(dtype);
    if (!a || c->head_dim <= 0 || c->ffn_hidden <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "config.json: the model config is invalid or not finalized");
    if (!dt)
        return fsdp_err_set(err, FSDP_E_INVALID, "config.json: weights of dtype %s have no transformers torch_dtype "
                            "(f32, bf16 or f16)", fsdp_dtype_name(dtype));
    /* a switch the architecture does not have cannot be described to transformers */
    if (c->qkv_bias != a->qkv_bias || c->qk_norm != a->qk_norm)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "config.json: model_type '%s' has %s and %s, this model has %s and %s: transformers could "
                            "not load it",
                            a->model_type, a->qkv_bias ? "q/k/v biases" : "no q/k/v biases",
                            a->qk_norm ? "q/k norms" : "no q/k norms", c->qkv_bias ? "q/k/v biases" : "no q/k/v biases",
                            c->qk_norm ? "q/k norms" : "no q/k norms");
    json_t *o = config_object(c, a, dt);
    char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(real_precision(c))) : NULL;
    json_decref(o);
    if (!s) return fsdp_err_set(err, FSDP_E_NOMEM, "config.json: out of memory");
    *text = s;
    return FSDP_OK;
}

static int fsync_dir(const char *dir, fsdp_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open the directory: %s", dir, strerror(errno));
    int rc = fsync(fd) && errno != EINVAL ? errno : 0;
    close(fd);
    return rc ? fsdp_err_set(err, FSDP_E_IO, "%s: fsync of the directory: %s", dir, strerror(rc)) : FSDP_OK;
}

/* generation_config.json beside config.json, as save_pretrained writes it for a generative model
 * (GenerationConfig.from_model_config): loaders that look for it (OLMo-core's load_hf_model) open the directory. */
static int gen_config_write(const decoder_config *c, const char *dir, fsdp_err *err) {
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "_from_model_config", json_true()) ||
        (c->has_padding_idx && json_object_set_new(o, "pad_token_id", json_integer(c->padding_idx)))) {
        json_decref(o);
        return fsdp_err_set(err, FSDP_E_NOMEM, "generation_config.json: out of memory");
    }
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    char fin[4200], tmp[4220];
    if (!text) return fsdp_err_set(err, FSDP_E_NOMEM, "generation_config.json: out of memory");
    snprintf(fin, sizeof fin, "%s/generation_config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    size_t len = strlen(text);
    char *nl = realloc(text, len + 2);
    if (!nl) return free(text), fsdp_err_set(err, FSDP_E_NOMEM, "generation_config.json: out of memory");
    nl[len++] = '\n';
    int rc = tmpf_write_replace(tmp, fin, nl, len, "hfconfig", err);
    free(nl);
    return rc;
}

int hf_config_write(const decoder_config *c, fsdp_dtype dtype, const char *dir, fsdp_err *err) {
    char *text;
    int rc = hf_config_to_json(c, dtype, &text, err);
    if (rc) return rc;
    size_t len = strlen(text);
    char *with_nl = realloc(text, len + 2);
    if (!with_nl) {
        free(text);
        return fsdp_err_set(err, FSDP_E_NOMEM, "config.json: out of memory");
    }
    with_nl[len++] = '\n';
    with_nl[len] = '\0';
    char fin[4200], tmp[4210];
    if (snprintf(fin, sizeof fin, "%s/config.json", dir) >= (int)sizeof fin) {
        free(with_nl);
        return fsdp_err_set(err, FSDP_E_INVALID, "config.json: directory path too long: %s", dir);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    rc = tmpf_write_replace(tmp, fin, with_nl, len, "hfconfig", err);
    free(with_nl);
    if (!rc) rc = gen_config_write(c, dir, err);
    if (!rc) rc = fsync_dir(dir, err);
    return rc;
}
