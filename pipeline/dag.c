#include "pipeline/dag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dag_state_add(dag_state *s, const char *name) {
    if (dag_state_has(s, name)) return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        char **nn = realloc(s->names, cap * sizeof *nn);
        if (!nn) return -1;
        s->names = nn;
        s->cap = cap;
    }
    s->names[s->n] = strdup(name);
    if (!s->names[s->n]) return -1;
    s->n++;
    return 0;
}

int dag_state_has(const dag_state *s, const char *name) {
    for (size_t i = 0; s && i < s->n; i++)
        if (!strcmp(s->names[i], name)) return 1;
    return 0;
}

/* a need "a|b" is met by any of its alternatives */
static int need_met_by(const char *need, const char *have) {
    size_t hl = strlen(have);
    for (const char *p = need; *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == hl && !strncmp(p, have, n)) return 1;
        p += n + (bar ? 1 : 0);
    }
    return 0;
}

static int state_meets(const dag_state *s, const char *need) {
    for (size_t i = 0; s && i < s->n; i++)
        if (need_met_by(need, s->names[i])) return 1;
    return 0;
}

void dag_state_free(dag_state *s) {
    for (size_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->names);
    memset(s, 0, sizeof *s);
}

static long find_id(const recipe *r, const char *id) {
    for (size_t i = 0; i < r->n_stages; i++)
        if (!strcmp(r->stages[i].id, id)) return (long)i;
    return -1;
}

/* deps[i*n + j] = 1 when stage i runs after stage j directly */
static int resolve_edges(const recipe *r, unsigned char *deps, fsdp_err *err) {
    size_t n = r->n_stages;
    for (size_t i = 0; i < n; i++) {
        const recipe_stage *s = &r->stages[i];
        for (size_t k = 0; k < s->n_after; k++) {
            long j = find_id(r, s->after[k]);
            if (j < 0) {
                char known[1024] = "";
                size_t off = 0;
                for (size_t q = 0; q < n && off < sizeof known; q++)
                    off += (size_t)snprintf(known + off, sizeof known - off, "%s%s", q ? ", " : "", r->stages[q].id);
                const fsdp_value *at = s->after_vals ? s->after_vals[k] : s->node;
                return fsdp_err_at(err, FSDP_E_INVALID, at, "stage '%s': after: unknown stage id '%s' (known ids: %s)",
                                   s->id, s->after[k], known);
            }
            deps[i * n + (size_t)j] = 1;
        }
    }
    return 0;
}

/* DFS for a cycle; on finding one writes "a -> b -> a" into msg and returns the index
 * of the stage where the cycle was entered. */
static long dfs_cycle(const recipe *r, const unsigned char *deps, size_t v, int *color, size_t *stack, size_t depth,
                      char *msg, size_t cap) {
    size_t n = r->n_stages;
    color[v] = 1;
    stack[depth] = v;
    for (size_t j = 0; j < n; j++) {
        if (!deps[v * n + j]) continue;
        if (color[j] == 1) {
            /* cycle: j ... v -> j, printed in the order "j -> ... -> v -> j" as dependencies */
            size_t start = 0;
            while (stack[start] != j) start++;
            size_t off = 0;
            msg[0] = '\0';
            for (size_t q = start; q <= depth && off < cap; q++)
                off += (size_t)snprintf(msg + off, cap - off, "%s -> ", r->stages[stack[q]].id);
            if (off < cap) snprintf(msg + off, cap - off, "%s", r->stages[j].id);
            return (long)j;
        }
        if (color[j] == 0) {
            long c = dfs_cycle(r, deps, j, color, stack, depth + 1, msg, cap);
            if (c >= 0) return c;
        }
    }
    color[v] = 2;
    return -1;
}

int dag_plan(const recipe *r, const fsdp_registry *reg, const dag_state *initial, size_t *order,
             dag_state *after_state, fsdp_err *err) {
    size_t n = r->n_stages;
    unsigned char *deps = calloc(n * n, 1);
    unsigned char *anc = calloc(n * n, 1);
    int *color = calloc(n, sizeof *color);
    size_t *stack = calloc(n + 1, sizeof *stack);
    int *done = calloc(n, sizeof *done);
    int rc = 0;
    if (!deps || !anc || !color || !stack || !done) {
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = resolve_edges(r, deps, err))) goto out;
    for (size_t i = 0; i < n; i++) {
        if (color[i]) continue;
        char msg[2048];
        long c = dfs_cycle(r, deps, i, color, stack, 0, msg, sizeof msg);
        if (c >= 0) {
            rc = fsdp_err_at(err, FSDP_E_INVALID, r->stages[c].node,
                             "cycle in the stage graph (each stage runs after the next): %s", msg);
            goto out;
        }
    }
    /* Kahn's algorithm; among ready stages the earliest in the file goes first. */
    for (size_t k = 0; k < n; k++) {
        size_t pick = n;
        for (size_t i = 0; i < n && pick == n; i++) {
            if (done[i]) continue;
            int ready = 1;
            for (size_t j = 0; j < n && ready; j++)
                if (deps[i * n + j] && !done[j]) ready = 0;
            if (ready) pick = i;
        }
        if (pick == n) { /* unreachable after the cycle check */
            rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: the stage graph has a cycle", r->path);
            goto out;
        }
        done[pick] = 1;
        order[k] = pick;
        /* ancestors of pick = its direct deps and their ancestors (already computed) */
        for (size_t j = 0; j < n; j++) {
            if (!deps[pick * n + j]) continue;
            anc[pick * n + j] = 1;
            for (size_t q = 0; q < n; q++)
                if (anc[j * n + q]) anc[pick * n + q] = 1;
        }
    }
    /* State contract: every need must be provided upstream (or by an earlier recipe). */
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        const recipe_stage *s = &r->stages[i];
        for (const char *const *need = s->desc->needs; need && *need; need++) {
            int ok = state_meets(initial, *need);
            for (size_t j = 0; j < n && !ok; j++) {
                if (!anc[i * n + j]) continue;
                for (const char *const *p = r->stages[j].desc->provides; p && *p && !ok; p++)
                    if (need_met_by(*need, *p)) ok = 1;
            }
            if (!ok) {
                char prov[512] = "";
                size_t pl = 0;
                for (const char *q = *need; *q;) {
                    const char *bar = strchr(q, '|');
                    char one[64];
                    size_t n = bar ? (size_t)(bar - q) : strlen(q);
                    snprintf(one, sizeof one, "%.*s", (int)n, q);
                    if (pl < sizeof prov) {
                        if (pl) pl += (size_t)snprintf(prov + pl, sizeof prov - pl, ", ");
                        registry_providers(reg, one, prov + pl, sizeof prov - pl);
                        pl = strlen(prov);
                    }
                    q += n + (bar ? 1 : 0);
                }
                rc = fsdp_err_at(err, FSDP_E_INVALID, s->uses_node,
                                 "stage '%s' (%s) needs '%s', which no upstream stage provides (stages that provide "
                                 "it: %s; list one of them under `after`)",
                                 s->id, s->desc->name, *need, prov[0] ? prov : "none registered");
                goto out;
            }
        }
    }
    if (after_state) {
        for (size_t i = 0; i < n; i++)
            for (const char *const *p = r->stages[i].desc->provides; p && *p; p++)
                if (dag_state_add(after_state, *p)) {
                    rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                    goto out;
                }
    }
out:
    free(deps);
    free(anc);
    free(color);
    free(stack);
    free(done);
    return rc;
}
