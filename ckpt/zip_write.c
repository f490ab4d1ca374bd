/* Zip writer in torch.save's layout: STORED records whose payloads start at multiples of
 * 64 bytes from the archive start, CRC32 from zlib, zip64 fields where sizes or offsets
 * need them. Records are streamed: the local header carries the size given up front and
 * its CRC is filled in after the payload. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/crc32.h"
#include "ckpt/ckpt_pwrite.h"
#include "ckpt/zip.h"

#define ZIP_ALIGN 64
/* payloads of at least this many bytes start at a multiple of CKPT_DIRECT_ALIGN in the file */
#define ZIP_DIRECT_MIN ((uint64_t)1 << 20)
#define U32MAX 0xffffffffull

static void le(unsigned char *p, uint64_t x, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(x >> (8 * i));
}

/* through the stream in pieces of at most CKPT_WRITE_SLICE: stdio hands a larger fwrite to write(2) whole,
 * and the page cache sizes its folios by the call (see ckpt_pio.h) */
static int out(zip_writer *w, const void *p, size_t n, fsdp_err *err) {
    if (w->failed) return FSDP_E_IO;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CKPT_WRITE_SLICE ? n - done : CKPT_WRITE_SLICE;
        if (fwrite((const char *)p + done, 1, k, w->f) != k) {
            w->failed = 1;
            return fsdp_err_set(err, FSDP_E_IO, "zip: write failed: %s", strerror(errno));
        }
        done += k;
    }
    w->pos += n;
    return 0;
}

int zip_writer_begin(zip_writer *w, FILE *f, fsdp_err *err) {
    memset(w, 0, sizeof *w);
    w->f = f;
    off_t o = ftello(f);
    if (o < 0) return fsdp_err_set(err, FSDP_E_IO, "zip: cannot tell the stream position: %s", strerror(errno));
    w->start = (uint64_t)o;
    return 0;
}

