/* The decoder model's CPU workspace: one arena holding the saved activations and the backward scratch. */
#include "decoder/decoder_model_internal.h"
#include "decoder/decoder_model_ws_layout.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* The CPU arena counts in floats, every buffer 64-byte aligned; the tokens and labels live outside it. */
static const decoder_model_ws_layout_spec cpu_spec = {sizeof(float), sizeof(float), 64, 0};

/* The arena's layout for ws's shape into *L (decoder_model_ws_layout_free); 0, or an error in err. */
static int ws_layout(const decoder_model_ws *ws, decoder_model_ws_layout *L, fsdp_err *err) {
    const decoder_model_ws_layout_shape sh = {&ws->cfg, ws->ac, ws->B_max, ws->T_max, ws->head_chunk};
    int rc = decoder_model_ws_layout_compute(&cpu_spec, &sh, L);
    if (rc == FSDP_E_NOMEM) return fsdp_err_set(err, rc, "decoder workspace: out of memory for the layout");
    if (!rc && L->total <= SIZE_MAX / sizeof(float)) return FSDP_OK;
    decoder_model_ws_layout_free(L);
    return fsdp_err_set(err, FSDP_E_INVALID, "decoder workspace: activation size for batch %d x %d overflows", ws->B_max,
                        ws->T_max);
}

/* Points ws's buffers into ws->arena as L says (those L does not hold stay NULL). */
static void bind(decoder_model_ws *ws, const decoder_model_ws_layout *L) {
#define BIND_WS(name) ws->name = decoder_model_ws_layout_at(L, ws->arena, L->name);
#define BIND_ACT(name) a->name = decoder_model_ws_layout_at(L, ws->arena, L->layers[l].name);
    DECODER_MODEL_WS_LAYOUT_WS_BUFS(BIND_WS)
    for (int l = 0; l < L->n_layers; l++) {
        decoder_model_acts *a = &ws->acts[l];
        DECODER_MODEL_WS_LAYOUT_LAYER_BUFS(BIND_ACT)
    }
#undef BIND_WS
#undef BIND_ACT
}

/* The RoPE tables of ws (kc_rope_tables, in double) into its arena. */
static int fill_rope(decoder_model_ws *ws, fsdp_err *err) {
    const decoder_config *cfg = &ws->cfg;
    kc_rope_params rp = {
        .theta = cfg->rope_theta,
        .llama3_scaling = cfg->rope_scaling == DECODER_ROPE_LLAMA3,
        .factor = cfg->rope_factor,
        .low_freq_factor = cfg->rope_low_freq_factor,
        .high_freq_factor = cfg->rope_high_freq_factor,
        .original_max_pos = (double)cfg->rope_original_max_pos,
    };
    return kc_rope_tables(cfg->head_dim, ws->T_max, &rp, ws->rope_cos, ws->rope_sin, err);
}

int decoder_head_chunk_resolve(const decoder_config *c, int64_t rows, int head_chunk_rows, size_t elem_size) {
    int64_t r = head_chunk_rows;
    if (r <= 0) {
        size_t row_bytes = (size_t)(c->vocab_size > 0 ? c->vocab_size : 1) * (elem_size ? elem_size : 1);
        r = (int64_t)(DECODER_HEAD_CHUNK_BYTES / row_bytes);
    }
    if (r > rows) r = rows;
    return r < 1 ? 1 : (int)r;
}

int decoder_head_chunk_check(int64_t head_chunk_rows, const char *what, fsdp_err *err) {
    if (head_chunk_rows < 0 || head_chunk_rows > INT_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: head_chunk_rows is %lld, expected 0 (automatic: %zu MiB of logits per chunk) or a "
                            "positive number of rows",
                            what, (long long)head_chunk_rows, DECODER_HEAD_CHUNK_BYTES >> 20);
    return FSDP_OK;
}

