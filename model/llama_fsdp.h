/* One FSDP training step of the Llama model on sharded state (runtime/state.h):
 * per layer all-gather -> forward -> drop; backward with all-gather -> gradients ->
 * reduce-scatter (sum); global gradient norm over all shards; clipping; AdamW on the
 * local shards. The loss is the mean over all global tokens: gradients are summed over
 * ranks with the global token count as the denominator, so the result does not depend on
 * the world size beyond float summation order. */
#ifndef FSDP_MODEL_LLAMA_FSDP_H
#define FSDP_MODEL_LLAMA_FSDP_H

#include <stdint.h>

#include "fsdp/error.h"
#include "runtime/comm.h"
#include "runtime/state.h"

typedef struct llama_fsdp llama_fsdp;

typedef struct llama_fsdp_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    double max_norm; /* <= 0: no clipping */
    /* NULL, or one flag per state parameter (s->p[k]): nonzero = no weight decay for it (train-steps'
     * no_decay globs) */
    const unsigned char *no_decay;
} llama_fsdp_hparams;

typedef struct llama_fsdp_result {
    double loss;      /* global mean cross-entropy before the update */
    double grad_norm; /* global L2 norm of the gradients before clipping */
    int64_t tokens;   /* global tokens counted in the loss */
} llama_fsdp_result;

/* The state must hold every parameter of s->cfg under torchtitan names, sharded. */
int llama_fsdp_create(fsdp_state *s, comm *c, int local_batch, int seq_len, llama_fsdp **out, fsdp_err *err);
/* The same with activation checkpointing ac, a llama_ac of llama_model.h: LLAMA_AC_NONE, _FULL or
 * _SELECTIVE (llama_model_ws_create_ac; another value is FSDP_E_INVALID). */
int llama_fsdp_create_ac(fsdp_state *s, comm *c, int local_batch, int seq_len, int ac, llama_fsdp **out,
                         fsdp_err *err);
/* The same with the output head in chunks of head_chunk_rows rows (0: automatic; llama_model.h's
 * llama_model_ws_opts): the head runs as llama_head_train, so at most one chunk of logits exists. */
int llama_fsdp_create_opts(fsdp_state *s, comm *c, int local_batch, int seq_len, int ac, int head_chunk_rows,
                           llama_fsdp **out, fsdp_err *err);
void llama_fsdp_free(llama_fsdp *f);
/* Collectives per transformer block (flat != 0, the default: one all-gather and one reduce-scatter
 * of each layer's parameters together, runtime/flat_group.h) or per parameter (0). Both give the
 * same values: bit for bit on 2 ranks, within float32 summation order on more. */
void llama_fsdp_set_flat(llama_fsdp *f, int flat);
/* Forward and backward only: the global loss and reduce-scattered gradients in p->grad. */
int llama_fsdp_grads(llama_fsdp *f, const int32_t *tokens, const int32_t *labels, llama_fsdp_result *res,
                     fsdp_err *err);
/* Gradient accumulation: tokens and labels hold n_micro micro-batches of local_batch x seq_len, one
 * after the other. The loss is the mean over every token of all micro-batches of all ranks (one
 * denominator: exactly the loss and gradient of one batch n_micro times as large); the full gradients
 * add up over the micro-batches and are reduce-scattered once (each parameter once per call). With
 * n_micro > 1 every layer's full gradient is kept (n_layers x layer numel floats more). */
int llama_fsdp_grads_accum(llama_fsdp *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                           llama_fsdp_result *res, fsdp_err *err);
/* A whole step: grads, then (if finite) norm, clip and AdamW; s->opt_step advances.
 * A non-finite loss or gradient fails with FSDP_E_NUMERIC and changes nothing. */
int llama_fsdp_step(llama_fsdp *f, const int32_t *tokens, const int32_t *labels, const llama_fsdp_hparams *hp,
                    llama_fsdp_result *res, fsdp_err *err);
/* llama_fsdp_step over n_micro accumulated micro-batches (llama_fsdp_grads_accum). */
int llama_fsdp_step_accum(llama_fsdp *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                          const llama_fsdp_hparams *hp, llama_fsdp_result *res, fsdp_err *err);

#endif
