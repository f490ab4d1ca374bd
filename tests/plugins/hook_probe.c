/* Test plugin of the hooks of stage ABI 1.2 (include/fsdp/callbacks.h): stage `hook-probe` registers
 *   - event hooks of every kind, appending "KIND STEP PATH" to `file` (rank 0);
 *   - a pre-update hook that multiplies each update's learning rate by `lr_scale`, reads every trained
 *     parameter's gradient rows (fsdp_param_read_grad) to recompute the global gradient norm (its local
 *     sum of squares all-reduced) into the step's metric probe.grad_norm, and records the settings of the
 *     running train-steps it reads (probe.steps, probe.save_every) and probe.step (the step's number);
 *     rank `skip_on_rank` skips every update; rank r's scale is lr_scale + r x `scale_per_rank`;
 *   - a callback that sets probe.after (the step) in the same line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/callbacks.h"
#include "fsdp/collectives.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {{"file", FSDP_T_STRING, 1, NULL, NULL, "where the events go"},
                                         {"lr_scale", FSDP_T_FLOAT, 0, "1", NULL, "each update's lr times this"},
                                         {"skip_on_rank", FSDP_T_INT, 0, "-1", NULL, "this rank skips every update"},
                                         {"scale_per_rank", FSDP_T_FLOAT, 0, "0", NULL, "lr_scale + rank x this"},
                                         {NULL, 0, 0, NULL, NULL, NULL}};

typedef struct probe {
    char file[1024];
    double lr_scale, scale_per_rank;
    int64_t skip_on_rank;
} probe;

static const char *const KINDS[] = {"train_start", "train_end", "after_save", "after_load"};

static int on_event(fsdp_ctx *ctx, const fsdp_hook_event *ev, void *user, fsdp_err *err) {
    probe *p = user;
    if (fsdp_ctx_rank(ctx) != 0) return 0;
    FILE *f = fopen(p->file, "a");
    if (!f) return fsdp_err_set(err, FSDP_E_IO, "hook-probe: cannot open %s", p->file);
    fprintf(f, "%s %lld %s\n", KINDS[ev->kind], (long long)ev->step, ev->path ? ev->path : "-");
    fclose(f);
    return 0;
}

static int grad_norm(fsdp_ctx *ctx, double *out, fsdp_err *err) {
    double ss = 0;
    float *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < fsdp_param_count(ctx) && !rc; i++) {
        fsdp_param_info in;
        if ((rc = fsdp_param_info_at(ctx, i, &in, err)) || fsdp_param_trainable(ctx, i) != 1) continue;
        size_t n = (size_t)(in.rows * in.row_numel);
        if (n > cap) {
            float *nb = realloc(buf, n * sizeof *nb);
            if (!nb) rc = fsdp_err_set(err, FSDP_E_NOMEM, "hook-probe: out of memory");
            else buf = nb, cap = n;
        }
        if (!rc) rc = fsdp_param_read_grad(ctx, i, in.row0, in.rows, FSDP_DT_F32, buf, err);
        for (size_t k = 0; !rc && k < n; k++) ss += (double)buf[k] * buf[k];
    }
    free(buf);
    if (!rc) rc = fsdp_allreduce(ctx, &ss, 1, FSDP_DT_F64, FSDP_SUM, err);
    *out = sqrt(ss);
    return rc;
}

static int pre_update(fsdp_ctx *ctx, const fsdp_step_metrics *m, fsdp_update *u, void *user, fsdp_err *err) {
    probe *p = user;
    u->lr_scale = p->lr_scale + p->scale_per_rank * fsdp_ctx_rank(ctx);
    u->skip = fsdp_ctx_rank(ctx) == p->skip_on_rank;
    double gn = 0;
    const fsdp_value *t = fsdp_ctx_stage_args(ctx);
    int rc = grad_norm(ctx, &gn, err);
    if (!rc) rc = fsdp_step_metric(ctx, "probe.grad_norm", gn, err);
    if (!rc) rc = fsdp_step_metric(ctx, "probe.step", (double)m->step, err);
    if (!rc) rc = fsdp_step_metric(ctx, "probe.steps", (double)fsdp_arg_int(t, "steps", -1), err);
    if (!rc) rc = fsdp_step_metric(ctx, "probe.save_every", (double)fsdp_arg_int(t, "save_every", 0), err);
    return rc;
}

static int after_step(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user, fsdp_err *err) {
    (void)request, (void)user;
    return m->is_eval ? 0 : fsdp_step_metric(ctx, "probe.after", (double)m->step, err);
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    probe *p = calloc(1, sizeof *p);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    snprintf(p->file, sizeof p->file, "%s", fsdp_arg_str(with, "file", ""));
    p->lr_scale = fsdp_arg_float(with, "lr_scale", 1);
    p->scale_per_rank = fsdp_arg_float(with, "scale_per_rank", 0);
    p->skip_on_rank = fsdp_arg_int(with, "skip_on_rank", -1);
    int rc = fsdp_pre_update_add(ctx, "probe", pre_update, p, free, err);
    for (int k = 0; k < FSDP_HOOK_KINDS && !rc; k++)
        rc = fsdp_hook_add(ctx, "probe", (fsdp_hook_kind)k, on_event, p, NULL, err);
    if (!rc) rc = fsdp_callback_add(ctx, "probe", after_step, NULL, NULL, err);
    return rc;
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_DESC_INIT, "hook-probe", "every hook of stage ABI 1.2", PARAMS, NULL,
                                     NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
