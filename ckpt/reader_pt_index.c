/* Hugging Face directories of torch.save files, as transformers reads them when a model has no
 * safetensors: DIR/pytorch_model.bin, or the shards DIR/pytorch_model.bin.index.json lists
 * ({"metadata": ..., "weight_map": {tensor: file}}). Every file is opened beneath the directory
 * (runtime/fileio.h: a symlink out of it is refused); a sharded checkpoint is one reader over its
 * shards' readers, its weight_map checked against what the shards hold (every listed tensor in
 * its file, every tensor listed), as ckpt/safetensors_open.c checks a safetensors index. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/reader_impl.h"
#include "runtime/fileio.h"

#define PT_INDEX "pytorch_model.bin.index.json"
#define PT_SINGLE "pytorch_model.bin"

typedef struct ptx_impl {
    ckpt_reader **shard;
    size_t n_shard;
    size_t *of, *at; /* entry i: shard of[i], its entry at[i] */
} ptx_impl;

static int ptx_rows(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                    fsdp_err *err) {
    ptx_impl *x = r->impl;
    return ckpt_read_rows_nan(x->shard[x->of[i]], x->at[i], r0, r1, dst, dt, nan, err);
}

static const char *ptx_text(ckpt_reader *r, size_t i) {
    ptx_impl *x = r->impl;
    ckpt_reader *s = x->shard[x->of[i]];
    return s->ops->value_text(s, x->at[i]);
}

static void ptx_free(ptx_impl *x) {
    if (!x) return;
    for (size_t k = 0; k < x->n_shard; k++) ckpt_close(x->shard[k]);
    free(x->shard);
    free(x->of);
    free(x->at);
    free(x);
}

static void ptx_close(ckpt_reader *r) {
    ptx_free(r->impl);
    ckpt_reader_free(r);
}

static const ckpt_ops PTX_OPS = {ptx_rows, ptx_text, ptx_close, NULL, NULL, NULL, NULL};

int ckpt_pt_shards(const ckpt_reader *r, ckpt_reader *const **shard, size_t *n) {
    if (r->ops != &PTX_OPS) return 0;
    const ptx_impl *x = r->impl;
    *shard = x->shard;
    *n = x->n_shard;
    return 1;
}

void ckpt_pt_locate(const ckpt_reader *r, size_t i, ckpt_reader **shard, size_t *j) {
    const ptx_impl *x = r->impl;
    *shard = x->shard[x->of[i]];
    *j = x->at[i];
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The weight_map's files, sorted and unique (*names points into the JSON). */
static int shard_names(const json_t *wm, const char *ip, const char ***names, size_t *n, fsdp_err *err) {
    *names = calloc(json_object_size(wm) + 1, sizeof **names);
    if (!*names) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    size_t m = 0;
    json_object_foreach((json_t *)wm, k, v) {
        const char *f = json_string_value(v);
        if (!f || !*f || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, ".."))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: weight_map entry '%s' must be a file name inside the "
                                "index's directory", ip, k);
        (*names)[m++] = f;
    }
    qsort(*names, m, sizeof **names, cmp_str);
    *n = 0;
    for (size_t i = 0; i < m; i++)
        if (!*n || strcmp((*names)[*n - 1], (*names)[i])) (*names)[(*n)++] = (*names)[i];
    return 0;
}

