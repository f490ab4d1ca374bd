/* Zip reader for torch.save archives (STORED records, zip64).
 *
 * Opening reads the end records, the central directory and every record's local header, and
 * checks them against each other: a local header must carry the central directory's name and
 * method (and, unless deferred to a data descriptor, its sizes and CRC), every payload must lie
 * in the archive, and no payload may overlap another record or the central directory (a shifted
 * payload offset would otherwise hand out bytes of the neighbouring record). A broken directory
 * fails the open; a record that fails these checks keeps its error (zip_entry.bad), which every
 * read of it returns, so that the caller can name what the record holds (a tensor). Records
 * are indexed by name (sorted: zip_find is a binary search; two records of one name are an
 * error).
 *
 * CRC-32: a read that covers a whole record checks the record's CRC in the same pass as the
 * copy (zlib's crc32 over each piece while it is in cache); zip_read_checked also checks it for
 * a read of part of a record by streaming the rest of the record; a read of part of a record
 * through zip_read checks nothing (it cannot know the bytes it does not read). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/crc32.h"
#include "ckpt/ckpt_pread.h"
#include "ckpt/zip.h"

#define ZIP_FLAG_DESCRIPTOR 0x0008 /* sizes and CRC follow the payload (data descriptor) */
#define ZIP_STREAM_BUF ((size_t)16 << 20)

static uint64_t le(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static int rd(zip_reader *z, uint64_t off, void *dst, size_t n, fsdp_err *err) {
    if (off > z->len || n > z->len - off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip: read of %zu bytes at %llu past the end of the archive (%llu bytes)",
                            z->what, n, (unsigned long long)off, (unsigned long long)z->len);
    if (z->mem) {
        memcpy(dst, z->mem + z->base + off, n);
        return 0;
    }
    return ckpt_pread_all(z->fd, dst, n, z->base + off, z->what, NULL, err);
}

static uint32_t crc_update(uint32_t c, const void *p, size_t n) { return ckpt_crc32(c, p, n); }

/* The same as rd, with the CRC-32 of the bytes in *crc (computed piece by piece as they arrive). */
static int rd_crc(zip_reader *z, uint64_t off, void *dst, size_t n, uint32_t *crc, fsdp_err *err) {
    if (off > z->len || n > z->len - off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip: read of %zu bytes at %llu past the end of the archive (%llu bytes)",
                            z->what, n, (unsigned long long)off, (unsigned long long)z->len);
    if (!z->mem) return ckpt_pread_crc(z->fd, dst, n, z->base + off, crc, z->what, NULL, err);
    const size_t piece = (size_t)1 << 20;
    uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t a = 0; a < n; a += piece) {
        size_t k = n - a < piece ? n - a : piece;
        memcpy((char *)dst + a, z->mem + z->base + off + a, k);
        c = crc_update(c, (char *)dst + a, k);
    }
    *crc = c;
    return 0;
}

/* ---- opening ---------------------------------------------------------------------------- */

/* Finds the end record; fills the directory's record count, size and offset. */
static int find_directory(zip_reader *z, uint64_t *count, uint64_t *cd_size, uint64_t *cd_off, fsdp_err *err) {
    if (z->len < 22) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: too short to be a zip archive (%llu bytes)", z->what,
                                         (unsigned long long)z->len);
    /* the end record is the last "PK\5\6" of the archive's final 64 KiB + 22 bytes; without a
     * comment (torch.save) it is in the last few bytes: look in 4 KiB first, then in all */
    size_t full = z->len < 65557 ? (size_t)z->len : 65557, tail = 0;
    unsigned char *t = NULL;
    long eocd = -1;
    int rc = 0;
    for (int pass = 0; pass < 2 && eocd < 0; pass++) {
        size_t want = pass == 0 && full > 4096 ? 4096 : full;
        if (want <= tail) continue;
        tail = want;
        free(t);
        t = malloc(tail);
        if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if ((rc = rd(z, z->len - tail, t, tail, err))) {
            free(t);
            return rc;
        }
        for (long i = (long)tail - 22; i >= 0; i--)
            if (t[i] == 'P' && t[i + 1] == 'K' && t[i + 2] == 5 && t[i + 3] == 6) {
                eocd = i;
                break;
            }
    }
    if (eocd < 0) {
        free(t);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: no zip end-of-central-directory record (truncated or not a zip)",
                            z->what);
    }
    uint64_t eocd_abs = z->len - tail + (uint64_t)eocd;
    *count = le(t + eocd + 10, 2);
    *cd_size = le(t + eocd + 12, 4);
    *cd_off = le(t + eocd + 16, 4);
    free(t);
    if (*count == 0xffff || *cd_size == 0xffffffffu || *cd_off == 0xffffffffu) {
        /* zip64: locator right before the EOCD */
        unsigned char loc[20], z64[56];
        if (eocd_abs < 20 || (rc = rd(z, eocd_abs - 20, loc, 20, err)))
            return rc ? rc : fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip64 locator missing", z->what);
        if (le(loc, 4) != 0x07064b50u) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip64 locator missing", z->what);
        uint64_t z64off = le(loc + 8, 8);
        if ((rc = rd(z, z64off, z64, 56, err))) return rc;
        if (le(z64, 4) != 0x06064b50u) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: bad zip64 end record", z->what);
        *count = le(z64 + 32, 8);
        *cd_size = le(z64 + 40, 8);
        *cd_off = le(z64 + 48, 8);
    }
    if (*cd_off > z->len || *cd_size > z->len - *cd_off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip central directory outside the archive", z->what);
    if (*count > *cd_size / 46 + 1)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip claims %llu records in a %llu-byte directory", z->what,
                            (unsigned long long)*count, (unsigned long long)*cd_size);
    return 0;
}

