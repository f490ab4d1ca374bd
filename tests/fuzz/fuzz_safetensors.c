/* Fuzz the safetensors header parser and validation (through a memory file). What it accepts
 * must hold the invariants the readers rely on (a violation traps): each tensor's byte count is
 * exactly dtype size x its element count (no overflow) and lies inside the file. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "runtime/checked.h"
#include "tests/fuzz/fuzz.h"

int fsdp_fuzz_safetensors(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    st_reader *r;
    fsdp_err err;
    if (st_open(&r, path, &err) == 0) {
        for (size_t i = 0; i < st_count(r); i++) {
            const st_tensor_info *t = st_tensor(r, i);
            int64_t nb;
            if (chk_shape_bytes(t->ndim, t->shape, fsdp_dtype_size(t->dtype), &nb) || (uint64_t)nb != t->nbytes ||
                t->offset > size || t->nbytes > size - t->offset)
                __builtin_trap();
            if (t->nbytes <= 4096) {
                double buf[4096];
                if (st_row_numel(t) * st_rows(t) <= 4096) st_read(r, t, buf, FSDP_DT_F64, &err);
            }
        }
        st_close(r);
    }
    close(fd);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_safetensors)
