/* Pieces prepared by several threads, written in file order (see ckpt_pwrite.h). */
#include "ckpt/ckpt_pwrite.h"
#include "ckpt/crc32.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PW_PIECE ((size_t)4 << 20)

void ckpt_pwrite_opts_env(ckpt_pio_opts *o) {
    memset(o, 0, sizeof *o);
    o->writeback = 1;
    const char *t = getenv("FSDP_SAVE_THREADS"), *p = getenv("FSDP_SAVE_PIECE_KB");
    long v;
    char *end;
    if (t && *t && (v = strtol(t, &end, 10)) > 0 && !*end) o->threads = v > 64 ? 64 : (int)v;
    if (p && *p && (v = strtol(p, &end, 10)) > 0 && !*end) o->piece = (size_t)v << 10;
    const char *d = getenv("FSDP_SAVE_DIRECT");
    o->direct = !(d && !strcmp(d, "0"));
}

size_t ckpt_pwrite_piece(const ckpt_pio_opts *o) { return o && o->piece ? o->piece : PW_PIECE; }

typedef struct pw_piece {
    int err;     /* errno of the failed write, or 0 */
    int bad_cvt; /* the conversion failed */
    int redo;    /* its direct write was refused (EINVAL): written through the page cache after the others */
    int written; /* all its bytes are written */
    uint64_t at; /* the first byte not written (absolute), on failure */
    uint32_t crc;
} pw_piece;

typedef struct pw_job {
    int fd, writeback;
    const char *src;
    fsdp_dtype sdt, ddt;
    size_t ssz, dsz;
    size_t n, per; /* elements in all, per piece */
    uint64_t off;
    char **buf;    /* one buffer per thread (aligned), when the dtypes differ or the writes are direct */
    pw_piece *st;
    atomic_int failed;
    int direct;    /* the fd has O_DIRECT: whole blocks only, the last piece's tail kept for later */
    char tail[CKPT_DIRECT_ALIGN];
    size_t tail_len;
    uint64_t tail_off;
    /* a producer instead of src (ckpt_pwrite_gen): each piece's float32 values are produced into the
     * thread's scratch (or its aligned buffer when stored as f32), then converted */
    ckpt_gen_fn gen;
    void *gen_user;
    uint64_t gen_e0; /* the element gen calls the job's first */
    float **scr;
    int gen_failed;
    fsdp_err gen_err; /* the first failed production's */
} pw_job;

static uint32_t pw_crc(const char *p, size_t n) { return ckpt_crc32(0, p, n); }

/* Piece i in its stored form (converted into the thread's buffer, or the source itself) with its
 * CRC taken; NULL when the conversion failed. */
static const char *pw_prep(pw_job *j, size_t i, int tid, size_t *len) {
    size_t a = i * j->per, k = j->n - a < j->per ? j->n - a : j->per;
    *len = k * j->dsz;
    const char *p = j->gen ? NULL : j->src + a * j->ssz;
    if (j->gen) {
        float *vals = j->ddt == FSDP_DT_F32 ? (float *)j->buf[tid] : j->scr[tid];
        fsdp_err e;
        fsdp_err_clear(&e);
        if (j->gen(j->gen_user, j->gen_e0 + (uint64_t)a, k, vals, &e)) {
#pragma omp critical(ckpt_pwrite_gen_err)
            if (!j->gen_failed) j->gen_err = e, j->gen_failed = 1;
            return NULL;
        }
        p = (const char *)vals;
    }
    if (j->sdt != j->ddt) {
        fsdp_err e;
        if (fsdp_convert(j->buf[tid], j->ddt, p, j->sdt, k, &e)) {
            j->st[i].bad_cvt = 1;
            return NULL;
        }
        p = j->buf[tid];
    } else if (j->direct && j->buf && p != j->buf[tid]) { /* O_DIRECT writes from an aligned buffer */
        memcpy(j->buf[tid], p, *len);
        p = j->buf[tid];
    }
    j->st[i].crc = pw_crc(p, *len);
    return p;
}

