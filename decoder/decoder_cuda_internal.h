/* Private to decoder/decoder_cuda*.c: the device workspace layout. */
#ifndef FSDP_DECODER_DECODER_CUDA_INTERNAL_H
#define FSDP_DECODER_DECODER_CUDA_INTERNAL_H

#include "kernels/cuda/kcu.h"
#include "decoder/decoder_cuda.h"
#include "decoder/decoder_moe_cuda.h"

/* What one layer's forward saves for its backward (device; the void * in the workspace dtype).
 * With selective checkpointing xn1 and xn2 point at one buffer and g at another, both shared by
 * every layer and recomputed in the backward. */
typedef struct decoder_cuda_acts {
    void *x, *xn1, *q, *k, *v, *att, *h, *xn2, *a, *b, *g;
    float *rstd1, *rstd2, *lse;
    void *qr, *kr;        /* q and k before q_norm / k_norm (qk_norm only) */
    float *rstdq, *rstdk; /* their rsqrt per row and head */
} decoder_cuda_acts;

typedef enum decoder_cuda_phase {
    DECODER_CUDA_EMPTY = 0,
    DECODER_CUDA_FWD,       /* embedding done, layers fwd_next.. to go */
    DECODER_CUDA_HEAD,      /* head forward done */
    DECODER_CUDA_BWD,       /* head backward done, layers bwd_next..0 to go */
    DECODER_CUDA_BWD_LAYERS /* layers done, embedding backward to go */
} decoder_cuda_phase;

struct decoder_cuda_ws {
    dev_ctx *d;
    kcu_stream s;
    decoder_config cfg;
    fsdp_dtype dt;
    decoder_ac ac; /* FULL: acts[l] share every buffer but x; SELECTIVE: they share xn1 = xn2 and g */
    int B_max, T_max, B, T;
    int has_labels;
    int64_t n_valid; /* labelled tokens of the current batch (counted on the host) */
    int32_t *tokens, *labels; /* device [B_max*T_max] */
    float *rope_cos, *rope_sin; /* device [T_max, hd/2] */
    float *attn_scratch;        /* kcu_attention_scratch_floats(B_max, T_max, H) */
    decoder_cuda_acts *acts;      /* host array of n_layers */
    int head_chunk;  /* rows per output-head chunk (1..B_max*T_max) */
    int head_full;   /* the last decoder_cuda_fwd_head left every row's logits in `logits` */
    void *x_final, *xnf, *logits; /* logits: [head_chunk, V], one chunk (then its gradient) */
    float *rstdf, *lse_x;
    double *sums; /* [2] loss sum, count */
    void *dres, *dxn, *dq, *datt, *dk, *dv, *dg, *da, *db;
    void *dqr, *dkr; /* gradients before q_norm / k_norm (qk_norm only) */
    decoder_cuda_phase phase;
    int fwd_next, bwd_next;
    decoder_model_loss loss;
    void *arena;
    size_t arena_bytes;
    /* mixture of experts (cfg.n_experts > 0; decoder/decoder_cuda_moe.c): each MoE layer's saved routing and
     * expert activations (FULL checkpointing: one set, recomputed), the backward scratch, the experts'
     * output before the residual add, the load-balancing statistics of the current forward (device
     * counts[E], psum[E]) and their gradient, the host copies */
    decoder_moe_cuda_acts *moe; /* [n_layers] */
    decoder_moe_cuda_scratch moe_s;
    void *moe_arena;
    size_t moe_bytes;
    int32_t *moe_host_offsets; /* host [sets * (E + 2)] */
    void *moe_out;             /* inside moe_arena: [B_max*T_max, d] of dt */
    double *d_aux;             /* inside moe_arena: device [2E] counts, psum */
    float *d_dp_aux;           /* inside moe_arena: device [E] */
    double *h_aux;             /* host [2E] */
    float *h_dp_aux;           /* host [E] */
    double aux_rows;
    int64_t *load;             /* host [n_layers * E]: tokens per expert of each MoE layer's last forward */
    int recompute;             /* a FULL-checkpointing recomputation: no statistics */
    /* expert parallelism (decoder_cuda_set_expert_parallel; ep_size 1: off; decoder_cuda_moe_ep.c) */
    comm *ep;
    int ep_size, ep_rank, ep_experts;
    struct decoder_cuda_ep *eps; /* [n_layers] (FULL: the first MoE layer's for every layer) */
    void *ep_scratch;            /* device: recv [cap, d], dyr [cap, d], dxr [cap, d], dg, da, db [cap, F] */
    size_t ep_scratch_cap;
};

/* What an expert-parallel MoE layer's forward keeps for its backward (received rows, expert-major). */
typedef struct decoder_cuda_ep {
    void *rows;             /* device: xr [cap, d], ar, br, gr [cap, F], perm, inv [cap] int32 */
    size_t cap;
    void *xr, *ar, *br, *gr;
    int32_t *perm, *inv;    /* device: expert-major row -> received row, and back */
    int32_t *h_recvc, *h_loff, *h_perm, *h_inv; /* host: [P*El], [El+1], [cap], [cap] */
    int32_t rows_in;        /* rows received */
} decoder_cuda_ep;

/* Expert parallelism's forward and backward of MoE layer `layer` (ws->ep_size > 1). */
int decoder_cuda_moe_ep_forward(const decoder_config *c, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                                fsdp_err *err);
int decoder_cuda_moe_ep_backward(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg,
                                 int layer, decoder_cuda_ws *ws, fsdp_err *err);
void decoder_cuda_moe_ep_free(decoder_cuda_ws *ws);

/* The MoE buffers of a new workspace; 0 or an error (decoder_cuda_moe.c). */
int decoder_cuda_moe_alloc(decoder_cuda_ws *ws, fsdp_err *err);
void decoder_cuda_moe_free(decoder_cuda_ws *ws);
/* A new forward: statistics and their gradient cleared. */
int decoder_cuda_moe_reset(decoder_cuda_ws *ws, fsdp_err *err);
/* out = h + experts(xn2) of MoE layer `layer`; records the statistics unless ws->recompute. */
int decoder_cuda_moe_forward(const decoder_config *c, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                             void *out, fsdp_err *err);
/* dxn (overwritten) and the layer's router and expert gradients (+=) from dres. */
int decoder_cuda_moe_backward(const decoder_config *c, const decoder_cuda_layer *lw, decoder_model_layer *lg, int layer,
                              decoder_cuda_ws *ws, fsdp_err *err);

int decoder_cuda_ws_check(const decoder_config *cfg, const decoder_cuda_ws *ws, const char *what, fsdp_err *err);

#endif