/* Every shard's entries in r (in shard order), each listed by the weight_map in its own file. */
static int gather(ckpt_reader *r, ptx_impl *x, const char *const *files, const json_t *wm, const char *ip,
                  fsdp_err *err) {
    size_t n = 0;
    for (size_t k = 0; k < x->n_shard; k++) {
        ckpt_reader *s = x->shard[k];
        for (size_t j = 0; j < s->n; j++, n++) {
            const ckpt_entry *e = &s->entries[j];
            const char *f = json_string_value(json_object_get(wm, e->name));
            if (e->is_tensor && !f)
                return fsdp_err_set(err, FSDP_E_FORMAT, "%s: shard %s holds tensor '%s' that the weight_map does not "
                                    "list", ip, files[k], e->name);
            if (e->is_tensor && strcmp(f, files[k]))
                return fsdp_err_set(err, FSDP_E_FORMAT, "%s: weight_map puts tensor '%s' in %s but it is in %s", ip,
                                    e->name, f, files[k]);
            size_t prev;
            int a = nidx_add(&r->names, e->name, n, &prev);
            if (a < 0) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            if (a > 0)
                return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s' is in two shards (%s and %s)", ip, e->name,
                                    files[x->of[prev]], files[k]);
            r->entries[n] = *e;
            x->of[n] = k, x->at[n] = j;
        }
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
        if (nidx_get(&r->names, k) < 0)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: weight_map lists tensor '%s' in %s, which has no such tensor",
                                ip, k, json_string_value(v));
    }
    return 0;
}

/* The shards of the index (JSON root) opened beneath dfd, then the reader over them. */
static int open_shards(int dfd, const char *dir, const char *ip, const json_t *root, ckpt_reader **out,
                       fsdp_err *err) {
    const json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s", ip, wm ? "\"weight_map\" must be an object"
                                                                 : "missing \"weight_map\" (not an index)");
    const char **files = NULL;
    size_t nf = 0, total = 0;
    ptx_impl *x = calloc(1, sizeof *x);
    int rc = x ? shard_names(wm, ip, &files, &nf, err) : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc && !(x->shard = calloc(nf ? nf : 1, sizeof *x->shard)))
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < nf && !rc; k++, x->n_shard++) {
        char p[4400];
        int fd;
        snprintf(p, sizeof p, "%s/%s", dir, files[k]);
        rc = fio_open_beneath(dfd, dir, files[k], &fd, err);
        if (!rc) rc = ckpt_open_pt_fd(fd, p, &x->shard[k], err);
        if (rc) fsdp_err_prefix(err, "%s: shard %s", ip, files[k]);
        else total += x->shard[k]->n;
    }
    ckpt_reader *r = rc ? NULL : ckpt_reader_alloc(dir, total, &PTX_OPS, CKPT_PT, x);
    if (!rc && r) {
        x->of = calloc(total ? total : 1, sizeof *x->of);
        x->at = calloc(total ? total : 1, sizeof *x->at);
    }
    if (!rc && (!r || !x->of || !x->at)) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) rc = gather(r, x, files, wm, ip, err);
    free(files);
    if (rc) {
        if (r) ckpt_reader_free(r);
        ptx_free(x);
        return rc;
    }
    *out = r;
    return 0;
}

int ckpt_open_pt_hf(const char *path, ckpt_reader **out, fsdp_err *err) {
    struct stat st;
    char dir[4200], ip[4400];
    const char *rel = PT_INDEX;
    snprintf(dir, sizeof dir, "%s", path);
    if (stat(path, &st) != 0) return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) { /* the index itself */
        char *slash = strrchr(dir, '/');
        rel = slash ? path + (slash - dir) + 1 : path;
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
    }
    int dfd, fd;
    int rc = fio_open_dir(dir, &dfd, err);
    if (rc) return rc;
    snprintf(ip, sizeof ip, "%s/%s", dir, rel);
    if (S_ISDIR(st.st_mode) && faccessat(dfd, PT_INDEX, F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
        snprintf(ip, sizeof ip, "%s/%s", dir, PT_SINGLE); /* one file */
        rc = fio_open_beneath(dfd, dir, PT_SINGLE, &fd, err);
        close(dfd);
        return rc ? rc : ckpt_open_pt_fd(fd, ip, out, err);
    }
    rc = fio_open_beneath(dfd, dir, rel, &fd, err);
    json_error_t je;
    json_t *root = rc ? NULL : json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    if (!rc) close(fd);
    if (!rc && !root)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: invalid JSON index: %s (line %d, column %d)", ip, je.text, je.line,
                          je.column);
    if (!rc) rc = open_shards(dfd, dir, ip, root, out, err);
    json_decref(root);
    close(dfd);
    return rc;
}
