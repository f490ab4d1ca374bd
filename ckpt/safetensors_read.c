/* safetensors reader: listing, zero-copy views and row reads with dtype conversion. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"

size_t st_count(const st_reader *r) { return r ? r->nt : 0; }

const st_tensor_info *st_tensor(const st_reader *r, size_t i) {
    return r && i < r->nt ? &r->t[i] : NULL;
}

const st_tensor_info *st_find(const st_reader *r, const char *name) {
    if (!r || !name || !r->by_name) return NULL;
    size_t lo = 0, hi = r->nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->t[r->by_name[mid]].name, name);
        if (c == 0) return &r->t[r->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t st_file_count(const st_reader *r) { return r ? r->nfiles : 0; }

const char *st_file_path(const st_reader *r, size_t file) {
    return r && file < r->nfiles ? r->files[file].path : NULL;
}

int st_file_fd(const st_reader *r, size_t file) { return r && file < r->nfiles ? r->files[file].fd : -1; }

uint64_t st_file_size(const st_reader *r, size_t file) { return r && file < r->nfiles ? r->files[file].size : 0; }

const char *st_index_path(const st_reader *r) { return r ? r->index_path : NULL; }

int64_t st_index_total_size(const st_reader *r) { return r ? r->total_size : -1; }

size_t st_metadata_count(const st_reader *r, size_t file) {
    return r && file < r->nfiles ? r->files[file].nmeta : 0;
}

int st_metadata_at(const st_reader *r, size_t file, size_t i, const char **key, const char **value) {
    if (!r || file >= r->nfiles || i >= r->files[file].nmeta) return -1;
    *key = r->files[file].meta[2 * i];
    *value = r->files[file].meta[2 * i + 1];
    return 0;
}

const char *st_metadata_get(const st_reader *r, size_t file, const char *key) {
    if (!r || file >= r->nfiles) return NULL;
    const st_file *f = &r->files[file];
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

const void *st_data(const st_reader *r, const st_tensor_info *t) {
    return r->files[t->file].map + t->offset;
}

int st_is_aligned(const st_reader *r, const st_tensor_info *t) {
    return (uintptr_t)st_data(r, t) % fsdp_dtype_size(t->dtype) == 0;
}

int64_t st_rows(const st_tensor_info *t) { return t->ndim ? t->shape[0] : 1; }

int64_t st_row_numel(const st_tensor_info *t) {
    return t->ndim ? fsdp_numel(t->ndim - 1, t->shape + 1) : 1;
}

#define CHUNK ((size_t)1 << 16)   /* elements per parallel chunk */
#define BOUNCE_BYTES 32768        /* aligned staging for misaligned sources */

/* Converts n elements of (possibly misaligned) src into dst; OpenMP over chunks when large. */
static int convert(void *dst, fsdp_dtype ddt, const unsigned char *src, fsdp_dtype sdt, size_t n,
                   int aligned, fsdp_err *err) {
    size_t ssz = fsdp_dtype_size(sdt), dsz = fsdp_dtype_size(ddt);
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    int failed = 0;
    fsdp_err first;
    fsdp_err_clear(&first);
#pragma omp parallel for schedule(static) if (n > 16 * CHUNK)
    for (size_t c = 0; c < nchunks; c++) {
        size_t i0 = c * CHUNK, m = n - i0 < CHUNK ? n - i0 : CHUNK;
        fsdp_err e;
        int rc = FSDP_OK;
        if (aligned) {
            rc = fsdp_convert((unsigned char *)dst + i0 * dsz, ddt, src + i0 * ssz, sdt, m, &e);
        } else {
            double bounce[BOUNCE_BYTES / sizeof(double)]; /* 8-aligned, enough for any element */
            size_t per = BOUNCE_BYTES / ssz;
            for (size_t j = 0; j < m && !rc; j += per) {
                size_t k = m - j < per ? m - j : per;
                memcpy(bounce, src + (i0 + j) * ssz, k * ssz);
                rc = fsdp_convert((unsigned char *)dst + (i0 + j) * dsz, ddt, bounce, sdt, k, &e);
            }
        }
        if (rc) {
#pragma omp critical(st_convert_err)
            if (!failed) {
                failed = 1;
                first = e;
            }
        }
    }
    if (failed) {
        *err = first;
        return first.code;
    }
    return FSDP_OK;
}

