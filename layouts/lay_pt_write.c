/* A layout's part that is one torch.save file (OLMo's model.pt / optim.pt): the keys of its prefix nested as the
 * trainer's own torch.save nests them (lay_nest: (state, fqn, kind), (param_groups, i, option)), param_groups a
 * list, written by ckpt/pt_write.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/pt_write.h"
#include "layouts/lay_tree.h"

static uint64_t hash_of(size_t parent, const char *name, size_t len) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)parent * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
    return h;
}

static long add_node(lay_tree *t, const char *name, size_t len, int is_int, long entry) {
    if (t->n == t->cap) {
        size_t c = t->cap ? 2 * t->cap : 64;
        lay_node *v = realloc(t->v, c * sizeof *v);
        if (!v) return -1;
        t->v = v, t->cap = c;
    }
    lay_node *x = &t->v[t->n];
    memset(x, 0, sizeof *x);
    if (!(x->name = malloc(len + 1))) return -1;
    memcpy(x->name, name, len);
    x->name[len] = '\0';
    x->is_int = is_int;
    x->index = is_int ? strtol(x->name, NULL, 10) : 0;
    x->entry = entry;
    return (long)t->n++;
}

/* The child of p named name (created when absent; a leaf when entry >= 0); -2 when a leaf and a dict would share
 * the name. The hash is sized for every key of the part up front (tree_init). */
static long child(lay_tree *t, size_t p, const char *name, size_t len, int is_int, long entry) {
    size_t h = (size_t)hash_of(p, name, len) & (t->hcap - 1);
    for (; t->slot[h] >= 0; h = (h + 1) & (t->hcap - 1)) {
        lay_node *c = &t->v[t->slot[h]];
        if (c->parent == p && strlen(c->name) == len && !memcmp(c->name, name, len))
            return entry >= 0 || c->entry >= 0 ? -2 : t->slot[h];
    }
    long id = add_node(t, name, len, is_int, entry);
    if (id < 0) return -1;
    t->v[id].parent = p;
    t->slot[h] = id;
    lay_node *x = &t->v[p];
    if (x->n == x->cap) {
        size_t c = x->cap ? 2 * x->cap : 8;
        size_t *k = realloc(x->kids, c * sizeof *k);
        if (!k) return -1;
        x->kids = k, x->cap = c;
    }
    x->kids[x->n++] = (size_t)id;
    return id;
}

/* key's components after the part prefix (lay_nest's levels: the first nest dotted components, the rest, its last
 * component split off when tail) into the tree. */
static int add_key(lay_tree *t, const lay_layout *L, const char *key, size_t skip, long entry, fsdp_err *err) {
    int nest, tail;
    unsigned mask;
    lay_nest(L, key, &nest, &tail, &mask);
    if (nest < (int)skip) nest = (int)skip, tail = 0; /* the rest one key */
    const char *s = key;
    size_t p = 0;
    for (int c = 0;; c++) {
        const char *dot = c < nest ? strchr(s, '.') : NULL;
        const char *end = dot ? dot : s + strlen(s);
        int last = !dot;
        if (last && tail && c >= nest) {
            const char *d = strrchr(s, '.');
            if (d) end = d, last = 0;
        }
        if ((size_t)c >= skip) {
            long id = child(t, p, s, (size_t)(end - s), (mask >> c) & 1u, last ? entry : -1);
            if (id == -1) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            if (id == -2) return fsdp_err_set(err, FSDP_E_FORMAT, "key %s is both a value and a dict of values", key);
            p = (size_t)id;
        }
        if (last) return 0;
        s = end + 1;
    }
}


/* param_groups: a list in index order */
static int write_list(ptw_file *w, pkl_w *p, lay_tree *t, lay_node *x, ckpt_reader *r, fsdp_err *err) {
    for (size_t a = 1; a < x->n; a++) /* by index (a few groups) */
        for (size_t b = a; b > 0 && t->v[x->kids[b - 1]].index > t->v[x->kids[b]].index; b--) {
            size_t k = x->kids[b];
            x->kids[b] = x->kids[b - 1], x->kids[b - 1] = k;
        }
    pkl_w_empty_list(p);
    pkl_w_mark(p);
    int rc = 0;
    for (size_t k = 0; k < x->n && !rc; k++) rc = lay_tree_pickle(w, p, t, x->kids[k], r, 0, err);
    pkl_w_appends(p);
    return rc;
}

