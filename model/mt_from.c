/* A from-part's view of its source (see mt_from.h). */
#include "model/mt_from.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "model/mt_names.h"
#include "runtime/nearest.h"

void mt_strv_free(mt_strv *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = 0;
}

static int strv_push(mt_strv *s, const char *x, fsdp_err *err) {
    char **nv = realloc(s->v, (s->n + 1) * sizeof *nv);
    if (!nv) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    s->v = nv;
    if (!(s->v[s->n] = strdup(x))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    s->n++;
    return 0;
}

/* Puts the position of v in front of the message already in err. */
static int at_value(fsdp_err *err, const fsdp_value *v) {
    char msg[FSDP_ERR_MSG_MAX - 256];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return fsdp_err_at(err, err->code ? err->code : FSDP_E_INVALID, v, "%s", msg);
}

/* One glob pattern of a list: its brace groups expanded, each result checked. */
static int one_glob(const fsdp_value *g, const char *what, mt_dims *d, int eval, mt_strv *out, fsdp_err *err) {
    const char *t = fsdp_value_type(g) == FSDP_V_SCALAR ? fsdp_value_text(g) : NULL;
    if (!t || !*t) return fsdp_err_at(err, FSDP_E_INVALID, g, "model: %s: each glob must be text", what);
    mt_names names;
    int rc = mt_names_expand(t, d, g, eval, &names, err);
    if (rc) return rc;
    if (!eval && nmap_glob_check(t, NULL, err)) rc = at_value(err, g);
    for (size_t i = 0; !rc && i < names.n; i++) {
        if (nmap_glob_check(names.v[i], NULL, err)) rc = at_value(err, g);
        else rc = strv_push(out, names.v[i], err);
    }
    mt_names_free(&names);
    return rc;
}

int mt_from_globs(const fsdp_value *v, const char *what, mt_dims *d, int eval, mt_strv *out, int *given,
                  fsdp_err *err) {
    memset(out, 0, sizeof *out);
    *given = v != NULL;
    if (!v) return 0;
    fsdp_value_kind k = fsdp_value_type(v);
    if (k == FSDP_V_MAP || k == FSDP_V_NULL)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: %s must be a glob or a list of globs", what);
    size_t cnt = k == FSDP_V_SCALAR ? 1 : fsdp_value_size(v);
    int rc = 0;
    for (size_t i = 0; i < cnt && !rc; i++) rc = one_glob(k == FSDP_V_SCALAR ? v : fsdp_value_item(v, i), what, d, eval, out, err);
    if (rc) mt_strv_free(out);
    return rc;
}

int mt_from_strip(const fsdp_value *v, mt_strv *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    if (!v) return 0;
    fsdp_value_kind k = fsdp_value_type(v);
    size_t cnt = k == FSDP_V_SCALAR ? 1 : k == FSDP_V_LIST ? fsdp_value_size(v) : 0;
    if (!cnt)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: strip_prefix must be a prefix or a list of alternatives "
                           "(\"\" for keys without one)");
    int rc = 0;
    for (size_t i = 0; i < cnt && !rc; i++) {
        const fsdp_value *p = k == FSDP_V_SCALAR ? v : fsdp_value_item(v, i);
        const char *t = fsdp_value_type(p) == FSDP_V_SCALAR ? fsdp_value_text(p) : NULL;
        if (!t) rc = fsdp_err_at(err, FSDP_E_INVALID, p, "model: strip_prefix: each prefix must be text");
        else rc = strv_push(out, t, err);
    }
    if (rc) mt_strv_free(out);
    return rc;
}

/* ---- transforms --------------------------------------------------------------------------------- */

typedef struct xform {
    const char *glob;
    const fsdp_value *at, *permute, *reshape;
    int np;
    int perm[FSDP_MAX_DIMS];
} xform;

/* An entry GLOB: {permute: [...], reshape: [...]}: its keys and its permutation's syntax. */
static int read_xform(const fsdp_value *map, size_t i, xform *x, fsdp_err *err) {
    memset(x, 0, sizeof *x);
    x->glob = fsdp_value_key(map, i);
    x->at = fsdp_value_item(map, i);
    if (nmap_glob_check(x->glob, NULL, err)) return at_value(err, x->at);
    if (fsdp_value_type(x->at) != FSDP_V_MAP || !fsdp_value_size(x->at))
        return fsdp_err_at(err, FSDP_E_INVALID, x->at, "model: transform %s: expected {permute: [...], reshape: [...]}",
                           x->glob);
    for (size_t k = 0; k < fsdp_value_size(x->at); k++) {
        const char *key = fsdp_value_key(x->at, k);
        char hint[300];
        if (strcmp(key, "permute") && strcmp(key, "reshape"))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(x->at, k),
                               "model: transform %s: unknown key '%s'%s (permute, reshape)", x->glob, key,
                               nearest_hint(key, "permute, reshape", hint, sizeof hint));
    }
    x->permute = fsdp_value_get(x->at, "permute");
    x->reshape = fsdp_value_get(x->at, "reshape");
    const fsdp_value *lists[2] = {x->permute, x->reshape};
    for (int l = 0; l < 2; l++)
        if (lists[l] && (fsdp_value_type(lists[l]) != FSDP_V_LIST || fsdp_value_size(lists[l]) > FSDP_MAX_DIMS))
            return fsdp_err_at(err, FSDP_E_INVALID, lists[l], "model: transform %s: %s must be a list of at most %d sizes",
                               x->glob, l ? "reshape" : "permute", FSDP_MAX_DIMS);
    x->np = (int)fsdp_value_size(x->permute);
    unsigned seen = 0;
    for (int k = 0; k < x->np; k++) {
        const fsdp_value *e = fsdp_value_item(x->permute, (size_t)k);
        int64_t d;
        if (fsdp_value_int(e, &d) || d < 0 || d >= x->np || (seen >> d & 1u))
            return fsdp_err_at(err, FSDP_E_INVALID, e, "model: transform %s: permute must list each dim 0..%d once",
                               x->glob, x->np - 1);
        seen |= 1u << d;
        x->perm[k] = (int)d;
    }
    return 0;
}

