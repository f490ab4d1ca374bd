/* Llama-3 forward and backward on the GPU: the pieces of model/llama_model.h with the CUDA
 * kernels (kernels/cuda/kcu.h) and cuBLASLt GEMMs (runtime/device_gemm.h), all on the device
 * context's compute stream.
 *
 *   llama_cuda_fwd_embed -> llama_cuda_fwd_layer(0..L-1) -> llama_cuda_fwd_head
 *   llama_cuda_bwd_head -> llama_cuda_bwd_layer(L-1..0) -> llama_cuda_bwd_embed
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
 * gradients are always float32 device buffers (the llama_model_layer / llama_model_weights structs
 * of llama_model.h, pointing at device memory) and ACCUMULATE (+=) like the CPU model's.
 *
 * Token ids and labels are host arrays: they are checked on the host (the CPU model's errors) and
 * copied to the device. Nothing synchronises the host except llama_cuda_fwd_head when it is asked
 * for the loss. */
#ifndef FSDP_MODEL_LLAMA_CUDA_H
#define FSDP_MODEL_LLAMA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "model/llama_model.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One block's weights on the device, in the workspace dtype (torchtitan names as llama_model_layer;
 * the biases and q/k norms NULL when the config has none). */
typedef struct llama_cuda_layer {
    const void *wq, *wk, *wv, *wo, *w1, *w2, *w3, *attention_norm, *ffn_norm;
    const void *wq_b, *wk_b, *wv_b, *q_norm, *k_norm;
} llama_cuda_layer;

typedef struct llama_cuda_weights {
    const void *tok_embeddings; /* also the output head's weight with tied embeddings (output == it) */
    int n_layers;
    llama_cuda_layer *layers; /* n_layers entries, owned when made by llama_cuda_weights_bind */
    const void *norm;
    const void *output;
} llama_cuda_weights;

/* Points lw at a device layer block in the flat layout of llama_model.h (elements of dtype dt). */
void llama_cuda_layer_bind(const llama_config *cfg, const void *flat_layer, fsdp_dtype dt, llama_cuda_layer *lw);
/* Points w at the whole flat layout (llama_model_numel elements of dtype dt); allocates w->layers. */
int llama_cuda_weights_bind(const llama_config *cfg, const void *flat, fsdp_dtype dt, llama_cuda_weights *w,
                            fsdp_err *err);
void llama_cuda_weights_unbind(llama_cuda_weights *w);

typedef struct llama_cuda_ws llama_cuda_ws;

/* Device workspace for batches up to B_max x T_max in dtype dt (activations, saved tensors,
 * backward scratch, RoPE tables from kc_rope_tables), taken from d's allocator. Fails on a config
 * the kernels cannot run (llama_model_check, head_dim <= KCU_ATTN_MAX_HEAD_DIM) or without a GPU. */
llama_cuda_ws *llama_cuda_ws_create(dev_ctx *d, const llama_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                    fsdp_err *err);
/* The same with activation checkpointing `ac` (a llama_ac of llama_model.h, the same definitions as
 * the CPU model): FULL keeps only each layer's input and llama_cuda_bwd_layer recomputes the
 * layer's forward from it; SELECTIVE keeps the GEMM and attention outputs and recomputes only the
 * RMSNorm outputs (kcu_rmsnorm_apply from x/h and the saved rstd) and SwiGLU's g (in the SwiGLU
 * backward's pass, kcu_swiglu_backward_recompute). Results are
 * identical to LLAMA_AC_NONE (same kernels on the same inputs). */
llama_cuda_ws *llama_cuda_ws_create_ac(dev_ctx *d, const llama_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                       int ac, fsdp_err *err);
/* The same with the options of the CPU workspace (llama_model.h: checkpointing and the rows per
 * output-head chunk; opts NULL: neither checkpointing nor a chunk size, i.e. automatic chunks of
 * LLAMA_HEAD_CHUNK_BYTES of logits). The logits buffer holds one chunk: [chunk, V], not [B*T, V]. */
llama_cuda_ws *llama_cuda_ws_create_opts(dev_ctx *d, const llama_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                                         const llama_model_ws_opts *opts, fsdp_err *err);
/* The device bytes llama_cuda_ws_create_opts would allocate and the rows per head chunk, without a
 * device (sizing, tests); the same argument checks. bytes / head_chunk may be NULL. */
