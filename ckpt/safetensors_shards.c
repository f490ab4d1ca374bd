/* safetensors writer: Hugging Face sharded checkpoint (shard files + model.safetensors.index.json). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"
#include "runtime/crash.h"
#include "runtime/tmpfile.h"

typedef struct sdecl {
    char *name;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    uint64_t nbytes;
    size_t shard, local; /* shard number and index inside that shard's writer */
} sdecl;

typedef struct shard {
    char *file; /* name inside dir */
    st_writer *w;
    uint64_t total, written;
    int begun, done;
} shard;

struct st_shards {
    char *dir, *base;
    uint64_t max;
    char **meta;
    size_t nmeta;
    sdecl *d;
    size_t n, cap;
    shard *s;
    size_t ns;
    int begun, finished, failed;
    unsigned gen; /* of the shard names (safetensors_gen.c) */
};

int st_shards_new(st_shards **out, const char *dir, const char *base, uint64_t max_shard_bytes, fsdp_err *err) {
    *out = NULL;
    if (!dir || !*dir) return fsdp_err_set(err, FSDP_E_INVALID, "safetensors shards: empty directory");
    st_shards *s = (st_shards *)calloc(1, sizeof *s);
    if (!s) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", dir);
    s->dir = strdup(dir);
    s->base = strdup(base && *base ? base : "model");
    s->max = max_shard_bytes;
    if (!s->dir || !s->base) {
        st_shards_free(s);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", dir);
    }
    *out = s;
    return FSDP_OK;
}

void st_shards_free(st_shards *s) {
    if (!s) return;
    for (size_t i = 0; i < s->ns; i++) {
        st_writer_free(s->s[i].w);
        free(s->s[i].file);
    }
    for (size_t i = 0; i < s->n; i++) free(s->d[i].name);
    for (size_t i = 0; i < 2 * s->nmeta; i++) free(s->meta[i]);
    free(s->meta);
    free(s->d);
    free(s->s);
    free(s->dir);
    free(s->base);
    free(s);
}

int st_shards_set_metadata(st_shards *s, const char *key, const char *value, fsdp_err *err) {
    if (s->begun) return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ must be set before st_shards_begin", s->dir);
    if (!key || !value) return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ key/value is NULL", s->dir);
    for (size_t i = 0; i < s->nmeta; i++)
        if (!strcmp(s->meta[2 * i], key))
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: __metadata__ key '%s' set twice", s->dir, key);
    char **m = (char **)realloc(s->meta, 2 * (s->nmeta + 1) * sizeof *m);
    if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
    s->meta = m;
    m[2 * s->nmeta] = strdup(key);
    m[2 * s->nmeta + 1] = strdup(value);
    s->nmeta++;
    if (!m[2 * s->nmeta - 2] || !m[2 * s->nmeta - 1]) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
    return FSDP_OK;
}

int st_shards_declare(st_shards *s, const char *name, fsdp_dtype dt, int ndim, const int64_t *shape, size_t *idx,
                      fsdp_err *err) {
    if (s->begun) return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensors must be declared before st_shards_begin", s->dir);
    if (!name) return fsdp_err_set(err, FSDP_E_INVALID, "%s: NULL tensor name", s->dir);
    if (ndim < 0 || ndim > FSDP_MAX_DIMS || (ndim > 0 && !shape))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': bad rank %d", s->dir, name, ndim);
    int64_t numel = fsdp_numel(ndim, shape);
    size_t esz = fsdp_dtype_size(dt);
    if (!fsdp_dtype_st_name(dt))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': dtype %s has no safetensors equivalent", s->dir,
                            name, fsdp_dtype_name(dt));
    if (numel < 0 || (uint64_t)numel > (uint64_t)INT64_MAX / esz)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': negative or overflowing shape", s->dir, name);
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        sdecl *d = (sdecl *)realloc(s->d, cap * sizeof *d);
        if (!d) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
        s->d = d;
        s->cap = cap;
    }
    sdecl *d = &s->d[s->n];
    memset(d, 0, sizeof *d);
    d->name = strdup(name);
    if (!d->name) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
    d->dtype = dt;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
    d->nbytes = (uint64_t)numel * esz;
    if (idx) *idx = s->n;
    s->n++;
    return FSDP_OK;
}

