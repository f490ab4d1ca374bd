/* The decoder family's activation workspace layout (decoder_model_ws_layout.h): the offsets and sizes of
 * every buffer of the arena, once for the CPU and the GPU workspace. */
#include "decoder/decoder_model_ws_layout.h"

#include <stdint.h>
#include <stdlib.h>

/* The size of each kind of buffer, in units. */
typedef struct ws_sizes {
    size_t nd, nq, nkv, nf;    /* activations: [BT, d], [BT, H*hd], [BT, KV*hd], [BT, F] */
    size_t nstat, nlse, nlsek; /* float statistics: [BT], [BT*H], [BT*KV] */
    size_t nlog, nrope;        /* logits [head_chunk, V] (activation type), RoPE table [T_max, hd/2] (float) */
    size_t ntok, nsums;        /* int32 [BT] tokens or labels, the 2 double loss sums */
} ws_sizes;

/* Carving cursor: off is the next free unit; ok drops to 0 on overflow. */
typedef struct ws_cursor {
    size_t off, align;
    int ok;
} ws_cursor;

/* a*b*c*d, multiplied in that order; 0 on overflow. */
static int mul4(size_t a, size_t b, size_t c, size_t d, size_t *out) {
    size_t t, u;
    return !__builtin_mul_overflow(a, b, &t) && !__builtin_mul_overflow(t, c, &u) && !__builtin_mul_overflow(u, d, out);
}

/* Carves `count` units (rounded up to the alignment) and returns their offset. */
static size_t carve(ws_cursor *cur, size_t count) {
    size_t rounded, at = cur->off;
    if (!cur->ok || __builtin_add_overflow(count, cur->align - 1, &rounded) ||
        __builtin_add_overflow(cur->off, rounded & ~(cur->align - 1), &cur->off)) {
        cur->ok = 0;
        return DECODER_MODEL_WS_LAYOUT_NONE;
    }
    return at;
}

/* The buffer sizes for the shape, in the spec's units; 0 when one overflows. */
static int sizes(const decoder_model_ws_layout_spec *sp, const decoder_model_ws_layout_shape *sh, ws_sizes *s) {
    const decoder_config *c = sh->cfg;
    const size_t u = sp->unit_bytes, act = sp->act_bytes / u, f32 = sizeof(float) / u;
    const size_t BT = (size_t)sh->B_max * (size_t)sh->T_max;
    s->nsums = 2 * sizeof(double) / u;
    return mul4(BT, (size_t)c->dim, act, 1, &s->nd) &&
           mul4(BT, (size_t)c->n_heads, (size_t)c->head_dim, act, &s->nq) &&
           mul4(BT, (size_t)c->n_kv_heads, (size_t)c->head_dim, act, &s->nkv) &&
           mul4(BT, (size_t)c->ffn_hidden, act, 1, &s->nf) && mul4(BT, f32, 1, 1, &s->nstat) &&
           mul4(BT, (size_t)c->n_heads, f32, 1, &s->nlse) && mul4(BT, (size_t)c->n_kv_heads, f32, 1, &s->nlsek) &&
           mul4((size_t)sh->head_chunk, (size_t)c->vocab_size, act, 1, &s->nlog) &&
           mul4((size_t)sh->T_max, (size_t)(c->head_dim / 2), f32, 1, &s->nrope) &&
           mul4(BT, sizeof(int32_t) / u, 1, 1, &s->ntok);
}

/* Layer l's buffers; sel_xn and sel_g are the buffers SELECTIVE checkpointing shares. */
static void carve_layer(ws_cursor *cur, const ws_sizes *s, const decoder_model_ws_layout_shape *sh, size_t sel_xn,
                        size_t sel_g, int l, decoder_model_ws_layout *L) {
    decoder_model_ws_layout_layer *a = &L->layers[l];
    const int sel = sh->ac == DECODER_AC_SELECTIVE;
    if (sh->ac == DECODER_AC_FULL && l > 0) {
        /* full checkpointing: one set of intermediates, recomputed per layer in the backward */
        *a = L->layers[0];
        a->x = carve(cur, s->nd);
        return;
    }
    a->x = carve(cur, s->nd);
    a->rstd1 = carve(cur, s->nstat);
    a->xn1 = sel ? sel_xn : carve(cur, s->nd);
    if (sh->cfg->qk_norm) {
        a->qr = carve(cur, s->nq);
        a->kr = carve(cur, s->nkv);
        a->rstdq = carve(cur, s->nlse);
        a->rstdk = carve(cur, s->nlsek);
    }
    a->q = carve(cur, s->nq);
    a->k = carve(cur, s->nkv);
    a->v = carve(cur, s->nkv);
    a->att = carve(cur, s->nq);
    a->lse = carve(cur, s->nlse);
    a->h = carve(cur, s->nd);
    a->rstd2 = carve(cur, s->nstat);
    a->xn2 = sel ? sel_xn : carve(cur, s->nd);
    if (decoder_layer_is_moe(sh->cfg, l) && sh->ac != DECODER_AC_FULL) return; /* its experts' are elsewhere */
    a->a = carve(cur, s->nf);
    a->b = carve(cur, s->nf);
    a->g = sel ? sel_g : carve(cur, s->nf);
}

