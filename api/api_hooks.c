/* The hooks of the plugin API (include/fsdp/callbacks.h, stage ABI 1.2; api/api_hooks.h): one list kept in
 * the context for the run, and the metrics callbacks set for the running step. */
#include "api/api_hooks.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_agree.h"
#include "api/api_util.h"
#include "runtime/ctx_impl.h"
#include "runtime/err_local.h"

#define HOOKS_ATTACH "fsdp.hooks"
#define PRE_UPDATE FSDP_HOOK_KINDS /* the kind of a pre-update hook in the list */
#define STEP_METRICS_MAX 64

typedef struct hook_entry {
    char *name;
    int kind;
    fsdp_hook_fn fn;
    fsdp_pre_update_fn pre;
    void *user;
    void (*destroy)(void *);
} hook_entry;

typedef struct hook_list {
    hook_entry *e;
    size_t n;
    struct {
        char name[65];
        double value;
    } metric[STEP_METRICS_MAX];
    size_t n_metrics;
} hook_list;

static void entry_free(hook_entry *e) {
    if (e->destroy) e->destroy(e->user);
    free(e->name);
}

static void list_free(void *p) {
    hook_list *l = p;
    for (size_t i = 0; l && i < l->n; i++) entry_free(&l->e[i]);
    if (l) free(l->e);
    free(l);
}

static hook_list *list_of(fsdp_ctx *ctx, int create) {
    hook_list *l = fsdp_ctx_attached(ctx, HOOKS_ATTACH);
    if (l || !create) return l;
    if (!(l = calloc(1, sizeof *l))) return NULL;
    if (fsdp_ctx_attach(ctx, HOOKS_ATTACH, l, list_free)) {
        free(l);
        return NULL;
    }
    return l;
}

static int add(fsdp_ctx *ctx, const char *call, hook_entry ne, fsdp_err *err) {
    if (!ctx) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no context", call);
    if (!ne.name || !*ne.name || (!ne.fn && !ne.pre))
        return api_fail(ctx, err, FSDP_E_INVALID, call, "a hook needs a name and a function");
    if (ne.kind < 0 || ne.kind > PRE_UPDATE) return api_fail(ctx, err, FSDP_E_INVALID, call, "unknown hook kind %d", ne.kind);
    if (ctx->in_callback) return api_fail(ctx, err, FSDP_E_INVALID, call, "not allowed inside a callback or hook");
    hook_list *l = list_of(ctx, 1);
    if (!l) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    for (size_t i = 0; i < l->n; i++) {
        if (strcmp(l->e[i].name, ne.name) || l->e[i].kind != ne.kind) continue;
        hook_entry old = l->e[i];
        ne.name = old.name;
        l->e[i] = ne;
        if (old.destroy) old.destroy(old.user);
        return 0;
    }
    hook_entry *grown = realloc(l->e, (l->n + 1) * sizeof *grown);
    char *nm = strdup(ne.name);
    if (!grown || !nm) {
        if (grown) l->e = grown;
        free(nm);
        return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    }
    l->e = grown;
    ne.name = nm;
    l->e[l->n++] = ne;
    return 0;
}

int fsdp_hook_add(fsdp_ctx *ctx, const char *name, fsdp_hook_kind kind, fsdp_hook_fn fn, void *user,
                  void (*destroy)(void *), fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    if ((unsigned)kind >= FSDP_HOOK_KINDS)
        return ctx ? api_fail(ctx, err, FSDP_E_INVALID, "fsdp_hook_add", "unknown hook kind %d", (int)kind)
                   : fsdp_err_set(err, FSDP_E_INVALID, "fsdp_hook_add: no context");
    return add(ctx, "fsdp_hook_add", (hook_entry){(char *)name, (int)kind, fn, NULL, user, destroy}, err);
}

int fsdp_pre_update_add(fsdp_ctx *ctx, const char *name, fsdp_pre_update_fn fn, void *user, void (*destroy)(void *),
                        fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    return add(ctx, "fsdp_pre_update_add", (hook_entry){(char *)name, PRE_UPDATE, NULL, fn, user, destroy}, err);
}

int api_hooks_remove(fsdp_ctx *ctx, const char *name) {
    hook_list *l = list_of(ctx, 0);
    int found = 0;
    for (size_t i = 0; l && name && i < l->n;) {
        if (strcmp(l->e[i].name, name)) {
            i++;
            continue;
        }
        entry_free(&l->e[i]);
        memmove(l->e + i, l->e + i + 1, (l->n - i - 1) * sizeof *l->e);
        l->n--;
        found = 1;
    }
    return found;
}

size_t api_hooks_count(fsdp_ctx *ctx, int k) {
    hook_list *l = ctx ? list_of(ctx, 0) : NULL;
    size_t n = 0;
    for (size_t i = 0; l && i < l->n; i++) n += l->e[i].kind == k;
    return n;
}

static const char *const KIND_NAMES[] = {"train start", "train end", "after save", "after load", "pre-update"};

