/* ckpt_reader over safetensors (single files, HF sharded directories / indexes). */
#include <stdint.h>
#include <stdio.h>
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

/* FP8 block scaling (DeepSeek-V3's checkpoints): an e4m3 weight [M, N] stored with `<name>_scale_inv`
 * (float32 [ceil(M / 128), ceil(N / 128)]) is worth weight * scale_inv of its 128 x 128 block, computed in
 * float32 and then rounded to the dtype asked for, as PyTorch's reference dequantisation does. */
#define ST_FP8_BLOCK 128

/* The scale tensor of fp8 tensor t, or NULL when it has none; an error when one is there but its shape
 * is not t's blocks. */
static const st_tensor_info *fp8_scale(st_reader *s, const st_tensor_info *t, fsdp_err *err, int *bad) {
    *bad = 0;
    if (t->dtype != FSDP_DT_F8_E4M3FN || t->ndim != 2) return NULL;
    char name[1024];
    snprintf(name, sizeof name, "%s_scale_inv", t->name);
    const st_tensor_info *sc = st_find(s, name);
    if (!sc) return NULL;
    int64_t bm = (t->shape[0] + ST_FP8_BLOCK - 1) / ST_FP8_BLOCK, bn = (t->shape[1] + ST_FP8_BLOCK - 1) / ST_FP8_BLOCK;
    if (sc->ndim != 2 || sc->shape[0] != bm || sc->shape[1] != bn || !fsdp_dtype_is_float(sc->dtype)) {
        *bad = 1;
        fsdp_err_set(err, FSDP_E_FORMAT,
                     "%s: its block scale %s is %s of shape [%lld, %lld], expected a float [%lld, %lld] (128 x 128 "
                     "blocks of [%lld, %lld])",
                     t->name, name, fsdp_dtype_name(sc->dtype), (long long)sc->shape[0],
                     (long long)(sc->ndim > 1 ? sc->shape[1] : 0), (long long)bm, (long long)bn,
                     (long long)t->shape[0], (long long)t->shape[1]);
    }
    return sc;
}

/* Rows [r0, r1) of fp8 tensor t, dequantised with its block scale sc, into dst as dt. */
static int fp8_dequant_rows(st_reader *s, const st_tensor_info *t, const st_tensor_info *sc, int64_t r0, int64_t r1,
                            void *dst, fsdp_dtype dt, fsdp_err *err) {
    const int64_t N = t->shape[1], bn = sc->shape[1], b0 = r0 / ST_FP8_BLOCK, b1 = r1 ? (r1 - 1) / ST_FP8_BLOCK + 1 : 0;
    size_t nrow = (size_t)N, n = (size_t)(r1 - r0) * nrow;
    float *v = malloc((n ? n : 1) * sizeof *v), *scale = malloc((size_t)((b1 - b0) * bn + 1) * sizeof *scale);
    int rc = !v || !scale ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory dequantising %s", t->name) : 0;
    if (!rc) rc = st_read_rows(s, t, r0, r1, v, FSDP_DT_F32, err);
    if (!rc && b1 > b0) rc = st_read_rows(s, sc, b0, b1, scale, FSDP_DT_F32, err);
    for (int64_t r = r0; !rc && r < r1; r++) {
        const float *srow = scale + (r / ST_FP8_BLOCK - b0) * bn;
        float *row = v + (size_t)(r - r0) * nrow;
        for (int64_t c = 0; c < N; c++) row[c] = row[c] * srow[c / ST_FP8_BLOCK];
    }
    if (!rc) rc = fsdp_convert(dst, dt, v, FSDP_DT_F32, n, err);
    free(v);
    free(scale);
    return rc;
}

static int st_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                      fsdp_err *err) {
    st_reader *s = r->impl;
    const st_tensor_info *t = st_tensor(s, i);
    int bad = 0;
    const st_tensor_info *sc = dt != t->dtype && fsdp_dtype_is_float(dt) ? fp8_scale(s, t, err, &bad) : NULL;
    if (bad) return err->code;
    if (sc) {
        int rc = fp8_dequant_rows(s, t, sc, r0, r1, dst, dt, err);
        if (!rc && nan && dt == FSDP_DT_F32) *nan = ckpt_f32_has_nan(dst, (size_t)(r1 - r0) * (size_t)st_row_numel(t));
        return rc;
    }
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

static const ckpt_ops ST_OPS = {st_rows_op, NULL, st_close_op, st_find_op, NULL, NULL, NULL};

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
    /* the block scales of fp8 weights (their reads dequantise) */
    for (size_t i = 0; i < n; i++) {
        const st_tensor_info *t = st_tensor(s, i);
        int bad;
        fsdp_err ignored;
        const st_tensor_info *sc = fp8_scale(s, t, &ignored, &bad);
        if (sc && !bad) r->entries[sc - st_tensor(s, 0)].fp8_scale = 1;
    }
    r->restarts = restarts;
    *out = r;
    return 0;
}