/* The mapped pages wholly inside a large range just read are unmapped from the process (the page cache
 * keeps them: a later read refaults them from memory): a streamed save reading gigabytes through the
 * mapping holds its write buffers, not the source's pages, in its resident set. Failure only costs memory. */
static void let_go(const unsigned char *src, size_t bytes, long ps) {
    if (bytes < ((size_t)1 << 20) || ps <= 0) return;
    uintptr_t a = ((uintptr_t)src + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t b = ((uintptr_t)src + bytes) & ~((uintptr_t)ps - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* The mapped bytes [src, src + bytes) are still in the file: one truncated in place since it was mapped
 * (a source rewritten while a run keeps it open, e.g. for a streamed save's deferred reads) would fault
 * the read (SIGBUS); it is an error naming the file instead. A replaced or removed file keeps the inode
 * the mapping reads. (A truncation between this check and the copy is not caught.) */
static int still_there(const st_file *f, const unsigned char *src, size_t bytes, const char *name, fsdp_err *err) {
    struct stat sb;
    uint64_t end = (uint64_t)(src - f->map) + bytes;
    if (!bytes || f->fd < 0 || fstat(f->fd, &sb) != 0 || (uint64_t)sb.st_size >= end) return 0;
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s' needs bytes up to %llu, the file holds %lld now: it was "
                        "truncated after it was opened", f->path, name, (unsigned long long)end, (long long)sb.st_size);
}

int st_read_rows(const st_reader *r, const st_tensor_info *t, int64_t r0, int64_t r1, void *dst,
                 fsdp_dtype dst_dt, fsdp_err *err) {
    if (!r || !t || (r1 > r0 && !dst)) return fsdp_err_set(err, FSDP_E_INVALID, "st_read_rows: bad arguments");
    const char *path = r->files[t->file].path;
    int64_t rows = st_rows(t);
    if (r0 < 0 || r1 < r0 || r1 > rows)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: tensor '%s': rows [%lld, %lld) outside [0, %lld)", path,
                            t->name, (long long)r0, (long long)r1, (long long)rows);
    size_t ssz = fsdp_dtype_size(t->dtype);
    size_t per_row = (size_t)st_row_numel(t);
    size_t n = (size_t)(r1 - r0) * per_row; /* <= numel, validated at open */
    const unsigned char *src = (const unsigned char *)st_data(r, t) + (size_t)r0 * per_row * ssz;
    int rc0 = still_there(&r->files[t->file], src, n * ssz, t->name, err);
    if (rc0) return rc0;
    long ps = sysconf(_SC_PAGESIZE);
    if (n * ssz >= ((size_t)1 << 20) && ps > 0) { /* ask the kernel to read ahead; failure only costs speed */
        uintptr_t a = (uintptr_t)src & ~((uintptr_t)ps - 1);
        (void)madvise((void *)a, (uintptr_t)src + n * ssz - a, MADV_WILLNEED);
    }
    if (dst_dt == FSDP_DT_INVALID || dst_dt == t->dtype) {
        if (n) memcpy(dst, src, n * ssz);
        let_go(src, n * ssz, ps);
        return FSDP_OK;
    }
    fsdp_err e;
    if (fsdp_convert(dst, dst_dt, src, t->dtype, 0, &e)) /* checks that the pair converts */
        return fsdp_err_set(err, e.code, "%s: tensor '%s': %s", path, t->name, e.msg);
    int rc = convert(dst, dst_dt, src, t->dtype, n, (uintptr_t)src % ssz == 0, &e);
    if (rc) return fsdp_err_set(err, rc, "%s: tensor '%s': %s", path, t->name, e.msg);
    let_go(src, n * ssz, ps);
    return FSDP_OK;
}

int st_read(const st_reader *r, const st_tensor_info *t, void *dst, fsdp_dtype dst_dt, fsdp_err *err) {
    if (!t) return fsdp_err_set(err, FSDP_E_INVALID, "st_read: no tensor");
    return st_read_rows(r, t, 0, st_rows(t), dst, dst_dt, err);
}

int st_read_named(const st_reader *r, const char *name, void *dst, fsdp_dtype dst_dt, fsdp_err *err) {
    const st_tensor_info *t = st_find(r, name);
    if (!t)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: no tensor '%s'",
                            r && r->index_path ? r->index_path
                            : r && r->nfiles   ? r->files[0].path
                                               : "safetensors",
                            name ? name : "(null)");
    return st_read(r, t, dst, dst_dt, err);
}
