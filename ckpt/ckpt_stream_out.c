/* cks_to_st / cks_to_dcp (ckpt_stream_out.h). */
#include "ckpt/ckpt_stream_out.h"

#include <string.h>

#include "ckpt/zip_write_at.h"

int cks_rows_to_st(cks_src *s, int64_t r0, int64_t r1, fsdp_dtype dt, st_writer *w, size_t idx, const char *what,
                   const cks_opts *o, fsdp_err *err) {
    int fd;
    uint64_t off;
    int rc = st_writer_target(w, idx, &fd, &off, err);
    if (rc) return rc;
    rc = cks_copy_rows(s, r0, r1, dt, fd, off, NULL, o, what, err);
    uint64_t n = (uint64_t)(r1 - r0) * (s->row_bytes / fsdp_dtype_size(s->dtype)) * fsdp_dtype_size(dt);
    fsdp_err e2;
    int rc2 = st_writer_wrote(w, idx, rc ? 0 : n, rc != 0, &e2);
    if (!rc && rc2) *err = e2;
    return rc ? rc : rc2;
}

int cks_to_st(cks_src *s, fsdp_dtype dt, st_writer *w, size_t idx, const char *what, const cks_opts *o,
              fsdp_err *err) {
    return cks_rows_to_st(s, 0, s->rows, dt, w, idx, what, o, err);
}

/* The run of tensors k0 .. *k1 (file order) written from v; each accounted in w and marked done. */
static int run_write(st_writer *w, const cks_st_from *from, size_t k0, size_t k1, cks_src *v, char *done,
                     const char *what, const cks_opts *o, fsdp_err *err) {
    int fd;
    uint64_t off;
    size_t first = st_writer_file_order(w, k0);
    int rc = st_writer_target(w, first, &fd, &off, err);
    if (!rc) rc = cks_copy_rows(v, 0, v->rows, from[first].dt, fd, off, NULL, o, what, err);
    for (size_t k = k0; k < k1; k++) {
        size_t i = st_writer_file_order(w, k);
        const cks_src *s = from[i].src;
        uint64_t n = (uint64_t)(from[i].r1 - from[i].r0) * (s->row_bytes / fsdp_dtype_size(s->dtype)) *
                     fsdp_dtype_size(from[i].dt);
        fsdp_err e2;
        int rc2 = st_writer_wrote(w, i, rc ? 0 : n, rc != 0, &e2);
        if (!rc && rc2) *err = e2, rc = rc2;
        if (!rc) done[i] = 1;
    }
    return rc;
}

int cks_runs_to_st(st_writer *w, const cks_st_from *from, char *done, const char *what, const cks_opts *o,
                   fsdp_err *err) {
    size_t n = st_writer_count(w), k0 = 0;
    cks_src v;
    memset(&v, 0, sizeof v);
    int rc = 0, in_run = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        const cks_st_from *f = &from[st_writer_file_order(w, k)];
        int joined = f->src && in_run && f->dt == from[st_writer_file_order(w, k0)].dt
                         ? cks_src_append(&v, f->src, f->r0, f->r1, f->src->name) : 1;
        if (joined < 0) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (joined <= 0) continue;
        /* the run ends before this one (not streamed, other dtypes): written; this one may start the next */
        if (in_run) rc = run_write(w, from, k0, k, &v, done, what, o, err);
        cks_src_free(&v);
        in_run = 0;
        int j = !rc && f->src ? cks_src_append(&v, f->src, f->r0, f->r1, f->src->name) : 1;
        if (j < 0) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (j == 0) in_run = 1, k0 = k;
    }
    if (!rc && in_run) rc = run_write(w, from, k0, n, &v, done, what, o, err);
    cks_src_free(&v);
    return rc;
}

typedef struct dcp_fill {
    cks_src *s;
    int64_t r0, r1;
    fsdp_dtype dt;
    const cks_opts *o;
    const char *what;
} dcp_fill;

static int fill_chunk(void *user, zip_writer *zw, fsdp_err *err) {
    dcp_fill *f = user;
    int fd;
    uint64_t off;
    int rc = zip_writer_data_pos(zw, &fd, &off, err);
    uint32_t crc = 0;
    if (!rc) rc = cks_copy_rows(f->s, f->r0, f->r1, f->dt, fd, off, &crc, f->o, f->what, err);
    if (rc) {
        zw->failed = 1;
        return rc;
    }
    uint64_t n = (uint64_t)(f->r1 - f->r0) * (f->s->row_bytes / fsdp_dtype_size(f->s->dtype)) * fsdp_dtype_size(f->dt);
    return zip_writer_data_written(zw, n, crc, err);
}

int cks_to_dcp(cks_src *s, int64_t r0, int64_t r1, const char *name, fsdp_dtype dt, int ndim, const int64_t *shape,
               dcp_file_writer *fw, const cks_opts *o, dcp_record *rec, fsdp_err *err) {
    int64_t off[FSDP_MAX_DIMS] = {0}, sizes[FSDP_MAX_DIMS];
    memcpy(sizes, shape, (size_t)ndim * sizeof *shape);
    if (ndim > 0) {
        off[0] = r0;
        sizes[0] = r1 - r0;
    }
    dcp_fill f = {s, r0, r1, dt, o, fw->tmp};
    return dcp_file_add_tensor_fill(fw, name, dt, ndim, shape, off, sizes, fill_chunk, &f, rec, err);
}
