/* Fuzz the `model:` section of a recipe (model/mt_spec.h): the forms and their keys, the table syntax
 * (brace names, shapes, dtypes, init rules, like/as), dims and their expressions, parts and their
 * conflicts, the arch form. The input is YAML whose `model:` (or the whole document) is built into a
 * table. Inputs naming files (from:, table:, {config: ...}) are skipped: the harness stays off the file
 * system. */
#include <string.h>

#include "decoder/decoder_table.h"
#include "model/mt_spec.h"
#include "pipeline/yaml_load.h"
#include "tests/fuzz/fuzz.h"

/* 1 when a map anywhere in v has a key that reads a file. */
static int names_files(const fsdp_value *v, int depth) {
    if (depth > 64) return 1;
    for (size_t i = 0; i < fsdp_value_size(v); i++) {
        if (fsdp_value_type(v) == FSDP_V_MAP) {
            const char *k = fsdp_value_key(v, i);
            if (!strcmp(k, "from") || !strcmp(k, "table") || !strcmp(k, "config")) return 1;
        }
        if (names_files(fsdp_value_item(v, i), depth + 1)) return 1;
    }
    return 0;
}

int fsdp_fuzz_model(const uint8_t *data, size_t size) {
    fsdp_value *root;
    fsdp_err err;
    if (yaml_load_string((const char *)data, size, "fuzz.yaml", 0, 0, &root, &err)) return 0;
    const fsdp_value *model = fsdp_value_get(root, "model");
    if (!model) model = root;
    if (!names_files(model, 0)) {
        mt_table t;
        mt_spec_opts o = {1, &decoder_table_arch};
        if (mt_spec_build(model, &o, &t, &err) == 0) {
            (void)mt_total(&t);
            (void)mt_shard_numel(&t, 3);
            mt_free(&t);
        }
    }
    val_free(root);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_model)
