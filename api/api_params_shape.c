/* The plugin API's structural calls (include/fsdp/params.h): adding, removing and resizing a
 * parameter, keeping the state, the model table (what checkpoints and exports are written from) and a
 * decoder's vocabulary consistent. Each is agreed on by every rank: a failure on one fails all. */
#include "fsdp/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_agree.h"
#include "api/api_util.h"
#include "decoder/decoder_table.h"
#include "model/init_fill.h"
#include "model/model_table.h"
#include "runtime/ctx_impl.h"
#include "runtime/err_local.h"

/* Every rank's result of a structural call: rc on any rank fails every rank, each with the failing
 * rank's message. */
static int agree(fsdp_ctx *ctx, int rc, const char *call, fsdp_err *err) {
    (void)call;
    return api_agree_result(ctx, ctx_world_comm(ctx), rc, err);
}

/* The call and parameter i (its index and name) every rank agrees on first. */
static void call_of_param(api_call *a, const char *call, const fsdp_state *s, size_t i) {
    api_call_init(a, call);
    a->has = API_HAS_INDEX, a->count = (int64_t)i;
    api_call_name(a, i < s->n ? s->p[i].name : "(no such parameter)");
}

/* Values of rule r for elements [e0, e0 + n) of parameter `name` of full shape (ndim, shape), into
 * out (float32), from the run's seed: the stream init-meta draws from. */
