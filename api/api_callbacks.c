/* The callbacks of the plugin API (include/fsdp/callbacks.h): a list kept in the context for the
 * run, run by train-steps and eval (api/api_callbacks.h). */
#include "api/api_callbacks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_agree.h"
#include "api/api_hooks.h"
#include "api/api_util.h"
#include "runtime/ctx_impl.h"
#include "runtime/err_local.h"

#define CALLBACKS_ATTACH "fsdp.callbacks"

typedef struct cb_entry {
    char *name;
    fsdp_step_callback fn;
    void *user;
    void (*destroy)(void *);
} cb_entry;

typedef struct cb_list {
    cb_entry *e;
    size_t n;
    char saver[128]; /* the last run: the first callback of this rank that asked for a save ("" none) */
} cb_list;

static void entry_free(cb_entry *e) {
    if (e->destroy) e->destroy(e->user);
    free(e->name);
}

static void list_free(void *p) {
    cb_list *l = p;
    for (size_t i = 0; l && i < l->n; i++) entry_free(&l->e[i]);
    if (l) free(l->e);
    free(l);
}

static cb_list *list_of(fsdp_ctx *ctx, int create) {
    cb_list *l = fsdp_ctx_attached(ctx, CALLBACKS_ATTACH);
    if (l || !create) return l;
    if (!(l = calloc(1, sizeof *l))) return NULL;
    if (fsdp_ctx_attach(ctx, CALLBACKS_ATTACH, l, list_free)) {
        free(l);
        return NULL;
    }
    return l;
}

int fsdp_callback_add(fsdp_ctx *ctx, const char *name, fsdp_step_callback fn, void *user, void (*destroy)(void *),
                      fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_callback_add";
    if (!ctx) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no context", call);
    if (!name || !*name || !fn) return api_fail(ctx, err, FSDP_E_INVALID, call, "a callback needs a name and a function");
    if (ctx->in_callback) return api_fail(ctx, err, FSDP_E_INVALID, call, "not allowed inside a callback");
    cb_list *l = list_of(ctx, 1);
    if (!l) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    for (size_t i = 0; i < l->n; i++) {
        if (strcmp(l->e[i].name, name)) continue;
        cb_entry old = l->e[i];
        l->e[i].fn = fn, l->e[i].user = user, l->e[i].destroy = destroy;
        if (old.destroy) old.destroy(old.user);
        return 0;
    }
    cb_entry *ne = realloc(l->e, (l->n + 1) * sizeof *ne);
    char *nm = strdup(name);
    if (!ne || !nm) {
        if (ne) l->e = ne;
        free(nm);
        return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    }
    l->e = ne;
    l->e[l->n++] = (cb_entry){nm, fn, user, destroy};
    return 0;
}

int fsdp_callback_remove(fsdp_ctx *ctx, const char *name, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_callback_remove";
    if (!ctx) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no context", call);
    if (ctx->in_callback) return api_fail(ctx, err, FSDP_E_INVALID, call, "not allowed inside a callback");
    cb_list *l = list_of(ctx, 0);
    int found = api_hooks_remove(ctx, name);
    for (size_t i = 0; l && name && i < l->n; i++) {
        if (strcmp(l->e[i].name, name)) continue;
        entry_free(&l->e[i]);
        memmove(l->e + i, l->e + i + 1, (l->n - i - 1) * sizeof *l->e);
        l->n--;
        return 0;
    }
    if (found) return 0;
    return api_fail(ctx, err, FSDP_E_INVALID, call, "no callback named '%s'", name ? name : "(null)");
}

size_t api_callbacks_count(fsdp_ctx *ctx) {
    cb_list *l = list_of(ctx, 0);
    return l ? l->n : 0;
}

const char *api_callbacks_saver(fsdp_ctx *ctx) {
    cb_list *l = list_of(ctx, 0);
    return l && l->saver[0] ? l->saver : NULL;
}

int api_callbacks_run(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, fsdp_err *err) {
    *request = 0;
    cb_list *l = list_of(ctx, 0);
    if (!l || !l->n) return 0;
    int rc = 0;
    fsdp_err lerr;
    fsdp_err_clear(&lerr);
    ctx->in_callback = 1;
    l->saver[0] = '\0';
    for (size_t i = 0; i < l->n && !rc; i++) {
        unsigned r = 0;
        rc = l->e[i].fn(ctx, m, &r, l->e[i].user, &lerr);
        if (rc && !lerr.msg[0]) snprintf(lerr.msg, sizeof lerr.msg, "failed (%s)", fsdp_err_code_name(rc));
        if (rc) fsdp_err_prefix(&lerr, "callback '%s' at step %lld", l->e[i].name, (long long)m->step);
        if ((r & FSDP_REQUEST_SAVE) && !l->saver[0]) snprintf(l->saver, sizeof l->saver, "%s", l->e[i].name);
        *request |= r;
    }
    ctx->in_callback = 0;
    comm *w = ctx_world_comm(ctx);
    if (rc) *err = lerr;
    int agreed = api_agree_result(ctx, w, rc, err);
    if (rc) return rc;
    if (agreed) return agreed; /* "rank R: callback 'x' at step N: ..." */
    int64_t bits = (int64_t)*request;
    int64_t v[2] = {bits & FSDP_REQUEST_SAVE, bits & FSDP_REQUEST_STOP};
    if ((rc = comm_allreduce(w, v, 2, COMM_I64, COMM_MAX, err))) return rc;
    *request = (v[0] ? FSDP_REQUEST_SAVE : 0u) | (v[1] ? FSDP_REQUEST_STOP : 0u);
    return 0;
}
