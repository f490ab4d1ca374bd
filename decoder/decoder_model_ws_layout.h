/* The decoder family's activation workspace layout, computed once for both allocators: which
 * buffers one arena holds, their offsets and sizes, for the CPU workspace (decoder_model_ws.c,
 * counted in floats) and the GPU one (decoder_cuda_ws.c, counted in bytes). */
#ifndef FSDP_DECODER_DECODER_MODEL_WS_LAYOUT_H
#define FSDP_DECODER_DECODER_MODEL_WS_LAYOUT_H

#include <stddef.h>

#include "decoder/decoder_model.h"

/* How one side counts: every size and offset is in units of unit_bytes bytes. */
typedef struct decoder_model_ws_layout_spec {
    size_t unit_bytes;  /* bytes per unit: CPU sizeof(float), GPU 1 */
    size_t act_bytes;   /* bytes per activation element: CPU sizeof(float), GPU the workspace dtype's size */
    size_t align_bytes; /* every buffer starts at a multiple of this (power of two): CPU 64, GPU 256 */
    int device_io;      /* the arena also holds the tokens, labels, attention scratch and loss sums (GPU) */
} decoder_model_ws_layout_spec;

/* The shape the layout is made for (head_chunk from decoder_head_chunk_resolve). */
typedef struct decoder_model_ws_layout_shape {
    const decoder_config *cfg;
    decoder_ac ac;
    int B_max, T_max, head_chunk;
} decoder_model_ws_layout_shape;

/* An offset of a buffer the layout does not hold (its pointer stays NULL). */
#define DECODER_MODEL_WS_LAYOUT_NONE ((size_t)-1)

/* One layer's saved activations (X(name) for each, the field names of decoder_model_acts and decoder_cuda_acts). */
#define DECODER_MODEL_WS_LAYOUT_LAYER_BUFS(X) \
    X(x) X(rstd1) X(xn1) X(qr) X(kr) X(rstdq) X(rstdk) X(q) X(k) X(v) X(att) X(lse) X(h) X(rstd2) X(xn2) X(a) X(b) X(g)
/* The buffers both workspaces hold outside the layers (their field names in both). */
#define DECODER_MODEL_WS_LAYOUT_WS_BUFS(X)                                                                           \
    X(rope_cos) X(rope_sin) X(x_final) X(rstdf) X(xnf) X(logits) X(lse_x) X(dres) X(dxn) X(dq) X(datt) X(dk) \
        X(dv) X(dqr) X(dkr) X(dg) X(da) X(db)
/* The buffers only the GPU arena holds (spec.device_io). */
#define DECODER_MODEL_WS_LAYOUT_IO_BUFS(X) X(tokens) X(labels) X(attn_scratch) X(sums)

#define DECODER_MODEL_WS_LAYOUT_FIELD(name) size_t name;
/* Offsets in units, or DECODER_MODEL_WS_LAYOUT_NONE. Under FULL checkpointing layers 1.. share every buffer
 * of layer 0 but x; under SELECTIVE every layer's xn1 = xn2 is one shared buffer and g another. */
typedef struct decoder_model_ws_layout_layer {
    DECODER_MODEL_WS_LAYOUT_LAYER_BUFS(DECODER_MODEL_WS_LAYOUT_FIELD)
} decoder_model_ws_layout_layer;

typedef struct decoder_model_ws_layout {
    DECODER_MODEL_WS_LAYOUT_WS_BUFS(DECODER_MODEL_WS_LAYOUT_FIELD)
    DECODER_MODEL_WS_LAYOUT_IO_BUFS(DECODER_MODEL_WS_LAYOUT_FIELD)
    int n_layers;
    decoder_model_ws_layout_layer *layers; /* n_layers (malloc'd; decoder_model_ws_layout_free) */
    size_t unit_bytes;               /* the spec's, for decoder_model_ws_layout_at */
    size_t total;                    /* units of the whole arena */
} decoder_model_ws_layout;
#undef DECODER_MODEL_WS_LAYOUT_FIELD

/* Fills *L for `shape` counted as `spec` says. 0 on success, FSDP_E_INVALID when a size overflows
 * size_t, FSDP_E_NOMEM when the per-layer table cannot be allocated (*L then holds nothing to free). */
int decoder_model_ws_layout_compute(const decoder_model_ws_layout_spec *spec, const decoder_model_ws_layout_shape *shape,
                              decoder_model_ws_layout *L);

void decoder_model_ws_layout_free(decoder_model_ws_layout *L);

/* base + off units, or NULL for DECODER_MODEL_WS_LAYOUT_NONE (or a NULL base). */
void *decoder_model_ws_layout_at(const decoder_model_ws_layout *L, void *base, size_t off);

#endif
