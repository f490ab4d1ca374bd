/* A stage's `with:` map checked against its declared schema, defaults filled (pipeline/schema.h). */
#include "pipeline/schema.h"

#include <stdio.h>
#include <string.h>

#include "pipeline/errlist.h"
#include "pipeline/yaml_load.h"
#include "runtime/nearest.h"

const char *schema_type_name(fsdp_param_type t) {
    switch (t) {
    case FSDP_T_STRING: return "string";
    case FSDP_T_INT: return "int";
    case FSDP_T_FLOAT: return "float";
    case FSDP_T_BOOL: return "bool";
    case FSDP_T_LIST: return "list";
    case FSDP_T_MAP: return "map";
    }
    return "?";
}

static const char *kind_name(const fsdp_value *v) {
    switch (fsdp_value_type(v)) {
    case FSDP_V_NULL: return "null";
    case FSDP_V_SCALAR: return "a scalar";
    case FSDP_V_LIST: return "a list";
    case FSDP_V_MAP: return "a map";
    }
    return "?";
}

static int check_type(const char *label, const fsdp_param_spec *p, const fsdp_value *v, fsdp_err *err) {
    int64_t i;
    double f;
    int b;
    int ok;
    switch (p->type) {
    case FSDP_T_STRING: ok = fsdp_value_type(v) == FSDP_V_SCALAR; break;
    case FSDP_T_INT: ok = fsdp_value_int(v, &i) == 0; break;
    case FSDP_T_FLOAT: ok = fsdp_value_float(v, &f) == 0; break;
    case FSDP_T_BOOL: ok = fsdp_value_bool(v, &b) == 0; break;
    case FSDP_T_LIST: ok = fsdp_value_type(v) == FSDP_V_LIST; break;
    case FSDP_T_MAP: ok = fsdp_value_type(v) == FSDP_V_MAP; break;
    default: ok = 0;
    }
    if (!ok) {
        const char *t = fsdp_value_text(v);
        if (t)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: parameter '%s' expects %s, got '%s'", label, p->name,
                               schema_type_name(p->type), t);
        return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: parameter '%s' expects %s, got %s", label, p->name,
                           schema_type_name(p->type), kind_name(v));
    }
    if (p->choices && p->type == FSDP_T_STRING) {
        const char *t = fsdp_value_text(v);
        char list[512] = "";
        size_t off = 0;
        for (const char *const *c = p->choices; *c; c++) {
            if (!strcmp(*c, t)) return 0;
            off += (size_t)snprintf(list + off, off < sizeof list ? sizeof list - off : 0, "%s%s", off ? ", " : "", *c);
        }
        return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: parameter '%s' must be one of: %s (got '%s')", label,
                           p->name, list, t);
    }
    return 0;
}

/* Every error of the map is reported (one per line), not only the first. */
int schema_check_map(const char *label, const fsdp_param_spec *params, const fsdp_value *node_for_missing,
                     fsdp_value *with, fsdp_err *err) {
    errlist el;
    errlist_init(&el);
    fsdp_err e;
    for (size_t k = 0; k < with->n; k++) {
        const fsdp_param_spec *p = params;
        while (p && p->name && strcmp(p->name, with->keys[k])) p++;
        fsdp_err_clear(&e);
        if (!p || !p->name) {
            char known[1024] = "";
            size_t off = 0;
            for (const fsdp_param_spec *q = params; q && q->name && off < sizeof known; q++)
                off += (size_t)snprintf(known + off, sizeof known - off, "%s%s", off ? ", " : "", q->name);
            char hint[300];
            /* a key a --set placed is located in that argument (its start: the key), not in the recipe */
            const fsdp_value *item = with->items[k];
            int by_set = item && item->file && !strncmp(item->file, "--set '", 7);
            fsdp_err_set(&e, FSDP_E_INVALID, "%s:%d:%d: %s: unknown parameter '%s'%s (known: %s)",
                         by_set ? item->file : with->file, by_set ? 1 : with->key_line[k], by_set ? 1 : with->key_col[k],
                         label, with->keys[k], nearest_hint(with->keys[k], known, hint, sizeof hint),
                         off ? known : "none");
            errlist_add(&el, &e);
            continue;
        }
        if (fsdp_value_type(with->items[k]) == FSDP_V_NULL) continue; /* null = not given */
        if (check_type(label, p, with->items[k], &e)) errlist_add(&el, &e);
    }
    for (const fsdp_param_spec *p = params; p && p->name; p++) {
        long k = val_map_find(with, p->name);
        if (k >= 0 && fsdp_value_type(with->items[k]) != FSDP_V_NULL) continue;
        if (p->required) {
            fsdp_err_at(&e, FSDP_E_INVALID, node_for_missing, "%s: missing required parameter '%s' (%s%s%s)", label,
                        p->name, schema_type_name(p->type), p->help ? ": " : "", p->help ? p->help : "");
            errlist_add(&el, &e);
            continue;
        }
        if (!p->dflt) continue;
        fsdp_value *v;
        char where[160];
        snprintf(where, sizeof where, "default of %s", p->name);
        int rc = yaml_load_string(p->dflt, strlen(p->dflt), where, 0, 0, &v, err);
        if (rc) return rc;
        v->is_default = 1;
        if (val_map_set(with, p->name, v, with->line, with->col))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    return errlist_finish(&el, err);
}

int schema_check(const fsdp_stage_desc *d, const char *id, const fsdp_value *stage_node, fsdp_value *with,
                 fsdp_err *err) {
    char label[256];
    snprintf(label, sizeof label, "stage '%s' (%s)", id, d->name);
    int rc = schema_check_map(label, d->params, stage_node, with, err);
    if (rc) return rc;
    if (d->check) {
        fsdp_err e2;
        fsdp_err_clear(&e2);
        rc = d->check(with, &e2);
        if (rc || e2.code) {
            if (!e2.msg[0]) snprintf(e2.msg, sizeof e2.msg, "invalid parameters");
            return fsdp_err_set(err, FSDP_E_INVALID, "%s", e2.msg);
        }
    }
    return 0;
}
