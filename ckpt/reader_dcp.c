/* ckpt_reader over DCP directories. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/reader_impl.h"
#include "runtime/checked.h"

static int dcp_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                       fsdp_err *err) {
    dcp_ckpt *c = r->impl;
    const dcp_item *x = &c->items[i];
    int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) len[d] = x->shape[d];
    if (x->ndim > 0) {
        off[0] = r0;
        len[0] = r1 - r0;
    }
    return dcp_read_box_nan(c, i, off, len, dst, dt, nan, err);
}

static const char *dcp_text_op(ckpt_reader *r, size_t i) { return dcp_value_text(r->impl, i); }

static void dcp_close_op(ckpt_reader *r) {
    dcp_close(r->impl);
    ckpt_reader_free(r);
}

static const ckpt_ops DCP_OPS = {dcp_rows_op, dcp_text_op, dcp_close_op, NULL, NULL, NULL, NULL};

static int cmp_where(const dcp_storage *a, const dcp_storage *b) {
    int c = strcmp(a->relative_path, b->relative_path);
    if (c) return c;
    if (a->offset != b->offset) return a->offset < b->offset ? -1 : 1;
    return a->length < b->length ? -1 : a->length > b->length;
}

/* A tensor item by its first chunk's record (then its position). */
typedef struct first_ref {
    const dcp_storage *w;
    size_t i;
} first_ref;

static int cmp_first(const void *a, const void *b) {
    const first_ref *x = a, *y = b;
    int c = cmp_where(x->w, y->w);
    return c ? c : (x->i < y->i ? -1 : x->i > y->i);
}

/* y stores exactly x's pieces: the same dtype, shape and chunks, each at the same record */
static int same_pieces(const dcp_item *x, const dcp_item *y) {
    if (x->dtype != y->dtype || x->ndim != y->ndim || x->n_chunks != y->n_chunks ||
        memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof *x->shape))
        return 0;
    for (size_t k = 0; k < x->n_chunks; k++) {
        const dcp_chunk *a = &x->chunks[k], *b = &y->chunks[k];
        if (memcmp(a->offsets, b->offsets, (size_t)x->ndim * sizeof *a->offsets) ||
            memcmp(a->sizes, b->sizes, (size_t)x->ndim * sizeof *a->sizes) || cmp_where(&a->where, &b->where))
            return 0;
    }
    return 1;
}

/* every chunk of x is stored as a torch.save archive (whose record alone says what it holds) */
static int archives_only(dcp_ckpt *c, const dcp_item *x) {
    for (size_t k = 0; k < x->n_chunks; k++)
        if (fsdp_numel(x->ndim, x->chunks[k].sizes) && !dcp_record_is_archive(c, &x->chunks[k].where)) return 0;
    return 1;
}

/* ckpt_entry.is_alias / alias_of of every tensor whose pieces an earlier one has (the pieces of
 * non-empty tensors only: empty ones store nothing to share; torch.save records only: in a
 * serialization_format=SAFETENSORS checkpoint every chunk of a file records the same blob) */
static int mark_aliases(ckpt_reader *r, dcp_ckpt *c, fsdp_err *err) {
    first_ref *v = malloc((c->n ? c->n : 1) * sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        if (x->is_tensor && x->n_chunks && x->chunks[0].where.relative_path[0] && r->entries[i].nbytes) {
            v[k].w = &x->chunks[0].where;
            v[k++].i = i;
        }
    }
    qsort(v, k, sizeof *v, cmp_first);
    for (size_t a = 0, lead = 0; a < k; a++) {
        if (a == 0 || cmp_where(v[a].w, v[lead].w)) {
            lead = a;
            continue;
        }
        /* in a run of one first record: the first by position whose pieces are all the same */
        for (size_t b = lead; b < a; b++) {
            if (r->entries[v[b].i].is_alias || !same_pieces(&c->items[v[b].i], &c->items[v[a].i]) ||
                !archives_only(c, &c->items[v[a].i]))
                continue;
            r->entries[v[a].i].is_alias = 1;
            r->entries[v[a].i].alias_of = v[b].i;
            break;
        }
    }
    free(v);
    return 0;
}

int ckpt_open_dcp(const char *path, ckpt_reader **out, fsdp_err *err) {
    dcp_ckpt *c;
    int rc = dcp_open(path, &c, err);
    if (rc) return rc;
    ckpt_reader *r = ckpt_reader_alloc(path, c->n, &DCP_OPS, CKPT_DCP, c);
    if (!r) {
        dcp_close(c);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        ckpt_entry *e = &r->entries[i];
        e->name = x->fqn;
        e->is_tensor = x->is_tensor;
        e->dtype = x->dtype;
        e->ndim = x->ndim;
        memcpy(e->shape, x->shape, sizeof e->shape);
        e->chunks = (int)x->n_chunks;
        if (x->is_tensor) {
            int64_t nbytes;
            if (chk_shape_bytes(x->ndim, x->shape, fsdp_dtype_size(x->dtype), &nbytes)) { /* dcp_open checked it */
                ckpt_close(r);
                return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: %s: corrupt .metadata: the size overflows",
                                    path, x->fqn);
            }
            e->nbytes = (uint64_t)nbytes;
        } else {
            e->nbytes = x->where.length;
        }
    }
    int rc2 = mark_aliases(r, c, err);
    if (rc2) {
        ckpt_close(r);
        return rc2;
    }
    *out = r;
    return 0;
}
