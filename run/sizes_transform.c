/* Static check of `transform` ops: a target glob that matches no parameter of the model. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "run/sizes.h"

/* Whether any parameter of t matches the glob (or any glob of the list) in keys. */
static int any_match(const mt_table *t, const fsdp_value *keys) {
    for (size_t i = 0; i < t->n; i++) {
        const char *name = t->p[i].name;
        if (fsdp_value_type(keys) == FSDP_V_SCALAR) {
            const char *g = fsdp_value_text(keys);
            if (g && nmap_glob_match(g, name, NULL) >= 0) return 1;
            continue;
        }
        for (size_t k = 0; k < fsdp_value_size(keys); k++) {
            const char *g = fsdp_value_text(fsdp_value_item(keys, k));
            if (g && nmap_glob_match(g, name, NULL) >= 0) return 1;
        }
    }
    return 0;
}

static void check_ops(const recipe_stage *s, const mt_table *t, errlist *el) {
    const fsdp_value *ops = fsdp_value_get(s->with, "ops");
    for (size_t i = 0; i < fsdp_value_size(ops); i++) {
        const fsdp_value *op = fsdp_value_item(ops, i);
        if (fsdp_value_type(op) != FSDP_V_MAP || fsdp_value_size(op) != 1) continue; /* the stage's own check */
        const char *n = fsdp_value_key(op, 0);
        const fsdp_value *b = fsdp_value_item(op, 0);
        const fsdp_value *keys = !strcmp(n, "copy") ? fsdp_value_get(b, "to")
                                 : !strcmp(n, "scale") || !strcmp(n, "fill") || !strcmp(n, "cast")
                                     ? fsdp_value_get(b, "keys")
                                     : NULL;
        if (!keys || any_match(t, keys)) continue;
        fsdp_err e;
        fsdp_err_at(&e, FSDP_E_INVALID, keys,
                    "stage '%s' (transform): %s %s matches no parameter of the model (%zu parameters, e.g. %s)", s->id,
                    n, !strcmp(n, "copy") ? "target" : "keys", t->n, t->n ? t->p[0].name : "none");
        errlist_add(el, &e);
    }
}

void sizes_check_transform(const recipe *r, const mt_table *t, errlist *el) {
    if (t->incomplete) return; /* a source of the table cannot be read yet */
    for (size_t i = 0; i < r->n_stages; i++)
        if (!strcmp(r->stages[i].uses, "transform") && r->stages[i].with) check_ops(&r->stages[i], t, el);
}
