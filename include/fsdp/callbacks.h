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
/* 0 when removed, FSDP_E_INVALID when no callback has that name. */
int fsdp_callback_remove(fsdp_ctx *ctx, const char *name, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
