/* --set KEY=VALUE: the value (parsed as YAML or kept as written) and its place in the recipe tree.
 *
 * The value is parsed as YAML only when that cannot change what was typed: a flow collection
 * (`[..]`, `{..}`) or a quoted scalar (`"..."`, `'...'`) that spans the whole value, or a plain
 * scalar that YAML reads back whole (numbers, booleans, null, words, paths). Anything else is kept
 * literally as a string: a value holding a newline (YAML would fold it), one with a comment YAML
 * would cut (` #3`, `# x`, `[1] # one`), leading or trailing blanks YAML would trim, or text YAML
 * reads as something else (`a: b`, `- x`, `&a x`, `!!str x`, `@x`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/recipe.h"
#include "pipeline/yaml_load.h"
#include "runtime/nearest.h"

/* The value of a --set argument; `where` names the argument in positions, col0 is the value's
 * column offset in it (the key and '='). */
static int set_value(const char *text, const char *where, int col0, fsdp_value **out, fsdp_err *err) {
    *out = NULL;
    size_t len = strlen(text);
    int typed = text[0] == '[' || text[0] == '{' || text[0] == '"' || text[0] == '\'';
    if (len && !strpbrk(text, "\n\r")) {
        fsdp_err perr;
        fsdp_value *v;
        size_t end;
        int rc = yaml_load_value(text, len, where, col0, &v, &end, &perr);
        if (rc && typed) { /* a malformed flow collection or quoted string: report it, in the argument's one line */
            size_t wl = strlen(where);
            int line = 0, col = 0, at = 0;
            if (!strncmp(perr.msg, where, wl) && sscanf(perr.msg + wl, ":%d:%d:%n", &line, &col, &at) == 2 && at &&
                line > 1) /* the parser ran past the end of the value: point at its end */
                return fsdp_err_set(err, rc, "%s:1:%d:%s", where, col0 + (int)len + 1, perr.msg + wl + at);
            *err = perr;
            return rc;
        }
        int whole = !rc && (typed ? end == len : v->kind == FSDP_V_SCALAR && !v->quoted && !strcmp(v->text, text));
        if (whole) {
            *out = v;
            return 0;
        }
        if (!rc) val_free(v);
    }
    *out = val_scalar(text, 1, where, 1, col0 + 1);
    return *out ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
}

static int is_index(const char *s, size_t *out) {
    if (!*s) return 0;
    size_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        v = v * 10 + (size_t)(*p - '0');
    }
    *out = v;
    return 1;
}

/* Where one --set walks: the argument (for messages) and the value still to place (NULL once
 * placed or handed over). */
typedef struct {
    const char *arg;
    fsdp_value *val;
    fsdp_err *err;
} set_walk;

/* One step into a list by index or stage id; *cur moves to the item, or the value replaces the
 * item when `last`. Returns 0 (go on or *done), 1 (no stage with that id), or an error. */
static int step_list(set_walk *w, fsdp_value **cur, const char *part, int last, int *done) {
    fsdp_value *list = *cur;
    size_t idx;
    if (is_index(part, &idx)) {
        if (idx >= list->n)
            return fsdp_err_set(w->err, FSDP_E_INVALID, "--set %s: index %zu is out of range (the list has %zu items)",
                                w->arg, idx, list->n);
        if (last) {
            val_free(list->items[idx]);
            list->items[idx] = w->val;
            w->val = NULL;
            *done = 1;
            return 0;
        }
        *cur = list->items[idx];
        return 0;
    }
    fsdp_value *child = NULL;
    for (size_t i = 0; i < list->n && !child; i++) {
        const char *id = recipe_stage_id(list->items[i]);
        if (id && !strcmp(id, part)) child = list->items[i];
    }
    if (!child) return 1; /* no stage with that id here */
    if (last)
        return fsdp_err_set(w->err, FSDP_E_INVALID, "--set %s: cannot replace a whole stage; set its keys", w->arg);
    *cur = child;
    return 0;
}

/* One step into a map (a null scalar becomes an empty map); missing maps on the way are created. */
static int step_map(set_walk *w, fsdp_value **cur, const char *part, int last, int *done) {
    fsdp_value *map = *cur;
    if (map->kind != FSDP_V_MAP) {
        map->kind = FSDP_V_MAP;
        free(map->text);
        map->text = NULL;
    }
    if (last) {
        fsdp_value *v = w->val;
        w->val = NULL; /* val_map_set owns it, even when it fails */
        if (val_map_set(map, part, v, 1, 1)) return fsdp_err_set(w->err, FSDP_E_NOMEM, "out of memory");
        *done = 1;
        return 0;
    }
    fsdp_value *child = val_get_mut(map, part);
    if (!child) {
        child = val_new(FSDP_V_MAP, "--set", 1, 1);
        if (!child || val_map_set(map, part, child, 1, 1)) return fsdp_err_set(w->err, FSDP_E_NOMEM, "out of memory");
    }
    *cur = child;
    return 0;
}

/* Walks the dotted key (modified in place) from root and places w->val at its end. */
static int set_walk_key(set_walk *w, fsdp_value *root, char *key) {
    fsdp_value *cur = root;
    char *save = NULL;
    char *part = strtok_r(key, ".", &save);
    for (int depth = 0; part; depth++) {
        char *nextp = strtok_r(NULL, ".", &save);
        if (depth == 0 && !recipe_is_top_key(part)) {
            char known[256], hint[300];
            recipe_top_keys(known, sizeof known);
            return fsdp_err_set(w->err, FSDP_E_INVALID, "--set %s: unknown top-level key '%s'%s (expected one of: %s)",
                                w->arg, part, nearest_hint(part, known, hint, sizeof hint), known);
        }
        int rc, done = 0;
        if (cur->kind == FSDP_V_LIST) {
            rc = step_list(w, &cur, part, !nextp, &done);
        } else if (cur->kind == FSDP_V_MAP ||
                   (cur->kind == FSDP_V_SCALAR && val_text_is_null(cur->text) && !cur->quoted)) {
            rc = step_map(w, &cur, part, !nextp, &done);
        } else {
            return fsdp_err_set(w->err, FSDP_E_INVALID, "--set %s: '%s' is inside a scalar value (%s:%d:%d), not a map",
                                w->arg, part, cur->file, cur->line, cur->col);
        }
        if (rc || done) return rc;
        part = nextp;
    }
    return 0;
}

int recipe_apply_override(fsdp_value *root, const char *arg, fsdp_err *err) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return fsdp_err_set(err, FSDP_E_INVALID, "--set %s: expected KEY=VALUE (e.g. --set model.dim=128)", arg);
    size_t klen = (size_t)(eq - arg);
    char *key = strndup(arg, klen);
    if (!key) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    /* the value's positions name the --set argument: "--set 'KEY=VALUE':1:COL: ..." */
    char where[512];
    snprintf(where, sizeof where, "--set '%.480s'", arg);
    set_walk w = {arg, NULL, err};
    int rc = set_value(eq + 1, where, (int)klen + 1, &w.val, err);
    if (!rc) rc = set_walk_key(&w, root, key);
    val_free(w.val);
    free(key);
    return rc;
}
