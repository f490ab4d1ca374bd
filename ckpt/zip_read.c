/* Zip reader for torch.save archives (STORED records, zip64). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/zip.h"

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

static int parse(zip_reader *z, fsdp_err *err) {
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
    uint64_t count = le(t + eocd + 10, 2), cd_size = le(t + eocd + 12, 4), cd_off = le(t + eocd + 16, 4);
    free(t);
    if (count == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
        /* zip64: locator right before the EOCD */
        unsigned char loc[20], z64[56];
        if (eocd_abs < 20 || (rc = rd(z, eocd_abs - 20, loc, 20, err))) return rc ? rc : fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip64 locator missing", z->what);
        if (le(loc, 4) != 0x07064b50u) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip64 locator missing", z->what);
        uint64_t z64off = le(loc + 8, 8);
        if ((rc = rd(z, z64off, z64, 56, err))) return rc;
        if (le(z64, 4) != 0x06064b50u) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: bad zip64 end record", z->what);
        count = le(z64 + 32, 8);
        cd_size = le(z64 + 40, 8);
        cd_off = le(z64 + 48, 8);
    }
    if (cd_off > z->len || cd_size > z->len - cd_off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip central directory outside the archive", z->what);
    if (count > cd_size / 46 + 1)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip claims %llu records in a %llu-byte directory", z->what,
                            (unsigned long long)count, (unsigned long long)cd_size);
    unsigned char *cd = malloc(cd_size ? cd_size : 1);
    z->entries = calloc(count ? count : 1, sizeof *z->entries);
    if (!cd || !z->entries) {
        free(cd);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    if ((rc = rd(z, cd_off, cd, cd_size, err))) {
        free(cd);
        return rc;
    }
    size_t p = 0;
    for (uint64_t i = 0; i < count; i++) {
        if (p + 46 > cd_size || le(cd + p, 4) != 0x02014b50u) {
            free(cd);
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt zip central directory entry %llu", z->what,
                                (unsigned long long)i);
        }
        zip_entry *e = &z->entries[z->n];
        e->method = (uint16_t)le(cd + p + 10, 2);
        e->crc = (uint32_t)le(cd + p + 16, 4);
        uint64_t csize = le(cd + p + 20, 4), usize = le(cd + p + 24, 4);
        size_t nl = (size_t)le(cd + p + 28, 2), xl = (size_t)le(cd + p + 30, 2), cl = (size_t)le(cd + p + 32, 2);
        uint64_t hoff = le(cd + p + 42, 4);
        if (p + 46 + nl + xl + cl > cd_size) {
            free(cd);
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip directory entry %llu runs past the directory", z->what,
                                (unsigned long long)i);
        }
        e->name = malloc(nl + 1);
        if (!e->name) {
            free(cd);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        memcpy(e->name, cd + p + 46, nl);
        e->name[nl] = '\0';
        z->n++;
        /* zip64 extra: fields present only for the 0xffffffff ones, in order usize, csize, offset */
        const unsigned char *x = cd + p + 46 + nl;
        for (size_t q = 0; q + 4 <= xl;) {
            uint16_t id = (uint16_t)le(x + q, 2), sz = (uint16_t)le(x + q + 2, 2);
            if (q + 4 + sz > xl) break;
            if (id == 1) {
                size_t r = q + 4;
                if (usize == 0xffffffffu && r + 8 <= q + 4 + sz) usize = le(x + r, 8), r += 8;
                if (csize == 0xffffffffu && r + 8 <= q + 4 + sz) csize = le(x + r, 8), r += 8;
                if (hoff == 0xffffffffu && r + 8 <= q + 4 + sz) hoff = le(x + r, 8), r += 8;
            }
            q += 4 + (size_t)sz;
        }
        e->size = usize;
        e->header_off = hoff;
        if (e->method == 0 && csize != usize) {
            free(cd);
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: stored size %llu != size %llu", z->what, e->name,
                                (unsigned long long)csize, (unsigned long long)usize);
        }
        if (hoff > z->len || usize > z->len - hoff) {
            free(cd);
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s lies outside the archive", z->what, e->name);
        }
        p += 46 + nl + xl + cl;
    }
    free(cd);
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
    for (size_t i = 0; i < z->n; i++) free(z->entries[i].name);
    free(z->entries);
    free(z->what);
    memset(z, 0, sizeof *z);
    z->fd = -1;
}

zip_entry *zip_find(zip_reader *z, const char *suffix) {
    size_t pl = strlen(z->prefix);
    for (size_t i = 0; i < z->n; i++)
        if (!strcmp(z->entries[i].name + pl, suffix)) return &z->entries[i];
    return NULL;
}

static int resolve(zip_reader *z, zip_entry *e, fsdp_err *err) {
    if (e->data_resolved) return 0;
    unsigned char h[30];
    int rc = rd(z, e->header_off, h, 30, err);
    if (rc) return rc;
    if (le(h, 4) != 0x04034b50u)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: bad local header", z->what, e->name);
    uint64_t off = e->header_off + 30 + le(h + 26, 2) + le(h + 28, 2);
    if (off > z->len || e->size > z->len - off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: zip record %s: payload past the end of the archive", z->what,
                            e->name);
    e->data_off = off;
    e->data_resolved = 1;
    return 0;
}

int zip_read(zip_reader *z, zip_entry *e, uint64_t off, void *dst, size_t n, fsdp_err *err) {
    if (e->method != 0)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: zip record %s is compressed (method %u); torch.save archives are stored, not compressed",
                            z->what, e->name, e->method);
    if (off > e->size || n > e->size - off)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: read of %zu bytes at %llu past the end of record %s (%llu bytes)",
                            z->what, n, (unsigned long long)off, e->name, (unsigned long long)e->size);
    int rc = resolve(z, e, err);
    if (rc) return rc;
    return rd(z, e->data_off + off, dst, n, err);
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
