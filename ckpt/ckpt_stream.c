/* The ring of ckpt_stream.h: a reader thread fills slots with source pieces (checking segment
 * CRCs as it goes), the calling thread converts and writes them in the same order. */
#include "ckpt/ckpt_stream.h"
#include "ckpt/crc32.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/ckpt_pwrite.h"

void cks_opts_default(cks_opts *o) {
    o->piece = (size_t)8 << 20;
    o->slots = 4;
    const char *c = getenv("FSDP_CONVERT_CFR");
    /* copy_file_range only when asked: even reading nothing (no CRC needs the bytes), the kernel's copy of
     * 8 MiB pieces measured slower than pread + pwrite through the ring on ext4 (llama3_1b safetensors -> DCP
     * 2.9-3.8 s against 2.4-3.2 s, more system time) and equal on the MoE's small tensors */
    o->cfr = c && !strcmp(c, "1");
    const char *d = getenv("FSDP_SAVE_DIRECT");
    o->direct = !(d && !strcmp(d, "0"));
    const char *w = getenv("FSDP_CONVERT_WRITEBACK");
    o->writeback = !(w && !strcmp(w, "0"));
    const char *p = getenv("FSDP_CONVERT_PIECE");
    if (p && *p) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (!*end && v > 0) o->piece = (size_t)v;
    }
}

int cks_enabled(void) {
    const char *s = getenv("FSDP_CONVERT_STREAM");
    return !(s && !strcmp(s, "0"));
}

void cks_files_free(cks_files *fc) {
    for (size_t i = 0; i < fc->n; i++) {
        if (fc->f[i].fd >= 0) close(fc->f[i].fd);
        free(fc->f[i].path);
    }
    free(fc->f);
    for (int i = 0; i < CKS_MAX_SLOTS; i++) free(fc->buf[i]);
    free(fc->cvt);
    memset(fc, 0, sizeof *fc);
}

/* the cached entry of path (1), or a new slot for it (0, *slot set; -1 out of memory) */
static int files_slot(cks_files *fc, const char *path, int *fd, uint64_t *size, const char **what,
                      struct cks_file **slot) {
    for (size_t i = 0; i < fc->n; i++)
        if (!strcmp(fc->f[i].path, path)) {
            *fd = fc->f[i].fd, *size = fc->f[i].size, *what = fc->f[i].path;
            return 1;
        }
    if (fc->n == fc->cap) {
        size_t cap = fc->cap ? 2 * fc->cap : 8;
        struct cks_file *f = realloc(fc->f, cap * sizeof *f);
        if (!f) return -1;
        fc->f = f;
        fc->cap = cap;
    }
    *slot = &fc->f[fc->n];
    return ((*slot)->path = strdup(path)) ? 0 : -1;
}

int cks_files_open(cks_files *fc, const char *path, int *fd, uint64_t *size, const char **what, fsdp_err *err) {
    struct cks_file *f;
    int have = files_slot(fc, path, fd, size, what, &f);
    if (have) return have > 0 ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory opening %s", path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0) {
        int e = errno;
        if (f->fd >= 0) close(f->fd);
        free(f->path);
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open: %s", path, strerror(e));
    }
    f->size = (uint64_t)st.st_size;
    fc->n++;
    *fd = f->fd, *size = f->size, *what = f->path;
    return 0;
}

int cks_files_adopt(cks_files *fc, const char *path, int src_fd, uint64_t src_size, int *fd, uint64_t *size,
                    const char **what, fsdp_err *err) {
    struct cks_file *f;
    int have = files_slot(fc, path, fd, size, what, &f);
    if (have) return have > 0 ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory opening %s", path);
    f->fd = fcntl(src_fd, F_DUPFD_CLOEXEC, 0);
    if (f->fd < 0) {
        int e = errno;
        free(f->path);
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot duplicate its descriptor: %s", path, strerror(e));
    }
    f->size = src_size;
    fc->n++;
    *fd = f->fd, *size = f->size, *what = f->path;
    return 0;
}

void cks_src_free(cks_src *s) {
    for (size_t k = 0; s->seg && k < s->n; k++) free(s->seg[k].ahead);
    free(s->seg);
    memset(s, 0, sizeof *s);
}

