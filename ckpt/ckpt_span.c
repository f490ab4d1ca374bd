/* cks_src_resolve (ckpt_stream.h): where a tensor's bytes lie in a DCP directory's data files (its
 * chunks' torch.save records or safetensors pieces) or in a safetensors file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_stream.h"
#include "ckpt/dcp.h"
#include "ckpt/dcp_st.h"
#include "ckpt/reader_impl.h"
#include "ckpt/reader_view.h"
#include "ckpt/safetensors.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"

static int cmp_chunk_row(const void *a, const void *b) {
    const dcp_chunk *x = *(const dcp_chunk *const *)a, *y = *(const dcp_chunk *const *)b;
    return x->offsets[0] < y->offsets[0] ? -1 : x->offsets[0] > y->offsets[0];
}

/* A C-contiguous tensor of shape sizes at the start of its record, which holds exactly its bytes. */
static int plain_record(const ts_tensor *t, const zip_entry *e, const int64_t *sizes, int nd, fsdp_dtype dt) {
    if (t->ndim != nd || t->dtype != dt || t->storage_offset != 0 || e->method != 0) return 0;
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (t->shape[d] != sizes[d]) return 0;
        if (t->shape[d] > 1 && t->stride[d] != st) return 0;
        st *= t->shape[d];
    }
    return e->size == (uint64_t)t->numel * fsdp_dtype_size(dt);
}

/* The segment of one non-empty chunk of DCP item x; *ok = 0 when it is not a plain record. */
static int dcp_chunk_seg(dcp_ckpt *c, const dcp_item *x, const dcp_chunk *ch, cks_files *fc, cks_seg *g, int *ok,
                         fsdp_err *err) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", c->dir, ch->where.relative_path);
    int fd, held;
    uint64_t fsize, held_size;
    const char *what;
    int rc = dcp_data_fd(c, ch->where.relative_path, &held, &held_size, err);
    if (!rc) rc = cks_files_adopt(fc, path, held, held_size, &fd, &fsize, &what, err);
    if (rc) return fsdp_err_prefix(err, "tensor %s", x->fqn);
    memset(g, 0, sizeof *g);
    g->fd = fd, g->what = what, g->row0 = x->ndim ? ch->offsets[0] : 0, g->rows = x->ndim ? ch->sizes[0] : 1;
    if (dcp_st_is_piece(fd, ch->where.offset)) {
        dcp_st_blob *blob = NULL;
        dcp_st_tensor t;
        rc = dcp_st_locate(&blob, fd, fsize, ch->where.offset, x->fqn, x->ndim, ch->offsets, what, &t, err);
        dcp_st_blob_free(blob);
        if (rc) return fsdp_err_prefix(err, "tensor %s", x->fqn);
        if (t.ndim != x->ndim || t.dtype != x->dtype || memcmp(t.shape, ch->sizes, (size_t)x->ndim * sizeof *t.shape))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: stored piece of %s has another dtype or shape than its chunk "
                                "in .metadata", what, x->fqn);
        g->off = t.at;
        g->len = (uint64_t)fsdp_numel(x->ndim, ch->sizes) * fsdp_dtype_size(x->dtype);
        return 0;
    }
    zip_reader z;
    char zwhat[4500];
    snprintf(zwhat, sizeof zwhat, "%s@%llu", what, (unsigned long long)ch->where.offset);
    if ((rc = zip_open_fd(&z, fd, ch->where.offset, ch->where.length, zwhat, err)))
        return fsdp_err_prefix(err, "tensor %s", x->fqn);
    ts_tensor t;
    rc = ts_load_tensor(&z, x->fqn, &t, err);
    if (!rc) {
        char rec[80];
        snprintf(rec, sizeof rec, "data/%s", t.key);
        zip_entry *e = zip_find(&z, rec);
        if (e && plain_record(&t, e, ch->sizes, x->ndim, x->dtype)) {
            g->off = ch->where.offset + e->data_off;
            g->len = e->size;
            g->check = 1;
            g->crc = e->crc;
            g->run = 0;
            snprintf(g->rec, sizeof g->rec, "@%llu: zip record %s", (unsigned long long)ch->where.offset, e->name);
        } else {
            *ok = 0;
        }
    }
    zip_close(&z);
    return rc ? fsdp_err_prefix(err, "tensor %s", x->fqn) : 0;
}

static int resolve_dcp(ckpt_reader *r, size_t i, cks_files *fc, cks_src *s, int *ok, fsdp_err *err) {
    dcp_ckpt *c = r->impl;
    const dcp_item *x = &c->items[i];
    const dcp_chunk **ord = calloc(x->n_chunks ? x->n_chunks : 1, sizeof *ord);
    s->seg = calloc(x->n_chunks ? x->n_chunks : 1, sizeof *s->seg);
    if (!ord || !s->seg) {
        free(ord);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t k = 0; k < x->n_chunks; k++) {
        const dcp_chunk *ch = &x->chunks[k];
        if (fsdp_numel(x->ndim, ch->sizes) == 0) continue;
        for (int d = 1; d < x->ndim; d++) /* only whole rows */
            if (ch->offsets[d] != 0 || ch->sizes[d] != x->shape[d]) *ok = 0;
        ord[n++] = ch;
    }
    qsort(ord, n, sizeof *ord, cmp_chunk_row);
    int rc = 0;
    for (size_t k = 0; k < n && *ok && !rc; k++) rc = dcp_chunk_seg(c, x, ord[k], fc, &s->seg[s->n++], ok, err);
    free(ord);
    return rc;
}

