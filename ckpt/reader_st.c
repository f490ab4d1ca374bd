/* ckpt_reader over safetensors (single files, HF sharded directories / indexes). */
#include <stdlib.h>
#include <string.h>

#include "ckpt/reader_impl.h"
#include "ckpt/safetensors.h"

static int st_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, fsdp_err *err) {
    st_reader *s = r->impl;
    return st_read_rows(s, st_tensor(s, i), r0, r1, dst, dt, err);
}

static void st_close_op(ckpt_reader *r) {
    st_close(r->impl);
    free(r->entries);
    free(r->path);
    free(r);
}

static const ckpt_ops ST_OPS = {st_rows_op, NULL, st_close_op};

int ckpt_open_safetensors(const char *path, ckpt_reader **out, fsdp_err *err) {
    st_reader *s;
    int rc = st_open(&s, path, err);
    if (rc) return rc;
    ckpt_reader *r = calloc(1, sizeof *r);
    size_t n = st_count(s);
    if (r) r->entries = calloc(n ? n : 1, sizeof *r->entries);
    if (r) r->path = strdup(path);
    if (!r || !r->entries || !r->path) {
        if (r) {
            free(r->entries);
            free(r->path);
        }
        free(r);
        st_close(s);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    r->ops = &ST_OPS;
    r->format = CKPT_SAFETENSORS;
    r->impl = s;
    r->n = n;
    for (size_t i = 0; i < n; i++) {
        const st_tensor_info *t = st_tensor(s, i);
        ckpt_entry *e = &r->entries[i];
        e->name = t->name;
        e->is_tensor = 1;
        e->dtype = t->dtype;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof e->shape);
        e->nbytes = t->nbytes;
        e->chunks = 1;
    }
    *out = r;
    return 0;
}