int cks_src_append(cks_src *v, cks_src *s, int64_t r0, int64_t r1, const char *tensor) {
    size_t esz = fsdp_dtype_size(s->dtype);
    if (!esz || (v->n && v->dtype != s->dtype) || s->row_bytes % esz) return 1;
    cks_seg *seg = realloc(v->seg, (v->n + s->n + 1) * sizeof *seg);
    if (!seg) return -1;
    v->seg = seg;
    if (!v->n) v->name = tensor, v->dtype = s->dtype, v->row_bytes = esz, v->fc = s->fc, v->rows = 0;
    int64_t per = (int64_t)(s->row_bytes / esz);
    for (size_t k = 0; k < s->n; k++) {
        cks_seg *g = &s->seg[k];
        int64_t lo = r0 > g->row0 ? r0 : g->row0, hi = r1 < g->row0 + g->rows ? r1 : g->row0 + g->rows;
        if (hi <= lo) continue;
        cks_seg *d = &v->seg[v->n++];
        *d = *g;
        d->off = g->off + (uint64_t)(lo - g->row0) * s->row_bytes;
        d->len = (uint64_t)(hi - lo) * s->row_bytes;
        d->row0 = v->rows + (lo - r0) * per;
        d->rows = (hi - lo) * per;
        d->run = 0, d->done = 0;
        d->ahead = NULL, d->nahead = d->cap_ahead = 0;
        d->tensor = tensor;
        d->whole = g->whole ? g->whole : g;
        d->whole_at = (g->whole ? g->whole_at : 0) + (uint64_t)(lo - g->row0) * s->row_bytes;
    }
    v->rows += (r1 - r0) * per;
    return 0;
}

#define CKS_DIRECT_WRITERS 2
/* The first piece of a copy is the piece size over this (1 MiB of 8 MiB) and each next one twice the one before:
 * nothing overlaps the read of a copy's first piece (the writer waits for it), so a small first piece lets the
 * writes start after a fraction of a millisecond, while later pieces are read as earlier ones are written
 * (convert_moe HF -> DCP, 51 records of 64 KiB - 34 MB: 0.24-0.26 s with 8 MiB first pieces, 0.21-0.23 s with
 * 1 MiB ones, cp + sync 0.22 s) */
#define CKS_FIRST_DIV 8

/* ---- the ring ------------------------------------------------------------------------------ */

typedef struct slot {
    char *buf;
    size_t len;
    size_t seg;
    uint64_t at;  /* file offset of the piece in its segment's file */
    uint64_t seg_at; /* its offset in the segment */
    size_t split; /* the reader's CRC covers [0, split) */
    int unread;   /* the reader left the bytes in the file: the kernel copies them (copy_file_range) */
    size_t shift; /* the bytes lie at buf + shift: the output offset's place within a block (shift_read) */
    uint32_t crc; /* of the piece, when the reader computes the destination's CRC (same dtype) */
} slot;

typedef struct ring {
    cks_src *s;
    int64_t r0, r1;
    const cks_opts *o;
    size_t piece;
    slot *sl;
    int nslots;
    size_t first; /* the first piece's bytes (piece / CKS_FIRST_DIV in whole elements, at least one) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long produced, consumed;
    int reader_done, reader_failed, stop;
    int piece_crc;  /* each source piece's CRC is needed (a stored CRC to check, or the same bytes written
                       into a zip record) */
    int out_same;   /* the bytes written are the source's (no conversion) */
    int crc_split;  /* the writer computes the second half of each piece's CRC (it has time beside the
                       kernel's copy) */
    int cfr;        /* the writer copies with copy_file_range (no conversion) */
    int no_read;    /* cfr and no CRC of the bytes: the reader only hands out the pieces' places */
    int shift_read; /* direct writes of the source's bytes: each piece is read into its slot at its output
                       offset's place within a block, so that its whole blocks go direct from the slot */
    uint64_t out_off, out_pos; /* the output offset of the first piece; the bytes the reader has handed out */
    int pack;       /* a slot may hold the bytes of several segments in a row (each one's CRC checked by the reader
                       as it reads; not when the kernel copies a piece from one place of one file) */
    fsdp_err rerr;
    size_t fail_seg; /* the segment the reader failed in */
} ring;

/* Bytes [a, b) of segment k that rows [r0, r1) cover. */
static void seg_range(const cks_src *s, size_t k, int64_t r0, int64_t r1, uint64_t *a, uint64_t *b) {
    const cks_seg *g = &s->seg[k];
    int64_t lo = r0 > g->row0 ? r0 : g->row0, hi = r1 < g->row0 + g->rows ? r1 : g->row0 + g->rows;
    if (hi < lo) hi = lo;
    *a = (uint64_t)(lo - g->row0) * s->row_bytes;
    *b = (uint64_t)(hi - g->row0) * s->row_bytes;
}

