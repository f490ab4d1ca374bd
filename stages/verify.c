/* Stage `verify`: checks every parameter for NaN/Inf, prints a digest per tensor (the same
 * on every world size), and with `against: PATH` compares with any checkpoint (DCP,
 * safetensors, .pt), each rank its own rows; fails the run on a mismatch. Rows on the GPU are
 * downloaded one parameter at a time.
 *
 * with: against (path), rtol (float, 0), atol (float, 0), digest (bool, true) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_agree.h"
#include "ckpt/reader.h"
#include "stages/stages.h"
#include "model/mt_state.h"

static const fsdp_param_spec PARAMS[] = {
    {"against", FSDP_T_STRING, 0, NULL, NULL, "a checkpoint to compare with"},
    {"rtol", FSDP_T_FLOAT, 0, "0", NULL, "relative tolerance of the comparison"},
    {"atol", FSDP_T_FLOAT, 0, "0", NULL, "absolute tolerance of the comparison"},
    {"digest", FSDP_T_BOOL, 0, "true", NULL, "log sum, sum of squares and max |x| per tensor"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params|full_params", NULL};

/* What verify_run carries from parameter to parameter: the settings, the checkpoint compared
 * with (if any) and the counts so far. */
typedef struct verify_job {
    fsdp_ctx *ctx;
    const fsdp_value *with;
    fsdp_state *s;
    comm *c;
    const char *against;
    double rtol, atol;
    ckpt_reader *r;
    int64_t bad_total, mismatched;
    char first_bad[256];
} verify_job;

/* A parameter's statistics: [sum, sumsq, nonfinite, maxabs, maxdiff, maxrel, out-of-tolerance]. */
enum { V_SUM, V_SUMSQ, V_NONFINITE, V_MAXABS, V_MAXDIFF, V_MAXREL, V_OUT, V_N };

/* Opens the checkpoint of `against` (the same save on every rank), warning when a save replaced
 * it meanwhile. */
static int verify_open_against(verify_job *j, fsdp_err *err) {
    char at[4400];
    int restarts = 0, rc;
    snprintf(at, sizeof at, "%s", j->against ? j->against : "");
    if (j->against && (rc = ckpt_open_agreed(j->c, CKPT_AUTO, NULL, NULL, at, sizeof at, &j->r, &restarts, err)))
        return rc;
    if (restarts)
        fsdp_log(j->ctx, FSDP_LOG_WARN,
                 "verify: %s changed while it was being opened (a save replaced it); read the new save (%d restart%s)",
                 at, restarts, restarts == 1 ? "" : "s");
    return 0;
}

/* Sum, sum of squares and max |x| of the finite values; the non-finite ones counted. */
static void verify_digest(const float *data, size_t n, double *v) {
    for (size_t k = 0; k < n; k++) {
        double x = data[k];
        if (!isfinite(x)) {
            v[V_NONFINITE]++;
            continue;
        }
        v[V_SUM] += x;
        v[V_SUMSQ] += x * x;
        if (fabs(x) > v[V_MAXABS]) v[V_MAXABS] = fabs(x);
    }
}

/* This rank's rows against the checkpoint's: max abs and rel differences, values out of
 * tolerance (a missing or differently shaped entry counts as one). */
static int verify_compare(const verify_job *j, const state_param *p, const float *data, size_t n, double *v,
                          fsdp_err *err) {
    long ci = ckpt_find(j->r, p->name);
    const ckpt_entry *e = ci >= 0 ? ckpt_entry_at(j->r, (size_t)ci) : NULL;
    if (!e || e->ndim != p->ndim || memcmp(e->shape, p->shape, (size_t)p->ndim * sizeof *p->shape)) {
        v[V_OUT] = 1;
        return 0;
    }
    if (!n) return 0;
    int rc;
    float *ref = malloc(n * sizeof *ref);
    if (!ref) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    else rc = ckpt_read_rows(j->r, (size_t)ci, p->row0, p->row0 + p->rows, ref, FSDP_DT_F32, err);
    for (size_t k = 0; !rc && k < n; k++) {
        double d = fabs((double)data[k] - ref[k]);
        if (isnan(data[k]) || isnan(ref[k])) d = isnan(data[k]) && isnan(ref[k]) ? 0 : INFINITY;
        if (d > v[V_MAXDIFF]) v[V_MAXDIFF] = d;
        double rel = ref[k] != 0 ? d / fabs(ref[k]) : (d > 0 ? INFINITY : 0);
        if (rel > v[V_MAXREL]) v[V_MAXREL] = rel;
        if (d > j->atol + j->rtol * fabs(ref[k])) v[V_OUT]++;
    }
    free(ref);
    return rc;
}

