/* Llama model workspace: one arena holding the saved activations and the backward scratch. */
#include "decoder/decoder_model_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Carves `count` floats (rounded up to 16 for 64-byte alignment) at *off; 0 on overflow. */
static int carve(size_t *off, size_t count, size_t *at) {
    size_t rounded;
    if (__builtin_add_overflow(count, (size_t)15, &rounded)) return 0;
    rounded &= ~(size_t)15;
    *at = *off;
    return !__builtin_add_overflow(*off, rounded, off);
}

static int mul3(size_t a, size_t b, size_t c, size_t *out) {
    size_t t;
    return !__builtin_mul_overflow(a, b, &t) && !__builtin_mul_overflow(t, c, out);
}

/* Two passes: sizes (base == NULL) then pointers. Returns 0 on size overflow. */
static int layout(decoder_model_ws *ws, float *base, size_t *total) {
    const decoder_config *c = &ws->cfg;
    size_t BT = (size_t)ws->B_max * (size_t)ws->T_max;
    size_t nd, nq, nkv, nf, nlse, nlsek, nlog, nrope;
    if (!mul3(BT, (size_t)c->dim, 1, &nd) || !mul3(BT, (size_t)c->n_heads, (size_t)c->head_dim, &nq) ||
        !mul3(BT, (size_t)c->n_kv_heads, (size_t)c->head_dim, &nkv) || !mul3(BT, (size_t)c->ffn_hidden, 1, &nf) ||
        !mul3(BT, (size_t)c->n_heads, 1, &nlse) || !mul3(BT, (size_t)c->n_kv_heads, 1, &nlsek) || !mul3((size_t)ws->head_chunk, (size_t)c->vocab_size, 1, &nlog) ||
        !mul3((size_t)ws->T_max, (size_t)(c->head_dim / 2), 1, &nrope))
        return 0;
    size_t off = 0, at;
#define CARVE(ptr, n)                                       \
    do {                                                    \
        if (!carve(&off, (n), &at)) return 0;               \
        if (base) (ptr) = base + at;                        \
    } while (0)
    CARVE(ws->rope_cos, nrope);
    CARVE(ws->rope_sin, nrope);
    /* selective checkpointing: the cheap intermediates, one buffer each for all layers */
    float *sel_xn = NULL, *sel_g = NULL;
    if (ws->ac == DECODER_AC_SELECTIVE) {
        CARVE(sel_xn, nd);
        CARVE(sel_g, nf);
    }
    decoder_model_acts scratch; /* the sizing pass (base NULL) may run without acts */
    for (int l = 0; l < c->n_layers; l++) {
        decoder_model_acts *a = base ? &ws->acts[l] : &scratch;
        CARVE(a->x, nd);
        if (ws->ac == DECODER_AC_FULL && l > 0) {
            /* full checkpointing: one set of intermediates, recomputed per layer in the backward */
            if (base) {
                float *x = a->x;
                *a = ws->acts[0];
                a->x = x;
            }
            continue;
        }
        CARVE(a->rstd1, BT);
        if (ws->ac == DECODER_AC_SELECTIVE) a->xn1 = sel_xn;
        else CARVE(a->xn1, nd);
        if (c->qk_norm) {
            CARVE(a->qr, nq);
            CARVE(a->kr, nkv);
            CARVE(a->rstdq, nlse);
            CARVE(a->rstdk, nlsek);
        }
        CARVE(a->q, nq);
        CARVE(a->k, nkv);
        CARVE(a->v, nkv);
        CARVE(a->att, nq);
        CARVE(a->lse, nlse);
        CARVE(a->h, nd);
        CARVE(a->rstd2, BT);
        if (ws->ac == DECODER_AC_SELECTIVE) a->xn2 = sel_xn;
        else CARVE(a->xn2, nd);
        CARVE(a->a, nf);
        CARVE(a->b, nf);
        if (ws->ac == DECODER_AC_SELECTIVE) a->g = sel_g;
        else CARVE(a->g, nf);
    }
    CARVE(ws->x_final, nd);
    CARVE(ws->rstdf, BT);
    CARVE(ws->xnf, nd);
    CARVE(ws->logits, nlog);
    CARVE(ws->lse_x, BT);
    CARVE(ws->dres, nd);
    CARVE(ws->dxn, nd);
    CARVE(ws->dq, nq);
    CARVE(ws->datt, nq);
    CARVE(ws->dk, nkv);
    CARVE(ws->dv, nkv);
    if (c->qk_norm) {
        CARVE(ws->dqr, nq);
        CARVE(ws->dkr, nkv);
    }
    CARVE(ws->dg, nf);
    CARVE(ws->da, nf);
    CARVE(ws->db, nf);
#undef CARVE
    *total = off;
    return 1;
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
    size_t total = 0, bt = (size_t)B_max * (size_t)T_max, b;
    if (!layout(&ws, NULL, &total) || __builtin_mul_overflow(total, sizeof(float), &b) ||
        __builtin_add_overflow(b, 2 * bt * sizeof(int32_t), &b))
        return -1;
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
    if (decoder_head_chunk_check(o.head_chunk_rows, "llama workspace", err)) return NULL;
    if (B_max <= 0 || T_max <= 0 || (int64_t)B_max * T_max > INT_MAX) {
        fsdp_err_set(err, FSDP_E_INVALID, "llama workspace: batch %d x %d must be positive with B*T <= %d", B_max,
                     T_max, INT_MAX);
        return NULL;
    }
    if (o.ac != DECODER_AC_NONE && o.ac != DECODER_AC_FULL && o.ac != DECODER_AC_SELECTIVE) {
        fsdp_err_set(err, FSDP_E_INVALID, "llama workspace: activation checkpointing mode %d is not none (%d), full (%d) "
                     "or selective (%d)", o.ac, DECODER_AC_NONE, DECODER_AC_FULL, DECODER_AC_SELECTIVE);
        return NULL;
    }
    decoder_model_ws *ws = calloc(1, sizeof *ws);
    if (!ws) {
        fsdp_err_set(err, FSDP_E_NOMEM, "llama workspace: out of memory");
        return NULL;
    }
    ws->cfg = *cfg;
    ws->ac = (decoder_ac)o.ac;
    ws->B_max = B_max;
    ws->T_max = T_max;
    ws->head_chunk = decoder_head_chunk_resolve(cfg, (int64_t)B_max * T_max, o.head_chunk_rows, sizeof(float));
    size_t bt = (size_t)B_max * (size_t)T_max, total = 0;
    ws->acts = calloc((size_t)cfg->n_layers, sizeof *ws->acts);
    ws->tokens = malloc(bt * sizeof(int32_t));
    ws->labels = malloc(bt * sizeof(int32_t));
    if (!ws->acts || !ws->tokens || !ws->labels) {
        fsdp_err_set(err, FSDP_E_NOMEM, "llama workspace: out of memory for %zu tokens", bt);
        decoder_model_ws_free(ws);
        return NULL;
    }
    if (!layout(ws, NULL, &total) || total > SIZE_MAX / sizeof(float)) {
        fsdp_err_set(err, FSDP_E_INVALID, "llama workspace: activation size for batch %d x %d overflows", B_max, T_max);
        decoder_model_ws_free(ws);
        return NULL;
    }
    ws->arena = aligned_alloc(64, total * sizeof(float));
    if (!ws->arena) {
        fsdp_err_set(err, FSDP_E_NOMEM, "llama workspace: cannot allocate %zu bytes of activations for batch %d x %d",
                     total * sizeof(float), B_max, T_max);
        decoder_model_ws_free(ws);
        return NULL;
    }
    ws->arena_floats = total;
    layout(ws, ws->arena, &total);
    kc_rope_params rp = {
        .theta = cfg->rope_theta,
        .llama3_scaling = cfg->rope_scaling == DECODER_ROPE_LLAMA3,
        .factor = cfg->rope_factor,
        .low_freq_factor = cfg->rope_low_freq_factor,
        .high_freq_factor = cfg->rope_high_freq_factor,
        .original_max_pos = (double)cfg->rope_original_max_pos,
    };
    if (kc_rope_tables(cfg->head_dim, T_max, &rp, ws->rope_cos, ws->rope_sin, err)) {
        fsdp_err_prefix(err, "llama workspace");
        decoder_model_ws_free(ws);
        return NULL;
    }
    ws->phase = DECODER_PHASE_EMPTY;
    return ws;
}

void decoder_model_ws_free(decoder_model_ws *ws) {
    if (!ws) return;
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
    return ws->arena_floats * sizeof(float) + 2 * (size_t)ws->B_max * (size_t)ws->T_max * sizeof(int32_t);
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
        c->qk_norm != w->qk_norm || c->tie_embeddings != w->tie_embeddings)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: the config does not match the one the workspace was made for",
                            what);
    return FSDP_OK;
}
