/* save-dcp's parameters (see save_dcp_opts.h). */
#include "stages/save_dcp_opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp_side.h"
#include "ckpt/save_plan.h"
#include "stages/value_pickle.h"
#include "runtime/nearest.h"

static int parse_aliases(const fsdp_value *with, sdcp_opts *s, fsdp_err *err) {
    const fsdp_value *av = fsdp_value_get(with, "aliases");
    size_t n = fsdp_value_size(av);
    if (!n) return 0;
    s->aliases = calloc(n, sizeof *s->aliases);
    if (!s->aliases) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    const char *prefix = s->o.key_prefix ? s->o.key_prefix : "";
    for (size_t i = 0; i < n; i++) {
        const fsdp_value *v = fsdp_value_item(av, i);
        const char *t = fsdp_value_text(v);
        if (!t)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: aliases: expected key prefixes such as 'ema_model.'");
        if (!splan_prefix_ok(t))
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "save-dcp: aliases: '%s' is not a key prefix (expected \"\" or dotted names ending in "
                               "'.', e.g. 'ema_model.')",
                               t);
        if (!strcmp(t, prefix))
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "save-dcp: aliases: '%s' is the parameters' prefix itself (prefix: '%s'); an alias "
                               "names another prefix",
                               t, prefix);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(t, s->aliases[j]))
                return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: aliases: '%s' is listed twice", t);
        s->aliases[i] = t;
    }
    s->o.aliases = s->aliases;
    s->o.n_aliases = n;
    return 0;
}

/* A number of fresh_optimizer, with the Python type it was given as (int or float), >= 0 and
 * (below_one) < 1. */
static int number(const fsdp_value *v, const char *name, int below_one, fopt_num *out, fsdp_err *err) {
    int64_t i;
    double f;
    if (fsdp_value_type(v) != FSDP_V_SCALAR || fsdp_value_quoted(v) || fsdp_value_float(v, &f))
        return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: fresh_optimizer.%s: expected a number", name);
    out->is_int = fsdp_value_int(v, &i) == 0;
    out->i = out->is_int ? i : 0;
    out->f = out->is_int ? (double)i : f;
    if (!isfinite(out->f) || out->f < 0 || (below_one && out->f >= 1))
        return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: fresh_optimizer.%s: %s is out of range (AdamW takes %s)",
                           name, fsdp_value_text(v), below_one ? "0 <= beta < 1" : "a finite value >= 0");
    return 0;
}

static int fresh_key(const fsdp_value *fv, size_t k, fopt_adamw *f, fsdp_err *err) {
    const char *key = fsdp_value_key(fv, k);
    const fsdp_value *v = fsdp_value_item(fv, k);
    if (!strcmp(key, "prefix")) {
        const char *t = fsdp_value_text(v);
        if (!t || !splan_prefix_ok(t))
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "save-dcp: fresh_optimizer.prefix: expected \"\" or dotted names ending in '.' (e.g. "
                               "'optimizer.')");
        f->prefix = t;
        return 0;
    }
    if (!strcmp(key, "betas")) {
        if (fsdp_value_type(v) != FSDP_V_LIST || fsdp_value_size(v) != 2)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: fresh_optimizer.betas: expected [beta1, beta2]");
        int rc = number(fsdp_value_item(v, 0), "betas", 1, &f->beta1, err);
        return rc ? rc : number(fsdp_value_item(v, 1), "betas", 1, &f->beta2, err);
    }
    if (!strcmp(key, "lr")) return number(v, key, 0, &f->lr, err);
    if (!strcmp(key, "eps")) return number(v, key, 0, &f->eps, err);
    if (!strcmp(key, "weight_decay")) return number(v, key, 0, &f->weight_decay, err);
    if (!strcmp(key, "initial_lr")) {
        f->has_initial_lr = 1;
        return number(v, key, 0, &f->initial_lr, err);
    }
    static const char KNOWN[] = "prefix, lr, initial_lr, betas, eps, weight_decay";
    char hint[300];
    return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: fresh_optimizer: unknown key '%s'%s (known: %s)", key,
                       nearest_hint(key, KNOWN, hint, sizeof hint), KNOWN);
}

static int parse_fresh(const fsdp_value *with, sdcp_opts *s, fsdp_err *err) {
    const fsdp_value *fv = fsdp_value_get(with, "fresh_optimizer");
    if (fsdp_value_type(fv) != FSDP_V_MAP) return 0;
    fopt_defaults(&s->fresh);
    for (size_t k = 0; k < fsdp_value_size(fv); k++) {
        int rc = fresh_key(fv, k, &s->fresh, err);
        if (rc) return rc;
    }
    s->o.fresh_optim = &s->fresh;
    return 0;
}

static int parse_files(const fsdp_value *with, sdcp_opts *s, fsdp_err *err) {
    const fsdp_value *fv = fsdp_value_get(with, "files");
    size_t n = fsdp_value_size(fv);
    if (fsdp_value_type(fv) != FSDP_V_MAP || !n) return 0;
    s->files = calloc(n, sizeof *s->files);
    if (!s->files) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    s->o.files = s->files;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *name = fsdp_value_key(fv, i), *why;
        const fsdp_value *v = fsdp_value_item(fv, i);
        if (!dcp_side_name_ok(name, &why))
            return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: files: '%s' %s", name, why);
        char what[600];
        snprintf(what, sizeof what, "save-dcp: files: %s", name);
        pkl_w w;
        pkl_w_init(&w);
        rc = vpkl_pickle(&w, v, what, err);
        s->files[i].name = name;
        s->files[i].pickle = w.buf; /* owned: freed by sdcp_opts_free */
        s->files[i].len = w.len;
        s->o.n_files = i + 1;
    }
    return rc;
}

int sdcp_opts_parse(const fsdp_value *with, sdcp_opts *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    out->o.optimizer = fsdp_arg_bool(with, "optimizer", 1);
    out->o.overwrite = fsdp_arg_bool(with, "overwrite", 0);
    out->o.key_prefix = fsdp_arg_str(with, "prefix", NULL);
    out->o.no_train_state = !fsdp_arg_bool(with, "train_state", 1);
    int rc = parse_aliases(with, out, err);
    if (!rc) rc = parse_fresh(with, out, err);
    if (!rc) rc = parse_files(with, out, err);
    if (rc) sdcp_opts_free(out);
    return rc;
}

void sdcp_opts_free(sdcp_opts *o) {
    free(o->aliases);
    for (size_t i = 0; i < o->o.n_files; i++) free((void *)o->files[i].pickle);
    free(o->files);
    memset(o, 0, sizeof *o);
}
