/* Fuzz the safetensors header parser and validation (through a memory file). What it accepts
 * must hold the invariants the readers rely on (a violation traps): each tensor's byte count is
 * exactly dtype size x its element count (no overflow) and lies inside the file; and the one-pass
 * header reader must be no more lenient than Jansson: a header it accepts is a JSON object that
 * Jansson reads too (duplicate keys refused) with the same tensors and metadata. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "runtime/checked.h"
#include "tests/fuzz/fuzz.h"

static int same_tensor(const st_tensor_info *t, const json_t *v) {
    const json_t *sh = json_object_get(v, "shape");
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    if (!t || !dt || strcmp(dt, fsdp_dtype_st_name(t->dtype)) || json_array_size(sh) != (size_t)t->ndim) return 0;
    for (int d = 0; d < t->ndim; d++)
        if (json_integer_value(json_array_get(sh, (size_t)d)) != t->shape[d]) return 0;
    return 1;
}

/* The header of an accepted file (one file: data is the whole of it), read again by Jansson. */
static void check_like_jansson(const uint8_t *data, const st_reader *r) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
    json_error_t je;
    json_t *root = json_loadb((const char *)data + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root && strstr(je.text, "maximum parsing depth")) return; /* an ignored value nested 2048 deep */
    if (!root || !json_is_object(root)) __builtin_trap();
    const json_t *meta = json_object_get(root, "__metadata__");
    if (json_object_size(root) - (meta ? 1 : 0) != st_count(r) || json_object_size(meta) != st_metadata_count(r, 0))
        __builtin_trap();
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (v != meta && !same_tensor(st_find(r, k), v)) __builtin_trap();
    }
    json_object_foreach((json_t *)meta, k, v) {
        const char *mine = st_metadata_get(r, 0, k);
        if (!mine || strcmp(mine, json_string_value(v))) __builtin_trap();
    }
    json_decref(root);
}

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
        check_like_jansson(data, r);
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
