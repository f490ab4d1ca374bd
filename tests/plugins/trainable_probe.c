/* Test plugin of the trainable flags (include/fsdp/params.h, stage ABI 1.2): stage `trainable-probe`
 * appends "NAME TRAINABLE HAS_MOMENTS" for every parameter to `file` (rank 0), after making the
 * parameters named in `buffers` buffers (fsdp_param_set_trainable 0) and those in `train` trainable
 * again; with `in_callback: true` it registers a callback that writes the same lines at optimizer step
 * 1 instead (what a callback sees while train-steps runs with freeze:); `nan_into` first writes NaN into
 * row 0 of that parameter. */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/callbacks.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {{"file", FSDP_T_STRING, 1, NULL, NULL, "where the lines go"},
                                         {"buffers", FSDP_T_STRING, 0, NULL, NULL, "a glob: these become buffers"},
                                         {"train", FSDP_T_STRING, 0, NULL, NULL, "a glob: these become trainable"},
                                         {"in_callback", FSDP_T_BOOL, 0, "false", NULL, "write at step 1"},
                                         {"nan_into", FSDP_T_STRING, 0, NULL, NULL, "NaN into row 0 of this parameter"},
                                         {NULL, 0, 0, NULL, NULL, NULL}};

static int dump(fsdp_ctx *ctx, const char *file, fsdp_err *err) {
    if (fsdp_ctx_rank(ctx) != 0) return 0;
    FILE *f = fopen(file, "a");
    if (!f) return fsdp_err_set(err, FSDP_E_IO, "trainable-probe: cannot open %s", file);
    for (size_t i = 0; i < fsdp_param_count(ctx); i++) {
        fsdp_param_info in;
        int rc = fsdp_param_info_at(ctx, i, &in, err);
        if (rc) {
            fclose(f);
            return rc;
        }
        fprintf(f, "%s %d %d\n", in.name, fsdp_param_trainable(ctx, i), in.has_optimizer);
    }
    fclose(f);
    return 0;
}

static int at_step(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user, fsdp_err *err) {
    (void)request;
    return m->is_eval || m->step != 1 ? 0 : dump(ctx, (const char *)user, err);
}

/* NaN into global row 0 of parameter `name` (on the rank that holds it). */
static int put_nan(fsdp_ctx *ctx, const char *name, fsdp_err *err) {
    long i = fsdp_param_find(ctx, name);
    fsdp_param_info in;
    int rc = i < 0 ? fsdp_err_set(err, FSDP_E_INVALID, "trainable-probe: no %s", name) : fsdp_param_info_at(ctx, (size_t)i, &in, err);
    if (rc || in.row0 != 0 || in.rows < 1) return rc;
    float *row = calloc((size_t)in.row_numel, sizeof *row);
    if (!row) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    row[0] = NAN;
    rc = fsdp_param_write(ctx, (size_t)i, 0, 1, FSDP_DT_F32, row, err);
    free(row);
    return rc;
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    const char *nan_into = fsdp_arg_str(with, "nan_into", NULL);
    if (nan_into) {
        int rc = put_nan(ctx, nan_into, err);
        if (rc) return rc;
    }
    const char *file = fsdp_arg_str(with, "file", ""), *buf = fsdp_arg_str(with, "buffers", ""),
               *tr = fsdp_arg_str(with, "train", "");
    for (size_t i = 0; i < fsdp_param_count(ctx); i++) {
        fsdp_param_info in;
        int rc = fsdp_param_info_at(ctx, i, &in, err);
        if (!rc && *buf && !fnmatch(buf, in.name, 0)) rc = fsdp_param_set_trainable(ctx, i, 0, err);
        if (!rc && *tr && !fnmatch(tr, in.name, 0)) rc = fsdp_param_set_trainable(ctx, i, 1, err);
        if (rc) return rc;
    }
    if (!fsdp_arg_bool(with, "in_callback", 0)) return dump(ctx, file, err);
    char *dup = strdup(file);
    if (!dup) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return fsdp_callback_add(ctx, "trainable-probe", at_step, dup, free, err);
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_DESC_INIT, "trainable-probe", "what fsdp_param_trainable says", PARAMS,
                                     NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