/* After the layers: the final norm, the head and the backward scratch. */
static void carve_tail(ws_cursor *cur, const ws_sizes *s, int qk_norm, decoder_model_ws_layout *L) {
    L->x_final = carve(cur, s->nd);
    L->rstdf = carve(cur, s->nstat);
    L->xnf = carve(cur, s->nd);
    L->logits = carve(cur, s->nlog);
    L->lse_x = carve(cur, s->nstat);
    L->dres = carve(cur, s->nd);
    L->dxn = carve(cur, s->nd);
    L->dq = carve(cur, s->nq);
    L->datt = carve(cur, s->nq);
    L->dk = carve(cur, s->nkv);
    L->dv = carve(cur, s->nkv);
    if (qk_norm) {
        L->dqr = carve(cur, s->nq);
        L->dkr = carve(cur, s->nkv);
    }
    L->dg = carve(cur, s->nf);
    L->da = carve(cur, s->nf);
    L->db = carve(cur, s->nf);
}

/* Every offset DECODER_MODEL_WS_LAYOUT_NONE, in *L and in *layer. */
#define UNSET(name) L->name = DECODER_MODEL_WS_LAYOUT_NONE;
#define UNSET_LAYER(name) layer->name = DECODER_MODEL_WS_LAYOUT_NONE;
static void unset(decoder_model_ws_layout *L, decoder_model_ws_layout_layer *layer) {
    DECODER_MODEL_WS_LAYOUT_WS_BUFS(UNSET)
    DECODER_MODEL_WS_LAYOUT_IO_BUFS(UNSET)
    DECODER_MODEL_WS_LAYOUT_LAYER_BUFS(UNSET_LAYER)
    L->n_layers = 0;
    L->layers = NULL;
    L->unit_bytes = 0;
    L->total = 0;
}
#undef UNSET
#undef UNSET_LAYER

int decoder_model_ws_layout_compute(const decoder_model_ws_layout_spec *spec, const decoder_model_ws_layout_shape *shape,
                              decoder_model_ws_layout *L) {
    decoder_model_ws_layout_layer none;
    unset(L, &none);
    L->unit_bytes = spec->unit_bytes;
    ws_sizes s;
    if (!sizes(spec, shape, &s)) return FSDP_E_INVALID;
    const int n = shape->cfg->n_layers > 0 ? shape->cfg->n_layers : 0;
    L->layers = malloc((size_t)(n > 0 ? n : 1) * sizeof *L->layers);
    if (!L->layers) return FSDP_E_NOMEM;
    L->n_layers = n;
    for (int l = 0; l < n; l++) L->layers[l] = none;
    ws_cursor cur = {0, spec->align_bytes / spec->unit_bytes, 1};
    if (spec->device_io) {
        L->tokens = carve(&cur, s.ntok);
        L->labels = carve(&cur, s.ntok);
    }
    L->rope_cos = carve(&cur, s.nrope);
    L->rope_sin = carve(&cur, s.nrope);
    if (spec->device_io) {
        L->attn_scratch = carve(&cur, s.nlse);
        L->sums = carve(&cur, s.nsums);
    }
    /* selective checkpointing: the cheap intermediates, one buffer each for all layers */
    size_t sel_xn = DECODER_MODEL_WS_LAYOUT_NONE, sel_g = DECODER_MODEL_WS_LAYOUT_NONE;
    if (shape->ac == DECODER_AC_SELECTIVE) {
        sel_xn = carve(&cur, s.nd);
        sel_g = carve(&cur, s.nf);
    }
    for (int l = 0; l < n; l++) carve_layer(&cur, &s, shape, sel_xn, sel_g, l, L);
    carve_tail(&cur, &s, shape->cfg->qk_norm, L);
    if (!cur.ok) {
        decoder_model_ws_layout_free(L);
        return FSDP_E_INVALID;
    }
    L->total = cur.off;
    return FSDP_OK;
}

void decoder_model_ws_layout_free(decoder_model_ws_layout *L) {
    if (!L) return;
    free(L->layers);
    L->layers = NULL;
    L->n_layers = 0;
}

void *decoder_model_ws_layout_at(const decoder_model_ws_layout *L, void *base, size_t off) {
    if (!base || off == DECODER_MODEL_WS_LAYOUT_NONE) return NULL;
    return (unsigned char *)base + off * L->unit_bytes;
}
