/* Test plugin of the plugin API (include/fsdp/params.h, collectives.h, callbacks.h, ckpt.h).
 *
 * `api-misuse`: calls every call wrongly (unknown index, rows outside this rank's, NULL buffers, a
 * dtype that is not a float, a bad root, a structural call inside a callback, ...) and appends each
 * error message to `file` as one line "CALL: MESSAGE" (every call must fail: one that succeeds is
 * written "CALL: UNEXPECTED SUCCESS"). With fail: true it then returns the last error, so the stage
 * fails and fsdp-run must end cleanly with it.
 *
 * `api-probe`: uses every call rightly and checks what it sees, failing with a message on the first
 * mismatch: rows read equal the gathered tensor's, a scatter of twice the tensor doubles every rank's
 * rows, moments round-trip, the collectives compute what they should; metric `checks`.
 *
 * `api-edit`: adds `extra.weight` [5, 3] (init rule `rule`) and `extra.ones` [7] (ones), removes
 * `remove` (a name), and scales the learning rate of the steps to come by `lr_scale`.
 *
 * `api-save-at`: registers a callback that asks for a save after optimizer step `step` (with stop: true, to stop
 * there too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/callbacks.h"
#include "fsdp/ckpt.h"
#include "fsdp/collectives.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec MISUSE_PARAMS[] = {
    {"file", FSDP_T_STRING, 1, NULL, NULL, "where each error is appended"},
    {"fail", FSDP_T_BOOL, 0, "false", NULL, "return the last error"},
    {NULL, 0, 0, NULL, NULL, NULL}};

typedef struct log_to {
    FILE *f;
    int rank;
    fsdp_err last;
} log_to;

/* One misuse: rc must be nonzero. */
static void expect_fail(log_to *l, const char *call, int rc, const fsdp_err *e) {
    if (l->rank != 0) return;
    if (rc) fprintf(l->f, "%s: %s\n", call, e->msg);
    else fprintf(l->f, "%s: UNEXPECTED SUCCESS\n", call);
}

static int in_callback(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user, fsdp_err *err) {
    (void)m, (void)request, (void)err;
    log_to *l = user;
    fsdp_err e;
    int64_t shape[1] = {4};
    expect_fail(l, "fsdp_param_add (in a callback)", fsdp_param_add(ctx, "x", 1, shape, FSDP_DT_F32, "zeros", &e), &e);
    expect_fail(l, "fsdp_param_remove (in a callback)", fsdp_param_remove(ctx, 0, &e), &e);
    expect_fail(l, "fsdp_param_resize (in a callback)", fsdp_param_resize(ctx, 0, 9, NULL, FSDP_DT_F32, NULL, &e), &e);
    return 0;
}

