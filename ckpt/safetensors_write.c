/* safetensors writer: one file, streamed (header first, then tensor bytes in pieces). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/safetensors_internal.h"
#include "runtime/crash.h"
#include "runtime/tmpfile.h"

enum { W_DECLARE = 0, W_WRITING, W_DONE, W_FAILED };

typedef struct wtensor {
    char *name;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    uint64_t nbytes, begin, written; /* begin relative to the data buffer */
} wtensor;

struct st_writer {
    char *path, *tmp;
    int fd, state;
    int tmp_created; /* tmp is this writer's (created and locked by it) */
    long tensors_done;
    wtensor *t;
    size_t n, cap;
    char **meta; /* key, value, ... */
    size_t nmeta;
    size_t *order; /* file order -> declared index */
    uint64_t header_len, data_size;
};

int st_writer_new(st_writer **out, const char *path, fsdp_err *err) {
    *out = NULL;
    if (!path || !*path) return fsdp_err_set(err, FSDP_E_INVALID, "safetensors writer: empty path");
    st_writer *w = (st_writer *)calloc(1, sizeof *w);
    if (!w) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    w->fd = -1;
    size_t n = strlen(path);
    w->path = strdup(path);
    w->tmp = (char *)malloc(n + 5);
    if (!w->path || !w->tmp) {
        st_writer_free(w);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    *out = w;
    return FSDP_OK;
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    /* unlinked while still locked (runtime/tmpfile.h), then closed */
    if ((w->state == W_WRITING || w->state == W_FAILED) && w->tmp_created) unlink(w->tmp);
    if (w->fd >= 0) close(w->fd);
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    for (size_t i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
    free(w->meta);
    free(w->t);
    free(w->order);
    free(w->path);
    free(w->tmp);
    free(w);
}

int st_writer_set_metadata(st_writer *w, const char *key, const char *value, fsdp_err *err) {
    if (w->state != W_DECLARE)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ must be set before writing starts", w->path);
    if (!key || !value) return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ key/value is NULL", w->path);
    for (size_t i = 0; i < w->nmeta; i++)
        if (!strcmp(w->meta[2 * i], key))
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ key '%s' set twice", w->path, key);
    char **m = (char **)realloc(w->meta, 2 * (w->nmeta + 1) * sizeof *m);
    if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", w->path);
    w->meta = m;
    m[2 * w->nmeta] = strdup(key);
    m[2 * w->nmeta + 1] = strdup(value);
    w->nmeta++;
    if (!m[2 * w->nmeta - 2] || !m[2 * w->nmeta - 1])
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", w->path);
    return FSDP_OK;
}

int st_writer_declare(st_writer *w, const char *name, fsdp_dtype dt, int ndim, const int64_t *shape,
                      size_t *idx, fsdp_err *err) {
    if (w->state != W_DECLARE)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensors must be declared before writing starts", w->path);
    if (!name || !strcmp(name, "__metadata__"))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: invalid tensor name '%s'", w->path, name ? name : "(null)");
    if (!fsdp_dtype_st_name(dt))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': dtype %s has no safetensors equivalent",
                            w->path, name, fsdp_dtype_name(dt));
    if (ndim < 0 || ndim > FSDP_MAX_DIMS || (ndim > 0 && !shape))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': bad rank %d", w->path, name, ndim);
    int64_t numel = fsdp_numel(ndim, shape);
    size_t esz = fsdp_dtype_size(dt);
    if (numel < 0 || (uint64_t)numel > (uint64_t)INT64_MAX / esz)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': negative or overflowing shape", w->path, name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wtensor *t = (wtensor *)realloc(w->t, cap * sizeof *t);
        if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", w->path);
        w->t = t;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", w->path);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = (uint64_t)numel * esz;
    if (idx) *idx = w->n;
    w->n++;
    return FSDP_OK;
}

/* The reference writer's order: descending dtype alignment rank, then name (bytewise). */
static int cmp_order(const void *a, const void *b, void *ctx) {
    const wtensor *t = (const wtensor *)ctx;
    const wtensor *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
    int rx = st_dtype_rank(x->dtype), ry = st_dtype_rank(y->dtype);
    if (rx != ry) return rx > ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* serde_json writes \u escapes with lowercase hex digits; Jansson with uppercase. */
static void lowercase_u_escapes(char *s) {
    for (; *s; s++) {
        if (*s != '\\') continue;
        if (s[1] == 'u') {
            for (int i = 2; i < 6 && s[i]; i++)
                if (s[i] >= 'A' && s[i] <= 'F') s[i] = (char)(s[i] - 'A' + 'a');
        }
        if (s[1]) s++; /* skip the escaped character (so "\\u" stays literal) */
    }
}

static int build_header(st_writer *w, char **out, size_t *len, fsdp_err *err) {
    json_t *root = json_object();
    if (!root) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory building the header", w->path);
    if (w->nmeta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) {
            json_decref(root);
            return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory building the header", w->path);
        }
        for (size_t i = 0; i < w->nmeta; i++) {
            if (json_object_set_new(m, w->meta[2 * i], json_string(w->meta[2 * i + 1]))) {
                json_decref(root);
                return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ '%s' is not valid UTF-8", w->path,
                                    w->meta[2 * i]);
            }
        }
    }
    for (size_t k = 0; k < w->n; k++) {
        const wtensor *t = &w->t[w->order[k]];
        json_t *sh = json_array(), *o = NULL;
        int bad = !sh;
        for (int i = 0; !bad && i < t->ndim; i++) bad = json_array_append_new(sh, json_integer(t->shape[i]));
        if (!bad)
            o = json_pack("{s:s,s:O,s:[I,I]}", "dtype", fsdp_dtype_st_name(t->dtype), "shape", sh, "data_offsets",
                          (json_int_t)t->begin, (json_int_t)(t->begin + t->nbytes));
        json_decref(sh);
        if (!o) {
            json_decref(root);
            return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory building the header", w->path);
        }
        if (json_object_set_new(root, t->name, o)) {
            json_decref(root);
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor name '%s' is not valid UTF-8", w->path, t->name);
        }
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory building the header", w->path);
    lowercase_u_escapes(s);
    size_t n = strlen(s), padded = (n + 7) / 8 * 8;
    char *h = (char *)realloc(s, padded + 1);
    if (!h) {
        free(s);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory building the header", w->path);
    }
    memset(h + n, ' ', padded - n);
    h[padded] = '\0';
    *out = h;
    *len = padded;
    return FSDP_OK;
}

static int pwrite_all(st_writer *w, const void *buf, size_t len, uint64_t off, fsdp_err *err) {
    uint64_t at = 0;
    int e = ckpt_pwrite_sliced(w->fd, buf, len, off, &at);
    if (!e) return FSDP_OK;
    w->state = W_FAILED;
    return fsdp_err_set(err, FSDP_E_IO, "%s: write failed at byte %llu: %s", w->tmp, (unsigned long long)at,
                        e == EIO ? "no progress" : strerror(e));
}

static int cmp_name(const void *a, const void *b, void *ctx) {
    const wtensor *t = (const wtensor *)ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int check_unique(const st_writer *w, fsdp_err *err) {
    size_t *ix = (size_t *)malloc((w->n ? w->n : 1) * sizeof(size_t));
    if (!ix) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", w->path);
    for (size_t i = 0; i < w->n; i++) ix[i] = i;
    qsort_r(ix, w->n, sizeof(size_t), cmp_name, w->t);
    int rc = FSDP_OK;
    for (size_t i = 1; i < w->n && !rc; i++)
        if (!strcmp(w->t[ix[i]].name, w->t[ix[i - 1]].name))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s' declared twice", w->path, w->t[ix[i]].name);
    free(ix);
    return rc;
}

int st_writer_begin(st_writer *w, fsdp_err *err) {
    if (w->state != W_DECLARE) return fsdp_err_set(err, FSDP_E_INVALID, "%s: st_writer_begin called twice", w->path);
    free(w->order);
    w->order = (size_t *)malloc((w->n ? w->n : 1) * sizeof(size_t));
    if (!w->order) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", w->path);
    for (size_t i = 0; i < w->n; i++) w->order[i] = i;
    qsort_r(w->order, w->n, sizeof(size_t), cmp_order, w->t);
    int rc = check_unique(w, err);
    if (rc) return rc;
    uint64_t off = 0;
    for (size_t k = 0; k < w->n; k++) {
        wtensor *t = &w->t[w->order[k]];
        if (t->nbytes > (uint64_t)INT64_MAX - off)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: total data size overflows", w->path);
        t->begin = off;
        off += t->nbytes;
    }
    w->data_size = off;
    char *h = NULL;
    size_t hlen = 0;
    rc = build_header(w, &h, &hlen, err);
    if (rc) return rc;
    if (hlen > ST_MAX_HEADER_SIZE) {
        free(h);
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: header of %zu bytes exceeds the safetensors limit", w->path, hlen);
    }
    w->header_len = hlen;
    rc = tmpf_create(w->tmp, &w->fd, NULL, NULL, err);
    if (rc) {
        free(h);
        return rc;
    }
    w->tmp_created = 1;
    w->state = W_WRITING;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    rc = pwrite_all(w, le, 8, 0, err);
    if (!rc) rc = pwrite_all(w, h, hlen, 8, err);
    free(h);
    return rc;
}

int st_writer_write(st_writer *w, size_t idx, const void *data, size_t len, fsdp_err *err) {
    if (w->state != W_WRITING)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: not writing (call st_writer_begin first; or an earlier error)",
                            w->path);
    if (idx >= w->n) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no tensor #%zu", w->path, idx);
    wtensor *t = &w->t[idx];
    if (len > t->nbytes - t->written)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': %zu more bytes exceed its %llu bytes (%llu written)",
                            w->path, t->name, len, (unsigned long long)t->nbytes, (unsigned long long)t->written);
    if (!len) return FSDP_OK;
    if (!data) return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': NULL data", w->path, t->name);
    int rc = pwrite_all(w, data, len, 8 + w->header_len + t->begin + t->written, err);
    if (!rc) t->written += len;
    if (!rc && t->written == t->nbytes) crash_point("st.data.tensor", ++w->tensors_done, -1);
    return rc;
}

