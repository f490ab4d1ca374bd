/* One training step of a whole decoder-family model on one process (the reference the FSDP step is tested against): forward, backward, global gradient
 * norm, clipping, AdamW (torch.optim.AdamW semantics, weight decay on every parameter).
 * The train state owns flat float32 buffers (parameters, gradients, exp_avg, exp_avg_sq) in the
 * layout of decoder_model_weights_bind, and views on them in torchtitan names. The single-process
 * reference of the decoder family (its buffers are the family's own weight views), so it lives beside
 * the model; the FSDP step of train/ sees a model only through model/model_blocks.h. */
#ifndef FSDP_DECODER_DECODER_SINGLE_H
#define FSDP_DECODER_DECODER_SINGLE_H

#include <stdint.h>

#include "fsdp/error.h"
#include "decoder/decoder_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct decoder_single_hparams {
    double beta1;        /* 0.9 */
    double beta2;        /* 0.95 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 0.1 */
    double max_norm;     /* clip_grad_norm_ max_norm; <= 0 disables clipping (the norm is still computed) */
} decoder_single_hparams;

typedef struct decoder_single_state {
    decoder_config cfg;
    int64_t numel;       /* parameter count */
    float *params;       /* numel floats each */
    float *grads;
    float *exp_avg;
    float *exp_avg_sq;
    decoder_model_weights w;  /* views on params */
    decoder_model_weights g;  /* views on grads */
    decoder_model_weights m;  /* views on exp_avg */
    decoder_model_weights v;  /* views on exp_avg_sq */
    int64_t step;           /* optimizer steps taken so far */
    decoder_model_ws *ws;
    kc_stats *stats;        /* optional GEMM timing (NULL: off) */
} decoder_single_state;

typedef struct decoder_single_result {
    double loss;      /* mean cross-entropy before the update */
    int64_t n_valid;  /* tokens in the mean */
    double grad_norm; /* total L2 norm of the gradients before clipping */
    double clip_coef; /* factor the gradients were multiplied by (1 when not clipped) */
} decoder_single_result;

/* Allocates zeroed buffers for cfg and a workspace for batches up to B_max x T_max. The caller
 * fills st->params (directly or through st->w / decoder_model_param_at). */
int decoder_single_init(decoder_single_state *st, const decoder_config *cfg, int B_max, int T_max, fsdp_err *err);
void decoder_single_free(decoder_single_state *st);
/* Timing hook for the GEMMs of the following steps (NULL: off). */
void decoder_single_set_stats(decoder_single_state *st, kc_stats *stats);

/* One step at learning rate lr: zero grads, forward, backward (mean over the batch's kept tokens),
 * norm, clip, AdamW with step count st->step + 1. A non-finite loss or gradient norm fails with
 * FSDP_E_NUMERIC before anything is updated. */
int decoder_single_step(decoder_single_state *st, const int32_t *tokens, const int32_t *labels, int B, int T, double lr,
                     const decoder_single_hparams *hp, decoder_single_result *res, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
