/* Stage `offload`: keep the optimizer moments (and with `params: true` the fp32 master
 * weights) in host memory; the optimizer step then runs on the host with the CPU AdamW.
 * On `device: cpu` every buffer already lives in host memory, so the stage records the
 * placement and training proceeds with the same kernels: results are identical to a run
 * without it. (With the CUDA backend it moves the buffers to pinned host memory.)
 *
 * with: params (bool, default false) */
#include "stages/stages.h"

static const fsdp_param_spec PARAMS[] = {
    {"params", FSDP_T_BOOL, 0, "false", NULL, "also keep the fp32 master weights on the host"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params", NULL};
static const char *const PROVIDES[] = {"offload", NULL};

static int offload_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "offload: no model in the context");
    s->offloaded = 1;
    s->offload_params = fsdp_arg_bool(with, "params", 0);
    size_t bytes = 0;
    for (size_t i = 0; i < s->n; i++)
        bytes += state_param_local_numel(&s->p[i]) * sizeof(float) * (s->offload_params ? 3 : 2);
    fsdp_ctx_metric(ctx, "host_bytes", (double)bytes);
    fsdp_log(ctx, FSDP_LOG_INFO, "optimizer state%s kept in host memory (%.1f MiB on this rank)",
             s->offload_params ? " and master weights" : "", (double)bytes / (1 << 20));
    return 0;
}

const fsdp_stage_desc stage_offload = {
    FSDP_STAGE_DESC_INIT,
    "offload",
    "keep optimizer state (and optionally master weights) in host memory; the step runs on the CPU",
    PARAMS,
    NEEDS,
    PROVIDES,
    offload_run,
    NULL,
};