int st_writer_target(st_writer *w, size_t idx, int *fd, uint64_t *off, fsdp_err *err) {
    if (w->state != W_WRITING)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: not writing (call st_writer_begin first; or an earlier error)",
                            w->path);
    if (idx >= w->n) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no tensor #%zu", w->path, idx);
    *fd = w->fd;
    *off = 8 + w->header_len + w->t[idx].begin + w->t[idx].written;
    return FSDP_OK;
}

int st_writer_wrote(st_writer *w, size_t idx, uint64_t len, int failed, fsdp_err *err) {
    if (w->state != W_WRITING || idx >= w->n)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: st_writer_wrote outside writing", w->path);
    if (failed) {
        w->state = W_FAILED;
        return FSDP_OK;
    }
    wtensor *t = &w->t[idx];
    if (len > t->nbytes - t->written) {
        w->state = W_FAILED;
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': %llu more bytes exceed its %llu bytes", w->path,
                            t->name, (unsigned long long)len, (unsigned long long)t->nbytes);
    }
    t->written += len;
    if (t->written == t->nbytes) crash_point("st.data.tensor", ++w->tensors_done, -1);
    return FSDP_OK;
}

int st_int_fsync_dir_of(const char *path, fsdp_err *err) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = strdup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = (char *)malloc(n + 1);
        if (dir) {
            memcpy(dir, path, n);
            dir[n] = '\0';
        }
    }
    if (!dir) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = FSDP_OK;
    if (fd < 0 || fsync(fd) != 0)
        rc = fsdp_err_set(err, FSDP_E_IO, "%s: cannot sync directory: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int st_writer_finish(st_writer *w, fsdp_err *err) {
    if (w->state != W_WRITING)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: nothing to finish (not begun, finished or failed)", w->path);
    for (size_t k = 0; k < w->n; k++) {
        const wtensor *t = &w->t[w->order[k]];
        if (t->written != t->nbytes)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s' incomplete: %llu of %llu bytes written",
                                w->path, t->name, (unsigned long long)t->written, (unsigned long long)t->nbytes);
    }
    crash_point("st.data.written", 1, -1);
    if (fsync(w->fd) != 0) {
        w->state = W_FAILED;
        return fsdp_err_set(err, FSDP_E_IO, "%s: fsync failed: %s", w->tmp, strerror(errno));
    }
    crash_point("st.data.synced", 1, -1);
    /* renamed while still open: the lock (runtime/tmpfile.h) covers the temporary until it has its
     * final name; rename replaces an existing file atomically */
    if (rename(w->tmp, w->path) != 0) {
        w->state = W_FAILED;
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
    }
    w->state = W_DONE;
    crash_point("st.data.renamed", 1, -1);
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) return fsdp_err_set(err, FSDP_E_IO, "%s: close failed: %s", w->path, strerror(errno));
    return st_int_fsync_dir_of(w->path, err);
}

