/* Stage `init-meta`: declares every parameter of the model config and materialises only this
 * rank's Shard(0) rows, filled by the model's init rules from a counter-based RNG keyed by
 * (seed, parameter, element): identical weights for every world size. No rank ever
 * allocates a full parameter.
 *
 * with: seed (int, default runtime.seed), dtype (f32|bf16) */
#include "stages/stages.h"

static const char *const DTYPES[] = {"f32", "bf16", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"seed", FSDP_T_INT, 0, NULL, NULL, "init seed (default: runtime.seed)"},
    {"dtype", FSDP_T_STRING, 0, "f32", DTYPES, "parameter dtype (bf16 rounds the f32 draw)"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const PROVIDES[] = {"params", NULL};

static int init_meta_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    llama_config cfg;
    int rc = stage_model_config(ctx, &cfg, err);
    if (rc) return rc;
    double t0 = stage_now();
    llama_params table;
    fsdp_state *s;
    if ((rc = stage_state_from_config(ctx, &cfg, STATE_SHARDED, &table, &s, err))) return rc;
    fsdp_dtype dt = fsdp_dtype_from_name(fsdp_arg_str(with, "dtype", "f32"));
    rc = stage_init_values(s, &table, stage_seed(ctx, with), dt, err);
    size_t local = 0;
    for (size_t i = 0; i < s->n; i++) local += state_param_local_numel(&s->p[i]);
    if (!rc) {
        double el = stage_now() - t0;
        fsdp_ctx_metric(ctx, "params", (double)table.total);
        fsdp_ctx_metric(ctx, "local_params", (double)local);
        fsdp_ctx_metric(ctx, "seconds_init", el);
        fsdp_log(ctx, FSDP_LOG_INFO, "init-meta: %s, %lld parameters (%zu on this rank) in %.2fs", cfg.preset[0] ? cfg.preset : "custom",
                 (long long)table.total, local, el);
    }
    llama_params_free(&table);
    return rc;
}

const fsdp_stage_desc stage_init_meta = {
    FSDP_STAGE_DESC_INIT,
    "init-meta",
    "declare every parameter and materialise only the local shard (world-size invariant init)",
    PARAMS,
    NULL,
    PROVIDES,
    init_meta_run,
    NULL,
};
