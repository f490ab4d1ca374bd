/* Stage `offload`: keep the optimizer moments (and with `params: true` the fp32 master
 * weights and their gradients) in host memory; the optimizer step for them then runs on the host
 * with the CPU AdamW.
 *
 * On `device: cpu` every buffer already lives in host memory, so the stage records the
 * placement and training proceeds with the same kernels: results are identical to a run
 * without it. On the GPU (a state on the device, or runtime.device cuda) the offloaded arrays move
 * to pinned host memory now (s->offloaded / s->offload_params), and moments allocated later
 * (state_alloc_optimizer) are allocated there; the rest stays on the GPU. The GPU trainer computes from
 * weights on the device: with params: true on the GPU, a later train-steps or eval is refused (the
 * recipe check of run/checks.c, and train_backend_open for an offload in an earlier recipe)
 * instead of running on the CPU.
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
    int on_gpu = 0;
    int rc = stage_on_gpu(ctx, &on_gpu, err);
    if (rc) return rc;
    s->offloaded = 1;
    s->offload_params = fsdp_arg_bool(with, "params", 0);
    int moved = 0;
    if ((on_gpu && s->layout == STATE_SHARDED) || state_on_device(s)) {
        dev_ctx *d;
        if ((rc = stage_device(ctx, &d, err))) return rc;
        /* state_to_device keeps what offload names in pinned host memory */
        if ((rc = state_to_device(s, d, err))) return fsdp_err_prefix(err, "offload");
        moved = 1;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < s->n; i++)
        bytes += state_param_local_numel(&s->p[i]) * sizeof(float) * (s->offload_params ? 3 : 2);
    fsdp_ctx_metric(ctx, "host_bytes", (double)bytes);
    fsdp_ctx_metric_str(ctx, "device", moved ? "cuda" : "cpu");
    if (moved)
        fsdp_log(ctx, FSDP_LOG_INFO, "optimizer state%s kept in pinned host memory (%.1f MiB on this rank)",
                 s->offload_params ? " and master weights" : "", (double)bytes / (1 << 20));
    else /* nothing to move: say so rather than look like it did something */
        fsdp_log(ctx, FSDP_LOG_INFO,
                 "offload on the CPU: the optimizer state%s (%.1f MiB on this rank) already lives in host memory and "
                 "stays there; nothing moves and training is unchanged (offload matters on a GPU)",
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
