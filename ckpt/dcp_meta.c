/* DCP `.metadata` -> items: tensors with their chunks and storage, byte items. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/dcp_chunks.h"
#include "ckpt/dcp_meta_fold.h"
#include "runtime/name_index.h"


void dcp_items_free(dcp_item *items, size_t n) {
    if (!items) return;
    for (size_t i = 0; i < n; i++) {
        free(items[i].fqn);
        free(items[i].chunks);
        free(items[i].coords);
        free(items[i].value_text);
    }
    dcp_names_free(items[n].names);
    free(items);
}

static int is_meta_class(const pkl_obj *o, const char *name) {
    const char *c = dcp_meta_class(o);
    return c && !strcmp(c, name);
}

static int bad(fsdp_err *err, const char *what, const char *fqn, const char *msg) {
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s%s%s", what, fqn ? fqn : "", fqn ? ": " : "", msg);
}

/* A chunk's offsets and sizes from its folded entry at coords[at] (1 + 2 ndim values), where they stay (the
 * items keep the fold's table: dcp_parse_metadata_id); 0 when its dims are the tensor's. */
static int folded_chunk(const dcp_fold *f, uint64_t at, dcp_chunk *c, int ndim) {
    if (!f->coords) return -1;
    int64_t *e = f->coords + at;
    if (e[0] != ndim) return -1;
    c->offsets = e + 1;
    c->sizes = e + 1 + ndim;
    return 0;
}

/* One chunk the tree kept (a folded one among a list's own items, or one the fold refused). */
static int tree_chunk(const dcp_fold *f, const pkl_obj *c, dcp_chunk *out, int ndim) {
    if (dcp_fold_kind(c) == DCP_FOLD_CHUNK) return folded_chunk(f, dcp_fold_at(c), out, ndim);
    const pkl_obj *cs = pkl_state(c);
    int64_t off[FSDP_MAX_DIMS], sz[FSDP_MAX_DIMS];
    int no = 0, ns = 0;
    if (!is_meta_class(c, "ChunkStorageMetadata") || !cs ||
        pkl_int_tuple(pkl_dict_get(cs, "offsets"), off, FSDP_MAX_DIMS, &no) ||
        pkl_int_tuple(pkl_dict_get(cs, "sizes"), sz, FSDP_MAX_DIMS, &ns) || no != ndim || ns != ndim)
        return -1;
    memcpy(out->offsets, off, (size_t)ndim * sizeof *off);
    memcpy(out->sizes, sz, (size_t)ndim * sizeof *sz);
    return 0;
}

/* The chunks list: its folded run (pointing into the fold's table), then its own items (the tree's, with
 * coordinates of their own). */
static int read_chunks(const char *what, const char *fqn, const dcp_fold *f, const pkl_obj *chunks, dcp_item *it,
                       fsdp_err *err) {
    size_t run = chunks->len;
    int rc = dcp_item_chunks_alloc(it, run + chunks->n, chunks->n, err);
    if (rc) return rc;
    uint64_t at = (uint64_t)chunks->i;
    for (size_t k = 0; k < it->n_chunks; k++) {
        int bad_chunk = k < run ? folded_chunk(f, at, &it->chunks[k], it->ndim)
                                : tree_chunk(f, chunks->items[k - run], &it->chunks[k], it->ndim);
        if (bad_chunk) return bad(err, what, fqn, "malformed chunk (offsets/sizes must match the tensor's dims)");
        if (k < run) at += 1 + 2 * (uint64_t)f->coords[at];
    }
    return 0;
}

static int tensor_meta(const char *what, const char *fqn, const dcp_fold *f, const pkl_obj *tsm, dcp_item *it,
                       fsdp_err *err) {
    const pkl_obj *st = pkl_state(tsm);
    if (!st) return bad(err, what, fqn, "TensorStorageMetadata without state");
    const pkl_obj *props = pkl_dict_get(st, "properties"), *size = pkl_dict_get(st, "size"),
                  *chunks = pkl_dict_get(st, "chunks");
    if (!props || !size || !chunks || chunks->kind != PKL_LIST)
        return bad(err, what, fqn, "TensorStorageMetadata needs properties, size and chunks");
    if (!is_meta_class(props, "TensorProperties")) return bad(err, what, fqn, "properties is not a TensorProperties");
    const pkl_obj *ps = pkl_state(props), *dt = NULL;
    if (ps && ps->kind == PKL_TUPLE && ps->n >= 1) dt = ps->items[0];
    else if (ps && ps->kind == PKL_DICT) dt = pkl_dict_get(ps, "dtype");
    if (!dt || dt->kind != PKL_GLOBAL || strcmp(dt->s, "torch")) return bad(err, what, fqn, "no torch dtype in properties");
    it->dtype = fsdp_dtype_from_name(dt->name);
    if (!it->dtype) {
        char m[128];
        snprintf(m, sizeof m, "unsupported dtype torch.%s", dt->name);
        return bad(err, what, fqn, m);
    }
    if (pkl_int_tuple(size, it->shape, FSDP_MAX_DIMS, &it->ndim)) return bad(err, what, fqn, "bad tensor size");
    int rc = dcp_check_tensor_size(what, it, err);
    if (rc) return rc;
    return read_chunks(what, fqn, f, chunks, it, err);
}

