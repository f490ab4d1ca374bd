/* Fuzz the recipe text path: YAML (anchors and aliases, the value budget), then ${var}
 * substitution (memoised resolution, cycles, nesting, length bounds), then the flow printing of
 * --dry-run. Environment references read the real environment: harmless here. */
#include <stdlib.h>

#include "pipeline/recipe.h"
#include "pipeline/yaml_load.h"
#include "tests/fuzz/fuzz.h"

int fsdp_fuzz_recipe(const uint8_t *data, size_t size) {
    fsdp_value *root;
    fsdp_err err;
    if (yaml_load_string((const char *)data, size, "fuzz.yaml", 0, 0, &root, &err)) return 0;
    if (root->kind == FSDP_V_MAP && recipe_substitute_vars(root, NULL, &err) == 0) free(val_to_flow(root));
    val_free(root);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_recipe)
