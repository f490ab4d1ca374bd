/* The decoder family on the GPU: weight binding on the flat layout and the device workspace (one arena from the
 * device allocator). */
#include "decoder/decoder_cuda_internal.h"
#include "decoder/decoder_model_ws_layout.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding ------------------------------------------------------------------------------------ */

void decoder_cuda_layer_bind(const decoder_config *c, int layer, const void *flat_layer, fsdp_dtype dt,
                             decoder_cuda_layer *lw) {
    /* the flat layout of decoder_model_layer_bind (table order) in elements of dt */
    decoder_model_layer f;
    float *base = (float *)(uintptr_t)64; /* only differences are used */
    decoder_model_layer_bind(c, layer, base, &f);
    const size_t es = fsdp_dtype_size(dt);
    const unsigned char *p = flat_layer;
#define AT(field) (f.field ? p + (size_t)(f.field - base) * es : NULL)
    lw->wq = AT(wq);
    lw->wk = AT(wk);
    lw->wv = AT(wv);
    lw->wo = AT(wo);
    lw->w1 = AT(w1);
    lw->w2 = AT(w2);
    lw->w3 = AT(w3);
    lw->attention_norm = AT(attention_norm);
    lw->ffn_norm = AT(ffn_norm);
    lw->wq_b = AT(wq_b);
    lw->wk_b = AT(wk_b);
    lw->wv_b = AT(wv_b);
    lw->q_norm = AT(q_norm);
    lw->k_norm = AT(k_norm);
    lw->ew1 = AT(ew1);
    lw->ew2 = AT(ew2);
    lw->ew3 = AT(ew3);
    lw->router = AT(router);
#undef AT
}

int decoder_cuda_weights_bind(const decoder_config *c, const void *flat, fsdp_dtype dt, decoder_cuda_weights *w,
                            fsdp_err *err) {
    memset(w, 0, sizeof *w);
    if (decoder_model_check(c, err)) return err ? err->code : FSDP_E_INVALID;
    if (dt != FSDP_DT_F32 && dt != FSDP_DT_BF16)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda): weight dtype %s is not f32 or bf16", fsdp_dtype_name(dt));
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return fsdp_err_set(err, FSDP_E_NOMEM, "decoder (cuda): out of memory binding %d layers", c->n_layers);
    const size_t es = fsdp_dtype_size(dt), emb = (size_t)c->vocab_size * (size_t)c->dim * es;
    const unsigned char *p = flat;
    w->tok_embeddings = p;
    p += emb;
    for (int l = 0; l < c->n_layers; l++) {
        decoder_cuda_layer_bind(c, l, p, dt, &w->layers[l]);
        p += (size_t)decoder_model_layer_numel(c, l) * es;
    }
    w->norm = p;
    p += (size_t)c->dim * es;
    w->output = c->tie_embeddings ? w->tok_embeddings : p;
    w->n_layers = c->n_layers;
    return FSDP_OK;
}

