/* The decoder family's forward and backward on the GPU: the pieces of decoder/decoder_model.h with the CUDA
 * kernels (kernels/cuda/kcu.h) and cuBLASLt GEMMs (runtime/device_gemm.h), all on the device
 * context's compute stream.
 *
 *   decoder_cuda_fwd_embed -> decoder_cuda_fwd_layer(0..L-1) -> decoder_cuda_fwd_head
 *   decoder_cuda_bwd_head -> decoder_cuda_bwd_layer(L-1..0) -> decoder_cuda_bwd_embed
 *
 * Same math and order of operations as the CPU model, with these launches fused:
 * - the residual adds h = x + wo(att) and out = h + w2(g) are folded into their GEMMs (cuBLASLt's
 *   epilogue reads the residual as C with beta = 1, dev_linear_forward_residual), so each is one
 *   pass that writes h (or out) once instead of a GEMM output written, read back, added to the
 *   residual and written again; the RMSNorm that follows stays its own kernel (unchanged
 *   reduction order). A fused add+RMSNorm kernel would keep the GEMM's extra write and read, and
 *   could not take the second add: the next norm belongs to the next layer, whose weights FSDP
 *   gathers only later. In bf16 the sum is rounded once (the CPU/PyTorch order rounds the GEMM
 *   output first); in f32 it is the same single addition.
 * - RoPE on q and k is one launch (kcu_rope_qk_forward / _backward), bit-identical to two.
 * - SwiGLU forward and backward are one kernel each. Weights and activations are stored in the
 * workspace's dtype (FSDP_DT_F32, or FSDP_DT_BF16 for bf16 compute with float32 accumulation);
 * gradients are always float32 device buffers (the decoder_model_layer / decoder_model_weights structs
 * of decoder_model.h, pointing at device memory) and ACCUMULATE (+=) like the CPU model's.
 *
 * Token ids and labels are host arrays: they are checked on the host (the CPU model's errors) and
 * copied to the device. Nothing synchronises the host except decoder_cuda_fwd_head when it is asked
 * for the loss. */
#ifndef FSDP_DECODER_DECODER_CUDA_H
#define FSDP_DECODER_DECODER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "decoder/decoder_model.h"
#include "runtime/comm.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One block's weights on the device, in the workspace dtype (torchtitan names as decoder_model_layer;
 * the biases and q/k norms NULL when the config has none). */
typedef struct decoder_cuda_layer {
    const void *wq, *wk, *wv, *wo, *w1, *w2, *w3, *attention_norm, *ffn_norm;
    const void *wq_b, *wk_b, *wv_b, *q_norm, *k_norm;
    const void *ew1, *ew2, *ew3, *router; /* a MoE layer's experts and router (decoder_model_layer) */
} decoder_cuda_layer;

typedef struct decoder_cuda_weights {
    const void *tok_embeddings; /* also the output head's weight with tied embeddings (output == it) */
    int n_layers;
    decoder_cuda_layer *layers; /* n_layers entries, owned when made by decoder_cuda_weights_bind */
    const void *norm;
    const void *output;
} decoder_cuda_weights;

/* Points lw at layer `layer`'s device block in the flat layout of decoder_model.h (elements of dtype dt). */
void decoder_cuda_layer_bind(const decoder_config *cfg, int layer, const void *flat_layer, fsdp_dtype dt,
                             decoder_cuda_layer *lw);
/* Points w at the whole flat layout (decoder_model_numel elements of dtype dt); allocates w->layers. */
int decoder_cuda_weights_bind(const decoder_config *cfg, const void *flat, fsdp_dtype dt, decoder_cuda_weights *w,
                            fsdp_err *err);
void decoder_cuda_weights_unbind(decoder_cuda_weights *w);

typedef struct decoder_cuda_ws decoder_cuda_ws;

/* Device workspace for batches up to B_max x T_max in dtype dt (activations, saved tensors,
 * backward scratch, RoPE tables from kc_rope_tables), taken from d's allocator. Fails on a config
 * the kernels cannot run (decoder_model_check, head_dim <= KCU_ATTN_MAX_HEAD_DIM) or without a GPU. */
decoder_cuda_ws *decoder_cuda_ws_create(dev_ctx *d, const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                    fsdp_err *err);
/* The same with activation checkpointing `ac` (a decoder_ac of decoder_model.h, the same definitions as
 * the CPU model): FULL keeps only each layer's input and decoder_cuda_bwd_layer recomputes the
 * layer's forward from it; SELECTIVE keeps the GEMM and attention outputs and recomputes only the
 * RMSNorm outputs (kcu_rmsnorm_apply from x/h and the saved rstd) and SwiGLU's g (in the SwiGLU
 * backward's pass, kcu_swiglu_backward_recompute). Results are
 * identical to DECODER_AC_NONE (same kernels on the same inputs). */
decoder_cuda_ws *decoder_cuda_ws_create_ac(dev_ctx *d, const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                       int ac, fsdp_err *err);
/* The same with the options of the CPU workspace (decoder_model.h: checkpointing and the rows per
 * output-head chunk; opts NULL: neither checkpointing nor a chunk size, i.e. automatic chunks of
 * DECODER_HEAD_CHUNK_BYTES of logits). The logits buffer holds one chunk: [chunk, V], not [B*T, V]. */
decoder_cuda_ws *decoder_cuda_ws_create_opts(dev_ctx *d, const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                         const decoder_model_ws_opts *opts, fsdp_err *err);
/* The device bytes decoder_cuda_ws_create_opts would allocate and the rows per head chunk, without a
 * device (sizing, tests); the same argument checks. bytes / head_chunk may be NULL. */
