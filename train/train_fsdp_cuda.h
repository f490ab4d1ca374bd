/* One FSDP2-style training step of a model (model/model_blocks.h's model_blocks_cuda) on the GPU, on
 * the sharded state's device arrays (runtime/state.h: d_data, d_grad, d_exp_avg, d_exp_avg_sq). Same
 * semantics and order of operations as train/train_fsdp.h:
 *
 *   forward:  all-gather embedding, norm, output; per layer all-gather -> forward
 *   backward: head; per layer (last to first) all-gather (unless still resident) -> gradients
 *             into a full-layer f32 buffer -> reduce-scatter (sum) into the local d_grad; embedding
 *   global gradient norm (sum of squares of the local shards, all-reduced); clipping; AdamW on the
 *   local shards; the loss is the mean over all global tokens.
 *
 * Precision (FSDP2 MixedPrecisionPolicy):
 *   TRAIN_FSDP_MIXED_NONE  float32 everywhere (matches the CPU path to ~1e-6).
 *   TRAIN_FSDP_MIXED_BF16  param_dtype=bf16, reduce_dtype=fp32: each rank casts its f32 shard to
 *                          bf16 and the all-gather moves bf16; activations are bf16 with f32
 *                          accumulation; gradients, their reduce-scatter, the master weights and
 *                          AdamW stay float32.
 *
 * Streams (runtime/device.h): collectives run on DEV_STREAM_COMM, model kernels on
 * DEV_STREAM_COMPUTE, offloaded-optimizer copies on DEV_STREAM_COPY, ordered by CUDA events. The
 * all-gather of the next layer is issued before the current layer's compute (prefetch), so it
 * overlaps it; the reduce-scatter of layer i overlaps the backward of layer i-1. Gathered layers
 * live in two rotating buffers (FSDP2 reshard_after_forward=True: the backward re-gathers every
 * layer that is no longer resident, i.e. all but the last two) or, with keep_gathered, in one
 * buffer per layer (no re-gather in the backward, more memory).
 *
 * Optimizer placement: moments on the device (d_exp_avg/d_exp_avg_sq; allocated zeroed at create
 * when missing, host moments present at create are moved there) -> one multi-tensor AdamW launch;
 * s->offloaded -> moments stay in host memory (exp_avg/exp_avg_sq): each layer's gradients and
 * parameters are copied to pinned host memory on the COPY stream as soon as its reduce-scatter
 * finished (during the rest of the backward), AdamW runs on the CPU (kc_adamw_step) per parameter
 * as its copy arrives, and each updated parameter is uploaded at once (overlapping the CPU work on
 * the following parameters). Both run the same float operations (kcu_adamw_step mirrors
 * kc_adamw_step exactly): bit-identical results from identical gradients.
 *
 * Output head: the logits, cross-entropy and their gradient are computed in chunks of rows
 * (options.head_chunk_rows; the model's head_train), so the [B*T, vocab] logits never exist at once;
 * the loss's denominator (the global token count) is counted on the host and all-reduced before the
 * step, so each chunk's gradient is final when it is computed.
 *
 * Host synchronisation: none inside the step. The global loss sum and gradient sum of squares
 * (all-reduced on the device in one call) are copied to pinned host memory asynchronously, with an
 * event; clipping reads the norm on the device (kcu_clip_coef: the coefficient and a non-finite
 * flag, computed by a kernel) and the multi-tensor scaling and AdamW launches follow it on the
 * device. Only once the whole step is queued does train_fsdp_cuda_step wait for that event (not for
 * the optimizer) to return the loss and norm. A non-finite loss or norm makes the device's clipping
 * and AdamW skip the update (the flag) and the step fail with FSDP_E_NUMERIC naming the step, so
 * the detection happens in the same step, nothing being changed. The offloaded optimizer needs the
 * clip coefficient on the host: it waits for the statistics before its CPU AdamW, and for each
 * parameter's download.
 *
 * Requirements: every parameter's d_data on the device of `d` (no host master copy: the offload
 * of master weights is not supported here); gradients are allocated on the device when missing
 * (a host gradient array is freed: gradients carry no value between steps). The device arrays
 * this module allocates belong to the state afterwards (freed with the state's device arrays).
 * comm_dev_init must have succeeded on `c` (train_fsdp_cuda_create calls it). */
#ifndef FSDP_TRAIN_TRAIN_FSDP_CUDA_H
#define FSDP_TRAIN_TRAIN_FSDP_CUDA_H

#include <stdint.h>

#include "fsdp/error.h"
#include "model/model_blocks.h"
#include "train/train_fsdp.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum train_fsdp_mixed { TRAIN_FSDP_MIXED_NONE = 0, TRAIN_FSDP_MIXED_BF16 = 1 } train_fsdp_mixed;

