/* Recipe loading: includes, merging, overrides, variables, structure. */
#include "pipeline/recipe.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline/strmap.h"
#include "pipeline/yaml_load.h"
#include "runtime/nearest.h"

static const char *const TOP_KEYS[] = {"version", "name",    "description", "include", "vars",    "choices",
                                       "runtime", "model",   "data",        "plugins", "stages",  NULL};
static const char *const STAGE_KEYS[] = {"id", "uses", "after", "with", "description", NULL};


static int in_list(const char *const *list, const char *s) {
    for (; *list; list++)
        if (!strcmp(*list, s)) return 1;
    return 0;
}

int recipe_is_top_key(const char *key) { return in_list(TOP_KEYS, key); }

static void join_list(const char *const *list, char *buf, size_t cap);
void recipe_top_keys(char *buf, size_t cap) { join_list(TOP_KEYS, buf, cap); }

static void join_list(const char *const *list, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (; *list && off < cap; list++) off += (size_t)snprintf(buf + off, cap - off, "%s%s", off ? ", " : "", *list);
}

static int key_error(fsdp_err *err, const fsdp_value *map, size_t i, const char *fmt, const char *key) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, key);
    return fsdp_err_set(err, FSDP_E_INVALID, "%s:%d:%d: %s", map->file, map->key_line[i], map->key_col[i], msg);
}

/* A file whose top level is not a mapping holding at least one recipe key is refused as a whole, and
 * none of its text is quoted: it may be any file (`include: [/etc/shadow]`, a binary). */
static int check_is_recipe(const fsdp_value *root, const char *path, const fsdp_value *from_val, fsdp_err *err) {
    const char *kind = root->kind == FSDP_V_LIST ? "a list" : root->kind == FSDP_V_SCALAR ? "a scalar" : NULL;
    int known = 0;
    for (size_t i = 0; !kind && i < root->n && !known; i++) known = in_list(TOP_KEYS, root->keys[i]);
    if (!kind && (root->n == 0 || known)) return 0;
    if (!kind) kind = "a mapping without any recipe key";
    char keys[256];
    join_list(TOP_KEYS, keys, sizeof keys);
    if (from_val)
        return fsdp_err_at(err, FSDP_E_INVALID, from_val,
                           "include: %s:%d:%d: not a recipe (its top level is %s; expected a mapping of: %s)", path,
                           root->line, root->col, kind, keys);
    return fsdp_err_set(err, FSDP_E_INVALID, "%s:%d:%d: not a recipe (its top level is %s; expected a mapping of: %s)",
                        path, root->line, root->col, kind, keys);
}

static int check_top_keys(const fsdp_value *root, const char *path, const fsdp_value *from_val, fsdp_err *err) {
    int rc = check_is_recipe(root, path, from_val, err);
    for (size_t i = 0; !rc && i < root->n; i++) {
        if (!in_list(TOP_KEYS, root->keys[i])) {
            char known[256];
            join_list(TOP_KEYS, known, sizeof known);
            char fmt[700], hint[300];
            snprintf(fmt, sizeof fmt, "unknown top-level key '%%s'%s (expected one of: %s)",
                     nearest_hint(root->keys[i], known, hint, sizeof hint), known);
            return key_error(err, root, i, fmt, root->keys[i]);
        }
    }
    return rc;
}

/* Include paths are relative to the including file's directory; when no such file exists
 * there, relative to the working directory (so `include: [recipes/common/x.yaml]` works
 * from the project root too). */
static int resolve_include(const char *from, const char *inc, char *out, size_t cap) {
    if (inc[0] == '/') {
        snprintf(out, cap, "%s", inc);
        return 0;
    }
    char *dup = strdup(from);
    if (!dup) return -1;
    snprintf(out, cap, "%s/%s", dirname(dup), inc);
    free(dup);
    struct stat st;
    if (stat(out, &st) == 0) return 0;
    if (stat(inc, &st) == 0) snprintf(out, cap, "%s", inc);
    return 0;
}

/* What the loading of one recipe has used up: the chain of files being included (for cycles), the
 * files loaded through includes, and the value budget of the whole tree. */
typedef struct {
    const char *stack[RECIPE_MAX_INCLUDE_DEPTH + 1];
    size_t loads;
    val_budget *budget;
} include_state;

