/* torchtitan <-> Hugging Face Llama parameter names, torchtitan naming styles and prefixes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "ckpt/namemap_moe.h"

typedef struct {
    const char *tt, *hf;
    nmap_qk qk;
} pair;

/* Per-layer suffixes after "layers.{i}." / "model.layers.{i}.". */
static const pair LAYER[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", NMAP_QK_Q},
    {"attention.wk.weight", "self_attn.k_proj.weight", NMAP_QK_K},
    {"attention.wv.weight", "self_attn.v_proj.weight", NMAP_QK_NONE},
    {"attention.wo.weight", "self_attn.o_proj.weight", NMAP_QK_NONE},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", NMAP_QK_NONE},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", NMAP_QK_NONE},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", NMAP_QK_NONE},
    {"attention_norm.weight", "input_layernorm.weight", NMAP_QK_NONE},
    {"ffn_norm.weight", "post_attention_layernorm.weight", NMAP_QK_NONE},
    /* Qwen2's q/k/v biases (rows permuted like their weights) and Qwen3's per-head q/k norms (one
     * head_dim vector each, permuted as a single head) */
    {"attention.wq.bias", "self_attn.q_proj.bias", NMAP_QK_Q},
    {"attention.wk.bias", "self_attn.k_proj.bias", NMAP_QK_K},
    {"attention.wv.bias", "self_attn.v_proj.bias", NMAP_QK_NONE},
    {"attention.q_norm.weight", "self_attn.q_norm.weight", NMAP_QK_HEAD},
    {"attention.k_norm.weight", "self_attn.k_norm.weight", NMAP_QK_HEAD},
};

static const pair GLOBAL[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", NMAP_QK_NONE},
    {"norm.weight", "model.norm.weight", NMAP_QK_NONE},
    {"output.weight", "lm_head.weight", NMAP_QK_NONE},
};

/* Names with no counterpart on the other side. */
static const char *const TT_DROP[] = {"freqs_cis"};
static const char *const HF_DROP_GLOBAL[] = {"model.rotary_emb.inv_freq"};
static const char *const HF_DROP_LAYER[] = {"self_attn.rotary_emb.inv_freq"};

/* torchtitan classic name pattern <-> 2026 (HEAD) name pattern. */
static const char *const TT_ALIASES[][2] = {
    {"layers.*.attention.wq.weight", "layers.*.attention.qkv_linear.wq.weight"},
    {"layers.*.attention.wk.weight", "layers.*.attention.qkv_linear.wk.weight"},
    {"layers.*.attention.wv.weight", "layers.*.attention.qkv_linear.wv.weight"},
    {"output.weight", "lm_head.weight"},
};
#define N_ALIASES (sizeof TT_ALIASES / sizeof TT_ALIASES[0])

static int put(char *out, size_t cap, fsdp_err *err, const char *a, const char *b, const char *c) {
    int n = snprintf(out, cap, "%s%s%s", a, b, c);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) out[0] = '\0';
        return fsdp_err_set(err, FSDP_E_INVALID, "name '%s%s%s' does not fit in %zu bytes", a, b, c, cap);
    }
    return FSDP_OK;
}

int nmap_tt_restyle(const char *name, nmap_tt_style style, char *out, size_t cap, int *changed, fsdp_err *err) {
    if (changed) *changed = 0;
    if (!name || !out) return fsdp_err_set(err, FSDP_E_INVALID, "nmap_tt_restyle: NULL argument");
    int from = style == NMAP_TT_CLASSIC ? 1 : 0, to = 1 - from;
    for (size_t i = 0; i < N_ALIASES; i++) {
        if (nmap_glob_match(TT_ALIASES[i][from], name, NULL) < 0) continue;
        if (changed) *changed = 1;
        return nmap_glob_rewrite(TT_ALIASES[i][from], TT_ALIASES[i][to], name, out, cap, err);
    }
    return put(out, cap, err, name, "", "");
}

