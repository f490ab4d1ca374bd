/* A trainable model as the FSDP training step (train/) sees it (module prefix model_blocks_): an
 * architecture-neutral interface, a struct of function pointers over an opaque `impl`, one for the CPU
 * (model_blocks) and one for the GPU (model_blocks_cuda). A model family implements it (the decoder
 * family: decoder/decoder_blocks.h); the place that creates a trainer gets the family's implementation
 * and hands it to train_fsdp_create* / train_fsdp_cuda_create*, so a second family (a mixture of
 * experts, a ViT) plugs in beside the first without touching train/.
 *
 * The model, seen from the step:
 *   embedding  one tensor (layout.embed), gathered whole; its forward reads the token ids
 *   blocks     layout.n_blocks blocks of parameters (block_shape: how many and the block's flat
 *              elements, at most layout.per_block and layout.block_numel; block_param: the name in
 *              the sharded state, the element count and the offset in the block's flat buffer, in
 *              the order the parameters are gathered and reduce-scattered); forward 0..n-1, backward
 *              n-1..0, one gathered block at a time
 *   head       a final norm (layout.norm) and an output weight (layout.output; layout.tied: the output
 *              weight is the embedding itself, and a state must not hold layout.output's name); the
 *              training head computes the loss and the head's gradients in one pass
 * Labels equal to layout.ignore_index count in no loss.
 *
 * Protocol: check, then layout / block_param (describe the model; valid only after check succeeded),
 * check_opts for the workspace options, then ws_create. The workspace is the trainer's instance of the
 * model: it keeps what the pieces need (its own copy of the configuration, the saved activations) and
 * is freed with ws_free; impl needs to live only during the calls that take it. The pieces run in the
 * order fwd_embed -> fwd_block(0..n-1) -> head_train -> bwd_block(n-1..0) -> bwd_embed on full
 * (gathered) weights; gradients ACCUMULATE (+=) into the given buffers (zeroed by the caller). The loss
 * differentiated is the loss sum / loss_denom (the global token count of the step). */
#ifndef FSDP_MODEL_MODEL_BLOCKS_H
#define FSDP_MODEL_MODEL_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "runtime/comm.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_BLOCKS_PARAMS_MAX 16 /* the most parameters one block may hold */
#define MODEL_BLOCKS_NAME_MAX 64   /* a parameter name's room, with its terminating NUL */

/* Activation checkpointing of the workspace: NONE keeps every activation, FULL only each block's input
 * (its forward runs again in its backward), SELECTIVE what is expensive to recompute. All give the
 * same numbers; an implementation may refuse a mode (ws_create fails). */
typedef enum model_blocks_ac {
    MODEL_BLOCKS_AC_NONE = 0,
    MODEL_BLOCKS_AC_FULL = 1,
    MODEL_BLOCKS_AC_SELECTIVE = 2
} model_blocks_ac;

typedef struct model_blocks_ws_opts {
    int ac;              /* a model_blocks_ac */
    int head_chunk_rows; /* the head's rows per chunk of logits; 0: the implementation's choice */
} model_blocks_ws_opts;

/* One parameter: its name in the sharded state, its elements, and (block parameters) its element
 * offset in the block's flat buffer (0 for the embedding, norm and output). */
typedef struct model_blocks_tensor {
    char name[MODEL_BLOCKS_NAME_MAX];
    int64_t numel;
    int64_t offset;
    int expert; /* dim 0 are experts: under expert parallelism the block's buffer holds only this ep rank's
                   experts there (their first rows), and their gradient comes back the same way */
} model_blocks_tensor;

typedef struct model_blocks_layout {
    int n_blocks;
    int per_block;       /* the most parameters a block holds, <= MODEL_BLOCKS_PARAMS_MAX */
    int64_t block_numel; /* elements of the largest block's flat buffer */
    model_blocks_tensor embed, norm, output;
    int tied;         /* the output weight is the embedding (output: the name a state must not hold, and
                       * output.numel == embed.numel) */
    int n_params;     /* parameters of the whole model (embedding, blocks, norm, output unless tied) */
    int ignore_index; /* the label that counts in no loss */
    int n_aux;        /* statistics of an auxiliary loss summed over the ranks (0: none; see aux_stats) */
    int n_experts;    /* experts of a block with a mixture of experts (0: none; see expert_load) */
} model_blocks_layout;

/* An auxiliary loss of one micro-batch (a mixture of experts' load balancing). */
typedef struct model_blocks_aux {
    double loss;     /* its value */
    double weighted; /* what it adds to the objective (its coefficient times loss) */
} model_blocks_aux;

