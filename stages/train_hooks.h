/* train-steps' side of the plugin API's hooks (include/fsdp/callbacks.h, stage ABI 1.2; api/api_hooks.h):
 * the pre-update hooks bridged into the trainers' hyper-parameters, and the hook events. */
#ifndef FSDP_STAGES_TRAIN_HOOKS_H
#define FSDP_STAGES_TRAIN_HOOKS_H

#include "fsdp/callbacks.h"
#include "runtime/state.h"
#include "train/train_fsdp.h"

typedef struct train_hooks {
    fsdp_ctx *ctx;
    const fsdp_state *s;
    const train_fsdp_hparams *hp; /* the step's (its lr) */
} train_hooks;

/* When a pre-update hook is registered, hp->pre_update runs them (h lives as long as hp is used). */
void train_hooks_attach(train_hooks *h, fsdp_ctx *ctx, const fsdp_state *s, train_fsdp_hparams *hp);
/* The hooks of kind k (collective when one is registered). */
int train_hooks_event(fsdp_ctx *ctx, fsdp_hook_kind k, int64_t step, const char *path, fsdp_err *err);

#endif
