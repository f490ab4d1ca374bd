/* Example plugin: `average-checkpoints` sets every parameter of the model to the element-wise mean of
 * the same tensor in N checkpoints (OLMo-core's souping; checkpoint averaging), whatever world size or
 * format wrote them: each rank reads only its own rows of each (include/fsdp/ckpt.h) and writes them
 * (include/fsdp/params.h). The mean is taken in double and rounded once to float32, so it is the same
 * on every world size.
 *
 * Build:  cc -shared -fPIC -Iinclude examples/plugins/average_checkpoints.c -o libaverage_checkpoints.so
 * Use:    stages:
 *           - {id: init, uses: init-meta}
 *           - {id: soup, uses: average-checkpoints, after: [init], with: {paths: [runs/a/step-900, runs/a/step-1000]}}
 *           - {id: save, uses: save-dcp, after: [soup], with: {path: runs/a/soup}} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/ckpt.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {
    {"paths", FSDP_T_LIST, 1, NULL, NULL, "the checkpoints to average (at least one)"},
    {"prefix", FSDP_T_STRING, 0, "\"\"", NULL, "the checkpoints' key prefix before each parameter name (e.g. model.)"},
    {NULL, 0, 0, NULL, NULL, NULL}};

static const char *const NEEDS[] = {"params", NULL};

static int check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *p = fsdp_value_get(with, "paths");
    if (p && fsdp_value_size(p) < 1) return fsdp_err_at(err, FSDP_E_INVALID, p, "average-checkpoints: paths is empty");
    return 0;
}

/* Parameter i's rows: the mean over the n checkpoints, written back. */
static int average_one(fsdp_ctx *ctx, size_t i, fsdp_ckpt **ck, size_t n, const char *prefix, fsdp_err *err) {
    fsdp_param_info in;
    int rc = fsdp_param_info_at(ctx, i, &in, err);
    if (rc || in.rows == 0) return rc;
    char key[1024];
    snprintf(key, sizeof key, "%s%s", prefix, in.name);
    size_t cnt = (size_t)(in.rows * in.row_numel);
    double *acc = calloc(cnt ? cnt : 1, sizeof *acc);
    float *buf = malloc((cnt ? cnt : 1) * sizeof *buf);
    if (!acc || !buf) rc = fsdp_err_set(err, FSDP_E_NOMEM, "average-checkpoints: out of memory");
    for (size_t k = 0; k < n && !rc; k++) {
        int nd = 0;
        int64_t shape[FSDP_MAX_DIMS];
        rc = fsdp_ckpt_shape(ck[k], key, &nd, shape, NULL, err);
        for (int d = 0; !rc && d < nd; d++)
            if (nd != in.ndim || shape[d] != in.shape[d])
                rc = fsdp_err_set(err, FSDP_E_INVALID, "average-checkpoints: %s has another shape in checkpoint %zu", key,
                                  k + 1);
        if (!rc) rc = fsdp_ckpt_read(ck[k], key, in.row0, in.rows, FSDP_DT_F32, buf, err);
        for (size_t e = 0; !rc && e < cnt; e++) acc[e] += buf[e];
    }
    for (size_t e = 0; !rc && e < cnt; e++) buf[e] = (float)(acc[e] / (double)n);
    if (!rc) rc = fsdp_param_write(ctx, i, in.row0, in.rows, FSDP_DT_F32, buf, err);
    free(acc);
    free(buf);
    return rc;
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *paths = fsdp_value_get(with, "paths");
    const char *prefix = fsdp_arg_str(with, "prefix", "");
    size_t n = fsdp_value_size(paths);
    fsdp_ckpt **ck = calloc(n ? n : 1, sizeof *ck);
    if (!ck) return fsdp_err_set(err, FSDP_E_NOMEM, "average-checkpoints: out of memory");
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) rc = fsdp_ckpt_open(ctx, fsdp_value_text(fsdp_value_item(paths, k)), &ck[k], err);
    for (size_t i = 0; i < fsdp_param_count(ctx) && !rc; i++) rc = average_one(ctx, i, ck, n, prefix, err);
    for (size_t k = 0; k < n; k++) fsdp_ckpt_close(ck[k]);
    free(ck);
    if (!rc) {
        fsdp_log(ctx, FSDP_LOG_INFO, "average-checkpoints: %zu parameters are the mean of %zu checkpoints",
                 fsdp_param_count(ctx), n);
        fsdp_ctx_metric(ctx, "checkpoints", (double)n);
    }
    return rc;
}

static const fsdp_stage_desc STAGE = {FSDP_STAGE_DESC_INIT, "average-checkpoints",
                                      "set every parameter to the element-wise mean of N checkpoints",
                                      PARAMS, NEEDS, NULL, run, check};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &STAGE, err); }
