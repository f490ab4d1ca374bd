/* `when:` on list items: evaluated once the tree is final (includes merged, --set applied, ${var}
 * substituted). A false item leaves its list, a true one loses the key, so no schema ever sees it.
 *
 * Stages keep the DAG whole: a removed stage's effective dependencies are its `after` list (or, without
 * one, the previous stage of the file), removed ids replaced recursively by their own. A remaining
 * stage's `after` entry naming a removed stage is replaced by that stage's effective dependencies; a
 * remaining stage without `after` whose previous stage was removed gets the previous stage's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/recipe.h"
#include "pipeline/strmap.h"

/* ---- the texts as written ----------------------------------------------------------------------- */

static int cmp_node(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const recipe_when_text *)a)->node, y = (uintptr_t)((const recipe_when_text *)b)->node;
    return x < y ? -1 : x > y;
}

static int capture_one(recipe_when_texts *wt, const fsdp_value *w) {
    if (wt->n == wt->cap) {
        size_t cap = wt->cap ? wt->cap * 2 : 8;
        recipe_when_text *items = realloc(wt->items, cap * sizeof *items);
        if (!items) return -1;
        wt->items = items;
        wt->cap = cap;
    }
    recipe_when_text *t = &wt->items[wt->n];
    if (!(t->text = strdup(w->text))) return -1;
    t->node = w;
    t->line = w->line;
    t->col = w->col;
    wt->n++;
    return 0;
}

/* The `when:` of every list item that references a variable. */
static int capture_tree(recipe_when_texts *wt, const fsdp_value *v) {
    if (v->kind != FSDP_V_LIST && v->kind != FSDP_V_MAP) return 0;
    for (size_t i = 0; i < v->n; i++) {
        const fsdp_value *c = v->items[i];
        const fsdp_value *w = v->kind == FSDP_V_LIST ? fsdp_value_get(c, "when") : NULL;
        if (w && w->kind == FSDP_V_SCALAR && strchr(w->text, '$') && capture_one(wt, w)) return -1;
        if (capture_tree(wt, c)) return -1;
    }
    return 0;
}

int recipe_when_capture(const fsdp_value *root, recipe_when_texts *wt, fsdp_err *err) {
    memset(wt, 0, sizeof *wt);
    if (capture_tree(wt, root)) {
        recipe_when_texts_free(wt);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    if (wt->n) qsort(wt->items, wt->n, sizeof *wt->items, cmp_node);
    return 0;
}

void recipe_when_texts_free(recipe_when_texts *wt) {
    for (size_t i = 0; i < wt->n; i++) free(wt->items[i].text);
    free(wt->items);
    memset(wt, 0, sizeof *wt);
}

static const char *when_orig(const recipe_when_texts *wt, const fsdp_value *w) {
    if (!wt || !wt->n || !w) return NULL;
    recipe_when_text key = {w, NULL, 0, 0};
    const recipe_when_text *t = bsearch(&key, wt->items, wt->n, sizeof *wt->items, cmp_node);
    return t && t->line == w->line && t->col == w->col ? t->text : NULL;
}

/* ---- any list ----------------------------------------------------------------------------------- */

/* Evaluates the `when:` of a list item; *keep is 1 without one. A kept item loses the key. */
static int eval_item(fsdp_value *item, const recipe_when_texts *wt, int *keep, fsdp_err *err) {
    *keep = 1;
    long k = val_map_find(item, "when");
    if (k < 0) return 0;
    int rc = recipe_when_eval(item->items[k], when_orig(wt, item->items[k]), keep, err);
    if (!rc && *keep) val_map_remove(item, "when");
    return rc;
}

/* Every list of v's tree loses its items with a false `when:` (after an error, the list stays whole). */
static int walk(fsdp_value *v, const recipe_when_texts *wt, fsdp_err *err) {
    if (v->kind != FSDP_V_LIST && v->kind != FSDP_V_MAP) return 0;
    int rc = 0;
    if (v->kind == FSDP_V_LIST) {
        size_t w = 0;
        for (size_t i = 0; i < v->n; i++) {
            int keep = 1;
            if (!rc) rc = eval_item(v->items[i], wt, &keep, err);
            if (keep || rc) v->items[w++] = v->items[i];
            else val_free(v->items[i]);
        }
        v->n = w;
    }
    for (size_t i = 0; i < v->n && !rc; i++) rc = walk(v->items[i], wt, err);
    return rc;
}

/* ---- stages ------------------------------------------------------------------------------------- */

typedef struct {
    fsdp_value *list;
    size_t n;
    int *keep;
    const char **ids;    /* each stage's id, or NULL */
    strmap kept, gone;   /* id -> the first remaining / removed stage of that id */
    size_t *next_gone;   /* the next removed stage of the same id, or SIZE_MAX */
    size_t **raw, *n_raw; /* a removed stage's direct dependencies (stage indices) */
    size_t **eff, *n_eff; /* and its effective ones (remaining stages) */
    size_t *mark;        /* dedup stamps */
    fsdp_err *err;
} stage_set;

static void set_free(stage_set *s) {
    for (size_t i = 0; i < s->n; i++) {
        if (s->raw) free(s->raw[i]);
        if (s->eff) free(s->eff[i]);
    }
    free(s->keep);
    free(s->ids);
    strmap_free(&s->kept);
    strmap_free(&s->gone);
    free(s->next_gone);
    free(s->raw);
    free(s->n_raw);
    free(s->eff);
    free(s->n_eff);
    free(s->mark);
}

static int set_alloc(stage_set *s) {
    size_t n = s->n;
    s->keep = calloc(n, sizeof *s->keep);
    s->ids = calloc(n, sizeof *s->ids);
    s->next_gone = malloc(n * sizeof *s->next_gone);
    s->raw = calloc(n, sizeof *s->raw);
    s->n_raw = calloc(n, sizeof *s->n_raw);
    s->eff = calloc(n, sizeof *s->eff);
    s->n_eff = calloc(n, sizeof *s->n_eff);
    s->mark = calloc(n, sizeof *s->mark);
    if (!s->keep || !s->ids || !s->next_gone || !s->raw || !s->n_raw || !s->eff || !s->n_eff || !s->mark) return -1;
    return 0;
}

/* Stage ids into the kept / gone tables (the first of an id; removed duplicates chained). */
static int index_ids(stage_set *s) {
    size_t *last = malloc(s->n * sizeof *last);
    if (!last) return -1;
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        s->next_gone[i] = SIZE_MAX;
        const char *id = s->ids[i];
        size_t j;
        if (!id) continue;
        if (s->keep[i]) {
            if (!strmap_get(&s->kept, id, &j)) rc = strmap_put(&s->kept, id, i);
        } else if (strmap_get(&s->gone, id, &j)) {
            s->next_gone[last[j]] = i;
            last[j] = i;
        } else {
            rc = strmap_put(&s->gone, id, i);
            last[i] = i;
        }
    }
    free(last);
    return rc ? -1 : 0;
}