/* Activation checkpointing (model_blocks_ac of model/model_blocks.h, the same values). FULL keeps only each
 * layer's input and recomputes the layer's forward in its backward (torchtitan's
 * activation_checkpoint.mode = "full"). SELECTIVE keeps the residual stream, the GEMM outputs
 * (q and k after RoPE, v, w1's and w3's), the attention output with its logsumexp and the norms'
 * rstd, and recomputes in the backward only the cheap elementwise results: the RMSNorm outputs
 * (from the saved input and rstd) and SwiGLU's product (from the saved w1/w3 outputs). All three
 * give the same numbers. */
typedef enum train_fsdp_ac {
    TRAIN_FSDP_AC_NONE = MODEL_BLOCKS_AC_NONE,
    TRAIN_FSDP_AC_FULL = MODEL_BLOCKS_AC_FULL,
    TRAIN_FSDP_AC_SELECTIVE = MODEL_BLOCKS_AC_SELECTIVE
} train_fsdp_ac;

typedef struct train_fsdp_cuda_options {
    train_fsdp_mixed mixed;
    train_fsdp_ac ac;
    int keep_gathered; /* 1: keep every gathered layer from the forward for the backward */
    int head_chunk_rows; /* output head in chunks of this many rows (0: automatic, the model's choice) */
    /* 0 (default): one all-gather and one reduce-scatter per transformer block on a flat buffer
     * (train/flat_group.h); 1: one per parameter (the CPU path takes it too, train_fsdp_set_flat) */
    int per_param;
    /* expert parallelism degree of a mixture of experts (0 or 1: off; train_fsdp_set_expert_parallel,
     * train_fsdp_cuda_set_expert_parallel) */
    int expert_parallel;
} train_fsdp_cuda_options;

/* "none" / "bf16" and "none" / "full" / "selective" -> the enums; FSDP_E_INVALID naming the key,
 * the value and the valid values otherwise. */
int train_fsdp_mixed_from_name(const char *name, train_fsdp_mixed *out, fsdp_err *err);
int train_fsdp_ac_from_name(const char *name, train_fsdp_ac *out, fsdp_err *err);

typedef struct train_fsdp_cuda train_fsdp_cuda;

/* The model m (model/model_blocks.h; e.g. decoder/decoder_blocks.h's decoder_blocks_cuda) trains on the
 * state, which must hold every parameter m names; m is copied, m.host.impl needs to live only during
 * the call. opt NULL: defaults (f32, no checkpointing, two gather buffers). */
int train_fsdp_cuda_create(fsdp_state *s, model_blocks_cuda m, comm *c, dev_ctx *d, int local_batch, int seq_len,
                           const train_fsdp_cuda_options *opt, train_fsdp_cuda **out, fsdp_err *err);
/* HSDP (runtime/mesh.h): c given to create is the shard group; world is every rank the batch is split
 * over (the token count), replicate the group whose NCCL communicator (made here: collective over
 * every rank) all-reduces each reduced gradient shard in float32 and the loss sum (NULL: none). */
int train_fsdp_cuda_set_replicas(train_fsdp_cuda *f, comm *world, comm *replicate, fsdp_err *err);
/* Waits for the device work and frees the buffers (not the state's arrays). */
void train_fsdp_cuda_free(train_fsdp_cuda *f);
/* Forward and backward only: the global loss, token count and gradient norm (waits for them); the
 * reduce-scattered gradients in every p->d_grad. */
int train_fsdp_cuda_grads(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, train_fsdp_result *res,
                          fsdp_err *err);
/* A whole step (train_fsdp_step's semantics): grads, then (if finite) clip and AdamW; s->opt_step
 * advances. A non-finite loss or gradient fails with FSDP_E_NUMERIC and changes no parameter,
 * moment or counter. */
int train_fsdp_cuda_step(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels,
                         const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err);
/* Gradient accumulation (train_fsdp_grads_accum's semantics): tokens and labels hold n_micro
 * micro-batches of B x T; one loss denominator (the global token count of all of them), the full
 * gradients summed on the device (every layer's: n_layers x layer numel floats more, allocated at
 * the first such call) and reduce-scattered once per parameter with the last micro-batch. */
int train_fsdp_cuda_grads_accum(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                                train_fsdp_result *res, fsdp_err *err);
int train_fsdp_cuda_step_accum(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                               const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err);
/* Bytes of device memory this module holds (gather/gradient buffers, workspace). */
size_t train_fsdp_cuda_bytes(const train_fsdp_cuda *f);

/* Expert parallelism `ep` (1: off) of a mixture of experts over the shard group (train_fsdp_set_expert_parallel's
 * layout): tokens travel by NCCL all-to-all. Call once, after create. */
int train_fsdp_cuda_set_expert_parallel(train_fsdp_cuda *f, int ep, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
