/* Fuzz the .pt reader end to end, at any tensor size: the input becomes a file (memfd), which
 * ckpt_open reads as torch.save; every tensor is read whole as its own dtype and as f64 (what
 * `ckpt diff` does: both must agree), and its first half of rows; ckpt_verify checks every
 * record; the values are rendered. Whatever a tensor claims, the reader lists only tensors
 * whose bytes its record holds, so the buffers here are at most 8x the input (f64 of bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/reader.h"
#include "tests/fuzz/fuzz.h"

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

int fsdp_fuzz_pt(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.pt", 0);
    if (fd < 0) return 0;
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
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_pt)
