/* The parameters of the plugin API (include/fsdp/params.h): looking them up and moving their rows. */
#include "fsdp/params.h"

#include <stdlib.h>
#include <string.h>

#include "api/api_agree.h"
#include "api/api_util.h"
#include "ckpt/namemap.h"
#include "model/model_table.h"
#include "runtime/ctx_impl.h"
#include "runtime/err_local.h"

size_t fsdp_param_count(fsdp_ctx *ctx) {
    fsdp_state *s = ctx ? state_get(ctx) : NULL;
    return s ? s->n : 0;
}

int fsdp_param_info_at(fsdp_ctx *ctx, size_t i, fsdp_param_info *out, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_info_at";
    fsdp_state *s = api_state(ctx, call, err);
    state_param *p = s ? api_param(ctx, s, i, call, err) : NULL;
    if (!p) return err->code;
    if (!out) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL info");
    memset(out, 0, sizeof *out);
    out->name = p->name;
    out->ndim = p->ndim;
    memcpy(out->shape, p->shape, sizeof out->shape);
    out->dtype = p->dtype;
    out->row0 = p->ndim ? p->row0 : 0;
    out->rows = p->ndim ? p->rows : 1;
    out->row_numel = p->row_numel;
    const mt_table *t = s->model;
    int part = t && i < t->n ? t->p[i].part : -1;
    out->part = part >= 0 && (size_t)part < t->n_parts && t->parts[part].name ? t->parts[part].name : "";
    out->has_value = !p->no_value;
    out->has_optimizer = state_place_of(p, STATE_EXP_AVG) != STATE_ABSENT;
    return 0;
}

long fsdp_param_find(fsdp_ctx *ctx, const char *name) {
    fsdp_state *s = ctx && name ? state_get(ctx) : NULL;
    state_param *p = s ? state_find(s, name) : NULL;
    return p ? (long)(p - s->p) : -1;
}

int fsdp_param_glob(fsdp_ctx *ctx, const char *pattern, size_t *idx, size_t cap, size_t *n, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_glob";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s) return err->code;
    if (!pattern || !n || (cap && !idx)) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL pattern, idx or n");
    fsdp_err e;
    if (nmap_glob_check(pattern, NULL, &e)) return api_fail(ctx, err, FSDP_E_INVALID, call, "%s", e.msg);
    *n = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (nmap_glob_match(pattern, s->p[i].name, NULL) < 0) continue;
        if (*n < cap) idx[*n] = i;
        (*n)++;
    }
    return 0;
}

/* The state and parameter i for a call on rows [row0, row0 + rows) of it in buf (dt), checked; NULL (err set)
 * otherwise. */
static state_param *rows_param(fsdp_ctx *ctx, const char *call, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt,
                               const void *buf, fsdp_state **s, fsdp_err *err) {
    *s = api_state(ctx, call, err);
    state_param *p = *s ? api_param(ctx, *s, i, call, err) : NULL;
    return p && !api_check_rows(ctx, p, row0, rows, dt, buf, call, err) ? p : NULL;
}

int fsdp_param_read(fsdp_ctx *ctx, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_read";
    fsdp_state *s;
    state_param *p = rows_param(ctx, call, i, row0, rows, dt, dst, &s, err);
    if (!p) return err->code;
    if (p->no_value)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s holds no value yet (declared, not loaded or filled)",
                        p->name);
    return rows ? api_move_rows(ctx, s, p, STATE_DATA, row0, rows, dt, dst, 0, call, err) : 0;
}

int fsdp_param_write(fsdp_ctx *ctx, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt, const void *src,
                     fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_write";
    fsdp_state *s;
    state_param *p = rows_param(ctx, call, i, row0, rows, dt, src, &s, err);
    if (!p) return err->code;
    int rc = rows ? api_move_rows(ctx, s, p, STATE_DATA, row0, rows, dt, (void *)src, 1, call, err) : 0;
    if (!rc) p->no_value = 0;
    return rc;
}

int fsdp_param_read_grad(fsdp_ctx *ctx, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst,
                         fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_read_grad";
    fsdp_state *s;
    state_param *p = rows_param(ctx, call, i, row0, rows, dt, dst, &s, err);
    if (!p) return err->code;
    if (!ctx->in_pre_update)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "the gradients are readable only inside a pre-update hook");
    if (!state_param_trained(p) || state_place_of(p, STATE_GRAD) == STATE_ABSENT)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s is not trained: it has no gradient", p->name);
    return rows ? api_move_rows(ctx, s, p, STATE_GRAD, row0, rows, dt, dst, 0, call, err) : 0;
}