/* Adds a piece's CRC (crc of n bytes at byte at of segment g) to g's running CRC; once its last byte
 * is in, checks it against the stored one. */
static int seg_crc(const cks_src *s, cks_seg *p, uint64_t at, uint32_t crc, size_t n, fsdp_err *err) {
    cks_seg *g = p->whole ? p->whole : p; /* a part of a record: the record's check */
    if (p->whole) at += p->whole_at;
    if (!g->check) return 0;
    if (at < g->done || at + n > g->len) { /* read again, or not this record's bytes: cannot be checked */
        g->check = 0;
        return 0;
    }
    if (at > g->done) { /* ahead of the bytes in so far: kept until they are */
        if (g->nahead == g->cap_ahead) {
            size_t cap = g->cap_ahead ? 2 * g->cap_ahead : 16;
            struct cks_crc_piece *a = realloc(g->ahead, cap * sizeof *a);
            if (!a) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory checking %s", g->what);
            g->ahead = a, g->cap_ahead = cap;
        }
        g->ahead[g->nahead++] = (struct cks_crc_piece){at, n, crc};
        return 0;
    }
    g->run = (uint32_t)crc32_combine(g->run, crc, (z_off_t)n);
    g->done += n;
    for (size_t i = 0; i < g->nahead;) /* the pieces that now follow on */
        if (g->ahead[i].at == g->done) {
            g->run = (uint32_t)crc32_combine(g->run, g->ahead[i].crc, (z_off_t)g->ahead[i].n);
            g->done += g->ahead[i].n;
            g->ahead[i] = g->ahead[--g->nahead];
            i = 0;
        } else {
            i++;
        }
    if (g->done == g->len && g->run != g->crc)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "tensor %s: %s%s: CRC-32 mismatch (the archive says 0x%08x, the %llu bytes read give "
                            "0x%08x): the record is corrupt",
                            p->tensor ? p->tensor : s->name, g->what, g->rec, (unsigned)g->crc,
                            (unsigned long long)g->len, (unsigned)g->run);
    return 0;
}

/* Waits for a free slot; -1 when told to stop. */
static int wait_free(ring *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->stop && q->produced - q->consumed >= q->nslots) pthread_cond_wait(&q->cv, &q->mu);
    int stop = q->stop;
    pthread_mutex_unlock(&q->mu);
    return stop ? -1 : 0;
}

