/* The runtime context: rank, sections of the current recipe, metrics, state, attachments. */
#include "runtime/ctx_impl.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double ctx_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

fsdp_ctx *ctx_new(comm *cm, int verbosity, FILE *log) {
    fsdp_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->comm = cm;
    c->rank = cm ? comm_rank(cm) : 0;
    c->world = cm ? comm_size(cm) : 1;
    c->verbosity = verbosity;
    c->log = log ? log : stderr;
    c->log_is_tty = isatty(fileno(c->log));
    c->t0 = ctx_now();
    c->api_timeout_s = CTX_API_TIMEOUT_DEFAULT;
    /* collective: every rank makes its context at the same point of run_main */
    fsdp_err e;
    if (cm && comm_size(cm) > 1 && comm_dup(cm, &c->api_comm, &e)) c->api_comm = NULL;
    return c;
}

int ctx_add_finisher(fsdp_ctx *ctx, const char *name, void *ptr, ctx_finish_fn fn, void (*destroy)(void *),
                     fsdp_err *err) {
    ctx_finisher *nf = realloc(ctx->fin, (ctx->n_fin + 1) * sizeof *nf);
    char *n = strdup(name);
    if (!nf || !n) {
        free(n);
        if (nf) ctx->fin = nf;
        if (destroy) destroy(ptr);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    ctx->fin = nf;
    ctx->fin[ctx->n_fin].name = n;
    ctx->fin[ctx->n_fin].ptr = ptr;
    ctx->fin[ctx->n_fin].fn = fn;
    ctx->fin[ctx->n_fin].destroy = destroy;
    ctx->fin[ctx->n_fin].poll = NULL;
    ctx->n_fin++;
    return 0;
}

static int run_one(fsdp_ctx *ctx, size_t i, fsdp_err *err) {
    ctx_finisher f = ctx->fin[i];
    memmove(ctx->fin + i, ctx->fin + i + 1, (ctx->n_fin - i - 1) * sizeof *ctx->fin);
    ctx->n_fin--;
    int rc = f.fn ? f.fn(ctx, f.ptr, err) : 0;
    if (f.destroy) f.destroy(f.ptr);
    free(f.name);
    return rc;
}

void ctx_set_finisher_poll(fsdp_ctx *ctx, ctx_poll_fn poll) {
    if (ctx->n_fin) ctx->fin[ctx->n_fin - 1].poll = poll;
}

int ctx_poll_finishers(fsdp_ctx *ctx, fsdp_err *err) {
    int first = 0;
    for (size_t i = 0; i < ctx->n_fin;) {
        int done = 0, rc = 0;
        fsdp_err e2;
        fsdp_err_clear(&e2);
        if (ctx->fin[i].poll) rc = ctx->fin[i].poll(ctx, ctx->fin[i].ptr, &done, &e2);
        if (!rc && done) rc = run_one(ctx, i, &e2);
        else i++;
        if (rc && !first) {
            first = rc;
            *err = e2;
        }
    }
    return first;
}

int ctx_run_finisher(fsdp_ctx *ctx, const char *name, fsdp_err *err) {
    for (size_t i = 0; i < ctx->n_fin; i++)
        if (!strcmp(ctx->fin[i].name, name)) return run_one(ctx, i, err);
    return 0;
}

int ctx_run_finishers(fsdp_ctx *ctx, fsdp_err *err) {
    int first = 0;
    while (ctx->n_fin) {
        fsdp_err e2;
        fsdp_err_clear(&e2);
        int rc = run_one(ctx, 0, &e2);
        if (rc && !first) {
            first = rc;
            *err = e2;
        }
    }
    return first;
}

void ctx_free(fsdp_ctx *ctx) {
    if (!ctx) return;
    ctx_progress_close(ctx);
    for (size_t i = 0; i < ctx->n_fin; i++) {
        if (ctx->fin[i].destroy) ctx->fin[i].destroy(ctx->fin[i].ptr);
        free(ctx->fin[i].name);
    }
    free(ctx->fin);
    for (size_t i = ctx->n_att; i-- > 0;) {
        if (ctx->att[i].destroy) ctx->att[i].destroy(ctx->att[i].ptr);
        free(ctx->att[i].name);
    }
    free(ctx->att);
    for (size_t i = 0; i < ctx->n_state; i++) free(ctx->state[i]);
    free(ctx->state);
    mesh_free(ctx->mesh);
    comm_destroy(ctx->api_comm);
    free(ctx);
}

comm *ctx_world_comm(fsdp_ctx *ctx) {
    if (ctx->comm) return ctx->comm;
    comm *c = fsdp_ctx_attached(ctx, "fsdp.comm.single");
    if (c) return c;
    fsdp_err e;
    if (comm_create_single(&c, &e)) return NULL;
    if (fsdp_ctx_attach(ctx, "fsdp.comm.single", c, (void (*)(void *))comm_destroy)) {
        comm_destroy(c);
        return NULL;
    }
    return c;
}

comm *ctx_api_comm(fsdp_ctx *ctx) {
    if (ctx->api_comm) return ctx->api_comm;
    comm *w = ctx_world_comm(ctx);
    return w && comm_size(w) == 1 ? w : NULL;
}

comm *ctx_shard_comm(fsdp_ctx *ctx) { return ctx->mesh ? ctx->mesh->shard : ctx_world_comm(ctx); }
comm *ctx_replicate_comm(const fsdp_ctx *ctx) { return ctx->mesh && ctx->mesh->R > 1 ? ctx->mesh->replicate : NULL; }

void ctx_metrics_free(ctx_metrics *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) {
        free(m->items[i].name);
        free(m->items[i].str);
    }
    free(m->items);
    m->items = NULL;
    m->n = m->cap = 0;
}

