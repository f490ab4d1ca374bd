/* Recipe loading: YAML, includes (merged first, later keys win, cycles detected),
 * --set overrides and ${var} substitution, then the structural checks of every key. */
#ifndef FSDP_PIPELINE_RECIPE_H
#define FSDP_PIPELINE_RECIPE_H

#include <stddef.h>

#include "fsdp/error.h"
#include "fsdp/stage.h"
#include "pipeline/value_impl.h"

typedef struct recipe_stage {
    const char *id;               /* points into the recipe tree */
    const char *uses;
    const fsdp_value *node;       /* the stage's map */
    const fsdp_value *uses_node;
    const fsdp_value *after_node; /* NULL: implicitly after the previous stage in the file */
    const char **after;           /* resolved dependency ids */
    const fsdp_value **after_vals;/* their values (for error positions); NULL for implicit */
    size_t n_after;
    fsdp_value *with;             /* the stage's `with:` map (owned by the tree) */
    const fsdp_stage_desc *desc;  /* resolved by the planner */
    size_t index;                 /* position in the file */
} recipe_stage;

/* A stage that a false `when:` removed from the recipe (it does not run). */
typedef struct recipe_skipped {
    char *id;   /* "stages[N]" when it has none */
    char *uses; /* "?" when it has none */
    char *when; /* the condition as written (before substitution), else as evaluated */
} recipe_skipped;

typedef struct recipe {
    char *path;
    char *name;
    fsdp_value *root;             /* merged, overridden, substituted tree */
    recipe_stage *stages;
    size_t n_stages;
    char **plugins;               /* plugin paths as resolved */
    const fsdp_value **plugin_vals;
    size_t n_plugins;
    recipe_skipped *skipped;      /* stages removed by `when:`, in file order */
    size_t n_skipped;
    /* Errors found while reading the stages that do not stop the reading (a duplicate stage id): the caller
     * reports them with what its other checks find, and does not run the recipe. */
    fsdp_err *defects;
    size_t n_defects;
} recipe;

/* One --set override: "a.b.c=value". */
typedef struct recipe_override {
    const char *arg;  /* the whole argument, for messages */
    int applied;      /* set when it applied to at least one recipe */
} recipe_override;

int recipe_load(const char *path, recipe_override *ovr, size_t n_ovr, recipe **out, fsdp_err *err);
void recipe_free(recipe *r);

/* Whether key is one of the recipe's top-level keys (version, name, ..., stages). */
int recipe_is_top_key(const char *key);
/* The top-level keys a recipe may have, as "version, name, ..." (for messages). */
void recipe_top_keys(char *buf, size_t cap);
/* Applies one override to a recipe tree (pipeline/recipe_set.c): the value is parsed as YAML only
 * when it is a flow collection, a quoted scalar or a plain scalar YAML reads back whole; anything
 * else (a newline, a ` #` comment, ...) is kept literally as a string. Returns 0 when applied, 1
 * when it names a stage id this recipe does not have (not an error by itself when chaining), else
 * an error. */
int recipe_apply_override(fsdp_value *root, const char *arg, fsdp_err *err);
/* Bounds of one recipe's loading: include nesting and the number of files its includes load in all
 * (a fan-out of includes multiplies), ${var} nesting, the length of one substituted value and the
 * bytes all substitutions produce. */
#define RECIPE_MAX_INCLUDE_DEPTH 16
#define RECIPE_MAX_INCLUDE_LOADS 256
#define VARS_MAX_DEPTH 16
#define VARS_MAX_TEXT (1 << 20)
#define VARS_MAX_WORK (64 << 20)

/* Substitutes ${var} everywhere (pipeline/recipe_vars.c); variables may reference each other (each
 * is resolved once, in place in `vars`). Copies of list/map variables count against budget
 * (NULL: a fresh one). */
int recipe_substitute_vars(fsdp_value *root, val_budget *budget, fsdp_err *err);

/* Merge of two recipe trees (pipeline/recipe_merge.c); takes ownership of both, returns the merged
 * one: `stages` merge by id (same id: deep-merged in place; new ids appended), `plugins` concatenate
 * without duplicates, everything else deep-merges (later keys win). */
fsdp_value *recipe_merge(fsdp_value *dst, fsdp_value *src);
/* The `id` text of a stage map, or NULL. */
const char *recipe_stage_id(const fsdp_value *st);

/* ---- `when:` and `choices:` (pipeline/recipe_cond.c, recipe_when.c, recipe_choices.c) ---- */

/* Whether two scalar texts are equal as `when:` and `choices:` compare them: as booleans when both read
 * as booleans (fsdp_value_bool), as numbers when both are numbers, else as text. */
int recipe_values_equal(const char *a, const char *b);
/* Evaluates a `when:` value: a boolean, or a condition text (`A == B`, `A != B`, `A in [x, y]`, `not`,
 * `and`, `or`, parentheses). `orig` (may be NULL) is its text before substitution, for messages. */
int recipe_when_eval(const fsdp_value *v, const char *orig, int *out, fsdp_err *err);

/* The `when:` texts of the tree as written, taken before ${var} substitution (to name a removed
 * stage's condition as written). */
typedef struct recipe_when_text {
    const fsdp_value *node;
    char *text;
    int line, col; /* the node's position when taken (an address freed and reused does not match) */
} recipe_when_text;
typedef struct recipe_when_texts {
    recipe_when_text *items; /* sorted by node address */
    size_t n, cap;
} recipe_when_texts;
int recipe_when_capture(const fsdp_value *root, recipe_when_texts *wt, fsdp_err *err);
void recipe_when_texts_free(recipe_when_texts *wt);
/* Applies every `when:` of r's final tree: a list item (a map) whose `when:` is false leaves its list,
 * one whose `when:` is true loses the key. A removed stage's dependants inherit its dependencies
 * (r->skipped lists it). */
int recipe_apply_when(recipe *r, const recipe_when_texts *wt, fsdp_err *err);
/* Checks `choices:` (var -> allowed values) against the substituted `vars:`: every error, one per line. */
int recipe_check_choices(const fsdp_value *root, fsdp_err *err);

/* Relative input paths (data, checkpoints to load, from_hf, from) rewritten to the directory of the file
 * that wrote them when something is there (recipe_paths.c; the rule is in README, "Relative paths"). */
int recipe_resolve_paths(recipe *r, fsdp_err *err);
/* 1 when a stage of r writes path or a directory above it (a save's path, save_path, reshard-dcp's dst,
 * metrics), as written. */
int recipe_writes(const recipe *r, const char *path);

#endif