int api_hooks_run(fsdp_ctx *ctx, const fsdp_hook_event *ev, fsdp_err *err) {
    if (!api_hooks_count(ctx, (int)ev->kind)) return 0;
    hook_list *l = list_of(ctx, 0);
    int rc = 0;
    fsdp_err lerr;
    fsdp_err_clear(&lerr);
    ctx->in_callback = 1;
    for (size_t i = 0; i < l->n && !rc; i++) {
        if (l->e[i].kind != (int)ev->kind) continue;
        rc = l->e[i].fn(ctx, ev, l->e[i].user, &lerr);
        if (rc && !lerr.msg[0]) snprintf(lerr.msg, sizeof lerr.msg, "failed (%s)", fsdp_err_code_name(rc));
        if (rc) fsdp_err_prefix(&lerr, "%s hook '%s' at step %lld", KIND_NAMES[ev->kind], l->e[i].name, (long long)ev->step);
    }
    ctx->in_callback = 0;
    if (rc) *err = lerr;
    return api_agree_result(ctx, ctx_world_comm(ctx), rc, err);
}

/* This rank's hooks, in the order they were added: skip if any skips, the product of the scales. */
static int pre_update_local(fsdp_ctx *ctx, hook_list *l, const fsdp_step_metrics *m, fsdp_update *u, fsdp_err *err) {
    int rc = 0;
    for (size_t i = 0; i < l->n && !rc; i++) {
        if (l->e[i].kind != PRE_UPDATE) continue;
        fsdp_update mine = {0, 1.0};
        rc = l->e[i].pre(ctx, m, &mine, l->e[i].user, err);
        if (!rc && !(mine.lr_scale > 0 && isfinite(mine.lr_scale)))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "lr_scale %g (expected a finite number > 0)", mine.lr_scale);
        if (rc && !err->msg[0]) snprintf(err->msg, sizeof err->msg, "failed (%s)", fsdp_err_code_name(rc));
        if (rc) fsdp_err_prefix(err, "pre-update hook '%s' at step %lld", l->e[i].name, (long long)m->step);
        u->skip |= mine.skip != 0;
        u->lr_scale *= mine.lr_scale;
    }
    return rc;
}

int api_pre_update_run(fsdp_ctx *ctx, const fsdp_step_metrics *m, fsdp_update *u, fsdp_err *err) {
    u->skip = 0;
    u->lr_scale = 1.0;
    if (!api_hooks_count(ctx, PRE_UPDATE)) return 0;
    hook_list *l = list_of(ctx, 0);
    fsdp_err lerr;
    fsdp_err_clear(&lerr);
    ctx->in_callback = ctx->in_pre_update = 1;
    int rc = pre_update_local(ctx, l, m, u, &lerr);
    ctx->in_callback = ctx->in_pre_update = 0;
    if (rc) *err = lerr;
    comm *w = ctx_world_comm(ctx);
    if ((rc = api_agree_result(ctx, w, rc, err))) return rc;
    /* skip: any rank's; the scale: every rank's the same */
    double v[3] = {u->skip ? 1.0 : 0.0, u->lr_scale, -u->lr_scale};
    if ((rc = comm_allreduce(w, v, 3, COMM_F64, COMM_MAX, err))) return rc;
    if (v[1] != -v[2])
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "the pre-update hooks gave lr_scale %.17g on some ranks and %.17g on others (every rank must "
                            "give the same)", -v[2], v[1]);
    u->skip = v[0] > 0;
    return 0;
}

static int own_field(const char *name) {
    static const char *const own[] = {"step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s", "mfu", "elapsed_s",
                                      "run_id", "run_start", "skipped", "eval_loss", "eval_tokens", NULL};
    for (const char *const *o = own; *o; o++)
        if (!strcmp(*o, name)) return 1;
    return !strncmp(name, "peak_", 5) || !strncmp(name, "ce_", 3) || !strncmp(name, "aux_", 4);
}

int fsdp_step_metric(fsdp_ctx *ctx, const char *name, double value, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_step_metric";
    if (!ctx) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no context", call);
    if (!ctx->in_callback) return api_fail(ctx, err, FSDP_E_INVALID, call, "only inside a train-steps callback or hook");
    size_t len = name ? strlen(name) : 0;
    int ok = len >= 1 && len <= 64;
    for (size_t i = 0; ok && i < len; i++) ok = isalnum((unsigned char)name[i]) || name[i] == '_' || name[i] == '.';
    if (!ok) return api_fail(ctx, err, FSDP_E_INVALID, call, "a metric name is 1-64 of a-z, A-Z, 0-9, '_', '.'");
    if (own_field(name)) return api_fail(ctx, err, FSDP_E_INVALID, call, "'%s' is one of train-steps' own fields", name);
    hook_list *l = list_of(ctx, 1);
    if (!l) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    for (size_t i = 0; i < l->n_metrics; i++)
        if (!strcmp(l->metric[i].name, name)) {
            l->metric[i].value = value;
            return 0;
        }
    if (l->n_metrics == STEP_METRICS_MAX)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "at most %d metrics a step", STEP_METRICS_MAX);
    snprintf(l->metric[l->n_metrics].name, sizeof l->metric[0].name, "%s", name);
    l->metric[l->n_metrics++].value = value;
    return 0;
}

void api_step_metrics_take(fsdp_ctx *ctx, char *buf, size_t cap) {
    hook_list *l = list_of(ctx, 0);
    size_t off = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; l && i < l->n_metrics && off < cap; i++) {
        double v = l->metric[i].value;
        if (isfinite(v)) off += (size_t)snprintf(buf + off, cap - off, ", \"%s\": %.9g", l->metric[i].name, v);
        else off += (size_t)snprintf(buf + off, cap - off, ", \"%s\": null", l->metric[i].name);
    }
    if (l) l->n_metrics = 0;
}

void api_step_metrics_clear(fsdp_ctx *ctx) {
    hook_list *l = list_of(ctx, 0);
    if (l) l->n_metrics = 0;
}
