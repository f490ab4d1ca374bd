/* The optimizer state of the plugin API (include/fsdp/params.h): AdamW's step, learning rate and
 * moments. */
#include "fsdp/params.h"

#include <math.h>
#include <string.h>

#include "api/api_util.h"
#include "runtime/err_local.h"

int64_t fsdp_optim_step(fsdp_ctx *ctx) {
    fsdp_state *s = ctx ? state_get(ctx) : NULL;
    return s && s->has_optimizer ? s->opt_step : -1;
}

int fsdp_optim_set_step(fsdp_ctx *ctx, int64_t step, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_optim_set_step";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s) return err->code;
    if (step < 0) return api_fail(ctx, err, FSDP_E_INVALID, call, "step %lld is negative", (long long)step);
    s->opt_step = step;
    s->has_optimizer = 1;
    return 0;
}

double fsdp_optim_lr(fsdp_ctx *ctx) {
    fsdp_state *s = ctx ? state_get(ctx) : NULL;
    return s && s->has_lr_schedule ? s->lr_next : s ? s->lr : 0;
}

int fsdp_optim_set_lr(fsdp_ctx *ctx, double lr, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_optim_set_lr";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s) return err->code;
    if (!isfinite(lr) || lr < 0) return api_fail(ctx, err, FSDP_E_INVALID, call, "learning rate %g", lr);
    double cur = fsdp_optim_lr(ctx), scale = s->lr_scale > 0 ? s->lr_scale : 1.0;
    if (!(cur > 0))
        return api_fail(ctx, err, FSDP_E_INVALID, call,
                        "no learning rate to scale yet (set it after a train-steps step, e.g. from a callback)");
    s->lr_scale = scale * (lr / cur);
    s->lr_next = lr;
    return 0;
}

/* The moment array m of p, made (zeros) when write and the model had none. */
static int moment_of(fsdp_ctx *ctx, fsdp_state *s, state_param *p, fsdp_moment m, int write, state_array *a,
                     const char *call, fsdp_err *err) {
    if ((unsigned)m > FSDP_EXP_AVG_SQ) return api_fail(ctx, err, FSDP_E_INVALID, call, "unknown moment %d", (int)m);
    *a = m == FSDP_EXP_AVG ? STATE_EXP_AVG : STATE_EXP_AVG_SQ;
    if (state_place_of(p, *a) != STATE_ABSENT) return 0;
    if (!write) return api_fail(ctx, err, FSDP_E_INVALID, call, "%s has no optimizer moments", p->name);
    int rc = state_alloc_optimizer(s, err);
    if (!rc) s->has_optimizer = 1;
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

/* Rows of a moment between the state and buf (to_state 0 reads), through the host copy. */
static int moment_rows(fsdp_ctx *ctx, size_t i, fsdp_moment m, int64_t row0, int64_t rows, fsdp_dtype dt, void *buf,
                       int to_state, const char *call, fsdp_err *err) {
    fsdp_state *s = api_state(ctx, call, err);
    state_param *p = s ? api_param(ctx, s, i, call, err) : NULL;
    state_array a = STATE_EXP_AVG;
    if (!p || api_check_rows(ctx, p, row0, rows, dt, buf, call, err) ||
        moment_of(ctx, s, p, m, to_state, &a, call, err))
        return err->code;
    return rows ? api_move_rows(ctx, s, p, a, row0, rows, dt, buf, to_state, call, err) : 0;
}

int fsdp_optim_read(fsdp_ctx *ctx, size_t i, fsdp_moment m, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst,
                    fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    return moment_rows(ctx, i, m, row0, rows, dt, dst, 0, "fsdp_optim_read", err);
}

int fsdp_optim_write(fsdp_ctx *ctx, size_t i, fsdp_moment m, int64_t row0, int64_t rows, fsdp_dtype dt,
                     const void *src, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    return moment_rows(ctx, i, m, row0, rows, dt, (void *)src, 1, "fsdp_optim_write", err);
}
