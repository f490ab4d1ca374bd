/* Shared checks of the plugin API (api/api_util.h). */
#include "api/api_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ctx_impl.h"

int api_fail(fsdp_ctx *ctx, fsdp_err *err, int code, const char *call, const char *fmt, ...) {
    char msg[FSDP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ctx && ctx->stage_id)
        return fsdp_err_set(err, code, "stage '%s' (%s): %s: %s", ctx->stage_id,
                            ctx->stage_uses ? ctx->stage_uses : "?", call, msg);
    return fsdp_err_set(err, code, "%s: %s", call, msg);
}

fsdp_state *api_state(fsdp_ctx *ctx, const char *call, fsdp_err *err) {
    if (!ctx) {
        fsdp_err_set(err, FSDP_E_INVALID, "%s: no context", call);
        return NULL;
    }
    if (!ctx->stage_id) {
        api_fail(ctx, err, FSDP_E_INVALID, call, "called outside a stage's run");
        return NULL;
    }
    fsdp_state *s = state_get(ctx);
    if (!s) api_fail(ctx, err, FSDP_E_INVALID, call, "no model in the context (run init-meta, init-cpu or load-ckpt first)");
    return s;
}

state_param *api_param(fsdp_ctx *ctx, fsdp_state *s, size_t i, const char *call, fsdp_err *err) {
    if (i >= s->n) {
        api_fail(ctx, err, FSDP_E_INVALID, call, "parameter index %zu, but the model has %zu parameters", i, s->n);
        return NULL;
    }
    return &s->p[i];
}

int api_check_rows(fsdp_ctx *ctx, const state_param *p, int64_t row0, int64_t rows, fsdp_dtype dt, const void *buf,
                   const char *call, fsdp_err *err) {
    if (!buf) return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: NULL buffer", p->name);
    if (!fsdp_dtype_is_float(dt))
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: dtype %s is not a float dtype", p->name,
                        fsdp_dtype_name(dt) ? fsdp_dtype_name(dt) : "(invalid)");
    int64_t lo = p->ndim ? p->row0 : 0, n = p->ndim ? p->rows : 1;
    if (rows < 0 || row0 < lo || row0 + rows > lo + n)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: rows [%lld, %lld) are outside this rank's rows [%lld, %lld)",
                        p->name, (long long)row0, (long long)(row0 + rows), (long long)lo, (long long)(lo + n));
    return 0;
}

/* Rows [row0, row0 + rows) of array a of p between the state and buf (dt): to_state 0 reads. */
int api_move_rows(fsdp_ctx *ctx, fsdp_state *s, state_param *p, state_array a, int64_t row0, int64_t rows,
                     fsdp_dtype dt, void *buf, int to_state, const char *call, fsdp_err *err) {
    float *host = NULL;
    int rc = state_param_map(s, p, a, &host, err);
    if (rc) return api_fail(ctx, err, rc, call, "%s: %s", p->name, err->msg);
    size_t off = (size_t)(row0 - (p->ndim ? p->row0 : 0)) * (size_t)p->row_numel;
    size_t n = (size_t)rows * (size_t)p->row_numel;
    rc = to_state ? fsdp_convert(host + off, FSDP_DT_F32, buf, dt, n, err)
                  : fsdp_convert(buf, dt, host + off, FSDP_DT_F32, n, err);
    fsdp_err e2;
    int urc = state_param_unmap(s, p, a, host, to_state && !rc, &e2);
    if (rc) return api_fail(ctx, err, rc, call, "%s: %s", p->name, err->msg);
    if (urc) return api_fail(ctx, err, urc, call, "%s: %s", p->name, e2.msg);
    return 0;
}

int api_gather_array(fsdp_ctx *ctx, fsdp_state *s, state_param *p, state_array a, float **full, fsdp_err *err) {
    size_t numel = (size_t)state_param_numel(p);
    float *local = NULL;
    *full = malloc((numel ? numel : 1) * sizeof(float));
    if (!*full) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (%zu floats)", numel);
    int rc = state_param_map(s, p, a, &local, err);
    if (!rc) {
        /* a full layout: rank 0 holds it whole (the others nothing) */
        if (s->layout == STATE_FULL) memcpy(*full, local, state_param_local_numel(p) * sizeof(float));
        else rc = state_unshard(p, local, ctx_shard_comm(ctx), *full, err);
        fsdp_err e2;
        state_param_unmap(s, p, a, local, 0, &e2);
    }
    if (rc) {
        free(*full);
        *full = NULL;
    }
    return rc;
}

int api_not_in_callback(fsdp_ctx *ctx, const char *call, fsdp_err *err) {
    if (ctx->in_callback)
        return api_fail(ctx, err, FSDP_E_INVALID, call,
                        "not allowed in a train-steps callback (the trainer holds the parameters while it runs): "
                        "do it in a stage before or after train-steps");
    return 0;
}