/* The zip64 extra field (id 1) of a header: the 64-bit values of the fields that hold 0xffffffff,
 * in the order usize, csize, offset. A field it lacks is an error. */
static int zip64_extra(const unsigned char *x, size_t xl, uint64_t *usize, uint64_t *csize, uint64_t *hoff) {
    int need = (usize && *usize == 0xffffffffu) + (csize && *csize == 0xffffffffu) + (hoff && *hoff == 0xffffffffu);
    for (size_t q = 0; q + 4 <= xl;) {
        uint16_t id = (uint16_t)le(x + q, 2), sz = (uint16_t)le(x + q + 2, 2);
        if (q + 4 + sz > xl) break;
        if (id == 1) {
            size_t r = q + 4, end = q + 4 + sz;
            if (usize && *usize == 0xffffffffu && r + 8 <= end) *usize = le(x + r, 8), r += 8, need--;
            if (csize && *csize == 0xffffffffu && r + 8 <= end) *csize = le(x + r, 8), r += 8, need--;
            if (hoff && *hoff == 0xffffffffu && r + 8 <= end) *hoff = le(x + r, 8), r += 8, need--;
            break;
        }
        q += 4 + (size_t)sz;
    }
    return need ? -1 : 0;
}

/* One central directory entry at cd + *p into *e (name, sizes, method, flags, CRC, offset). */
static int read_cd_entry(zip_reader *z, const unsigned char *cd, uint64_t cd_size, size_t *p, uint64_t i, zip_entry *e,
                         fsdp_err *err) {
    if (*p + 46 > cd_size || le(cd + *p, 4) != 0x02014b50u)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt zip central directory entry %llu", z->what,
                            (unsigned long long)i);
    const unsigned char *h = cd + *p;
    e->flags = (uint16_t)le(h + 8, 2);
    e->method = (uint16_t)le(h + 10, 2);
    e->crc = (uint32_t)le(h + 16, 4);
    uint64_t csize = le(h + 20, 4), usize = le(h + 24, 4), hoff = le(h + 42, 4);
    size_t nl = (size_t)le(h + 28, 2), xl = (size_t)le(h + 30, 2), cl = (size_t)le(h + 32, 2);
    if (*p + 46 + nl + xl + cl > cd_size)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip directory entry %llu runs past the directory", z->what,
                            (unsigned long long)i);
    e->name = malloc(nl + 1);
    if (!e->name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memcpy(e->name, h + 46, nl);
    e->name[nl] = '\0';
    if (strlen(e->name) != nl)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip directory entry %llu: the record name holds a NUL byte",
                            z->what, (unsigned long long)i);
    if (zip64_extra(h + 46 + nl, xl, &usize, &csize, &hoff))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: zip64 sizes/offset missing from its directory entry",
                            z->what, e->name);
    e->size = usize;
    e->header_off = hoff;
    if (e->method == 0 && csize != usize)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: stored size %llu != size %llu", z->what, e->name,
                            (unsigned long long)csize, (unsigned long long)usize);
    if (hoff > z->len || usize > z->len - hoff)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s lies outside the archive", z->what, e->name);
    *p += 46 + nl + xl + cl;
    return 0;
}

