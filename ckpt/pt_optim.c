/* Integer optimizer ids -> parameter names of a classic training checkpoint (see pt_optim.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/pt_optim.h"
#include "ckpt/torchsave.h"

#define PTO_MAX_DIMS 8

/* A dict (an OrderedDict made a dict by its SETITEMS, or an empty OrderedDict()). */
static int is_dict(const pkl_obj *o) {
    return o && (o->kind == PKL_DICT || (o->kind == PKL_REDUCE && pkl_is_global(o->fn, "collections", "OrderedDict") &&
                                         o->args && o->args->n == 0));
}
static size_t dict_n(const pkl_obj *o) { return o->kind == PKL_DICT ? o->n : 0; }

/* The shape of a tensor value; -1 when o is not a tensor. */
static int tensor_shape(const pkl_obj *o, int64_t *shape, int *nd) {
    const pkl_obj *fn, *args;
    if (!ts_tensor_unwrap(o, &fn, &args) || args->n < 3) return -1;
    return pkl_int_tuple(args->items[2], shape, PTO_MAX_DIMS, nd);
}

static int is_optimizer(const pkl_obj *o) {
    const pkl_obj *st = pkl_dict_get(o, "state"), *pg = pkl_dict_get(o, "param_groups");
    return is_dict(o) && is_dict(st) && pg && pg->kind == PKL_LIST;
}

/* a dict whose every value is a tensor (at least one) */
static int is_model(const pkl_obj *o) {
    if (!is_dict(o) || dict_n(o) == 0) return 0;
    int64_t sh[PTO_MAX_DIMS];
    int nd;
    for (size_t i = 0; i < o->n; i++)
        if (o->items[2 * i]->kind != PKL_STR || tensor_shape(o->items[2 * i + 1], sh, &nd)) return 0;
    return 1;
}

/* The shape an id's state says its parameter has: its first tensor other than "step" (exp_avg,
 * momentum_buffer, ...); 0 when the state names none (any parameter fits). */
typedef struct want {
    int known, nd;
    int64_t shape[PTO_MAX_DIMS];
} want;

/* (id, value) pairs sorted by id, for lookups in O(log n) */
typedef struct idv {
    int64_t id;
    const pkl_obj *v;
    size_t at;
} idv;

