/* Brace expansion of table names (see mt_names.h). */
#include "model/mt_names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GROUPS_MAX 16

typedef struct group {
    const char *lit; /* literal text before the group */
    size_t lit_len;
    char **alts;     /* the group's expansions */
    size_t n_alts;
} group;

void mt_names_free(mt_names *n) {
    for (size_t i = 0; i < n->n; i++) free(n->v[i]);
    free(n->v);
    n->v = NULL;
    n->n = 0;
}

static void free_groups(group *g, int n) {
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < g[i].n_alts; k++) free(g[i].alts[k]);
        free(g[i].alts);
    }
}

static int nomem(fsdp_err *err) { return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory expanding names"); }

/* A range {a..b}: its two bounds evaluated (or checked) in d. */
static int range_group(const char *body, size_t len, const char *dots, mt_dims *d, const fsdp_value *at, int eval,
                       group *g, fsdp_err *err) {
    char a[256], b[256];
    size_t la = (size_t)(dots - body), lb = len - la - 2;
    if (la >= sizeof a || lb >= sizeof b)
        return fsdp_err_at(err, FSDP_E_INVALID, at, "model: name range '{%.*s}' is too long", (int)len, body);
    snprintf(a, sizeof a, "%.*s", (int)la, body);
    snprintf(b, sizeof b, "%.*s", (int)lb, dots + 2);
    if (!eval) {
        int rc = mt_dims_check(d, a, at, err);
        return rc ? rc : mt_dims_check(d, b, at, err);
    }
    int64_t lo, hi;
    int rc = mt_dims_eval(d, a, at, &lo, err);
    if (!rc) rc = mt_dims_eval(d, b, at, &hi, err);
    if (rc) return rc;
    if (hi >= lo && (hi - lo >= MT_NAMES_MAX || lo < -((int64_t)1 << 62) || hi > ((int64_t)1 << 62)))
        return fsdp_err_at(err, FSDP_E_INVALID, at, "model: name range {%lld..%lld} has more than %d values",
                           (long long)lo, (long long)hi, MT_NAMES_MAX);
    size_t n = hi >= lo ? (size_t)(hi - lo + 1) : 0;
    g->alts = calloc(n ? n : 1, sizeof *g->alts);
    if (!g->alts) return nomem(err);
    for (size_t k = 0; k < n; k++) {
        char num[32];
        snprintf(num, sizeof num, "%lld", (long long)(lo + (int64_t)k));
        if (!(g->alts[k] = strdup(num))) return nomem(err);
        g->n_alts++;
    }
    return 0;
}

/* Alternatives {x,y,z}. */
static int alt_group(const char *body, size_t len, const fsdp_value *at, group *g, fsdp_err *err) {
    size_t n = 1;
    for (size_t i = 0; i < len; i++) n += body[i] == ',';
    g->alts = calloc(n, sizeof *g->alts);
    if (!g->alts) return nomem(err);
    const char *s = body;
    for (size_t k = 0; k < n; k++) {
        const char *e = memchr(s, ',', (size_t)(body + len - s));
        if (!e) e = body + len;
        if (e == s)
            return fsdp_err_at(err, FSDP_E_INVALID, at, "model: name group '{%.*s}' has an empty alternative", (int)len,
                               body);
        if (!(g->alts[k] = strndup(s, (size_t)(e - s)))) return nomem(err);
        g->n_alts++;
        s = e + 1;
    }
    return 0;
}

static int parse_groups(const char *pattern, mt_dims *d, const fsdp_value *at, int eval, group *g, int *ng,
                        const char **tail, fsdp_err *err) {
    const char *s = pattern;
    *ng = 0;
    for (;;) {
        const char *open = strchr(s, '{'), *close = strchr(s, '}');
        if (close && (!open || close < open))
            return fsdp_err_at(err, FSDP_E_INVALID, at, "model: name '%s' has a '}' without its '{'", pattern);
        if (!open) break;
        close = strchr(open + 1, '}');
        const char *inner = strchr(open + 1, '{');
        if (!close || (inner && inner < close))
            return fsdp_err_at(err, FSDP_E_INVALID, at, "model: name '%s' has a '{' without its '}' (groups do not nest)",
                               pattern);
        if (*ng == GROUPS_MAX)
            return fsdp_err_at(err, FSDP_E_INVALID, at, "model: name '%s' has more than %d brace groups", pattern,
                               GROUPS_MAX);
        group *gr = &g[(*ng)++];
        gr->lit = s;
        gr->lit_len = (size_t)(open - s);
        const char *body = open + 1;
        size_t len = (size_t)(close - body);
        const char *dots = strstr(body, "..");
        int rc = dots && dots < close ? range_group(body, len, dots, d, at, eval, gr, err)
                                      : alt_group(body, len, at, gr, err);
        if (rc) return rc;
        s = close + 1;
    }
    *tail = s;
    return 0;
}

int mt_names_expand(const char *pattern, mt_dims *d, const fsdp_value *at, int eval, mt_names *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    if (!pattern || !*pattern) return fsdp_err_at(err, FSDP_E_INVALID, at, "model: a parameter has an empty name");
    group g[GROUPS_MAX];
    memset(g, 0, sizeof g);
    int ng = 0;
    const char *tail = pattern;
    int rc = parse_groups(pattern, d, at, eval, g, &ng, &tail, err);
    size_t total = 1;
    for (int i = 0; !rc && i < ng; i++)
        if (__builtin_mul_overflow(total, g[i].n_alts, &total) || total > MT_NAMES_MAX)
            rc = fsdp_err_at(err, FSDP_E_INVALID, at, "model: name '%s' expands to more than %d names", pattern,
                             MT_NAMES_MAX);
    if (!rc && eval && total) { /* an empty range expands to no name and allocates nothing */
        out->v = calloc(total, sizeof *out->v);
        if (!out->v) rc = nomem(err);
        char buf[MT_NAME_MAX + 2];
        for (size_t k = 0; !rc && k < total; k++) {
            size_t o = 0, rem = k, div = total;
            int full = 0;
            for (int i = 0; i < ng && !full; i++) {
                div /= g[i].n_alts;
                const char *alt = g[i].alts[rem / div];
                rem %= div;
                int w = snprintf(buf + o, sizeof buf - o, "%.*s%s", (int)g[i].lit_len, g[i].lit, alt);
                full = w < 0 || (size_t)w >= sizeof buf - o;
                if (!full) o += (size_t)w;
            }
            if (!full) {
                int w = snprintf(buf + o, sizeof buf - o, "%s", tail);
                full = w < 0 || (size_t)w >= sizeof buf - o;
            }
            if (full) {
                rc = fsdp_err_at(err, FSDP_E_INVALID, at, "model: a name of '%s' is longer than %d bytes", pattern,
                                 MT_NAME_MAX);
                break;
            }
            if (!(out->v[k] = strdup(buf))) rc = nomem(err);
            else out->n++;
        }
    }
    free_groups(g, ng);
    if (rc) mt_names_free(out);
    return rc;
}
