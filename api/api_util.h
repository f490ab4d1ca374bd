/* Shared checks of the plugin API (include/fsdp/params.h, collectives.h, callbacks.h, ckpt.h): every
 * error names the stage (`id` and what it `uses:`), the call and what was wrong. */
#ifndef FSDP_API_API_UTIL_H
#define FSDP_API_API_UTIL_H

#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "runtime/comm.h"
#include "runtime/ctx_impl.h" /* ctx_world_comm, ctx_shard_comm */
#include "runtime/state.h"

/* Sets err to "stage 'ID' (USES): CALL: <message>" and returns code. */
int api_fail(fsdp_ctx *ctx, fsdp_err *err, int code, const char *call, const char *fmt, ...) FSDP_PRINTF(5, 6);

/* The model state for `call`: an error when called outside a stage or without a model. */
fsdp_state *api_state(fsdp_ctx *ctx, const char *call, fsdp_err *err);
/* Parameter i of the state, or an error naming the index and the count. */
state_param *api_param(fsdp_ctx *ctx, fsdp_state *s, size_t i, const char *call, fsdp_err *err);
/* Rows [row0, row0 + rows) within p's rows on this rank (a 0-d parameter: row 0, 1 row), and buf not
 * NULL; dt a float dtype. */
int api_check_rows(fsdp_ctx *ctx, const state_param *p, int64_t row0, int64_t rows, fsdp_dtype dt, const void *buf,
                   const char *call, fsdp_err *err);
/* Rows [row0, row0 + rows) of array a of p between the state and buf (dt; to_state 0 reads), through
 * a host copy when the array is on the device (checked by api_check_rows first). */
int api_move_rows(fsdp_ctx *ctx, fsdp_state *s, state_param *p, state_array a, int64_t row0, int64_t rows,
                  fsdp_dtype dt, void *buf, int to_state, const char *call, fsdp_err *err);
/* Refused inside a train-steps callback (add, remove, resize). */
int api_not_in_callback(fsdp_ctx *ctx, const char *call, fsdp_err *err);
/* The whole of array a of p in float32 on every rank of the shard group (its rows gathered, through a
 * host copy on the GPU), malloc'd into *full (NULL on error). */
int api_gather_array(fsdp_ctx *ctx, fsdp_state *s, state_param *p, state_array a, float **full, fsdp_err *err);

#endif