static int read_directory(zip_reader *z, uint64_t count, uint64_t cd_size, uint64_t cd_off, fsdp_err *err) {
    unsigned char *cd = malloc(cd_size ? cd_size : 1);
    z->entries = calloc(count ? count : 1, sizeof *z->entries);
    if (!cd || !z->entries) {
        free(cd);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    int rc = rd(z, cd_off, cd, cd_size, err);
    size_t p = 0;
    for (uint64_t i = 0; i < count && !rc; i++) {
        rc = read_cd_entry(z, cd, cd_size, &p, i, &z->entries[z->n], err);
        if (z->entries[z->n].name) z->n++;
    }
    free(cd);
    return rc;
}

static int corrupt(zip_reader *z, const zip_entry *e, const char *what, uint64_t at, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: %s (at byte %llu): the archive is corrupt", z->what,
                        e->name, what, (unsigned long long)at);
}

/* A local header's extra field: whole (id, size, data) fields, then at most zero padding (what
 * zip aligners add); the zip64 sizes when the header's 32-bit ones are 0xffffffff. A shifted
 * payload offset (a wrong extra length) leaves payload bytes here that seldom parse. */
static int check_extra(zip_reader *z, const zip_entry *e, uint64_t at, size_t xl, uint64_t *usize, uint64_t *csize,
                       fsdp_err *err) {
    unsigned char *x = malloc(xl ? xl : 1);
    if (!x) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = rd(z, at, x, xl, err);
    size_t q = 0;
    while (!rc && q + 4 <= xl && q + 4 + le(x + q + 2, 2) <= xl && (le(x + q, 2) || le(x + q + 2, 2))) q += 4 + le(x + q + 2, 2);
    for (size_t r = q; !rc && r < xl; r++)
        if (x[r]) rc = corrupt(z, e, "the local header's extra field is malformed", at + q, err);
    if (!rc && (*usize == 0xffffffffu || *csize == 0xffffffffu) && zip64_extra(x, xl, usize, csize, NULL))
        rc = corrupt(z, e, "the local header lacks its zip64 sizes", at, err);
    free(x);
    return rc;
}

/* The data descriptor after the payload (flag bit 3): [signature] CRC-32, sizes. Its CRC must be
 * the directory's, so a payload found at a shifted offset is caught before any read. */
static int check_descriptor(zip_reader *z, const zip_entry *e, fsdp_err *err) {
    uint64_t at = e->data_off + e->size;
    unsigned char d[24] = {0};
    size_t n = z->len - at < sizeof d ? (size_t)(z->len - at) : sizeof d;
    int rc = rd(z, at, d, n, err);
    if (rc) return rc;
    int sig = n >= 4 && le(d, 4) == 0x08074b50u;
    const unsigned char *c = d + (sig ? 4 : 0);
    size_t have = n - (sig ? 4 : 0);
    uint64_t sz32 = have >= 12 ? le(c + 8, 4) : 0, sz64 = have >= 20 ? le(c + 12, 8) : 0;
    if (have < 12 || le(c, 4) != e->crc || (sz32 != e->size && sz64 != e->size))
        return corrupt(z, e, "no data descriptor with the directory's CRC-32 and size after the payload", at, err);
    return 0;
}