static int draw(fsdp_ctx *ctx, const char *name, const init_rule *r, int ndim, const int64_t *shape, int64_t e0,
                int64_t n, float *out, const char *call, fsdp_err *err) {
    init_job j;
    memset(&j, 0, sizeof j);
    int rc = init_job_for_rule(&j, r, ndim, shape, name, err);
    if (rc) return api_fail(ctx, err, rc, call, "%s", err->msg);
    j.stream = init_stream(name);
    j.e0 = e0;
    j.n = n;
    j.f32 = out;
    j.dtype = FSDP_DT_F32;
    uint64_t seed = (uint64_t)fsdp_arg_int(fsdp_ctx_section(ctx, "runtime"), "seed", 0);
    rc = n ? init_fill_jobs(&j, 1, seed, name, err) : 0;
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

/* The part plugin parameters belong to ("plugin"), made once. */
static int plugin_part(mt_table *t, int *part, fsdp_err *err) {
    long k = mt_find_part(t, "plugin");
    if (k >= 0) {
        *part = (int)k;
        return 0;
    }
    return mt_add_part(t, "plugin", "", "added by a plugin stage", "", part, err);
}

/* Checks of fsdp_param_add's arguments, then the table entry. */
static int add_to_table(fsdp_ctx *ctx, fsdp_state *s, const char *name, int ndim, const int64_t *shape, fsdp_dtype dt,
                        const init_rule *r, const char *call, fsdp_err *err) {
    if (!name || !*name || ndim < 0 || ndim > FSDP_MAX_DIMS || (ndim && !shape) || fsdp_numel(ndim, shape) < 0)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "a parameter needs a name and a shape of 0..%d dims >= 0",
                        FSDP_MAX_DIMS);
    if (dt != FSDP_DT_F32 && dt != FSDP_DT_BF16 && dt != FSDP_DT_F16)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: dtype must be f32, bf16 or f16", name);
    if (state_find(s, name)) return api_fail(ctx, err, FSDP_E_INVALID, call, "the model already has a parameter %s", name);
    if (!s->model) return 0;
    mt_param mp;
    memset(&mp, 0, sizeof mp);
    mp.name = (char *)name;
    mp.ndim = ndim;
    if (ndim) memcpy(mp.shape, shape, (size_t)ndim * sizeof *shape);
    mp.dtype = dt;
    mp.init = *r;
    mp.layer = -1;
    int rc = plugin_part(s->model, &mp.part, err);
    if (!rc) rc = mt_add(s->model, &mp, err);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

/* A new parameter's arrays where the others' are (the device when the model is there). */
static int place_like_others(fsdp_state *s, state_param *p, fsdp_err *err) {
    int on_dev = 0;
    for (size_t k = 0; k + 1 < s->n && !on_dev; k++) on_dev = state_place_of(&s->p[k], STATE_DATA) == STATE_DEVICE;
    int rc = 0;
    if (on_dev) {
        size_t n = state_param_local_numel(p);
        float *host = malloc((n ? n : 1) * sizeof *host);
        if (!host) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        memcpy(host, p->data, n * sizeof *host);
        state_param_release(s, p, STATE_DATA);
        rc = state_param_alloc(s, p, STATE_DATA, STATE_DEVICE, 0, err);
        if (!rc) rc = state_param_put(s, p, STATE_DATA, host, err);
        free(host);
    }
    if (!rc && s->has_optimizer) rc = state_alloc_optimizer(s, err);
    return rc;
}

static int add_local(fsdp_ctx *ctx, fsdp_state *s, const char *name, int ndim, const int64_t *shape, fsdp_dtype dt,
                     const char *rule, const char *call, fsdp_err *err) {
    init_rule r;
    int rc = init_rule_parse(rule ? rule : "none", &r, err);
    if (rc) return api_fail(ctx, err, rc, call, "%s: init rule: %s", name ? name : "?", err->msg);
    if ((rc = add_to_table(ctx, s, name, ndim, shape, dt, &r, call, err))) return rc;
    if ((rc = state_add_param(s, name, ndim, shape, -1, err))) return api_fail(ctx, err, rc, call, "%s", err->msg);
    state_param *p = &s->p[s->n - 1];
    p->dtype = dt;
    int64_t e0 = (p->ndim ? p->row0 : 0) * p->row_numel, n = (int64_t)state_param_local_numel(p);
    if (r.kind == INIT_NONE) {
        p->no_value = 1;
        for (int64_t k = 0; k < n; k++) p->data[k] = NAN;
    } else if ((rc = draw(ctx, name, &r, ndim, shape, e0, n, p->data, call, err))) {
        return rc;
    }
    rc = place_like_others(s, p, err);
    return rc ? api_fail(ctx, err, rc, call, "%s: %s", name, err->msg) : 0;
}

int fsdp_param_add(fsdp_ctx *ctx, const char *name, int ndim, const int64_t *shape, fsdp_dtype dtype,
                   const char *init_rule, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_add";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s || api_not_in_callback(ctx, call, err)) return err->code;
    api_call a;
    api_call_init(&a, call);
    a.has = API_HAS_SHAPE | API_HAS_DTYPE, a.dtype = (int32_t)dtype, a.ndim = ndim;
    api_call_name(&a, name);
    api_call_rule(&a, init_rule ? init_rule : "none");
    if (ndim > 0 && ndim <= FSDP_MAX_DIMS && shape) memcpy(a.shape, shape, (size_t)ndim * sizeof *shape);
    else if (ndim) api_call_bad(&a, ndim < 0 || ndim > FSDP_MAX_DIMS ? "a dim count out of range" : "a NULL shape");
    if (api_agree(ctx, &a, -1, NULL, err)) return err->code;
    int rc = add_local(ctx, s, name, ndim, shape, dtype, init_rule, call, err);
    return agree(ctx, rc, call, err);
}

int fsdp_param_remove(fsdp_ctx *ctx, size_t i, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_remove";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s || api_not_in_callback(ctx, call, err)) return err->code;
    api_call a;
    call_of_param(&a, call, s, i);
    if (api_agree(ctx, &a, -1, NULL, err)) return err->code;
    int rc = api_param(ctx, s, i, call, err) ? 0 : err->code;
    if (!rc && s->model && i < s->model->n && (rc = mt_remove(s->model, i, err))) api_fail(ctx, err, rc, call, "%s", err->msg);
    if (!rc && (rc = state_remove_param(s, i, err))) api_fail(ctx, err, rc, call, "%s", err->msg);
    return agree(ctx, rc, call, err);
}

/* The new rows of the data: given (rank 0's, broadcast), a rule's draw, or the kept rows' mean. */
static int new_rows(fsdp_ctx *ctx, state_param *p, int64_t old, int64_t d0, const char *rule, fsdp_dtype dt,
                    int use_given, const void *given, float *full, const char *call, fsdp_err *err) {
    const int64_t rn = p->row_numel, add = d0 - old;
    float *dst = full + (size_t)(old * rn);
    if (add <= 0) return 0;
    comm *w = ctx_world_comm(ctx);
    if (use_given) {
        int rc = comm_rank(w) == 0 ? fsdp_convert(dst, FSDP_DT_F32, given, dt, (size_t)(add * rn), err) : 0;
        if (!rc) rc = comm_bcast(w, dst, (size_t)(add * rn) * sizeof(float), 0, err);
        return rc ? api_fail(ctx, err, rc, call, "%s: %s", p->name, err->msg) : 0;
    }
    if (rule) {
        init_rule r;
        int rc = init_rule_parse(rule, &r, err);
        int64_t shape[FSDP_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        shape[0] = d0;
        if (!rc) return draw(ctx, p->name, &r, p->ndim, shape, old * rn, add * rn, dst, call, err);
        return api_fail(ctx, err, rc, call, "%s: init rule: %s", p->name, err->msg);
    }
    if (old < 1) return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: no rows to take the mean of", p->name);
    for (int64_t c = 0; c < rn; c++) {
        double sum = 0;
        for (int64_t r = 0; r < old; r++) sum += full[r * rn + c];
        for (int64_t r = 0; r < add; r++) dst[r * rn + c] = (float)(sum / (double)old);
    }
    return 0;
}

static int resize_local(fsdp_ctx *ctx, fsdp_state *s, state_param *p, int64_t d0, const char *rule, fsdp_dtype dt,
                        int use_given, const void *given, const char *call, fsdp_err *err) {
    if (p->ndim < 1 || d0 < 1)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: dim 0 of a %d-d parameter cannot become %lld", p->name,
                        p->ndim, (long long)d0);
    const int64_t old = p->shape[0], rn = p->row_numel;
    const size_t keep = (size_t)((old < d0 ? old : d0) * rn), numel = (size_t)(d0 * rn);
    float *full[STATE_ARRAYS] = {NULL, NULL, NULL, NULL};
    int rc = 0;
    for (int a = 0; a < STATE_ARRAYS && !rc; a++) {
        if (a == STATE_GRAD || state_place_of(p, (state_array)a) == STATE_ABSENT) continue;
        float *old_full = NULL;
        rc = api_gather_array(ctx, s, p, (state_array)a, &old_full, err);
        if (!rc && !(full[a] = calloc(numel ? numel : 1, sizeof(float)))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (!rc) memcpy(full[a], old_full, keep * sizeof(float));
        if (!rc && a == STATE_DATA && d0 > old) {
            float *both = realloc(old_full, numel * sizeof(float)); /* the old rows, then the new */
            if (!both) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            else old_full = both, rc = new_rows(ctx, p, old, d0, rule, dt, use_given, given, old_full, call, err);
            if (!rc) memcpy(full[a] + keep, old_full + keep, (numel - keep) * sizeof(float));
        }
        free(old_full);
    }
    if (!rc) rc = state_param_set_rows(s, p, d0, (const float *const *)full, err);
    for (int a = 0; a < STATE_ARRAYS; a++) free(full[a]);
    long t = !rc && s->model ? mt_find(s->model, p->name) : -1;
    if (t >= 0) s->model->p[t].shape[0] = d0;
    if (!rc) rc = decoder_state_param_resized(s, p->name, d0, err);
    return rc && !strstr(err->msg, call) ? api_fail(ctx, err, rc, call, "%s", err->msg) : rc;
}

int fsdp_param_resize(fsdp_ctx *ctx, size_t i, int64_t new_rows_n, const char *init_rule, fsdp_dtype dt,
                      const void *given, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_resize";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s || api_not_in_callback(ctx, call, err)) return err->code;
    api_call a, of0;
    call_of_param(&a, call, s, i);
    a.has |= API_HAS_ROWS, a.rows = new_rows_n;
    if (init_rule) api_call_rule(&a, init_rule);
    a.root_flag = given != NULL; /* rank 0's given decides */
    if (given && !fsdp_dtype_is_float(dt)) snprintf(a.root_bad, sizeof a.root_bad, "given rows of a dtype that is not a float");
    if (api_agree(ctx, &a, 0, &of0, err)) return err->code;
    if (of0.root_flag && of0.root_bad[0]) return api_fail(ctx, err, FSDP_E_INVALID, call, "rank 0 passed %s", of0.root_bad);
    state_param *p = api_param(ctx, s, i, call, err);
    int rc = p ? 0 : err->code;
    if (!rc && p->no_value) rc = api_fail(ctx, err, FSDP_E_INVALID, call, "%s holds no value yet", p->name);
    /* the checks are the same on every rank: agree before the collectives of the resize */
    if ((rc = agree(ctx, rc, call, err))) return rc;
    rc = resize_local(ctx, s, p, new_rows_n, init_rule, dt, of0.root_flag, given, call, err);
    return agree(ctx, rc, call, err);
}

int fsdp_param_set_trainable(fsdp_ctx *ctx, size_t i, int trainable, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_param_set_trainable";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s || api_not_in_callback(ctx, call, err)) return err->code;
    api_call a;
    call_of_param(&a, call, s, i);
    a.has |= API_HAS_TRAINABLE, a.rows = trainable != 0;
    if (api_agree(ctx, &a, -1, NULL, err)) return err->code;
    state_param *p = api_param(ctx, s, i, call, err);
    if (!p) return err->code;
    p->buffer = !trainable;
    long t = s->model ? mt_find(s->model, p->name) : -1;
    if (t >= 0) s->model->p[t].frozen = !trainable;
    if (!trainable) {
        state_param_release(s, p, STATE_EXP_AVG);
        state_param_release(s, p, STATE_EXP_AVG_SQ);
    }
    return 0;
}

int fsdp_param_trainable(fsdp_ctx *ctx, size_t i) {
    fsdp_state *s = ctx ? state_get(ctx) : NULL;
    if (!s || i >= s->n) return -1;
    return state_param_trained(&s->p[i]);
}
