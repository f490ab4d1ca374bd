/* The checkpoint read engine (see ckpt_pread.h) and the plain positional reads of ckpt_pio.h. */
#include "ckpt/ckpt_pread.h"
#include "ckpt/crc32.h"
#include "runtime/mempages.h"

#include <errno.h>
#include <libdeflate.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define RD_PIECE ((size_t)8 << 20)     /* stored bytes per piece (one thread's unit of work) */
#define RD_MIN_PIECE ((size_t)1 << 20) /* pieces shrink down to this so that every thread has one */
#define RD_STEP ((size_t)1 << 20)      /* a plain copy: bytes read, then checked while in cache */
#define RD_CVT_STEP ((size_t)128 << 10) /* converting: stored bytes per step of the per-thread buffer */

int ckpt_load_fast(void) {
    const char *v = getenv("FSDP_LOAD_FAST");
    return !(v && !strcmp(v, "0"));
}

/* a positive integer environment variable in [lo, hi], else 0 */
static long env_num(const char *name, long lo, long hi) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long t = strtol(v, &end, 10);
    return *end || t < lo || t > hi ? 0 : t;
}

int ckpt_load_threads(void) { return (int)env_num("FSDP_LOAD_THREADS", 1, 256); }

/* Compiled for AVX-512, AVX2 and the baseline, picked at load time: the scan of every loaded float32 runs while its
 * bytes are in cache, at 35 GB/s as SSE2 and 55-66 GB/s as AVX2 / AVX-512 (1 MiB in cache, this machine's Xeon),
 * i.e. 0.012 s less per GB loaded (the 2-rank load of llama3_1b checks 1 GB per rank). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define RD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RD_CLONES
#endif

RD_CLONES int ckpt_f32_has_nan(const float *p, size_t n) {
    unsigned bad = 0;
#pragma omp simd reduction(| : bad)
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, p + i, sizeof b);
        bad |= (b & 0x7fffffffu) > 0x7f800000u;
    }
    return bad != 0;
}

/* the outcome of one piece: the first failure (absolute byte), its CRC and NaN */
typedef struct rd_piece {
    int err;     /* errno, 0 */
    int eof;     /* the file ended */
    uint64_t at; /* first byte not read (absolute) */
    uint32_t crc;
    int nan;
} rd_piece;

/* threads and pieces of a read of `bytes` stored bytes */
static void rd_plan(size_t bytes, const ckpt_pio_opts *o, size_t *piece, size_t *np, int *threads) {
    int t = ckpt_load_threads();
    if (!t) t = ckpt_pio_threads(o);
    size_t p = (size_t)env_num("FSDP_LOAD_PIECE", 16, 1L << 30);
    if (!p) p = o && o->piece ? o->piece : 0;
    int fixed = p != 0;
    if (!fixed) p = RD_PIECE;
    if (!fixed && bytes / (size_t)t < p) {
        size_t q = (bytes + (size_t)t - 1) / (size_t)t;
        q = (q + 4095) & ~(size_t)4095; /* a multiple of every element size */
        p = q < RD_MIN_PIECE ? RD_MIN_PIECE : q;
    }
    p &= ~(size_t)15;
    if (!p) p = 16;
    *piece = p;
    *np = bytes / p + (bytes % p != 0);
    if ((size_t)t > *np) t = (int)(*np ? *np : 1);
    *threads = t;
}

/* exactly n bytes at off into dst; a failure is recorded in st */
static int rd_full(int fd, char *dst, size_t n, uint64_t off, rd_piece *st) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0) st->err = errno;
            else st->eof = 1;
            st->at = off + got;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

static uint32_t crc_zlib(uint32_t c, const void *p, size_t n) {
    return ckpt_crc32(c, p, n);
}

/* one piece of the fused path: stored bytes [a, a+len) of the range (a multiple of the element
 * size), read step by step; each step checked (CRC, NaN) and converted while in cache */
static void rd_piece_fused(int fd, char *dst, uint64_t off, size_t a, size_t len, const ckpt_rd_xf *xf, char *buf,
                           rd_piece *st) {
    size_t ss = fsdp_dtype_size(xf->src_dt), ds = fsdp_dtype_size(xf->dst_dt);
    int same = xf->src_dt == xf->dst_dt, nan = xf->want_nan && xf->dst_dt == FSDP_DT_F32;
    size_t step = same ? RD_STEP : RD_CVT_STEP;
    uint32_t c = 0;
    for (size_t done = 0; done < len; done += step) {
        size_t k = len - done < step ? len - done : step;
        char *out = dst + (a + done) / ss * ds, *in = same ? out : buf;
        mempages_prefault(out, k / ss * ds); /* fresh memory: its pages in one call, not a trap each */
        if (rd_full(fd, in, k, off + a + done, st)) return;
        if (xf->want_crc) c = libdeflate_crc32(c, in, k);
        if (!same) {
            fsdp_err e; /* the pair was accepted before the threads started */
            fsdp_convert(out, xf->dst_dt, in, xf->src_dt, k / ss, &e);
        }
        if (nan && !st->nan) st->nan = ckpt_f32_has_nan((const float *)out, k / ss * ds / sizeof(float));
    }
    st->crc = c;
}

/* one piece of the fallback path: the stored bytes only (zlib's CRC per 1 MiB read) */
static void rd_piece_plain(int fd, char *dst, uint64_t off, size_t len, int want_crc, rd_piece *st) {
    uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < len; done += RD_STEP) {
        size_t k = len - done < RD_STEP ? len - done : RD_STEP;
        mempages_prefault(dst + done, k);
        if (rd_full(fd, dst + done, k, off + done, st)) return;
        if (want_crc) c = crc_zlib(c, dst + done, k);
    }
    st->crc = c;
}

