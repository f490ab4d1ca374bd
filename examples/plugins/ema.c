/* Example plugin: `ema` keeps an exponential moving average of every trained parameter as buffers of
 * the model (include/fsdp/params.h's fsdp_param_set_trainable, stage ABI 1.2): `ema.<name>` beside each
 * parameter, saved in every checkpoint (train-steps' periodic ones, save-dcp), resharded and exported
 * like the others, never trained (no moments, no weight decay, not in the gradient norm). After every
 * `every`-th optimizer step of the train-steps that follow, on every rank over its own rows:
 *
 *     ema = decay * ema + (1 - decay) * weight      (float32: a = (float)decay, b = (float)(1 - decay),
 *                                                    ema = a * ema + b * weight, as numpy computes it)
 *
 * The EMA starts as a copy of the weights, or from the `ema.*` tensors of checkpoint `resume_from` (a
 * resumed run continues its average). The plain model loads such a checkpoint strictly with
 * `exclude: ["ema.**"]` (load-ckpt), or takes the average as its weights with `prefixes`/`keys`.
 *
 * Build:  cc -shared -fPIC -Iinclude examples/plugins/ema.c -o libema.so
 * Use:    plugins: [build/plugins/libema.so]
 *         stages:
 *           - {id: i, uses: init-meta}
 *           - {id: ema, uses: ema, after: [i], with: {decay: 0.999}}
 *           - {id: t, uses: train-steps, after: [ema], with: {steps: 1000, save_every: 100, save_path: ckpt}} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/callbacks.h"
#include "fsdp/ckpt.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {
    {"decay", FSDP_T_FLOAT, 0, "0.999", NULL, "the average's decay per update, in [0, 1)"},
    {"every", FSDP_T_INT, 0, "1", NULL, "update after every N-th optimizer step"},
    {"prefix", FSDP_T_STRING, 0, "ema.", NULL, "the averages' names: prefix + the parameter's"},
    {"resume_from", FSDP_T_STRING, 0, NULL, NULL, "a checkpoint whose prefix tensors start the average"},
    {NULL, 0, 0, NULL, NULL, NULL}};

typedef struct ema {
    float a, b;
    int64_t every;
    char prefix[64];
    char **names; /* the averaged parameters */
    size_t n;
    float *w, *e; /* scratch: one parameter's local rows */
    size_t cap;
} ema;

static void ema_free(void *p) {
    ema *m = p;
    for (size_t i = 0; m && i < m->n; i++) free(m->names[i]);
    if (m) free(m->names), free(m->w), free(m->e);
    free(m);
}

/* Scratch for numel floats. */
static int room(ema *m, size_t numel, fsdp_err *err) {
    if (numel <= m->cap) return 0;
    float *w = realloc(m->w, numel * sizeof *w), *e = w ? realloc(m->e, numel * sizeof *e) : NULL;
    if (w) m->w = w;
    if (e) m->e = e;
    if (!w || !e) return fsdp_err_set(err, FSDP_E_NOMEM, "ema: out of memory");
    m->cap = numel;
    return 0;
}

/* One average: a = decay * a + (1 - decay) * w over this rank's rows of parameter `name`. */
static int update_one(fsdp_ctx *ctx, ema *m, const char *name, fsdp_err *err) {
    char en[512];
    snprintf(en, sizeof en, "%s%s", m->prefix, name);
    long i = fsdp_param_find(ctx, name), k = fsdp_param_find(ctx, en);
    if (i < 0 || k < 0) return fsdp_err_set(err, FSDP_E_INVALID, "ema: %s or %s is gone from the model", name, en);
    fsdp_param_info in;
    int rc = fsdp_param_info_at(ctx, (size_t)i, &in, err);
    size_t numel = rc ? 0 : (size_t)(in.rows * in.row_numel);
    if (!rc) rc = room(m, numel, err);
    if (!rc) rc = fsdp_param_read(ctx, (size_t)i, in.row0, in.rows, FSDP_DT_F32, m->w, err);
    if (!rc) rc = fsdp_param_read(ctx, (size_t)k, in.row0, in.rows, FSDP_DT_F32, m->e, err);
    for (size_t j = 0; !rc && j < numel; j++) m->e[j] = m->a * m->e[j] + m->b * m->w[j];
    if (!rc) rc = fsdp_param_write(ctx, (size_t)k, in.row0, in.rows, FSDP_DT_F32, m->e, err);
    return rc;
}

