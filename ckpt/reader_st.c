/* ckpt_reader over safetensors (single files, HF sharded directories / indexes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/ckpt_pread.h"
#include "ckpt/reader_impl.h"
#include "ckpt/safetensors.h"

/* Page-aligned span of the mapped rows [r0, r1) of tensor t. */
static void span(st_reader *s, const st_tensor_info *t, int64_t r0, int64_t r1, void **p, size_t *len) {
    size_t row = (size_t)st_row_numel(t) * fsdp_dtype_size(t->dtype);
    uintptr_t a = (uintptr_t)st_data(s, t) + (size_t)r0 * row, b = a + (size_t)(r1 - r0) * row;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    a &= ~(pg - 1);
    *p = (void *)a;
    *len = b > a ? (size_t)(b - a) : 0;
}

static int st_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                      fsdp_err *err) {
    st_reader *s = r->impl;
    const st_tensor_info *t = st_tensor(s, i);
    /* in slices of about 64 MiB: read ahead, copy out, drop the pages, so that a streaming
     * reader's memory stays near one tensor however large the checkpoint is */
    size_t row_bytes = (size_t)st_row_numel(t) * fsdp_dtype_size(t->dtype);
    size_t out_row = (size_t)st_row_numel(t) * fsdp_dtype_size(dt);
    int64_t step = row_bytes ? (int64_t)(((size_t)64 << 20) / row_bytes) : (r1 - r0);
    if (step < 1) step = 1;
    for (int64_t a = r0; a < r1; a += step) {
        int64_t b = a + step < r1 ? a + step : r1;
        void *p;
        size_t len;
        span(s, t, a, b, &p, &len);
        if (len) madvise(p, len, MADV_WILLNEED);
        int rc = st_read_rows(s, t, a, b, (char *)dst + (size_t)(a - r0) * out_row, dt, err);
        if (len) madvise(p, len, MADV_DONTNEED);
        if (rc) return rc;
    }
    if (nan && dt == FSDP_DT_F32) *nan = ckpt_f32_has_nan(dst, (size_t)(r1 - r0) * (size_t)st_row_numel(t));
    return 0;
}

static void st_close_op(ckpt_reader *r) {
    st_close(r->impl);
    ckpt_reader_free(r);
}

#define ST_OPEN_TRIES 4

/* st_find's binary search over the reader's sorted names: no second index of the names */
static long st_find_op(const ckpt_reader *r, const char *name) {
    const st_tensor_info *t = st_find(r->impl, name);
    return t ? (long)(t - st_tensor(r->impl, 0)) : -1;
}

static const ckpt_ops ST_OPS = {st_rows_op, NULL, st_close_op, st_find_op};

/* st_open; when it fails while the checkpoint at path changes (an HF directory whose index a save
 * replaced, its old shards removed), again from the new index, at most DCP_OPEN_TRIES times */
static int open_st(const char *path, st_reader **s, int *restarts, fsdp_err *err) {
    for (int attempt = 0;; attempt++) {
        uint64_t before = ckpt_identity_at(path);
        int rc = st_open(s, path, err);
        if (!rc) {
            *restarts = attempt;
            return 0;
        }
        if (ckpt_identity_at(path) == before || attempt + 1 == ST_OPEN_TRIES) return rc;
    }
}

int ckpt_open_safetensors(const char *path, ckpt_reader **out, fsdp_err *err) {
    st_reader *s;
    int restarts = 0;
    int rc = open_st(path, &s, &restarts, err);
    if (rc) return rc;
    size_t n = st_count(s);
    ckpt_reader *r = ckpt_reader_alloc(path, n, &ST_OPS, CKPT_SAFETENSORS, s);
    if (!r) {
        st_close(s);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
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
    r->restarts = restarts;
    *out = r;
    return 0;
}
