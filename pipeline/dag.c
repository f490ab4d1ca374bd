/* The stage DAG of one recipe (pipeline/dag.h): dependencies, cycles, order, the state contract. */
#include "pipeline/dag.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/errlist.h"
#include "pipeline/strmap.h"

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

/* ---- the graph --------------------------------------------------------------------------------
 * Edges in compressed rows: stage i runs after deps[dep0[i] .. dep0[i+1]) (ascending), and before
 * the stages next[nxt0[i] .. nxt0[i+1]). Everything below is linear in stages + edges (the ready
 * queue adds a log): the planner of a recipe with a million stages takes seconds, not hours. */
typedef struct {
    size_t n;
    size_t *dep0, *deps; /* n + 1 offsets, then the edges */
    size_t *nxt0, *nxt;
    int bad; /* an `after:` id named no stage (graph_build_all collected them) */
} dag_graph;

static void graph_free(dag_graph *g) {
    free(g->dep0);
    free(g->deps);
    free(g->nxt0);
    free(g->nxt);
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static int unknown_after(const recipe *r, const recipe_stage *s, size_t k, fsdp_err *err) {
    char known[1024] = "";
    size_t off = 0;
    for (size_t q = 0; q < r->n_stages && off < sizeof known; q++)
        off += (size_t)snprintf(known + off, sizeof known - off, "%s%s", q ? ", " : "", r->stages[q].id);
    const fsdp_value *at = s->after_vals ? s->after_vals[k] : s->node;
    return fsdp_err_at(err, FSDP_E_INVALID, at, "stage '%s': after: unknown stage id '%s' (known ids: %s)", s->id,
                       s->after[k], known);
}

/* The dependency edges of r, ids resolved through a hash table; every unknown id into el (NULL: the first is the
 * error). */
static int graph_build_all(const recipe *r, dag_graph *g, errlist *el, fsdp_err *err);
static int graph_build(const recipe *r, dag_graph *g, fsdp_err *err) { return graph_build_all(r, g, NULL, err); }

static int graph_build_all(const recipe *r, dag_graph *g, errlist *el, fsdp_err *err) {
    size_t n = r->n_stages, m = 0;
    memset(g, 0, sizeof *g);
    g->n = n;
    for (size_t i = 0; i < n; i++) m += r->stages[i].n_after;
    strmap ids;
    strmap_init(&ids);
    g->dep0 = calloc(n + 1, sizeof *g->dep0);
    g->nxt0 = calloc(n + 2, sizeof *g->nxt0);
    g->deps = malloc((m ? m : 1) * sizeof *g->deps);
    g->nxt = malloc((m ? m : 1) * sizeof *g->nxt);
    int rc = !g->dep0 || !g->nxt0 || !g->deps || !g->nxt;
    for (size_t i = 0; i < n && !rc; i++) rc = strmap_put(&ids, r->stages[i].id, i);
    if (rc) {
        strmap_free(&ids);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    size_t e = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const recipe_stage *s = &r->stages[i];
        g->dep0[i] = e;
        for (size_t k = 0; k < s->n_after && !rc; k++) {
            size_t j = (size_t)-1;
            int found = strmap_get(&ids, s->after[k], &j) != 0;
            if (found && j == i && el) { /* collected; to dag_plan a stage after itself is a cycle */
                errlist_add_at(el, s->after_vals ? s->after_vals[k] : s->node,
                               "stage '%s': after: names the stage itself", s->id);
                g->bad = 1;
            } else if (found) {
                g->deps[e++] = j;
            } else if (!el) {
                rc = unknown_after(r, s, k, err);
            } else { /* collected: the walk goes on */
                fsdp_err one;
                unknown_after(r, s, k, &one);
                errlist_add(el, &one);
                                g->bad = 1;
            }
        }
        qsort(g->deps + g->dep0[i], e - g->dep0[i], sizeof *g->deps, cmp_size);
    }
    strmap_free(&ids);
    if (rc) return rc;
    g->dep0[n] = e; /* collected errors (g->bad): the graph of the known edges is still built */
    /* reverse edges: count per target, prefix sums, fill */
    for (size_t k = 0; k < e; k++) g->nxt0[g->deps[k] + 2]++;
    for (size_t i = 0; i < n; i++) g->nxt0[i + 2] += g->nxt0[i + 1];
    for (size_t i = 0; i < n; i++)
        for (size_t k = g->dep0[i]; k < g->dep0[i + 1]; k++) g->nxt[g->nxt0[g->deps[k] + 1]++] = i;
    return 0;
}

/* Depth-first search for a cycle, in the order of the stages and of their (sorted) dependencies;
 * on finding one writes "a -> b -> a" into msg and returns the stage where the cycle was entered,
 * else -1. Iterative: a chain of a million stages needs no million stack frames. */
static long find_cycle(const recipe *r, const dag_graph *g, int *color, size_t *path, size_t *pos, char *msg,
                       size_t cap) {
    for (size_t s = 0; s < g->n; s++) {
        if (color[s]) continue;
        size_t depth = 0;
        path[0] = s;
        pos[0] = g->dep0[s];
        color[s] = 1;
        while (1) {
            size_t v = path[depth];
            if (pos[depth] == g->dep0[v + 1]) {
                color[v] = 2;
                if (depth == 0) break;
                depth--;
                continue;
            }
            size_t j = g->deps[pos[depth]++];
            if (color[j] == 1) {
                size_t start = 0, off = 0;
                while (path[start] != j) start++;
                msg[0] = '\0';
                for (size_t q = start; q <= depth && off < cap; q++)
                    off += (size_t)snprintf(msg + off, cap - off, "%s -> ", r->stages[path[q]].id);
                if (off < cap) snprintf(msg + off, cap - off, "%s", r->stages[j].id);
                return (long)j;
            }
            if (color[j] == 0) {
                color[j] = 1;
                depth++;
                path[depth] = j;
                pos[depth] = g->dep0[j];
            }
        }
    }
    return -1;
}

/* A binary min-heap of stage indices: among ready stages the earliest in the file goes first. */
typedef struct {
    size_t *a;
    size_t n;
} ready_heap;

static void heap_push(ready_heap *h, size_t v) {
    size_t i = h->n++;
    while (i > 0 && h->a[(i - 1) / 2] > v) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = v;
}

static size_t heap_pop(ready_heap *h) {
    size_t top = h->a[0], v = h->a[--h->n], i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->a[c + 1] < h->a[c]) c++;
        if (h->a[c] >= v) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = v;
    return top;
}

