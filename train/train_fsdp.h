/* One FSDP training step of a model (model/model_blocks.h: Llama and the decoder family through
 * decoder/decoder_blocks.h) on sharded state (runtime/state.h):
 * per layer all-gather -> forward -> drop; backward with all-gather -> gradients ->
 * reduce-scatter (sum); global gradient norm over all shards; clipping; AdamW on the
 * local shards. The loss is the mean over all global tokens: gradients are summed over
 * ranks with the global token count as the denominator, so the result does not depend on
 * the world size beyond float summation order. */
#ifndef FSDP_TRAIN_TRAIN_FSDP_H
#define FSDP_TRAIN_TRAIN_FSDP_H

#include <stdint.h>

#include "fsdp/error.h"
#include "model/model_blocks.h"
#include "runtime/comm.h"
#include "runtime/state.h"

typedef struct train_fsdp train_fsdp;

struct train_fsdp_result;

typedef struct train_fsdp_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    double max_norm; /* <= 0: no clipping */
    /* NULL, or one flag per state parameter (s->p[k]): nonzero = no weight decay for it (train-steps'
     * no_decay globs) */
    const unsigned char *no_decay;
    /* NULL, or called on every rank after the gradients and their norm (res: loss, grad_norm, ...), before
     * the update: *skip 1 leaves everything as it was (res->skipped set, no error even when not finite);
     * *lr_scale multiplies this update's learning rate (train-steps' pre-update hooks). */
    int (*pre_update)(void *user, const struct train_fsdp_result *res, int *skip, double *lr_scale, fsdp_err *err);
    void *pre_user;
} train_fsdp_hparams;

typedef struct train_fsdp_result {
    double loss;      /* the objective before the update: ce_loss plus the weighted auxiliary loss */
    double ce_loss;   /* global mean cross-entropy */
    double aux_loss;  /* the model's auxiliary loss (a mixture of experts' load balancing; mean over the
                         micro-batches), unweighted; 0 without one */
    int has_aux;      /* the model has an auxiliary loss */
    /* a mixture of experts: tokens routed to each expert over the step's micro-batches and ranks,
     * [n_blocks][load_experts] (a dense block's row is all -1); NULL without experts. Valid until the
     * next step. */
    const int64_t *expert_load;
    int load_blocks, load_experts;
    double grad_norm; /* global L2 norm of the gradients before clipping */
    int64_t tokens;   /* global tokens counted in the loss */
    int skipped;      /* the pre-update hook skipped this update (nothing changed) */
} train_fsdp_result;

/* The model m (model/model_blocks.h: its blocks, their parameters in order and the pieces that run
 * them; e.g. decoder/decoder_blocks.h's decoder_blocks_cpu) trains on the state, which must hold every
 * parameter m names, sharded. m is copied; m.impl needs to live only during the call. */
int train_fsdp_create(fsdp_state *s, model_blocks m, comm *c, int local_batch, int seq_len, train_fsdp **out,
                      fsdp_err *err);
/* The same with activation checkpointing ac, a model_blocks_ac: MODEL_BLOCKS_AC_NONE, _FULL or _SELECTIVE
 * (another value is FSDP_E_INVALID, from the model's workspace). */
int train_fsdp_create_ac(fsdp_state *s, model_blocks m, comm *c, int local_batch, int seq_len, int ac,
                         train_fsdp **out, fsdp_err *err);
/* The same with the output head in chunks of head_chunk_rows rows (0: automatic, the model's choice):
 * the head runs as m.head_train, so at most one chunk of logits exists. */
int train_fsdp_create_opts(fsdp_state *s, model_blocks m, comm *c, int local_batch, int seq_len, int ac,
                           int head_chunk_rows, train_fsdp **out, fsdp_err *err);
/* HSDP (runtime/mesh.h): c given to create is the shard group; world is every rank the batch is
 * split over (the loss's token count and sum), replicate the group the reduced gradient shards are
 * all-reduced over after each reduce-scatter (NULL: no replicas). Without this call world = c. */
int train_fsdp_set_replicas(train_fsdp *f, comm *world, comm *replicate, fsdp_err *err);
void train_fsdp_free(train_fsdp *f);
/* Collectives per transformer block (flat != 0, the default: one all-gather and one reduce-scatter
 * of each layer's parameters together, train/flat_group.h) or per parameter (0). Both give the
 * same values: bit for bit on 2 ranks, within float32 summation order on more. */
/* Expert parallelism `ep` (1: off) over the shard group: each rank computes the experts of its ep rank
 * for the tokens of its ep group, exchanged by all-to-all (train/train_fsdp_ep.c has the layout). ep
 * must divide the shard group's size, which must divide the experts. Call once, after create. */
int train_fsdp_set_expert_parallel(train_fsdp *f, int ep, fsdp_err *err);
void train_fsdp_set_flat(train_fsdp *f, int flat);
/* Forward and backward only: the global loss and reduce-scattered gradients in p->grad. */
int train_fsdp_grads(train_fsdp *f, const int32_t *tokens, const int32_t *labels, train_fsdp_result *res,
                     fsdp_err *err);
/* Gradient accumulation: tokens and labels hold n_micro micro-batches of local_batch x seq_len, one
 * after the other. The loss is the mean over every token of all micro-batches of all ranks (one
 * denominator: exactly the loss and gradient of one batch n_micro times as large); the full gradients
 * add up over the micro-batches and are reduce-scattered once (each parameter once per call). With
 * n_micro > 1 every layer's full gradient is kept (n_layers x layer numel floats more). */
int train_fsdp_grads_accum(train_fsdp *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                           train_fsdp_result *res, fsdp_err *err);
/* A whole step: grads, then (if finite) norm, clip and AdamW; s->opt_step advances.
 * A non-finite loss or gradient fails with FSDP_E_NUMERIC and changes nothing. */
int train_fsdp_step(train_fsdp *f, const int32_t *tokens, const int32_t *labels, const train_fsdp_hparams *hp,
                    train_fsdp_result *res, fsdp_err *err);
/* train_fsdp_step over n_micro accumulated micro-batches (train_fsdp_grads_accum). */
int train_fsdp_step_accum(train_fsdp *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                          const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err);

#endif
