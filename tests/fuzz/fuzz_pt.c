/* Fuzz the .pt reader end to end, at any tensor size: the input becomes a file (memfd), which
 * ckpt_open reads as torch.save; every tensor is read whole as its own dtype and as f64 (what
 * `ckpt diff` does: both must agree), and its first half of rows; ckpt_verify checks every
 * record; the values are rendered. Whatever a tensor claims, the reader lists only tensors
 * whose bytes its record holds, so the buffers here are at most 8x the input (f64 of bytes).
 *
 * A mutated pickle or payload nearly always fails its record's CRC-32, which would keep the
 * fuzzer in front of the checksum: each input runs twice, as it is and with the CRCs of its
 * records rewritten to match their bytes (central directory, local header, data descriptor). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <zlib.h>

#include "ckpt/reader.h"
#include "ckpt/zip.h"
#include "tests/fuzz/fuzz.h"

static void put32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Rewrites the CRC-32 of every readable record of the archive in buf to match its payload. */
static void fix_crcs(uint8_t *buf, size_t size) {
    zip_reader z;
    fsdp_err err;
    if (zip_open_mem(&z, buf, size, "fuzz", &err)) return;
    uint32_t *crc = calloc(z.n ? z.n : 1, sizeof *crc);
    for (size_t i = 0; crc && i < z.n; i++) {
        zip_entry *e = &z.entries[i];
        if (e->bad || e->data_off + e->size > size) continue;
        crc[i] = (uint32_t)crc32(0L, buf + e->data_off, (uInt)e->size);
        uint64_t d = e->data_off + e->size;
        if (!(e->flags & 8) && e->header_off + 30 <= size) put32(buf + e->header_off + 14, crc[i]);
        else if ((e->flags & 8) && d + 8 <= size) put32(buf + d + (get32(buf + d) == 0x08074b50u ? 4 : 0), crc[i]);
    }
    /* the directory entries, by name */
    size_t pl = strlen(z.prefix);
    for (size_t at = 0; crc && at + 46 <= size; at++) {
        if (get32(buf + at) != 0x02014b50u) continue;
        size_t nl = (size_t)(buf[at + 28] | buf[at + 29] << 8);
        if (at + 46 + nl > size || nl < pl || nl > 4096) continue;
        char name[4097];
        memcpy(name, buf + at + 46, nl);
        name[nl] = '\0';
        zip_entry *e = strncmp(name, z.prefix, pl) ? NULL : zip_find(&z, name + pl);
        if (e && !e->bad) put32(buf + at + 16, crc[e - z.entries]);
    }
    free(crc);
    zip_close(&z);
}

static void read_tensor(ckpt_reader *r, size_t i, const ckpt_entry *e, size_t size) {
    fsdp_err err;
    size_t esz = fsdp_dtype_size(e->dtype);
    int64_t numel = fsdp_numel(e->ndim, e->shape), rows = e->ndim ? e->shape[0] : 1;
    /* the invariant the open checks guarantee */
    if (numel < 0 || e->nbytes != (uint64_t)numel * esz || e->nbytes > size) abort();
    unsigned char *own = malloc(e->nbytes ? e->nbytes : 1);
    double *f64 = malloc(numel ? (size_t)numel * sizeof *f64 : 1), *conv = malloc(numel ? (size_t)numel * sizeof *conv : 1);
    if (own && f64 && conv) {
        int a = ckpt_read_rows(r, i, 0, rows, own, e->dtype, &err);
        int b = ckpt_read_rows(r, i, 0, rows, f64, FSDP_DT_F64, &err);
        /* the same bytes either way: f64 of the native read equals the f64 read */
        if (!a && !b && !fsdp_convert(conv, FSDP_DT_F64, own, e->dtype, (size_t)numel, &err) &&
            memcmp(conv, f64, (size_t)numel * sizeof *f64))
            abort();
        ckpt_read_rows(r, i, 0, rows / 2, f64, FSDP_DT_F64, &err);
    }
    free(own);
    free(f64);
    free(conv);
}

static void run_pt(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.pt", 0);
    if (fd < 0) return;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ckpt_reader *r;
    fsdp_err err;
    if (done == size && ckpt_open(path, CKPT_PT, &r, &err) == 0) {
        for (size_t i = 0; i < ckpt_count(r); i++) {
            const ckpt_entry *e = ckpt_entry_at(r, i);
            if (ckpt_find(r, e->name) < 0 || (size_t)ckpt_find(r, e->name) > i) abort();
            if (e->is_tensor) {
                read_tensor(r, i, e, size);
            } else {
                int64_t v;
                ckpt_value_text(r, i);
                ckpt_value_int(r, i, &v);
            }
        }
        size_t records;
        ckpt_verify(r, &records, &err);
        ckpt_close(r);
    }
    close(fd);
}

int fsdp_fuzz_pt(const uint8_t *data, size_t size) {
    run_pt(data, size);
    uint8_t *fixed = malloc(size ? size : 1);
    if (!fixed) return 0;
    memcpy(fixed, data, size);
    fix_crcs(fixed, size);
    if (memcmp(fixed, data, size)) run_pt(fixed, size);
    free(fixed);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_pt)
