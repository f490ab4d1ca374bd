/* Reading DCP checkpoints: only the byte ranges a requested box needs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/dcp.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
#include "runtime/fileio.h"

static int read_file(const char *path, void **buf, size_t *len, fsdp_err *err) {
    /* named as "checkpoint <dir>: <file>" (a FIFO or another non-regular file is an error, not a hang) */
    char label[4400];
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(label, sizeof label, "checkpoint %.*s: %s", (int)(slash - path), path, slash + 1);
    else snprintf(label, sizeof label, "checkpoint .: %s", path);
    FILE *f;
    int rc = fio_fopen_read(path, label, &f, err);
    if (rc) return rc;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size > ((off_t)1 << 34)) {
        fclose(f);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: cannot size the file", path);
    }
    *len = (size_t)st.st_size;
    *buf = malloc(*len ? *len : 1);
    if (!*buf) {
        fclose(f);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", path);
    }
    size_t got = fread(*buf, 1, *len, f);
    fclose(f);
    if (got != *len) {
        free(*buf);
        return fsdp_err_set(err, FSDP_E_IO, "%s: short read", path);
    }
    return 0;
}

void dcp_close(dcp_ckpt *c) {
    if (!c) return;
    dcp_items_free(c->items, c->n);
    for (size_t i = 0; i < c->n_files; i++) {
        if (c->files[i].fd >= 0) close(c->files[i].fd);
        free(c->files[i].rel);
    }
    free(c->files);
    free(c->dir);
    free(c);
}

static struct dcp_file *get_file(dcp_ckpt *c, const char *rel, fsdp_err *err) {
    for (size_t i = 0; i < c->n_files; i++)
        if (!strcmp(c->files[i].rel, rel)) return &c->files[i];
    struct dcp_file *nf = realloc(c->files, (c->n_files + 1) * sizeof *nf);
    if (!nf) {
        fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        return NULL;
    }
    c->files = nf;
    struct dcp_file *f = &c->files[c->n_files];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, rel);
    mode_t mode = 0;
    int e = fio_open_raw(path, O_RDONLY, &f->fd, &mode); /* never blocks on a FIFO */
    if (e) {
        if (e < 0)
            fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s is a %s, not a regular file", c->dir, rel, fio_type_name(mode));
        else fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: cannot open %s: %s", c->dir, rel, strerror(e));
        return NULL;
    }
    struct stat st;
    fstat(f->fd, &st);
    f->size = (uint64_t)st.st_size;
    f->rel = strdup(rel);
    c->n_files++;
    return f;
}

static int check_range(dcp_ckpt *c, const char *fqn, const dcp_storage *s, fsdp_err *err) {
    struct dcp_file *f = get_file(c, s->relative_path, err);
    if (!f) return err->code;
    if (s->offset > f->size || s->length > f->size - s->offset)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "checkpoint %s: .metadata places %s at bytes [%llu, %llu) of %s, but that file has only "
                            "%llu bytes (truncated or mismatched)",
                            c->dir, fqn, (unsigned long long)s->offset, (unsigned long long)(s->offset + s->length),
                            s->relative_path, (unsigned long long)f->size);
    return 0;
}

static int merge_rank_local(const char *dir, dcp_item **items, size_t *n, char *ver, fsdp_err *err) {
    DIR *d = opendir(dir);
    if (!d) return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0, found = 0;
    while ((de = readdir(d)) && !rc) {
        int r;
        char tail[8];
        if (sscanf(de->d_name, "__%d.metadat%1s", &r, tail) != 2 || strcmp(strrchr(de->d_name, '.'), ".metadata"))
            continue;
        found = 1;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        void *buf;
        size_t len;
        if ((rc = read_file(path, &buf, &len, err))) break;
        dcp_item *part;
        size_t np;
        rc = dcp_parse_metadata(buf, len, path, &part, &np, ver, 32, err);
        free(buf);
        if (rc) break;
        /* merge: same fqn -> concatenate chunks */
        for (size_t i = 0; i < np; i++) {
            size_t j = 0;
            while (j < *n && strcmp((*items)[j].fqn, part[i].fqn)) j++;
            if (j == *n) {
                dcp_item *ni = realloc(*items, (*n + 1) * sizeof *ni);
                if (!ni) {
                    rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                    break;
                }
                *items = ni;
                (*items)[(*n)++] = part[i];
                memset(&part[i], 0, sizeof part[i]);
            } else if (part[i].is_tensor) {
                dcp_item *x = &(*items)[j];
                dcp_chunk *nc = realloc(x->chunks, (x->n_chunks + part[i].n_chunks) * sizeof *nc);
                if (!nc) {
                    rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                    break;
                }
                memcpy(nc + x->n_chunks, part[i].chunks, part[i].n_chunks * sizeof *nc);
                x->chunks = nc;
                x->n_chunks += part[i].n_chunks;
            }
        }
        dcp_items_free(part, np);
    }
    closedir(d);
    if (!rc && !found)
        rc = fsdp_err_set(err, FSDP_E_FORMAT,
                          "checkpoint %s is incomplete: there is no .metadata (the save did not finish, or this is not "
                          "a DCP checkpoint)",
                          dir);
    return rc;
}

