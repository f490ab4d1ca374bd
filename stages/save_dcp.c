/* Stage `save-dcp`: a PyTorch-loadable DCP checkpoint of the model (and optimizer) in
 * torchtitan's key layout. Every rank writes its shards; rank 0 writes `.metadata` last and
 * atomically, so an interrupted save never looks like a checkpoint. Refuses to overwrite an
 * existing checkpoint unless asked; an overwrite writes the new data files beside the old ones and
 * replaces `.metadata` last, so the path holds the old or the new checkpoint at every instant
 * (ckpt/dcp_commit.c). Stale temporaries of interrupted saves to the path are removed and logged. `async: true` snapshots the shards to host memory and
 * writes in a background thread while later stages run; the save is committed (`.metadata` written
 * and durable) at the first stage boundary or training step after every rank has written its file
 * (ctx_poll_finishers), so a later stage may load it and a kill after that point keeps it; a
 * load-ckpt waits for it, the next async save commits it first (one in flight), and the run's end
 * reports its errors. A state on the GPU is downloaded chunk by chunk into a ring of pinned
 * staging buffers (ckpt/ckpt_pipe.h): synchronously, each chunk is written to the data file while
 * the next ones download; with `async` the chunks are copied into the writer's host snapshot, and
 * the stage returns once every download has completed, so later stages may change the device state
 * at once.
 *
 * Keys: parameters as model.state_dict() names them, or under `prefix` ("model.": what
 * dcp.load({"model": model.state_dict()}) reads); optimizer.* and train_state.* keys as torchtitan's.
 * Every parameter must hold a value (one declared with init none and never loaded or copied is an
 * error naming it, before anything is written); each is written in its own dtype.
 *
 * Layouts of other trainers (e.g. Bagel PR #240's step-0 checkpoint: model.<key> and ema_model.<key>
 * of every parameter, a fresh AdamW's param group, metadata.pt; recipes/bagel_pr240_step0.yaml):
 *   aliases: [PREFIX, ...]  every parameter also under each prefix ("" or dotted ending in '.', none
 *       equal to prefix): entries whose storage records in .metadata are the parameter's own (same
 *       file, offset, length), so no byte is written twice; parameters only. Keys that collide (an
 *       alias that gives a key another entry has) are an error naming both, before anything is written.
 *   train_state: false  no train_state.* entries.
 *   fresh_optimizer: {prefix, lr, initial_lr, betas, eps, weight_decay}  the non-tensor entries of a
 *       fresh torch.optim.AdamW's state_dict() over every parameter, flattened as dcp.save does:
 *       <prefix>param_groups.0.<option> (ckpt/fresh_optim.h), numbers with the type given (0 an int,
 *       0.0 a float); only for a state without optimizer state at step 0, and no other key may lie
 *       under its prefix (default "optimizer."); written once, by rank 0.
 *   files: {NAME: VALUE, ...}  torch.save(VALUE) beside .metadata for plain YAML values (map -> dict,
 *       list -> list, int, float, bool, null -> None, string -> str), written by rank 0 after the data
 *       files and before .metadata, each atomically (ckpt/dcp_side.h); NAME a plain file name.
 * Without overwrite, a path that already holds a checkpoint is refused at validation (fsdp-run
 * validate, and before the first stage runs: run/checks_outputs.c) as well as here.
 *
 * with: path (required), optimizer (bool, true), overwrite (bool, false), async (bool, false), prefix,
 *       aliases (list), train_state (bool, true), fresh_optimizer (map), files (map) */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_steps.h"
#include "ckpt/state_io.h"
#include "runtime/ctx_impl.h"
#include "stages/save_dcp_opts.h"
#include "stages/stages.h"
#include "stages/train_hooks.h"
#include "model/mt_state.h"