/* Kahn's algorithm with the heap; order gets every stage (the graph has no cycle). */
static int topo_order(const dag_graph *g, size_t *order, fsdp_err *err) {
    size_t *indeg = malloc((g->n ? g->n : 1) * sizeof *indeg);
    ready_heap h = {malloc((g->n ? g->n : 1) * sizeof *h.a), 0};
    if (!indeg || !h.a) {
        free(indeg);
        free(h.a);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < g->n; i++) {
        indeg[i] = g->dep0[i + 1] - g->dep0[i];
        if (!indeg[i]) heap_push(&h, i);
    }
    size_t k = 0;
    while (h.n) {
        size_t v = heap_pop(&h);
        order[k++] = v;
        for (size_t q = g->nxt0[v]; q < g->nxt0[v + 1]; q++)
            if (--indeg[g->nxt[q]] == 0) heap_push(&h, g->nxt[q]);
    }
    free(indeg);
    free(h.a);
    return k == g->n ? 0 : fsdp_err_set(err, FSDP_E_INVALID, "the stage graph has a cycle");
}

/* ---- the state contract -------------------------------------------------------------------------
 * Every state name some stage provides gets a bit; up[i] holds the states provided upstream of
 * stage i (by any ancestor), built in execution order from its direct dependencies. */
typedef struct {
    strmap bits; /* state name -> bit */
    size_t words; /* 64-bit words per stage */
    uint64_t *prov, *up; /* n * words each */
} dag_states;

static void states_free(dag_states *st) {
    strmap_free(&st->bits);
    free(st->prov);
    free(st->up);
}

static int states_build(const recipe *r, const dag_graph *g, const size_t *order, dag_states *st) {
    strmap_init(&st->bits);
    size_t nbits = 0, n = g->n;
    for (size_t i = 0; i < n; i++)
        for (const char *const *p = r->stages[i].desc->provides; p && *p; p++) {
            size_t b;
            if (!strmap_get(&st->bits, *p, &b) && strmap_put(&st->bits, *p, nbits++)) return -1;
        }
    st->words = nbits / 64 + 1;
    if (n && st->words > SIZE_MAX / n / sizeof(uint64_t)) return -1;
    st->prov = calloc(n * st->words + 1, sizeof(uint64_t));
    st->up = calloc(n * st->words + 1, sizeof(uint64_t));
    if (!st->prov || !st->up) return -1;
    for (size_t i = 0; i < n; i++)
        for (const char *const *p = r->stages[i].desc->provides; p && *p; p++) {
            size_t b;
            strmap_get(&st->bits, *p, &b);
            st->prov[i * st->words + b / 64] |= (uint64_t)1 << (b % 64);
        }
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        uint64_t *up = st->up + i * st->words;
        for (size_t q = g->dep0[i]; q < g->dep0[i + 1]; q++) {
            size_t j = g->deps[q];
            for (size_t w = 0; w < st->words; w++) up[w] |= st->up[j * st->words + w] | st->prov[j * st->words + w];
        }
    }
    return 0;
}