/* The world's statistics of parameter p (v: this rank's): its digest line, non-finite values and
 * a mismatch counted. */
static int verify_reduce_and_report(verify_job *j, const state_param *p, const double *v, fsdp_err *err) {
    fsdp_ctx *ctx = j->ctx;
    double sums[3] = {v[V_SUM], v[V_SUMSQ], v[V_NONFINITE] + v[V_OUT]};
    double maxes[3] = {v[V_MAXABS], v[V_MAXDIFF], v[V_MAXREL]};
    int rc;
    if ((rc = comm_allreduce(j->c, sums, 3, COMM_F64, COMM_SUM, err)) ||
        (rc = comm_allreduce(j->c, maxes, 3, COMM_F64, COMM_MAX, err)))
        return rc;
    double v6 = v[V_OUT];
    if ((rc = comm_allreduce(j->c, &v6, 1, COMM_F64, COMM_SUM, err))) return rc;
    double nonfinite = sums[2] - v6;
    if (fsdp_arg_bool(j->with, "digest", 1))
        fsdp_log(ctx, FSDP_LOG_INFO, "verify %-40s sum %+.9e sumsq %.9e max|x| %.6g%s", p->name, sums[0], sums[1],
                 maxes[0], nonfinite ? "  NON-FINITE VALUES" : "");
    if (nonfinite > 0) {
        j->bad_total += (int64_t)nonfinite;
        if (!j->first_bad[0]) snprintf(j->first_bad, sizeof j->first_bad, "%s", p->name);
    }
    if (j->r && v6 > 0) {
        j->mismatched++;
        if (fsdp_ctx_rank(ctx) == 0)
            fsdp_log(ctx, FSDP_LOG_WARN, "verify: %s differs from %s: max abs diff %.6g, max rel diff %.6g", p->name,
                     j->against, maxes[1], maxes[2]);
    }
    return 0;
}

/* One parameter: this rank's rows (in host memory) digested and compared, then reported. */
static int verify_param(verify_job *j, state_param *p, fsdp_err *err) {
    fsdp_state *s = j->s;
    /* a 0-d value is replicated on every rank of a sharded state: rank 0 counts it */
    size_t n = p->ndim == 0 && s->layout == STATE_SHARDED && comm_rank(j->c) != 0 ? 0 : state_param_local_numel(p);
    float *data; /* this rank's rows in host memory (downloaded from the GPU when there) */
    int rc = state_param_map(s, p, STATE_DATA, &data, err);
    if (rc) return rc;
    double v[V_N] = {0, 0, 0, 0, 0, 0, 0};
    verify_digest(data, n, v);
    if (j->r) rc = verify_compare(j, p, data, n, v, err);
    fsdp_err e2;
    state_param_unmap(s, p, STATE_DATA, data, 0, &e2);
    if (rc) return rc;
    return verify_reduce_and_report(j, p, v, err);
}

static int verify_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "verify: no model in the context");
    verify_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.with = with;
    j.s = s;
    j.c = stage_shard_comm(ctx); /* the state's rows: replicas hold the same */
    j.against = fsdp_arg_str(with, "against", NULL);
    j.rtol = fsdp_arg_float(with, "rtol", 0);
    j.atol = fsdp_arg_float(with, "atol", 0);
    int rc = mt_state_check_values(s, "verify", err);
    if (rc) return rc;
    if ((rc = verify_open_against(&j, err))) return rc;
    for (size_t i = 0; i < s->n && !rc; i++) rc = verify_param(&j, &s->p[i], err);
    ckpt_close(j.r);
    if (rc) return rc;
    fsdp_ctx_metric(ctx, "nonfinite", (double)j.bad_total);
    fsdp_ctx_metric(ctx, "mismatched", (double)j.mismatched);
    if (j.bad_total)
        return fsdp_err_set(err, FSDP_E_NUMERIC, "verify: %lld NaN/Inf values (first in %s)", (long long)j.bad_total,
                            j.first_bad);
    if (j.mismatched)
        return fsdp_err_set(err, FSDP_E_NUMERIC, "verify: %lld parameters differ from %s beyond rtol %g / atol %g",
                            (long long)j.mismatched, j.against, j.rtol, j.atol);
    return 0;
}

const fsdp_stage_desc stage_verify = {
    FSDP_STAGE_DESC_INIT,
    "verify",
    "check for NaN/Inf, log a digest per tensor, compare with a checkpoint (tolerances)",
    PARAMS,
    NEEDS,
    NULL,
    verify_run,
    NULL,
};