static const fsdp_param_spec PARAMS[] = {
    {"path", FSDP_T_STRING, 1, NULL, NULL, "checkpoint directory"},
    {"optimizer", FSDP_T_BOOL, 0, "true", NULL, "include the optimizer state when there is one"},
    {"overwrite", FSDP_T_BOOL, 0, "false", NULL, "replace an existing checkpoint at path"},
    {"async", FSDP_T_BOOL, 0, "false", NULL, "write in the background after a host snapshot"},
    {"prefix", FSDP_T_STRING, 0, NULL, NULL,
     "key prefix of the parameters (none: as model.state_dict() names them; 'model.': "
     "dcp.load({'model': model.state_dict()}))"},
    {"aliases", FSDP_T_LIST, 0, NULL, NULL,
     "more key prefixes every parameter is written under too ('ema_model.'), sharing its bytes: no data "
     "written twice"},
    {"train_state", FSDP_T_BOOL, 0, "true", NULL, "write the train_state.* entries (step, tokens, data position)"},
    {"fresh_optimizer", FSDP_T_MAP, 0, NULL, NULL,
     "{prefix: 'optimizer.', lr, initial_lr, betas, eps, weight_decay}: the param group entries of a fresh "
     "torch.optim.AdamW over every parameter (state without optimizer state, step 0)"},
    {"files", FSDP_T_MAP, 0, NULL, NULL,
     "{NAME: VALUE}: torch.save(VALUE) files beside .metadata, e.g. {metadata.pt: {train_step: 0}}"},
    {"layout", FSDP_T_STRING, 0, NULL, NULL,
     "write the checkpoint in a trainer's layout (torchtitan-0.3, olmo-core-3, fms-1.13, megatron-fsdp-0.6, "
     "accelerate-1.15, olmo-0.6, deepspeed-zero1|2|3; as ckpt convert --to writes it)"},
    {"options", FSDP_T_MAP, 0, NULL, NULL,
     "{NAME: VALUE}: settings the layout keeps and fsdp-run's state lacks (olmo-0.6 max_grad_norm, deepspeed-zero1|2 "
     "gradient_clipping, deepspeed-zero3 sub_group_size)"},
    {"world", FSDP_T_INT, 0, "0", NULL,
     "with layout: the ranks the checkpoint is written for (0: this run's; DeepSpeed loads on that many only)"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params|full_params", NULL};
static const char *const PROVIDES[] = {"checkpoint", NULL};

/* An async save in flight: the writer, and for a periodic save its keep_last policy. */
typedef struct save_job {
    sio_async *a;
    char *base;        /* keep_last: the directory of the step-<N> checkpoints (NULL: none) */
    int64_t keep_last, step;
    double t_begin;
} save_job;

static void async_destroy(void *p) {
    save_job *j = p;
    sio_async_free(j->a);
    free(j->base);
    free(j);
}

static void note_warn(void *ctx, const char *msg) { fsdp_log(ctx, FSDP_LOG_WARN, "%s", msg); }

/* keep_last after step `step` of base was committed: rank 0 removes what goes (ckpt/ckpt_steps.h) */
static void prune(fsdp_ctx *ctx, const char *base, int64_t keep, int64_t step) {
    if (keep <= 0 || comm_rank(stage_comm(ctx)) != 0) return;
    int n = ckpt_steps_prune(base, keep, step, note_warn, ctx);
    if (n) fsdp_log(ctx, FSDP_LOG_INFO, "keep_last %lld: removed %d older checkpoint(s) from %s", (long long)keep, n, base);
}

static int async_finish(fsdp_ctx *ctx, void *p, fsdp_err *err) {
    save_job *j = p;
    double t0 = stage_now();
    int rc = sio_save_finish(j->a, err);
    if (!rc) {
        fsdp_log(ctx, FSDP_LOG_INFO, "async save-dcp %s committed (%.2fs after it began, waited %.2fs)",
                 sio_async_path(j->a), stage_now() - j->t_begin, stage_now() - t0);
        if (j->base) prune(ctx, j->base, j->keep_last, j->step);
        rc = train_hooks_event(ctx, FSDP_HOOK_AFTER_SAVE, j->step, sio_async_path(j->a), err);
    }
    return rc;
}

static int async_poll(fsdp_ctx *ctx, void *p, int *done, fsdp_err *err) {
    (void)ctx;
    return sio_save_poll(((save_job *)p)->a, done, err);
}

/* The staging sink for a state on the GPU (*sink NULL for a host state). Every rank takes part in
 * the saves, so a failure to set it up is agreed on before any collective. */
static int staging(fsdp_ctx *ctx, fsdp_state *s, stage_ckpt_sink *st, const ckpt_sink **sink, fsdp_err *err) {
    memset(st, 0, sizeof *st);
    *sink = NULL;
    if (!state_on_device(s)) return 0; /* the same on every rank */
    int rc = stage_ckpt_sink_create(s->dev, st, err);
    int who;
    fsdp_err e2;
    int agreed = comm_agree(stage_comm(ctx), rc, &who, &e2);
    if (!rc && agreed) rc = fsdp_err_set(err, agreed, "save-dcp: rank %d could not set up its GPU staging", who);
    if (rc) stage_ckpt_sink_free(st);
    else *sink = &st->sink;
    return rc;
}

/* The synchronous save with the parameters' key prefix (NULL: none). */
static int save_to(fsdp_ctx *ctx, fsdp_state *s, const char *path, const sio_save_opts *o, fsdp_err *err) {
    int rc = mt_state_check_values(s, "save-dcp", err);
    if (rc) return rc;
    double t0 = stage_now();
    size_t streamed = state_deferred_count(s);
    stage_ckpt_sink st;
    const ckpt_sink *sink;
    stage_sweep_stale(ctx, path);
    if ((rc = staging(ctx, s, &st, &sink, err))) return rc;
    rc = sio_save_staged(s, stage_comm(ctx), path, o, sink, err);
    stage_ckpt_sink_free(&st);
    if (!rc) {
        /* each parameter in its dtype, the AdamW moments in f32 */
        size_t bytes = 0;
        for (size_t i = 0; i < s->n; i++)
            bytes += state_param_local_numel(&s->p[i]) *
                     (fsdp_dtype_size(s->p[i].dtype) + (o->optimizer && s->has_optimizer ? 8 : 0));
        double el = stage_now() - t0;
        fsdp_log(ctx, FSDP_LOG_INFO, "saved %s (step %lld) in %.2fs, %.2f GB/s from this rank", path,
                 (long long)s->train_step, el, el > 0 ? (double)bytes / el / 1e9 : 0);
        fsdp_ctx_metric(ctx, "bytes_written", (double)bytes);
        fsdp_ctx_metric(ctx, "seconds_write", el);
        /* parameters whose rows went from their producer to the file without being held */
        fsdp_ctx_metric(ctx, "params_streamed", (double)streamed);
        rc = train_hooks_event(ctx, FSDP_HOOK_AFTER_SAVE, s->train_step, path, err);
    }
    return rc;
}

int stage_save_dcp_to(fsdp_ctx *ctx, fsdp_state *s, const char *path, int optimizer, int overwrite, fsdp_err *err) {
    sio_save_opts o = {.optimizer = optimizer, .overwrite = overwrite};
    return save_to(ctx, s, path, &o, err);
}

/* Starts an async save of s to path (a previous one of this run is committed first: one save in
 * flight); it is committed by ctx_poll_finishers as soon as every rank has written its file. */
static int save_async(fsdp_ctx *ctx, fsdp_state *s, const char *path, const sio_save_opts *o, const char *base,
                      int64_t keep_last, fsdp_err *err) {
    int rc = mt_state_check_values(s, "save-dcp", err);
    if (!rc) rc = ctx_run_finisher(ctx, "save-dcp.async", err);
    if (rc) return rc;
    save_job *j = calloc(1, sizeof *j);
    if (!j || (base && !(j->base = strdup(base)))) {
        free(j);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    j->keep_last = keep_last;
    j->step = s->train_step;
    double t0 = j->t_begin = stage_now();
    stage_ckpt_sink st;
    const ckpt_sink *sink;
    stage_sweep_stale(ctx, path);
    /* deferred values are produced into the save's snapshot */
    fsdp_ctx_metric(ctx, "params_streamed", (double)state_deferred_count(s));
    if (!(rc = staging(ctx, s, &st, &sink, err))) {
        rc = sio_save_begin_staged(s, stage_comm(ctx), path, o, sink, &j->a, err);
        stage_ckpt_sink_free(&st);
    }
    if (rc) {
        async_destroy(j);
        return rc;
    }
    if (sink) fsdp_ctx_metric(ctx, "seconds_download", stage_now() - t0);
    fsdp_ctx_metric(ctx, "seconds_blocking", stage_now() - t0);
    fsdp_log(ctx, FSDP_LOG_INFO, "save-dcp %s continues in the background", path);
    if ((rc = ctx_add_finisher(ctx, "save-dcp.async", j, async_finish, async_destroy, err))) return rc;
    ctx_set_finisher_poll(ctx, async_poll);
    return 0;
}

int stage_save_dcp_step(fsdp_ctx *ctx, fsdp_state *s, const char *base, const stage_save_policy *p, fsdp_err *err) {
    char dir[4200];
    ckpt_steps_dir(dir, sizeof dir, base, s->train_step);
    sio_save_opts o = {.optimizer = 1, .overwrite = p->overwrite};
    if (p->async) return save_async(ctx, s, dir, &o, base, p->keep_last, err);
    int rc = save_to(ctx, s, dir, &o, err);
    if (!rc) prune(ctx, base, p->keep_last, s->train_step);
    return rc;
}

int stage_wait_saves(fsdp_ctx *ctx, fsdp_err *err) { return ctx_run_finisher(ctx, "save-dcp.async", err); }

/* layout: the save in fsdp-run's layout into <path>.fsdp-canon, then written at path in the layout. */
static int save_layout(fsdp_ctx *ctx, fsdp_state *s, const fsdp_value *with, const char *path, fsdp_err *err) {
    char staged[4400];
    snprintf(staged, sizeof staged, "%s.fsdp-canon", path);
    sio_save_opts o = {.optimizer = fsdp_arg_bool(with, "optimizer", 1), .overwrite = 1,
                       .no_train_state = !fsdp_arg_bool(with, "train_state", 1)};
    int rc = save_to(ctx, s, staged, &o, err);
    return rc ? rc : stage_save_layout(ctx, with, staged, path, err);
}

static int save_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: no model in the context");
    const char *path = fsdp_arg_str(with, "path", "");
    const char *layout = fsdp_arg_str(with, "layout", NULL);
    if (layout && strcmp(layout, "torchtitan-0.2") && strcmp(layout, "torchtitan")) return save_layout(ctx, s, with, path, err);
    sdcp_opts so;
    int rc = sdcp_opts_parse(with, &so, err);
    if (rc) return rc;
    if (!fsdp_arg_bool(with, "async", 0)) rc = save_to(ctx, s, path, &so.o, err);
    else rc = save_async(ctx, s, path, &so.o, NULL, 0, err);
    sdcp_opts_free(&so);
    return rc;
}

/* The parameters the schema cannot check (aliases, fresh_optimizer, files), at validation. */
static int save_check(const fsdp_value *with, fsdp_err *err) {
    sdcp_opts so;
    int rc = stage_save_layout_check(with, err);
    if (rc) return rc;
    rc = sdcp_opts_parse(with, &so, err);
    if (!rc) sdcp_opts_free(&so);
    return rc;
}

const fsdp_stage_desc stage_save_dcp = {
    FSDP_STAGE_DESC_INIT,
    "save-dcp",
    "PyTorch DCP checkpoint (torchtitan keys); .metadata last and atomic; optional async",
    PARAMS,
    NEEDS,
    PROVIDES,
    save_run,
    save_check,
};
