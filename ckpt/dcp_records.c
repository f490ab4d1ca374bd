/* dcp_records_pack / dcp_records_unpack (dcp.h): the records' fields, variable-length. A record is
 *   u16 fqn length, the fqn bytes; u8 is_tensor, u8 ndim; i32 dtype; i64 shape, offsets, sizes [ndim each];
 *   u8 file name length, its bytes; u64 offset, length; i16 nest, u16 int_mask, i16 tail. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"

typedef struct rec_buf {
    unsigned char *p;
    size_t len, cap;
    int oom;
} rec_buf;

static void put(rec_buf *b, const void *x, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->len, x, n);
    b->len += n;
}

static void put_str(rec_buf *b, const char *s, size_t max, int wide) {
    size_t n = strnlen(s, max - 1);
    if (wide) {
        uint16_t k = (uint16_t)n;
        put(b, &k, sizeof k);
    } else {
        uint8_t k = (uint8_t)n;
        put(b, &k, sizeof k);
    }
    put(b, s, n);
}

static void put_rec(rec_buf *b, const dcp_record *r) {
    put_str(b, r->fqn, sizeof r->fqn, 1);
    uint8_t t = (uint8_t)(r->is_tensor != 0), nd = (uint8_t)(r->ndim > 0 ? r->ndim : 0);
    int32_t dt = (int32_t)r->dtype;
    put(b, &t, 1);
    put(b, &nd, 1);
    put(b, &dt, sizeof dt);
    put(b, r->shape, nd * sizeof *r->shape);
    put(b, r->offsets, nd * sizeof *r->offsets);
    put(b, r->sizes, nd * sizeof *r->sizes);
    put_str(b, r->where.relative_path, sizeof r->where.relative_path, 0);
    put(b, &r->where.offset, sizeof r->where.offset);
    put(b, &r->where.length, sizeof r->where.length);
    put(b, &r->nest, sizeof r->nest);
    put(b, &r->int_mask, sizeof r->int_mask);
    put(b, &r->tail, sizeof r->tail);
}

int dcp_records_pack(const dcp_record *recs, size_t n, void **out, size_t *len, fsdp_err *err) {
    rec_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (recs[i].ndim > FSDP_MAX_DIMS)
            return free(b.p), fsdp_err_set(err, FSDP_E_INVALID, "DCP: record %s has %d dims (at most %d)",
                                           recs[i].fqn, recs[i].ndim, FSDP_MAX_DIMS);
        put_rec(&b, &recs[i]);
    }
    if (!b.p && !b.oom) b.p = malloc(1);
    if (b.oom || !b.p) {
        free(b.p);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory packing %zu DCP records", n);
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

/* ---- reading back ------------------------------------------------------------------------- */

typedef struct rec_in {
    const unsigned char *p;
    size_t len, at;
    int bad;
} rec_in;

static void get(rec_in *in, void *x, size_t n) {
    if (in->bad || n > in->len - in->at) {
        in->bad = 1;
        if (x) memset(x, 0, n);
        return;
    }
    if (x) memcpy(x, in->p + in->at, n);
    in->at += n;
}

static void get_str(rec_in *in, char *dst, size_t max, int wide) {
    size_t n = 0;
    if (wide) {
        uint16_t k;
        get(in, &k, sizeof k);
        n = k;
    } else {
        uint8_t k;
        get(in, &k, sizeof k);
        n = k;
    }
    if (n >= max) in->bad = 1;
    if (in->bad) return;
    get(in, dst, n);
    if (dst && !in->bad) dst[n] = '\0';
}

/* One record from in into r (NULL: only walked over). */
static void get_rec(rec_in *in, dcp_record *r) {
    dcp_record tmp;
    dcp_record *d = r ? r : &tmp;
    memset(d, 0, sizeof *d);
    get_str(in, d->fqn, sizeof d->fqn, 1);
    uint8_t t = 0, nd = 0;
    int32_t dt = 0;
    get(in, &t, 1);
    get(in, &nd, 1);
    get(in, &dt, sizeof dt);
    if (nd > FSDP_MAX_DIMS || t > 1) in->bad = 1;
    if (in->bad) return;
    d->is_tensor = t, d->ndim = nd, d->dtype = (fsdp_dtype)dt;
    get(in, d->shape, nd * sizeof *d->shape);
    get(in, d->offsets, nd * sizeof *d->offsets);
    get(in, d->sizes, nd * sizeof *d->sizes);
    get_str(in, d->where.relative_path, sizeof d->where.relative_path, 0);
    get(in, &d->where.offset, sizeof d->where.offset);
    get(in, &d->where.length, sizeof d->where.length);
    get(in, &d->nest, sizeof d->nest);
    get(in, &d->int_mask, sizeof d->int_mask);
    get(in, &d->tail, sizeof d->tail);
}

int dcp_records_unpack(const void *buf, size_t len, dcp_record **recs, size_t *n, fsdp_err *err) {
    rec_in in = {buf, len, 0, 0};
    size_t count = 0;
    while (in.at < len && !in.bad) { /* first the count, every length checked */
        size_t start = in.at;
        get_rec(&in, NULL);
        if (in.bad) in.at = start;
        else count++;
    }
    if (in.bad)
        return fsdp_err_set(err, FSDP_E_FORMAT, "DCP: malformed record list: record %zu at byte %zu of %zu is cut short "
                            "or holds an impossible length or count", count, in.at, len);
    *recs = malloc((count ? count : 1) * sizeof **recs);
    if (!*recs) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu DCP records", count);
    in.at = 0;
    for (size_t i = 0; i < count; i++) get_rec(&in, &(*recs)[i]);
    *n = count;
    return 0;
}
