/* fsdp-run public API (stage ABI 1.2): callbacks in train-steps and eval.
 *
 * A plugin stage registers a callback for the rest of the run; train-steps calls it on every rank
 * after each optimizer step, and after each evaluation (its eval_every, and the eval stage), with the
 * step's metrics. A callback may read or write parameters and optimizer state (include/fsdp/params.h,
 * not add, remove or resize them), use the collectives, and request that the run save now or stop
 * after this step: requests are combined over every callback and every rank, so every rank saves and
 * stops at the same step. A save request writes train-steps' periodic checkpoint (save_path) at this
 * step; a stop ends train-steps there, successfully, and the recipe's next stages run (a following
 * save-dcp commits the last checkpoint). Requests made during the eval stage, outside train-steps,
 * are logged and ignored. A callback's error fails the stage, naming the callback. */
#ifndef FSDP_CALLBACKS_H
#define FSDP_CALLBACKS_H

#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_step_metrics {
    int is_eval;        /* 1: after an evaluation (eval_loss), 0: after an optimizer step */
    int64_t step;       /* optimizer steps done */
    double loss;        /* the step's training loss (global) */
    double grad_norm;   /* before clipping */
    double lr;          /* the step's learning rate */
    double tokens_per_s;
    double eval_loss;   /* is_eval: the evaluation's loss */
} fsdp_step_metrics;

#define FSDP_REQUEST_SAVE 1u /* save a checkpoint at this step (no save_path: a warning naming the callback) */
#define FSDP_REQUEST_STOP 2u /* end train-steps after this step */

/* *request starts at 0; a callback ORs FSDP_REQUEST_* into it. Nonzero return: the stage fails. */
typedef int (*fsdp_step_callback)(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user,
                                  fsdp_err *err);

/* Registers fn under `name` (replacing one of that name) for the rest of the run; destroy(user), when
 * not NULL, runs when it is replaced or removed or the run ends. */
int fsdp_callback_add(fsdp_ctx *ctx, const char *name, fsdp_step_callback fn, void *user, void (*destroy)(void *),
                      fsdp_err *err);
/* 0 when removed, FSDP_E_INVALID when no callback has that name. It removes a hook or a pre-update hook
 * (below) of that name too. */
int fsdp_callback_remove(fsdp_ctx *ctx, const char *name, fsdp_err *err);

/* ---- stage ABI 1.2: hooks --------------------------------------------------------------------
 * Registered like callbacks (for the rest of the run, replacing one of the same name and kind, destroy
 * at the end), called on every rank at the same point; a hook's error fails the stage on every rank,
 * each naming the hook and the rank. Inside a hook the parameters may be read and written (not added,
 * removed or resized) and the collectives used. */
typedef enum fsdp_hook_kind {
    FSDP_HOOK_TRAIN_START = 0, /* train-steps set up, before its first step */
    FSDP_HOOK_TRAIN_END = 1,   /* train-steps' last step done (or a stop), before its final save */
    FSDP_HOOK_AFTER_SAVE = 2,  /* a checkpoint of the state committed: save-dcp, train-steps' periodic and
                                  requested saves (an async one when it is committed) */
    FSDP_HOOK_AFTER_LOAD = 3,  /* load-ckpt restored the state */
    FSDP_HOOK_KINDS
} fsdp_hook_kind;

typedef struct fsdp_hook_event {
    fsdp_hook_kind kind;
    int64_t step;     /* optimizer steps done (train-steps' step count) */
    const char *path; /* AFTER_SAVE: the checkpoint written; AFTER_LOAD: the one loaded; else NULL */
} fsdp_hook_event;

typedef int (*fsdp_hook_fn)(fsdp_ctx *ctx, const fsdp_hook_event *ev, void *user, fsdp_err *err);
int fsdp_hook_add(fsdp_ctx *ctx, const char *name, fsdp_hook_kind kind, fsdp_hook_fn fn, void *user,
                  void (*destroy)(void *), fsdp_err *err);

/* Before each optimizer update of train-steps, after the gradients and their global norm: m holds the
 * step about to be taken (step: its number, 1-based; loss, grad_norm before clipping, lr as scheduled).
 * A hook may read this rank's gradient rows (fsdp_param_read_grad), set u->skip = 1 to skip this update
 * (weights, moments and AdamW's step count stay as they are, bitwise; the batch is consumed and the
 * schedule moves on, as torchtitan and Megatron skip a step on a spike; the step's metrics line says
 * "skipped": true) or multiply this update's learning rate by u->lr_scale (> 0, 1 as given). Over every
 * hook and rank: skipped if any skips, the product of the scales, which must be the same on every rank.
 * A skipped update is not an error even when the loss or norm is not finite. */
typedef struct fsdp_update {
    int skip;
    double lr_scale;
} fsdp_update;
typedef int (*fsdp_pre_update_fn)(fsdp_ctx *ctx, const fsdp_step_metrics *m, fsdp_update *u, void *user,
                                  fsdp_err *err);
int fsdp_pre_update_add(fsdp_ctx *ctx, const char *name, fsdp_pre_update_fn fn, void *user, void (*destroy)(void *),
                        fsdp_err *err);

/* Inside a callback or pre-update hook of train-steps: a number for this step's metrics JSONL line
 * (`"name": value`, after train-steps' own fields; the last value given wins). 0, or FSDP_E_INVALID
 * outside one, for a bad name (1-64 of a-z, A-Z, 0-9, '_', '.') or one of train-steps' own fields. */
int fsdp_step_metric(fsdp_ctx *ctx, const char *name, double value, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
