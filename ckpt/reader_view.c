/* ckpt_reader over another reader's rows (ckpt/reader_view.h). */
#include "ckpt/reader_view.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/reader_impl.h"

typedef struct ckv_entry {
    char *name;
    long same;    /* source entry passed through, or -1 */
    ckv_run *run; /* rows made of runs */
    size_t n_run;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    ckv_piece *piece; /* elements made of pieces (sorted by v0) */
    size_t n_piece;
    void *pickle; /* a value of its own (ckv_add_value) */
    size_t pickle_len;
    char *text;
} ckv_entry;

struct ckv_builder {
    ckpt_reader *src;
    int own;
    ckv_entry *e;
    size_t n, cap;
};

typedef struct ckv_impl {
    ckpt_reader *src;
    int own;
    ckv_entry *e;
    size_t n;
    void *tmp; /* a run's source rows (grown as needed) */
    size_t tmp_cap;
} ckv_impl;

static int64_t rows_of(const ckpt_entry *e) { return e->ndim ? e->shape[0] : 1; }

static int64_t row_numel(int ndim, const int64_t *shape) {
    int64_t k = 1;
    for (int d = 1; d < ndim; d++) k *= shape[d];
    return k;
}

int ckv_new(ckpt_reader *src, int own, ckv_builder **out, fsdp_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    (*out)->src = src;
    (*out)->own = own;
    return 0;
}

static void free_entries(ckv_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) free(e[i].name), free(e[i].run), free(e[i].piece), free(e[i].pickle), free(e[i].text);
    free(e);
}

void ckv_free(ckv_builder *b) {
    if (!b) return;
    free_entries(b->e, b->n);
    if (b->own) ckpt_close(b->src);
    free(b);
}

static ckv_entry *grow(ckv_builder *b, const char *name) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        ckv_entry *e = realloc(b->e, cap * sizeof *e);
        if (!e) return NULL;
        b->e = e, b->cap = cap;
    }
    ckv_entry *e = &b->e[b->n];
    memset(e, 0, sizeof *e);
    e->same = -1;
    if (!(e->name = strdup(name))) return NULL;
    b->n++;
    return e;
}

int ckv_add_same(ckv_builder *b, const char *name, size_t src, fsdp_err *err) {
    if (src >= ckpt_count(b->src))
        return fsdp_err_set(err, FSDP_E_INVALID, "view %s: no source entry #%zu", name, src);
    ckv_entry *e = grow(b, name);
    if (!e) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    e->same = (long)src;
    return 0;
}

static int cmp_piece(const void *a, const void *b) {
    const ckv_piece *x = a, *y = b;
    return x->v0 < y->v0 ? -1 : x->v0 > y->v0;
}

int ckv_add_pieces(ckv_builder *b, const char *name, int ndim, const int64_t *shape, const ckv_piece *p, size_t n,
                   fsdp_err *err) {
    if (ndim < 0 || ndim > FSDP_MAX_DIMS || !n)
        return fsdp_err_set(err, FSDP_E_INVALID, "view %s: a tensor needs a shape and its pieces", name);
    ckv_piece *q = malloc(n * sizeof *q);
    if (!q) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memcpy(q, p, n * sizeof *q);
    qsort(q, n, sizeof *q, cmp_piece);
    int64_t next = 0, numel = fsdp_numel(ndim, shape);
    const ckpt_entry *first = ckpt_entry_at(b->src, q[0].src);
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        const ckpt_entry *s = ckpt_entry_at(b->src, q[k].src);
        if (!s || !s->is_tensor || s->ndim != 1 || s->dtype != first->dtype)
            rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: a piece's source is not a flat tensor of its dtype", name);
        else if (q[k].n < 1 || q[k].s0 < 0 || q[k].s0 + q[k].n > s->shape[0])
            rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: elements [%lld, %lld) are outside %s's %lld", name,
                              (long long)q[k].s0, (long long)(q[k].s0 + q[k].n), s->name, (long long)s->shape[0]);
        else if (q[k].v0 != next)
            rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: element %lld is given %s", name, (long long)next,
                              q[k].v0 > next ? "by no piece" : "twice");
        next = q[k].v0 + q[k].n;
    }
    if (!rc && next != numel)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: pieces give %lld of its %lld elements", name, (long long)next,
                          (long long)numel);
    ckv_entry *e = rc ? NULL : grow(b, name);
    if (!rc && !e) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (rc) return free(q), rc;
    e->piece = q, e->n_piece = n, e->ndim = ndim;
    if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    return 0;
}