int decoder_model_ws_size(const decoder_config *cfg, int B_max, int T_max, const decoder_model_ws_opts *opts,
                        size_t *bytes) {
    decoder_model_ws_opts o = {0, 0};
    if (opts) o = *opts;
    if (B_max <= 0 || T_max <= 0 || (int64_t)B_max * T_max > INT_MAX || o.head_chunk_rows < 0) return -1;
    decoder_model_ws ws;
    memset(&ws, 0, sizeof ws);
    ws.cfg = *cfg;
    ws.ac = (decoder_ac)o.ac;
    ws.B_max = B_max;
    ws.T_max = T_max;
    ws.head_chunk = decoder_head_chunk_resolve(cfg, (int64_t)B_max * T_max, o.head_chunk_rows, sizeof(float));
    size_t bt = (size_t)B_max * (size_t)T_max, b;
    decoder_model_ws_layout L;
    if (ws_layout(&ws, &L, NULL)) return -1;
    size_t moe = 0;
    if (cfg->n_experts > 0) {
        kc_moe_dims m = {B_max * T_max, cfg->dim, cfg->moe_ffn_hidden, cfg->n_experts, cfg->top_k, cfg->norm_topk};
        size_t sets = o.ac == DECODER_AC_FULL ? 1 : (size_t)decoder_moe_layers(cfg);
        moe = (kc_moe_acts_floats(&m) * sets + kc_moe_scratch_floats(&m)) * sizeof(float);
    }
    int over = __builtin_mul_overflow(L.total, sizeof(float), &b) ||
               __builtin_add_overflow(b, 2 * bt * sizeof(int32_t), &b) || __builtin_add_overflow(b, moe, &b);
    decoder_model_ws_layout_free(&L);
    if (over) return -1;
    *bytes = b;
    return 0;
}

decoder_model_ws *decoder_model_ws_create(const decoder_config *cfg, int B_max, int T_max, fsdp_err *err) {
    return decoder_model_ws_create_opts(cfg, B_max, T_max, NULL, err);
}

decoder_model_ws *decoder_model_ws_create_ac(const decoder_config *cfg, int B_max, int T_max, int ac, fsdp_err *err) {
    decoder_model_ws_opts o = {ac, 0};
    return decoder_model_ws_create_opts(cfg, B_max, T_max, &o, err);
}

int decoder_model_ws_head_chunk(const decoder_model_ws *ws) { return ws ? ws->head_chunk : 0; }

decoder_model_ws *decoder_model_ws_create_opts(const decoder_config *cfg, int B_max, int T_max,
                                           const decoder_model_ws_opts *opts, fsdp_err *err) {
    decoder_model_ws_opts o = {0, 0};
    if (opts) o = *opts;
    if (decoder_model_check(cfg, err)) return NULL;
    if (decoder_head_chunk_check(o.head_chunk_rows, "decoder workspace", err)) return NULL;
    if (B_max <= 0 || T_max <= 0 || (int64_t)B_max * T_max > INT_MAX) {
        fsdp_err_set(err, FSDP_E_INVALID, "decoder workspace: batch %d x %d must be positive with B*T <= %d", B_max,
                     T_max, INT_MAX);
        return NULL;
    }
    if (o.ac != DECODER_AC_NONE && o.ac != DECODER_AC_FULL && o.ac != DECODER_AC_SELECTIVE) {
        fsdp_err_set(err, FSDP_E_INVALID, "decoder workspace: activation checkpointing mode %d is not none (%d), full (%d) "
                     "or selective (%d)", o.ac, DECODER_AC_NONE, DECODER_AC_FULL, DECODER_AC_SELECTIVE);
        return NULL;
    }
    decoder_model_ws *ws = calloc(1, sizeof *ws);
    if (!ws) {
        fsdp_err_set(err, FSDP_E_NOMEM, "decoder workspace: out of memory");
        return NULL;
    }
    ws->cfg = *cfg;
    ws->ac = (decoder_ac)o.ac;
    ws->B_max = B_max;
    ws->T_max = T_max;
    ws->head_chunk = decoder_head_chunk_resolve(cfg, (int64_t)B_max * T_max, o.head_chunk_rows, sizeof(float));
    size_t bt = (size_t)B_max * (size_t)T_max;
    ws->acts = calloc((size_t)cfg->n_layers, sizeof *ws->acts);
    ws->tokens = malloc(bt * sizeof(int32_t));
    ws->labels = malloc(bt * sizeof(int32_t));
    if (!ws->acts || !ws->tokens || !ws->labels) {
        fsdp_err_set(err, FSDP_E_NOMEM, "decoder workspace: out of memory for %zu tokens", bt);
        decoder_model_ws_free(ws);
        return NULL;
    }
    decoder_model_ws_layout L;
    if (ws_layout(ws, &L, err)) {
        decoder_model_ws_free(ws);
        return NULL;
    }
    ws->arena = aligned_alloc(64, L.total * sizeof(float));
    if (!ws->arena) {
        fsdp_err_set(err, FSDP_E_NOMEM, "decoder workspace: cannot allocate %zu bytes of activations for batch %d x %d",
                     L.total * sizeof(float), B_max, T_max);
        decoder_model_ws_layout_free(&L);
        decoder_model_ws_free(ws);
        return NULL;
    }
    ws->arena_floats = L.total;
    bind(ws, &L);
    decoder_model_ws_layout_free(&L);
    if (decoder_moe_ws_alloc(ws, err)) {
        decoder_model_ws_free(ws);
        return NULL;
    }
    if (fill_rope(ws, err)) {
        fsdp_err_prefix(err, "decoder workspace");
        decoder_model_ws_free(ws);
        return NULL;
    }
    ws->phase = DECODER_PHASE_EMPTY;
    return ws;
}

