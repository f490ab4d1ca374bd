/* A layout's part as OLMo's safetensors twin (olmo/safetensors_util.py state_dict_to_safetensors_file): the part's
 * nested dict flattened as OLMo flattens it, a tensor per tensor, dicts walked into, any other value (the param_groups
 * list, a number) a uint8 tensor of its pickle; each named by its key tuple in OLMo's encoding (layouts/lay_stkey.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "layouts/lay_stkey.h"
#include "layouts/lay_tree.h"

#define STW_DEPTH 16
#define STW_PIECE ((size_t)32 << 20)

typedef struct stw_item {
    char name[LAY_STKEY_NAME];
    long entry;  /* a tensor of the reader (-1: a pickle) */
    pkl_w pk;    /* the pickled value */
} stw_item;

typedef struct stw {
    stw_item *it;
    size_t n, cap;
} stw;

static stw_item *add_item(stw *s, const char *const *comps, size_t depth, int pickled, fsdp_err *err) {
    if (s->n == s->cap) {
        size_t c = s->cap ? 2 * s->cap : 64;
        stw_item *v = realloc(s->it, c * sizeof *v);
        if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory"), NULL;
        s->it = v, s->cap = c;
    }
    stw_item *it = &s->it[s->n];
    memset(it, 0, sizeof *it);
    if (lay_stkey_name(comps, depth, pickled, it->name, sizeof it->name))
        return fsdp_err_set(err, FSDP_E_INVALID, "a key of %zu components (%s...) OLMo's encoding does not take (1 to 3, "
                            "short enough)", depth, depth ? comps[0] : ""), NULL;
    s->n++;
    return it;
}

/* Node k (its key components comps[0 .. depth)) into items. */
static int walk(stw *s, lay_tree *t, size_t k, ckpt_reader *r, const char **comps, size_t depth, fsdp_err *err) {
    lay_node *x = &t->v[k];
    if (k) {
        if (depth > STW_DEPTH) return fsdp_err_set(err, FSDP_E_INVALID, "keys nested deeper than %d", STW_DEPTH);
        comps[depth - 1] = x->name;
    }
    int leaf_tensor = x->entry >= 0 && ckpt_entry_at(r, (size_t)x->entry)->is_tensor;
    if (x->entry >= 0 || (k && lay_tree_is_list(t, x))) { /* a tensor, or a value pickled whole */
        stw_item *it = add_item(s, comps, depth, !leaf_tensor, err);
        if (!it) return err->code;
        it->entry = leaf_tensor ? x->entry : -1;
        if (leaf_tensor) return 0;
        pkl_w_init(&it->pk);
        pkl_w_proto(&it->pk, 2);
        int rc = lay_tree_pickle(NULL, &it->pk, t, k, r, 0, err);
        pkl_w_stop(&it->pk);
        return rc ? rc : it->pk.oom ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : 0;
    }
    int rc = 0;
    for (size_t c = 0; c < x->n && !rc; c++) rc = walk(s, t, x->kids[c], r, comps, depth + 1, err);
    return rc;
}

/* Every item's bytes: the tensors' rows in pieces, the pickles whole. */
static int write_items(const stw *s, ckpt_reader *r, st_writer *w, fsdp_err *err) {
    int rc = 0;
    void *buf = NULL;
    for (size_t i = 0; i < s->n && !rc; i++) {
        const stw_item *it = &s->it[i];
        if (it->entry < 0) {
            rc = st_writer_write(w, i, it->pk.buf, it->pk.len, err);
            continue;
        }
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)it->entry);
        int64_t rows = e->ndim ? e->shape[0] : 1;
        size_t row = rows ? (size_t)(e->nbytes / (uint64_t)rows) : 0;
        int64_t step = row ? (int64_t)(STW_PIECE / row) : rows;
        if (step < 1) step = 1;
        if (!buf && !(buf = malloc(STW_PIECE > row ? STW_PIECE : row)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        for (int64_t r0 = 0; r0 < rows && !rc; r0 += step) {
            int64_t r1 = r0 + step < rows ? r0 + step : rows;
            if (!(rc = ckpt_read_rows(r, (size_t)it->entry, r0, r1, buf, e->dtype, err)))
                rc = st_writer_write(w, i, buf, (size_t)(r1 - r0) * row, err);
        }
    }
    free(buf);
    return rc;
}

int lay_part_write_st(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, fsdp_err *err) {
    lay_tree t;
    stw s = {0};
    const char *comps[STW_DEPTH + 1];
    int rc = lay_tree_build(L, r, part, path, &t, err);
    if (!rc) rc = walk(&s, &t, 0, r, comps, 0, err);
    st_writer *w = NULL;
    if (!rc) rc = st_writer_new(&w, path, err);
    for (size_t i = 0; i < s.n && !rc; i++) {
        const stw_item *it = &s.it[i];
        if (it->entry >= 0) {
            const ckpt_entry *e = ckpt_entry_at(r, (size_t)it->entry);
            rc = st_writer_declare(w, it->name, e->dtype, e->ndim, e->shape, NULL, err);
        } else {
            int64_t len = (int64_t)it->pk.len;
            rc = st_writer_declare(w, it->name, FSDP_DT_U8, 1, &len, NULL, err);
        }
    }
    if (!rc) rc = st_writer_begin(w, err);
    if (!rc) rc = write_items(&s, r, w, err);
    if (!rc) rc = st_writer_finish(w, err);
    if (w) st_writer_free(w);
    for (size_t i = 0; i < s.n; i++) pkl_w_free(&s.it[i].pk);
    free(s.it);
    lay_tree_free(&t);
    return rc ? fsdp_err_prefix(err, "layout %s: %s", L->name, path) : 0;
}