/* Checks a record's local header against its directory entry and sets data_off. */
static int check_local(zip_reader *z, zip_entry *e, fsdp_err *err) {
    size_t nl = strlen(e->name);
    unsigned char *h = malloc(30 + nl);
    if (!h) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = rd(z, e->header_off, h, 30 + nl, err);
    if (rc) {
        free(h);
        return fsdp_err_prefix(err, "%s: zip record %s: local header", z->what, e->name);
    }
    const char *bad = NULL;
    uint16_t flags = (uint16_t)le(h + 6, 2);
    uint64_t crc = le(h + 14, 4), csize = le(h + 18, 4), usize = le(h + 22, 4), xl = le(h + 28, 2);
    if (le(h, 4) != 0x04034b50u) bad = "no local header signature at the directory's offset";
    else if (le(h + 26, 2) != nl || memcmp(h + 30, e->name, nl)) bad = "the local header names another record";
    else if (le(h + 8, 2) != e->method) bad = "the local header gives another compression method";
    free(h);
    if (bad) return corrupt(z, e, bad, e->header_off, err);
    uint64_t off = e->header_off + 30 + nl + xl;
    if (off > z->len || e->size > z->len - off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: payload past the end of the archive", z->what,
                            e->name);
    if ((rc = check_extra(z, e, e->header_off + 30 + nl, (size_t)xl, &usize, &csize, err))) return rc;
    e->data_off = off;
    if (flags & ZIP_FLAG_DESCRIPTOR) return check_descriptor(z, e, err);
    if (crc != e->crc || usize != e->size || (e->method == 0 && csize != e->size))
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: zip record %s: the local header (size %llu, CRC-32 0x%08llx) disagrees with the "
                            "central directory (size %llu, CRC-32 0x%08x): the archive is corrupt",
                            z->what, e->name, (unsigned long long)usize, (unsigned long long)crc,
                            (unsigned long long)e->size, e->crc);
    return 0;
}

static int cmp_header_off(const void *a, const void *b, void *entries) {
    const zip_entry *x = &((const zip_entry *)entries)[*(const size_t *)a];
    const zip_entry *y = &((const zip_entry *)entries)[*(const size_t *)b];
    return x->header_off < y->header_off ? -1 : x->header_off > y->header_off;
}

static int cmp_name(const void *a, const void *b, void *entries) {
    const zip_entry *x = &((const zip_entry *)entries)[*(const size_t *)a];
    const zip_entry *y = &((const zip_entry *)entries)[*(const size_t *)b];
    int c = strcmp(x->name, y->name);
    return c ? c : (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
}

/* Marks e broken with the message in err (a format error); other errors stay fatal. */
static int mark_bad(zip_entry *e, int rc, const fsdp_err *err) {
    if (rc != FSDP_E_FORMAT) return rc;
    if (!e->bad) e->bad = strdup(err->msg);
    return e->bad ? 0 : FSDP_E_NOMEM;
}

/* Local headers, overlaps (records sorted by offset: each one's payload ends before the next
 * record and the directory) and the name index. */
static int check_records(zip_reader *z, uint64_t cd_off, fsdp_err *err) {
    fsdp_err rec_err;
    for (size_t i = 0; i < z->n; i++) {
        int rc = mark_bad(&z->entries[i], check_local(z, &z->entries[i], &rec_err), &rec_err);
        if (rc) return rc == FSDP_E_NOMEM ? fsdp_err_set(err, rc, "out of memory") : fsdp_err_set(err, rc, "%s", rec_err.msg);
    }
    z->by_name = malloc((z->n ? z->n : 1) * sizeof *z->by_name);
    if (!z->by_name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < z->n; i++)
        if (!z->entries[i].bad) z->by_name[m++] = i;
    qsort_r(z->by_name, m, sizeof *z->by_name, cmp_header_off, z->entries);
    for (size_t k = 0; k < m; k++) {
        zip_entry *e = &z->entries[z->by_name[k]];
        const zip_entry *next = k + 1 < m ? &z->entries[z->by_name[k + 1]] : NULL;
        uint64_t end = e->data_off + e->size, limit = next ? next->header_off : cd_off;
        if (end <= limit) continue;
        fsdp_err_set(&rec_err, FSDP_E_FORMAT,
                     "%s: zip record %s: its payload [%llu, %llu) overlaps %s%s at byte %llu: the archive is corrupt",
                     z->what, e->name, (unsigned long long)e->data_off, (unsigned long long)end,
                     next ? "record " : "the central directory", next ? next->name : "", (unsigned long long)limit);
        if (mark_bad(e, FSDP_E_FORMAT, &rec_err)) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < z->n; i++) z->by_name[i] = i;
    qsort_r(z->by_name, z->n, sizeof *z->by_name, cmp_name, z->entries);
    for (size_t k = 1; k < z->n; k++)
        if (!strcmp(z->entries[z->by_name[k]].name, z->entries[z->by_name[k - 1]].name))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip holds two records named %s: the archive is corrupt", z->what,
                                z->entries[z->by_name[k]].name);
    return 0;
}