void decoder_model_ws_free(decoder_model_ws *ws) {
    if (!ws) return;
    decoder_moe_ws_free(ws);
    free(ws->arena);
    free(ws->acts);
    free(ws->tokens);
    free(ws->labels);
    free(ws);
}

void decoder_model_ws_set_stats(decoder_model_ws *ws, kc_stats *st) {
    if (ws) ws->stats = st;
}

const float *decoder_model_ws_logits(const decoder_model_ws *ws) {
    return ws && ws->phase == DECODER_PHASE_HEAD && ws->head_full ? ws->logits : NULL;
}

size_t decoder_model_ws_bytes(const decoder_model_ws *ws) {
    if (!ws) return 0;
    return (ws->arena_floats + ws->moe_floats) * sizeof(float) +
           2 * (size_t)ws->B_max * (size_t)ws->T_max * sizeof(int32_t);
}

int decoder_model_ws_check(const decoder_config *c, const decoder_model_ws *ws, const char *what, fsdp_err *err) {
    if (!ws || !c) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no workspace or config", what);
    const decoder_config *w = &ws->cfg;
    if (c->dim != w->dim || c->n_layers != w->n_layers || c->n_heads != w->n_heads ||
        c->n_kv_heads != w->n_kv_heads || c->vocab_size != w->vocab_size || c->head_dim != w->head_dim ||
        c->ffn_hidden != w->ffn_hidden || c->norm_eps != w->norm_eps || c->rope_theta != w->rope_theta ||
        c->rope_scaling != w->rope_scaling || c->rope_factor != w->rope_factor ||
        c->rope_low_freq_factor != w->rope_low_freq_factor || c->rope_high_freq_factor != w->rope_high_freq_factor ||
        c->rope_original_max_pos != w->rope_original_max_pos || c->qkv_bias != w->qkv_bias ||
        c->qk_norm != w->qk_norm || c->tie_embeddings != w->tie_embeddings || c->qk_norm_full != w->qk_norm_full ||
        c->n_experts != w->n_experts || c->top_k != w->top_k || c->moe_ffn_hidden != w->moe_ffn_hidden ||
        c->norm_topk != w->norm_topk || c->moe_step != w->moe_step ||
        memcmp(c->dense_layers, w->dense_layers, sizeof c->dense_layers))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: the config does not match the one the workspace was made for",
                            what);
    return FSDP_OK;
}
