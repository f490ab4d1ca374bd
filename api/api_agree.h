/* What every rank passed to a collective call of the plugin API, agreed on before any payload moves
 * (include/fsdp/collectives.h, the collective calls of params.h): the call, its counts, dtype,
 * operation, root, parameter, shape and init rule, and the call's number on the plugin API's own
 * communicator (ctx_api_comm), which the trainer's collectives never use. A rank that passed
 * something else, or called another collective, fails every rank with one message naming what each
 * rank passed; a rank that does not arrive within runtime.collective_timeout ends the wait of those
 * that did with a message naming the call and the ranks that arrived. */
#ifndef FSDP_API_API_AGREE_H
#define FSDP_API_API_AGREE_H

#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "runtime/comm.h"

/* Which fields a call passes (each names itself in the messages). */
enum {
    API_HAS_DTYPE = 1u << 0,
    API_HAS_OP = 1u << 1,
    API_HAS_ROOT = 1u << 2,
    API_HAS_ELEMS = 1u << 3, /* count: elements */
    API_HAS_BYTES = 1u << 4, /* count: bytes */
    API_HAS_INDEX = 1u << 5, /* count: a parameter index (name: its name on this rank) */
    API_HAS_NAME = 1u << 6,
    API_HAS_SHAPE = 1u << 7,
    API_HAS_RULE = 1u << 8,
    API_HAS_ROWS = 1u << 9, /* rows: a new dim 0 */
    API_HAS_TRAINABLE = 1u << 10 /* rows: trainable 0 or 1 */
};

typedef struct api_call {
    uint64_t seq;  /* the call's number on the plugin API's communicator (set by api_agree) */
    char call[32]; /* "fsdp_allreduce" */
    uint32_t has;  /* API_HAS_* */
    int32_t dtype, op, root, ndim;
    int64_t count, rows;
    int64_t shape[FSDP_MAX_DIMS];
    char name[96], rule[64];
    char bad[64]; /* what is wrong with this rank's own arguments ("a NULL buffer"), else "" */
    /* what the root rank alone decides or passes: not compared across ranks */
    int32_t root_flag;
    char root_bad[64]; /* what is wrong with the root's buffer ("a NULL buffer"), else "" */
} api_call;

/* A zeroed record of `call` (so that two records of the same arguments are equal byte for byte). */
void api_call_init(api_call *c, const char *call);
/* name (truncated to the record's room) and a rule or "" into the record. */
void api_call_name(api_call *c, const char *name);
void api_call_rule(api_call *c, const char *rule);
/* Notes a problem of this rank's arguments that the other ranks cannot see (a NULL buffer): it is part
 * of what the ranks agree on, so a rank alone with it fails every rank before any payload moves. */
void api_call_bad(api_call *c, const char *what);
/* "fsdp_allreduce(4 elements, f32, sum)": what a record says a rank passed. */
void api_call_describe(const api_call *c, char *buf, size_t cap);

/* Collective over every rank: 0 when every rank passed what this one did (*of_root, when not NULL,
 * gets the record of rank `root` when it is a rank), else an error (named for the stage and call) on
 * every rank that takes part. */
int api_agree(fsdp_ctx *ctx, api_call *mine, int root, api_call *of_root, fsdp_err *err);

/* Collective over c, once every rank made the same call: rc on any rank fails every rank, the others
 * with the lowest failing rank's message ("rank 2: ..."). Returns this rank's rc, else that one's. */
int api_agree_result(fsdp_ctx *ctx, comm *c, int rc, fsdp_err *err);

#endif