/* Writes piece i unless a piece has failed. */
static void pw_put(pw_job *j, size_t i, const char *p, size_t len) {
    pw_piece *st = &j->st[i];
    if (atomic_load(&j->failed)) return;
    if (!p) {
        atomic_store(&j->failed, 1);
        return;
    }
    uint64_t off = j->off + (uint64_t)i * j->per * j->dsz;
    uint64_t at = 0;
    if (j->direct) {
        size_t whole = len & ~(CKPT_DIRECT_ALIGN - 1);
        if (len > whole) { /* the last piece: its partial block after the direct writes */
            memcpy(j->tail, p + whole, len - whole);
            j->tail_len = len - whole;
            j->tail_off = off + whole;
        }
        int e = whole ? ckpt_pwrite_sliced(j->fd, p, whole, off, &at) : 0;
        if (e == EINVAL && at == off) st->redo = 1;
        else if (e) st->err = e, st->at = at, atomic_store(&j->failed, 1);
        else st->written = 1; /* its tail, if any, is the job's */
        return;
    }
    int e = ckpt_pwrite_sliced(j->fd, p, len, off, &at);
    if (e) {
        st->err = e;
        st->at = at;
        atomic_store(&j->failed, 1);
        return;
    }
    /* write-back of the piece's whole pages only: the pages it shares with the bytes beside it (a
     * zip header patched later, the next piece) are never under write-back when those are written */
    st->written = 1;
    uint64_t a = (off + 4095) & ~(uint64_t)4095, b = (off + len) & ~(uint64_t)4095;
    if (j->writeback && b > a) sync_file_range(j->fd, (off_t)a, (off_t)(b - a), SYNC_FILE_RANGE_WRITE);
}

static int pw_threads(const ckpt_pio_opts *o, size_t np) {
    int t = ckpt_pio_threads(o);
    if ((size_t)t > np) t = (int)np;
    return t < 1 ? 1 : t;
}

static void pw_run(pw_job *j, size_t np, int threads) {
    if (threads == 1) {
        for (size_t i = 0; i < np && !atomic_load(&j->failed); i++) {
            size_t len = 0;
            const char *p = pw_prep(j, i, 0, &len);
            pw_put(j, i, p, len);
        }
        return;
    }
#ifdef _OPENMP
    /* each thread prepares and writes its pieces: the kernel copies of one file run one at a time
     * (the inode lock), so the threads overlap one piece's copy with the next pieces' conversion
     * and CRC. (Handing the writes to the threads in file order, `ordered`, measured 2.4x slower
     * on the loaded 2-core machine: a descheduled thread holds up all the others.) */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (size_t i = 0; i < np; i++) {
        size_t len = 0;
        const char *p = atomic_load(&j->failed) ? NULL : pw_prep(j, i, omp_get_thread_num(), &len);
        pw_put(j, i, p, len);
    }
#endif
}

/* the first failed piece as an error; the CRC of all of them otherwise */
/* The first byte not written: that of the first piece not written whole (a failed piece's own, or the
 * start of one skipped once another had failed: threads meet errors in any order). */
static uint64_t pw_first_unwritten(const pw_job *j, size_t np) {
    for (size_t i = 0; i < np; i++)
        if (!j->st[i].written) return j->st[i].err ? j->st[i].at : j->off + (uint64_t)i * j->per * j->dsz;
    return j->off + (uint64_t)j->n * j->dsz;
}

static int pw_result(const pw_job *j, size_t np, uint32_t *crc, const char *what, fsdp_err *err) {
    if (j->gen_failed) {
        if (err) *err = j->gen_err;
        return j->gen_err.code ? j->gen_err.code : FSDP_E_IO;
    }
    for (size_t i = 0; i < np; i++) {
        if (j->st[i].bad_cvt)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: cannot convert %s to %s", what, fsdp_dtype_name(j->sdt),
                                fsdp_dtype_name(j->ddt));
        if (j->st[i].err)
            return fsdp_err_set(err, FSDP_E_IO, "%s: write error at byte %llu: %s", what,
                                (unsigned long long)pw_first_unwritten(j, np), strerror(j->st[i].err));
    }
    if (!crc) return 0;
    uLong c = crc32(0L, Z_NULL, 0);
    for (size_t i = 0; i < np; i++) {
        size_t a = i * j->per, k = j->n - a < j->per ? j->n - a : j->per;
        c = crc32_combine(c, j->st[i].crc, (z_off_t)(k * j->dsz));
    }
    *crc = (uint32_t)c;
    return 0;
}

