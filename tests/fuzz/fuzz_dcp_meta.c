/* Fuzz the DCP .metadata loader (pickle -> catalogue with chunk validation), as a global
 * `.metadata` and as one rank-local `__<r>.metadata` merged with itself (the merge's
 * de-duplication and tiling check). What it accepts must hold the invariants the readers rely on
 * (checked here: a violation traps): sizes whose element and byte counts fit int64, non-empty
 * chunks inside the tensor and no larger than their storage record, chunk volumes adding up to the
 * tensor's element count. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/dcp_chunks.h"
#include "runtime/checked.h"
#include "tests/fuzz/fuzz.h"

static void check_invariants(const dcp_item *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const dcp_item *x = &items[i];
        if (!x->is_tensor) continue;
        int64_t numel, nbytes, covered = 0;
        size_t esz = fsdp_dtype_size(x->dtype);
        if (chk_numel(x->ndim, x->shape, &numel) || chk_nbytes(numel, esz, &nbytes)) __builtin_trap();
        for (size_t k = 0; k < x->n_chunks; k++) {
            const dcp_chunk *c = &x->chunks[k];
            int64_t v, b;
            if (chk_numel(x->ndim, c->sizes, &v)) __builtin_trap();
            if (v == 0) continue;
            for (int d = 0; d < x->ndim; d++)
                if (c->offsets[d] < 0 || c->offsets[d] > x->shape[d] - c->sizes[d]) __builtin_trap();
            if (chk_nbytes(v, esz, &b) || (uint64_t)b > c->where.length || chk_add_i64(covered, v, &covered))
                __builtin_trap();
        }
        if (covered != numel) __builtin_trap();
    }
}

/* The file as two ranks' metadata: chunks listed twice are kept once; the merge must tile. */
static void merge_with_itself(const uint8_t *data, size_t size) {
    dcp_item *items;
    size_t n;
    char ver[32];
    fsdp_err err;
    if (dcp_parse_metadata_ex(data, size, "fuzz", 0, &items, &n, ver, sizeof ver, &err)) return;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        dcp_item *x = &items[i];
        if (!x->is_tensor) continue;
        dcp_chunk *twice = malloc((2 * x->n_chunks + 1) * sizeof *twice);
        if (!twice) {
            ok = 0;
            break;
        }
        memcpy(twice, x->chunks, x->n_chunks * sizeof *twice);
        memcpy(twice + x->n_chunks, x->chunks, x->n_chunks * sizeof *twice);
        free(x->chunks);
        x->chunks = twice;
        x->n_chunks *= 2;
        ok = dcp_chunks_dedup(x, &err) == 0 && dcp_check_tiling("fuzz", x, &err) == 0;
    }
    if (ok) check_invariants(items, n);
    dcp_items_free(items, n);
}

int fsdp_fuzz_dcp_meta(const uint8_t *data, size_t size) {
    dcp_item *items;
    size_t n;
    char ver[32];
    fsdp_err err;
    if (dcp_parse_metadata(data, size, "fuzz", &items, &n, ver, sizeof ver, &err) == 0) {
        check_invariants(items, n);
        dcp_items_free(items, n);
    }
    merge_with_itself(data, size);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_dcp_meta)
