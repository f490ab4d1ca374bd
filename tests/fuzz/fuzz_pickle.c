/* Fuzz the pickle reader (and the repr of whatever it builds). */
#include <stdlib.h>

#include "ckpt/pickle.h"
#include "tests/fuzz/fuzz.h"

int fsdp_fuzz_pickle(const uint8_t *data, size_t size) {
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    if (pkl_parse(data, size, "fuzz", &doc, &root, &err) == 0) {
        free(pkl_repr(root));
        pkl_free(doc);
    }
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_pickle)