int st_mkdirs(const char *dir, fsdp_err *err) {
    char *p = strdup(dir);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = FSDP_OK;
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char save = *c;
        *c = '\0';
        struct stat st;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = fsdp_err_set(err, FSDP_E_IO, "%s: cannot create directory: %s", p, strerror(errno));
        } else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = fsdp_err_set(err, FSDP_E_IO, "%s: exists and is not a directory", p);
        }
        *c = save;
        if (rc || !save) break;
    }
    free(p);
    return rc;
}

/* Assigns tensors to shards in declaration order (see safetensors.h). */
static size_t plan(st_shards *s) {
    size_t ns = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < s->n; i++) {
        uint64_t b = s->d[i].nbytes;
        int fits = !s->max || cur == 0 || (cur <= s->max && b <= s->max - cur);
        if (ns == 0 || !fits) {
            ns++;
            cur = 0;
        }
        s->d[i].shard = ns - 1;
        cur += b;
    }
    return ns;
}

static int cmp_decl_name(const void *a, const void *b, void *ctx) {
    const sdecl *d = (const sdecl *)ctx;
    return strcmp(d[*(const size_t *)a].name, d[*(const size_t *)b].name);
}

int st_shards_begin(st_shards *s, fsdp_err *err) {
    if (s->begun) return fsdp_err_set(err, FSDP_E_INVALID, "%s: st_shards_begin called twice", s->dir);
    size_t *ix = (size_t *)malloc((s->n ? s->n : 1) * sizeof(size_t));
    if (!ix) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
    for (size_t i = 0; i < s->n; i++) ix[i] = i;
    qsort_r(ix, s->n, sizeof(size_t), cmp_decl_name, s->d);
    for (size_t i = 1; i < s->n; i++)
        if (!strcmp(s->d[ix[i]].name, s->d[ix[i - 1]].name)) {
            int rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s' declared twice", s->dir, s->d[ix[i]].name);
            free(ix);
            return rc;
        }
    free(ix);
    int rc = st_mkdirs(s->dir, err);
    if (rc) return rc;
    size_t ns = plan(s);
    if ((rc = st_int_shard_gen(s->dir, s->base, ns, &s->gen, err))) return rc;
    s->s = (shard *)calloc(ns ? ns : 1, sizeof *s->s);
    if (!s->s) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
    s->begun = 1;
    for (size_t k = 0; k < ns; k++) {
        shard *sh = &s->s[k];
        s->ns++;
        sh->file = st_int_shard_name(s->base, k, ns, s->gen);
        if (!sh->file) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
        char *path = st_int_join(s->dir, sh->file);
        if (!path) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", s->dir);
        rc = st_writer_new(&sh->w, path, err);
        free(path);
        if (rc) return rc;
        for (size_t i = 0; i < s->nmeta && !rc; i++) rc = st_writer_set_metadata(sh->w, s->meta[2 * i], s->meta[2 * i + 1], err);
        if (rc) return rc;
    }
    for (size_t i = 0; i < s->n; i++) {
        sdecl *d = &s->d[i];
        shard *sh = &s->s[d->shard];
        rc = st_writer_declare(sh->w, d->name, d->dtype, d->ndim, d->shape, &d->local, err);
        if (rc) return rc;
        sh->total += d->nbytes;
    }
    return FSDP_OK;
}

static int shard_close(shard *sh, fsdp_err *err) {
    int rc = FSDP_OK;
    if (!sh->begun) {
        rc = st_writer_begin(sh->w, err);
        sh->begun = 1;
    }
    if (!rc) rc = st_writer_finish(sh->w, err);
    if (!rc) sh->done = 1;
    return rc;
}

int st_shards_write(st_shards *s, size_t idx, const void *data, size_t len, fsdp_err *err) {
    if (!s->begun || s->finished || s->failed)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: not writing (call st_shards_begin first; or an earlier error)",
                            s->dir);
    if (idx >= s->n) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no tensor #%zu", s->dir, idx);
    if (len == 0) return FSDP_OK; /* also fine for a tensor whose shard is already finished */
    shard *sh = &s->s[s->d[idx].shard];
    if (sh->done)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': %zu more bytes exceed its %llu bytes (already complete)",
                            s->dir, s->d[idx].name, len, (unsigned long long)s->d[idx].nbytes);
    int rc = FSDP_OK;
    if (!sh->begun) {
        rc = st_writer_begin(sh->w, err);
        sh->begun = 1;
    }
    if (!rc) rc = st_writer_write(sh->w, s->d[idx].local, data, len, err);
    if (!rc) {
        sh->written += len;
        if (sh->written == sh->total) rc = shard_close(sh, err);
    }
    if (rc && rc != FSDP_E_INVALID) s->failed = 1; /* I/O trouble; usage errors leave the writer usable */
    return rc;
}

