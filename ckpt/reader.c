/* Format dispatch of ckpt_reader; each format lives in its own ckpt/reader_<fmt>.c. */
#include "ckpt/reader.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_stale.h"
#include "ckpt/ckpt_steps.h"
#include "ckpt/dcp.h"
#include "ckpt/reader_impl.h"
#include "ckpt/reader_view.h"
#include "runtime/fileio.h"

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int file_exists(const char *dir, const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

const char *ckpt_format_name(ckpt_format f) {
    switch (f) {
    case CKPT_DCP: return "dcp";
    case CKPT_SAFETENSORS: return "safetensors";
    case CKPT_PT: return "pt";
    default: return "auto";
    }
}

int ckpt_format_from_name(const char *name, ckpt_format *out) {
    const ckpt_format all[] = {CKPT_AUTO, CKPT_DCP, CKPT_SAFETENSORS, CKPT_PT};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, ckpt_format_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return -1;
}

/* A directory with DCP data files or checkpoint writers' temporaries but no .metadata: a save that
 * did not finish (an error naming what is there), else 0. */
static int incomplete_save(const char *path, fsdp_err *err) {
    DIR *d = opendir(path);
    if (!d) return 0;
    size_t data = 0, tmps = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (has_suffix(de->d_name, ".distcp")) data++;
        else if (ckpt_stale_owned(de->d_name)) tmps++;
    }
    closedir(d);
    if (!data && !tmps) return 0;
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "checkpoint %s is an incomplete save: it has %zu data file%s (.distcp) and %zu temporary "
                        "file%s (.tmp) but no .metadata (a save that did not finish, or one still running)",
                        path, data, data == 1 ? "" : "s", tmps, tmps == 1 ? "" : "s");
}

static int detect(const char *path, ckpt_format *fmt, fsdp_err *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if (file_exists(path, ".metadata") || file_exists(path, "__0.metadata")) {
            *fmt = CKPT_DCP;
            return 0;
        }
        if (file_exists(path, "model.safetensors.index.json") || file_exists(path, "model.safetensors")) {
            *fmt = CKPT_SAFETENSORS;
            return 0;
        }
        if (file_exists(path, "pytorch_model.bin.index.json") || file_exists(path, "pytorch_model.bin")) {
            *fmt = CKPT_PT; /* transformers' torch.save layout (no safetensors) */
            return 0;
        }
        int rc = incomplete_save(path, err);
        if (rc) return rc;
        char hint[1024];
        if (ckpt_steps_hint(path, hint, sizeof hint))
            return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: a run directory, not a checkpoint: %s", path, hint);
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "checkpoint %s: not a DCP checkpoint (no .metadata) nor a Hugging Face directory "
                            "(model.safetensors[.index.json] or pytorch_model.bin[.index.json])", path);
    }
    if (has_suffix(path, ".bin.index.json")) {
        *fmt = CKPT_PT;
        return 0;
    }
    if (has_suffix(path, ".safetensors") || has_suffix(path, ".json")) {
        *fmt = CKPT_SAFETENSORS;
        return 0;
    }
    if (has_suffix(path, ".pt") || has_suffix(path, ".pth") || has_suffix(path, ".bin")) {
        *fmt = CKPT_PT;
        return 0;
    }
    /* sniff: a zip (torch.save) or a safetensors header */
    FILE *f;
    char label[4200];
    snprintf(label, sizeof label, "checkpoint %s", path);
    int rc = fio_fopen_read(path, label, &f, err);
    if (rc) return rc;
    unsigned char head[8] = {0};
    size_t n = fread(head, 1, 8, f);
    fclose(f);
    if ((n >= 4 && head[0] == 'P' && head[1] == 'K') || ckpt_pt_is_legacy(path)) {
        *fmt = CKPT_PT;
        return 0;
    }
    if (n == 8) {
        *fmt = CKPT_SAFETENSORS;
        return 0;
    }
    return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: unknown format (use format: dcp|safetensors|pt)", path);
}

/* The name index behind ckpt_find: the first entry of each name (O(n log n) to build); none for
 * a format that finds names itself. */
static int index_names(ckpt_reader *r, fsdp_err *err) {
    if (r->ops->find) return 0;
    for (size_t i = 0; i < r->n; i++)
        if (nidx_add(&r->names, r->entries[i].name, i, NULL) < 0)
            return fsdp_err_set(err, FSDP_E_NOMEM, "checkpoint %s: out of memory indexing %zu names", r->path, r->n);
    return 0;
}