int ckv_add_value(ckv_builder *b, const char *name, const void *pickle, size_t len, const char *text, fsdp_err *err) {
    ckv_entry *e = grow(b, name);
    if (!e || !(e->pickle = malloc(len ? len : 1)) || !(e->text = strdup(text ? text : "")))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memcpy(e->pickle, pickle, len);
    e->pickle_len = len;
    return 0;
}

/* Each run inside its source and of the tensor's dtype and row shape; every view row covered once. */
static int check_runs(const ckv_builder *b, const char *name, int ndim, const int64_t *shape, const ckv_run *runs,
                      size_t n, fsdp_err *err) {
    int64_t rows = ndim ? shape[0] : 1;
    unsigned char *seen = calloc((size_t)(rows ? rows : 1), 1);
    if (!seen) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0;
    const ckpt_entry *first = n ? ckpt_entry_at(b->src, runs[0].src) : NULL;
    for (size_t k = 0; k < n && !rc; k++) {
        const ckv_run *u = &runs[k];
        const ckpt_entry *s = ckpt_entry_at(b->src, u->src);
        if (!s || !s->is_tensor) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: source #%zu is not a tensor", name, u->src);
            break;
        }
        int64_t sl = u->s0 + (u->n - 1) * u->sstride, vl = u->v0 + (u->n - 1) * u->vstride;
        if (u->n < 1 || u->sstride < 1 || u->vstride < 1 || u->s0 < 0 || u->v0 < 0 || sl >= rows_of(s) || vl >= rows)
            rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: rows of %s outside a tensor", name, s->name);
        else if (s->dtype != first->dtype || (ndim ? ndim : 1) != (s->ndim ? s->ndim : 1) ||
                 row_numel(ndim, shape) != row_numel(s->ndim, s->shape) ||
                 (ndim > 1 && memcmp(shape + 1, s->shape + 1, (size_t)(ndim - 1) * sizeof *shape)))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: %s has another dtype or row shape than its other parts",
                              name, s->name);
        for (int64_t j = 0; j < u->n && !rc; j++) {
            int64_t v = u->v0 + j * u->vstride;
            if (seen[v]++) rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: row %lld is given twice", name, (long long)v);
        }
    }
    for (int64_t v = 0; v < rows && !rc; v++)
        if (!seen[v]) rc = fsdp_err_set(err, FSDP_E_INVALID, "view %s: row %lld is given by no part", name, (long long)v);
    free(seen);
    return rc;
}

