/* The callbacks of the plugin API (include/fsdp/callbacks.h) as train-steps and eval run them. */
#ifndef FSDP_API_API_CALLBACKS_H
#define FSDP_API_API_CALLBACKS_H

#include "fsdp/callbacks.h"

/* Callbacks registered in ctx (the same number on every rank: a stage registers them on all). */
size_t api_callbacks_count(fsdp_ctx *ctx);

/* Collective when any callback is registered: runs every callback on this rank with m (in the order
 * they were added), ORs their requests, and agrees over every rank: a callback's failure on any rank
 * fails every rank (naming the callback and the rank), and *request is the OR over every rank. */
int api_callbacks_run(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, fsdp_err *err);

/* The first callback of this rank that asked for a save in the last api_callbacks_run (NULL: none here; another
 * rank's may have). */
const char *api_callbacks_saver(fsdp_ctx *ctx);

#endif