static int resolve_st(ckpt_reader *r, size_t i, cks_files *fc, cks_src *s, fsdp_err *err) {
    st_reader *sr = r->impl;
    const st_tensor_info *t = st_tensor(sr, i);
    s->seg = calloc(1, sizeof *s->seg);
    if (!s->seg) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    cks_seg *g = &s->seg[0];
    uint64_t fsize;
    int held = st_file_fd(sr, t->file);
    int rc = held >= 0 ? cks_files_adopt(fc, st_file_path(sr, t->file), held, st_file_size(sr, t->file), &g->fd, &fsize,
                                          &g->what, err)
                       : cks_files_open(fc, st_file_path(sr, t->file), &g->fd, &fsize, &g->what, err);
    if (rc) return fsdp_err_prefix(err, "tensor %s", t->name);
    g->off = t->offset;
    g->len = t->nbytes;
    g->row0 = 0;
    g->rows = s->rows;
    s->n = 1;
    return 0;
}

static int cmp_seg_row(const void *a, const void *b) {
    const cks_seg *x = a, *y = b;
    return x->row0 < y->row0 ? -1 : x->row0 > y->row0;
}

/* A view's entry made of runs of consecutive rows (a fused tensor's part, a renamed whole): its source's
 * byte ranges, cut to each run's rows and placed at the view's; not when a run permutes rows. */
static int resolve_view_runs(ckpt_reader *r, size_t i, cks_files *fc, cks_src *s, int *ok, fsdp_err *err) {
    ckpt_reader *src;
    const ckv_run *run;
    size_t nr;
    *ok = 0;
    if (!ckpt_view_runs(r, i, &src, &run, &nr)) return 0;
    /* one run of whole rows (a part of q, k, v or gate, up fused one after another): its source's bytes; the many
     * short runs of an interleave (torchtitan 0.3's per-kv-head q, k, v) read faster whole (measured) */
    if (nr != 1) return 0;
    for (size_t k = 0; k < nr; k++)
        if (run[k].vstride != 1 || run[k].sstride != 1) return 0;
    size_t cap = 0;
    int rc = 0, all = 1;
    for (size_t k = 0; k < nr && all && !rc; k++) {
        cks_src t;
        int ok2 = 0;
        if ((rc = cks_src_resolve(src, run[k].src, fc, &t, &ok2, err)) || !ok2) {
            all = ok2;
            continue;
        }
        if (k == 0) s->dtype = t.dtype, s->row_bytes = t.row_bytes;
        for (size_t g = 0; g < t.n && !rc; g++) {
            const cks_seg *x = &t.seg[g];
            int64_t a = x->row0 > run[k].s0 ? x->row0 : run[k].s0;
            int64_t b = x->row0 + x->rows < run[k].s0 + run[k].n ? x->row0 + x->rows : run[k].s0 + run[k].n;
            if (a >= b) continue;
            if (s->n == cap) {
                cks_seg *ns = realloc(s->seg, (cap = cap ? 2 * cap : 16) * sizeof *ns);
                if (!ns) {
                    rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                    break;
                }
                s->seg = ns;
            }
            cks_seg *y = &s->seg[s->n++];
            *y = *x;
            y->off = x->off + (uint64_t)(a - x->row0) * t.row_bytes;
            y->len = (uint64_t)(b - a) * t.row_bytes;
            y->row0 = run[k].v0 + (a - run[k].s0);
            y->rows = b - a;
            y->run = 0, y->done = 0;
            if (a != x->row0 || b != x->row0 + x->rows) y->check = 0; /* a record's CRC covers all of it */
        }
        cks_src_free(&t);
    }
    if (rc || !all) {
        free(s->seg);
        s->seg = NULL, s->n = 0;
        return rc;
    }
    qsort(s->seg, s->n, sizeof *s->seg, cmp_seg_row);
    const ckpt_entry *e = ckpt_entry_at(r, i);
    s->name = e->name;
    s->rows = e->ndim ? e->shape[0] : 1;
    s->fc = fc;
    *ok = 1;
    return 0;
}

int cks_src_resolve(ckpt_reader *r, size_t i, cks_files *fc, cks_src *s, int *ok, fsdp_err *err) {
    memset(s, 0, sizeof *s);
    const ckpt_entry *e = ckpt_entry_at(r, i);
    if (r->ops->same) { /* a view or a union: an entry passed through streams from its source, runs of whole rows too */
        ckpt_reader *src;
        long j = ckpt_view_same(r, i, &src);
        *ok = 0;
        if (j < 0) return resolve_view_runs(r, i, fc, s, ok, err);
        int rc = cks_src_resolve(src, (size_t)j, fc, s, ok, err);
        if (!rc && *ok) s->name = e->name;
        return rc;
    }
    *ok = e && e->is_tensor && (r->format == CKPT_DCP || r->format == CKPT_SAFETENSORS);
    if (!*ok) return 0;
    s->name = e->name;
    s->dtype = e->dtype;
    s->rows = e->ndim ? e->shape[0] : 1;
    int64_t per = 1;
    for (int d = 1; d < e->ndim; d++) per *= e->shape[d];
    s->row_bytes = (uint64_t)per * fsdp_dtype_size(e->dtype);
    s->fc = fc;
    int rc = r->format == CKPT_DCP ? resolve_dcp(r, i, fc, s, ok, err) : resolve_st(r, i, fc, s, err);
    if (rc || !*ok) cks_src_free(s);
    return rc;
}