static int parse(zip_reader *z, fsdp_err *err) {
    uint64_t count = 0, cd_size = 0, cd_off = 0;
    int rc = find_directory(z, &count, &cd_size, &cd_off, err);
    if (!rc) rc = read_directory(z, count, cd_size, cd_off, err);
    if (!rc) rc = check_records(z, cd_off, err);
    if (rc) return rc;
    /* common prefix = up to the first '/' of the first record (torch: "archive/") */
    if (z->n) {
        const char *s = strchr(z->entries[0].name, '/');
        size_t pl = s ? (size_t)(s - z->entries[0].name + 1) : 0;
        if (pl < sizeof z->prefix) {
            memcpy(z->prefix, z->entries[0].name, pl);
            z->prefix[pl] = '\0';
        }
        for (size_t i = 0; i < z->n; i++)
            if (strncmp(z->entries[i].name, z->prefix, strlen(z->prefix))) z->prefix[0] = '\0';
    }
    return 0;
}

int zip_open_mem(zip_reader *z, const void *buf, size_t len, const char *what, fsdp_err *err) {
    memset(z, 0, sizeof *z);
    z->mem = buf;
    z->len = len;
    z->fd = -1;
    z->what = strdup(what ? what : "zip");
    if (!z->what) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = parse(z, err);
    if (rc) zip_close(z);
    return rc;
}

int zip_open_fd(zip_reader *z, int fd, uint64_t base, uint64_t len, const char *what, fsdp_err *err) {
    memset(z, 0, sizeof *z);
    z->fd = fd;
    z->base = base;
    z->len = len;
    z->what = strdup(what ? what : "zip");
    if (!z->what) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = parse(z, err);
    if (rc) zip_close(z);
    return rc;
}

void zip_close(zip_reader *z) {
    for (size_t i = 0; i < z->n; i++) {
        free(z->entries[i].name);
        free(z->entries[i].bad);
    }
    free(z->entries);
    free(z->by_name);
    free(z->what);
    memset(z, 0, sizeof *z);
    z->fd = -1;
}

zip_entry *zip_find(zip_reader *z, const char *suffix) {
    size_t pl = strlen(z->prefix), lo = 0, hi = z->n;
    /* every name starts with the prefix: the order by name is the order by suffix */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(z->entries[z->by_name[mid]].name + pl, suffix);
        if (!c) return &z->entries[z->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- reading ---------------------------------------------------------------------------- */

static int crc_mismatch(zip_reader *z, const zip_entry *e, uint32_t got, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "%s: zip record %s: CRC-32 mismatch (the archive says 0x%08x, the %llu bytes read give 0x%08x): "
                        "the record is corrupt",
                        z->what, e->name, e->crc, (unsigned long long)e->size, got);
}

static int check_range(zip_reader *z, const zip_entry *e, uint64_t off, size_t n, fsdp_err *err) {
    if (e->bad) return fsdp_err_set(err, FSDP_E_FORMAT, "%s", e->bad);
    if (e->method != 0)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: zip record %s is compressed (method %u); torch.save archives are stored, not compressed",
                            z->what, e->name, e->method);
    if (off > e->size || n > e->size - off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: read of %zu bytes at %llu past the end of record %s (%llu bytes)",
                            z->what, n, (unsigned long long)off, e->name, (unsigned long long)e->size);
    return 0;
}

int zip_read(zip_reader *z, zip_entry *e, uint64_t off, void *dst, size_t n, fsdp_err *err) {
    int rc = check_range(z, e, off, n, err);
    if (rc) return rc;
    if (off != 0 || n != e->size) return rd(z, e->data_off + off, dst, n, err);
    uint32_t c;
    if ((rc = rd_crc(z, e->data_off, dst, n, &c, err))) return rc;
    if (c != e->crc && !e->no_crc) return crc_mismatch(z, e, c, err);
    e->crc_checked = 1;
    return 0;
}

/* CRC-32 of [off, off+n) of a record without keeping the bytes. */
static int crc_of_range(zip_reader *z, const zip_entry *e, uint64_t off, uint64_t n, uint32_t *crc, fsdp_err *err) {
    uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
    if (z->mem) {
        *crc = crc_update(c, z->mem + z->base + e->data_off + off, (size_t)n);
        return 0;
    }
    size_t cap = n < ZIP_STREAM_BUF ? (size_t)n : ZIP_STREAM_BUF;
    void *buf = malloc(cap ? cap : 1);
    if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory checking %s", z->what);
    int rc = 0;
    for (uint64_t a = 0; a < n && !rc; a += cap) {
        size_t k = n - a < cap ? (size_t)(n - a) : cap;
        uint32_t pc;
        rc = rd_crc(z, e->data_off + off + a, buf, k, &pc, err);
        if (!rc) c = (uint32_t)crc32_combine(c, pc, (z_off_t)k);
    }
    free(buf);
    *crc = c;
    return rc;
}

