/* Parallel positional file I/O (see ckpt_pio.h). */
#include "ckpt/ckpt_pio.h"
#include "ckpt/ckpt_pwrite.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PIO_PIECE ((size_t)8 << 20)
#define PIO_MIN_PIECE ((size_t)1 << 20)
#define PIO_MAX_THREADS 8

typedef struct piece_st {
    int err;        /* errno, 0 */
    int eof;        /* the file ended */
    uint64_t at;    /* first byte not transferred (absolute) */
    uint32_t crc;
} piece_st;

static void plan(size_t n, const ckpt_pio_opts *o, size_t *piece, size_t *np, int *threads) {
    size_t p = o && o->piece ? o->piece : PIO_PIECE;
#ifdef _OPENMP
    int t = o && o->threads > 0 ? o->threads : omp_get_max_threads();
#else
    int t = 1; /* built without OpenMP: the pieces run one after another */
#endif
    if (!(o && o->threads > 0) && t > PIO_MAX_THREADS) t = PIO_MAX_THREADS;
    if (t < 1) t = 1;
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

#define PIO_CRC_STEP ((size_t)1 << 20)

static uint32_t crc_of(uint32_t c, const char *p, size_t n) {
    uLong x = c;
    while (n) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        x = crc32(x, (const unsigned char *)p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)x;
}

/* Reads n bytes; with want_crc, in steps of PIO_CRC_STEP whose CRC is taken right after the read. */
static void read_piece(int fd, char *dst, size_t n, uint64_t off, int want_crc, piece_st *st) {
    size_t done = 0, step = want_crc ? PIO_CRC_STEP : n;
    uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
    while (done < n) {
        size_t want = n - done < step ? n - done : step, got = 0;
        while (got < want) {
            ssize_t r = pread(fd, dst + done + got, want - got, (off_t)(off + done + got));
            if (r < 0) {
                if (errno == EINTR) continue;
                st->err = errno;
                st->at = off + done + got;
                return;
            }
            if (r == 0) {
                st->eof = 1;
                st->at = off + done + got;
                return;
            }
            got += (size_t)r;
        }
        if (want_crc) c = crc_of(c, dst + done, want);
        done += want;
    }
    st->crc = c;
}

/* the first failed piece as an error */
static int report(const piece_st *st, size_t np, const char *what, int reading, fsdp_err *err) {
    for (size_t i = 0; i < np; i++) {
        if (st[i].eof)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: the file ends before byte %llu (truncated?)", what,
                                (unsigned long long)st[i].at);
        if (st[i].err)
            return fsdp_err_set(err, FSDP_E_IO, "%s: %s error at byte %llu: %s", what, reading ? "read" : "write",
                                (unsigned long long)st[i].at, strerror(st[i].err));
    }
    return 0;
}

static int pread_impl(int fd, void *dst, size_t n, uint64_t off, uint32_t *crc, const char *what,
                      const ckpt_pio_opts *o, fsdp_err *err) {
    size_t piece, np;
    int threads;
    plan(n, o, &piece, &np, &threads);
    if (np <= 1 || threads == 1) {
        piece_st st = {0};
        read_piece(fd, dst, n, off, crc != NULL, &st);
        if (crc) *crc = st.crc;
        return report(&st, 1, what, 1, err);
    }
    piece_st *st = calloc(np, sizeof *st);
    if (!st) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", what);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (size_t i = 0; i < np; i++) {
        size_t a = i * piece, len = n - a < piece ? n - a : piece;
        read_piece(fd, (char *)dst + a, len, off + a, crc != NULL, &st[i]);
    }
    int rc = report(st, np, what, 1, err);
    if (!rc && crc) {
        uLong c = st[0].crc;
        for (size_t i = 1; i < np; i++) {
            size_t a = i * piece, len = n - a < piece ? n - a : piece;
            c = crc32_combine(c, st[i].crc, (z_off_t)len);
        }
        *crc = (uint32_t)c;
    }
    free(st);
    return rc;
}

int ckpt_pread_all(int fd, void *dst, size_t n, uint64_t off, const char *what, const ckpt_pio_opts *o,
                   fsdp_err *err) {
    return pread_impl(fd, dst, n, off, NULL, what, o, err);
}

int ckpt_pread_crc(int fd, void *dst, size_t n, uint64_t off, uint32_t *crc, const char *what,
                   const ckpt_pio_opts *o, fsdp_err *err) {
    return pread_impl(fd, dst, n, off, crc, what, o, err);
}

/* the write side: ckpt_pwrite.c (pieces prepared by several threads, written in file order) */
int ckpt_pwrite_all(int fd, const void *src, size_t n, uint64_t off, uint32_t *crc, const char *what,
                    const ckpt_pio_opts *o, fsdp_err *err) {
    return ckpt_pwrite_conv(fd, src, FSDP_DT_U8, FSDP_DT_U8, n, off, crc, what, o, err);
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
