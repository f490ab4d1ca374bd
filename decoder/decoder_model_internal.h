/* Private to decoder/decoder_*.c: the workspace layout shared by the forward and backward files. */
#ifndef FSDP_DECODER_DECODER_MODEL_INTERNAL_H
#define FSDP_DECODER_DECODER_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "decoder/decoder_model.h"
#include "kernels/cpu/kc_moe.h"

/* What one layer's forward saves for its backward. Shapes use the current B*T rows. */
typedef struct decoder_model_acts {
    float *x;     /* [BT, d] layer input (residual stream) */
    float *rstd1; /* [BT] attention_norm rsqrt */
    float *xn1;   /* [BT, d] attention_norm output (SELECTIVE: shared, recomputed in the backward) */
    float *qr;    /* [BT, H*hd] q before its norm (qk_norm only; wq's output with its bias) */
    float *kr;    /* [BT, KV*hd] */
    float *rstdq; /* [BT*H] q_norm rsqrt per head (qk_norm only) */
    float *rstdk; /* [BT*KV] */
    float *q;     /* [BT, H*hd] after (q_norm and) RoPE */
    float *k;     /* [BT, KV*hd] after (k_norm and) RoPE */
    float *v;     /* [BT, KV*hd] */
    float *att;   /* [BT, H*hd] attention output (input of wo) */
    float *lse;   /* [B, H, T] softmax logsumexp */
    float *h;     /* [BT, d] x + attention */
    float *rstd2; /* [BT] ffn_norm rsqrt */
    float *xn2;   /* [BT, d] ffn_norm output (SELECTIVE: the same buffer as xn1) */
    float *a;     /* [BT, F] w1 output */
    float *b;     /* [BT, F] w3 output */
    float *g;     /* [BT, F] silu(a)*b (input of w2; SELECTIVE: shared, recomputed in the backward) */
} decoder_model_acts;

typedef enum decoder_model_phase {
    DECODER_PHASE_EMPTY = 0, /* nothing run yet */
    DECODER_PHASE_FWD,       /* embedding done, layers fwd_next.. to go */
    DECODER_PHASE_HEAD,      /* head forward done (logits valid) */
    DECODER_PHASE_BWD,       /* head backward done, layers bwd_next..0 to go */
    DECODER_PHASE_BWD_LAYERS /* every layer's backward done, embedding backward to go */
} decoder_model_phase;

struct decoder_model_ws {
    decoder_config cfg;
    decoder_ac ac; /* FULL: acts[l] share every buffer but x; SELECTIVE: they share xn1 = xn2 and g */
    int B_max, T_max;
    int B, T; /* current batch */
    int has_labels;
    int32_t *tokens; /* [B_max*T_max] */
    int32_t *labels;
    float *rope_cos, *rope_sin; /* [T_max, hd/2] */
    decoder_model_acts *acts;     /* n_layers */
    float *x_final;             /* [BT, d] output of the last layer */
    float *rstdf;               /* [BT] */
    float *xnf;                 /* [BT, d] */
    int head_chunk;             /* rows per head chunk (1..B_max*T_max) */
    int head_full;              /* the last decoder_fwd_head left every row's logits in `logits` */
    float *logits;              /* [head_chunk, V]: one chunk's logits, then their gradient */
    float *lse_x;               /* [BT] cross-entropy logsumexp */
    /* backward scratch */
    float *dres; /* [BT, d] gradient of the residual stream */
    float *dxn;  /* [BT, d] */
    float *dq, *datt; /* [BT, H*hd] */
    float *dk, *dv;   /* [BT, KV*hd] */
    float *dqr, *dkr; /* [BT, H*hd], [BT, KV*hd]: gradients before q_norm / k_norm (qk_norm only) */
    float *dg, *da, *db; /* [BT, F] */
    decoder_model_phase phase;
    int fwd_next, bwd_next;
    decoder_model_loss loss;
    kc_stats *stats;
    float *arena;
    size_t arena_floats;
    /* mixture of experts (cfg.n_experts > 0): each MoE layer's routing and expert activations
     * (FULL checkpointing: one set shared by every layer, recomputed), the backward scratch, and the
     * load-balancing statistics of the current forward (kc_moe.h) with their gradient */
    kc_moe_acts *moe;        /* [n_layers]; unused for dense layers */
    kc_moe_scratch moe_s;
    float *moe_arena;
    size_t moe_floats;
    double *aux_counts, *aux_psum; /* [E] each, summed over this forward's MoE layers */
    double aux_rows;               /* MoE layers x tokens of this forward */
    float *dp_aux;                 /* [E] the aux loss's gradient per probability (decoder_model_aux_apply) */
    int64_t *load;                 /* [n_layers * E] tokens per expert of each MoE layer's last forward */
    int recompute;                 /* a FULL-checkpointing recomputation: no statistics */
};

/* The MoE dims of ws's current batch. */
kc_moe_dims decoder_moe_dims(const decoder_model_ws *ws);
/* The MoE buffers of a new workspace (cfg.n_experts > 0); 0 or an error. */
int decoder_moe_ws_alloc(decoder_model_ws *ws, fsdp_err *err);
void decoder_moe_ws_free(decoder_model_ws *ws);
/* ---- decoder/decoder_moe.c: the mixture-of-experts feed-forward of a MoE layer (decoder_layer_is_moe) */
/* Clears the load-balancing statistics and gradient (a new forward). */
void decoder_moe_ws_reset(decoder_model_ws *ws);
/* out = the experts' feed-forward of xn (the ffn_norm output) for layer `layer`; records the routing
 * statistics unless ws->recompute. */
int decoder_moe_forward(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                        const float *xn, float *out, fsdp_err *err);
/* dxn (overwritten) and the layer's expert and router gradients (+=) from dout. */
int decoder_moe_backward(const decoder_config *c, const decoder_model_layer *lw, decoder_model_layer *lg, int layer,
                         decoder_model_ws *ws, const float *xn, const float *dout, float *dxn, fsdp_err *err);


/* Layer `layer`'s forward from acts[layer].x into acts[layer+1].x (or x_final), without the phase
 * checks: the forward itself and the recomputation of activation checkpointing. */
int decoder_fwd_layer_compute(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                            fsdp_err *err);

/* FSDP_E_INVALID unless ws exists and was made for a config with cfg's shapes; `what` names the caller. */
int decoder_model_ws_check(const decoder_config *cfg, const decoder_model_ws *ws, const char *what, fsdp_err *err);

#endif