int zip_read_checked(zip_reader *z, zip_entry *e, uint64_t off, void *dst, size_t n, fsdp_err *err) {
    int rc = check_range(z, e, off, n, err);
    if (rc) return rc;
    if (e->crc_checked || (off == 0 && n == e->size)) return zip_read(z, e, off, dst, n, err);
    uint32_t head, mid, tail;
    uint64_t rest = e->size - off - n;
    if ((rc = crc_of_range(z, e, 0, off, &head, err))) return rc;
    if ((rc = rd_crc(z, e->data_off + off, dst, n, &mid, err))) return rc;
    if ((rc = crc_of_range(z, e, off + n, rest, &tail, err))) return rc;
    uint32_t c = (uint32_t)crc32_combine(crc32_combine(head, mid, (z_off_t)n), tail, (z_off_t)rest);
    if (c != e->crc && !e->no_crc) return crc_mismatch(z, e, c, err);
    e->crc_checked = 1;
    return 0;
}

/* rd_xf over an in-memory archive: the same results, in one thread */
static int rd_xf_mem(zip_reader *z, uint64_t at, void *dst, ckpt_rd_xf *xf, fsdp_err *err) {
    const unsigned char *src = z->mem + z->base + at;
    size_t bytes = xf->n * fsdp_dtype_size(xf->src_dt);
    xf->crc = xf->want_crc ? crc_update((uint32_t)crc32(0L, Z_NULL, 0), src, bytes) : 0;
    int rc = fsdp_convert(dst, xf->dst_dt, src, xf->src_dt, xf->n, err);
    xf->nan = !rc && xf->want_nan && xf->dst_dt == FSDP_DT_F32 && ckpt_f32_has_nan(dst, xf->n);
    return rc;
}

int zip_read_xf(zip_reader *z, zip_entry *e, uint64_t off, void *dst, ckpt_rd_xf *xf, int check, fsdp_err *err) {
    size_t ss = fsdp_dtype_size(xf->src_dt), n = xf->n * ss;
    if (!ss || xf->n > SIZE_MAX / 16) return fsdp_err_set(err, FSDP_E_INVALID, "%s: invalid read", z->what);
    int rc = check_range(z, e, off, n, err);
    if (rc) return rc;
    int whole = off == 0 && n == e->size, crc = whole || (check && !e->crc_checked);
    xf->want_crc = crc;
    rc = z->mem ? rd_xf_mem(z, e->data_off + off, dst, xf, err)
                : ckpt_pread_xf(z->fd, dst, z->base + e->data_off + off, xf, z->what, NULL, err);
    if (rc || !crc) return rc;
    uint32_t c = xf->crc;
    if (!whole) { /* the rest of the record through a bounded buffer */
        uint32_t head, tail;
        uint64_t rest = e->size - off - n;
        if ((rc = crc_of_range(z, e, 0, off, &head, err))) return rc;
        if ((rc = crc_of_range(z, e, off + n, rest, &tail, err))) return rc;
        c = (uint32_t)crc32_combine(crc32_combine(head, c, (z_off_t)n), tail, (z_off_t)rest);
    }
    if (c != e->crc && !e->no_crc) return crc_mismatch(z, e, c, err);
    e->crc_checked = 1;
    return 0;
}

int zip_verify(zip_reader *z, zip_entry *e, fsdp_err *err) {
    if (e->bad || e->method != 0) return check_range(z, e, 0, 0, err);
    uint32_t c;
    int rc = crc_of_range(z, e, 0, e->size, &c, err);
    if (rc) return rc;
    if (c != e->crc && !e->no_crc) return crc_mismatch(z, e, c, err);
    e->crc_checked = 1;
    return 0;
}

int zip_read_all(zip_reader *z, zip_entry *e, void **out, size_t *len, fsdp_err *err) {
    *out = NULL;
    if (e->size > ((uint64_t)1 << 30))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: record %s is too large to load whole", z->what, e->name);
    void *b = malloc(e->size ? e->size : 1);
    if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = zip_read(z, e, 0, b, (size_t)e->size, err);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    *len = (size_t)e->size;
    return 0;
}
