/* The table syntax (see mt_yaml.h). */
#include "model/mt_yaml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "model/mt_names.h"
#include "runtime/nearest.h"

/* Puts the position of v in front of the message already in err. */
static int at_value(fsdp_err *err, const fsdp_value *v) {
    char msg[FSDP_ERR_MSG_MAX - 256];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return fsdp_err_at(err, err->code ? err->code : FSDP_E_INVALID, v, "%s", msg);
}

int mt_yaml_init_rule(const fsdp_value *v, init_rule *out, fsdp_err *err) {
    const char *text = fsdp_value_text(v);
    if (!text) return fsdp_err_at(err, FSDP_E_INVALID, v, "model: init must be a rule such as normal(0, 0.02) or none");
    return init_rule_parse(text, out, err) ? at_value(err, v) : 0;
}

int mt_yaml_dtype(const fsdp_value *v, fsdp_dtype *out, fsdp_err *err) {
    *out = mt_dtype_from_name(fsdp_value_text(v));
    if (*out == FSDP_DT_INVALID)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: dtype '%s' (a parameter is f32, bf16 or f16)",
                           fsdp_value_text(v) ? fsdp_value_text(v) : "a list or map");
    return 0;
}

typedef struct entry {
    const fsdp_value *v;                       /* the entry map (positions) */
    const fsdp_value *shape, *dtype, *init, *like, *as, *unless, *trainable;
    int unless_declared;                       /* declare only the names no earlier entry or part declared */
    int frozen;                                /* trainable: false */
    const char *name;                          /* the name pattern (NULL for like entries) */
    const fsdp_value *name_at;                 /* its value, or the entry for a map key */
} entry;

/* An entry map; map_name: the name when params is a map (the key), else NULL. */
static int read_entry(const fsdp_value *v, const char *map_name, entry *e, fsdp_err *err) {
    memset(e, 0, sizeof *e);
    e->v = v;
    if (fsdp_value_type(v) != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: a parameter entry is a map {name, shape, dtype, init} or "
                           "{like, as, ...}");
    static const char *const keys[] = {"name", "shape", "dtype", "init", "like", "as", "unless_declared", "trainable", NULL};
    const fsdp_value *name = NULL;
    const fsdp_value **slots[] = {&name, &e->shape, &e->dtype, &e->init, &e->like, &e->as, &e->unless, &e->trainable};
    for (size_t i = 0; i < fsdp_value_size(v); i++) {
        const char *k = fsdp_value_key(v, i);
        int j = 0;
        while (keys[j] && strcmp(keys[j], k)) j++;
        static const char KNOWN[] = "name, shape, dtype, init, like, as, unless_declared, trainable";
        char hint[300];
        if (!keys[j])
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(v, i),
                               "model: unknown key '%s' in a parameter entry%s (%s)", k,
                               nearest_hint(k, KNOWN, hint, sizeof hint), KNOWN);
        *slots[j] = fsdp_value_item(v, i);
    }
    if (e->unless && fsdp_value_bool(e->unless, &e->unless_declared))
        return fsdp_err_at(err, FSDP_E_INVALID, e->unless, "model: unless_declared must be true or false");
    int on = 1;
    if (e->trainable && fsdp_value_bool(e->trainable, &on))
        return fsdp_err_at(err, FSDP_E_INVALID, e->trainable, "model: trainable must be true or false");
    e->frozen = !on;
    if (map_name && (name || e->like))
        return fsdp_err_at(err, FSDP_E_INVALID, name ? name : e->like,
                           "model: entry '%s' is named by its key; drop '%s'", map_name, name ? "name" : "like");
    const fsdp_value *txt[] = {name, e->like, e->as};
    for (int i = 0; i < 3; i++)
        if (txt[i] && fsdp_value_type(txt[i]) != FSDP_V_SCALAR)
            return fsdp_err_at(err, FSDP_E_INVALID, txt[i], "model: a parameter name must be text");
    e->name = map_name ? map_name : fsdp_value_text(name);
    e->name_at = map_name ? v : name;
    if (e->like && e->name)
        return fsdp_err_at(err, FSDP_E_INVALID, e->like, "model: an entry has either 'name' or 'like', not both");
    if (e->as && !e->like) return fsdp_err_at(err, FSDP_E_INVALID, e->as, "model: 'as' needs 'like'");
    if (e->like && !e->as) return fsdp_err_at(err, FSDP_E_INVALID, e->like, "model: 'like' needs 'as' (the new name)");
    if (!e->like && !e->name)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: a parameter entry needs 'name' (or 'like' and 'as')");
    if (e->name && !e->shape)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: parameter entry '%s' needs 'shape'", e->name);
    if (e->shape && fsdp_value_type(e->shape) != FSDP_V_LIST)
        return fsdp_err_at(err, FSDP_E_INVALID, e->shape, "model: shape must be a list of sizes ([] for a 0-d tensor)");
    if (fsdp_value_size(e->shape) > FSDP_MAX_DIMS)
        return fsdp_err_at(err, FSDP_E_INVALID, e->shape, "model: shape has %zu dims (at most %d)",
                           fsdp_value_size(e->shape), FSDP_MAX_DIMS);
    return 0;
}

