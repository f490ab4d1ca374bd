/* fsdp-run public API: the runtime context a stage runs in.
 *
 * One fsdp_ctx per rank, shared by every stage of every recipe of a run. Stages never
 * call each other; they meet in the context. */
#ifndef FSDP_CTX_H
#define FSDP_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_ctx fsdp_ctx;

typedef enum fsdp_log_level {
    FSDP_LOG_ERROR = 0,
    FSDP_LOG_WARN = 1,
    FSDP_LOG_INFO = 2,
    FSDP_LOG_DEBUG = 3
} fsdp_log_level;

int fsdp_ctx_rank(const fsdp_ctx *ctx);
int fsdp_ctx_world_size(const fsdp_ctx *ctx);
/* The current recipe's top-level sections: "runtime", "model", "data", "vars". */
const fsdp_value *fsdp_ctx_section(const fsdp_ctx *ctx, const char *name);
const char *fsdp_ctx_recipe_name(const fsdp_ctx *ctx);
const char *fsdp_ctx_recipe_path(const fsdp_ctx *ctx);
const char *fsdp_ctx_stage_id(const fsdp_ctx *ctx);
/* (stage ABI 1.2) The running stage's `with:` map as the recipe gives it (NULL outside a stage or when it
 * has none): inside a train-steps callback or hook, train-steps' settings (save_path, steps, save_every,
 * eval_every, ...); read them with fsdp_arg_* and the stage's documented defaults. */
const fsdp_value *fsdp_ctx_stage_args(const fsdp_ctx *ctx);
/* This run's id ("20261125T043512Z-1a2b3c4d": its start time and 32 random bits, the same on every
 * rank) and its start time (ISO 8601, UTC, milliseconds): in every metrics line and the report. */
const char *fsdp_ctx_run_id(const fsdp_ctx *ctx);
const char *fsdp_ctx_run_start(const fsdp_ctx *ctx);

/* Log a line on stderr, prefixed with the rank, honouring -q / -v. */
void fsdp_log(fsdp_ctx *ctx, fsdp_log_level level, const char *fmt, ...) FSDP_PRINTF(3, 4);

/* Record a metric of the running stage; it appears in the run report. */
void fsdp_ctx_metric(fsdp_ctx *ctx, const char *name, double value);
void fsdp_ctx_metric_str(fsdp_ctx *ctx, const char *name, const char *value);

/* Progress of a long stage: a bar with rate and ETA on a terminal, periodic plain lines
 * otherwise. Only rank 0 draws. `unit` names what is counted ("steps", "B"). */
typedef struct fsdp_progress fsdp_progress;
fsdp_progress *fsdp_progress_begin(fsdp_ctx *ctx, const char *label, double total, const char *unit);
void fsdp_progress_update(fsdp_progress *p, double done, const char *status);
void fsdp_progress_end(fsdp_progress *p);

/* Named state the DAG contract talks about ("params", "full_params", "optimizer", ...):
 * whether it is present now. Built-in and plugin stages set what they provide. */
int fsdp_ctx_has_state(const fsdp_ctx *ctx, const char *name);
void fsdp_ctx_set_state(fsdp_ctx *ctx, const char *name, int present);

/* Opaque attachments a plugin may keep across stages of one run, by name. The destructor
 * (may be NULL) runs when the context is destroyed or the slot is replaced. */
int fsdp_ctx_attach(fsdp_ctx *ctx, const char *name, void *ptr, void (*destroy)(void *));
void *fsdp_ctx_attached(const fsdp_ctx *ctx, const char *name);

#ifdef __cplusplus
}
#endif
#endif
