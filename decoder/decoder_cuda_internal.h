/* Private to decoder/decoder_cuda*.c: the device workspace layout. */
#ifndef FSDP_DECODER_DECODER_CUDA_INTERNAL_H
#define FSDP_DECODER_DECODER_CUDA_INTERNAL_H

#include "kernels/cuda/kcu.h"
#include "decoder/decoder_cuda.h"

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
};

int decoder_cuda_ws_check(const decoder_config *cfg, const decoder_cuda_ws *ws, const char *what, fsdp_err *err);

#endif
