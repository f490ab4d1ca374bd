/* Reading checkpoints from a plugin (include/fsdp/ckpt.h), through ckpt/reader.h. */
#include "fsdp/ckpt.h"

#include <stdlib.h>
#include <string.h>

#include "api/api_util.h"
#include "ckpt/reader.h"
#include "runtime/err_local.h"

struct fsdp_ckpt {
    fsdp_ctx *ctx;
    ckpt_reader *r;
    char *path;
};

int fsdp_ckpt_open(fsdp_ctx *ctx, const char *path, fsdp_ckpt **out, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_ckpt_open";
    if (!out || !path) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL path or out");
    *out = NULL;
    fsdp_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    }
    c->ctx = ctx;
    int rc = ckpt_open(path, CKPT_AUTO, &c->r, err);
    if (rc) {
        free(c->path);
        free(c);
        return api_fail(ctx, err, rc, call, "%s", err->msg);
    }
    *out = c;
    return 0;
}

void fsdp_ckpt_close(fsdp_ckpt *c) {
    if (!c) return;
    ckpt_close(c->r);
    free(c->path);
    free(c);
}

/* The tensor entry of `name`, or an error naming the checkpoint. */
static const ckpt_entry *entry(fsdp_ckpt *c, const char *name, long *idx, const char *call, fsdp_err *err) {
    if (!c || !name) {
        fsdp_err_set(err, FSDP_E_INVALID, "%s: NULL checkpoint or name", call);
        return NULL;
    }
    long i = ckpt_find(c->r, name);
    const ckpt_entry *e = i >= 0 ? ckpt_entry_at(c->r, (size_t)i) : NULL;
    if (!e || !e->is_tensor) {
        api_fail(c->ctx, err, FSDP_E_INVALID, call, "%s has no tensor %s", c->path, name);
        return NULL;
    }
    *idx = i;
    return e;
}

int fsdp_ckpt_shape(fsdp_ckpt *c, const char *name, int *ndim, int64_t *shape, fsdp_dtype *dtype, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    long i;
    const ckpt_entry *e = entry(c, name, &i, "fsdp_ckpt_shape", err);
    if (!e) return err->code;
    if (ndim) *ndim = e->ndim;
    if (shape) memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
    if (dtype) *dtype = e->dtype;
    return 0;
}

int fsdp_ckpt_read(fsdp_ckpt *c, const char *name, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst,
                   fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_ckpt_read";
    long i;
    const ckpt_entry *e = entry(c, name, &i, call, err);
    if (!e) return err->code;
    int64_t n = e->ndim ? e->shape[0] : 1;
    if (!dst || rows < 0 || row0 < 0 || row0 + rows > n)
        return api_fail(c->ctx, err, FSDP_E_INVALID, call, "%s in %s: rows [%lld, %lld) of %lld (or a NULL buffer)",
                        name, c->path, (long long)row0, (long long)(row0 + rows), (long long)n);
    if (!fsdp_dtype_is_float(dt))
        return api_fail(c->ctx, err, FSDP_E_INVALID, call, "dtype %s is not a float dtype",
                        fsdp_dtype_name(dt) ? fsdp_dtype_name(dt) : "(invalid)");
    int rc = rows ? ckpt_read_rows(c->r, (size_t)i, row0, row0 + rows, dst, dt, err) : 0;
    return rc ? api_fail(c->ctx, err, rc, call, "%s in %s: %s", name, c->path, err->msg) : 0;
}
