/* Parallel positional file I/O (see ckpt_pio.h): the write side and copies; the reads are in
 * ckpt_pread.c. */
#include "ckpt/ckpt_pio.h"

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

static void write_piece(int fd, const char *src, size_t n, uint64_t off, int want_crc, int writeback, piece_st *st) {
    if (want_crc) st->crc = crc_of((uint32_t)crc32(0L, Z_NULL, 0), src, n);
    size_t done = 0;
    while (done < n) {
        ssize_t r = pwrite(fd, src + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            st->err = errno;
            st->at = off + done;
            return;
        }
        if (r == 0) {
            st->err = EIO;
            st->at = off + done;
            return;
        }
        done += (size_t)r;
    }
    /* start the write-back of the whole pages of the range only: bytes beside it (a zip header
     * patched later, the next record) then never wait for a page under write-back */
    uint64_t a = (off + 4095) & ~(uint64_t)4095, b = (off + n) & ~(uint64_t)4095;
    if (writeback && b > a) sync_file_range(fd, (off_t)a, (off_t)(b - a), SYNC_FILE_RANGE_WRITE);
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

int ckpt_pwrite_all(int fd, const void *src, size_t n, uint64_t off, uint32_t *crc, const char *what,
                    const ckpt_pio_opts *o, fsdp_err *err) {
    size_t piece, np;
    int threads;
    plan(n, o, &piece, &np, &threads);
    int wb = o && o->writeback;
    if (np <= 1 || threads == 1) {
        piece_st st = {0};
        write_piece(fd, src, n, off, crc != NULL, wb, &st);
        if (crc) *crc = n ? st.crc : (uint32_t)crc32(0L, Z_NULL, 0);
        return report(&st, 1, what, 0, err);
    }
    piece_st *st = calloc(np, sizeof *st);
    if (!st) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory writing %s", what);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (size_t i = 0; i < np; i++) {
        size_t a = i * piece, len = n - a < piece ? n - a : piece;
        write_piece(fd, (const char *)src + a, len, off + a, crc != NULL, wb, &st[i]);
    }
    int rc = report(st, np, what, 0, err);
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