static void misuse_params(fsdp_ctx *ctx, log_to *l) {
    fsdp_err e;
    float buf[16];
    fsdp_param_info in;
    size_t n = fsdp_param_count(ctx), idx[4], m = 0;
    expect_fail(l, "fsdp_param_info_at", fsdp_param_info_at(ctx, n + 5, &in, &e), &e);
    expect_fail(l, "fsdp_param_glob", fsdp_param_glob(ctx, "layers.***", idx, 4, &m, &e), &e);
    fsdp_param_info_at(ctx, 0, &in, &e);
    expect_fail(l, "fsdp_param_read (rows)", fsdp_param_read(ctx, 0, in.row0 + in.rows, 1, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_param_read (NULL)", fsdp_param_read(ctx, 0, in.row0, 0, FSDP_DT_F32, NULL, &e), &e);
    expect_fail(l, "fsdp_param_read (dtype)", fsdp_param_read(ctx, 0, in.row0, 0, FSDP_DT_I32, buf, &e), &e);
    expect_fail(l, "fsdp_param_write (index)", fsdp_param_write(ctx, n, 0, 1, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_param_write (rows)", fsdp_param_write(ctx, 0, -1, 1, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_param_gather (root)", fsdp_param_gather(ctx, 0, 99, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_param_scatter (NULL on root)", fsdp_param_scatter(ctx, 0, 0, FSDP_DT_F32, NULL, &e), &e);
    int64_t shape[2] = {2, 3};
    expect_fail(l, "fsdp_param_add (exists)", fsdp_param_add(ctx, in.name, 2, shape, FSDP_DT_F32, "zeros", &e), &e);
    expect_fail(l, "fsdp_param_add (rule)", fsdp_param_add(ctx, "new.weight", 2, shape, FSDP_DT_F32, "gauss(1)", &e), &e);
    expect_fail(l, "fsdp_param_add (dtype)", fsdp_param_add(ctx, "new.weight", 2, shape, FSDP_DT_I64, "zeros", &e), &e);
    expect_fail(l, "fsdp_param_remove", fsdp_param_remove(ctx, n + 1, &e), &e);
    expect_fail(l, "fsdp_param_resize (rows)", fsdp_param_resize(ctx, 0, 0, NULL, FSDP_DT_F32, NULL, &e), &e);
    expect_fail(l, "fsdp_param_resize (index)", fsdp_param_resize(ctx, n + 2, 8, NULL, FSDP_DT_F32, NULL, &e), &e);
    /* stage ABI 1.2's calls outside their place */
    expect_fail(l, "fsdp_step_metric", fsdp_step_metric(ctx, "x", 1, &e), &e);
    expect_fail(l, "fsdp_param_read_grad", fsdp_param_read_grad(ctx, 0, in.row0, 1, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_hook_add (kind)", fsdp_hook_add(ctx, "h", (fsdp_hook_kind)9, NULL, NULL, NULL, &e), &e);
    expect_fail(l, "fsdp_param_set_trainable (index)", fsdp_param_set_trainable(ctx, n + 3, 0, &e), &e);
}

static void misuse_rest(fsdp_ctx *ctx, log_to *l) {
    fsdp_err e;
    float buf[16];
    expect_fail(l, "fsdp_optim_read (no moments)", fsdp_optim_read(ctx, 0, FSDP_EXP_AVG, 0, 0, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_optim_read (moment)", fsdp_optim_read(ctx, 0, (fsdp_moment)7, 0, 0, FSDP_DT_F32, buf, &e), &e);
    expect_fail(l, "fsdp_optim_set_step", fsdp_optim_set_step(ctx, -3, &e), &e);
    expect_fail(l, "fsdp_optim_set_lr", fsdp_optim_set_lr(ctx, -1.0, &e), &e);
    expect_fail(l, "fsdp_broadcast (root)", fsdp_broadcast(ctx, buf, 4, -1, &e), &e);
    expect_fail(l, "fsdp_allreduce (dtype)", fsdp_allreduce(ctx, buf, 1, FSDP_DT_BF16, FSDP_SUM, &e), &e);
    expect_fail(l, "fsdp_allreduce (NULL)", fsdp_allreduce(ctx, NULL, 3, FSDP_DT_F32, FSDP_SUM, &e), &e);
    expect_fail(l, "fsdp_allgather (NULL)", fsdp_allgather(ctx, NULL, 4, buf, &e), &e);
    expect_fail(l, "fsdp_callback_add (no function)", fsdp_callback_add(ctx, "x", NULL, NULL, NULL, &e), &e);
    expect_fail(l, "fsdp_callback_remove (unknown)", fsdp_callback_remove(ctx, "no-such-callback", &e), &e);
    fsdp_ckpt *c = NULL;
    expect_fail(l, "fsdp_ckpt_open (missing)", fsdp_ckpt_open(ctx, "/no/such/checkpoint", &c, &e), &e);
    l->last = e;
}

static int misuse_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    static log_to l; /* the callback's user pointer outlives the stage */
    l.rank = fsdp_ctx_rank(ctx);
    l.f = l.rank == 0 ? fopen(fsdp_arg_str(with, "file", ""), "a") : NULL;
    if (l.rank == 0 && !l.f) return fsdp_err_set(err, FSDP_E_IO, "api-misuse: cannot open the file");
    misuse_params(ctx, &l);
    misuse_rest(ctx, &l);
    int rc = fsdp_callback_add(ctx, "misuse", in_callback, &l, NULL, err);
    if (l.f) fflush(l.f);
    if (!rc && fsdp_arg_bool(with, "fail", 0)) {
        *err = l.last;
        rc = err->code ? err->code : FSDP_E_INVALID;
    }
    return rc;
}

/* ---- api-probe -------------------------------------------------------------------------------- */

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        checks++;                                                           \
        if (!(cond)) {                                                      \
            rc = fsdp_err_set(err, FSDP_E_RUNTIME, "api-probe: " __VA_ARGS__); \
            goto done;                                                      \
        }                                                                   \
    } while (0)

/* Parameter i: read == gathered rows; scatter of 2x doubles the rows; write back the original. */
static int probe_param(fsdp_ctx *ctx, size_t i, int *nchecks, fsdp_err *err) {
    int rc = 0, checks = 0;
    fsdp_param_info in;
    float *full = NULL, *mine = NULL, *twice = NULL;
    if ((rc = fsdp_param_info_at(ctx, i, &in, err))) return rc;
    int64_t numel = 1;
    for (int d = 0; d < in.ndim; d++) numel *= in.shape[d];
    size_t local = (size_t)(in.rows * in.row_numel);
    full = malloc((size_t)numel * sizeof *full);
    mine = malloc((local ? local : 1) * sizeof *mine);
    twice = malloc((local ? local : 1) * sizeof *twice);
    CHECK(full && mine && twice, "out of memory");
    if ((rc = fsdp_param_read(ctx, i, in.row0, in.rows, FSDP_DT_F32, mine, err))) goto done;
    /* every rank is root once: its gathered tensor holds every rank's rows */
    if ((rc = fsdp_param_gather(ctx, i, 0, FSDP_DT_F32, full, err))) goto done;
    if ((rc = fsdp_broadcast(ctx, full, (size_t)numel * sizeof *full, 0, err))) goto done;
    CHECK(!memcmp(full + in.row0 * in.row_numel, mine, local * sizeof *mine), "%s: gathered rows differ from read", in.name);
    for (int64_t k = 0; k < numel; k++) full[k] *= 2;
    if ((rc = fsdp_param_scatter(ctx, i, 0, FSDP_DT_F32, full, err))) goto done;
    if ((rc = fsdp_param_read(ctx, i, in.row0, in.rows, FSDP_DT_F32, twice, err))) goto done;
    for (size_t k = 0; k < local; k++) CHECK(twice[k] == 2 * mine[k], "%s: scatter of 2x: element %zu", in.name, k);
    if ((rc = fsdp_param_write(ctx, i, in.row0, in.rows, FSDP_DT_F32, mine, err))) goto done;
    /* bf16 reads are the float32 values rounded */
    if (local) {
        uint16_t *h = malloc((size_t)in.row_numel * sizeof *h); /* one row */
        CHECK(h, "out of memory");
        rc = fsdp_param_read(ctx, i, in.row0, 1, FSDP_DT_BF16, h, err);
        float first = h ? fsdp_bf16_to_f32(h[0]) : 0;
        free(h);
        if (rc) goto done;
        CHECK(fabsf(first - mine[0]) <= fabsf(mine[0]) / 128, "%s: bf16 read", in.name);
    }
done:
    free(full);
    free(mine);
    free(twice);
    *nchecks += checks;
    return rc;
}

/* The collectives: a sum, a max, an all-gather and a broadcast of known values. */
static int probe_collectives(fsdp_ctx *ctx, int *nchecks, fsdp_err *err) {
    int rc = 0, checks = 0, r = fsdp_ctx_rank(ctx), w = fsdp_ctx_world_size(ctx);
    double sum = r;
    int64_t mx = r;
    int32_t s32 = 1;
    int *all = malloc((size_t)w * sizeof *all);
    CHECK(all, "out of memory");
    if ((rc = fsdp_allreduce(ctx, &sum, 1, FSDP_DT_F64, FSDP_SUM, err)) ||
        (rc = fsdp_allreduce(ctx, &mx, 1, FSDP_DT_I64, FSDP_MAX, err)) ||
        (rc = fsdp_allreduce(ctx, &s32, 1, FSDP_DT_I32, FSDP_SUM, err)) || (rc = fsdp_allgather(ctx, &r, sizeof r, all, err)) ||
        (rc = fsdp_barrier(ctx, err)))
        goto done;
    CHECK(sum == w * (w - 1) / 2.0, "all-reduce sum %g", sum);
    CHECK(mx == w - 1, "all-reduce max %lld", (long long)mx);
    CHECK(s32 == w, "all-reduce int32 %d", s32);
    for (int k = 0; k < w; k++) CHECK(all[k] == k, "all-gather [%d] = %d", k, all[k]);
    int v = r == w - 1 ? 42 : 0;
    if ((rc = fsdp_broadcast(ctx, &v, sizeof v, w - 1, err))) goto done;
    CHECK(v == 42, "broadcast %d", v);
done:
    free(all);
    *nchecks += checks;
    return rc;
}

/* The moments of parameter 0 round-trip (made when absent). */
static int probe_optim(fsdp_ctx *ctx, int *nchecks, fsdp_err *err) {
    int rc = 0, checks = 0;
    fsdp_param_info in;
    if ((rc = fsdp_param_info_at(ctx, 0, &in, err)) || in.rows == 0) return rc;
    size_t local = (size_t)(in.rows * in.row_numel);
    float *v = malloc(local * sizeof *v), *back = malloc(local * sizeof *back);
    CHECK(v && back, "out of memory");
    for (size_t k = 0; k < local; k++) v[k] = (float)k * 0.5f;
    if ((rc = fsdp_optim_write(ctx, 0, FSDP_EXP_AVG_SQ, in.row0, in.rows, FSDP_DT_F32, v, err)) ||
        (rc = fsdp_optim_read(ctx, 0, FSDP_EXP_AVG_SQ, in.row0, in.rows, FSDP_DT_F32, back, err)))
        goto done;
    CHECK(!memcmp(v, back, local * sizeof *v), "moments round trip");
    CHECK(fsdp_optim_step(ctx) >= 0, "optimizer step %lld", (long long)fsdp_optim_step(ctx));
done:
    free(v);
    free(back);
    *nchecks += checks;
    return rc;
}

/* A glob finds the parameters of layer 0's attention, and fsdp_param_find agrees with it. */
static int probe_glob(fsdp_ctx *ctx, int *nchecks, fsdp_err *err) {
    int rc = 0, checks = 0;
    size_t idx[64], n = 0;
    if ((rc = fsdp_param_glob(ctx, "layers.0.attention.*.weight", idx, 64, &n, err))) return rc;
    CHECK(n == 4, "layers.0.attention.*.weight matched %zu parameters", n);
    fsdp_param_info in;
    for (size_t k = 0; k < n && k < 64; k++) {
        if ((rc = fsdp_param_info_at(ctx, idx[k], &in, err))) goto done;
        CHECK(fsdp_param_find(ctx, in.name) == (long)idx[k], "find %s", in.name);
    }
    CHECK(fsdp_param_find(ctx, "no.such.weight") == -1, "find of an unknown name");
done:
    *nchecks += checks;
    return rc;
}

static int probe_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)with;
    int checks = 0, rc = probe_glob(ctx, &checks, err);
    for (size_t i = 0; i < fsdp_param_count(ctx) && !rc; i++) rc = probe_param(ctx, i, &checks, err);
    if (!rc) rc = probe_collectives(ctx, &checks, err);
    if (!rc) rc = probe_optim(ctx, &checks, err);
    if (!rc) fsdp_ctx_metric(ctx, "checks", checks);
    return rc;
}

/* ---- api-edit, api-save-at ------------------------------------------------------------------- */

static const fsdp_param_spec EDIT_PARAMS[] = {
    {"rule", FSDP_T_STRING, 0, "normal(std=0.02)", NULL, "init rule of extra.weight"},
    {"remove", FSDP_T_STRING, 0, "\"\"", NULL, "a parameter to remove"},
    {"lr_scale", FSDP_T_FLOAT, 0, "1", NULL, "scale of the learning rate from the next step"},
    {NULL, 0, 0, NULL, NULL, NULL}};

static int edit_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    int64_t s2[2] = {5, 3}, s1[1] = {7};
    int rc = fsdp_param_add(ctx, "extra.weight", 2, s2, FSDP_DT_F32, fsdp_arg_str(with, "rule", "zeros"), err);
    if (!rc) rc = fsdp_param_add(ctx, "extra.ones", 1, s1, FSDP_DT_BF16, "ones", err);
    const char *rm = fsdp_arg_str(with, "remove", "");
    long i = *rm ? fsdp_param_find(ctx, rm) : -1;
    if (!rc && *rm && i < 0) rc = fsdp_err_set(err, FSDP_E_INVALID, "api-edit: no parameter %s", rm);
    if (!rc && i >= 0) rc = fsdp_param_remove(ctx, (size_t)i, err);
    double scale = fsdp_arg_float(with, "lr_scale", 1);
    if (!rc && scale != 1) rc = fsdp_optim_set_lr(ctx, fsdp_optim_lr(ctx) * scale, err);
    return rc;
}

static const fsdp_param_spec SAVE_AT_PARAMS[] = {
    {"step", FSDP_T_INT, 1, NULL, NULL, "ask for a save after this optimizer step"},
    {"stop", FSDP_T_BOOL, 0, "false", NULL, "ask to stop there too"},
    {NULL, 0, 0, NULL, NULL, NULL}};

static int save_at(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user, fsdp_err *err) {
    (void)ctx, (void)err;
    const int64_t *at = user; /* step, stop */
    if (!m->is_eval && m->step == at[0]) *request |= FSDP_REQUEST_SAVE | (at[1] ? FSDP_REQUEST_STOP : 0u);
    return 0;
}

static int save_at_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    int64_t *at = malloc(2 * sizeof *at);
    if (!at) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    at[0] = fsdp_arg_int(with, "step", 1), at[1] = fsdp_arg_bool(with, "stop", 0);
    return fsdp_callback_add(ctx, "save-at", save_at, at, free, err);
}

static const fsdp_stage_desc EDIT = {FSDP_STAGE_DESC_INIT, "api-edit", "adds, removes, rescales the lr", EDIT_PARAMS,
                                     NULL, NULL, edit_run, NULL};
static const fsdp_stage_desc SAVE_AT = {FSDP_STAGE_DESC_INIT, "api-save-at", "asks for a save at a step",
                                        SAVE_AT_PARAMS, NULL, NULL, save_at_run, NULL};

static const fsdp_stage_desc MISUSE = {FSDP_STAGE_DESC_INIT, "api-misuse", "calls every plugin API call wrongly",
                                       MISUSE_PARAMS, NULL, NULL, misuse_run, NULL};
static const fsdp_stage_desc PROBE = {FSDP_STAGE_DESC_INIT, "api-probe", "checks the plugin API's calls",
                                      NULL, NULL, NULL, probe_run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) {
    const fsdp_stage_desc *all[] = {&MISUSE, &PROBE, &EDIT, &SAVE_AT};
    int rc = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all && !rc; i++) rc = fsdp_registry_add(reg, all[i], err);
    return rc;
}