/* The CPU interface: weights and gradients are float32 host buffers. */
typedef struct model_blocks {
    const void *impl;
    /* The model can run (sizes, ...); the error names what is wrong. */
    int (*check)(const void *impl, fsdp_err *err);
    /* The workspace options are valid; errors start with `what` ("training"). */
    int (*check_opts)(const void *impl, const model_blocks_ws_opts *o, const char *what, fsdp_err *err);
    void (*layout)(const void *impl, model_blocks_layout *out);
    /* Parameter k (0..block's count - 1) of block `block`. */
    void (*block_param)(const void *impl, int block, int k, model_blocks_tensor *out);
    /* Block `block`'s parameter count and flat elements; NULL when every block has layout.per_block
     * and layout.block_numel. */
    void (*block_shape)(const void *impl, int block, int *n_params, int64_t *numel);
    /* The auxiliary loss (layout.n_aux > 0; NULL otherwise). After fwd_block of the last block,
     * aux_stats writes this micro-batch's layout.n_aux statistics; the trainer sums them over every
     * rank of the step (the ranks run the same micro-batch index) and aux_apply takes the sums before
     * the first bwd_block: the loss's value and its gradient, scaled by `scale` (1 / micro-batches). */
    int (*aux_stats)(void *ws, double *stats, fsdp_err *err);
    int (*aux_apply)(void *ws, const double *sums, double scale, model_blocks_aux *out, fsdp_err *err);
    /* Tokens routed to each expert of block `block` in the last forward (counts[layout.n_experts]);
     * returns 1 for a block with experts, 0 for one without (counts untouched). NULL: no experts. */
    int (*expert_load)(void *ws, int block, int64_t *counts);
    /* Expert parallelism over ep (NULL or size 1: off): from now on the workspace's MoE blocks compute
     * only ep rank r's experts (r * n_experts / size ...), exchanging tokens with the other ep ranks by
     * all-to-all, and read / write only those experts' rows of the expert tensors. ep lives as long as
     * the workspace. NULL when the model has no experts. */
    int (*set_expert_parallel)(void *ws, comm *ep, fsdp_err *err);
    /* A workspace for batches of B x T tokens; NULL with err set. */
    void *(*ws_create)(const void *impl, int B, int T, const model_blocks_ws_opts *o, fsdp_err *err);
    void (*ws_free)(void *ws);
    /* tokens, labels: [B, T] host arrays (labels needed for training). */
    int (*fwd_embed)(void *ws, const float *embed, const int32_t *tokens, const int32_t *labels, int B, int T,
                     fsdp_err *err);
    /* w: block `block`'s gathered flat buffer (layout.block_numel floats). */
    int (*fwd_block)(void *ws, int block, const float *w, fsdp_err *err);
    /* The training head in one pass: *loss_sum = this batch's loss sum (not divided). */
    int (*head_train)(void *ws, const float *norm, const float *output, float *d_norm, float *d_output,
                      double loss_denom, double *loss_sum, fsdp_err *err);
    /* g: the block's flat gradient buffer, accumulated into. */
    int (*bwd_block)(void *ws, int block, const float *w, float *g, fsdp_err *err);
    int (*bwd_embed)(void *ws, float *d_embed, fsdp_err *err);
} model_blocks;

/* The GPU interface: gathered weights are device buffers of the workspace's dtype dt (float32 or
 * bf16), gradients float32 device buffers; every piece runs on the device context's compute stream
 * and none synchronises the host. */
typedef struct model_blocks_cuda {
    model_blocks host; /* the same model's description (check, check_opts, layout, block_param) */
    void *(*ws_create)(const void *impl, dev_ctx *d, int B, int T, fsdp_dtype dt, const model_blocks_ws_opts *o,
                       fsdp_err *err);
    void (*ws_free)(void *ws);
    size_t (*ws_bytes)(const void *ws); /* device bytes the workspace holds */
    int (*fwd_embed)(void *ws, const void *embed, const int32_t *tokens, const int32_t *labels, int B, int T,
                     fsdp_err *err);
    int (*fwd_block)(void *ws, int block, const void *w, fsdp_err *err);
    /* The training head in one pass; the loss sum stays on the device (loss_sums). */
    int (*head_train)(void *ws, const void *norm, const void *output, float *d_norm, float *d_output,
                      double loss_denom, fsdp_err *err);
    /* Device double[2]: the last head_train's loss sum and labelled tokens, valid once the compute
     * stream reached that point. */
    const double *(*loss_sums)(const void *ws);
    int (*bwd_block)(void *ws, int block, const void *w, float *g, fsdp_err *err);
    int (*bwd_embed)(void *ws, float *d_embed, fsdp_err *err);
    /* model_blocks' aux_stats / aux_apply / expert_load on the GPU workspace (NULL without experts):
     * aux_stats waits for the compute stream and gives host statistics; aux_apply queues the gradient's
     * upload on the compute stream; expert_load reads what the forward already brought to the host. */
    int (*aux_stats)(void *ws, double *stats, fsdp_err *err);
    int (*aux_apply)(void *ws, const double *sums, double scale, model_blocks_aux *out, fsdp_err *err);
    int (*expert_load)(void *ws, int block, int64_t *counts);
    /* model_blocks' set_expert_parallel on the GPU workspace (ep's device communicator initialised). */
    int (*set_expert_parallel)(void *ws, comm *ep, fsdp_err *err);
} model_blocks_cuda;

#ifdef __cplusplus
}
#endif
#endif
