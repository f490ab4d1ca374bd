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

static int verify_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "verify: no model in the context");
    comm *c = stage_comm(ctx);
    const char *against = fsdp_arg_str(with, "against", NULL);
    double rtol = fsdp_arg_float(with, "rtol", 0), atol = fsdp_arg_float(with, "atol", 0);
    ckpt_reader *r = NULL;
    int rc = mt_state_check_values(s, "verify", err);
    if (rc) return rc;
    char at[4400];
    int restarts = 0;
    snprintf(at, sizeof at, "%s", against ? against : "");
    if (against && (rc = ckpt_open_agreed(c, CKPT_AUTO, NULL, NULL, at, sizeof at, &r, &restarts, err))) return rc;
    if (restarts)
        fsdp_log(ctx, FSDP_LOG_WARN, "verify: %s changed while it was being opened (a save replaced it); read the new "
                 "save (%d restart%s)", at, restarts, restarts == 1 ? "" : "s");
    int64_t bad_total = 0, mismatched = 0;
    char first_bad[256] = "";
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *p = &s->p[i];
        /* a 0-d value is replicated on every rank of a sharded state: rank 0 counts it */
        size_t n = p->ndim == 0 && s->layout == STATE_SHARDED && comm_rank(c) != 0 ? 0 : state_param_local_numel(p);
        float *data; /* this rank's rows in host memory (downloaded from the GPU when there) */
        if ((rc = state_param_map(s, p, STATE_DATA, &data, err))) break;
        /* [sum, sumsq, nonfinite, maxabs, maxdiff, maxrel, out-of-tolerance] */
        double v[7] = {0, 0, 0, 0, 0, 0, 0};
        for (size_t k = 0; k < n; k++) {
            double x = data[k];
            if (!isfinite(x)) {
                v[2]++;
                continue;
            }
            v[0] += x;
            v[1] += x * x;
            if (fabs(x) > v[3]) v[3] = fabs(x);
        }
        if (r) {
            long ci = ckpt_find(r, p->name);
            const ckpt_entry *e = ci >= 0 ? ckpt_entry_at(r, (size_t)ci) : NULL;
            if (!e || e->ndim != p->ndim || memcmp(e->shape, p->shape, (size_t)p->ndim * sizeof *p->shape)) {
                v[6] = 1;
            } else if (n) {
                float *ref = malloc(n * sizeof *ref);
                if (!ref) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                else rc = ckpt_read_rows(r, (size_t)ci, p->row0, p->row0 + p->rows, ref, FSDP_DT_F32, err);
                for (size_t k = 0; !rc && k < n; k++) {
                    double d = fabs((double)data[k] - ref[k]);
                    if (isnan(data[k]) || isnan(ref[k])) d = isnan(data[k]) && isnan(ref[k]) ? 0 : INFINITY;
                    if (d > v[4]) v[4] = d;
                    double rel = ref[k] != 0 ? d / fabs(ref[k]) : (d > 0 ? INFINITY : 0);
                    if (rel > v[5]) v[5] = rel;
                    if (d > atol + rtol * fabs(ref[k])) v[6]++;
                }
                free(ref);
            }
        }
        fsdp_err e2;
        state_param_unmap(s, p, STATE_DATA, data, 0, &e2);
        if (rc) break;
        double sums[3] = {v[0], v[1], v[2] + v[6]}, maxes[3] = {v[3], v[4], v[5]};
        if ((rc = comm_allreduce(c, sums, 3, COMM_F64, COMM_SUM, err)) ||
            (rc = comm_allreduce(c, maxes, 3, COMM_F64, COMM_MAX, err)))
            break;
        double v6 = v[6];
        if ((rc = comm_allreduce(c, &v6, 1, COMM_F64, COMM_SUM, err))) break;
        double nonfinite = sums[2] - v6;
        if (fsdp_arg_bool(with, "digest", 1))
            fsdp_log(ctx, FSDP_LOG_INFO, "verify %-40s sum %+.9e sumsq %.9e max|x| %.6g%s", p->name, sums[0], sums[1],
                     maxes[0], nonfinite ? "  NON-FINITE VALUES" : "");
        if (nonfinite > 0) {
            bad_total += (int64_t)nonfinite;
            if (!first_bad[0]) snprintf(first_bad, sizeof first_bad, "%s", p->name);
        }
        if (r && v6 > 0) {
            mismatched++;
            if (fsdp_ctx_rank(ctx) == 0)
                fsdp_log(ctx, FSDP_LOG_WARN, "verify: %s differs from %s: max abs diff %.6g, max rel diff %.6g", p->name,
                     against, maxes[1], maxes[2]);
        }
    }
    ckpt_close(r);
    if (rc) return rc;
    fsdp_ctx_metric(ctx, "nonfinite", (double)bad_total);
    fsdp_ctx_metric(ctx, "mismatched", (double)mismatched);
    if (bad_total)
        return fsdp_err_set(err, FSDP_E_NUMERIC, "verify: %lld NaN/Inf values (first in %s)", (long long)bad_total,
                            first_bad);
    if (mismatched)
        return fsdp_err_set(err, FSDP_E_NUMERIC, "verify: %lld parameters differ from %s beyond rtol %g / atol %g",
                            (long long)mismatched, against, rtol, atol);
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