int decoder_cuda_ws_plan_bytes(const decoder_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                             const decoder_model_ws_opts *opts, size_t *bytes, int *head_chunk, fsdp_err *err);
int decoder_cuda_ws_head_chunk(const decoder_cuda_ws *ws);
void decoder_cuda_ws_free(decoder_cuda_ws *ws);
size_t decoder_cuda_ws_bytes(const decoder_cuda_ws *ws);
fsdp_dtype decoder_cuda_ws_dtype(const decoder_cuda_ws *ws);
/* Device logits [B*T, V] (workspace dtype) of the last decoder_cuda_fwd_head; NULL before it, after
 * decoder_cuda_bwd_head (which overwrites them with their gradient) and when the batch is larger than
 * one head chunk (the whole batch's logits are never held then). */
const void *decoder_cuda_ws_logits(const decoder_cuda_ws *ws);
/* Device double[2] written by decoder_cuda_fwd_head (with labels) or decoder_cuda_head_train: the sum
 * of the token losses and the number of labelled tokens, valid once the compute stream reached
 * that point. */
const double *decoder_cuda_ws_loss_sums(const decoder_cuda_ws *ws);

/* ---- pieces (device weight pointers; labels may be NULL: no loss, no backward) -------------- */

int decoder_cuda_fwd_embed(const decoder_config *cfg, const void *tok_embeddings, const int32_t *tokens,
                         const int32_t *labels, int B, int T, decoder_cuda_ws *ws, fsdp_err *err);
int decoder_cuda_fwd_layer(const decoder_config *cfg, const decoder_cuda_layer *lw, int layer, decoder_cuda_ws *ws,
                         fsdp_err *err);
/* Final norm and, chunk by chunk, logits and (with labels) the loss sums (decoder_cuda_ws_loss_sums).
 * loss may be NULL; when not, the loss is copied to the host (a synchronisation). Over several
 * chunks the logits are not kept: decoder_cuda_bwd_head computes them again. */
int decoder_cuda_fwd_head(const decoder_config *cfg, const void *norm_w, const void *output_w, decoder_cuda_ws *ws,
                        decoder_model_loss *loss, fsdp_err *err);

/* loss_denom <= 0: the batch's number of labelled tokens. */
int decoder_cuda_bwd_head(const decoder_config *cfg, const void *norm_w, const void *output_w, float *d_norm,
                        float *d_output, double loss_denom, decoder_cuda_ws *ws, fsdp_err *err);
/* The training head in one pass instead of decoder_cuda_fwd_head + decoder_cuda_bwd_head (decoder_model.h's
 * decoder_head_train): per chunk of rows, the logits GEMM, kcu_xent_chunk (lse, loss sums, dlogits in
 * place with the scale 1/loss_denom known before), dxnf = dlogits W_out and d_output += dlogits^T
 * xnf; then the final norm's backward. Labels needed. The loss sums are left on the device
 * (decoder_cuda_ws_loss_sums), nothing synchronises the host. decoder_cuda_bwd_layer(L-1) follows. */
int decoder_cuda_head_train(const decoder_config *cfg, const void *norm_w, const void *output_w, float *d_norm,
                          float *d_output, double loss_denom, decoder_cuda_ws *ws, fsdp_err *err);
int decoder_cuda_bwd_layer(const decoder_config *cfg, const decoder_cuda_layer *lw, decoder_model_layer *lg, int layer,
                         decoder_cuda_ws *ws, fsdp_err *err);
int decoder_cuda_bwd_embed(const decoder_config *cfg, float *d_tok_embeddings, decoder_cuda_ws *ws, fsdp_err *err);

/* ---- whole model ------------------------------------------------------------------------------- */

int decoder_cuda_model_forward(const decoder_config *cfg, const decoder_cuda_weights *w, const int32_t *tokens,
                             const int32_t *labels, int B, int T, decoder_cuda_ws *ws, decoder_model_loss *loss,
                             fsdp_err *err);
/* g: float32 device gradients (decoder_model_weights_bind on a device buffer). */
int decoder_cuda_model_backward(const decoder_config *cfg, const decoder_cuda_weights *w, decoder_model_weights *g,
                              double loss_denom, decoder_cuda_ws *ws, fsdp_err *err);

/* ---- mixture of experts (decoder_model.h's load-balancing loss, on the GPU workspace) ----------
 * aux_stats waits for the compute stream and gives DECODER_MODEL_AUX_STATS(cfg) host doubles; aux_apply
 * sets the gradient (uploaded on the compute stream) and returns the loss; expert_load gives MoE layer
 * `layer`'s tokens per expert of the last forward (1), or 0 for a dense layer. */
int decoder_cuda_aux_stats(decoder_cuda_ws *ws, double *stats, fsdp_err *err);
int decoder_cuda_aux_apply(decoder_cuda_ws *ws, const double *sums, double scale, double *aux, fsdp_err *err);
int decoder_cuda_expert_load(const decoder_cuda_ws *ws, int layer, int64_t *counts);
/* Expert parallelism over ep (decoder_model_set_expert_parallel's contract on the GPU): the rows travel
 * by NCCL all-to-all (comm_dev_alltoallv: ep's device communicator must be initialised), the counts by
 * MPI. */
int decoder_cuda_set_expert_parallel(decoder_cuda_ws *ws, comm *ep, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