int ckpt_open(const char *path, ckpt_format fmt, ckpt_reader **out, fsdp_err *err) {
    *out = NULL;
    int rc = 0;
    if (fmt == CKPT_AUTO && (rc = detect(path, &fmt, err))) return rc;
    switch (fmt) {
    case CKPT_SAFETENSORS: rc = ckpt_open_safetensors(path, out, err); break;
    case CKPT_DCP: rc = ckpt_open_dcp(path, out, err); break;
    case CKPT_PT: {
        struct stat st;
        int hf = has_suffix(path, ".bin.index.json") || (stat(path, &st) == 0 && S_ISDIR(st.st_mode));
        rc = hf ? ckpt_open_pt_hf(path, out, err) : ckpt_open_pt(path, out, err);
        break;
    }
    default: return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: unknown format", path);
    }
    if (!rc && (rc = index_names(*out, err))) {
        ckpt_close(*out);
        *out = NULL;
    }
    if (!rc && fmt == CKPT_DCP) {
        const dcp_ckpt *c = (*out)->impl;
        (*out)->identity = c->meta_hash ? c->meta_hash : ckpt_identity_at(path);
        (*out)->restarts = c->restarts;
    } else if (!rc) {
        (*out)->identity = ckpt_identity_at(path);
    }
    return rc;
}

uint64_t ckpt_identity(const ckpt_reader *r) { return r->identity; }

int ckpt_restarts(const ckpt_reader *r) { return r->restarts; }


uint64_t ckpt_identity_at(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    uint64_t h = DCP_HASH_START;
    int dfd = -1, fd = -1;
    fsdp_err e;
    if (S_ISDIR(st.st_mode) && !fio_open_dir(path, &dfd, &e)) {
        int rc = fio_open_beneath(dfd, path, ".metadata", &fd, &e);
        close(dfd);
        if (!rc) { /* a DCP checkpoint: its .metadata's bytes, as dcp_open hashes them */
            char buf[65536];
            ssize_t n;
            while ((n = read(fd, buf, sizeof buf)) > 0) h = dcp_hash_bytes(h, buf, (size_t)n);
            close(fd);
            return dcp_hash_end(h);
        }
    }
    char index[4200];
    struct stat ist;
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
    if (S_ISDIR(st.st_mode) && stat(index, &ist) != 0) /* or the torch.save files' index */
        snprintf(index, sizeof index, "%s/pytorch_model.bin.index.json", path);
    if (S_ISDIR(st.st_mode) && stat(index, &ist) == 0) st = ist; /* an HF directory: its index, replaced last */
    uint64_t v[4] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                     (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec};
    h = dcp_hash_bytes(h, v, sizeof v);
    return dcp_hash_end(h);
}