/* Whether need ("a|b": any of them) is provided upstream of stage i. */
static int upstream_meets(const dag_states *st, size_t i, const char *need) {
    for (const char *p = need; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        char buf[128], *one = len < sizeof buf ? buf : malloc(len + 1);
        size_t b;
        if (!one) return 0;
        memcpy(one, p, len);
        one[len] = '\0';
        int met = strmap_get(&st->bits, one, &b) && (st->up[i * st->words + b / 64] >> (b % 64) & 1);
        if (one != buf) free(one);
        if (met) return 1;
        p += len + (bar ? 1 : 0);
    }
    return 0;
}

static int unmet_need(const fsdp_registry *reg, const recipe_stage *s, const char *need, fsdp_err *err) {
    char prov[512] = "";
    size_t pl = 0;
    for (const char *q = need; *q;) {
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
    return fsdp_err_at(err, FSDP_E_INVALID, s->uses_node,
                       "stage '%s' (%s) needs '%s', which no upstream stage provides (stages that provide "
                       "it: %s; list one of them under `after`)",
                       s->id, s->desc->name, need, prov[0] ? prov : "none registered");
}

static int check_contract(const recipe *r, const fsdp_registry *reg, const dag_state *initial, const dag_graph *g,
                          const size_t *order, fsdp_err *err) {
    dag_states st = {0};
    if (states_build(r, g, order, &st)) {
        states_free(&st);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    int rc = 0;
    for (size_t k = 0; k < g->n && !rc; k++) {
        size_t i = order[k];
        const recipe_stage *s = &r->stages[i];
        for (const char *const *need = s->desc->needs; need && *need && !rc; need++)
            if (!state_meets(initial, *need) && !upstream_meets(&st, i, *need)) rc = unmet_need(reg, s, *need, err);
    }
    states_free(&st);
    return rc;
}

int dag_check_graph(const recipe *r, errlist *el) {
    size_t n = r->n_stages;
    dag_graph g;
    fsdp_err err;
    int rc = graph_build_all(r, &g, el, &err);
    if (rc) errlist_add(el, &err); /* out of memory */
    int *color = rc ? NULL : calloc(n ? n : 1, sizeof *color);
    size_t *path = rc ? NULL : malloc((n ? n : 1) * sizeof *path), *pos = rc ? NULL : malloc((n ? n : 1) * sizeof *pos);
    if (!rc && color && path && pos) { /* the graph of the known edges: its cycle, if any */
        char msg[2048];
        long c = find_cycle(r, &g, color, path, pos, msg, sizeof msg);
        if (c >= 0) {
            errlist_add_at(el, r->stages[c].node, "cycle in the stage graph (each stage runs after the next): %s", msg);
            rc = FSDP_E_INVALID;
        }
    }
    int bad = g.bad;
    graph_free(&g);
    free(color), free(path), free(pos);
    return rc || bad ? 1 : 0;
}

int dag_plan(const recipe *r, const fsdp_registry *reg, const dag_state *initial, size_t *order,
             dag_state *after_state, fsdp_err *err) {
    size_t n = r->n_stages;
    dag_graph g;
    int rc = graph_build(r, &g, err);
    if (rc) {
        graph_free(&g);
        return rc;
    }
    int *color = calloc(n ? n : 1, sizeof *color);
    size_t *path = malloc((n ? n : 1) * sizeof *path), *pos = malloc((n ? n : 1) * sizeof *pos);
    if (!color || !path || !pos) {
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        goto out;
    }
    char msg[2048];
    long c = find_cycle(r, &g, color, path, pos, msg, sizeof msg);
    if (c >= 0) {
        rc = fsdp_err_at(err, FSDP_E_INVALID, r->stages[c].node,
                         "cycle in the stage graph (each stage runs after the next): %s", msg);
        goto out;
    }
    if ((rc = topo_order(&g, order, err))) goto out;
    if ((rc = check_contract(r, reg, initial, &g, order, err))) goto out;
    for (size_t i = 0; after_state && i < n; i++)
        for (const char *const *p = r->stages[i].desc->provides; p && *p; p++)
            if (dag_state_add(after_state, *p)) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                goto out;
            }
out:
    graph_free(&g);
    free(color);
    free(path);
    free(pos);
    return rc;
}
