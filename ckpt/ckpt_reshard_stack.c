/* ckrs_write_stack (ckpt_reshard.h): a stack of source tensors (grouped experts) as DCP chunks. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_pwrite.h"
#include "ckpt/ckpt_reshard.h"
#include "ckpt/crc32.h"
#include "ckpt/namemap.h"
#include "ckpt/zip_write_at.h"
#include "runtime/shard.h"

/* The parts of one stacked entry: each resolved for the stream (ok[k]) or read whole on demand. */
typedef struct stack_src {
    const ckrs_src *s;
    const ckrs_entry *x;
    cks_src *src;
    int *ok;
    int64_t part_rows;   /* rows of one part (its dim 0; 1 for a 0-d part) */
    size_t sub_bytes;    /* bytes of one part row as x->dt */
    int64_t f0, f1;      /* the chunk's flat rows */
    const char *what;
    cks_src all;         /* every part streamed alike (dtype, row size): their rows in a row as one tensor's, so that
                            a chunk is copied in whole pieces, not part by part */
} stack_src;

/* Rows [a, b) of part k read whole (as x->dt) and written at pos of fd; *crc their CRC-32. */
static int write_whole_rows(stack_src *t, int k, int64_t a, int64_t b, int fd, uint64_t pos, uint32_t *crc,
                            fsdp_err *err) {
    void *buf = NULL;
    int rc = t->s->read_whole(t->s->user, t->x->parts[k], t->x->dt, &buf, err);
    if (rc) return rc;
    ckpt_pio_opts po = {0, 1, 0, 0};
    *crc = 0;
    rc = ckpt_pwrite_all(fd, (const char *)buf + (size_t)a * t->sub_bytes, (size_t)(b - a) * t->sub_bytes, pos, crc,
                         t->what, &po, err);
    free(buf);
    return rc;
}

/* dcp_file_add_tensor_fill's callback: the chunk's flat rows, part piece by part piece. */
static int fill_stack(void *user, zip_writer *zw, fsdp_err *err) {
    stack_src *t = user;
    int fd;
    uint64_t pos;
    int rc = zip_writer_data_pos(zw, &fd, &pos, err);
    uint32_t crc = 0;
    uint64_t total = 0;
    if (!rc && t->all.seg) { /* its rows are elements: a flat row is sub_bytes of them */
        int64_t e = (int64_t)(t->sub_bytes / fsdp_dtype_size(t->x->dt));
        total = (uint64_t)(t->f1 - t->f0) * t->sub_bytes;
        rc = cks_copy_rows(&t->all, t->f0 * e, t->f1 * e, t->x->dt, fd, pos, &crc, &t->s->o, t->what, err);
    }
    for (int64_t f = t->f0; f < t->f1 && !rc && !t->all.seg;) {
        int k;
        int64_t a, b;
        nmap_stack_piece(t->part_rows, f, t->f1, &k, &a, &b);
        uint32_t c = 0;
        rc = t->ok[k] ? cks_copy_rows(&t->src[k], a, b, t->x->dt, fd, pos, &c, &t->s->o, t->what, err)
                      : write_whole_rows(t, k, a, b, fd, pos, &c, err);
        uint64_t n = (uint64_t)(b - a) * t->sub_bytes;
        crc = ckpt_crc32_combine(crc, c, n);
        pos += n;
        total += n;
        f += b - a;
    }
    if (rc) {
        zw->failed = 1;
        return rc;
    }
    return zip_writer_data_written(zw, total, crc, err);
}

/* t->all from the resolved parts when every one streams with the same dtype and row size (else left empty): each
 * part's rows appended in turn (cks_src_append: rows of one element, errors naming the part) */
static int merge_parts(stack_src *t, fsdp_err *err) {
    for (size_t q = 0; q < t->x->nparts; q++) {
        const cks_src *p = &t->src[q];
        if (!t->ok[q] || p->dtype != t->src[0].dtype || p->row_bytes != t->src[0].row_bytes || p->rows != t->part_rows)
            return 0;
    }
    for (size_t q = 0; q < t->x->nparts; q++)
        if (cks_src_append(&t->all, &t->src[q], 0, t->part_rows, t->src[q].name) < 0) {
            cks_src_free(&t->all);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
    return 0;
}

int ckrs_write_stack(const ckrs_src *s, size_t k, int lo, int hi, dcp_file_writer *fw, cks_files *fc,
                     dcp_record **recs, size_t *nrec, fsdp_err *err) {
    const ckrs_entry *x = &s->e[k];
    const ckpt_entry *p0 = ckpt_entry_at(s->r, x->parts[0]);
    stack_src t = {s, x, calloc(x->nparts, sizeof(cks_src)), calloc(x->nparts, sizeof(int)),
                   p0->ndim ? p0->shape[0] : 1, 0, 0, 0, NULL, {0}};
    int rc = t.src && t.ok ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int64_t per = 1;
    for (int d = 2; d < x->ndim; d++) per *= x->shape[d];
    t.sub_bytes = (size_t)per * fsdp_dtype_size(x->dt);
    for (size_t q = 0; q < x->nparts && !rc; q++)
        if (!s->can_stream || s->can_stream(s->user, x->parts[q]))
            rc = cks_src_resolve(s->r, x->parts[q], fc, &t.src[q], &t.ok[q], err);
    if (!rc && x->nparts > 1) rc = merge_parts(&t, err);
    for (int r = lo; r < hi && !rc; r++) {
        dcp_file_writer *w = &fw[r - lo];
        t.what = w->tmp;
        int64_t row0 = 0, rows = x->shape[0];
        shard_rows(x->shape[0], s->world, r, &row0, &rows);
        int64_t off[FSDP_MAX_DIMS] = {0}, sizes[FSDP_MAX_DIMS];
        memcpy(sizes, x->shape, sizeof sizes);
        sizes[0] = rows;
        /* an empty shard records the dimension size as its offset (as save-dcp, PyTorch >= 2.8) */
        off[0] = rows == 0 && s->world > 1 ? x->shape[0] : row0;
        t.f0 = row0 * t.part_rows;
        t.f1 = (row0 + rows) * t.part_rows;
        rc = dcp_file_add_tensor_fill(w, x->name, x->dt, x->ndim, x->shape, off, sizes, fill_stack, &t,
                                      &recs[r - lo][nrec[r - lo]++], err);
    }
    for (size_t q = 0; t.src && t.ok && q < x->nparts; q++)
        if (t.ok[q]) cks_src_free(&t.src[q]);
    cks_src_free(&t.all);
    free(t.src);
    free(t.ok);
    return rc;
}