void decoder_cuda_weights_unbind(decoder_cuda_weights *w) {
    if (!w) return;
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* ---- workspace ----------------------------------------------------------------------------------- */

/* The device arena's layout for ws's shape into *L (decoder_model_ws_layout_free): counted in bytes, every
 * buffer 256-byte aligned, the tokens, labels, attention scratch and loss sums in the arena too. */
static int ws_layout(const decoder_cuda_ws *ws, decoder_model_ws_layout *L, fsdp_err *err) {
    const decoder_model_ws_layout_spec spec = {1, fsdp_dtype_size(ws->dt), 256, 1};
    const decoder_model_ws_layout_shape sh = {&ws->cfg, ws->ac, ws->B_max, ws->T_max, ws->head_chunk};
    int rc = decoder_model_ws_layout_compute(&spec, &sh, L);
    if (rc == FSDP_E_NOMEM) return fsdp_err_set(err, rc, "decoder (cuda) workspace: out of host memory");
    if (rc)
        return fsdp_err_set(err, rc, "decoder (cuda) workspace: activation size for batch %d x %d overflows", ws->B_max,
                            ws->T_max);
    return FSDP_OK;
}

/* Points ws's buffers into ws->arena as L says (those L does not hold stay NULL). */
static void bind(decoder_cuda_ws *ws, const decoder_model_ws_layout *L) {
#define BIND_WS(name) ws->name = decoder_model_ws_layout_at(L, ws->arena, L->name);
#define BIND_ACT(name) a->name = decoder_model_ws_layout_at(L, ws->arena, L->layers[l].name);
    DECODER_MODEL_WS_LAYOUT_WS_BUFS(BIND_WS)
    DECODER_MODEL_WS_LAYOUT_IO_BUFS(BIND_WS)
    for (int l = 0; l < L->n_layers; l++) {
        decoder_cuda_acts *a = &ws->acts[l];
        DECODER_MODEL_WS_LAYOUT_LAYER_BUFS(BIND_ACT)
    }
#undef BIND_WS
#undef BIND_ACT
}

decoder_cuda_ws *decoder_cuda_ws_create(dev_ctx *d, const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                    fsdp_err *err) {
    return decoder_cuda_ws_create_opts(d, cfg, B_max, T_max, dt, NULL, err);
}

decoder_cuda_ws *decoder_cuda_ws_create_ac(dev_ctx *d, const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                       int ac, fsdp_err *err) {
    decoder_model_ws_opts o = {ac, 0};
    return decoder_cuda_ws_create_opts(d, cfg, B_max, T_max, dt, &o, err);
}

static int upload_rope(decoder_cuda_ws *ws, fsdp_err *err);

/* The checks of decoder_cuda_ws_create_opts that need no device. */
static int ws_args(const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt, const decoder_model_ws_opts *o,
                   fsdp_err *err) {
    if (decoder_model_check(cfg, err)) return err ? err->code : FSDP_E_INVALID;
    if (decoder_head_chunk_check(o->head_chunk_rows, "decoder (cuda) workspace", err)) return FSDP_E_INVALID;
    if (cfg->head_dim > KCU_ATTN_MAX_HEAD_DIM)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) workspace: head_dim %d is larger than the attention kernel's %d",
                            cfg->head_dim, KCU_ATTN_MAX_HEAD_DIM);
    if (dt != FSDP_DT_F32 && dt != FSDP_DT_BF16)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) workspace: dtype %s is not f32 or bf16",
                            fsdp_dtype_name(dt));
    if (o->ac != DECODER_AC_NONE && o->ac != DECODER_AC_FULL && o->ac != DECODER_AC_SELECTIVE)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) workspace: activation checkpointing mode %d is not none (%d), full (%d) or "
                            "selective (%d)",
                            o->ac, DECODER_AC_NONE, DECODER_AC_FULL, DECODER_AC_SELECTIVE);
    if (B_max <= 0 || T_max <= 0 || B_max > 65535 || (int64_t)B_max * T_max > INT_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) workspace: batch %d x %d must be positive with B <= 65535 and B*T <= %d",
                            B_max, T_max, INT_MAX);
    return FSDP_OK;
}

int decoder_cuda_ws_plan_bytes(const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                             const decoder_model_ws_opts *opts, size_t *bytes, int *head_chunk, fsdp_err *err) {
    decoder_model_ws_opts o = {0, 0};
    if (opts) o = *opts;
    int rc = ws_args(cfg, B_max, T_max, dt, &o, err);
    if (rc) return rc;
    decoder_cuda_ws ws;
    memset(&ws, 0, sizeof ws);
    ws.cfg = *cfg;
    ws.dt = dt;
    ws.ac = (decoder_ac)o.ac;
    ws.B_max = B_max;
    ws.T_max = T_max;
    ws.head_chunk = decoder_head_chunk_resolve(cfg, (int64_t)B_max * T_max, o.head_chunk_rows, fsdp_dtype_size(dt));
    decoder_model_ws_layout L;
    if ((rc = ws_layout(&ws, &L, err))) return rc;
    if (bytes) *bytes = L.total;
    decoder_model_ws_layout_free(&L);
    if (head_chunk) *head_chunk = ws.head_chunk;
    return FSDP_OK;
}

