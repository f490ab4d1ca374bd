/* Fuzz the recipe text path: YAML (anchors and aliases, the value budget), then ${var}
 * substitution (memoised resolution, cycles, nesting, length bounds), `choices:`, `when:` (conditions,
 * the removal of list items and stages), then the flow printing of --dry-run. Environment references
 * read the real environment: harmless here. */
#include <stdlib.h>

#include "pipeline/recipe.h"
#include "pipeline/yaml_load.h"
#include "tests/fuzz/fuzz.h"

int fsdp_fuzz_recipe(const uint8_t *data, size_t size) {
    fsdp_value *root;
    fsdp_err err;
    if (yaml_load_string((const char *)data, size, "fuzz.yaml", 0, 0, &root, &err)) return 0;
    recipe *r = calloc(1, sizeof *r);
    recipe_when_texts wt = {0};
    if (!r || root->kind != FSDP_V_MAP || recipe_when_capture(root, &wt, &err)) {
        free(r);
        val_free(root);
        return 0;
    }
    r->root = root;
    if (recipe_substitute_vars(root, NULL, &err) == 0 && recipe_check_choices(root, &err) == 0 &&
        recipe_apply_when(r, &wt, &err) == 0)
        free(val_to_flow(root));
    recipe_when_texts_free(&wt);
    recipe_free(r);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_recipe)