/* The entry's shape evaluated (eval) or checked. */
static int entry_shape(const mt_yaml_ctx *c, const entry *e, int *ndim, int64_t *shape, fsdp_err *err) {
    *ndim = (int)fsdp_value_size(e->shape);
    for (int d = 0; d < *ndim; d++) {
        const fsdp_value *s = fsdp_value_item(e->shape, (size_t)d);
        int rc;
        int64_t x = 0;
        if (fsdp_value_type(s) != FSDP_V_SCALAR) rc = mt_dims_eval_value(c->dims, s, &x, err); /* the error */
        else if (fsdp_value_int(s, &x) == 0) rc = 0;
        else rc = c->eval ? mt_dims_eval(c->dims, fsdp_value_text(s), s, &x, err)
                          : mt_dims_check(c->dims, fsdp_value_text(s), s, err);
        if (!rc && x < 0)
            rc = fsdp_err_at(err, FSDP_E_INVALID, s, "model: size '%s' is %lld, a negative size", fsdp_value_text(s),
                             (long long)x);
        shape[d] = x;
        if (rc) return rc;
    }
    return 0;
}

/* dtype and init of an entry: its own, else the given defaults. */
static int entry_props(const entry *e, fsdp_dtype dflt_dt, const init_rule *dflt_init, fsdp_dtype *dt, init_rule *init,
                       fsdp_err *err) {
    *dt = dflt_dt ? dflt_dt : FSDP_DT_F32;
    *init = *dflt_init;
    int rc = 0;
    if (e->dtype) rc = mt_yaml_dtype(e->dtype, dt, err);
    if (!rc && e->init) rc = mt_yaml_init_rule(e->init, init, err);
    return rc;
}

static int add_one(const mt_yaml_ctx *c, const char *rel, int ndim, const int64_t *shape, fsdp_dtype dt,
                   const init_rule *init, const entry *e, fsdp_err *err) {
    const fsdp_value *at = e->v;
    char name[MT_NAME_MAX + 2];
    int w = snprintf(name, sizeof name, "%s%s", c->t->parts[c->part].prefix, rel);
    if (w < 0 || (size_t)w >= sizeof name)
        return fsdp_err_at(err, FSDP_E_INVALID, at, "model: parameter name %s%.64s... is longer than %d bytes",
                           c->t->parts[c->part].prefix, rel, MT_NAME_MAX);
    if (e->unless_declared && mt_find(c->t, name) >= 0) return 0;
    mt_param p;
    memset(&p, 0, sizeof p);
    p.name = name;
    p.ndim = ndim;
    memcpy(p.shape, shape, (size_t)ndim * sizeof *shape);
    p.dtype = dt;
    p.init = *init;
    p.part = c->part;
    p.layer = -1;
    p.frozen = e->frozen;
    return mt_add(c->t, &p, err) ? at_value(err, at) : 0;
}

static int named_entry(const mt_yaml_ctx *c, const entry *e, fsdp_err *err) {
    fsdp_dtype dt;
    init_rule init;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS] = {0};
    int rc = entry_props(e, c->dtype, &c->init, &dt, &init, err);
    if (!rc) rc = entry_shape(c, e, &ndim, shape, err);
    mt_names names;
    if (!rc) rc = mt_names_expand(e->name, c->dims, e->name_at, c->eval, &names, err);
    if (rc || !c->eval) return rc;
    for (size_t i = 0; i < names.n && !rc; i++) rc = add_one(c, names.v[i], ndim, shape, dt, &init, e, err);
    mt_names_free(&names);
    return rc;
}

static int like_entry(const mt_yaml_ctx *c, const entry *e, fsdp_err *err) {
    const char *like = fsdp_value_text(e->like), *as = fsdp_value_text(e->as);
    int rc = nmap_glob_check(like, as, err);
    if (rc) return at_value(err, e->like);
    fsdp_dtype dt0;
    init_rule init;
    if ((rc = entry_props(e, FSDP_DT_INVALID, &c->init, &dt0, &init, err))) return rc;
    int ndim = 0;
    int64_t shape[FSDP_MAX_DIMS] = {0};
    if (e->shape && (rc = entry_shape(c, e, &ndim, shape, err))) return rc;
    if (!c->eval) return 0;
    const char *prefix = c->t->parts[c->part].prefix;
    size_t n0 = c->t->n, hits = 0; /* only what was declared before this entry */
    for (size_t i = 0; i < n0 && !rc; i++) {
        const mt_param *src = &c->t->p[i];
        const char *rel = nmap_strip_prefix(src->name, prefix);
        if (!rel || nmap_glob_match(like, rel, NULL) < 0) continue;
        char out[MT_NAME_MAX + 2];
        if ((rc = nmap_glob_rewrite(like, as, rel, out, sizeof out, err))) return at_value(err, e->as);
        hits++;
        fsdp_dtype dt = e->dtype ? dt0 : src->dtype;
        rc = e->shape ? add_one(c, out, ndim, shape, dt, &init, e, err)
                      : add_one(c, out, src->ndim, src->shape, dt, &init, e, err);
    }
    if (!rc && !hits)
        rc = fsdp_err_at(err, FSDP_E_INVALID, e->like, "model: like '%s' matches no parameter declared before it%s%s%s",
                         like, prefix[0] ? " (under the prefix '" : "", prefix, prefix[0] ? "')" : "");
    return rc;
}

int mt_yaml_add(const mt_yaml_ctx *c, const fsdp_value *params, fsdp_err *err) {
    fsdp_value_kind k = fsdp_value_type(params);
    if (k != FSDP_V_LIST && k != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, params, "model: params must be a list of parameter entries (or a map of "
                           "name: entry)");
    for (size_t i = 0; i < fsdp_value_size(params); i++) {
        entry e;
        int rc = read_entry(fsdp_value_item(params, i), k == FSDP_V_MAP ? fsdp_value_key(params, i) : NULL, &e, err);
        if (!rc) rc = e.like ? like_entry(c, &e, err) : named_entry(c, &e, err);
        if (rc) return rc;
    }
    return 0;
}
