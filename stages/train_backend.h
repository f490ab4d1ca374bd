/* train-steps' training backend: the CPU step (train/train_fsdp.h) or the GPU step
 * (train/train_fsdp_cuda.h) behind one interface, with the memory figure each reports. */
#ifndef FSDP_STAGES_TRAIN_BACKEND_H
#define FSDP_STAGES_TRAIN_BACKEND_H

#include "fsdp/ctx.h"
#include "train/train_fsdp.h"
#include "train/train_fsdp_cuda.h"
#include "runtime/comm.h"
#include "runtime/state.h"

typedef struct train_backend {
    int on_gpu;
    train_fsdp *cpu;
    train_fsdp_cuda *gpu;
    dev_ctx *dev; /* the state's device context on the GPU (not owned) */
} train_backend;

/* Whether this run trains on the GPU: the state's arrays are on a device (s->dev set and the
 * parameters placed there). The single switch between the two paths. */
int train_on_gpu(fsdp_ctx *ctx, const fsdp_state *s);

/* Opens the backend for local batches of B x T. The CPU path trains in float32 only (mixed bf16:
 * FSDP_E_INVALID naming the key); both paths do activation checkpointing. */
int train_backend_open(fsdp_ctx *ctx, fsdp_state *s, comm *c, int B, int T, const train_fsdp_cuda_options *opt,
                       train_backend *b, fsdp_err *err);
int train_backend_step(train_backend *b, const int32_t *tokens, const int32_t *labels, const train_fsdp_hparams *hp,
                       train_fsdp_result *res, fsdp_err *err);
/* The same over n_micro micro-batches of B x T (gradient accumulation: one loss denominator, one
 * reduce-scatter per parameter; train_fsdp_step_accum / train_fsdp_cuda_step_accum). */
int train_backend_step_accum(train_backend *b, const int32_t *tokens, const int32_t *labels, int n_micro,
                             const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err);
/* Forward and backward of one batch without an update: the global loss (evaluation). The gradients
 * it leaves are overwritten by the next step's. */
int train_backend_grads(train_backend *b, const int32_t *tokens, const int32_t *labels, train_fsdp_result *res,
                        fsdp_err *err);
void train_backend_close(train_backend *b);
/* Resets the device's peak-memory counter (GPU; nothing on the CPU). */
void train_backend_reset_peak(train_backend *b);
/* Peak memory in MiB and its metric name: "peak_device_mem_mib" (device allocator's peak since
 * the reset) on the GPU, "peak_rss_mib" (process peak RSS) on the CPU. */
double train_backend_peak_mib(const train_backend *b, const char **name);

/* Model FLOPs utilisation in percent (torchtitan's mfu): tokens/s per device times the model
 * FLOPs per token (decoder_flops_per_token) over the device's peak (peak_tflops * 1e12 FLOP/s);
 * 0 when any input is not positive. */
double train_mfu_percent(double flops_per_token, double tokens_per_s_per_device, double peak_tflops);

#endif