static void publish(ring *q, int done, int failed) {
    pthread_mutex_lock(&q->mu);
    if (!done) q->produced++;
    else q->reader_done = 1, q->reader_failed = failed;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* The next byte to read at or after byte *at of segment *k (the rows [r0, r1) cover), moving on to the next segment
 * with bytes to give; 0 when every segment is done. *end: the end of that segment's range. */
static int next_bytes(const ring *q, size_t *k, uint64_t *at, uint64_t *end) {
    for (; *k < q->s->n; (*k)++, *at = 0) {
        uint64_t a, b;
        seg_range(q->s, *k, q->r0, q->r1, &a, &b);
        if (*at < a) *at = a;
        if (*at < b) {
            *end = b;
            return 1;
        }
    }
    return 0;
}

/* The bytes the next piece may hold: first, doubled with each piece produced, up to piece. */
static size_t piece_limit(const ring *q) {
    size_t lim = q->first;
    for (long n = q->produced; n > 0 && lim < q->piece; n--) lim *= 2;
    return lim < q->piece ? lim : q->piece;
}

/* Fills sl from segment *k at *at: one piece of it, or (q->pack) the bytes of as many segments in a row as the
 * piece holds, so that a tensor stacked from small ones (a mixture's experts) is written in whole pieces. */
static int fill_slot(ring *q, slot *sl, size_t *k, uint64_t *at, uint64_t end, const ckpt_pio_opts *po) {
    cks_seg *g = &q->s->seg[*k];
    sl->unread = q->no_read;
    sl->shift = q->shift_read ? (size_t)((q->out_off + q->out_pos) % CKPT_DIRECT_ALIGN) : 0;
    sl->seg = *k;
    sl->at = g->off + *at;
    sl->seg_at = *at;
    char *dst = sl->buf + sl->shift;
    size_t fill = 0, lim = piece_limit(q);
    int rc = 0;
    uLong crc = crc32(0L, Z_NULL, 0);
    do {
        g = &q->s->seg[*k];
        size_t n = end - *at < lim - fill ? (size_t)(end - *at) : lim - fill;
        if (!sl->unread) rc = ckpt_pread_all(g->fd, dst + fill, n, g->off + *at, g->what, po, &q->rerr);
        if (!rc && q->piece_crc && !q->crc_split) { /* each segment's bytes checked here, in read order */
            uint32_t pc = (uint32_t)ckpt_crc32(0, dst + fill, n);
            rc = seg_crc(q->s, g, *at, pc, n, &q->rerr);
            crc = crc32_combine(crc, pc, (z_off_t)n);
        }
        fill += n;
        *at += n;
    } while (!rc && q->pack && fill < lim && next_bytes(q, k, at, &end));
    if (rc) q->fail_seg = *k;
    q->out_pos += fill;
    sl->len = fill;
    /* copied by the kernel: the piece's CRC is shared, the reader's half here, the writer's beside its copy */
    sl->split = q->crc_split ? fill / 2 : fill;
    sl->crc = (uint32_t)crc;
    if (!rc && q->piece_crc && q->crc_split) sl->crc = (uint32_t)ckpt_crc32(0, dst, sl->split);
    return rc;
}

static void *reader_main(void *arg) {
    ring *q = arg;
    ckpt_pio_opts po = {0, 1, 0, 0};
    int rc = 0;
    size_t k = 0;
    uint64_t at = 0, end = 0;
    while (!rc && next_bytes(q, &k, &at, &end)) {
        if (wait_free(q)) {
            publish(q, 1, 0);
            return NULL;
        }
        rc = fill_slot(q, &q->sl[q->produced % q->nslots], &k, &at, end, &po);
        if (!rc) publish(q, 0, 0);
    }
    publish(q, 1, rc != 0);
    return NULL;
}

/* The next filled slot, NULL when the reader is done (q->reader_failed: with an error). */
static slot *wait_filled(ring *q) {
    pthread_mutex_lock(&q->mu);
    while (q->consumed == q->produced && !q->reader_done) pthread_cond_wait(&q->cv, &q->mu);
    slot *sl = q->consumed < q->produced ? &q->sl[q->consumed % q->nslots] : NULL;
    pthread_mutex_unlock(&q->mu);
    return sl;
}

static void release(ring *q) {
    pthread_mutex_lock(&q->mu);
    q->consumed++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* The piece copied by the kernel from its source file (copy_file_range: no copy through user
 * memory); *copied = 0 where the kernel cannot (another file system, a special file): the caller
 * writes the slot's bytes, and so for the rest of the tensor. */
static int copy_range(ring *q, const slot *sl, int out_fd, uint64_t pos, int *copied, const char *out_what,
                      fsdp_err *err) {
    const cks_seg *g = &q->s->seg[sl->seg];
    loff_t in = (loff_t)sl->at, out = (loff_t)pos;
    size_t left = sl->len;
    while (left) {
        ssize_t k = copy_file_range(g->fd, &in, out_fd, &out, left, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && left == sl->len &&
            (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP || errno == EBADF)) {
            q->cfr = 0;
            return 0;
        }
        if (k <= 0) /* 0: the source ended early (it shrank since the reader read it) */
            return fsdp_err_set(err, k < 0 ? FSDP_E_IO : FSDP_E_FORMAT, "%s: write failed (copying from %s): %s",
                                out_what, g->what, k < 0 ? strerror(errno) : "the source file ends early");
        left -= (size_t)k;
    }
    *copied = 1;
    /* the piece's whole pages handed to write-back at once, as ckpt_pwrite_all does with its writes */
    uint64_t a = (pos + 4095) & ~(uint64_t)4095, b = (pos + sl->len) & ~(uint64_t)4095;
    if (q->o->writeback && b > a) sync_file_range(out_fd, (off_t)a, (off_t)(b - a), SYNC_FILE_RANGE_WRITE);
    return 0;
}

/* An error about segment k of s names its tensor (once). */
static int name_tensor(const cks_src *s, size_t k, fsdp_err *err, int rc) {
    char tag[1100];
    snprintf(tag, sizeof tag, "tensor %s", k < s->n && s->seg[k].tensor ? s->seg[k].tensor : s->name);
    return strstr(err->msg, tag) ? rc : fsdp_err_prefix(err, "%s", tag);
}

/* The calling thread's side: convert, CRC, write every piece in order. */
static int writer_loop(ring *q, fsdp_dtype dst_dt, int out_fd, uint64_t out_off, uint32_t *out_crc, char *cvt,
                       const char *out_what, fsdp_err *err) {
    cks_src *s = q->s;
    size_t ssz = fsdp_dtype_size(s->dtype), dsz = fsdp_dtype_size(dst_dt);
    /* direct writes by two threads, each half of a piece (two requests in flight instead of one: this VM's
     * virtio disk took 2 GB in 1.25 s median against 1.41-1.56 s from one writer); buffered writes by one,
     * since the kernel's copies into one file's page cache run one at a time */
    ckpt_pio_opts po = {0, q->o->direct ? CKS_DIRECT_WRITERS : 1, q->o->writeback, q->o->direct};
    uint64_t pos = out_off;
    uint32_t crc = (uint32_t)crc32(0, NULL, 0);
    slot *sl;
    while ((sl = wait_filled(q))) {
        const char *p = sl->buf + sl->shift;
        size_t n = sl->len;
        int rc = 0;
        /* a converted piece bound for the middle of a block is placed in the aligned buffer at the same offset
         * within a block, so that from the next boundary on it is written directly from there (ckpt_pwrite.h);
         * the source's own bytes were read at that place (shift_read) */
        size_t shift = q->o->direct && cvt ? (size_t)(pos % CKPT_DIRECT_ALIGN) : 0;
        if (dst_dt != s->dtype) {
            rc = fsdp_convert(cvt + shift, dst_dt, p, s->dtype, n / ssz, err);
            p = cvt + shift;
            n = n / ssz * dsz;
        }
        uint32_t c = 0;
        if (q->piece_crc && q->crc_split) {
            size_t rest = sl->len - sl->split;
            uint32_t b = (uint32_t)ckpt_crc32(0, (const char *)sl->buf + sl->shift + sl->split, rest);
            uint32_t pc = (uint32_t)crc32_combine(sl->crc, b, (z_off_t)rest);
            rc = seg_crc(s, &s->seg[sl->seg], sl->seg_at, pc, sl->len, err);
            c = pc;
        } else if (q->piece_crc) {
            c = sl->crc; /* the reader's, its segments checked */
        }
        int copied = 0;
        if (!rc && q->cfr) rc = copy_range(q, sl, out_fd, pos, &copied, out_what, err);
        if (!rc && !copied && sl->unread) { /* the kernel could not copy it: the bytes through the slot */
            ckpt_pio_opts ro = {0, 1, 0, 0};
            const cks_seg *g = &s->seg[sl->seg];
            rc = ckpt_pread_all(g->fd, sl->buf, sl->len, sl->at, g->what, &ro, err);
        }
        if (!rc && !copied && shift && p == sl->buf) { /* read back after copy_file_range refused: not shifted */
            memcpy(cvt + shift, p, n);
            p = cvt + shift;
        }
        if (!rc && !copied)
            rc = ckpt_pwrite_all(out_fd, p, n, pos, out_crc && !q->out_same ? &c : NULL, out_what, &po, err);
        if (rc) return name_tensor(s, sl->seg, err, rc);
        if (out_crc) crc = (uint32_t)crc32_combine(crc, c, (z_off_t)n);
        pos += n;
        release(q);
    }
    if (q->reader_failed) {
        *err = q->rerr;
        return name_tensor(s, q->fail_seg, err, err->code);
    }
    if (out_crc) *out_crc = crc;
    return 0;
}

/* The ring's slots on fc's buffers (grown to the piece size once, then reused) and the conversion
 * buffer of cvt_bytes (none for 0); nonzero when out of memory. */
static int ring_buffers(cks_files *fc, ring *q, size_t cvt_bytes, char **cvt) {
    size_t need = q->piece + (q->shift_read ? CKPT_DIRECT_ALIGN : 0);
    if (fc->buf_cap < need) {
        for (int i = 0; i < CKS_MAX_SLOTS; i++) free(fc->buf[i]), fc->buf[i] = NULL;
        fc->buf_cap = need;
    }
    for (int i = 0; i < q->nslots; i++) {
        /* block-aligned: a piece bound for a block boundary of the output is written from its slot with
         * O_DIRECT, without a copy (ckpt_pwrite.h) */
        if (!fc->buf[i]) fc->buf[i] = ckpt_dio_alloc(fc->buf_cap);
        if (!fc->buf[i]) return -1;
        q->sl[i].buf = fc->buf[i];
    }
    if (cvt_bytes > fc->cvt_cap) {
        free(fc->cvt);
        fc->cvt = NULL;
        fc->cvt_cap = 0;
        if (!(fc->cvt = ckpt_dio_alloc(cvt_bytes))) return -1;
        fc->cvt_cap = cvt_bytes;
    }
    *cvt = cvt_bytes ? fc->cvt : NULL;
    return 0;
}

int cks_copy_rows(cks_src *s, int64_t r0, int64_t r1, fsdp_dtype dst_dt, int out_fd, uint64_t out_off,
                  uint32_t *out_crc, const cks_opts *o, const char *out_what, fsdp_err *err) {
    ring q;
    memset(&q, 0, sizeof q);
    q.s = s, q.r0 = r0, q.r1 = r1, q.o = o;
    size_t ssz = fsdp_dtype_size(s->dtype), dsz = fsdp_dtype_size(dst_dt);
    q.piece = o->piece / ssz * ssz;
    if (q.piece < ssz) q.piece = ssz;
    q.first = q.piece / CKS_FIRST_DIV / ssz * ssz;
    if (q.first < ssz) q.first = ssz;
    q.nslots = o->slots < 2 ? 2 : o->slots > CKS_MAX_SLOTS ? CKS_MAX_SLOTS : o->slots;
    if (out_crc) *out_crc = (uint32_t)crc32(0, NULL, 0);
    if (r1 <= r0) return 0;
    q.out_same = dst_dt == s->dtype;
    q.piece_crc = (out_crc && q.out_same) || s->n == 0;
    for (size_t k = 0; k < s->n; k++) q.piece_crc |= s->seg[k].check;
    /* nothing needs the bytes in memory (no conversion, no CRC): the kernel copies them from file to file,
     * as cp does, and the reader only hands out the pieces' places; a CRC reads the bytes anyway, and then
     * writing them from the ring is as fast (measured) */
    q.cfr = o->cfr && q.out_same && !q.piece_crc;
    q.crc_split = q.cfr;
    q.no_read = q.cfr;
    q.shift_read = o->direct && q.out_same && !q.cfr;
    q.pack = !q.cfr;
    q.out_off = out_off;
    q.sl = calloc((size_t)q.nslots, sizeof *q.sl);
    char *cvt = NULL;
    /* the conversion's output, or (direct writes of pieces the kernel might not copy) the aligned buffer of a
     * piece bound for the middle of a block */
    size_t out_bytes = dst_dt != s->dtype ? q.piece / ssz * dsz : o->direct && !q.shift_read ? q.piece : 0;
    int rc = !q.sl || ring_buffers(s->fc, &q, out_bytes ? out_bytes + (o->direct ? CKPT_DIRECT_ALIGN : 0) : 0, &cvt);
    if (rc) {
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "tensor %s: out of memory for the copy buffers", s->name);
    } else {
        pthread_mutex_init(&q.mu, NULL);
        pthread_cond_init(&q.cv, NULL);
        pthread_t th;
        uint64_t total = 0;
        int pieces = 0;
        for (size_t k = 0; k < s->n; k++) {
            uint64_t a, b;
            seg_range(s, k, r0, r1, &a, &b);
            total += b - a;
            pieces += b > a;
        }
        if (total <= q.first && pieces <= q.nslots) {
            /* one first piece (norms, biases, small projections; a piece per segment, as many as the ring
             * holds): nothing to overlap, so the calling thread reads it into the ring itself instead of
             * starting a reader thread for it */
            reader_main(&q);
            rc = writer_loop(&q, dst_dt, out_fd, out_off, out_crc, cvt, out_what, err);
        } else if (pthread_create(&th, NULL, reader_main, &q) != 0) {
            rc = fsdp_err_set(err, FSDP_E_RUNTIME, "tensor %s: cannot start the reader thread", s->name);
        } else {
            rc = writer_loop(&q, dst_dt, out_fd, out_off, out_crc, cvt, out_what, err);
            pthread_mutex_lock(&q.mu);
            q.stop = 1;
            pthread_cond_broadcast(&q.cv);
            pthread_mutex_unlock(&q.mu);
            pthread_join(th, NULL);
        }
        pthread_cond_destroy(&q.cv);
        pthread_mutex_destroy(&q.mu);
    }
    free(q.sl);
    return rc;
}