int ckv_add_tensor(ckv_builder *b, const char *name, int ndim, const int64_t *shape, const ckv_run *runs, size_t n,
                   fsdp_err *err) {
    if (ndim < 0 || ndim > FSDP_MAX_DIMS || !n)
        return fsdp_err_set(err, FSDP_E_INVALID, "view %s: a tensor needs a shape and its rows", name);
    int rc = check_runs(b, name, ndim, shape, runs, n, err);
    if (rc) return rc;
    ckv_entry *e = grow(b, name);
    if (!e || !(e->run = malloc(n * sizeof *runs))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memcpy(e->run, runs, n * sizeof *runs);
    e->n_run = n;
    e->ndim = ndim;
    if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    return 0;
}

/* ------------------------------------------------------------------ the reader */

static int grow_tmp(ckv_impl *v, size_t bytes, fsdp_err *err) {
    if (bytes <= v->tmp_cap) return 0;
    void *t = realloc(v->tmp, bytes);
    if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (%zu bytes reading a view's rows)", bytes);
    v->tmp = t, v->tmp_cap = bytes;
    return 0;
}

/* The run's rows that fall in view rows [r0, r1): its indices [*k0, *k1). */
static void run_span(const ckv_run *u, int64_t r0, int64_t r1, int64_t *k0, int64_t *k1) {
    int64_t a = r0 <= u->v0 ? 0 : (r0 - u->v0 + u->vstride - 1) / u->vstride;
    int64_t b = r1 <= u->v0 ? 0 : (r1 - 1 - u->v0) / u->vstride + 1;
    *k0 = a < u->n ? a : u->n;
    *k1 = b < u->n ? b : u->n;
}

static int read_run(ckv_impl *v, const ckv_run *u, int64_t r0, int64_t r1, char *dst, size_t row_bytes,
                    fsdp_dtype dt, int *nan, fsdp_err *err) {
    int64_t k0, k1;
    run_span(u, r0, r1, &k0, &k1);
    if (k0 >= k1) return 0;
    int64_t s_lo = u->s0 + k0 * u->sstride, s_hi = u->s0 + (k1 - 1) * u->sstride + 1;
    int n2 = 0, rc;
    if (u->vstride == 1 && u->sstride == 1) {
        rc = ckpt_read_rows_nan(v->src, u->src, s_lo, s_hi, dst + (size_t)(u->v0 + k0 - r0) * row_bytes, dt, &n2, err);
    } else {
        if ((rc = grow_tmp(v, (size_t)(s_hi - s_lo) * row_bytes, err))) return rc;
        rc = ckpt_read_rows_nan(v->src, u->src, s_lo, s_hi, v->tmp, dt, &n2, err);
        for (int64_t k = k0; k < k1 && !rc; k++)
            memcpy(dst + (size_t)(u->v0 + k * u->vstride - r0) * row_bytes,
                   (char *)v->tmp + (size_t)((k - k0) * u->sstride) * row_bytes, row_bytes);
    }
    if (nan && n2) *nan = 1;
    return rc;
}

/* View rows [r0, r1) of an entry of pieces: the elements they hold, read from each piece's source. */
static int read_pieces(ckv_impl *v, const ckv_entry *e, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                       fsdp_err *err) {
    int64_t c = row_numel(e->ndim, e->shape), e0 = r0 * c, e1 = r1 * c;
    size_t esz = fsdp_dtype_size(dt);
    int rc = 0;
    for (size_t k = 0; k < e->n_piece && !rc; k++) {
        const ckv_piece *p = &e->piece[k];
        int64_t a = p->v0 > e0 ? p->v0 : e0, b = p->v0 + p->n < e1 ? p->v0 + p->n : e1;
        if (a >= b) continue;
        int n2 = 0;
        rc = ckpt_read_rows_nan(v->src, p->src, p->s0 + (a - p->v0), p->s0 + (b - p->v0), (char *)dst + (size_t)(a - e0) * esz,
                                dt, &n2, err);
        if (nan && n2) *nan = 1;
    }
    return rc;
}

/* The runs k.. of one source (runs[k].src) not done yet: when several of them, or one with strides, fall in view rows
 * [r0, r1), their source rows are read once as one span (a head's two rotate-half halves, a fused tensor's
 * interleaved rows: the span holds each row once) and scattered; else each is read as read_run reads it. */
static int read_src_runs(ckv_impl *v, const ckv_entry *e, size_t k, unsigned char *done, int64_t r0, int64_t r1,
                         char *dst, size_t row_bytes, fsdp_dtype dt, int *nan, fsdp_err *err) {
    size_t src = e->run[k].src, n = 0;
    int64_t lo = INT64_MAX, hi = INT64_MIN, need = 0;
    int strided = 0;
    for (size_t j = k; j < e->n_run; j++) {
        const ckv_run *u = &e->run[j];
        if (done[j] || u->src != src) continue;
        int64_t k0, k1;
        run_span(u, r0, r1, &k0, &k1);
        done[j] = 1;
        if (k0 >= k1) continue;
        int64_t a = u->s0 + k0 * u->sstride, b = u->s0 + (k1 - 1) * u->sstride + 1;
        lo = a < lo ? a : lo, hi = b > hi ? b : hi, need += k1 - k0, n++;
        strided |= u->vstride != 1 || u->sstride != 1;
    }
    if (!n) return 0;
    if ((n == 1 && !strided) || hi - lo > 2 * need) { /* one plain run, or a span mostly of rows not asked for */
        int rc = 0;
        for (size_t j = k; j < e->n_run && !rc; j++)
            if (e->run[j].src == src) rc = read_run(v, &e->run[j], r0, r1, dst, row_bytes, dt, nan, err);
        return rc;
    }
    int n2 = 0, rc = grow_tmp(v, (size_t)(hi - lo) * row_bytes, err);
    if (!rc) rc = ckpt_read_rows_nan(v->src, src, lo, hi, v->tmp, dt, &n2, err);
    for (size_t j = k; j < e->n_run && !rc; j++) {
        const ckv_run *u = &e->run[j];
        if (u->src != src) continue;
        int64_t k0, k1;
        run_span(u, r0, r1, &k0, &k1);
        for (int64_t q = k0; q < k1; q++)
            memcpy(dst + (size_t)(u->v0 + q * u->vstride - r0) * row_bytes,
                   (char *)v->tmp + (size_t)(u->s0 + q * u->sstride - lo) * row_bytes, row_bytes);
    }
    if (nan && n2) *nan = 1;
    return rc;
}

static int view_read_rows(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                          fsdp_err *err) {
    ckv_impl *v = r->impl;
    const ckv_entry *e = &v->e[i];
    if (e->same >= 0) return ckpt_read_rows_nan(v->src, (size_t)e->same, r0, r1, dst, dt, nan, err);
    if (e->n_piece) {
        if (nan) *nan = 0;
        int rc = read_pieces(v, e, r0, r1, dst, dt, nan, err);
        return rc ? fsdp_err_prefix(err, "%s (read as %s)", r->path, e->name) : 0;
    }
    size_t row_bytes = (size_t)row_numel(e->ndim, e->shape) * fsdp_dtype_size(dt);
    unsigned char *done = calloc(e->n_run ? e->n_run : 1, 1);
    if (!done) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", e->name);
    if (nan) *nan = 0;
    int rc = 0;
    for (size_t k = 0; k < e->n_run && !rc; k++)
        if (!done[k]) rc = read_src_runs(v, e, k, done, r0, r1, dst, row_bytes, dt, nan, err);
    free(done);
    return rc ? fsdp_err_prefix(err, "%s (read as %s)", r->path, e->name) : 0;
}

static const char *view_value_text(ckpt_reader *r, size_t i) {
    ckv_impl *v = r->impl;
    if (v->e[i].pickle) return v->e[i].text;
    return v->e[i].same >= 0 ? ckpt_value_text(v->src, (size_t)v->e[i].same) : NULL;
}

static void view_close(ckpt_reader *r) {
    ckv_impl *v = r->impl;
    if (v->own) ckpt_close(v->src);
    free_entries(v->e, v->n);
    free(v->tmp);
    free(v);
    ckpt_reader_free(r);
}

static long view_same(const ckpt_reader *r, size_t i, ckpt_reader **src) {
    const ckv_impl *v = r->impl;
    if (src) *src = v->src;
    return i < r->n ? v->e[i].same : -1;
}

static int view_verify(ckpt_reader *r, size_t *records, fsdp_err *err) {
    return ckpt_verify(((ckv_impl *)r->impl)->src, records, err);
}

static int view_check(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err) {
    return ckpt_check(((ckv_impl *)r->impl)->src, rep, err);
}

static const ckpt_ops view_ops = {view_read_rows, view_value_text, view_close, NULL, view_same, view_verify, view_check};

static void fill_entry(const ckv_impl *v, const ckv_entry *e, ckpt_entry *out) {
    memset(out, 0, sizeof *out);
    out->name = e->name;
    if (e->pickle) {
        out->nbytes = e->pickle_len;
        out->chunks = 1;
        return;
    }
    if (e->same >= 0) {
        *out = *ckpt_entry_at(v->src, (size_t)e->same);
        out->name = e->name;
        out->is_alias = 0; /* its index is the source's: not this reader's */
        return;
    }
    const ckpt_entry *s = ckpt_entry_at(v->src, e->n_piece ? e->piece[0].src : e->run[0].src);
    out->is_tensor = 1;
    out->dtype = s->dtype;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    out->nbytes = (uint64_t)fsdp_numel(e->ndim, e->shape) * fsdp_dtype_size(s->dtype);
    out->chunks = 1;
}

int ckv_finish(ckv_builder *b, ckpt_reader **out, fsdp_err *err) {
    *out = NULL;
    ckv_impl *v = calloc(1, sizeof *v);
    ckpt_reader *r = v ? ckpt_reader_alloc(b->src->path, b->n, &view_ops, ckpt_reader_format(b->src), v) : NULL;
    if (!r) {
        free(v);
        ckv_free(b);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    v->src = b->src, v->own = b->own, v->e = b->e, v->n = b->n;
    free(b);
    r->inner = v->src;
    r->identity = ckpt_identity(v->src);
    int rc = 0;
    for (size_t i = 0; i < v->n && !rc; i++) {
        fill_entry(v, &v->e[i], &r->entries[i]);
        size_t prev;
        int a = nidx_add(&r->names, v->e[i].name, i, &prev);
        if (a < 0) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else if (a > 0) rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: two entries would be named %s", r->path, v->e[i].name);
    }
    if (rc) {
        view_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

long ckpt_view_same(const ckpt_reader *r, size_t i, ckpt_reader **src) {
    return r->ops->same ? r->ops->same(r, i, src) : -1;
}

int ckpt_view_value(const ckpt_reader *r, size_t i, const void **pickle, size_t *len, const char **text) {
    if (!r->inner || r->ops != &view_ops || i >= r->n) return 0;
    const ckv_impl *v = r->impl;
    if (!v->e[i].pickle) return 0;
    *pickle = v->e[i].pickle, *len = v->e[i].pickle_len, *text = v->e[i].text;
    return 1;
}

int ckpt_view_runs(const ckpt_reader *r, size_t i, ckpt_reader **src, const ckv_run **runs, size_t *n) {
    if (!r->inner || r->ops != &view_ops || i >= r->n) return 0;
    const ckv_impl *v = r->impl;
    if (!v->e[i].n_run) return 0;
    *src = v->src, *runs = v->e[i].run, *n = v->e[i].n_run;
    return 1;
}

ckpt_reader *ckpt_view_base(ckpt_reader *r) {
    while (r->inner) r = r->inner;
    return r;
}