decoder_cuda_ws *decoder_cuda_ws_create_opts(dev_ctx *d, const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                         const decoder_model_ws_opts *opts, fsdp_err *err) {
    decoder_model_ws_opts o = {0, 0};
    if (opts) o = *opts;
    if (!d) {
        fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) workspace: no device context");
        return NULL;
    }
    if (ws_args(cfg, B_max, T_max, dt, &o, err)) return NULL;
    decoder_cuda_ws *ws = calloc(1, sizeof *ws);
    if (!ws || !(ws->acts = calloc((size_t)cfg->n_layers, sizeof *ws->acts))) {
        free(ws);
        fsdp_err_set(err, FSDP_E_NOMEM, "decoder (cuda) workspace: out of host memory");
        return NULL;
    }
    ws->d = d;
    ws->s = dev_ctx_stream(d, DEV_STREAM_COMPUTE);
    ws->cfg = *cfg;
    ws->dt = dt;
    ws->ac = (decoder_ac)o.ac;
    ws->B_max = B_max;
    ws->T_max = T_max;
    ws->head_chunk = decoder_head_chunk_resolve(cfg, (int64_t)B_max * T_max, o.head_chunk_rows, fsdp_dtype_size(dt));
    decoder_model_ws_layout L;
    if (ws_layout(ws, &L, err)) {
        decoder_cuda_ws_free(ws);
        return NULL;
    }
    if (dev_alloc(d, L.total, &ws->arena, err)) {
        fsdp_err_prefix(err, "decoder (cuda) workspace: %zu bytes of activations for batch %d x %d", L.total, B_max,
                        T_max);
        decoder_model_ws_layout_free(&L);
        decoder_cuda_ws_free(ws);
        return NULL;
    }
    ws->arena_bytes = L.total;
    bind(ws, &L);
    decoder_model_ws_layout_free(&L);
    if (upload_rope(ws, err)) {
        fsdp_err_prefix(err, "decoder (cuda) workspace");
        decoder_cuda_ws_free(ws);
        return NULL;
    }
    if (decoder_cuda_moe_alloc(ws, err)) {
        decoder_cuda_ws_free(ws);
        return NULL;
    }
    ws->phase = DECODER_CUDA_EMPTY;
    return ws;
}

/* RoPE tables: computed on the host in double (kc_rope_tables), uploaded once. */
static int upload_rope(decoder_cuda_ws *ws, fsdp_err *err) {
    const decoder_config *cfg = &ws->cfg;
    size_t half = (size_t)cfg->head_dim / 2, nrope = (size_t)ws->T_max * half;
    float *tab = malloc(2 * nrope * sizeof(float));
    if (!tab) return fsdp_err_set(err, FSDP_E_NOMEM, "out of host memory for the RoPE tables");
    kc_rope_params rp = {
        .theta = cfg->rope_theta,
        .llama3_scaling = cfg->rope_scaling == DECODER_ROPE_LLAMA3,
        .factor = cfg->rope_factor,
        .low_freq_factor = cfg->rope_low_freq_factor,
        .high_freq_factor = cfg->rope_high_freq_factor,
        .original_max_pos = (double)cfg->rope_original_max_pos,
    };
    int rc = kc_rope_tables(cfg->head_dim, ws->T_max, &rp, tab, tab + nrope, err);
    if (!rc) rc = dev_upload(ws->d, ws->rope_cos, tab, nrope * sizeof(float), err);
    if (!rc) rc = dev_upload(ws->d, ws->rope_sin, tab + nrope, nrope * sizeof(float), err);
    free(tab);
    return rc;
}

void decoder_cuda_ws_free(decoder_cuda_ws *ws) {
    if (!ws) return;
    decoder_cuda_moe_free(ws);
    if (ws->arena) {
        fsdp_err err;
        /* pending kernels may still use the arena: wait before giving it back */
        dev_stream_sync(ws->d, DEV_STREAM_COMPUTE, &err);
        dev_free(ws->d, ws->arena, &err);
    }
    free(ws->acts);
    free(ws);
}

size_t decoder_cuda_ws_bytes(const decoder_cuda_ws *ws) { return ws ? ws->arena_bytes + ws->moe_bytes : 0; }
fsdp_dtype decoder_cuda_ws_dtype(const decoder_cuda_ws *ws) { return ws ? ws->dt : FSDP_DT_INVALID; }

const void *decoder_cuda_ws_logits(const decoder_cuda_ws *ws) {
    return ws && ws->phase == DECODER_CUDA_HEAD && ws->head_full ? ws->logits : NULL;
}

int decoder_cuda_ws_head_chunk(const decoder_cuda_ws *ws) { return ws ? ws->head_chunk : 0; }

const double *decoder_cuda_ws_loss_sums(const decoder_cuda_ws *ws) { return ws ? ws->sums : NULL; }

int decoder_cuda_ws_check(const decoder_config *c, const decoder_cuda_ws *ws, const char *what, fsdp_err *err) {
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