static void known_ids(const stage_set *s, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (size_t q = 0; q < s->n && off < cap; q++)
        if (s->ids[q]) off += (size_t)snprintf(buf + off, cap - off, "%s%s", off ? ", " : "", s->ids[q]);
}

/* Appends item (NULL: out of memory) to list. */
static int push_val(fsdp_value *list, fsdp_value *item) { return item ? val_list_push(list, item) : -1; }

static int push_idx(size_t **a, size_t *n, size_t v) {
    if ((*n & (*n - 1)) == 0) { /* 0, 1, 2, 4, ...: grow to the next power of two */
        size_t *na = realloc(*a, (*n ? *n * 2 : 1) * sizeof *na);
        if (!na) return -1;
        *a = na;
    }
    (*a)[(*n)++] = v;
    return 0;
}

/* The direct dependencies of removed stage i (an unknown id is an error as in any stage). */
static int build_raw(stage_set *s, size_t i) {
    const fsdp_value *st = s->list->items[i], *after = fsdp_value_get(st, "after");
    const char *name = s->ids[i] ? s->ids[i] : "?";
    if (!after) return i > 0 && push_idx(&s->raw[i], &s->n_raw[i], i - 1) ? -1 : 0;
    size_t n = after->kind == FSDP_V_LIST ? after->n : (fsdp_value_type(after) == FSDP_V_NULL ? 0 : 1);
    for (size_t k = 0; k < n; k++) {
        const fsdp_value *a = after->kind == FSDP_V_LIST ? after->items[k] : after;
        const char *t = fsdp_value_text(a);
        size_t j;
        if (!t) return fsdp_err_at(s->err, FSDP_E_INVALID, a, "stage '%s': `after` must list stage ids", name);
        if (strmap_get(&s->kept, t, &j)) {
            if (push_idx(&s->raw[i], &s->n_raw[i], j)) return -1;
        } else if (strmap_get(&s->gone, t, &j)) {
            for (; j != SIZE_MAX; j = s->next_gone[j])
                if (push_idx(&s->raw[i], &s->n_raw[i], j)) return -1;
        } else {
            char known[1024];
            known_ids(s, known, sizeof known);
            return fsdp_err_at(s->err, FSDP_E_INVALID, a, "stage '%s': after: unknown stage id '%s' (known ids: %s)",
                               name, t, known);
        }
    }
    return 0;
}