int nmap_rules_add_tt_aliases(nmap_rules *r, fsdp_err *err) {
    for (size_t i = 0; i < N_ALIASES; i++) {
        int rc = nmap_rules_add(r, TT_ALIASES[i][1], TT_ALIASES[i][0], err);
        if (rc) return rc;
    }
    return FSDP_OK;
}

/* "<prefix><digits>.<rest>": *digits_len and *rest; 0 when name has that shape. */
static int split_layer(const char *name, const char *prefix, size_t *digits_len, const char **rest) {
    size_t pl = strlen(prefix), n = 0;
    if (strncmp(name, prefix, pl) != 0) return -1;
    const char *d = name + pl;
    while (d[n] >= '0' && d[n] <= '9') n++;
    if (n == 0 || n > 9 || d[n] != '.') return -1;
    *digits_len = n;
    *rest = d + n + 1;
    return 0;
}

static void set_info(nmap_info *info, int dropped, nmap_qk qk, int n_heads, int n_kv_heads, int layer) {
    if (!info) return;
    info->dropped = dropped;
    info->qk = qk;
    info->heads = qk == NMAP_QK_Q      ? n_heads
                  : qk == NMAP_QK_K    ? (n_kv_heads > 0 ? n_kv_heads : n_heads)
                  : qk == NMAP_QK_HEAD ? 1
                                       : 0;
    if (info->heads < 0) info->heads = 0;
    info->layer = layer;
    info->stacked = 0;
    info->part = 0;
}

static int in_list(const char *s, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, list[i])) return 1;
    return 0;
}

/* The Llama table's permutation under hf: q/k norms over the whole projection move like q / k rows. */
static nmap_qk layer_qk(const pair *p, const nmap_hf *hf) {
    if (p->qk != NMAP_QK_HEAD || !hf->qk_norm_full) return p->qk;
    return strstr(p->tt, "q_norm") ? NMAP_QK_Q : NMAP_QK_K;
}

/* rest (the suffix after a layer prefix) mapped into suffix: the MLA names first for an MLA model,
 * the Llama table, the MoE names. 1 when mapped, 0 when rest is none of them, -1 on an error (err). */
static int map_layer_rest(nmap_dir dir, const char *rest, const nmap_hf *hf, char *suffix, size_t cap, nmap_qk *qk,
                          int *stacked, int *part, fsdp_err *err) {
    int to_hf = dir == NMAP_TT_TO_HF;
    *qk = NMAP_QK_NONE;
    int m = hf->mla ? nmap_moe_rest(dir, rest, hf, 1, suffix, cap, stacked, part) : 0;
    for (size_t i = 0; !m && i < sizeof LAYER / sizeof LAYER[0]; i++) {
        if (strcmp(rest, to_hf ? LAYER[i].tt : LAYER[i].hf) != 0) continue;
        *stacked = *part = 0;
        *qk = hf->mla ? NMAP_QK_NONE : layer_qk(&LAYER[i], hf);
        if (put(suffix, cap, err, to_hf ? LAYER[i].hf : LAYER[i].tt, "", "")) return -1;
        m = 1;
    }
    if (!m) m = nmap_moe_rest(dir, rest, hf, 0, suffix, cap, stacked, part);
    if (m < 0) fsdp_err_set(err, FSDP_E_INVALID, "the name mapped from '%s' does not fit in %zu bytes", rest, cap);
    return m;
}

