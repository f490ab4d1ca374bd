/* Stage `init-cpu`: the FSDP1 path. Rank 0 materialises the full model on the CPU with the
 * same init rules as init-meta (so init-cpu + shard == init-meta, bit for bit); the other
 * ranks hold nothing until `shard`. Post-init weight copies (`transform`) run on the full
 * parameters in between.
 *
 * with: seed (int, default runtime.seed), dtype (f32|bf16) */
#include "stages/stages.h"

static const char *const DTYPES[] = {"f32", "bf16", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"seed", FSDP_T_INT, 0, NULL, NULL, "init seed (default: runtime.seed)"},
    {"dtype", FSDP_T_STRING, 0, "f32", DTYPES, "parameter dtype (bf16 rounds the f32 draw)"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const PROVIDES[] = {"full_params", NULL};

static int init_cpu_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    llama_config cfg;
    int rc = stage_model_config(ctx, &cfg, err);
    if (rc) return rc;
    double t0 = stage_now();
    llama_params table;
    fsdp_state *s;
    if ((rc = stage_state_from_config(ctx, &cfg, STATE_FULL, &table, &s, err))) return rc;
    fsdp_dtype dt = fsdp_dtype_from_name(fsdp_arg_str(with, "dtype", "f32"));
    rc = stage_init_values(s, &table, stage_seed(ctx, with), dt, err);
    if (!rc) {
        double el = stage_now() - t0;
        fsdp_ctx_metric(ctx, "params", (double)table.total);
        fsdp_ctx_metric(ctx, "seconds_init", el);
        if (fsdp_ctx_rank(ctx) == 0)
            fsdp_log(ctx, FSDP_LOG_INFO, "init-cpu: %s, %lld parameters materialised on rank 0 in %.2fs (%.2f GB/s)",
                     cfg.preset[0] ? cfg.preset : "custom", (long long)table.total, el,
                     el > 0 ? (double)table.total * 4 / el / 1e9 : 0);
    }
    llama_params_free(&table);
    return rc;
}

const fsdp_stage_desc stage_init_cpu = {
    FSDP_STAGE_DESC_INIT,
    "init-cpu",
    "FSDP1-style: rank 0 materialises the full model on the CPU (same init rules as init-meta)",
    PARAMS,
    NULL,
    PROVIDES,
    init_cpu_run,
    NULL,
};