int dcp_open(const char *dir, dcp_ckpt **out, fsdp_err *err) {
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0) return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: not a directory", dir);
    dcp_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/.metadata", dir);
    int rc;
    if (stat(path, &st) == 0) {
        void *buf;
        size_t len;
        if (!(rc = read_file(path, &buf, &len, err))) {
            rc = dcp_parse_metadata(buf, len, path, &c->items, &c->n, c->version, sizeof c->version, err);
            free(buf);
        }
    } else {
        rc = merge_rank_local(dir, &c->items, &c->n, c->version, err);
        /* merged chunks must still tile each tensor */
        for (size_t i = 0; !rc && i < c->n; i++) {
            dcp_item *x = &c->items[i];
            if (!x->is_tensor) continue;
            int64_t tot = 1, cov = 0;
            for (int d = 0; d < x->ndim; d++) tot *= x->shape[d];
            for (size_t k = 0; k < x->n_chunks; k++) {
                int64_t v = 1;
                for (int d = 0; d < x->ndim; d++) v *= x->chunks[k].sizes[d];
                cov += v;
            }
            if (cov != tot)
                rc = fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: %s: the rank-local chunks cover %lld of %lld elements",
                                  dir, x->fqn, (long long)cov, (long long)tot);
        }
    }
    for (size_t i = 0; !rc && i < c->n; i++) {
        dcp_item *x = &c->items[i];
        if (!x->is_tensor) rc = check_range(c, x->fqn, &x->where, err);
        for (size_t k = 0; !rc && x->is_tensor && k < x->n_chunks; k++)
            if (x->chunks[k].where.relative_path[0]) rc = check_range(c, x->fqn, &x->chunks[k].where, err);
    }
    if (rc) {
        dcp_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

long dcp_find(const dcp_ckpt *c, const char *fqn) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->items[i].fqn, fqn)) return (long)i;
    return -1;
}

static int open_blob(dcp_ckpt *c, const dcp_storage *s, zip_reader *z, fsdp_err *err) {
    struct dcp_file *f = get_file(c, s->relative_path, err);
    if (!f) return err->code;
    char what[4400];
    snprintf(what, sizeof what, "%s/%s@%llu", c->dir, s->relative_path, (unsigned long long)s->offset);
    return zip_open_fd(z, f->fd, s->offset, s->length, what, err);
}

/* An error of reading tensor fqn names it (once). */
static int name_tensor(fsdp_err *err, const char *fqn, int rc) {
    char tag[1100];
    snprintf(tag, sizeof tag, "tensor %s", fqn);
    return strstr(err->msg, tag) ? rc : fsdp_err_prefix(err, "%s", tag);
}