int fsdp_ctx_rank(const fsdp_ctx *ctx) { return ctx ? ctx->rank : -1; }
int fsdp_ctx_world_size(const fsdp_ctx *ctx) { return ctx ? ctx->world : 0; }
const char *fsdp_ctx_recipe_name(const fsdp_ctx *ctx) { return ctx ? ctx->recipe_name : NULL; }
const char *fsdp_ctx_recipe_path(const fsdp_ctx *ctx) { return ctx ? ctx->recipe_path : NULL; }
const char *fsdp_ctx_run_id(const fsdp_ctx *ctx) { return ctx ? ctx->run_id : NULL; }
const char *fsdp_ctx_run_start(const fsdp_ctx *ctx) { return ctx ? ctx->run_start : NULL; }

void ctx_set_run(fsdp_ctx *ctx, double start, uint32_t random) {
    time_t s = (time_t)start;
    struct tm tm;
    gmtime_r(&s, &tm);
    snprintf(ctx->run_id, sizeof ctx->run_id, "%04d%02d%02dT%02d%02d%02dZ-%08x", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)random);
    snprintf(ctx->run_start, sizeof ctx->run_start, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)((start - (double)s) * 1000));
}
const char *fsdp_ctx_stage_id(const fsdp_ctx *ctx) { return ctx ? ctx->stage_id : NULL; }
const fsdp_value *fsdp_ctx_stage_args(const fsdp_ctx *ctx) { return ctx ? ctx->stage_with : NULL; }

const fsdp_value *fsdp_ctx_section(const fsdp_ctx *ctx, const char *name) {
    return ctx && name ? fsdp_value_get(ctx->root, name) : NULL;
}

static ctx_metric *metric_slot(fsdp_ctx *ctx, const char *name) {
    ctx_metrics *m = ctx && name ? ctx->metrics : NULL;
    if (!m) return NULL;
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->items[i].name, name)) return &m->items[i];
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        ctx_metric *ni = realloc(m->items, cap * sizeof *ni);
        if (!ni) return NULL;
        m->items = ni;
        m->cap = cap;
    }
    ctx_metric *s = &m->items[m->n];
    memset(s, 0, sizeof *s);
    s->name = strdup(name);
    if (!s->name) return NULL;
    m->n++;
    return s;
}

void fsdp_ctx_metric(fsdp_ctx *ctx, const char *name, double value) {
    ctx_metric *s = metric_slot(ctx, name);
    if (!s) return;
    free(s->str);
    s->str = NULL;
    s->is_str = 0;
    s->num = value;
}

void fsdp_ctx_metric_str(fsdp_ctx *ctx, const char *name, const char *value) {
    ctx_metric *s = metric_slot(ctx, name);
    if (!s) return;
    char *v = strdup(value ? value : "");
    if (!v) return;
    free(s->str);
    s->str = v;
    s->is_str = 1;
}

int fsdp_ctx_has_state(const fsdp_ctx *ctx, const char *name) {
    if (!ctx || !name) return 0;
    for (size_t i = 0; i < ctx->n_state; i++)
        if (!strcmp(ctx->state[i], name)) return 1;
    return 0;
}

void fsdp_ctx_set_state(fsdp_ctx *ctx, const char *name, int present) {
    if (!ctx || !name) return;
    for (size_t i = 0; i < ctx->n_state; i++) {
        if (!strcmp(ctx->state[i], name)) {
            if (!present) {
                free(ctx->state[i]);
                ctx->state[i] = ctx->state[--ctx->n_state];
            }
            return;
        }
    }
    if (!present) return;
    if (ctx->n_state == ctx->cap_state) {
        size_t cap = ctx->cap_state ? ctx->cap_state * 2 : 8;
        char **ns = realloc(ctx->state, cap * sizeof *ns);
        if (!ns) return;
        ctx->state = ns;
        ctx->cap_state = cap;
    }
    char *s = strdup(name);
    if (s) ctx->state[ctx->n_state++] = s;
}

int fsdp_ctx_attach(fsdp_ctx *ctx, const char *name, void *ptr, void (*destroy)(void *)) {
    if (!ctx || !name) return FSDP_E_INVALID;
    for (size_t i = 0; i < ctx->n_att; i++) {
        if (!strcmp(ctx->att[i].name, name)) {
            if (ctx->att[i].destroy && ctx->att[i].ptr != ptr) ctx->att[i].destroy(ctx->att[i].ptr);
            ctx->att[i].ptr = ptr;
            ctx->att[i].destroy = destroy;
            return 0;
        }
    }
    if (ctx->n_att == ctx->cap_att) {
        size_t cap = ctx->cap_att ? ctx->cap_att * 2 : 8;
        ctx_attachment *na = realloc(ctx->att, cap * sizeof *na);
        if (!na) return FSDP_E_NOMEM;
        ctx->att = na;
        ctx->cap_att = cap;
    }
    char *n = strdup(name);
    if (!n) return FSDP_E_NOMEM;
    ctx->att[ctx->n_att].name = n;
    ctx->att[ctx->n_att].ptr = ptr;
    ctx->att[ctx->n_att].destroy = destroy;
    ctx->n_att++;
    return 0;
}

void *fsdp_ctx_attached(const fsdp_ctx *ctx, const char *name) {
    if (!ctx || !name) return NULL;
    for (size_t i = 0; i < ctx->n_att; i++)
        if (!strcmp(ctx->att[i].name, name)) return ctx->att[i].ptr;
    return NULL;
}
