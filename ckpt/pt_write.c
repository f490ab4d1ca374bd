/* torch.save files of many tensors (ckpt/pt_write.h). */
#include "ckpt/pt_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
#include "runtime/tmpfile.h"

/* a tensor's rows are read and written in pieces of about this many bytes */
#define TS_TREE_PIECE ((size_t)32 << 20)

struct ptw_file {
    char *path, *tmp;
    char archive[128];
    FILE *f;
    zip_writer zw;
    pkl_w w;
    long next; /* the next storage key */
};

int ptw_begin(const char *path, const char *archive, ptw_file **out, fsdp_err *err) {
    *out = NULL;
    ptw_file *t = calloc(1, sizeof *t);
    size_t n = strlen(path) + 8;
    if (!t || !(t->path = strdup(path)) || !(t->tmp = malloc(n))) {
        if (t) free(t->path);
        free(t);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    snprintf(t->tmp, n, "%s.tmp", path);
    snprintf(t->archive, sizeof t->archive, "%s", archive);
    int fd, rc = tmpf_create(t->tmp, &fd, NULL, NULL, err);
    if (!rc && !(t->f = fdopen(fd, "wb"))) {
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", t->tmp, strerror(errno));
        close(fd);
        unlink(t->tmp);
    }
    if (!rc) rc = zip_writer_begin(&t->zw, t->f, err);
    if (rc) {
        if (t->f) fclose(t->f), unlink(t->tmp);
        free(t->path), free(t->tmp), free(t);
        return rc;
    }
    pkl_w_init(&t->w);
    pkl_w_proto(&t->w, 2);
    *out = t;
    return 0;
}

pkl_w *ptw_pickle(ptw_file *t) { return &t->w; }

static int start_record(ptw_file *t, fsdp_dtype dt, int ndim, const int64_t *shape, uint64_t *bytes, fsdp_err *err) {
    int64_t numel = fsdp_numel(ndim, shape);
    if (numel < 0) return fsdp_err_set(err, FSDP_E_INVALID, "torch.save: invalid shape");
    char key[32], rec[200];
    snprintf(key, sizeof key, "%ld", t->next++);
    snprintf(rec, sizeof rec, "%s/data/%s", t->archive, key);
    ts_w_tensor_ref(&t->w, dt, ndim, shape, key);
    *bytes = (uint64_t)numel * fsdp_dtype_size(dt);
    return zip_writer_start(&t->zw, rec, *bytes, err);
}

int ptw_tensor_mem(ptw_file *t, fsdp_dtype dt, int ndim, const int64_t *shape, const void *data, fsdp_err *err) {
    uint64_t bytes;
    int rc = start_record(t, dt, ndim, shape, &bytes, err);
    if (!rc && bytes) rc = zip_writer_data(&t->zw, data, (size_t)bytes, err);
    if (!rc) rc = zip_writer_end_record(&t->zw, err);
    return rc;
}

int ptw_tensor_begin(ptw_file *t, fsdp_dtype dt, int ndim, const int64_t *shape, fsdp_err *err) {
    uint64_t bytes;
    return start_record(t, dt, ndim, shape, &bytes, err);
}

int ptw_tensor_data(ptw_file *t, const void *data, size_t n, fsdp_err *err) {
    return n ? zip_writer_data(&t->zw, data, n, err) : 0;
}

int ptw_tensor_end(ptw_file *t, fsdp_err *err) { return zip_writer_end_record(&t->zw, err); }

int ptw_tensor_from(ptw_file *t, ckpt_reader *r, size_t i, fsdp_dtype dt, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, i);
    if (!dt) dt = e->dtype;
    uint64_t bytes;
    int rc = start_record(t, dt, e->ndim, e->shape, &bytes, err);
    int64_t rows = e->ndim ? e->shape[0] : 1;
    size_t row_bytes = rows ? (size_t)(bytes / (uint64_t)rows) : 0;
    int64_t step = row_bytes ? (int64_t)(TS_TREE_PIECE / row_bytes) : rows;
    if (step < 1) step = 1;
    void *buf = NULL;
    if (!rc && bytes && !(buf = malloc((size_t)(step < rows ? step : rows) * row_bytes)))
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory writing %s", e->name);
    for (int64_t r0 = 0; !rc && bytes && r0 < rows; r0 += step) {
        int64_t r1 = r0 + step < rows ? r0 + step : rows;
        if (!(rc = ckpt_read_rows(r, i, r0, r1, buf, dt, err)))
            rc = zip_writer_data(&t->zw, buf, (size_t)(r1 - r0) * row_bytes, err);
    }
    free(buf);
    if (!rc) rc = zip_writer_end_record(&t->zw, err);
    return rc ? fsdp_err_prefix(err, "writing %s to %s", e->name, t->tmp) : 0;
}

int ptw_value_parse(ckpt_reader *r, size_t i, pkl_doc **doc, const pkl_obj **root, fsdp_err *err) {
    void *buf;
    size_t len;
    int rc = ckpt_value_pickle(r, i, &buf, &len, err);
    if (rc) return rc;
    rc = pkl_parse(buf, len, ckpt_entry_at(r, i)->name, doc, root, err);
    free(buf);
    return rc;
}

int ptw_value_into(pkl_w *p, ckpt_reader *r, size_t i, fsdp_err *err) {
    pkl_doc *doc;
    const pkl_obj *root;
    int rc = ptw_value_parse(r, i, &doc, &root, err);
    if (rc) return rc;
    if (pkl_w_value(p, root, 1u << 20))
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: a value torch.save cannot hold here (a storage, or too large)",
                          ckpt_entry_at(r, i)->name);
    pkl_free(doc);
    return rc;
}

int ptw_value_from(ptw_file *t, ckpt_reader *r, size_t i, fsdp_err *err) { return ptw_value_into(&t->w, r, i, err); }

static int finish(ptw_file *t, fsdp_err *err) {
    char rec[200];
    pkl_w_stop(&t->w);
    if (t->w.oom) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    snprintf(rec, sizeof rec, "%s/data.pkl", t->archive);
    int rc = zip_writer_add(&t->zw, rec, t->w.buf, t->w.len, err);
    snprintf(rec, sizeof rec, "%s/byteorder", t->archive);
    if (!rc) rc = zip_writer_add(&t->zw, rec, "little", 6, err);
    snprintf(rec, sizeof rec, "%s/version", t->archive);
    if (!rc) rc = zip_writer_add(&t->zw, rec, "3\n", 2, err);
    uint64_t len;
    if (!rc) rc = zip_writer_finish(&t->zw, &len, err);
    if (!rc && fflush(t->f) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", t->tmp, strerror(errno));
    if (!rc && fsync(fileno(t->f)) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", t->tmp, strerror(errno));
    if (!rc && rename(t->tmp, t->path) != 0)
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot rename %s: %s", t->tmp, strerror(errno));
    return rc;
}

int ptw_finish(ptw_file *t, fsdp_err *err) {
    int rc = finish(t, err);
    if (rc) unlink(t->tmp);
    if (fclose(t->f) != 0 && !rc) rc = fsdp_err_set(err, FSDP_E_IO, "%s: close failed: %s", t->path, strerror(errno));
    t->f = NULL;
    zip_writer_free(&t->zw);
    pkl_w_free(&t->w);
    free(t->path), free(t->tmp), free(t);
    return rc;
}

void ptw_abort(ptw_file *t) {
    if (!t) return;
    if (t->f) fclose(t->f);
    unlink(t->tmp);
    zip_writer_free(&t->zw);
    pkl_w_free(&t->w);
    free(t->path), free(t->tmp), free(t);
}