/* The reshape sizes of x in d: -1 (at most one) is inferred from numel. */
static int reshape_sizes(const xform *x, mt_dims *d, int eval, int64_t numel, int *nd, int64_t *out, fsdp_err *err) {
    *nd = (int)fsdp_value_size(x->reshape);
    int infer = -1;
    int64_t known = 1;
    for (int k = 0; k < *nd; k++) {
        const fsdp_value *e = fsdp_value_item(x->reshape, (size_t)k);
        int64_t v = 0;
        int rc = fsdp_value_int(e, &v) == 0 ? 0
                 : eval ? mt_dims_eval_value(d, e, &v, err)
                        : mt_dims_check(d, fsdp_value_text(e) ? fsdp_value_text(e) : "", e, err);
        if (rc) return rc;
        if (v == -1 && infer < 0) infer = k;
        else if (v < 0) return fsdp_err_at(err, FSDP_E_INVALID, e, "model: transform %s: size %lld (one -1 at most)", x->glob, (long long)v);
        else if (__builtin_mul_overflow(known, v, &known)) return fsdp_err_at(err, FSDP_E_INVALID, e, "model: transform %s: the shape overflows", x->glob);
        out[k] = v;
    }
    if (infer >= 0 && eval) out[infer] = known ? numel / known : 0;
    return 0;
}

/* Applies x to parameter p (its current shape is what the source stores). */
static int apply_xform(const xform *x, mt_param *p, mt_dims *d, fsdp_err *err) {
    char a[128], b[128];
    if (p->src_ndim)
        return fsdp_err_at(err, FSDP_E_INVALID, x->at, "model: transform %s: %s is already transformed by another entry",
                           x->glob, p->name);
    if (x->permute && x->np != p->ndim)
        return fsdp_err_at(err, FSDP_E_INVALID, x->permute, "model: transform %s: %s is stored as %s (%d dims); permute "
                           "lists %d", x->glob, p->name, fsdp_shape_str(p->ndim, p->shape, a, sizeof a), p->ndim, x->np);
    int64_t perm_shape[FSDP_MAX_DIMS], out[FSDP_MAX_DIMS];
    int perm[FSDP_MAX_DIMS];
    for (int k = 0; k < p->ndim; k++) {
        perm[k] = x->permute ? x->perm[k] : k;
        perm_shape[k] = p->shape[perm[k]];
    }
    int64_t numel = fsdp_numel(p->ndim, p->shape);
    int nd = p->ndim;
    memcpy(out, perm_shape, sizeof out);
    if (x->reshape) {
        int rc = reshape_sizes(x, d, 1, numel, &nd, out, err);
        if (rc) return rc;
    }
    if (fsdp_numel(nd, out) != numel)
        return fsdp_err_at(err, FSDP_E_INVALID, x->reshape, "model: transform %s: %s is stored as %s (%lld elements), "
                           "which does not reshape to %s", x->glob, p->name, fsdp_shape_str(p->ndim, p->shape, a, sizeof a),
                           (long long)numel, fsdp_shape_str(nd, out, b, sizeof b));
    int identity = nd == p->ndim && !memcmp(out, p->shape, (size_t)nd * sizeof *out);
    for (int k = 0; k < p->ndim; k++) identity = identity && perm[k] == k;
    if (identity) return 0;
    p->src_ndim = p->ndim;
    memcpy(p->src_shape, p->shape, sizeof p->src_shape);
    memcpy(p->src_perm, perm, sizeof p->src_perm);
    p->ndim = nd;
    memset(p->shape, 0, sizeof p->shape);
    memcpy(p->shape, out, (size_t)nd * sizeof *out);
    return 0;
}

int mt_from_transforms(mt_table *t, int part, const fsdp_value *map, mt_dims *d, int eval, fsdp_err *err) {
    if (!map) return 0;
    if (fsdp_value_type(map) != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, map, "model: transform must be a map of KEY-GLOB: {permute, reshape}");
    const char *prefix = t->parts[part].prefix;
    for (size_t i = 0; i < fsdp_value_size(map); i++) {
        xform x;
        int rc = read_xform(map, i, &x, err);
        int nd;
        int64_t sizes[FSDP_MAX_DIMS];
        if (!rc && !eval && x.reshape) rc = reshape_sizes(&x, d, 0, 0, &nd, sizes, err);
        if (rc || !eval) {
            if (rc) return rc;
            continue;
        }
        size_t hits = 0;
        for (size_t j = 0; j < t->n && !rc; j++) {
            mt_param *p = &t->p[j];
            const char *rel = p->part == part ? nmap_strip_prefix(p->name, prefix) : NULL;
            if (!rel || nmap_glob_match(x.glob, rel, NULL) < 0) continue;
            hits++;
            rc = apply_xform(&x, p, d, err);
        }
        if (rc) return rc;
        if (!hits)
            return fsdp_err_at(err, FSDP_E_INVALID, x.at, "model: transform %s matches no tensor of part '%s' (%s)", x.glob,
                               t->parts[part].name, t->parts[part].source);
    }
    return 0;
}
