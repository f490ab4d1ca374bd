/* dcp_records_pack / dcp_records_unpack (dcp.h): the records' fields, variable-length. A record is
 *   u16 fqn length, the fqn bytes; u8 is_tensor, u8 ndim; i32 dtype; i64 shape, offsets, sizes [ndim each];
 *   u8 file name length, its bytes; u64 offset, length; i16 nest, u16 int_mask, i16 tail.
 * One walk over the fields (rec_fields) serves both directions, so the two cannot drift apart. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"

typedef struct rec_io {
    int reading;
    unsigned char *p; /* writing: grown as needed */
    const unsigned char *in;
    size_t len, cap, at;
    int oom, bad; /* writing: out of memory; reading: cut short or an impossible value */
} rec_io;

static void io_put(rec_io *b, const void *x, size_t n) {
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

/* n bytes of x out, or in (x zeroed when the input ends first) */
static void io(rec_io *b, void *x, size_t n) {
    if (!b->reading) {
        io_put(b, x, n);
        return;
    }
    if (b->bad || n > b->len - b->at) {
        b->bad = 1;
        memset(x, 0, n);
        return;
    }
    memcpy(x, b->in + b->at, n);
    b->at += n;
}

/* A NUL-terminated string of a char[max] field by its length (u16 when wide, else u8) and bytes. */
static void io_str(rec_io *b, char *s, size_t max, int wide) {
    uint16_t k16 = (uint16_t)(b->reading ? 0 : strnlen(s, max - 1));
    uint8_t k8 = (uint8_t)k16;
    if (wide) io(b, &k16, sizeof k16);
    else io(b, &k8, sizeof k8);
    size_t n = wide ? k16 : k8;
    if (n >= max) b->bad = 1;
    if (b->bad) return;
    io(b, s, n);
    if (b->reading && !b->bad) s[n] = '\0';
}

static void rec_fields(rec_io *b, dcp_record *r) {
    io_str(b, r->fqn, sizeof r->fqn, 1);
    uint8_t t = (uint8_t)(r->is_tensor != 0), nd = (uint8_t)(r->ndim > 0 ? r->ndim : 0);
    int32_t dt = (int32_t)r->dtype;
    io(b, &t, 1);
    io(b, &nd, 1);
    io(b, &dt, sizeof dt);
    if (nd > FSDP_MAX_DIMS || t > 1) b->bad = 1;
    if (b->bad) return;
    r->is_tensor = t, r->ndim = nd, r->dtype = (fsdp_dtype)dt;
    io(b, r->shape, nd * sizeof *r->shape);
    io(b, r->offsets, nd * sizeof *r->offsets);
    io(b, r->sizes, nd * sizeof *r->sizes);
    io_str(b, r->where.relative_path, sizeof r->where.relative_path, 0);
    io(b, &r->where.offset, sizeof r->where.offset);
    io(b, &r->where.length, sizeof r->where.length);
    io(b, &r->nest, sizeof r->nest);
    io(b, &r->int_mask, sizeof r->int_mask);
    io(b, &r->tail, sizeof r->tail);
}

int dcp_records_pack(const dcp_record *recs, size_t n, void **out, size_t *len, fsdp_err *err) {
    rec_io b = {0};
    for (size_t i = 0; i < n && !b.oom; i++) {
        if (recs[i].ndim > FSDP_MAX_DIMS)
            return free(b.p), fsdp_err_set(err, FSDP_E_INVALID, "DCP: record %s has %d dims (at most %d)",
                                           recs[i].fqn, recs[i].ndim, FSDP_MAX_DIMS);
        dcp_record r = recs[i]; /* the walk writes back the fields it normalises */
        rec_fields(&b, &r);
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

int dcp_records_unpack(const void *buf, size_t len, dcp_record **recs, size_t *n, fsdp_err *err) {
    rec_io in = {1, NULL, buf, len, 0, 0, 0, 0};
    dcp_record r;
    size_t count = 0, start = 0;
    while (in.at < len && !in.bad) { /* first the count, every length checked */
        start = in.at;
        memset(&r, 0, sizeof r);
        rec_fields(&in, &r);
        count += !in.bad;
    }
    if (in.bad)
        return fsdp_err_set(err, FSDP_E_FORMAT, "DCP: malformed record list: record %zu at byte %zu of %zu is cut short "
                            "or holds an impossible length or count", count, start, len);
    *recs = malloc((count ? count : 1) * sizeof **recs);
    if (!*recs) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu DCP records", count);
    in.at = 0;
    for (size_t i = 0; i < count; i++) {
        memset(&(*recs)[i], 0, sizeof **recs);
        rec_fields(&in, &(*recs)[i]);
    }
    *n = count;
    return 0;
}
