/* Stage `init-cpu`: the FSDP1 path. Rank 0 materialises the full model on the CPU with the
 * same init rules as init-meta (so init-cpu + shard == init-meta, bit for bit); the other
 * ranks hold nothing until `shard`. Post-init weight copies (`transform`) run on the full
 * parameters in between.
 *
 * Any model (model/mt_spec.h): parameters whose init rule is none are left without a value (NaN
 * rows) for a load-ckpt or a transform to fill.
 *
 * with: seed (int, default runtime.seed), dtype (auto|f32|bf16|f16; auto: each parameter's own) */
#include "stages/stages.h"

static const char *const PROVIDES[] = {"full_params", NULL};

static int init_cpu_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = NULL;
    double t0 = stage_now();
    int rc = stage_init_model(ctx, with, STATE_FULL, &s, err);
    if (!rc) {
        double el = stage_now() - t0;
        int64_t total = mt_total(s->model);
        fsdp_ctx_metric(ctx, "params", (double)total);
        fsdp_ctx_metric(ctx, "seconds_init", el);
        if (fsdp_ctx_rank(ctx) == 0)
            fsdp_log(ctx, FSDP_LOG_INFO, "init-cpu: %s, %zu tensors, %lld parameters materialised on rank 0 in %.2fs "
                     "(%.2f GB/s)", mt_kind(s->model), s->n, (long long)total, el,
                     el > 0 ? (double)total * 4 / el / 1e9 : 0);
    }
    return rc;
}

const fsdp_stage_desc stage_init_cpu = {
    FSDP_STAGE_DESC_INIT,
    "init-cpu",
    "FSDP1-style: rank 0 materialises the full model on the CPU (same init rules as init-meta)",
    stage_init_params,
    NULL,
    PROVIDES,
    init_cpu_run,
    NULL,
};