ckpt_reader *ckpt_reader_alloc(const char *path, size_t n, const ckpt_ops *ops, ckpt_format format, void *impl) {
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->entries = calloc(n ? n : 1, sizeof *r->entries);
    r->path = strdup(path);
    if (!r->entries || !r->path) {
        ckpt_reader_free(r);
        return NULL;
    }
    r->ops = ops;
    r->format = format;
    r->impl = impl;
    r->n = n;
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

void ckpt_reader_free(ckpt_reader *r) {
    if (!r) return;
    nidx_free(&r->names);
    free(r->entries);
    free(r->path);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

void ckpt_close(ckpt_reader *r) {
    if (!r) return;
    if (__atomic_fetch_sub(&r->extra_refs, 1, __ATOMIC_ACQ_REL) > 0) return; /* another holder keeps it open */
    r->ops->close(r);
}

int ckpt_reader_of_files(const ckpt_reader *r) { return r && !r->inner && !(r->ops && r->ops->same); }

ckpt_reader *ckpt_reader_ref(ckpt_reader *r) {
    if (r) __atomic_add_fetch(&r->extra_refs, 1, __ATOMIC_RELAXED);
    return r;
}

int ckpt_read_rows_shared(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, int *nan,
                          fsdp_err *err) {
    if (r->format == CKPT_SAFETENSORS) return ckpt_read_rows_nan(r, i, r0, r1, dst, dst_dt, nan, err);
    pthread_mutex_lock(&r->lock);
    int rc = ckpt_read_rows_nan(r, i, r0, r1, dst, dst_dt, nan, err);
    pthread_mutex_unlock(&r->lock);
    return rc;
}
ckpt_format ckpt_reader_format(const ckpt_reader *r) { return r->format; }
const char *ckpt_reader_path(const ckpt_reader *r) { return r->path; }
size_t ckpt_count(const ckpt_reader *r) { return r->n; }
const ckpt_entry *ckpt_entry_at(const ckpt_reader *r, size_t i) { return i < r->n ? &r->entries[i] : NULL; }

long ckpt_find(const ckpt_reader *r, const char *name) {
    if (r->ops && r->ops->find) return r->ops->find(r, name);
    if (r->names.n) return nidx_get(&r->names, name);
    for (size_t i = 0; i < r->n; i++) /* a reader not made by ckpt_open */
        if (!strcmp(r->entries[i].name, name)) return (long)i;
    return -1;
}

int ckpt_verify(ckpt_reader *r, size_t *records, fsdp_err *err) {
    *records = 0;
    if (r->ops->verify) return r->ops->verify(r, records, err); /* a reader over others: their files */
    switch (r->format) {
    case CKPT_PT: return ckpt_verify_pt(r, records, err);
    case CKPT_DCP: return dcp_verify(r->impl, records, err);
    default: return 0; /* safetensors: no checksums */
    }
}

int ckpt_read_rows(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, fsdp_err *err) {
    return ckpt_read_rows_nan(r, i, r0, r1, dst, dst_dt, NULL, err);
}

int ckpt_read_rows_nan(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, int *nan,
                       fsdp_err *err) {
    if (nan) *nan = 0;
    if (i >= r->n) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: no tensor #%zu", r->path, i);
    const ckpt_entry *e = &r->entries[i];
    if (!e->is_tensor)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: '%s' is not a tensor", r->path, e->name);
    int64_t rows = e->ndim == 0 ? 1 : e->shape[0];
    if (r0 < 0 || r1 < r0 || r1 > rows)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: rows [%lld, %lld) of '%s' are outside its %lld rows",
                            r->path, (long long)r0, (long long)r1, e->name, (long long)rows);
    if (r0 == r1) return 0;
    return r->ops->read_rows(r, i, r0, r1, dst, dst_dt == FSDP_DT_INVALID ? e->dtype : dst_dt, nan, err);
}

const char *ckpt_value_text(ckpt_reader *r, size_t i) {
    return i < r->n && r->ops->value_text ? r->ops->value_text(r, i) : NULL;
}

int ckpt_value(ckpt_reader *r, size_t i, const char **text, fsdp_err *err) {
    *text = NULL;
    if (i >= r->n || r->entries[i].is_tensor)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: entry #%zu is not a value", r->path, i);
    ckpt_reader *src;
    long j = ckpt_view_same(r, i, &src);
    if (j >= 0) return ckpt_value(src, (size_t)j, text, err);
    const void *pk;
    size_t pl;
    if (ckpt_view_value(r, i, &pk, &pl, text)) return 0;
    if (r->ops->same) return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: value %s is not decodable", r->path,
                                          r->entries[i].name);
    if (r->format == CKPT_DCP) {
        int rc = dcp_value(r->impl, i, text, err);
        return rc ? fsdp_err_prefix(err, "checkpoint %s", r->path) : 0;
    }
    *text = ckpt_value_text(r, i);
    return *text ? 0 : fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: value %s is not decodable", r->path,
                                    r->entries[i].name);
}

int ckpt_value_pickle(ckpt_reader *r, size_t i, void **buf, size_t *len, fsdp_err *err) {
    *buf = NULL;
    if (i >= r->n || r->entries[i].is_tensor)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: entry #%zu is not a value", r->path, i);
    ckpt_reader *src;
    long j = ckpt_view_same(r, i, &src);
    if (j >= 0) return ckpt_value_pickle(src, (size_t)j, buf, len, err);
    const void *pk;
    const char *tx;
    if (ckpt_view_value(r, i, &pk, len, &tx)) {
        if (!(*buf = malloc(*len ? *len : 1))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        memcpy(*buf, pk, *len);
        return 0;
    }
    int rc;
    switch (r->ops->same ? CKPT_AUTO : r->format) {
    case CKPT_DCP: rc = dcp_value_pickle(r->impl, i, buf, len, err); break;
    case CKPT_PT: rc = ckpt_pt_value_pickle(r, i, buf, len, err); break;
    default: rc = fsdp_err_set(err, FSDP_E_INVALID, "value %s: this format holds no values", r->entries[i].name);
    }
    return rc ? fsdp_err_prefix(err, "checkpoint %s", r->path) : 0;
}

int ckpt_value_int(ckpt_reader *r, size_t i, int64_t *out) {
    const char *t = ckpt_value_text(r, i);
    if (!t) return -1;
    char *end;
    long long v = strtoll(t, &end, 10);
    if (end == t || *end) return -1;
    *out = v;
    return 0;
}
