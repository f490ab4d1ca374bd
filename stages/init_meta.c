/* Stage `init-meta`: declares every parameter of the model config and materialises only this
 * rank's Shard(0) rows, filled by the model's init rules from a counter-based RNG keyed by
 * (seed, parameter, element): identical weights for every world size. No rank ever
 * allocates a full parameter.
 *
 * Any model (model/mt_spec.h); parameters whose init rule is none are left without a value.
 *
 * with: seed (int, default runtime.seed), dtype (auto|f32|bf16|f16; auto: each parameter's own) */
#include "stages/stages.h"

static const char *const PROVIDES[] = {"params", NULL};

static int init_meta_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = NULL;
    double t0 = stage_now();
    int rc = stage_init_model(ctx, with, STATE_SHARDED, &s, err);
    size_t local = 0;
    for (size_t i = 0; s && i < s->n; i++) local += state_param_local_numel(&s->p[i]);
    if (!rc) {
        double el = stage_now() - t0;
        int64_t total = mt_total(s->model);
        fsdp_ctx_metric(ctx, "params", (double)total);
        fsdp_ctx_metric(ctx, "local_params", (double)local);
        fsdp_ctx_metric(ctx, "seconds_init", el);
        fsdp_ctx_metric(ctx, "params_deferred", (double)state_deferred_count(s));
        fsdp_log(ctx, FSDP_LOG_INFO, "init-meta: %s, %zu tensors, %lld parameters (%zu on this rank) in %.2fs",
                 mt_kind(s->model), s->n, (long long)total, local, el);
    }
    return rc;
}

const fsdp_stage_desc stage_init_meta = {
    FSDP_STAGE_DESC_INIT,
    "init-meta",
    "declare every parameter and materialise only the local shard (world-size invariant init)",
    stage_init_params,
    NULL,
    PROVIDES,
    init_meta_run,
    NULL,
};