/* Every rank agrees on the call, parameter i (its index and name) and the root before any payload
 * moves; then the root, the index and the root's buffer (root_bad: NULL or not a float) are checked
 * the same way on every rank. */
static state_param *agree_param_root(fsdp_ctx *ctx, fsdp_state *s, size_t i, int root, int root_bad, const char *call,
                                     fsdp_err *err) {
    api_call a, of;
    api_call_init(&a, call);
    a.has = API_HAS_INDEX | API_HAS_ROOT, a.count = (int64_t)i, a.root = root;
    api_call_name(&a, i < s->n ? s->p[i].name : "(no such parameter)");
    if (root_bad) snprintf(a.root_bad, sizeof a.root_bad, "a NULL buffer or a dtype that is not a float");
    memset(&of, 0, sizeof of);
    if (api_agree(ctx, &a, root, &of, err)) return NULL;
    comm *w = ctx_world_comm(ctx);
    if (root < 0 || root >= comm_size(w)) {
        api_fail(ctx, err, FSDP_E_INVALID, call, "root %d outside [0, %d)", root, comm_size(w));
        return NULL;
    }
    state_param *p = api_param(ctx, s, i, call, err);
    if (p && of.root_bad[0]) {
        api_fail(ctx, err, FSDP_E_INVALID, call, "rank %d passed %s", root, of.root_bad);
        return NULL;
    }
    return p;
}

int fsdp_param_gather(fsdp_ctx *ctx, size_t i, int root, fsdp_dtype dt, void *dst, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_gather";
    fsdp_state *s = api_state(ctx, call, err);
    int mine = ctx && comm_rank(ctx_world_comm(ctx)) == root;
    state_param *p = s ? agree_param_root(ctx, s, i, root, mine && (!dst || !fsdp_dtype_is_float(dt)), call, err) : NULL;
    if (!p) return err->code;
    int rc;
    float *full = NULL;
    /* a full layout: rank 0 holds it whole (the others hold nothing) */
    if (s->layout == STATE_FULL && root != 0)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: the model is not sharded yet (rank 0 holds it): root must be 0",
                        p->name);
    if ((rc = api_gather_array(ctx, s, p, STATE_DATA, &full, err)))
        return api_fail(ctx, err, rc, call, "%s: %s", p->name, err->msg);
    if (comm_rank(ctx_world_comm(ctx)) == root)
        rc = fsdp_convert(dst, dt, full, FSDP_DT_F32, (size_t)state_param_numel(p), err);
    free(full);
    return rc;
}

int fsdp_param_scatter(fsdp_ctx *ctx, size_t i, int root, fsdp_dtype dt, const void *src, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_scatter";
    fsdp_state *s = api_state(ctx, call, err);
    int mine = ctx && comm_rank(ctx_world_comm(ctx)) == root;
    state_param *p = s ? agree_param_root(ctx, s, i, root, mine && (!src || !fsdp_dtype_is_float(dt)), call, err) : NULL;
    if (!p) return err->code;
    int rc = 0;
    comm *w = ctx_world_comm(ctx);
    size_t numel = (size_t)state_param_numel(p);
    float *full = malloc((numel ? numel : 1) * sizeof(float));
    if (!full) return api_fail(ctx, err, FSDP_E_NOMEM, call, "%s: out of memory", p->name);
    if (comm_rank(w) == root) rc = fsdp_convert(full, FSDP_DT_F32, src, dt, numel, err);
    if (!rc) rc = comm_bcast(w, full, numel * sizeof(float), root, err);
    int64_t r0 = p->ndim ? p->row0 : 0, rows = s->layout == STATE_FULL && s->rank != 0 ? 0 : p->ndim ? p->rows : 1;
    if (!rc && rows)
        rc = api_move_rows(ctx, s, p, STATE_DATA, r0, rows, FSDP_DT_F32, full + (size_t)r0 * (size_t)p->row_numel, 1, call,
                       err);
    if (!rc) p->no_value = 0;
    free(full);
    return rc;
}