static int storage_of(const char *what, const dcp_fold *f, dcp_names *names, const pkl_obj *si, dcp_storage *s,
                      fsdp_err *err) {
    if (dcp_fold_kind(si) == DCP_FOLD_STORAGE) {
        const dcp_fold_storage *fs = &f->st[dcp_fold_at(si)];
        if (!(s->relative_path = dcp_names_intern(names, fs->rel))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        s->offset = fs->offset;
        s->length = fs->length;
        return 0;
    }
    const pkl_obj *st = pkl_state(si);
    const pkl_obj *rp = pkl_dict_get(st, "relative_path"), *off = pkl_dict_get(st, "offset"),
                  *len = pkl_dict_get(st, "length"), *tr = pkl_dict_get(st, "transform_descriptors");
    const pkl_obj *cls = pkl_callable(si);
    if (!cls || strcmp(cls->name, "_StorageInfo")) return bad(err, what, NULL, "storage_data value is not a _StorageInfo");
    if (!rp || rp->kind != PKL_STR || !off || off->kind != PKL_INT || !len || len->kind != PKL_INT || off->i < 0 ||
        len->i < 0 || rp->len >= DCP_REL_PATH_MAX)
        return bad(err, what, NULL, "malformed _StorageInfo");
    if (strchr(rp->s, '/') || !strcmp(rp->s, "..") || !rp->s[0])
        return bad(err, what, rp->s, "relative_path must be a file name in the checkpoint directory");
    if (tr && tr->kind == PKL_LIST && tr->n > 0) {
        char m[256];
        char *r = pkl_repr(tr);
        snprintf(m, sizeof m, "stream transforms %s are not supported (save without _extensions)", r ? r : "?");
        free(r);
        return bad(err, what, rp->s, m);
    }
    if (!(s->relative_path = dcp_names_intern(names, rp->s))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    s->offset = (uint64_t)off->i;
    s->length = (uint64_t)len->i;
    return 0;
}

/* state_dict_metadata -> items (in file order) and the name index over them. */
static int parse_items(const char *what, const dcp_fold *f, const pkl_obj *sdm, dcp_item *it, size_t *cnt, nidx *names,
                       fsdp_err *err) {
    int rc = 0;
    for (size_t i = 0; i < sdm->n && !rc; i++) {
        const pkl_obj *k = sdm->items[2 * i], *v = sdm->items[2 * i + 1];
        if (k->kind != PKL_STR) return bad(err, what, NULL, "state_dict_metadata key is not a string");
        dcp_item *x = &it[*cnt];
        x->fqn = strdup(k->s);
        x->where.relative_path = "";
        if (!x->fqn) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        (*cnt)++;
        int dup = nidx_add(names, x->fqn, *cnt - 1, NULL);
        if (dup < 0) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (dup) return bad(err, what, k->s, "corrupt .metadata: the key is listed twice in state_dict_metadata");
        if (is_meta_class(v, "TensorStorageMetadata")) {
            x->is_tensor = 1;
            rc = tensor_meta(what, k->s, f, v, x, err);
        } else if (is_meta_class(v, "BytesStorageMetadata")) {
            x->is_tensor = 0;
        } else {
            /* a folded object keeps its class */
            const pkl_obj *c = v->kind == PKL_FOLDED ? v->fn : pkl_callable(v);
            char m[256];
            snprintf(m, sizeof m, "unknown storage metadata class %s.%s", c ? c->s : "?", c ? c->name : "?");
            rc = bad(err, what, k->s, m);
        }
    }
    return rc;
}

/* Chunk orders by offsets for every tensor: ord[base[j] ...] lists item j's chunks. */
typedef struct chunk_orders {
    size_t *ord, *base;
} chunk_orders;

static int sort_chunks(const dcp_item *it, size_t cnt, chunk_orders *o, fsdp_err *err) {
    size_t total = 0;
    for (size_t j = 0; j < cnt; j++) total += it[j].is_tensor ? it[j].n_chunks : 0;
    o->ord = malloc((total ? total : 1) * sizeof *o->ord);
    o->base = malloc((cnt ? cnt : 1) * sizeof *o->base);
    if (!o->ord || !o->base) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory sorting %zu chunks", total);
    for (size_t j = 0, at = 0; j < cnt; j++) {
        o->base[j] = at;
        if (!it[j].is_tensor) continue;
        dcp_chunks_sort(&it[j], o->ord + at);
        at += it[j].n_chunks;
    }
    return 0;
}

/* A storage_data key: its fqn and offsets (*no -1: None). */
static int index_of(const char *what, const dcp_fold *f, const pkl_obj *k, const char **fqn, int64_t *ofs, int *no,
                    fsdp_err *err) {
    if (dcp_fold_kind(k) == DCP_FOLD_INDEX) {
        const dcp_fold_index *ix = &f->ix[dcp_fold_at(k)];
        *fqn = ix->fqn;
        *no = ix->ndim;
        if (ix->ndim > 0) memcpy(ofs, f->ints + ix->at, (size_t)ix->ndim * sizeof *ofs);
        return 0;
    }
    const pkl_obj *ks = pkl_state(k);
    if (!is_meta_class(k, "MetadataIndex") || !ks)
        return bad(err, what, NULL, "storage_data key is not a MetadataIndex");
    const pkl_obj *fo = pkl_dict_get(ks, "fqn"), *off = pkl_dict_get(ks, "offset");
    if (!fo || fo->kind != PKL_STR) return bad(err, what, NULL, "MetadataIndex without fqn");
    *fqn = fo->s;
    *no = -1;
    if (off && off->kind != PKL_NONE && pkl_int_tuple(off, ofs, FSDP_MAX_DIMS, no)) *no = -2; /* not offsets */
    return 0;
}

/* One storage_data entry: (MetadataIndex(fqn, offset), _StorageInfo) onto its item or chunk. A
 * storage entry goes to the first chunk (in offsets order) that starts at its offset; the other
 * chunks with the same offsets (empty shards) get it from spread_storage. Later entries for the
 * same key win, as in a Python dict. */
static int storage_entry(const char *what, const dcp_fold *f, dcp_names *files, const pkl_obj *k, const pkl_obj *v,
                         dcp_item *it, const nidx *names, const chunk_orders *o, fsdp_err *err) {
    const char *fqn = NULL;
    int64_t ofs[FSDP_MAX_DIMS];
    int no = -1;
    dcp_storage s;
    int rc = index_of(what, f, k, &fqn, ofs, &no, err);
    if (!rc) rc = storage_of(what, f, files, v, &s, err);
    if (rc) return rc;
    long j = nidx_get(names, fqn);
    if (j < 0) return 0; /* storage of an unknown key: ignored, like torch */
    dcp_item *x = &it[j];
    if (!x->is_tensor) {
        x->where = s;
        return 0;
    }
    if (no != x->ndim) return bad(err, what, fqn, "tensor storage index without matching offsets");
    size_t lo, hi;
    dcp_chunks_find(x, o->ord + o->base[j], ofs, &lo, &hi);
    if (lo < hi) x->chunks[o->ord[o->base[j] + lo]].where = s;
    return 0;
}

static void spread_storage(dcp_item *x, const size_t *ord) {
    for (size_t i = 1, first = 0; i < x->n_chunks; i++) {
        if (memcmp(x->chunks[ord[i]].offsets, x->chunks[ord[first]].offsets, (size_t)x->ndim * sizeof(int64_t))) {
            first = i;
            continue;
        }
        x->chunks[ord[i]].where = x->chunks[ord[first]].where;
    }
}

/* storage_data's entries in order: its folded run, then its own items */
static int assign_storage(const char *what, const dcp_fold *f, dcp_names *files, const pkl_obj *sd, dcp_item *it,
                          size_t cnt, const nidx *names, fsdp_err *err) {
    chunk_orders o = {NULL, NULL};
    int rc = sort_chunks(it, cnt, &o, err);
    for (size_t i = 0; i < sd->len && !rc; i++) {
        const dcp_fold_pair *p = &f->pairs[(size_t)sd->i + i];
        pkl_obj k = {.kind = PKL_FOLDED, .i = (int64_t)(((uint64_t)DCP_FOLD_INDEX << DCP_FOLD_SHIFT) | p->ix)},
                v = {.kind = PKL_FOLDED, .i = (int64_t)(((uint64_t)DCP_FOLD_STORAGE << DCP_FOLD_SHIFT) | p->st)};
        rc = storage_entry(what, f, files, &k, &v, it, names, &o, err);
    }
    for (size_t i = 0; i < sd->n && !rc; i++)
        rc = storage_entry(what, f, files, sd->items[2 * i], sd->items[2 * i + 1], it, names, &o, err);
    for (size_t j = 0; j < cnt && !rc; j++)
        if (it[j].is_tensor) spread_storage(&it[j], o.ord + o.base[j]);
    free(o.ord);
    free(o.base);
    return rc;
}

static int check_items(const char *what, dcp_item *it, size_t cnt, int whole, fsdp_err *err) {
    int rc = 0;
    for (size_t j = 0; j < cnt && !rc; j++) {
        dcp_item *x = &it[j];
        if (!x->is_tensor) {
            if (!x->where.relative_path[0]) rc = bad(err, what, x->fqn, "no storage entry for this value");
            continue;
        }
        for (size_t c = 0; c < x->n_chunks && !rc; c++)
            if (!x->chunks[c].where.relative_path[0] && fsdp_numel(x->ndim, x->chunks[c].sizes) != 0)
                rc = bad(err, what, x->fqn, "a chunk has no storage entry");
        if (!rc) rc = dcp_check_chunk_bounds(what, x, err);
        if (!rc && whole) rc = dcp_check_tiling(what, x, err);
    }
    return rc;
}

/* StorageMeta.save_id into out ("" when absent or not a string) */
static void save_id_of(const pkl_obj *st, char *out, size_t cap) {
    if (!out || !cap) return;
    out[0] = '\0';
    const pkl_obj *sm = pkl_dict_get(st, "storage_meta");
    const pkl_obj *sms = sm ? pkl_state(sm) : NULL;
    const pkl_obj *id = sms && sms->kind == PKL_DICT ? pkl_dict_get(sms, "save_id") : NULL;
    if (id && id->kind == PKL_STR) snprintf(out, cap, "%s", id->s);
}

int dcp_parse_metadata_id(const void *buf, size_t len, const char *what, int whole, int flags, dcp_item **items,
                          size_t *n, char *version, size_t vcap, char *save_id, size_t scap, fsdp_err *err) {
    *items = NULL;
    *n = 0;
    pkl_doc *doc;
    const pkl_obj *root;
    dcp_fold f;
    pkl_fold hooks;
    dcp_fold_hooks(&f, &hooks, flags & DCP_PARSE_CONSUME);
    int rc = pkl_parse_fold(buf, len, what, flags & DCP_PARSE_TREE ? NULL : &hooks, &doc, &root, err);
    if (rc) {
        dcp_fold_free(&f);
        return rc;
    }
    const pkl_obj *st = pkl_state(root);
    if (!is_meta_class(root, "Metadata") || !st || st->kind != PKL_DICT) {
        pkl_free(doc);
        dcp_fold_free(&f);
        return bad(err, what, NULL, "not a torch.distributed.checkpoint Metadata pickle");
    }
    const pkl_obj *sdm = pkl_dict_get(st, "state_dict_metadata"), *sd = pkl_dict_get(st, "storage_data"),
                  *ver = pkl_dict_get(st, "version");
    if (version && vcap) {
        version[0] = '\0';
        if (ver && ver->kind == PKL_STR) snprintf(version, vcap, "%s", ver->s);
    }
    save_id_of(st, save_id, scap);
    if (!sdm || sdm->kind != PKL_DICT || !sd || sd->kind != PKL_DICT) {
        pkl_free(doc);
        dcp_fold_free(&f);
        return bad(err, what, NULL, "Metadata without state_dict_metadata / storage_data dicts");
    }
    dcp_item *it = calloc(sdm->n + 1, sizeof *it); /* and the sentinel that owns the file names */
    dcp_names *files = dcp_names_new();
    if (!it || !files) {
        free(it);
        dcp_names_free(files);
        pkl_free(doc);
        dcp_fold_free(&f);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    size_t cnt = 0;
    nidx names;
    nidx_init(&names);
    rc = parse_items(what, &f, sdm, it, &cnt, &names, err);
    /* the chunks point into the fold's coordinates: the items keep them */
    if (f.coords && dcp_names_keep(files, f.coords) == 0) f.coords = NULL;
    else if (f.coords && !rc) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) rc = assign_storage(what, &f, files, sd, it, cnt, &names, err);
    if (!rc) rc = check_items(what, it, cnt, whole, err);
    it[cnt].names = files;
    nidx_free(&names);
    pkl_free(doc);
    dcp_fold_free(&f);
    if (rc) {
        dcp_items_free(it, cnt);
        return rc;
    }
    *items = it;
    *n = cnt;
    return 0;
}

int dcp_parse_metadata_ex(const void *buf, size_t len, const char *what, int whole, dcp_item **items, size_t *n,
                          char *version, size_t vcap, fsdp_err *err) {
    return dcp_parse_metadata_id(buf, len, what, whole, 0, items, n, version, vcap, NULL, 0, err);
}

int dcp_parse_metadata(const void *buf, size_t len, const char *what, dcp_item **items, size_t *n, char *version,
                       size_t vcap, fsdp_err *err) {
    return dcp_parse_metadata_ex(buf, len, what, 1, items, n, version, vcap, err);
}