/* the first failed piece as an error; else the pieces' CRCs combined and their NaN */
static int rd_finish(const rd_piece *st, size_t np, size_t piece, size_t bytes, ckpt_rd_xf *xf, const char *what,
                     fsdp_err *err) {
    for (size_t i = 0; i < np; i++) {
        if (st[i].eof)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: the file ends before byte %llu (truncated?)", what,
                                (unsigned long long)st[i].at);
        if (st[i].err)
            return fsdp_err_set(err, FSDP_E_IO, "%s: read error at byte %llu: %s", what, (unsigned long long)st[i].at,
                                strerror(st[i].err));
    }
    uLong c = np ? st[0].crc : crc32(0L, Z_NULL, 0);
    int nan = np ? st[0].nan : 0;
    for (size_t i = 1; i < np; i++) {
        size_t len = bytes - i * piece < piece ? bytes - i * piece : piece;
        c = crc32_combine(c, st[i].crc, (z_off_t)len);
        nan |= st[i].nan;
    }
    xf->crc = (uint32_t)c;
    xf->nan = nan;
    return 0;
}

/* the pieces on `threads` threads; fused: each thread with its own conversion buffer */
static void rd_run(int fd, char *dst, uint64_t off, size_t bytes, const ckpt_rd_xf *xf, int fused, size_t piece,
                   size_t np, int threads, rd_piece *st) {
    int cvt = fused && xf->src_dt != xf->dst_dt;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        char *buf = cvt ? malloc(RD_CVT_STEP) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < np; i++) {
            size_t a = i * piece, len = bytes - a < piece ? bytes - a : piece;
            if (cvt && !buf) st[i].err = ENOMEM, st[i].at = off + a;
            else if (fused) rd_piece_fused(fd, dst, off, a, len, xf, buf, &st[i]);
            else rd_piece_plain(fd, dst + a, off + a, len, xf->want_crc, &st[i]);
        }
        free(buf);
    }
}

/* the fallback: the whole range first (a bounce buffer of its size when converting), then the
 * conversion and NaN passes */
static int rd_fallback(int fd, void *dst, uint64_t off, ckpt_rd_xf *xf, const char *what, const ckpt_pio_opts *o,
                       size_t bytes, fsdp_err *err) {
    size_t piece, np;
    int threads;
    rd_plan(bytes, o, &piece, &np, &threads);
    int same = xf->src_dt == xf->dst_dt;
    char *in = same ? dst : malloc(bytes ? bytes : 1);
    rd_piece one = {0}, *st = np > 1 ? calloc(np, sizeof *st) : &one;
    if (!in || !st) {
        if (!same) free(in);
        if (st != &one) free(st);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", what);
    }
    rd_run(fd, in, off, bytes, xf, 0, piece, np, threads, st);
    int rc = rd_finish(st, np, piece, bytes, xf, what, err);
    if (!rc && !same) rc = ckpt_convert_par(dst, xf->dst_dt, in, xf->src_dt, xf->n, o, err);
    if (!same) free(in);
    if (st != &one) free(st);
    xf->nan = !rc && xf->want_nan && xf->dst_dt == FSDP_DT_F32 && ckpt_f32_has_nan(dst, xf->n);
    return rc;
}

int ckpt_pread_xf(int fd, void *dst, uint64_t off, ckpt_rd_xf *xf, const char *what, const ckpt_pio_opts *o,
                  fsdp_err *err) {
    size_t ss = fsdp_dtype_size(xf->src_dt);
    xf->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    xf->nan = 0;
    if (!ss || !fsdp_dtype_size(xf->dst_dt) || xf->n > SIZE_MAX / 16)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: cannot read %zu elements as %s", what, xf->n,
                            fsdp_dtype_name(xf->dst_dt));
    /* a pair fsdp_convert refuses gives its message before any thread starts */
    char probe[16];
    int rc = xf->src_dt == xf->dst_dt ? 0 : fsdp_convert(probe, xf->dst_dt, probe, xf->src_dt, 0, err);
    if (rc) return rc;
    size_t bytes = xf->n * ss;
    if (!bytes) return 0;
    if (!ckpt_load_fast()) return rd_fallback(fd, dst, off, xf, what, o, bytes, err);
    size_t piece, np;
    int threads;
    rd_plan(bytes, o, &piece, &np, &threads);
    rd_piece one = {0}, *st = np > 1 ? calloc(np, sizeof *st) : &one;
    if (!st) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", what);
    rd_run(fd, dst, off, bytes, xf, 1, piece, np, threads, st);
    rc = rd_finish(st, np, piece, bytes, xf, what, err);
    if (st != &one) free(st);
    return rc;
}

int ckpt_pread_all(int fd, void *dst, size_t n, uint64_t off, const char *what, const ckpt_pio_opts *o,
                   fsdp_err *err) {
    ckpt_rd_xf xf = {n, FSDP_DT_U8, FSDP_DT_U8, 0, 0, 0, 0};
    return ckpt_pread_xf(fd, dst, off, &xf, what, o, err);
}

int ckpt_pread_crc(int fd, void *dst, size_t n, uint64_t off, uint32_t *crc, const char *what,
                   const ckpt_pio_opts *o, fsdp_err *err) {
    ckpt_rd_xf xf = {n, FSDP_DT_U8, FSDP_DT_U8, 1, 0, 0, 0};
    int rc = ckpt_pread_xf(fd, dst, off, &xf, what, o, err);
    *crc = xf.crc;
    return rc;
}
