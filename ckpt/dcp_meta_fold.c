/* Folding a DCP `.metadata` while it is parsed (see dcp_meta_fold.h). */
#include "ckpt/dcp_meta_fold.h"

#include <stdlib.h>
#include <string.h>

#define META_MOD "torch.distributed.checkpoint.metadata"

/* Room for `more` elements of size `el` in *arr; 0, or -1 when out of memory. */
static int room(void **arr, size_t *cap, size_t n, size_t more, size_t el) {
    if (n + more <= *cap) return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < n + more) c *= 2;
    void *a = realloc(*arr, c * el);
    if (!a) return -1;
    *arr = a;
    *cap = c;
    return 0;
}

static int nomem(fsdp_err *err) { return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory folding .metadata"), -1; }

const char *dcp_meta_class(const pkl_obj *o) {
    const pkl_obj *c = pkl_callable(o);
    if (!c || (strcmp(c->s, META_MOD) && strcmp(c->s, "torch.distributed._shard.sharded_tensor.metadata"))) return NULL;
    return c->name;
}

static int64_t tag(int kind, uint64_t at) { return (int64_t)(((uint64_t)kind << DCP_FOLD_SHIFT) | at); }

/* ChunkStorageMetadata(offsets, sizes): both int tuples of one length (what dcp_meta.c accepts). */
static int fold_chunk(dcp_fold *f, const pkl_obj *st, int64_t *t, fsdp_err *err) {
    int64_t off[FSDP_MAX_DIMS], sz[FSDP_MAX_DIMS];
    int no = 0, ns = 0;
    if (!st || pkl_int_tuple(pkl_dict_get(st, "offsets"), off, FSDP_MAX_DIMS, &no) ||
        pkl_int_tuple(pkl_dict_get(st, "sizes"), sz, FSDP_MAX_DIMS, &ns) || no != ns)
        return 0;
    if (room((void **)&f->coords, &f->cap_coords, f->n_coords, 1 + 2 * (size_t)no, sizeof *f->coords)) return nomem(err);
    *t = tag(DCP_FOLD_CHUNK, f->n_coords);
    int64_t *c = f->coords + f->n_coords;
    c[0] = no;
    memcpy(c + 1, off, (size_t)no * sizeof *off);
    memcpy(c + 1 + no, sz, (size_t)no * sizeof *sz);
    f->n_coords += 1 + 2 * (size_t)no;
    return 1;
}

/* MetadataIndex(fqn, offset, index): fqn a string, offset None (absent) or an int tuple. */
static int fold_index(dcp_fold *f, const pkl_obj *st, int64_t *t, fsdp_err *err) {
    const pkl_obj *fqn = pkl_dict_get(st, "fqn"), *off = pkl_dict_get(st, "offset");
    int64_t o[FSDP_MAX_DIMS];
    int no = -1;
    if (!fqn || fqn->kind != PKL_STR) return 0;
    if (off && off->kind != PKL_NONE && pkl_int_tuple(off, o, FSDP_MAX_DIMS, &no)) return 0;
    if (room((void **)&f->ix, &f->cap_ix, f->n_ix, 1, sizeof *f->ix) ||
        room((void **)&f->ints, &f->cap_ints, f->n_ints, no > 0 ? (size_t)no : 0, sizeof *f->ints))
        return nomem(err);
    f->ix[f->n_ix] = (dcp_fold_index){fqn->s, f->n_ints, no};
    if (no > 0) memcpy(f->ints + f->n_ints, o, (size_t)no * sizeof *o), f->n_ints += (size_t)no;
    *t = tag(DCP_FOLD_INDEX, f->n_ix++);
    return 1;
}

/* _StorageInfo(relative_path, offset, length, [transform_descriptors]): every check of dcp_meta.c's. */
static int fold_storage(dcp_fold *f, const pkl_obj *st, int64_t *t, fsdp_err *err) {
    const pkl_obj *rp = pkl_dict_get(st, "relative_path"), *off = pkl_dict_get(st, "offset"),
                  *len = pkl_dict_get(st, "length"), *tr = pkl_dict_get(st, "transform_descriptors");
    if (!rp || rp->kind != PKL_STR || !off || off->kind != PKL_INT || !len || len->kind != PKL_INT || off->i < 0 ||
        len->i < 0 || rp->len >= DCP_REL_PATH_MAX || !rp->s[0] || strchr(rp->s, '/') || !strcmp(rp->s, "..") ||
        (tr && tr->kind == PKL_LIST && tr->n > 0))
        return 0;
    if (room((void **)&f->st, &f->cap_st, f->n_st, 1, sizeof *f->st)) return nomem(err);
    f->st[f->n_st] = (dcp_fold_storage){rp->s, (uint64_t)off->i, (uint64_t)len->i};
    *t = tag(DCP_FOLD_STORAGE, f->n_st++);
    return 1;
}

static int on_built(void *user, const pkl_obj *o, int64_t *t, fsdp_err *err) {
    const char *cls = dcp_meta_class(o);
    const pkl_obj *st = pkl_state(o), *c = pkl_callable(o);
    if (!st || st->kind != PKL_DICT) return 0;
    /* _StorageInfo by its name alone, as dcp_meta.c takes it (torch's lives in checkpoint.filesystem) */
    if (!strcmp(c->name, "_StorageInfo")) return fold_storage(user, st, t, err);
    if (!cls) return 0;
    if (!strcmp(cls, "ChunkStorageMetadata")) return fold_chunk(user, st, t, err);
    if (!strcmp(cls, "MetadataIndex")) return fold_index(user, st, t, err);
    return 0;
}

/* A folded chunk appended to a list without items of its own: it starts the list's run, or extends it when
 * it is the entry right after the run's last (chunks are appended in the order they were built, so a
 * tensor's chunks are one run); any other goes to the list's items. */
static int on_append(void *user, pkl_obj *l, const pkl_obj *it, fsdp_err *err) {
    (void)err;
    dcp_fold *f = user;
    if (dcp_fold_kind(it) != DCP_FOLD_CHUNK || l->n) return 0;
    uint64_t at = dcp_fold_at(it);
    if (l->len == 0) l->i = (int64_t)at;
    else if (f->run_list != l || at != f->run_end) return 0;
    l->len++;
    f->run_list = l;
    f->run_end = at + 1 + 2 * (uint64_t)f->coords[at];
    return 1;
}

static int on_setitem(void *user, pkl_obj *d, const pkl_obj *k, const pkl_obj *v, fsdp_err *err) {
    dcp_fold *f = user;
    if (dcp_fold_kind(k) != DCP_FOLD_INDEX || dcp_fold_kind(v) != DCP_FOLD_STORAGE || d->n)
        return 0;
    if (d->len == 0) d->i = (int64_t)f->n_pairs;
    else if (f->run_dict != d || (uint64_t)d->i + d->len != f->n_pairs) return 0;
    if (room((void **)&f->pairs, &f->cap_pairs, f->n_pairs, 1, sizeof *f->pairs)) return nomem(err);
    f->pairs[f->n_pairs++] = (dcp_fold_pair){(uint32_t)dcp_fold_at(k), (uint32_t)dcp_fold_at(v)};
    d->len++;
    f->run_dict = d;
    return 1;
}

void dcp_fold_hooks(dcp_fold *f, pkl_fold *hooks, int consume) {
    memset(f, 0, sizeof *f);
    *hooks = (pkl_fold){f, on_built, on_append, on_setitem, consume};
}

void dcp_fold_free(dcp_fold *f) {
    free(f->coords);
    free(f->ints);
    free(f->ix);
    free(f->st);
    free(f->pairs);
    memset(f, 0, sizeof *f);
}
