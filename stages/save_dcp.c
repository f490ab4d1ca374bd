/* Stage `save-dcp`: a PyTorch-loadable DCP checkpoint of the model (and optimizer) in
 * torchtitan's key layout. Every rank writes its shards; rank 0 writes `.metadata` last and
 * atomically, so an interrupted save never looks like a checkpoint. Refuses to overwrite an
 * existing checkpoint unless asked; an overwrite writes the new data files beside the old ones and
 * replaces `.metadata` last, so the path holds the old or the new checkpoint at every instant
 * (ckpt/dcp_commit.c). Stale temporaries of interrupted saves to the path are removed and logged. `async: true` snapshots the shards to host memory and
 * writes in a background thread while later stages run; the run waits for it at the end
 * and reports its errors. A state on the GPU is downloaded chunk by chunk into a ring of pinned
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
 * with: path (required), optimizer (bool, true), overwrite (bool, false), async (bool, false), prefix */
#include <string.h>

#include "ckpt/state_io.h"
#include "runtime/ctx_impl.h"
#include "stages/stages.h"

static const fsdp_param_spec PARAMS[] = {
    {"path", FSDP_T_STRING, 1, NULL, NULL, "checkpoint directory"},
    {"optimizer", FSDP_T_BOOL, 0, "true", NULL, "include the optimizer state when there is one"},
    {"overwrite", FSDP_T_BOOL, 0, "false", NULL, "replace an existing checkpoint at path"},
    {"async", FSDP_T_BOOL, 0, "false", NULL, "write in the background after a host snapshot"},
    {"prefix", FSDP_T_STRING, 0, NULL, NULL,
     "key prefix of the parameters (none: as model.state_dict() names them; 'model.': "
     "dcp.load({'model': model.state_dict()}))"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params|full_params", NULL};
static const char *const PROVIDES[] = {"checkpoint", NULL};

static void async_destroy(void *p) { sio_async_free(p); }

static int async_finish(fsdp_ctx *ctx, void *p, fsdp_err *err) {
    double t0 = stage_now();
    int rc = sio_save_finish(p, err);
    if (!rc) fsdp_log(ctx, FSDP_LOG_INFO, "async save-dcp finished (waited %.2fs)", stage_now() - t0);
    return rc;
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
    int rc = state_check_values(s, "save-dcp", err);
    if (rc) return rc;
    double t0 = stage_now();
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
    }
    return rc;
}

int stage_save_dcp_to(fsdp_ctx *ctx, fsdp_state *s, const char *path, int optimizer, int overwrite, fsdp_err *err) {
    sio_save_opts o = {optimizer, overwrite, NULL};
    return save_to(ctx, s, path, &o, err);
}

static int save_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: no model in the context");
    const char *path = fsdp_arg_str(with, "path", "");
    int opt = fsdp_arg_bool(with, "optimizer", 1), ow = fsdp_arg_bool(with, "overwrite", 0);
    sio_save_opts o = {opt, ow, fsdp_arg_str(with, "prefix", NULL)};
    if (!fsdp_arg_bool(with, "async", 0)) return save_to(ctx, s, path, &o, err);
    /* a previous async save of this run finishes first */
    int rc = state_check_values(s, "save-dcp", err);
    if (!rc) rc = ctx_run_finisher(ctx, "save-dcp.async", err);
    if (rc) return rc;
    sio_async *a;
    double t0 = stage_now();
    stage_ckpt_sink st;
    const ckpt_sink *sink;
    stage_sweep_stale(ctx, path);
    if ((rc = staging(ctx, s, &st, &sink, err))) return rc;
    rc = sio_save_begin_staged(s, stage_comm(ctx), path, &o, sink, &a, err);
    stage_ckpt_sink_free(&st);
    if (rc) return rc;
    if (sink) fsdp_ctx_metric(ctx, "seconds_download", stage_now() - t0);
    fsdp_ctx_metric(ctx, "seconds_blocking", stage_now() - t0);
    fsdp_log(ctx, FSDP_LOG_INFO, "save-dcp %s continues in the background", path);
    return ctx_add_finisher(ctx, "save-dcp.async", a, async_finish, async_destroy, err);
}

const fsdp_stage_desc stage_save_dcp = {
    FSDP_STAGE_DESC_INIT,
    "save-dcp",
    "PyTorch DCP checkpoint (torchtitan keys); .metadata last and atomic; optional async",
    PARAMS,
    NEEDS,
    PROVIDES,
    save_run,
    NULL,
};