int dcp_read_box(dcp_ckpt *c, size_t i, const int64_t *off, const int64_t *len, void *dst, fsdp_dtype dst_dt,
                 fsdp_err *err) {
    dcp_item *x = &c->items[i];
    if (!x->is_tensor) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: %s is not a tensor", c->dir, x->fqn);
    int nd = x->ndim;
    size_t esz = fsdp_dtype_size(dst_dt);
    int64_t dst_stride[FSDP_MAX_DIMS];
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (off[d] < 0 || len[d] < 0 || off[d] + len[d] > x->shape[d])
            return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: box outside tensor %s", c->dir, x->fqn);
        dst_stride[d] = s;
        s *= len[d];
    }
    if (s == 0) return 0;
    for (size_t k = 0; k < x->n_chunks; k++) {
        dcp_chunk *ch = &x->chunks[k];
        int64_t io[FSDP_MAX_DIMS], il[FSDP_MAX_DIMS], vol = 1;
        for (int d = 0; d < nd; d++) {
            int64_t a = off[d] > ch->offsets[d] ? off[d] : ch->offsets[d];
            int64_t b = off[d] + len[d] < ch->offsets[d] + ch->sizes[d] ? off[d] + len[d] : ch->offsets[d] + ch->sizes[d];
            il[d] = b > a ? b - a : 0;
            io[d] = a;
            vol *= il[d];
        }
        if (vol == 0) continue;
        zip_reader z;
        int rc = open_blob(c, &ch->where, &z, err);
        if (rc) return rc;
        pkl_doc *doc;
        const pkl_obj *root;
        ts_tensor t;
        rc = ts_load_pickle(&z, &doc, &root, err);
        if (!rc) {
            rc = ts_tensor_from_pickle(root, z.what, &t, err);
            pkl_free(doc);
        }
        if (!rc) rc = ts_check_record(&z, &t, x->fqn, err);
        if (!rc && (t.ndim != nd || memcmp(t.shape, ch->sizes, (size_t)nd * sizeof *t.shape)))
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: %s: stored piece has another shape than its chunk",
                              c->dir, x->fqn);
        if (rc) {
            zip_close(&z);
            return name_tensor(err, x->fqn, rc);
        }
        int64_t so[FSDP_MAX_DIMS];
        for (int d = 0; d < nd; d++) so[d] = io[d] - ch->offsets[d];
        /* read the intersection into a temporary then scatter into dst's box layout */
        int full_rows = 1; /* intersection spans whole trailing dims of the destination box */
        for (int d = 1; d < nd; d++)
            if (il[d] != len[d]) full_rows = 0;
        char *tgt = (char *)dst;
        for (int d = 0; d < nd; d++) tgt += (size_t)((io[d] - off[d]) * dst_stride[d]) * esz;
        if (full_rows) {
            rc = ts_read_box(&z, &t, so, il, tgt, dst_dt, err);
        } else {
            void *tmp = malloc((size_t)vol * esz);
            if (!tmp) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            else rc = ts_read_box(&z, &t, so, il, tmp, dst_dt, err);
            if (!rc) {
                int64_t idx[FSDP_MAX_DIMS] = {0};
                int64_t inner = il[nd - 1];
                for (int64_t e = 0; e < vol; e += inner) {
                    size_t doff = 0;
                    for (int d = 0; d < nd; d++) doff += (size_t)(idx[d] * dst_stride[d]);
                    memcpy(tgt + doff * esz, (char *)tmp + (size_t)e * esz, (size_t)inner * esz);
                    for (int d = nd - 2; d >= 0; d--) {
                        if (++idx[d] < il[d]) break;
                        idx[d] = 0;
                    }
                }
            }
            free(tmp);
        }
        zip_close(&z);
        if (rc) return name_tensor(err, x->fqn, rc);
    }
    return 0;
}

int dcp_read_value(dcp_ckpt *c, size_t i, pkl_doc **doc, const pkl_obj **root, fsdp_err *err) {
    dcp_item *x = &c->items[i];
    if (x->is_tensor) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: %s is a tensor", c->dir, x->fqn);
    zip_reader z;
    int rc = open_blob(c, &x->where, &z, err);
    if (rc) return rc;
    rc = ts_load_pickle(&z, doc, root, err);
    zip_close(&z);
    return rc;
}

const char *dcp_value_text(dcp_ckpt *c, size_t i) {
    dcp_item *x = &c->items[i];
    if (x->is_tensor) return NULL;
    if (x->value_text) return x->value_text;
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    if (dcp_read_value(c, i, &doc, &root, &err)) return NULL;
    x->value_text = pkl_repr(root);
    pkl_free(doc);
    return x->value_text;
}

/* Every record of the archive at s, checked. */
static int verify_blob(dcp_ckpt *c, const dcp_storage *s, size_t *records, fsdp_err *err) {
    zip_reader z;
    int rc = open_blob(c, s, &z, err);
    if (rc) return rc;
    for (size_t k = 0; !rc && k < z.n; k++, ++*records) rc = zip_verify(&z, &z.entries[k], err);
    zip_close(&z);
    return rc;
}

int dcp_verify(dcp_ckpt *c, size_t *records, fsdp_err *err) {
    *records = 0;
    for (size_t i = 0; i < c->n; i++) {
        dcp_item *x = &c->items[i];
        int rc = x->is_tensor ? 0 : verify_blob(c, &x->where, records, err);
        for (size_t k = 0; !rc && x->is_tensor && k < x->n_chunks; k++)
            rc = verify_blob(c, &x->chunks[k].where, records, err);
        if (rc) return fsdp_err_prefix(err, "%s %s", x->is_tensor ? "tensor" : "value", x->fqn);
    }
    return 0;
}