static int write_index(st_shards *s, fsdp_err *err) {
    uint64_t total = 0;
    json_t *wm = json_object();
    for (size_t i = 0; wm && i < s->n; i++) {
        total += s->d[i].nbytes;
        if (json_object_set_new(wm, s->d[i].name, json_string(s->s[s->d[i].shard].file))) {
            json_decref(wm);
            wm = NULL;
        }
    }
    json_t *root = wm ? json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm) : NULL;
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    size_t blen = strlen(s->base);
    char *name = (char *)malloc(blen + sizeof ".safetensors.index.json");
    if (name) {
        memcpy(name, s->base, blen);
        memcpy(name + blen, ".safetensors.index.json", sizeof ".safetensors.index.json");
    }
    char *path = name ? st_int_join(s->dir, name) : NULL;
    free(name);
    char *tmp = path ? (char *)malloc(strlen(path) + 5) : NULL;
    if (!text || !path || !tmp) {
        free(text);
        free(path);
        free(tmp);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory writing the index", s->dir);
    }
    sprintf(tmp, "%s.tmp", path);
    /* the index names the new shards: replacing it is the commit (safetensors_gen.c) */
    size_t tl = strlen(text);
    text[tl] = '\n'; /* the terminating NUL becomes the final newline (the length is passed on) */
    int rc = tmpf_write_replace(tmp, path, text, tl + 1, "st.index", err);
    if (!rc) rc = st_int_fsync_dir_of(path, err);
    free(text);
    free(path);
    free(tmp);
    return rc;
}

int st_shards_finish(st_shards *s, fsdp_err *err) {
    if (!s->begun || s->finished || s->failed)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: nothing to finish (not begun, finished or failed)", s->dir);
    for (size_t i = 0; i < s->n; i++) {
        const sdecl *d = &s->d[i];
        const shard *sh = &s->s[d->shard];
        if (!sh->done && !st_writer_complete(sh->w, d->local))
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s' was not completely written", s->dir, d->name);
    }
    for (size_t k = 0; k < s->ns; k++) {
        if (s->s[k].done) continue;
        int rc = shard_close(&s->s[k], err);
        if (rc) {
            s->failed = 1;
            return rc;
        }
    }
    int rc = write_index(s, err);
    if (rc) {
        s->failed = 1;
        return rc;
    }
    s->finished = 1;
    /* the new index is durable: the replaced checkpoint's shards go */
    crash_point("st.index.durable", 1, -1);
    st_int_shard_cleanup(s->dir, s->base, s->ns, s->gen);
    return FSDP_OK;
}

size_t st_shards_count(const st_shards *s) { return s->ns; }
size_t st_shards_of(const st_shards *s, size_t idx) { return idx < s->n && s->begun ? s->d[idx].shard : (size_t)-1; }
const char *st_shards_file(const st_shards *s, size_t shard) { return shard < s->ns ? s->s[shard].file : NULL; }

int st_write_index_of(const char *file, fsdp_err *err) {
    st_reader *r;
    int rc = st_open(&r, file, err);
    if (rc) return rc;
    const char *slash = strrchr(file, '/'), *base = slash ? slash + 1 : file;
    uint64_t total = 0;
    json_t *wm = json_object();
    for (size_t i = 0; wm && i < st_count(r); i++) {
        total += st_tensor(r, i)->nbytes;
        if (json_object_set_new(wm, st_tensor(r, i)->name, json_string(base))) json_decref(wm), wm = NULL;
    }
    st_close(r);
    json_t *root = wm ? json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm) : NULL;
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    size_t fl = strlen(file);
    char *path = malloc(fl + sizeof ".index.json"), *tmp = malloc(fl + sizeof ".index.json.tmp");
    if (!text || !path || !tmp) {
        free(text), free(path), free(tmp);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory writing its index", file);
    }
    sprintf(path, "%s.index.json", file);
    sprintf(tmp, "%s.tmp", path);
    size_t tl = strlen(text);
    text[tl] = '\n';
    rc = tmpf_write_replace(tmp, path, text, tl + 1, "st.index", err);
    if (!rc) rc = st_int_fsync_dir_of(path, err);
    free(text), free(path), free(tmp);
    return rc;
}