static int include_cycle(const include_state *st, int from, int depth, const char *real, const fsdp_value *at,
                         fsdp_err *err) {
    char chain[2048];
    size_t off = 0;
    for (int j = from; j < depth && off < sizeof chain; j++)
        off += (size_t)snprintf(chain + off, sizeof chain - off, "%s -> ", st->stack[j]);
    if (off < sizeof chain) snprintf(chain + off, sizeof chain - off, "%s", real);
    return fsdp_err_at(err, FSDP_E_INVALID, at, "include cycle: %s (the file refers to itself through its includes)",
                       chain);
}

static int load_tree(const char *path, const fsdp_value *from_val, include_state *st, int depth, fsdp_value **out,
                     fsdp_err *err);

/* Loads the files `include:` names (relative to `path`) and merges them in order into *base. */
static int load_includes(const char *path, const fsdp_value *inc, include_state *st, int depth, fsdp_value **base,
                         fsdp_err *err) {
    size_t n = inc->kind == FSDP_V_LIST ? inc->n : 1;
    for (size_t i = 0; i < n; i++) {
        const fsdp_value *item = inc->kind == FSDP_V_LIST ? inc->items[i] : inc;
        const char *p = fsdp_value_text(item);
        if (!p) return fsdp_err_at(err, FSDP_E_INVALID, item, "include: expected a file path or a list of paths");
        char resolved[PATH_MAX];
        if (resolve_include(path, p, resolved, sizeof resolved)) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        fsdp_value *sub;
        int rc = load_tree(resolved, item, st, depth + 1, &sub, err);
        if (rc) return rc;
        *base = *base ? recipe_merge(*base, sub) : sub;
    }
    return 0;
}

static int load_tree(const char *path, const fsdp_value *from_val, include_state *st, int depth, fsdp_value **out,
                     fsdp_err *err) {
    *out = NULL;
    char real[PATH_MAX];
    if (!realpath(path, real)) {
        if (from_val)
            return fsdp_err_at(err, FSDP_E_INVALID, from_val, "cannot include '%s': %s", path, strerror(errno));
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open recipe: %s", path, strerror(errno));
    }
    for (int i = 0; i < depth; i++)
        if (!strcmp(st->stack[i], real)) return include_cycle(st, i, depth, real, from_val, err);
    if (depth > RECIPE_MAX_INCLUDE_DEPTH)
        return fsdp_err_at(err, FSDP_E_INVALID, from_val, "includes nested deeper than %d (including '%s')",
                           RECIPE_MAX_INCLUDE_DEPTH, fsdp_value_text(from_val));
    if (depth > 0 && ++st->loads > RECIPE_MAX_INCLUDE_LOADS)
        return fsdp_err_at(err, FSDP_E_INVALID, from_val,
                           "the recipe's includes load more than %d files in all (each `include:` entry loads its "
                           "file again, with everything that file includes)",
                           RECIPE_MAX_INCLUDE_LOADS);
    fsdp_value *tree;
    int rc = yaml_load_file(path, st->budget, &tree, err);
    if (rc) return rc;
    if ((rc = check_top_keys(tree, path, from_val, err))) {
        val_free(tree);
        return rc;
    }
    const fsdp_value *inc = fsdp_value_get(tree, "include");
    if (!inc || fsdp_value_type(inc) == FSDP_V_NULL) {
        val_map_remove(tree, "include");
        *out = tree;
        return 0;
    }
    st->stack[depth] = real;
    fsdp_value *base = NULL;
    rc = load_includes(path, inc, st, depth, &base, err);
    if (rc) {
        val_free(base);
        val_free(tree);
        return rc;
    }
    val_map_remove(tree, "include");
    *out = base ? recipe_merge(base, tree) : tree;
    return 0;
}

/* ---- structure ------------------------------------------------------------------ */

static int expect_kind(const fsdp_value *root, const char *key, fsdp_value_kind kind, const char *what,
                       fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(root, key);
    if (!v || fsdp_value_type(v) == FSDP_V_NULL) return 0;
    if (v->kind != kind) return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: expected %s", key, what);
    return 0;
}