int zip_writer_start(zip_writer *w, const char *name, uint64_t size, fsdp_err *err) {
    if (w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: a record is already open");
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 8;
        struct zip_wrec *nr = realloc(w->recs, cap * sizeof *nr);
        if (!nr) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        w->recs = nr;
        w->cap = cap;
    }
    size_t nl = strlen(name);
    if (nl > 65535) return fsdp_err_set(err, FSDP_E_INVALID, "zip: record name too long");
    int z64 = size >= U32MAX || w->pos >= U32MAX;
    size_t base = 30 + nl + (z64 ? 20 : 0);
    /* padding extra field ("FB" + len + 'Z'...) so that the payload is 64-byte aligned from the archive's
     * start, as torch.save aligns it; a large payload at a multiple of CKPT_DIRECT_ALIGN in the file
     * instead, where its whole blocks can be written with O_DIRECT (ckpt/ckpt_pwrite.h; torch's readers
     * find a payload by its header, whatever the padding) */
    size_t pad = size >= ZIP_DIRECT_MIN
                     ? (CKPT_DIRECT_ALIGN - (w->start + w->pos + base + 4) % CKPT_DIRECT_ALIGN) % CKPT_DIRECT_ALIGN
                     : (ZIP_ALIGN - (w->pos + base + 4) % ZIP_ALIGN) % ZIP_ALIGN;
    size_t xl = (z64 ? 20 : 0) + 4 + pad;
    unsigned char h[30];
    le(h, 0x04034b50u, 4);
    le(h + 4, z64 ? 45 : 20, 2);
    le(h + 6, 0, 2);  /* flags */
    le(h + 8, 0, 2);  /* STORED */
    le(h + 10, 0, 4); /* time, date */
    le(h + 14, 0, 4); /* CRC: patched after the payload */
    le(h + 18, z64 ? U32MAX : size, 4);
    le(h + 22, z64 ? U32MAX : size, 4);
    le(h + 26, nl, 2);
    le(h + 28, xl, 2);
    struct zip_wrec *r = &w->recs[w->n];
    memset(r, 0, sizeof *r);
    r->name = strdup(name);
    if (!r->name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    r->header_off = w->pos;
    w->n++;
    int rc = out(w, h, 30, err);
    if (!rc) rc = out(w, name, nl, err);
    if (!rc && z64) {
        unsigned char x[20];
        le(x, 1, 2);
        le(x + 2, 16, 2);
        le(x + 4, size, 8);
        le(x + 12, size, 8);
        rc = out(w, x, 20, err);
    }
    if (!rc) {
        unsigned char x[4 + CKPT_DIRECT_ALIGN];
        le(x, 0x4246, 2); /* "FB" */
        le(x + 2, pad, 2);
        memset(x + 4, 'Z', pad);
        rc = out(w, x, 4 + pad, err);
    }
    if (rc) return rc;
    r->off = w->pos;
    w->open_rec = 1;
    w->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    w->rec_size = 0;
    w->rec_expect = size;
    return 0;
}

int zip_writer_data(zip_writer *w, const void *data, size_t n, fsdp_err *err) {
    if (!w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: no open record");
    w->crc = ckpt_crc32(w->crc, data, n);
    w->rec_size += n;
    return out(w, data, n, err);
}

/* A payload of one piece or less: through the stream's buffer (small records coalesce into large
 * writes), converted into a buffer of its size first when the dtypes differ. */
static int data_small(zip_writer *w, const void *src, fsdp_dtype src_dt, fsdp_dtype dst_dt, size_t n, fsdp_err *err) {
    size_t bytes = n * fsdp_dtype_size(dst_dt);
    if (src_dt == dst_dt) return zip_writer_data(w, src, bytes, err);
    void *b = malloc(bytes ? bytes : 1);
    if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory converting %zu values", n);
    int rc = fsdp_convert(b, dst_dt, src, src_dt, n, err);
    if (!rc) rc = zip_writer_data(w, b, bytes, err);
    free(b);
    return rc;
}

/* A payload of one piece or less produced whole, then appended through the stream. */
static int gen_small(zip_writer *w, ckpt_gen_fn gen, void *user, fsdp_dtype dst_dt, size_t n, fsdp_err *err) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory producing %zu values", n);
    int rc = n ? gen(user, 0, n, v, err) : 0;
    if (!rc) rc = data_small(w, v, FSDP_DT_F32, dst_dt, n, err);
    free(v);
    return rc;
}

/* zip_writer_data_conv and zip_writer_data_gen: values from src, or from gen when src is NULL */
static int data_any(zip_writer *w, const void *src, ckpt_gen_fn gen, void *user, fsdp_dtype src_dt, fsdp_dtype dst_dt,
                    size_t n, fsdp_err *err) {
    if (!w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: no open record");
    if (w->failed) return FSDP_E_IO;
    ckpt_pio_opts o;
    ckpt_pwrite_opts_env(&o);
    size_t bytes = n * fsdp_dtype_size(dst_dt);
    if (bytes <= ckpt_pwrite_piece(&o))
        return gen ? gen_small(w, gen, user, dst_dt, n, err) : data_small(w, src, src_dt, dst_dt, n, err);
    int fd = fileno(w->f);
    if (fd < 0) return fsdp_err_set(err, FSDP_E_INVALID, "zip: the archive is not on a file");
    if (fflush(w->f) != 0) {
        w->failed = 1;
        return fsdp_err_set(err, FSDP_E_IO, "zip: write failed: %s", strerror(errno));
    }
    uint32_t c;
    int rc = gen ? ckpt_pwrite_gen(fd, gen, user, dst_dt, n, w->start + w->pos, &c, "zip", &o, err)
                 : ckpt_pwrite_conv(fd, src, src_dt, dst_dt, n, w->start + w->pos, &c, "zip", &o, err);
    if (rc) {
        w->failed = 1;
        return rc;
    }
    w->crc = (uint32_t)crc32_combine(w->crc, c, (z_off_t)bytes);
    w->rec_size += bytes;
    w->pos += bytes;
    if (fseeko(w->f, (off_t)(w->start + w->pos), SEEK_SET) != 0) {
        w->failed = 1;
        return fsdp_err_set(err, FSDP_E_IO, "zip: cannot seek past the payload: %s", strerror(errno));
    }
    return 0;
}

int zip_writer_data_conv(zip_writer *w, const void *src, fsdp_dtype src_dt, fsdp_dtype dst_dt, size_t n,
                         fsdp_err *err) {
    return data_any(w, src, NULL, NULL, src_dt, dst_dt, n, err);
}

int zip_writer_data_gen(zip_writer *w, ckpt_gen_fn gen, void *user, fsdp_dtype dst_dt, size_t n, fsdp_err *err) {
    return data_any(w, NULL, gen, user, FSDP_DT_F32, dst_dt, n, err);
}

int zip_writer_data_par(zip_writer *w, const void *data, size_t n, fsdp_err *err) {
    if (w->open_rec && !w->failed && fileno(w->f) < 0) return zip_writer_data(w, data, n, err);
    return zip_writer_data_conv(w, data, FSDP_DT_U8, FSDP_DT_U8, n, err);
}

int zip_writer_end_record(zip_writer *w, fsdp_err *err) {
    if (!w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: no open record");
    struct zip_wrec *r = &w->recs[w->n - 1];
    if (w->rec_size != w->rec_expect)
        return fsdp_err_set(err, FSDP_E_INVALID, "zip: record %s: %llu bytes written, %llu declared", r->name,
                            (unsigned long long)w->rec_size, (unsigned long long)w->rec_expect);
    r->size = w->rec_size;
    r->crc = w->crc;
    w->open_rec = 0;
    /* patch the CRC in the local header */
    if (fflush(w->f) != 0 || fseeko(w->f, (off_t)(w->start + r->header_off + 14), SEEK_SET) != 0) {
        w->failed = 1;
        return fsdp_err_set(err, FSDP_E_IO, "zip: cannot seek to patch the CRC: %s", strerror(errno));
    }
    unsigned char c[4];
    le(c, r->crc, 4);
    if (fwrite(c, 1, 4, w->f) != 4 || fseeko(w->f, (off_t)(w->start + w->pos), SEEK_SET) != 0) {
        w->failed = 1;
        return fsdp_err_set(err, FSDP_E_IO, "zip: cannot patch the CRC: %s", strerror(errno));
    }
    return 0;
}

int zip_writer_add(zip_writer *w, const char *name, const void *data, size_t n, fsdp_err *err) {
    int rc = zip_writer_start(w, name, n, err);
    if (!rc) rc = zip_writer_data(w, data, n, err);
    if (!rc) rc = zip_writer_end_record(w, err);
    return rc;
}

/* The central directory entry of record r: its header, name and, when its size or offset does
 * not fit 32 bits, the ZIP64 extra field. */
static int write_central_entry(zip_writer *w, const struct zip_wrec *r, fsdp_err *err) {
    size_t nl = strlen(r->name);
    int zs = r->size >= U32MAX, zo = r->header_off >= U32MAX;
    size_t xl = (zs || zo) ? 4 + (zs ? 16 : 0) + (zo ? 8 : 0) : 0;
    unsigned char h[46];
    le(h, 0x02014b50u, 4);
    le(h + 4, 45, 2);
    le(h + 6, (zs || zo) ? 45 : 20, 2);
    le(h + 8, 0, 2);
    le(h + 10, 0, 2);
    le(h + 12, 0, 4);
    le(h + 16, r->crc, 4);
    le(h + 20, zs ? U32MAX : r->size, 4);
    le(h + 24, zs ? U32MAX : r->size, 4);
    le(h + 28, nl, 2);
    le(h + 30, xl, 2);
    le(h + 32, 0, 2);
    le(h + 34, 0, 2);
    le(h + 36, 0, 2);
    le(h + 38, 0, 4);
    le(h + 42, zo ? U32MAX : r->header_off, 4);
    int rc = out(w, h, 46, err);
    if (!rc) rc = out(w, r->name, nl, err);
    if (!rc && xl) {
        unsigned char x[28];
        size_t k = 0;
        le(x, 1, 2);
        le(x + 2, xl - 4, 2);
        k = 4;
        if (zs) {
            le(x + k, r->size, 8);
            le(x + k + 8, r->size, 8);
            k += 16;
        }
        if (zo) {
            le(x + k, r->header_off, 8);
            k += 8;
        }
        rc = out(w, x, k, err);
    }
    return rc;
}

/* The ZIP64 end of central directory record and its locator (for cd_size bytes at cd_start). */
static int write_zip64_end(zip_writer *w, uint64_t cd_start, uint64_t cd_size, fsdp_err *err) {
    uint64_t z64_off = w->pos;
    unsigned char e[56];
    le(e, 0x06064b50u, 4);
    le(e + 4, 44, 8);
    le(e + 12, 45, 2);
    le(e + 14, 45, 2);
    le(e + 16, 0, 4);
    le(e + 20, 0, 4);
    le(e + 24, w->n, 8);
    le(e + 32, w->n, 8);
    le(e + 40, cd_size, 8);
    le(e + 48, cd_start, 8);
    unsigned char l[20];
    le(l, 0x07064b50u, 4);
    le(l + 4, 0, 4);
    le(l + 8, z64_off, 8);
    le(l + 16, 1, 4);
    int rc;
    if ((rc = out(w, e, 56, err)) || (rc = out(w, l, 20, err))) return rc;
    return 0;
}

int zip_writer_finish(zip_writer *w, uint64_t *len, fsdp_err *err) {
    if (w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: a record is still open");
    uint64_t cd_start = w->pos;
    int rc = 0;
    for (size_t i = 0; i < w->n && !rc; i++) rc = write_central_entry(w, &w->recs[i], err);
    if (rc) return rc;
    uint64_t cd_size = w->pos - cd_start;
    int z64 = w->n >= 0xffff || cd_start >= U32MAX || cd_size >= U32MAX;
    if (z64 && (rc = write_zip64_end(w, cd_start, cd_size, err))) return rc;
    unsigned char e[22];
    le(e, 0x06054b50u, 4);
    le(e + 4, 0, 4);
    le(e + 8, z64 ? 0xffff : w->n, 2);
    le(e + 10, z64 ? 0xffff : w->n, 2);
    le(e + 12, z64 ? U32MAX : cd_size, 4);
    le(e + 16, z64 ? U32MAX : cd_start, 4);
    le(e + 20, 0, 2);
    if ((rc = out(w, e, 22, err))) return rc;
    *len = w->pos;
    return 0;
}

void zip_writer_free(zip_writer *w) {
    for (size_t i = 0; i < w->n; i++) free(w->recs[i].name);
    free(w->recs);
    memset(w, 0, sizeof *w);
}
