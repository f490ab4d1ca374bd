/* Param groups keyed by index (layouts/layout.h, LAY_GROUPS_INDEXED): `<optim>param_groups.<i>.<option>` and the
 * list `<optim>param_groups.<i>.params` of the group's parameter names, to and from fsdp-run's flattened
 * `optimizer.param_groups.<fqn>.<option>`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/pickle.h"
#include "ckpt/pt_write.h"
#include "layouts/lay_view_impl.h"

/* The names in group g's `params` list (a pickled list of str): *names malloc'd strings, *n of them. */
static int group_params(lay_job *J, const char *g, char ***names, size_t *n, fsdp_err *err) {
    char key[LAY_NAME_CAP];
    *names = NULL, *n = 0;
    int rc = lay_full_name(J, 1, LAY_K_OPTION, g, "params", key, err);
    if (rc) return rc;
    long k = ckpt_find(J->src, key);
    if (k < 0)
        return fsdp_err_set(err, FSDP_E_FORMAT, "layout %s: param group %s has no list of its parameters (%s)", J->L->name,
                            g, key);
    pkl_doc *doc = NULL;
    const pkl_obj *root;
    if ((rc = ptw_value_parse(J->src, (size_t)k, &doc, &root, err))) return rc;
    if (!rc && root->kind != PKL_LIST)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: expected a list of parameter names", key);
    if (!rc && !(*names = calloc(root->n ? root->n : 1, sizeof **names))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < root->n; i++) {
        const pkl_obj *o = root->items[i];
        const char *name = o->kind == PKL_STR ? o->s : NULL;
        if (o->kind == PKL_INT && J->L->ids == LAY_IDS_MODULE_ORDER) name = lay_id_name(J, (long)o->i);
        if (!name || !*name)
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: item %zu is not a parameter %s", key, i,
                              J->L->ids == LAY_IDS_MODULE_ORDER ? "id of the checkpoint's model" : "name");
        else if (!((*names)[i] = strdup(name))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else (*n)++;
    }
    pkl_free(doc);
    return rc;
}

static void free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

int lay_group_to_canon(lay_job *J, size_t i, const char *g, const char *opt, fsdp_err *err) {
    if (!strcmp(opt, "params")) return 0; /* read by every option of the group */
    if (J->L->params_also && !strcmp(opt, J->L->params_also)) return 0; /* the same list again */
    char **names;
    size_t n;
    int rc = group_params(J, g, &names, &n, err);
    for (size_t p = 0; p < n && !rc; p++) {
        char cf[LAY_MAX_PARTS][LAY_NAME_CAP], key[LAY_NAME_CAP];
        int parts;
        rc = lay_canon_fqns(J, names[p], LAY_FUSE_MOMENTS, cf, &parts, err);
        for (int q = 0; q < parts && !rc; q++)
            if (!(rc = lay_full_name(J, 0, LAY_K_OPTION, cf[q], opt, key, err))) rc = ckv_add_same(J->b, key, i, err);
    }
    free_names(names, n);
    return rc;
}

/* ------------------------------------------------------------------ fsdp-run's options -> groups */

typedef struct gparam {
    char *fqn;    /* canonical */
    char *sig;    /* its options and their values, in key order: equal sig, same group */
    size_t first; /* the entry index of its first option */
    int group;
} gparam;

typedef struct gset {
    gparam *p;
    size_t n, cap;
} gset;

static gparam *param_of(gset *s, const char *fqn, size_t entry) {
    for (size_t k = s->n; k-- > 0;)
        if (!strcmp(s->p[k].fqn, fqn)) return &s->p[k];
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        gparam *p = realloc(s->p, cap * sizeof *p);
        if (!p) return NULL;
        s->p = p, s->cap = cap;
    }
    gparam *p = &s->p[s->n];
    memset(p, 0, sizeof *p);
    p->first = entry;
    p->group = -1;
    if (!(p->fqn = strdup(fqn)) || !(p->sig = strdup(""))) return NULL;
    s->n++;
    return p;
}

static int add_sig(gparam *p, const char *opt, const char *text) {
    size_t a = strlen(p->sig), b = strlen(opt) + strlen(text ? text : "?") + 3;
    char *s = realloc(p->sig, a + b);
    if (!s) return -1;
    snprintf(s + a, b, "%s=%s;", opt, text ? text : "?");
    p->sig = s;
    return 0;
}