int llama_cuda_ws_plan_bytes(const llama_config *cfg, int B_max, int T_max, fsdp_dtype dt,
                             const llama_model_ws_opts *opts, size_t *bytes, int *head_chunk, fsdp_err *err);
int llama_cuda_ws_head_chunk(const llama_cuda_ws *ws);
void llama_cuda_ws_free(llama_cuda_ws *ws);
size_t llama_cuda_ws_bytes(const llama_cuda_ws *ws);
fsdp_dtype llama_cuda_ws_dtype(const llama_cuda_ws *ws);
/* Device logits [B*T, V] (workspace dtype) of the last llama_cuda_fwd_head; NULL before it, after
 * llama_cuda_bwd_head (which overwrites them with their gradient) and when the batch is larger than
 * one head chunk (the whole batch's logits are never held then). */
const void *llama_cuda_ws_logits(const llama_cuda_ws *ws);
/* Device double[2] written by llama_cuda_fwd_head (with labels) or llama_cuda_head_train: the sum
 * of the token losses and the number of labelled tokens, valid once the compute stream reached
 * that point. */
const double *llama_cuda_ws_loss_sums(const llama_cuda_ws *ws);

/* ---- pieces (device weight pointers; labels may be NULL: no loss, no backward) -------------- */

int llama_cuda_fwd_embed(const llama_config *cfg, const void *tok_embeddings, const int32_t *tokens,
                         const int32_t *labels, int B, int T, llama_cuda_ws *ws, fsdp_err *err);
int llama_cuda_fwd_layer(const llama_config *cfg, const llama_cuda_layer *lw, int layer, llama_cuda_ws *ws,
                         fsdp_err *err);
/* Final norm and, chunk by chunk, logits and (with labels) the loss sums (llama_cuda_ws_loss_sums).
 * loss may be NULL; when not, the loss is copied to the host (a synchronisation). Over several
 * chunks the logits are not kept: llama_cuda_bwd_head computes them again. */
int llama_cuda_fwd_head(const llama_config *cfg, const void *norm_w, const void *output_w, llama_cuda_ws *ws,
                        llama_model_loss *loss, fsdp_err *err);

/* loss_denom <= 0: the batch's number of labelled tokens. */
int llama_cuda_bwd_head(const llama_config *cfg, const void *norm_w, const void *output_w, float *d_norm,
                        float *d_output, double loss_denom, llama_cuda_ws *ws, fsdp_err *err);
/* The training head in one pass instead of llama_cuda_fwd_head + llama_cuda_bwd_head (llama_model.h's
 * llama_head_train): per chunk of rows, the logits GEMM, kcu_xent_chunk (lse, loss sums, dlogits in
 * place with the scale 1/loss_denom known before), dxnf = dlogits W_out and d_output += dlogits^T
 * xnf; then the final norm's backward. Labels needed. The loss sums are left on the device
 * (llama_cuda_ws_loss_sums), nothing synchronises the host. llama_cuda_bwd_layer(L-1) follows. */
int llama_cuda_head_train(const llama_config *cfg, const void *norm_w, const void *output_w, float *d_norm,
                          float *d_output, double loss_denom, llama_cuda_ws *ws, fsdp_err *err);
int llama_cuda_bwd_layer(const llama_config *cfg, const llama_cuda_layer *lw, llama_model_layer *lg, int layer,
                         llama_cuda_ws *ws, fsdp_err *err);
int llama_cuda_bwd_embed(const llama_config *cfg, float *d_tok_embeddings, llama_cuda_ws *ws, fsdp_err *err);

/* ---- whole model ------------------------------------------------------------------------------- */

int llama_cuda_model_forward(const llama_config *cfg, const llama_cuda_weights *w, const int32_t *tokens,
                             const int32_t *labels, int B, int T, llama_cuda_ws *ws, llama_model_loss *loss,
                             fsdp_err *err);
/* g: float32 device gradients (llama_model_weights_bind on a device buffer). */
int llama_cuda_model_backward(const llama_config *cfg, const llama_cuda_weights *w, llama_model_weights *g,
                              double loss_denom, llama_cuda_ws *ws, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