/* Stage i of the list: keys, id (unique: ids maps each id to its stage), uses, with, after. */
static int build_stage(recipe *r, fsdp_value *stages, size_t i, strmap *ids, fsdp_err *err) {
    fsdp_value *st = stages->items[i];
    recipe_stage *rs = &r->stages[i];
    rs->index = i;
    rs->node = st;
    if (st->kind != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, st, "stages[%zu]: expected a map with id, uses, after, with", i);
    for (size_t k = 0; k < st->n; k++) {
        if (!in_list(STAGE_KEYS, st->keys[k]))
            return key_error(err, st, k, "unknown stage key '%s' (expected one of: id, uses, after, with, description)",
                             st->keys[k]);
    }
    const fsdp_value *id = fsdp_value_get(st, "id");
    if (!id) return fsdp_err_at(err, FSDP_E_INVALID, st, "stages[%zu]: missing `id`", i);
    if (!fsdp_value_text(id) || !*fsdp_value_text(id))
        return fsdp_err_at(err, FSDP_E_INVALID, id, "stages[%zu]: `id` must be a non-empty string", i);
    rs->id = id->text;
    size_t j;
    if (strmap_get(ids, rs->id, &j)) { /* recorded; the reading goes on, so that the other errors come too */
        fsdp_err *nd = realloc(r->defects, (r->n_defects + 1) * sizeof *nd);
        if (!nd) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        r->defects = nd;
        fsdp_err_at(&r->defects[r->n_defects++], FSDP_E_INVALID, id, "duplicate stage id '%s' (first used at line %d)",
                    rs->id, r->stages[j].node->line);
    } else if (strmap_put(ids, rs->id, i)) {
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    const fsdp_value *uses = fsdp_value_get(st, "uses");
    if (!uses) return fsdp_err_at(err, FSDP_E_INVALID, st, "stage '%s': missing `uses` (the stage to run)", rs->id);
    if (!fsdp_value_text(uses))
        return fsdp_err_at(err, FSDP_E_INVALID, uses, "stage '%s': `uses` must be a stage name", rs->id);
    rs->uses = uses->text;
    rs->uses_node = uses;
    fsdp_value *with = val_get_mut(st, "with");
    if (!with || fsdp_value_type(with) == FSDP_V_NULL) {
        fsdp_value *m = val_new(FSDP_V_MAP, st->file, st->line, st->col);
        if (!m || val_map_set(st, "with", m, st->line, st->col))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        with = val_get_mut(st, "with");
    } else if (with->kind != FSDP_V_MAP) {
        return fsdp_err_at(err, FSDP_E_INVALID, with, "stage '%s': `with` must be a map of parameters", rs->id);
    }
    rs->with = with;
    const fsdp_value *after = fsdp_value_get(st, "after");
    rs->after_node = after;
    if (!after) {
        if (i > 0) {
            rs->after = calloc(1, sizeof *rs->after);
            if (!rs->after) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            rs->after[0] = r->stages[i - 1].id;
            rs->n_after = 1;
        }
        return 0;
    }
    size_t n = after->kind == FSDP_V_LIST ? after->n : (fsdp_value_type(after) == FSDP_V_NULL ? 0 : 1);
    rs->after = calloc(n ? n : 1, sizeof *rs->after);
    rs->after_vals = calloc(n ? n : 1, sizeof *rs->after_vals);
    if (!rs->after || !rs->after_vals) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < n; k++) {
        const fsdp_value *a = after->kind == FSDP_V_LIST ? after->items[k] : after;
        if (!fsdp_value_text(a))
            return fsdp_err_at(err, FSDP_E_INVALID, a, "stage '%s': `after` must list stage ids", rs->id);
        rs->after[k] = a->text;
        rs->after_vals[k] = a;
    }
    rs->n_after = n;
    return 0;
}

static int build_stages(recipe *r, fsdp_err *err) {
    fsdp_value *stages = val_get_mut(r->root, "stages");
    if (!stages || fsdp_value_type(stages) == FSDP_V_NULL)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s:1:1: the recipe has no `stages:` list", r->path);
    if (stages->kind != FSDP_V_LIST)
        return fsdp_err_at(err, FSDP_E_INVALID, stages, "stages: expected a list of {id, uses, after, with}");
    if (stages->n == 0) return fsdp_err_at(err, FSDP_E_INVALID, stages, "stages: the list is empty");
    r->stages = calloc(stages->n, sizeof *r->stages);
    if (!r->stages) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    r->n_stages = stages->n;
    strmap ids;
    strmap_init(&ids);
    int rc = 0;
    for (size_t i = 0; i < stages->n && !rc; i++) rc = build_stage(r, stages, i, &ids, err);
    strmap_free(&ids);
    return rc;
}

