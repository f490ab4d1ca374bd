/* fsdp-run public API (stage ABI 1.2): collectives over host buffers on the run's communicator.
 *
 * Every rank of the run (the world: with an HSDP mesh every replica too) takes part, in the same
 * order, with the same counts: a plugin that computes a statistic or agrees on a decision needs no
 * MPI of its own. In a world of 1 they are copies. Errors name the stage and the call.
 *
 * Before any payload moves every rank's call and arguments (count, dtype, operation, root, a NULL
 * buffer) reach every rank on a communicator the trainer's collectives never use; these calls and the
 * collective calls of params.h are numbered on it. A rank that passed something else, or made another
 * call, fails every rank (FSDP_E_INVALID) with a message naming what each rank passed; a call that
 * some rank does not make within runtime.collective_timeout seconds (default 300) fails the ranks that
 * made it (FSDP_E_COMM), naming the call and the ranks that did, and every later call fails too. */
#ifndef FSDP_COLLECTIVES_H
#define FSDP_COLLECTIVES_H

#include <stddef.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_reduce_op { FSDP_SUM = 0, FSDP_MAX, FSDP_MIN } fsdp_reduce_op;

int fsdp_barrier(fsdp_ctx *ctx, fsdp_err *err);
/* root's `bytes` bytes of buf to every rank. */
int fsdp_broadcast(fsdp_ctx *ctx, void *buf, size_t bytes, int root, fsdp_err *err);
/* In place, count elements of dt: FSDP_DT_F32, F64, I32 (summed as int64 internally: no overflow
 * below 2^63) or I64. */
int fsdp_allreduce(fsdp_ctx *ctx, void *buf, size_t count, fsdp_dtype dt, fsdp_reduce_op op, fsdp_err *err);
/* Every rank sends `bytes` bytes; recv receives world_size * bytes, rank by rank. */
int fsdp_allgather(fsdp_ctx *ctx, const void *send, size_t bytes, void *recv, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
