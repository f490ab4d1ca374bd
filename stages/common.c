/* Helpers shared by the built-in stages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_stale.h"
#include "model/init_defer.h"
#include "model/init_fill.h"
#include "decoder/decoder_table.h"
#include "decoder/decoder_spec.h"
#include "model/mt_spec.h"
#include "runtime/ctx_impl.h"
#include "stages/stages.h"

comm *stage_comm(fsdp_ctx *ctx) { return ctx_world_comm(ctx); }
comm *stage_shard_comm(fsdp_ctx *ctx) { return ctx_shard_comm(ctx); }
comm *stage_replicate_comm(fsdp_ctx *ctx) { return ctx_replicate_comm(ctx); }

double stage_now(void) { return ctx_now(); }

static void note_warn(void *ctx, const char *msg) { fsdp_log(ctx, FSDP_LOG_WARN, "%s", msg); }

void stage_sweep_stale(fsdp_ctx *ctx, const char *path) {
    comm *c = stage_comm(ctx);
    if (!c || comm_rank(c) == 0) ckpt_stale_sweep(path, note_warn, ctx);
}

int stage_model_config(fsdp_ctx *ctx, decoder_config *cfg, fsdp_err *err) {
    return decoder_spec_from_value(cfg, fsdp_ctx_section(ctx, "model"), err);
}

uint64_t stage_seed(fsdp_ctx *ctx, const fsdp_value *with) {
    const fsdp_value *s = fsdp_value_get(with, "seed");
    int64_t v;
    if (s && fsdp_value_int(s, &v) == 0) return (uint64_t)v;
    return (uint64_t)fsdp_arg_int(fsdp_ctx_section(ctx, "runtime"), "seed", 0);
}

int stage_model_table(fsdp_ctx *ctx, mt_table *out, fsdp_err *err) {
    const fsdp_value *m = fsdp_ctx_section(ctx, "model");
    if (mt_spec_is_table(m)) {
        mt_spec_opts o = {0, &decoder_table_arch};
        return mt_spec_build(m, &o, out, err);
    }
    /* the built-in arch form: the Llama-family config of the recipe, as a table */
    mt_init(out);
    decoder_config cfg;
    int rc = mt_spec_check_arch_keys(m, err);
    if (!rc) rc = stage_model_config(ctx, &cfg, err);
    char where[512] = "";
    if (m) {
        const char *file;
        int line, col;
        fsdp_value_where(m, &file, &line, &col);
        snprintf(where, sizeof where, "%s:%d:%d", file, line, col);
    }
    if (!rc) rc = decoder_table_build(&cfg, m ? where : NULL, out, err);
    if (rc) mt_free(out);
    return rc;
}

int stage_state_from_table(fsdp_ctx *ctx, mt_table *t, state_layout layout, fsdp_state **out, fsdp_err *err) {
    fsdp_state *s;
    mt_table *own = malloc(sizeof *own);
    if (!own) {
        mt_free(t);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    mt_move(own, t);
    int rc = state_create(ctx, layout, &s, err);
    if (rc) {
        mt_free(own);
        free(own);
        return rc;
    }
    s->model = own;
    s->model_free = mt_destroy;
    if ((rc = decoder_state_set_config(s, decoder_table_config(own), err))) return rc;
    for (size_t i = 0; i < own->n; i++) {
        const mt_param *p = &own->p[i];
        if ((rc = state_add_param(s, p->name, p->ndim, p->shape, p->layer, err))) return rc;
        state_param *sp = &s->p[s->n - 1];
        sp->dtype = p->dtype;
        sp->buffer = p->frozen;
        sp->no_value = 1; /* until an init, a load or a copy gives it one */
    }
    *out = s;
    return 0;
}

/* The dtype a parameter is initialised in: the stage's `dtype` when not auto, else its own. */
static fsdp_dtype init_dtype(const state_param *sp, fsdp_dtype over) { return over ? over : sp->dtype; }

/* Deferred init (stage_init_values' defer): each parameter's rows drawn when they are needed, or NaN. */
static int init_defer_all(fsdp_state *s, uint64_t seed, fsdp_dtype over, fsdp_err *err) {
    const mt_table *t = s->model;
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *sp = &s->p[i];
        const mt_param *p = &t->p[i];
        sp->dtype = init_dtype(sp, over);
        if (p->init.kind == INIT_NONE) {
            rc = state_param_defer(s, sp, NULL, FSDP_DT_INVALID, err);
            continue;
        }
        init_job j;
        memset(&j, 0, sizeof j);
        if ((rc = mt_param_init_job(p, &j, err))) break;
        j.dtype = sp->dtype;
        rc = init_defer_param(s, sp, &j, seed, err);
    }
    return rc;
}