static int check_structure(recipe *r, fsdp_err *err) {
    const fsdp_value *ver = fsdp_value_get(r->root, "version");
    if (ver && fsdp_value_type(ver) != FSDP_V_NULL) {
        int64_t v;
        if (fsdp_value_int(ver, &v) || v != 1)
            return fsdp_err_at(err, FSDP_E_INVALID, ver, "version: expected 1 (the only recipe format version)");
    }
    const fsdp_value *name = fsdp_value_get(r->root, "name");
    if (name && fsdp_value_type(name) != FSDP_V_NULL && !fsdp_value_text(name))
        return fsdp_err_at(err, FSDP_E_INVALID, name, "name: expected a string");
    int rc;
    if ((rc = expect_kind(r->root, "runtime", FSDP_V_MAP, "a map (device, seed, threads)", err))) return rc;
    if ((rc = expect_kind(r->root, "model", FSDP_V_MAP, "a map (arch, preset, ...)", err))) return rc;
    if ((rc = expect_kind(r->root, "data", FSDP_V_MAP, "a map (kind, path, batch_size, seq_len, ...)", err))) return rc;
    if ((rc = expect_kind(r->root, "plugins", FSDP_V_LIST, "a list of shared-object paths", err))) return rc;
    const char *nm = fsdp_value_text(name);
    if (!nm) {
        /* default name: the file's base name without extension */
        const char *b = strrchr(r->path, '/');
        b = b ? b + 1 : r->path;
        r->name = strdup(b);
        if (r->name) {
            char *dot = strrchr(r->name, '.');
            if (dot && dot != r->name) *dot = '\0';
        }
    } else {
        r->name = strdup(nm);
    }
    if (!r->name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    const fsdp_value *plugins = fsdp_value_get(r->root, "plugins");
    size_t np = fsdp_value_size(plugins);
    if (np) {
        r->plugins = calloc(np, sizeof *r->plugins);
        r->plugin_vals = calloc(np, sizeof *r->plugin_vals);
        if (!r->plugins || !r->plugin_vals) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        for (size_t i = 0; i < np; i++) {
            const fsdp_value *p = fsdp_value_item(plugins, i);
            const char *t = fsdp_value_text(p);
            if (!t || !*t) return fsdp_err_at(err, FSDP_E_INVALID, p, "plugins: expected a shared-object path");
            /* relative to the directory of the file that names it, else to the working directory */
            struct stat st;
            char buf[PATH_MAX];
            snprintf(buf, sizeof buf, "%s", t);
            if (t[0] != '/' && p->file && strncmp(p->file, "--set", 5)) {
                char *dup = strdup(p->file), cand[PATH_MAX];
                if (!dup) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                snprintf(cand, sizeof cand, "%s/%s", dirname(dup), t);
                free(dup);
                if (stat(cand, &st) == 0) snprintf(buf, sizeof buf, "%s", cand);
            }
            r->plugins[i] = strdup(buf);
            if (!r->plugins[i]) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            r->plugin_vals[i] = p;
            r->n_plugins = i + 1;
        }
    }
    return build_stages(r, err);
}

int recipe_load(const char *path, recipe_override *ovr, size_t n_ovr, recipe **out, fsdp_err *err) {
    *out = NULL;
    recipe *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    val_budget budget = {0, 0};
    include_state st = {{0}, 0, &budget};
    int rc = load_tree(path, NULL, &st, 0, &r->root, err);
    for (size_t i = 0; !rc && i < n_ovr; i++) {
        rc = recipe_apply_override(r->root, ovr[i].arg, err);
        if (rc == 0) ovr[i].applied = 1;
        else if (rc == 1) rc = 0;
    }
    /* `when:` sees the final tree; its text as written names a removed stage */
    recipe_when_texts wt = {0};
    if (!rc) rc = recipe_when_capture(r->root, &wt, err);
    if (!rc) rc = recipe_substitute_vars(r->root, &budget, err);
    if (!rc) rc = recipe_check_choices(r->root, err);
    if (!rc) rc = recipe_apply_when(r, &wt, err);
    recipe_when_texts_free(&wt);
    if (!rc) rc = check_structure(r, err);
    if (!rc) rc = recipe_resolve_paths(r, err);
    if (rc) {
        recipe_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void recipe_free(recipe *r) {
    if (!r) return;
    free(r->defects);
    for (size_t i = 0; i < r->n_stages; i++) {
        free(r->stages[i].after);
        free(r->stages[i].after_vals);
    }
    free(r->stages);
    for (size_t i = 0; i < r->n_plugins; i++) free(r->plugins[i]);
    free(r->plugins);
    free(r->plugin_vals);
    for (size_t i = 0; i < r->n_skipped; i++) {
        free(r->skipped[i].id);
        free(r->skipped[i].uses);
        free(r->skipped[i].when);
    }
    free(r->skipped);
    val_free(r->root);
    free(r->path);
    free(r->name);
    free(r);
}
