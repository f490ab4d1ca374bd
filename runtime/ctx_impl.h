/* Internal layout of the runtime context (public view: include/fsdp/ctx.h). */
#ifndef FSDP_RUNTIME_CTX_IMPL_H
#define FSDP_RUNTIME_CTX_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include "fsdp/ctx.h"
#include "runtime/comm.h"
#include "runtime/mesh.h"

typedef struct ctx_metric {
    char *name;
    int is_str;
    double num;
    char *str;
} ctx_metric;

typedef struct ctx_metrics {
    ctx_metric *items;
    size_t n, cap;
} ctx_metrics;

typedef int (*ctx_finish_fn)(fsdp_ctx *ctx, void *ptr, fsdp_err *err);

/* Collective: sets *done when the work can be completed now without waiting. */
typedef int (*ctx_poll_fn)(fsdp_ctx *ctx, void *ptr, int *done, fsdp_err *err);

typedef struct ctx_finisher {
    char *name;
    void *ptr;
    ctx_finish_fn fn;
    ctx_poll_fn poll; /* NULL: completed only by ctx_run_finisher(s) */
    void (*destroy)(void *);
} ctx_finisher;

typedef struct ctx_attachment {
    char *name;
    void *ptr;
    void (*destroy)(void *);
} ctx_attachment;

struct fsdp_ctx {
    int rank, world;
    comm *api_comm;       /* the plugin API's collectives: a duplicate of comm (owned; NULL in a world of 1) */
    comm *comm;           /* borrowed from the caller of run_main */
    double api_timeout_s; /* how long an API collective waits for every rank (runtime.collective_timeout) */
    mesh *mesh;           /* the current recipe's runtime.mesh (owned; NULL: 1-D over comm) */
    int verbosity;        /* 0 quiet (warnings+errors), 1 normal, 2 verbose */
    FILE *log;            /* stderr unless redirected (tests) */
    int log_is_tty;
    double t0;            /* monotonic start time, seconds */
    /* current recipe / stage */
    const fsdp_value *root;
    const char *recipe_name, *recipe_path, *stage_id;
    const char *stage_uses; /* the running stage's kind (`uses:`), for the plugin API's messages */
    int in_callback;        /* a train-steps callback runs (include/fsdp/callbacks.h) */
    int in_pre_update;      /* a pre-update hook runs: the gradients of this step are readable */
    const fsdp_value *stage_with; /* the running stage's with: (fsdp_ctx_stage_args) */
    /* 1 while the running stage may leave parameter values deferred (runtime/state_defer.h): every stage
     * after it reads them through the deferral or materialises them itself (set by run/run.c) */
    int defer_ok;
    ctx_metrics *metrics; /* sink of the running stage (owned by the run record) */
    /* DAG state names present */
    char **state;
    size_t n_state, cap_state;
    ctx_attachment *att;
    size_t n_att, cap_att;
    fsdp_progress *progress; /* the active progress display, if any */
    ctx_finisher *fin;       /* work to complete before the run ends (async saves) */
    size_t n_fin;
    char run_id[48];      /* fsdp_ctx_run_id ("" outside a run) */
    char run_start[32];   /* fsdp_ctx_run_start */
};

fsdp_ctx *ctx_new(comm *c, int verbosity, FILE *log);
void ctx_free(fsdp_ctx *ctx);
/* Every rank's communicator: the run's, or (in-process runs without one: tests) a world of 1 that
 * lives with the context; NULL only when out of memory. */
comm *ctx_world_comm(fsdp_ctx *ctx);
/* The plugin API's communicator: the world's ranks on a channel the trainer's collectives never use
 * (the world's own in a world of 1); NULL when it could not be made. */
comm *ctx_api_comm(fsdp_ctx *ctx);
/* runtime.collective_timeout's default, seconds. */
#define CTX_API_TIMEOUT_DEFAULT 300.0
/* The communicator parameters are sharded over (the mesh's shard group; the world by default) and
 * the one they are replicated over (NULL without replicas). */
comm *ctx_shard_comm(fsdp_ctx *ctx);
comm *ctx_replicate_comm(const fsdp_ctx *ctx);
/* Sets the run's id and start time from start (UNIX time); random: 32 random bits. */
void ctx_set_run(fsdp_ctx *ctx, double start, uint32_t random);
double ctx_now(void); /* monotonic seconds */
void ctx_metrics_free(ctx_metrics *m);
/* Background work a stage leaves running: `fn` completes it (collectively) before the run
 * ends, or earlier through ctx_run_finisher; destroy frees it. */
int ctx_add_finisher(fsdp_ctx *ctx, const char *name, void *ptr, ctx_finish_fn fn, void (*destroy)(void *),
                     fsdp_err *err);
/* Gives the last finisher added a poll function (ctx_poll_finishers). */
void ctx_set_finisher_poll(fsdp_ctx *ctx, ctx_poll_fn poll);
/* Collective (every rank calls it at the same points: between stages, between training steps):
 * completes each finisher whose poll says it is ready, without waiting for the others. The first
 * error is returned. */
int ctx_poll_finishers(fsdp_ctx *ctx, fsdp_err *err);
/* Completes the named finisher now (no-op when there is none). */
int ctx_run_finisher(fsdp_ctx *ctx, const char *name, fsdp_err *err);
/* Completes every finisher in order; the first error is returned, the rest still run. */
int ctx_run_finishers(fsdp_ctx *ctx, fsdp_err *err);
/* Closes an active progress display (when a stage returns without ending it). */
void ctx_progress_close(fsdp_ctx *ctx);

#endif
