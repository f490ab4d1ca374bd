/* Helpers shared by the built-in stages. */
#include <stdlib.h>

#include "ckpt/ckpt_stale.h"
#include "runtime/ctx_impl.h"
#include "stages/stages.h"

comm *stage_comm(fsdp_ctx *ctx) {
    if (!ctx->comm) {
        /* in-process runs (tests) without a communicator get a world of 1 that lives with the context */
        comm *c = fsdp_ctx_attached(ctx, "fsdp.comm.single");
        if (!c) {
            fsdp_err err;
            if (comm_create_single(&c, &err)) return NULL;
            if (fsdp_ctx_attach(ctx, "fsdp.comm.single", c, (void (*)(void *))comm_destroy)) {
                comm_destroy(c);
                return NULL;
            }
        }
        return c;
    }
    return ctx->comm;
}

double stage_now(void) { return ctx_now(); }

static void note_warn(void *ctx, const char *msg) { fsdp_log(ctx, FSDP_LOG_WARN, "%s", msg); }

void stage_sweep_stale(fsdp_ctx *ctx, const char *path) {
    comm *c = stage_comm(ctx);
    if (!c || comm_rank(c) == 0) ckpt_stale_sweep(path, note_warn, ctx);
}

int stage_model_config(fsdp_ctx *ctx, llama_config *cfg, fsdp_err *err) {
    return llama_config_from_value(cfg, fsdp_ctx_section(ctx, "model"), err);
}

uint64_t stage_seed(fsdp_ctx *ctx, const fsdp_value *with) {
    const fsdp_value *s = fsdp_value_get(with, "seed");
    int64_t v;
    if (s && fsdp_value_int(s, &v) == 0) return (uint64_t)v;
    return (uint64_t)fsdp_arg_int(fsdp_ctx_section(ctx, "runtime"), "seed", 0);
}

int stage_state_from_config(fsdp_ctx *ctx, const llama_config *cfg, state_layout layout, llama_params *table,
                            fsdp_state **out, fsdp_err *err) {
    int rc = llama_params_build(cfg, table, err);
    if (rc) return rc;
    fsdp_state *s;
    if ((rc = state_create(ctx, layout, &s, err))) {
        llama_params_free(table);
        return rc;
    }
    s->cfg = *cfg;
    s->has_cfg = 1;
    for (int i = 0; i < table->n; i++) {
        const llama_param *p = &table->p[i];
        if ((rc = state_add_param(s, p->name, p->ndim, p->shape, p->layer, err))) {
            llama_params_free(table);
            return rc;
        }
    }
    *out = s;
    return 0;
}

int stage_init_values(fsdp_state *s, const llama_params *table, uint64_t seed, fsdp_dtype dtype, fsdp_err *err) {
    /* every local shard in one parallel fill (llama_init_jobs): small parameters side by side,
     * bf16 rounding done by the same threads on the freshly written values */
    llama_init_job *jobs = calloc((size_t)(table->n > 0 ? table->n : 1), sizeof *jobs);
    if (!jobs) return fsdp_err_set(err, FSDP_E_NOMEM, "init: out of memory for %d parameters", table->n);
    int n = 0;
    for (int i = 0; i < table->n; i++) {
        state_param *sp = &s->p[i];
        sp->dtype = dtype;
        if (sp->rows == 0) continue;
        jobs[n].p = &table->p[i];
        jobs[n].r0 = sp->row0;
        jobs[n].r1 = sp->row0 + sp->rows;
        jobs[n].f32 = sp->data;
        jobs[n].round_bf16 = dtype == FSDP_DT_BF16;
        n++;
    }
    int rc = llama_init_jobs(jobs, n, seed, err);
    free(jobs);
    return rc ? fsdp_err_prefix(err, "init") : 0;
}

static const char *const INIT_DTYPES[] = {"f32", "bf16", NULL};
const fsdp_param_spec stage_init_params[] = {
    {"seed", FSDP_T_INT, 0, NULL, NULL, "init seed (default: runtime.seed)"},
    {"dtype", FSDP_T_STRING, 0, "f32", INIT_DTYPES, "parameter dtype (bf16 rounds the f32 draw)"},
    {NULL, 0, 0, NULL, NULL, NULL}};

int stage_init_model(fsdp_ctx *ctx, const fsdp_value *with, state_layout layout, llama_config *cfg, int64_t *total,
                     fsdp_err *err) {
    int rc = stage_model_config(ctx, cfg, err);
    if (rc) return rc;
    int on_gpu = 0;
    dev_ctx *d = NULL;
    if (layout == STATE_SHARDED && (rc = stage_on_gpu(ctx, &on_gpu, err))) return rc;
    if (on_gpu && (rc = stage_device(ctx, &d, err))) return rc;
    fsdp_ctx_metric_str(ctx, "device", on_gpu ? "cuda" : "cpu");
    llama_params table;
    fsdp_state *s;
    if ((rc = stage_state_from_config(ctx, cfg, layout, &table, &s, err))) return rc;
    fsdp_dtype dt = fsdp_dtype_from_name(fsdp_arg_str(with, "dtype", "f32"));
    rc = d ? stage_init_values_dev(s, &table, d, stage_seed(ctx, with), dt, err)
           : stage_init_values(s, &table, stage_seed(ctx, with), dt, err);
    *total = table.total;
    llama_params_free(&table);
    return rc;
}
