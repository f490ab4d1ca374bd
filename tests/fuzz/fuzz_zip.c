/* Fuzz the zip reader and the torch.save tensor decoding on top of it. */
#include <stdlib.h>

#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
#include "tests/fuzz/fuzz.h"

int fsdp_fuzz_zip(const uint8_t *data, size_t size) {
    zip_reader z;
    fsdp_err err;
    if (zip_open_mem(&z, data, size, "fuzz", &err)) return 0;
    for (size_t i = 0; i < z.n; i++) {
        void *buf;
        size_t len;
        if (z.entries[i].size < 4096 && zip_read_all(&z, &z.entries[i], &buf, &len, &err) == 0) free(buf);
    }
    pkl_doc *doc;
    const pkl_obj *root;
    if (ts_load_pickle(&z, &doc, &root, &err) == 0) {
        ts_tensor t;
        if (ts_tensor_from_pickle(root, "fuzz", &t, &err) == 0) {
            int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
            int64_t n = 1;
            for (int d = 0; d < t.ndim; d++) n *= (len[d] = t.shape[d]);
            if (n > 0 && n < 4096) {
                double *dst = malloc((size_t)n * sizeof *dst);
                if (dst) ts_read_box(&z, &t, off, len, dst, FSDP_DT_F64, &err);
                free(dst);
            }
        }
        pkl_free(doc);
    }
    zip_close(&z);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_zip)