/* eff[v]: the remaining stages among raw[v], and the effective dependencies of the removed ones. */
static int build_eff(stage_set *s, size_t v) {
    for (size_t q = 0; q < s->n_raw[v]; q++) {
        size_t t = s->raw[v][q];
        size_t *from = s->keep[t] ? &s->raw[v][q] : s->eff[t];
        size_t nf = s->keep[t] ? 1 : s->n_eff[t];
        for (size_t k = 0; k < nf; k++) {
            if (s->mark[from[k]] == v + 1) continue;
            s->mark[from[k]] = v + 1;
            if (push_idx(&s->eff[v], &s->n_eff[v], from[k])) return -1;
        }
    }
    return 0;
}

static int removed_cycle(stage_set *s, const size_t *stack, size_t depth, size_t t) {
    char chain[1024] = "";
    size_t off = 0, from = 0;
    while (stack[from] != t) from++;
    for (size_t q = from; q < depth && off < sizeof chain; q++)
        off += (size_t)snprintf(chain + off, sizeof chain - off, "%s -> ", s->ids[stack[q]] ? s->ids[stack[q]] : "?");
    if (off < sizeof chain) snprintf(chain + off, sizeof chain - off, "%s", s->ids[t] ? s->ids[t] : "?");
    return fsdp_err_at(s->err, FSDP_E_INVALID, s->list->items[t],
                       "cycle in the stage graph among stages with a false when: (each stage runs after the next): %s",
                       chain);
}

/* The effective dependencies of every removed stage: a depth-first search over removed stages (iterative:
 * a long chain of them needs no deep stack). -1: out of memory, else an error code. */
static int effective_deps(stage_set *s) {
    char *state = calloc(s->n, 1);
    size_t *stack = malloc(s->n * sizeof *stack), *pos = malloc(s->n * sizeof *pos);
    int rc = !state || !stack || !pos ? -1 : 0;
    for (size_t r = 0; r < s->n && !rc; r++) {
        if (s->keep[r] || state[r]) continue;
        size_t depth = 1;
        stack[0] = r;
        pos[0] = 0;
        state[r] = 1;
        rc = build_raw(s, r);
        while (depth && !rc) {
            size_t v = stack[depth - 1];
            if (pos[depth - 1] == s->n_raw[v]) {
                rc = build_eff(s, v);
                state[v] = 2;
                depth--;
                continue;
            }
            size_t t = s->raw[v][pos[depth - 1]++];
            if (s->keep[t] || state[t] == 2) continue;
            if (state[t] == 1) {
                rc = removed_cycle(s, stack, depth, t);
                break;
            }
            state[t] = 1;
            stack[depth] = t;
            pos[depth++] = 0;
            rc = build_raw(s, t);
        }
    }
    free(state);
    free(stack);
    free(pos);
    return rc;
}

/* Appends to list an `after` entry per effective dependency of removed stage g, at `at`'s position;
 * stamp dedups the list. */
static int add_eff(stage_set *s, fsdp_value *list, size_t g, const fsdp_value *at, size_t stamp) {
    for (size_t k = 0; k < s->n_eff[g]; k++) {
        size_t d = s->eff[g][k];
        if (s->mark[d] == stamp || !s->ids[d]) continue;
        s->mark[d] = stamp;
        if (push_val(list, val_scalar(s->ids[d], 1, at->file, at->line, at->col))) return -1;
    }
    return 0;
}

/* The rewritten explicit `after` of remaining stage j, into *out (NULL when it names no removed stage). */
static int rewrite_after(stage_set *s, size_t j, const fsdp_value *after, fsdp_value **out) {
    *out = NULL;
    size_t n = after->kind == FSDP_V_LIST ? after->n : (fsdp_value_type(after) == FSDP_V_SCALAR ? 1 : 0);
    int names_gone = 0;
    size_t x;
    for (size_t k = 0; k < n; k++) {
        const char *t = fsdp_value_text(after->kind == FSDP_V_LIST ? after->items[k] : after);
        if (t && !strmap_get(&s->kept, t, &x) && strmap_get(&s->gone, t, &x)) names_gone = 1;
    }
    if (!names_gone) return 0;
    fsdp_value *list = val_new(FSDP_V_LIST, after->file, after->line, after->col);
    size_t stamp = s->n + 1 + j;
    for (size_t k = 0; list && k < n; k++) {
        const fsdp_value *a = after->kind == FSDP_V_LIST ? after->items[k] : after;
        const char *t = fsdp_value_text(a);
        size_t g;
        int rc = 0;
        if (t && strmap_get(&s->kept, t, &x)) {
            if (s->mark[x] != stamp) rc = push_val(list, val_clone(a));
            s->mark[x] = stamp;
        } else if (t && strmap_get(&s->gone, t, &g)) {
            for (; g != SIZE_MAX && !rc; g = s->next_gone[g]) rc = add_eff(s, list, g, a, stamp);
        } else {
            rc = push_val(list, val_clone(a));
        }
        if (rc) {
            val_free(list);
            list = NULL;
        }
    }
    *out = list;
    return list ? 0 : -1;
}