int lay_tree_is_list(const lay_tree *t, const lay_node *x) {
    int all_int = x->n > 0;
    for (size_t c = 0; c < x->n; c++) all_int &= t->v[x->kids[c]].is_int;
    return all_int && !strcmp(x->name, "param_groups");
}

/* Node k into pickle p; its tensors (w: the torch.save file's records; NULL: none allowed) as records of w. */
int lay_tree_pickle(ptw_file *w, pkl_w *p, lay_tree *t, size_t k, ckpt_reader *r, int root, fsdp_err *err) {
    lay_node *x = &t->v[k];
    if (x->entry >= 0) {
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)x->entry);
        if (e->is_tensor && !w) return fsdp_err_set(err, FSDP_E_INVALID, "%s: a tensor inside a pickled value", e->name);
        return e->is_tensor ? ptw_tensor_from(w, r, (size_t)x->entry, 0, err) : ptw_value_into(p, r, (size_t)x->entry, err);
    }
    int flat = 1;
    for (size_t c = 0; c < x->n; c++) flat &= t->v[x->kids[c]].entry >= 0;
    if (lay_tree_is_list(t, x)) return write_list(w, p, t, x, r, err);
    if (root && flat) { /* a state dict: an OrderedDict, as torch.save(model.state_dict()) */
        pkl_w_global(p, "collections", "OrderedDict");
        pkl_w_empty_tuple(p);
        pkl_w_reduce(p);
    } else {
        pkl_w_empty_dict(p);
    }
    pkl_w_mark(p);
    int rc = 0;
    for (size_t c = 0; c < x->n && !rc; c++) {
        lay_node *y = &t->v[x->kids[c]];
        if (y->is_int) pkl_w_int(p, y->index);
        else pkl_w_str(p, y->name);
        rc = lay_tree_pickle(w, p, t, x->kids[c], r, 0, err);
    }
    pkl_w_setitems(p);
    return rc;
}

/* The tree of part `part`'s keys of r. */
int lay_tree_build(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, lay_tree *t, fsdp_err *err) {
    const char *pre = L->part_keys[part];
    size_t skip = 0, plen = strlen(pre), n = 0;
    for (const char *c = pre; *c; c++) skip += *c == '.';
    memset(t, 0, sizeof *t);
    for (t->hcap = 64; t->hcap < 8 * (ckpt_count(r) + 1); t->hcap *= 2) {
    }
    t->slot = malloc(t->hcap * sizeof *t->slot);
    if (t->slot) memset(t->slot, 0xff, t->hcap * sizeof *t->slot); /* -1: empty */
    int rc = !t->slot || add_node(t, "", 0, 0, -1) < 0 ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : 0;
    for (size_t i = 0; i < ckpt_count(r) && !rc; i++) {
        const char *key = ckpt_entry_at(r, i)->name;
        if (strncmp(key, pre, plen)) continue;
        rc = add_key(t, L, key, skip, (long)i, err);
        n++;
    }
    if (!rc && !n) rc = fsdp_err_set(err, FSDP_E_INVALID, "layout %s: nothing to write into %s (no key %s*)", L->name, path, pre);
    return rc;
}

void lay_tree_free(lay_tree *t) {
    for (size_t k = 0; k < t->n; k++) free(t->v[k].name), free(t->v[k].kids);
    free(t->v);
    free(t->slot);
}

static int ends_with(const char *s, const char *end) {
    size_t n = strlen(s), m = strlen(end);
    return n > m && !strcmp(s + n - m, end);
}

int lay_part_is_file(const lay_layout *L, size_t part) {
    return ends_with(L->parts[part], ".pt") || ends_with(L->parts[part], ".safetensors");
}

int lay_part_write_file(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, fsdp_err *err) {
    return ends_with(L->parts[part], ".safetensors") ? lay_part_write_st(L, r, part, path, err)
                                                     : lay_part_write_pt(L, r, part, path, err);
}

int lay_part_write_pt(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, fsdp_err *err) {
    lay_tree t;
    int rc = lay_tree_build(L, r, part, path, &t, err);
    char arch[128];
    const char *base = strrchr(path, '/');
    snprintf(arch, sizeof arch, "%s", base ? base + 1 : path);
    char *dot = strrchr(arch, '.');
    if (dot) *dot = '\0';
    ptw_file *w = NULL;
    if (!rc) rc = ptw_begin(path, arch, &w, err);
    if (!rc) rc = lay_tree_pickle(w, ptw_pickle(w), &t, 0, r, 1, err);
    if (!rc) rc = ptw_finish(w, err);
    else ptw_abort(w);
    lay_tree_free(&t);
    return rc;
}