static int cmp_idv(const void *a, const void *b) {
    const idv *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static const idv *find_idv(const idv *a, size_t n, int64_t id) {
    idv key = {id, NULL, 0};
    return bsearch(&key, a, n, sizeof *a, cmp_idv);
}

static void state_shape(const pkl_obj *s, want *w) {
    memset(w, 0, sizeof *w);
    if (!s || !is_dict(s)) return;
    for (size_t j = 0; j < dict_n(s); j++) {
        const pkl_obj *sk = s->items[2 * j];
        if (sk->kind == PKL_STR && !strcmp(sk->s, "step")) continue;
        if (!tensor_shape(s->items[2 * j + 1], w->shape, &w->nd)) {
            w->known = 1;
            return;
        }
    }
}

static int fits(const want *w, const pkl_obj *tensor) {
    if (!w->known) return 1;
    int64_t sh[PTO_MAX_DIMS];
    int nd;
    return !tensor_shape(tensor, sh, &nd) && nd == w->nd && !memcmp(sh, w->shape, (size_t)nd * sizeof *sh);
}

/* the ids of param_groups[*].params in order; -1 when they are not distinct ints */
static int collect_ids(const pkl_obj *pg, pt_optim_map *m) {
    size_t n = 0;
    for (size_t g = 0; g < pg->n; g++) {
        const pkl_obj *ps = pkl_dict_get(pg->items[g], "params");
        if (!ps || ps->kind != PKL_LIST) return -1;
        n += ps->n;
    }
    m->ids = malloc((n ? n : 1) * sizeof *m->ids);
    m->names = calloc(n ? n : 1, sizeof *m->names);
    if (!m->ids || !m->names) return -2;
    for (size_t g = 0; g < pg->n; g++) {
        const pkl_obj *ps = pkl_dict_get(pg->items[g], "params");
        for (size_t k = 0; k < ps->n; k++) {
            if (ps->items[k]->kind != PKL_INT) return -1;
            m->ids[m->n++] = ps->items[k]->i;
        }
    }
    return 0;
}

/* The earliest and the latest placement of the ids on the model's tensors (in order, each on a
 * tensor of its shape); the assignment is unique iff both are the same. */
static int place(pt_optim_map *m, const pkl_obj *model, const want *w) {
    size_t n = m->n, nm = model->n;
    size_t *lo = malloc((n ? n : 1) * sizeof *lo), *hi = malloc((n ? n : 1) * sizeof *hi);
    int rc = lo && hi ? 0 : -2;
    for (size_t k = 0, j = 0; !rc && k < n; k++, j++) {
        while (j < nm && !fits(&w[k], model->items[2 * j + 1])) j++;
        if (j == nm) rc = -1;
        else lo[k] = j;
    }
    for (size_t k = n, j = nm; !rc && k-- > 0;) {
        while (j > 0 && !fits(&w[k], model->items[2 * (j - 1) + 1])) j--;
        if (j == 0) rc = -1;
        else hi[k] = --j;
    }
    for (size_t k = 0; !rc && k < n; k++)
        if (lo[k] != hi[k]) rc = -3;
    for (size_t k = 0; !rc && k < n; k++) m->names[k] = model->items[2 * lo[k]]->s;
    free(lo);
    free(hi);
    return rc;
}

int pt_optim_find(const pkl_obj *root, pt_optim_map *m, fsdp_err *err) {
    memset(m, 0, sizeof *m);
    if (!is_dict(root)) return 0;
    const pkl_obj *optim = NULL, *model = NULL, *named = NULL;
    int n_opt = 0, n_model = 0;
    for (size_t i = 0; i < dict_n(root); i++) {
        const pkl_obj *k = root->items[2 * i], *v = root->items[2 * i + 1];
        if (is_optimizer(v)) optim = v, n_opt++;
        else if (is_model(v)) {
            model = v, n_model++;
            if (k->kind == PKL_STR &&
                (!strcmp(k->s, "model") || !strcmp(k->s, "model_state_dict") || !strcmp(k->s, "state_dict")))
                named = v;
        }
    }
    if (n_opt != 1) return 0;
    if (named) model = named;
    else if (n_model != 1) {
        snprintf(m->why, sizeof m->why, "%s model state dict next to the optimizer's",
                 n_model ? "more than one" : "no");
        return 0;
    }
    const pkl_obj *st = pkl_dict_get(optim, "state"), *pg = pkl_dict_get(optim, "param_groups");
    int rc = collect_ids(pg, m);
    want *w = rc ? NULL : malloc((m->n ? m->n : 1) * sizeof *w);
    idv *sv = rc ? NULL : malloc((dict_n(st) ? dict_n(st) : 1) * sizeof *sv);
    m->by_id = rc ? NULL : malloc((m->n ? m->n : 1) * sizeof *m->by_id);
    if (!rc && (!w || !sv || !m->by_id)) rc = -2;
    size_t ns = 0;
    for (size_t i = 0; !rc && i < dict_n(st); i++)
        if (st->items[2 * i]->kind == PKL_INT) sv[ns++] = (idv){st->items[2 * i]->i, st->items[2 * i + 1], i};
    if (!rc) qsort(sv, ns, sizeof *sv, cmp_idv);
    for (size_t k = 0; !rc && k < m->n; k++) {
        const idv *x = find_idv(sv, ns, m->ids[k]);
        state_shape(x ? x->v : NULL, &w[k]);
        m->by_id[k] = (idv){m->ids[k], NULL, k};
    }
    if (!rc) qsort(m->by_id, m->n, sizeof *m->by_id, cmp_idv);
    for (size_t k = 1; !rc && k < m->n; k++)
        if (m->by_id[k].id == m->by_id[k - 1].id) rc = -1; /* an id in two places */
    if (!rc) rc = place(m, model, w);
    free(w);
    free(sv);
    if (rc == -2) {
        pt_optim_free(m);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory mapping optimizer ids");
    }
    if (rc) {
        snprintf(m->why, sizeof m->why, "%s",
                 rc == -3 ? "its ids fit the model's tensors in more than one way (buffers of the same shapes)"
                          : "its ids do not fall on the model's tensors in order (shapes differ)");
        char why[256];
        memcpy(why, m->why, sizeof why);
        pt_optim_free(m);
        memcpy(m->why, why, sizeof why);
        return 0;
    }
    m->optim = optim;
    return 0;
}

const char *pt_optim_name(const pt_optim_map *m, int64_t id) {
    const idv *x = m->optim ? find_idv(m->by_id, m->n, id) : NULL;
    return x ? m->names[x->at] : NULL;
}

void pt_optim_free(pt_optim_map *m) {
    free(m->ids);
    free(m->names);
    free(m->by_id);
    memset(m, 0, sizeof *m);
}
