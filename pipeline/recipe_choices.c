/* `choices:` (var -> its allowed values), checked against the final, substituted `vars:` (a `--set
 * vars.X=...` included): every violation and every bad entry, one line each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/errlist.h"
#include "pipeline/recipe.h"

/* The text a value compares with: a scalar's, "" for null; NULL for a list or a map. */
static const char *choice_text(const fsdp_value *v) {
    fsdp_value_kind k = fsdp_value_type(v);
    return k == FSDP_V_SCALAR ? v->text : k == FSDP_V_NULL ? "" : NULL;
}

static void check_entry(const fsdp_value *choices, size_t i, const fsdp_value *vars, errlist *el) {
    const char *name = choices->keys[i];
    const fsdp_value *allowed = choices->items[i];
    long k = val_map_find(vars, name);
    if (k < 0) {
        fsdp_err e;
        char known[512] = "";
        size_t off = 0;
        for (size_t q = 0; q < fsdp_value_size(vars) && off < sizeof known; q++)
            off += (size_t)snprintf(known + off, sizeof known - off, "%s%s", q ? ", " : "", vars->keys[q]);
        fsdp_err_set(&e, FSDP_E_INVALID, "%s:%d:%d: choices: '%s' is not a variable (defined in vars: %s)",
                     choices->file, choices->key_line[i], choices->key_col[i], name, off ? known : "none");
        errlist_add(el, &e);
        return;
    }
    int ok = allowed->kind == FSDP_V_LIST;
    for (size_t q = 0; ok && q < allowed->n; q++) ok = choice_text(allowed->items[q]) != NULL;
    if (!ok) {
        errlist_add_at(el, allowed, "choices.%s: expected a list of the allowed values (scalars), e.g. [a, b]", name);
        return;
    }
    const fsdp_value *v = vars->items[k];
    const char *t = choice_text(v);
    for (size_t q = 0; t && q < allowed->n; q++)
        if (recipe_values_equal(t, choice_text(allowed->items[q]))) return;
    char *is = t ? NULL : val_to_flow(v), *one_of = val_to_flow(allowed);
    errlist_add_at(el, v, "vars.%s is %s%.200s%s, not one of its choices %.300s (choices.%s at %s:%d:%d)", name,
                   t ? "'" : "", t ? t : is ? is : "?", t ? "'" : "", one_of ? one_of : "?", name, allowed->file,
                   allowed->line, allowed->col);
    free(is);
    free(one_of);
}

int recipe_check_choices(const fsdp_value *root, fsdp_err *err) {
    const fsdp_value *choices = fsdp_value_get(root, "choices");
    if (fsdp_value_type(choices) == FSDP_V_NULL) return 0;
    if (choices->kind != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, choices,
                           "choices: expected a map of variable: [allowed values] (e.g. {layout: [dcp, pr240]})");
    const fsdp_value *vars = fsdp_value_get(root, "vars");
    errlist el;
    errlist_init(&el);
    for (size_t i = 0; i < choices->n; i++) check_entry(choices, i, vars, &el);
    return errlist_finish(&el, err);
}
