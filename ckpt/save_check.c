/* sio_save_check (state_io.h): what a save would write, checked before anything is written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp_side.h"
#include "ckpt/save_plan.h"
#include "runtime/name_index.h"

/* What an item is, for messages: "parameter w under alias 'ema_model.'". */
static void describe(const fsdp_state *s, const sio_save_opts *o, const save_item *it, char *out, size_t cap) {
    const char *prefix = o->key_prefix ? o->key_prefix : "";
    if (it->param >= 0 && it->alias >= 0)
        snprintf(out, cap, "parameter %s under alias '%s'", s->p[it->param].name, o->aliases[it->alias]);
    else if (it->param >= 0 && *prefix)
        snprintf(out, cap, "parameter %s under prefix '%s'", s->p[it->param].name, prefix);
    else if (it->param >= 0)
        snprintf(out, cap, "parameter %s", s->p[it->param].name);
    else if (it->fresh)
        snprintf(out, cap, "a fresh_optimizer entry");
    else
        snprintf(out, cap, "an optimizer or train_state entry");
}

static int check_aliases(const sio_save_opts *o, fsdp_err *err) {
    const char *prefix = o->key_prefix ? o->key_prefix : "";
    for (size_t a = 0; a < o->n_aliases; a++) {
        const char *x = o->aliases[a];
        if (!splan_prefix_ok(x))
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "save-dcp: aliases: '%s' is not a key prefix (expected \"\" or dotted names ending in "
                                "'.', e.g. 'ema_model.')",
                                x ? x : "(null)");
        if (!strcmp(x, prefix))
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "save-dcp: aliases: '%s' is the parameters' prefix itself (prefix: '%s'); an alias "
                                "names another prefix",
                                x, prefix);
        for (size_t b = 0; b < a; b++)
            if (!strcmp(x, o->aliases[b]))
                return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: aliases: '%s' is listed twice", x);
    }
    return 0;
}

static int check_fresh(const fsdp_state *s, const sio_save_opts *o, fsdp_err *err) {
    const fopt_adamw *f = o->fresh_optim;
    if (!f) return 0;
    if (!splan_prefix_ok(f->prefix ? f->prefix : ""))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "save-dcp: fresh_optimizer: prefix '%s' is not a key prefix (expected \"\" or dotted "
                            "names ending in '.', e.g. 'optimizer.')",
                            f->prefix);
    if (s->has_optimizer)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "save-dcp: fresh_optimizer writes the param group of an AdamW that has not stepped, but "
                            "this state holds optimizer state (AdamW moments, step %lld); save it with optimizer: true "
                            "instead, or save before training",
                            (long long)s->train_step);
    if (s->train_step != 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "save-dcp: fresh_optimizer writes the param group of an AdamW that has not stepped, but "
                            "this state is at step %lld (a fresh optimizer belongs to step 0)",
                            (long long)s->train_step);
    return 0;
}

static int check_files(const sio_save_opts *o, fsdp_err *err) {
    for (size_t i = 0; i < o->n_files; i++) {
        const char *why = NULL;
        if (!dcp_side_name_ok(o->files[i].name, &why))
            return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: files: '%s' %s", o->files[i].name, why);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(o->files[i].name, o->files[j].name))
                return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: files: '%s' is listed twice", o->files[i].name);
    }
    return 0;
}

/* 1 when key lies in the namespace of the fresh optimizer's state dict */
static int under_fresh(const char *key, const char *prefix) {
    if (*prefix) return !strncmp(key, prefix, strlen(prefix));
    return !strncmp(key, "param_groups.", 13) || !strncmp(key, "state.", 6);
}

/* Every key of rank 0's plan (which has every key) once, and none but the fresh optimizer's under
 * its prefix. */
static int check_keys(const fsdp_state *s, const sio_save_opts *o, const save_plan *p, fsdp_err *err) {
    nidx keys;
    nidx_init(&keys);
    int rc = 0;
    const char *fp = o->fresh_optim ? (o->fresh_optim->prefix ? o->fresh_optim->prefix : "") : NULL;
    for (size_t i = 0; i < p->n && !rc; i++) {
        const save_item *it = &p->items[i];
        char a[1200], b[1200];
        size_t prev;
        int dup = nidx_add(&keys, it->fqn, i, &prev);
        if (dup < 0) {
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        } else if (dup) {
            describe(s, o, &p->items[prev], a, sizeof a);
            describe(s, o, it, b, sizeof b);
            rc = fsdp_err_set(err, FSDP_E_INVALID,
                              "save-dcp: two entries would be written under the key %s: %s and %s (change the "
                              "prefix or aliases)",
                              it->fqn, a, b);
        } else if (fp && !it->fresh && under_fresh(it->fqn, fp)) {
            describe(s, o, it, a, sizeof a);
            rc = fsdp_err_set(err, FSDP_E_INVALID,
                              "save-dcp: fresh_optimizer: the key %s (%s) lies under its prefix '%s', where only the "
                              "fresh optimizer's entries may be; give fresh_optimizer another prefix",
                              it->fqn, a, fp);
        }
    }
    nidx_free(&keys);
    return rc;
}

int sio_save_check(const fsdp_state *s, int world, const sio_save_opts *o, fsdp_err *err) {
    int rc = check_aliases(o, err);
    if (!rc) rc = check_fresh(s, o, err);
    if (!rc) rc = check_files(o, err);
    if (rc) return rc;
    save_plan p = {0};
    rc = splan_build((fsdp_state *)s, 0, world, o, &p, err);
    if (!rc) rc = check_keys(s, o, &p, err);
    splan_free(&p);
    return rc;
}