int stage_init_values(fsdp_state *s, uint64_t seed, fsdp_dtype over, int defer, fsdp_err *err) {
    /* every local shard in one parallel fill (init_fill_jobs): small parameters side by side, the
     * rounding to bf16 / f16 done by the same threads on the freshly written values */
    const mt_table *t = s->model;
    if (!t || t->n != s->n) return fsdp_err_set(err, FSDP_E_INVALID, "init: the state has no model table");
    if (defer && s->layout == STATE_SHARDED && !s->dev) return init_defer_all(s, seed, over, err);
    init_job *jobs = calloc(s->n ? s->n : 1, sizeof *jobs);
    if (!jobs) return fsdp_err_set(err, FSDP_E_NOMEM, "init: out of memory for %zu parameters", s->n);
    int n = 0, rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *sp = &s->p[i];
        const mt_param *p = &t->p[i];
        sp->dtype = init_dtype(sp, over);
        sp->no_value = p->init.kind == INIT_NONE;
        if (sp->rows == 0) continue;
        /* a parameter without a value holds NaN until a load or a copy gives it one: filled by the same
         * threads as the draws (its first touch of fresh pages is most of an init that loads) */
        if (sp->no_value) rng_dist_const(&jobs[n].dist, NAN);
        else if ((rc = mt_param_init_job(p, &jobs[n], err))) break;
        jobs[n].e0 = sp->row0 * sp->row_numel;
        jobs[n].n = (int64_t)state_param_local_numel(sp);
        jobs[n].f32 = sp->data;
        jobs[n].dtype = sp->no_value ? FSDP_DT_F32 : sp->dtype;
        n++;
    }
    if (!rc) rc = init_fill_jobs(jobs, n, seed, "init", err);
    free(jobs);
    return rc;
}

static const char *const INIT_DTYPES[] = {"auto", "f32", "bf16", "f16", NULL};
const fsdp_param_spec stage_init_params[] = {
    {"seed", FSDP_T_INT, 0, NULL, NULL, "init seed (default: runtime.seed)"},
    {"dtype", FSDP_T_STRING, 0, "auto", INIT_DTYPES,
     "dtype of every parameter (auto: each its own from the model; bf16 / f16 round the f32 draw)"},
    {NULL, 0, 0, NULL, NULL, NULL}};

int stage_init_model(fsdp_ctx *ctx, const fsdp_value *with, state_layout layout, fsdp_state **out, fsdp_err *err) {
    mt_table t;
    int rc = stage_model_table(ctx, &t, err);
    if (rc) return rc;
    int on_gpu = 0;
    dev_ctx *d = NULL;
    if (layout == STATE_SHARDED && !rc) rc = stage_on_gpu(ctx, &on_gpu, err);
    if (on_gpu && !rc) rc = stage_device(ctx, &d, err);
    if (rc) {
        mt_free(&t);
        return rc;
    }
    fsdp_ctx_metric_str(ctx, "device", on_gpu ? "cuda" : "cpu");
    fsdp_state *s;
    if ((rc = stage_state_from_table(ctx, &t, layout, &s, err))) return rc;
    const char *dts = fsdp_arg_str(with, "dtype", "auto");
    fsdp_dtype over = strcmp(dts, "auto") ? fsdp_dtype_from_name(dts) : FSDP_DT_INVALID;
    rc = d ? stage_init_values_dev(s, d, stage_seed(ctx, with), over, err)
           : stage_init_values(s, stage_seed(ctx, with), over, layout == STATE_SHARDED && state_defer_allowed(ctx), err);
    *out = s;
    return rc;
}