static int on_step(fsdp_ctx *ctx, const fsdp_step_metrics *s, unsigned *request, void *user, fsdp_err *err) {
    (void)request;
    ema *m = user;
    if (s->is_eval || s->step % m->every) return 0;
    for (size_t i = 0; i < m->n; i++) {
        int rc = update_one(ctx, m, m->names[i], err);
        if (rc) return rc;
    }
    return 0;
}

/* The average of parameter i starts: a buffer of its shape and dtype, this rank's rows copied from the
 * weights or read from `from`. */
static int start_one(fsdp_ctx *ctx, ema *m, size_t i, fsdp_ckpt *from, fsdp_err *err) {
    fsdp_param_info in;
    int rc = fsdp_param_info_at(ctx, i, &in, err);
    if (rc) return rc;
    char *name = strdup(in.name), en[512];
    char **nn = name ? realloc(m->names, (m->n + 1) * sizeof *nn) : NULL;
    if (!nn) {
        free(name);
        return fsdp_err_set(err, FSDP_E_NOMEM, "ema: out of memory");
    }
    m->names = nn;
    m->names[m->n++] = name;
    snprintf(en, sizeof en, "%s%s", m->prefix, name);
    int ndim = in.ndim;
    int64_t shape[FSDP_MAX_DIMS], row0 = in.row0, rows = in.rows;
    memcpy(shape, in.shape, sizeof shape);
    fsdp_dtype dt = in.dtype;
    size_t numel = (size_t)(rows * in.row_numel);
    if ((rc = fsdp_param_add(ctx, en, ndim, shape, dt, "none", err))) return rc;
    long k = fsdp_param_find(ctx, en);
    if ((rc = fsdp_param_set_trainable(ctx, (size_t)k, 0, err)) || (rc = room(m, numel, err))) return rc;
    long w = fsdp_param_find(ctx, name);
    rc = from ? fsdp_ckpt_read(from, en, row0, rows, FSDP_DT_F32, m->e, err)
              : fsdp_param_read(ctx, (size_t)w, row0, rows, FSDP_DT_F32, m->e, err);
    return rc ? rc : fsdp_param_write(ctx, (size_t)k, row0, rows, FSDP_DT_F32, m->e, err);
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    double decay = fsdp_arg_float(with, "decay", 0.999);
    if (!(decay >= 0 && decay < 1)) return fsdp_err_set(err, FSDP_E_INVALID, "ema: decay %g is not in [0, 1)", decay);
    ema *m = calloc(1, sizeof *m);
    if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "ema: out of memory");
    m->a = (float)decay;
    m->b = (float)(1.0 - decay);
    m->every = fsdp_arg_int(with, "every", 1);
    snprintf(m->prefix, sizeof m->prefix, "%s", fsdp_arg_str(with, "prefix", "ema."));
    const char *resume = fsdp_arg_str(with, "resume_from", NULL);
    fsdp_ckpt *from = NULL;
    int rc = m->every < 1 ? fsdp_err_set(err, FSDP_E_INVALID, "ema: every must be >= 1") : 0;
    if (!rc && resume) rc = fsdp_ckpt_open(ctx, resume, &from, err);
    size_t n = fsdp_param_count(ctx);
    for (size_t i = 0; i < n && !rc; i++) /* the parameters there were before the averages were added */
        if (fsdp_param_trainable(ctx, i) == 1) rc = start_one(ctx, m, i, from, err);
    fsdp_ckpt_close(from);
    if (!rc) fsdp_log(ctx, FSDP_LOG_INFO, "ema: %zu averages (decay %g, every %lld steps)", m->n, decay, (long long)m->every);
    if (!rc) return fsdp_callback_add(ctx, "ema", on_step, m, ema_free, err);
    ema_free(m);
    return rc;
}

static const fsdp_stage_desc STAGE = {FSDP_STAGE_DESC_INIT, "ema", "an exponential moving average of the weights",
                                      PARAMS, NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &STAGE, err); }
