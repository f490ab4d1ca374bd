/* Fuzz the DCP .metadata loader (pickle -> catalogue with chunk validation). */
#include "ckpt/dcp.h"
#include "tests/fuzz/fuzz.h"

int fsdp_fuzz_dcp_meta(const uint8_t *data, size_t size) {
    dcp_item *items;
    size_t n;
    char ver[32];
    fsdp_err err;
    if (dcp_parse_metadata(data, size, "fuzz", &items, &n, ver, sizeof ver, &err) == 0) dcp_items_free(items, n);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_dcp_meta)
