/* recipe_paths (recipe.h): relative input paths resolved once, when the recipe is loaded.
 *
 * The rule (README "Relative paths"): a relative path that a stage reads (data, a checkpoint to load,
 * `from_hf`, `from`, transform's `load`; a model table and `plugins` follow it where they are read) resolves against the directory of the file that wrote it (the
 * recipe or the included file) when something is there, else against the working directory. A value
 * given with --set, or one whose text starts with a ${var} (or ${env:...}) given so, resolves against
 * the working directory only. Outputs (save paths, metrics) are the working directory's, and so is an
 * input at or under a path a stage of the recipe writes: it is found where the run writes it. */
#include <glob.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pipeline/recipe.h"
#include "pipeline/value_impl.h"

/* Stage parameters that name what a stage writes. */
static const char *const OUTPUT_KEYS[][2] = {
    {"save-dcp", "path"},         {"save-safetensors", "path"}, {"train-steps", "save_path"},
    {"reshard-dcp", "dst"},       {"train-steps", "metrics"},   {"eval", "metrics"},
};

/* 1 when text is out or lies beneath it ("out/latest", "out/step-10"). */
static int under(const char *text, const char *out) {
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    return n && !strncmp(text, out, n) && (text[n] == '\0' || text[n] == '/');
}

int recipe_writes(const recipe *r, const char *text) {
    for (size_t i = 0; i < r->n_stages; i++)
        for (size_t k = 0; k < sizeof OUTPUT_KEYS / sizeof OUTPUT_KEYS[0]; k++) {
            if (strcmp(r->stages[i].uses, OUTPUT_KEYS[k][0])) continue;
            const char *o = fsdp_value_text(fsdp_value_get(r->stages[i].with, OUTPUT_KEYS[k][1]));
            if (o && *o && under(text, o)) return 1;
        }
    return 0;
}

/* Something is at path: a file, a directory, a glob's match, or the directory of `DIR/latest`. */
static int present(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    if (strpbrk(path, "*?[")) {
        glob_t g;
        int rc = glob(path, 0, NULL, &g);
        globfree(&g);
        return rc == 0;
    }
    const char *slash = strrchr(path, '/');
    if (slash && !strcmp(slash + 1, "latest")) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
        return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    }
    return 0;
}

/* Rewrites v's text to the path beside its file when one is there. */
static int resolve_one(const recipe *r, fsdp_value *v, fsdp_err *err) {
    if (!v || v->kind != FSDP_V_SCALAR || !v->text || !*v->text || v->text[0] == '/' || v->cwd_only) return 0;
    if (!v->file || !strncmp(v->file, "--set", 5) || recipe_writes(r, v->text)) return 0;
    char *dup = strdup(v->file);
    if (!dup) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    char cand[PATH_MAX];
    const char *dir = dirname(dup);
    int fits = snprintf(cand, sizeof cand, "%s/%s", dir, v->text) < (int)sizeof cand;
    int same = !strcmp(dir, ".");
    free(dup);
    if (!fits || same || !present(cand)) return 0;
    return val_set_text(v, cand) ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : 0;
}

static int resolve_key(const recipe *r, fsdp_value *map, const char *key, fsdp_err *err) {
    return map && map->kind == FSDP_V_MAP ? resolve_one(r, val_get_mut(map, key), err) : 0;
}

static int resolve_model(const recipe *r, fsdp_value *model, fsdp_err *err) {
    static const char *const KEYS[] = {"from_hf", "from"};
    int rc = 0;
    for (size_t k = 0; k < 2 && !rc; k++) rc = resolve_key(r, model, KEYS[k], err);
    fsdp_value *parts = val_get_mut(model, "parts");
    for (size_t i = 0; !rc && parts && parts->kind == FSDP_V_LIST && i < parts->n; i++)
        rc = resolve_key(r, parts->items[i], "from", err);
    return rc;
}

/* transform's `ops: [{load: {path: ...}}, ...]`. */
static int resolve_transform(const recipe *r, fsdp_value *with, fsdp_err *err) {
    fsdp_value *ops = val_get_mut(with, "ops");
    int rc = 0;
    for (size_t i = 0; !rc && ops && ops->kind == FSDP_V_LIST && i < ops->n; i++)
        rc = resolve_key(r, val_get_mut(ops->items[i], "load"), "path", err);
    return rc;
}

/* data.tokenizer is a path unless it names the model's own ("model"). */
static int resolve_tokenizer(const recipe *r, fsdp_value *data, fsdp_err *err) {
    fsdp_value *t = val_get_mut(data, "tokenizer");
    if (!t || t->kind != FSDP_V_SCALAR || !fsdp_value_text(t) || !strcmp(fsdp_value_text(t), "model")) return 0;
    return resolve_key(r, data, "tokenizer", err);
}

int recipe_resolve_paths(recipe *r, fsdp_err *err) {
    fsdp_value *model = val_get_mut(r->root, "model");
    int rc = model && model->kind == FSDP_V_MAP ? resolve_model(r, model, err) : 0;
    if (!rc) rc = resolve_key(r, val_get_mut(r->root, "data"), "path", err);
    if (!rc) rc = resolve_tokenizer(r, val_get_mut(r->root, "data"), err);
    for (size_t i = 0; !rc && i < r->n_stages; i++) {
        recipe_stage *s = &r->stages[i];
        if (!s->with || s->with->kind != FSDP_V_MAP) continue;
        if (!strcmp(s->uses, "load-ckpt")) rc = resolve_key(r, s->with, "path", err);
        else if (!strcmp(s->uses, "reshard-dcp")) rc = resolve_key(r, s->with, "src", err);
        else if (!strcmp(s->uses, "transform")) rc = resolve_transform(r, s->with, err);
        if (!rc && (!strcmp(s->uses, "train-steps") || !strcmp(s->uses, "eval")))
            rc = resolve_key(r, val_get_mut(s->with, "eval_data"), "path", err);
        if (!rc && (!strcmp(s->uses, "train-steps") || !strcmp(s->uses, "eval")))
            rc = resolve_tokenizer(r, val_get_mut(s->with, "eval_data"), err);
    }
    return rc;
}