int nmap_map_hf(nmap_dir dir, const char *name, const nmap_hf *hf, char *out, size_t cap, nmap_info *info,
                fsdp_err *err) {
    if (!name || !out || !cap || !hf) return fsdp_err_set(err, FSDP_E_INVALID, "nmap_map: NULL argument");
    out[0] = '\0';
    int to_hf = dir == NMAP_TT_TO_HF, n_heads = hf->n_heads, n_kv_heads = hf->n_kv_heads;
    char canon[NMAP_NAME_MAX];
    const char *in = name;
    if (to_hf) {
        int rc = nmap_tt_restyle(name, NMAP_TT_CLASSIC, canon, sizeof canon, NULL, err);
        if (rc) return rc;
        in = canon;
    }
    for (size_t i = 0; i < sizeof GLOBAL / sizeof GLOBAL[0]; i++) {
        if (strcmp(in, to_hf ? GLOBAL[i].tt : GLOBAL[i].hf) != 0) continue;
        set_info(info, 0, NMAP_QK_NONE, n_heads, n_kv_heads, -1);
        return put(out, cap, err, to_hf ? GLOBAL[i].hf : GLOBAL[i].tt, "", "");
    }
    if (to_hf ? in_list(in, TT_DROP, sizeof TT_DROP / sizeof TT_DROP[0])
              : in_list(in, HF_DROP_GLOBAL, sizeof HF_DROP_GLOBAL / sizeof HF_DROP_GLOBAL[0])) {
        set_info(info, 1, NMAP_QK_NONE, n_heads, n_kv_heads, -1);
        return FSDP_OK;
    }
    size_t nd;
    const char *rest;
    const char *from_prefix = to_hf ? "layers." : "model.layers.", *to_prefix = to_hf ? "model.layers." : "layers.";
    if (!split_layer(in, from_prefix, &nd, &rest)) {
        const char *digits = in + strlen(from_prefix);
        int layer = atoi(digits);
        if (!to_hf && in_list(rest, HF_DROP_LAYER, sizeof HF_DROP_LAYER / sizeof HF_DROP_LAYER[0])) {
            set_info(info, 1, NMAP_QK_NONE, n_heads, n_kv_heads, layer);
            return FSDP_OK;
        }
        char suffix[NMAP_NAME_MAX];
        nmap_qk qk;
        int stacked, part;
        int m = map_layer_rest(dir, rest, hf, suffix, sizeof suffix, &qk, &stacked, &part, err);
        if (m < 0) return err->code;
        if (m == 1) {
            set_info(info, 0, qk, n_heads, n_kv_heads, layer);
            if (stacked && !info)
                return fsdp_err_set(err, FSDP_E_INVALID, "'%s' is a stacked tensor (experts): its mapping needs an nmap_info",
                                    name);
            if (info) info->stacked = stacked, info->part = part;
            if (stacked && to_hf) return FSDP_OK; /* out "": nmap_stack_part_name names the parts */
            char head[64];
            snprintf(head, sizeof head, "%s%.*s.", to_prefix, (int)nd, digits);
            return put(out, cap, err, head, suffix, "");
        }
    }
    return fsdp_err_set(err, FSDP_E_INVALID, "no %s name for %s tensor '%s'", to_hf ? "Hugging Face" : "torchtitan",
                        to_hf ? "torchtitan" : "Hugging Face", name);
}

int nmap_map(nmap_dir dir, const char *name, int n_heads, int n_kv_heads, char *out, size_t cap, nmap_info *info,
             fsdp_err *err) {
    nmap_hf hf = {n_heads, n_kv_heads, 0, 0, 0};
    nmap_info tmp;
    int rc = nmap_map_hf(dir, name, &hf, out, cap, &tmp, err);
    if (rc) return rc;
    if (tmp.stacked) {
        out[0] = '\0';
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "'%s' is %s of a stacked tensor of experts: map it with the MoE-aware mapping "
                            "(nmap_map_hf)", name, dir == NMAP_TT_TO_HF ? "the whole" : "one expert");
    }
    if (info) *info = tmp;
    return FSDP_OK;
}

const char *nmap_strip_prefix(const char *name, const char *prefix) {
    if (!name || !prefix) return NULL;
    size_t n = strlen(prefix);
    return strncmp(name, prefix, n) == 0 ? name + n : NULL;
}

int nmap_add_prefix(const char *prefix, const char *name, char *out, size_t cap, fsdp_err *err) {
    if (!prefix || !name || !out) return fsdp_err_set(err, FSDP_E_INVALID, "nmap_add_prefix: NULL argument");
    return put(out, cap, err, prefix, name, "");
}