uint64_t st_writer_data_size(const st_writer *w) { return w->data_size; }
uint64_t st_writer_file_size(const st_writer *w) { return 8 + w->header_len + w->data_size; }
size_t st_writer_count(const st_writer *w) { return w->n; }
size_t st_writer_file_order(const st_writer *w, size_t pos) {
    return w->order && pos < w->n ? w->order[pos] : pos;
}
int st_writer_complete(const st_writer *w, size_t idx) {
    return idx < w->n && w->t[idx].written == w->t[idx].nbytes;
}

int st_save(const char *path, const st_entry *entries, size_t n, const char *const *meta, size_t meta_n,
            st_fill_fn fill, void *user, fsdp_err *err) {
    st_writer *w;
    int rc = st_writer_new(&w, path, err);
    if (rc) return rc;
    for (size_t i = 0; !rc && i < meta_n; i++) rc = st_writer_set_metadata(w, meta[2 * i], meta[2 * i + 1], err);
    for (size_t i = 0; !rc && i < n; i++)
        rc = st_writer_declare(w, entries[i].name, entries[i].dtype, entries[i].ndim, entries[i].shape, NULL, err);
    if (!rc) rc = st_writer_begin(w, err);
    for (size_t k = 0; !rc && k < n; k++) {
        size_t i = w->order[k];
        if (fill) {
            rc = fill(user, w, i, err);
            if (!rc && !st_writer_complete(w, i))
                rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: the fill callback left tensor '%s' incomplete", path,
                                  w->t[i].name);
        } else {
            rc = st_writer_write(w, i, entries[i].data, (size_t)w->t[i].nbytes, err);
        }
    }
    if (!rc) rc = st_writer_finish(w, err);
    st_writer_free(w);
    return rc;
}