/* Remaining stage j: its `after` without the removed stages (see the top of the file). */
static int relink(stage_set *s, size_t j) {
    fsdp_value *st = s->list->items[j];
    if (st->kind != FSDP_V_MAP) return 0;
    long k = val_map_find(st, "after");
    fsdp_value *list = NULL;
    if (k >= 0) {
        if (rewrite_after(s, j, st->items[k], &list)) return -1;
        if (list && val_map_set(st, "after", list, st->key_line[k], st->key_col[k])) return -1;
        return 0;
    }
    if (j == 0 || s->keep[j - 1]) return 0;
    list = val_new(FSDP_V_LIST, st->file, st->line, st->col);
    if (!list || add_eff(s, list, j - 1, st, s->n + 1 + j)) {
        val_free(list);
        return -1;
    }
    return val_map_set(st, "after", list, st->line, st->col);
}

/* r->skipped gets removed stage i (its `when:` still in place). */
static int record_skipped(recipe *r, stage_set *s, size_t i, const recipe_when_texts *wt) {
    const fsdp_value *st = s->list->items[i], *w = fsdp_value_get(st, "when");
    const char *uses = fsdp_value_text(fsdp_value_get(st, "uses")), *orig = when_orig(wt, w);
    const char *text = orig ? orig : fsdp_value_text(w);
    char idx[48];
    snprintf(idx, sizeof idx, "stages[%zu]", i);
    recipe_skipped *k = &r->skipped[r->n_skipped];
    k->id = strdup(s->ids[i] ? s->ids[i] : idx);
    k->uses = strdup(uses ? uses : "?");
    k->when = strdup(text ? text : "false");
    r->n_skipped++;
    return k->id && k->uses && k->when ? 0 : -1;
}

/* Relinks the remaining stages, records and drops the removed ones. */
static int drop_stages(recipe *r, stage_set *s, const recipe_when_texts *wt) {
    size_t gone = 0, w = 0;
    for (size_t i = 0; i < s->n; i++) gone += !s->keep[i];
    r->skipped = calloc(gone, sizeof *r->skipped);
    if (!r->skipped) return -1;
    for (size_t i = 0; i < s->n; i++)
        if (s->keep[i] ? relink(s, i) : record_skipped(r, s, i, wt)) return -1;
    strmap_free(&s->kept); /* they borrow the ids of the stages about to be freed */
    strmap_free(&s->gone);
    for (size_t i = 0; i < s->n; i++) {
        if (s->keep[i]) s->list->items[w++] = s->list->items[i];
        else val_free(s->list->items[i]);
    }
    s->list->n = w;
    return 0;
}

static int apply_stages(recipe *r, fsdp_value *list, const recipe_when_texts *wt, fsdp_err *err) {
    stage_set s = {0};
    s.list = list;
    s.n = list->n;
    s.err = err;
    strmap_init(&s.kept);
    strmap_init(&s.gone);
    int rc = set_alloc(&s) ? -1 : 0;
    size_t kept = 0;
    for (size_t i = 0; i < s.n && !rc; i++) {
        s.ids[i] = recipe_stage_id(list->items[i]);
        rc = eval_item(list->items[i], wt, &s.keep[i], err);
        kept += (size_t)s.keep[i];
    }
    if (!rc && kept == 0)
        rc = fsdp_err_at(err, FSDP_E_INVALID, list,
                         "stages: every stage of the recipe has a false when: (there is nothing to run)");
    if (!rc && kept < s.n) {
        rc = index_ids(&s);
        if (!rc) rc = effective_deps(&s);
        if (!rc) rc = drop_stages(r, &s, wt);
    }
    set_free(&s);
    return rc == -1 ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : rc;
}

int recipe_apply_when(recipe *r, const recipe_when_texts *wt, fsdp_err *err) {
    fsdp_value *stages = val_get_mut(r->root, "stages");
    if (stages && stages->kind == FSDP_V_LIST && stages->n) {
        int rc = apply_stages(r, stages, wt, err);
        if (rc) return rc;
    }
    return walk(r->root, wt, err);
}
