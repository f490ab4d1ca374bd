/* Parallel positional file I/O (see ckpt_pio.h): the write side and copies; the reads are in
 * ckpt_pread.c. */
#include "ckpt/ckpt_pio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PIO_PIECE ((size_t)8 << 20)
#define PIO_MIN_PIECE ((size_t)1 << 20)
#define PIO_MAX_THREADS 8

int ckpt_pio_threads(const ckpt_pio_opts *o) {
    if (o && o->threads > 0) return o->threads;
#ifdef _OPENMP
    int t = omp_get_max_threads();
    return t < 1 ? 1 : t > PIO_MAX_THREADS ? PIO_MAX_THREADS : t;
#else
    return 1; /* built without OpenMP: the pieces run one after another */
#endif
}

static void plan(size_t n, const ckpt_pio_opts *o, size_t *piece, size_t *np, int *threads) {
    size_t p = o && o->piece ? o->piece : PIO_PIECE;
    int t = ckpt_pio_threads(o);
    /* default pieces: smaller (down to 1 MiB) when that gives every thread one */
    if (!(o && o->piece) && n / (size_t)t < p) {
        size_t q = (n + (size_t)t - 1) / (size_t)t;
        p = q < PIO_MIN_PIECE ? PIO_MIN_PIECE : q;
    }
    *piece = p;
    *np = n / p + (n % p != 0);
    if ((size_t)t > *np) t = (int)(*np ? *np : 1);
    *threads = t;
}

int ckpt_pwrite_sliced(int fd, const void *p, size_t n, uint64_t off, uint64_t *at) {
    const char *c = p;
    for (size_t done = 0; done < n;) {
        size_t len = n - done < CKPT_WRITE_SLICE ? n - done : CKPT_WRITE_SLICE;
        ssize_t r = pwrite(fd, c + done, len, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (at) *at = off + done;
            return r < 0 ? errno : EIO; /* a write of nothing: the device took no byte */
        }
        done += (size_t)r;
    }
    return 0;
}

void ckpt_copy_par(void *dst, const void *src, size_t n, const ckpt_pio_opts *o) {
    size_t piece, np;
    int threads;
    plan(n, o, &piece, &np, &threads);
    if (np <= 1 || threads == 1) {
        if (n) memcpy(dst, src, n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < np; i++) {
        size_t a = i * piece, len = n - a < piece ? n - a : piece;
        memcpy((char *)dst + a, (const char *)src + a, len);
    }
}

int ckpt_convert_par(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, size_t n,
                     const ckpt_pio_opts *o, fsdp_err *err) {
    size_t ds = fsdp_dtype_size(dst_dt), ss = fsdp_dtype_size(src_dt), w = ds > ss ? ds : ss;
    if (!w) return fsdp_convert(dst, dst_dt, src, src_dt, n, err); /* its error */
    size_t bytes = n > SIZE_MAX / w ? SIZE_MAX : n * w, piece, np;
    int threads;
    plan(bytes, o, &piece, &np, &threads);
    size_t pe = piece / w ? piece / w : 1; /* elements per piece */
    np = n / pe + (n % pe != 0);
    if (np <= 1 || threads == 1) return fsdp_convert(dst, dst_dt, src, src_dt, n, err);
    /* the first piece here: a dtype pair it refuses gives the caller its message */
    int rc = fsdp_convert(dst, dst_dt, src, src_dt, pe, err);
    if (rc) return rc;
    int bad = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : bad)
    for (size_t i = 1; i < np; i++) {
        size_t a = i * pe, len = n - a < pe ? n - a : pe;
        fsdp_err e;
        bad |= fsdp_convert((char *)dst + a * ds, dst_dt, (const char *)src + a * ss, src_dt, len, &e) != 0;
    }
    if (bad) return fsdp_err_set(err, FSDP_E_INVALID, "cannot convert %s to %s", fsdp_dtype_name(src_dt),
                                 fsdp_dtype_name(dst_dt));
    return 0;
}

void *ckpt_dio_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes < ((size_t)1 << 20)) return posix_memalign(&p, CKPT_DIRECT_ALIGN, bytes ? bytes : 1) ? NULL : p;
    size_t cap = (bytes + huge - 1) / huge * huge;
    if (cap < bytes || posix_memalign(&p, huge, cap)) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, cap, MADV_HUGEPAGE); /* advice: without it the buffer works the same on small pages */
#endif
    return p;
}