static int pw_setup(pw_job *j, size_t np, int threads, const char *what, fsdp_err *err) {
    j->st = calloc(np, sizeof *j->st);
    if (!j->st) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory writing %s", what);
    /* no buffer: the pieces are written from the source itself (direct writes need it block-aligned) */
    if (j->sdt == j->ddt && !j->gen && (!j->direct || (uintptr_t)j->src % CKPT_DIRECT_ALIGN == 0)) return 0;
    j->buf = calloc((size_t)threads, sizeof *j->buf);
    if (!j->buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory writing %s", what);
    size_t k = j->n < j->per ? j->n : j->per;
    if (j->gen && j->ddt != FSDP_DT_F32) { /* produced as f32, then converted into buf */
        if (!(j->scr = calloc((size_t)threads, sizeof *j->scr)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory writing %s", what);
        for (int t = 0; t < threads; t++)
            if (!(j->scr[t] = malloc(k * sizeof(float))))
                return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory producing %s", what);
    }
    size_t bytes = (k * j->dsz + CKPT_DIRECT_ALIGN - 1) & ~(CKPT_DIRECT_ALIGN - 1);
    for (int t = 0; t < threads; t++) {
        if (!(j->buf[t] = ckpt_dio_alloc(bytes)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory converting %s", what);
    }
    return 0;
}

/* The payload's blocks allocated and the file's size set to its end before it is written, where it extends the
 * file: a direct write past the end of the file is an extending write, which ext4 runs under the inode's
 * exclusive lock and follows with an update of the size, while writes inside the size into allocated blocks
 * run under a shared lock, several at once. Exactly the payload's range: every byte of it is written next
 * (or the write fails and the temporary file is discarded), so the file never holds bytes nobody wrote.
 * Where the file system cannot (no fallocate), the writes extend the file as before. */
static void pw_reserve(int fd, uint64_t off, size_t bytes) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < off + bytes)
        (void)fallocate(fd, 0, (off_t)off, (off_t)bytes);
}

/* O_DIRECT on the fd for a payload at off (a multiple of the alignment) of at least one block;
 * 0 when the options or the file system say no (the writes then go through the page cache). */
static int pw_direct_on(int fd, uint64_t off, size_t bytes, const ckpt_pio_opts *o) {
    if (!o || !o->direct || off % CKPT_DIRECT_ALIGN || bytes < CKPT_DIRECT_ALIGN) return 0;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) return 0;
    pw_reserve(fd, off, bytes);
    return 1;
}

/* Back to buffered writes: the pieces a direct write refused, then the last partial block. */
static void pw_direct_off(pw_job *j, size_t np) {
    int fl = fcntl(j->fd, F_GETFL);
    if (fl >= 0) fcntl(j->fd, F_SETFL, fl & ~O_DIRECT);
    int direct = j->direct;
    j->direct = 0;
    for (size_t i = 0; i < np && !atomic_load(&j->failed); i++) {
        if (!j->st[i].redo) continue;
        size_t len = 0;
        const char *p = pw_prep(j, i, 0, &len);
        pw_put(j, i, p, len);
    }
    uint64_t at = 0;
    int e = direct && j->tail_len && !atomic_load(&j->failed) ? ckpt_pwrite_sliced(j->fd, j->tail, j->tail_len, j->tail_off, &at) : 0;
    if (e) {
        j->st[np - 1].err = e;
        j->st[np - 1].at = at;
        j->st[np - 1].written = 0;
        atomic_store(&j->failed, 1);
    }
}

static void pw_free(pw_job *j, int threads) {
    for (int t = 0; j->scr && t < threads; t++) free(j->scr[t]);
    free(j->scr);
    for (int t = 0; j->buf && t < threads; t++) free(j->buf[t]);
    free(j->buf);
    free(j->st);
}

static int pw_go(pw_job *j, int fd, size_t n, uint64_t off, uint32_t *crc, const char *what, const ckpt_pio_opts *o,
                 fsdp_err *err);

/* A payload that starts inside a block (a safetensors tensor, a piece of one): the elements up to the next
 * block boundary written through the page cache first, then the rest from that boundary, whose whole
 * blocks can go direct; the CRCs combined. 1 when the payload is not such a one (nothing written). */
static int pw_go_split(pw_job *j, int fd, size_t n, uint64_t off, uint32_t *crc, const char *what,
                       const ckpt_pio_opts *o, fsdp_err *err) {
    size_t head = CKPT_DIRECT_ALIGN - off % CKPT_DIRECT_ALIGN;
    if (!o || !o->direct || off % CKPT_DIRECT_ALIGN == 0 || head % j->dsz || n * j->dsz < head + 2 * CKPT_DIRECT_ALIGN)
        return 1;
    size_t hn = head / j->dsz;
    pw_job h = *j, b = *j;
    ckpt_pio_opts ho = *o;
    ho.direct = 0;
    ho.threads = 1;
    uint32_t hc = 0, bc = 0;
    int rc = pw_go(&h, fd, hn, off, crc ? &hc : NULL, what, &ho, err);
    if (rc) return rc;
    if (b.gen) b.gen_e0 += hn;
    else b.src += hn * b.ssz;
    rc = pw_go(&b, fd, n - hn, off + head, crc ? &bc : NULL, what, o, err);
    if (rc) return rc;
    if (crc) *crc = (uint32_t)crc32_combine(hc, bc, (z_off_t)((n - hn) * j->dsz));
    return 0;
}

/* The job's pieces on its threads (src or gen, the dtypes and sizes set by the caller); no bytes: the CRC
 * of none. */
static int pw_go(pw_job *j, int fd, size_t n, uint64_t off, uint32_t *crc, const char *what, const ckpt_pio_opts *o,
                 fsdp_err *err) {
    if (!n) {
        if (crc) *crc = (uint32_t)crc32(0L, Z_NULL, 0);
        return 0;
    }
    int split = pw_go_split(j, fd, n, off, crc, what, o, err);
    if (split != 1) return split;
    size_t piece = ckpt_pwrite_piece(o);
    j->fd = fd;
    j->writeback = o ? o->writeback : 1;
    j->n = n;
    j->per = piece / j->dsz ? piece / j->dsz : 1;
    j->off = off;
    atomic_init(&j->failed, 0);
    size_t np = n / j->per + (n % j->per != 0);
    int threads = pw_threads(o, np);
    /* direct pieces must be whole blocks: the piece size a multiple of the alignment */
    j->direct = j->per * j->dsz % CKPT_DIRECT_ALIGN == 0 && pw_direct_on(fd, off, n * j->dsz, o);
    int direct = j->direct;
    int rc = pw_setup(j, np, threads, what, err);
    if (!rc) pw_run(j, np, threads);
    if (direct) pw_direct_off(j, np);
    if (!rc) rc = pw_result(j, np, crc, what, err);
    pw_free(j, threads);
    return rc;
}

int ckpt_pwrite_conv(int fd, const void *src, fsdp_dtype src_dt, fsdp_dtype dst_dt, size_t n, uint64_t off,
                     uint32_t *crc, const char *what, const ckpt_pio_opts *o, fsdp_err *err) {
    pw_job j;
    memset(&j, 0, sizeof j);
    j.ssz = fsdp_dtype_size(src_dt);
    j.dsz = fsdp_dtype_size(dst_dt);
    if (!j.ssz || !j.dsz)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: cannot write %s values as %s", what, fsdp_dtype_name(src_dt),
                            fsdp_dtype_name(dst_dt));
    if (n && src_dt != dst_dt) {
        /* a pair fsdp_convert refuses gives its message before anything is written */
        unsigned char one[16];
        int rc = fsdp_convert(one, dst_dt, src, src_dt, 1, err);
        if (rc) return fsdp_err_prefix(err, "%s", what);
    }
    j.src = src;
    j.sdt = src_dt;
    j.ddt = dst_dt;
    return pw_go(&j, fd, n, off, crc, what, o, err);
}

int ckpt_pwrite_gen(int fd, ckpt_gen_fn gen, void *user, fsdp_dtype dst_dt, size_t n, uint64_t off, uint32_t *crc,
                    const char *what, const ckpt_pio_opts *o, fsdp_err *err) {
    pw_job j;
    memset(&j, 0, sizeof j);
    j.ssz = sizeof(float);
    j.dsz = fsdp_dtype_size(dst_dt);
    unsigned char one[16];
    float zero = 0;
    if (!j.dsz || (dst_dt != FSDP_DT_F32 && fsdp_convert(one, dst_dt, &zero, FSDP_DT_F32, 1, err)))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: cannot write float32 values as %s", what, fsdp_dtype_name(dst_dt));
    j.gen = gen;
    j.gen_user = user;
    j.sdt = FSDP_DT_F32;
    j.ddt = dst_dt;
    return pw_go(&j, fd, n, off, crc, what, o, err);
}

int ckpt_pwrite_all(int fd, const void *src, size_t n, uint64_t off, uint32_t *crc, const char *what,
                    const ckpt_pio_opts *o, fsdp_err *err) {
    return ckpt_pwrite_conv(fd, src, FSDP_DT_U8, FSDP_DT_U8, n, off, crc, what, o, err);
}