static int collect(lay_job *J, gset *s, fsdp_err *err) {
    char fqn[LAY_NAME_CAP], last[128];
    for (size_t i = 0; i < ckpt_count(J->src); i++) {
        const ckpt_entry *e = ckpt_entry_at(J->src, i);
        if (lay_classify(J, 0, e->name, fqn, last) != LAY_K_OPTION) continue;
        gparam *p = param_of(s, fqn, i);
        if (!p || add_sig(p, last, ckpt_value_text(J->src, i)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    return 0;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

/* Group g's members as the trainer names them (a fused tensor once); with ids (LAY_IDS_MODULE_ORDER) their ids
 * in ascending order, which torch's load_state_dict pairs with the live group's parameters by position.
 * *names malloc'd (strings in s's order, or ids as text), *n of them. */
static int members(lay_job *J, const gset *s, int g, char ***names, size_t *n, fsdp_err *err) {
    *names = calloc(s->n ? s->n : 1, sizeof **names), *n = 0;
    long *ids = calloc(s->n ? s->n : 1, sizeof *ids);
    int rc = *names && ids ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < s->n && !rc; k++) {
        if (s->p[k].group != g) continue;
        char nf[LAY_NAME_CAP];
        int secondary;
        if ((rc = lay_native_fqn(J, s->p[k].fqn, LAY_FUSE_MOMENTS, nf, &secondary, err)) || secondary) continue;
        if (J->L->ids == LAY_IDS_MODULE_ORDER && (ids[*n] = lay_name_id(J, nf)) < 0)
            rc = fsdp_err_set(err, FSDP_E_INVALID, "param group %d: %s is no parameter of the checkpoint's model", g, nf);
        else if (J->L->ids != LAY_IDS_MODULE_ORDER && !((*names)[*n] = strdup(nf)))
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (!rc) (*n)++;
    }
    if (!rc && J->L->ids == LAY_IDS_MODULE_ORDER) {
        qsort(ids, *n, sizeof *ids, cmp_long);
        for (size_t k = 0; k < *n && !rc; k++) {
            char t[32];
            snprintf(t, sizeof t, "%ld", ids[k]);
            if (!((*names)[k] = strdup(t))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
    }
    free(ids);
    return rc;
}

/* The pickled list of group g's parameters (names, or ids), and its text (*text malloc'd, "['a', 'b']", "[0, 1]"). */
static int params_value(lay_job *J, const gset *s, int g, pkl_w *w, char **text, fsdp_err *err) {
    char **names;
    size_t n;
    int rc = members(J, s, g, &names, &n, err), ids = J->L->ids == LAY_IDS_MODULE_ORDER;
    size_t tl = 1, tcap = 256;
    char *t = rc ? NULL : malloc(tcap);
    if (!rc && !t) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) {
        strcpy(t, "[");
        pkl_w_proto(w, 2);
        pkl_w_empty_list(w);
        pkl_w_mark(w);
    }
    for (size_t k = 0; k < n && !rc; k++) {
        if (ids) pkl_w_int(w, strtol(names[k], NULL, 10));
        else pkl_w_str(w, names[k]);
        size_t need = tl + strlen(names[k]) + 5;
        if (need > tcap) {
            char *u = realloc(t, tcap = 2 * need);
            if (!u) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                break;
            }
            t = u;
        }
        tl += (size_t)sprintf(t + tl, ids ? "%s%s" : "%s'%s'", tl > 1 ? ", " : "", names[k]);
    }
    free_names(names, n);
    if (rc) return free(t), rc;
    strcpy(t + tl, "]");
    pkl_w_appends(w);
    pkl_w_stop(w);
    *text = t;
    return w->oom ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : 0;
}

static int no_option(const lay_layout *L, const char *opt) {
    for (const char *const *o = L->no_options; o && *o; o++)
        if (!strcmp(*o, opt)) return 1;
    return 0;
}

/* A Python literal (None, True, False, an int, a float) as a pickle, 1; 0 when text is none of them. */
static int literal_pickle(const char *text, pkl_w *w) {
    char *end;
    pkl_w_proto(w, 2);
    if (!strcmp(text, "None")) pkl_w_none(w);
    else if (!strcmp(text, "True") || !strcmp(text, "False")) pkl_w_bool(w, text[0] == 'T');
    else {
        long long i = strtoll(text, &end, 10);
        if (*text && !*end) pkl_w_int(w, i);
        else {
            double d = strtod(text, &end);
            if (!*text || *end) return 0;
            pkl_w_float(w, d);
        }
    }
    pkl_w_stop(w);
    return 1;
}

/* The value of add-option o: from `--option NAME=VALUE`, else its default (NULL: none). */
static const char *add_option_value(const lay_job *J, const lay_add_option *o) {
    size_t n = strlen(o->name);
    for (size_t k = 0; k < J->f->n_group_opt; k++)
        if (!strncmp(J->f->group_opt[k], o->name, n) && J->f->group_opt[k][n] == '=') return J->f->group_opt[k] + n + 1;
    return o->def;
}

/* The layout's options fsdp-run's groups lack (lay_add_option) into group gi, unless the group has them (have:
 * the canonical parameter's own options were written: a checkpoint read from this layout keeps its values). */
static int add_options(lay_job *J, const char *gi, const char *fqn, fsdp_err *err) {
    int rc = 0;
    for (const lay_add_option *o = J->L->add_options; o && o->name && !rc; o++) {
        char key[LAY_NAME_CAP];
        if ((rc = lay_full_name(J, 0, LAY_K_OPTION, fqn, o->name, key, err))) break;
        if (ckpt_find(J->src, key) >= 0) continue; /* the checkpoint has it */
        const char *v = add_option_value(J, o);
        if (!v)
            return fsdp_err_set(err, FSDP_E_INVALID, "layout %s needs param-group option %s, which fsdp-run's checkpoint "
                                "does not hold (the trainer reads it from the loaded groups): pass --option "
                                "%s=VALUE (save-dcp: options: {%s: VALUE}; a Python literal, None where the trainer "
                                "takes none)", J->L->name, o->name, o->name, o->name);
        pkl_w w;
        pkl_w_init(&w);
        if (!literal_pickle(v, &w))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "option %s=%s: not None, True, False or a number", o->name, v);
        else if (w.oom) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (!rc && !(rc = lay_full_name(J, 1, LAY_K_OPTION, gi, o->name, key, err)))
            rc = ckv_add_value(J->b, key, w.buf, w.len, v, err);
        pkl_w_free(&w);
    }
    return rc;
}

/* Group g: the options of its first parameter p under `<optim>param_groups.<g>.`, and its list. */
static int emit_group(lay_job *J, const gset *s, const gparam *p, int g, fsdp_err *err) {
    char gi[32], fqn[LAY_NAME_CAP], last[128], key[LAY_NAME_CAP];
    snprintf(gi, sizeof gi, "%d", g);
    int rc = 0;
    for (size_t i = p->first; i < ckpt_count(J->src) && !rc; i++) {
        const ckpt_entry *e = ckpt_entry_at(J->src, i);
        if (lay_classify(J, 0, e->name, fqn, last) != LAY_K_OPTION || strcmp(fqn, p->fqn) || no_option(J->L, last) ||
            (J->L->params_also && !strcmp(last, J->L->params_also)))
            continue;
        if (!(rc = lay_full_name(J, 1, LAY_K_OPTION, gi, last, key, err))) rc = ckv_add_same(J->b, key, i, err);
    }
    pkl_w w;
    pkl_w_init(&w);
    char *text = NULL;
    if (!rc) rc = add_options(J, gi, p->fqn, err);
    if (!rc) rc = params_value(J, s, g, &w, &text, err);
    if (!rc && !(rc = lay_full_name(J, 1, LAY_K_OPTION, gi, "params", key, err)))
        rc = ckv_add_value(J->b, key, w.buf, w.len, text, err);
    if (!rc && J->L->params_also && !(rc = lay_full_name(J, 1, LAY_K_OPTION, gi, J->L->params_also, key, err)))
        rc = ckv_add_value(J->b, key, w.buf, w.len, text, err);
    free(text);
    pkl_w_free(&w);
    return rc;
}

int lay_groups_from_canon(lay_job *J, fsdp_err *err) {
    gset s = {0};
    int rc = collect(J, &s, err), groups = 0;
    for (size_t k = 0; k < s.n && !rc; k++) {
        if (s.p[k].group >= 0) continue;
        for (size_t m = k; m < s.n; m++)
            if (s.p[m].group < 0 && !strcmp(s.p[m].sig, s.p[k].sig)) s.p[m].group = groups;
        groups++;
    }
    for (int g = 0, k = 0; g < groups && !rc; g++) {
        while (s.p[k].group != g) k++;
        rc = emit_group(J, &s, &s.p[k], g, err);
    }
    for (size_t k = 0; k < s.n; k++) free(s.p[k].fqn), free(s.p[k].sig);
    free(s.p);
    return rc;
}
