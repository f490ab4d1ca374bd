/* Stage `shard`: full parameters on rank 0 (after init-cpu) -> FSDP2 Shard(0) shards on
 * every rank, scattered over the communicator; the full copy is freed. On runtime.device cuda the
 * shards then move to each rank's GPU.
 *
 * with: (none) */
#include "stages/stages.h"

static const char *const NEEDS[] = {"full_params", NULL};
static const char *const PROVIDES[] = {"params", NULL};

static int shard_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)with;
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "shard: no model in the context (run init-cpu first)");
    if (s->layout == STATE_SHARDED)
        return fsdp_err_set(err, FSDP_E_INVALID, "shard: the parameters are already sharded");
    double t0 = stage_now();
    int rc = state_shard(s, stage_shard_comm(ctx), err);
    if (rc) return rc;
    int on_gpu = 0;
    if ((rc = stage_place_state(ctx, s, &on_gpu, err))) return rc;
    fsdp_ctx_metric_str(ctx, "device", on_gpu ? "cuda" : "cpu");
    size_t local = 0;
    for (size_t i = 0; i < s->n; i++) local += state_param_local_numel(&s->p[i]);
    fsdp_ctx_set_state(ctx, "full_params", 0);
    fsdp_ctx_metric(ctx, "local_params", (double)local);
    fsdp_log(ctx, FSDP_LOG_INFO, "sharded %zu parameters over %d ranks in %.2fs (%zu values on rank %d%s)", s->n,
             s->world, stage_now() - t0, local, s->rank, on_gpu ? ", on its GPU" : "");
    return 0;
}

const fsdp_stage_desc stage_shard = {
    FSDP_STAGE_DESC_INIT,
    "shard",
    "full parameters on rank 0 -> Shard(0) shards on every rank (frees the full copy)",
    NULL,
    NEEDS,
    PROVIDES,
    shard_run,
    NULL,
};
