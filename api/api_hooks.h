/* The hooks of the plugin API (include/fsdp/callbacks.h, stage ABI 1.2) as the stages run them: the
 * train start / end and after-save / after-load hooks, the pre-update hooks of train-steps, and the
 * metrics callbacks add to a step's line. */
#ifndef FSDP_API_API_HOOKS_H
#define FSDP_API_API_HOOKS_H

#include <stddef.h>

#include "fsdp/callbacks.h"

/* Hooks of kind k registered in ctx (the same on every rank); FSDP_HOOK_KINDS: pre-update hooks. */
size_t api_hooks_count(fsdp_ctx *ctx, int k);

/* Collective when a hook of ev->kind is registered: runs each on this rank; a failure on any rank fails
 * every rank with the failing rank's message (naming the hook). */
int api_hooks_run(fsdp_ctx *ctx, const fsdp_hook_event *ev, fsdp_err *err);

/* Collective when a pre-update hook is registered: runs each with m (ctx->in_pre_update set), combines
 * u over the hooks and ranks (skip if any skips; the product of the scales, the same on every rank, else
 * an error naming the ranks' values). u starts as {0, 1}. */
int api_pre_update_run(fsdp_ctx *ctx, const fsdp_step_metrics *m, fsdp_update *u, fsdp_err *err);

/* The metrics fsdp_step_metric set since the last call, as JSON members (", \"name\": value" each) into
 * buf, and forgotten. */
void api_step_metrics_take(fsdp_ctx *ctx, char *buf, size_t cap);

/* Forgets the metrics fsdp_step_metric set (a step's metrics are its own). */
void api_step_metrics_clear(fsdp_ctx *ctx);

/* Removes the hooks named `name` (fsdp_callback_remove's other half): 1 when one was. */
int api_hooks_remove(fsdp_ctx *ctx, const char *name);

#endif
