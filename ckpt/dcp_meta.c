/* DCP `.metadata` -> items: tensors with their chunks and storage, byte items. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/dcp_chunks.h"
#include "runtime/name_index.h"

#define META_MOD "torch.distributed.checkpoint.metadata"

void dcp_items_free(dcp_item *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(items[i].fqn);
        free(items[i].chunks);
        free(items[i].value_text);
    }
    free(items);
}

static int is_meta_class(const pkl_obj *o, const char *name) {
    const pkl_obj *c = pkl_callable(o);
    if (!c) return 0;
    if (!strcmp(c->name, name) &&
        (!strcmp(c->s, META_MOD) || !strcmp(c->s, "torch.distributed._shard.sharded_tensor.metadata")))
        return 1;
    return 0;
}

static int bad(fsdp_err *err, const char *what, const char *fqn, const char *msg) {
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s%s%s", what, fqn ? fqn : "", fqn ? ": " : "", msg);
}

static int tensor_meta(const char *what, const char *fqn, const pkl_obj *tsm, dcp_item *it, fsdp_err *err) {
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
    it->n_chunks = chunks->n;
    it->chunks = calloc(chunks->n ? chunks->n : 1, sizeof *it->chunks);
    if (!it->chunks) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < chunks->n; k++) {
        const pkl_obj *c = chunks->items[k], *cs = pkl_state(c);
        int no = 0, ns = 0;
        if (!is_meta_class(c, "ChunkStorageMetadata") || !cs ||
            pkl_int_tuple(pkl_dict_get(cs, "offsets"), it->chunks[k].offsets, FSDP_MAX_DIMS, &no) ||
            pkl_int_tuple(pkl_dict_get(cs, "sizes"), it->chunks[k].sizes, FSDP_MAX_DIMS, &ns) || no != it->ndim ||
            ns != it->ndim)
            return bad(err, what, fqn, "malformed chunk (offsets/sizes must match the tensor's dims)");
    }
    return 0;
}

static int storage_of(const char *what, const pkl_obj *si, dcp_storage *s, fsdp_err *err) {
    const pkl_obj *st = pkl_state(si);
    const pkl_obj *rp = pkl_dict_get(st, "relative_path"), *off = pkl_dict_get(st, "offset"),
                  *len = pkl_dict_get(st, "length"), *tr = pkl_dict_get(st, "transform_descriptors");
    const pkl_obj *cls = pkl_callable(si);
    if (!cls || strcmp(cls->name, "_StorageInfo")) return bad(err, what, NULL, "storage_data value is not a _StorageInfo");
    if (!rp || rp->kind != PKL_STR || !off || off->kind != PKL_INT || !len || len->kind != PKL_INT || off->i < 0 ||
        len->i < 0 || rp->len >= sizeof s->relative_path)
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
    memcpy(s->relative_path, rp->s, rp->len + 1);
    s->offset = (uint64_t)off->i;
    s->length = (uint64_t)len->i;
    return 0;
}

/* state_dict_metadata -> items (in file order) and the name index over them. */
static int parse_items(const char *what, const pkl_obj *sdm, dcp_item *it, size_t *cnt, nidx *names, fsdp_err *err) {
    int rc = 0;
    for (size_t i = 0; i < sdm->n && !rc; i++) {
        const pkl_obj *k = sdm->items[2 * i], *v = sdm->items[2 * i + 1];
        if (k->kind != PKL_STR) return bad(err, what, NULL, "state_dict_metadata key is not a string");
        dcp_item *x = &it[*cnt];
        x->fqn = strdup(k->s);
        if (!x->fqn) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        (*cnt)++;
        int dup = nidx_add(names, x->fqn, *cnt - 1, NULL);
        if (dup < 0) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (dup) return bad(err, what, k->s, "corrupt .metadata: the key is listed twice in state_dict_metadata");
        if (is_meta_class(v, "TensorStorageMetadata")) {
            x->is_tensor = 1;
            rc = tensor_meta(what, k->s, v, x, err);
        } else if (is_meta_class(v, "BytesStorageMetadata")) {
            x->is_tensor = 0;
        } else {
            const pkl_obj *c = pkl_callable(v);
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

/* One storage_data entry: (MetadataIndex(fqn, offset), _StorageInfo) onto its item or chunk. A
 * storage entry goes to the first chunk (in offsets order) that starts at its offset; the other
 * chunks with the same offsets (empty shards) get it from spread_storage. Later entries for the
 * same key win, as in a Python dict. */
static int storage_entry(const char *what, const pkl_obj *k, const pkl_obj *v, dcp_item *it, const nidx *names,
                         const chunk_orders *o, fsdp_err *err) {
    const pkl_obj *ks = pkl_state(k);
    if (!is_meta_class(k, "MetadataIndex") || !ks)
        return bad(err, what, NULL, "storage_data key is not a MetadataIndex");
    const pkl_obj *f = pkl_dict_get(ks, "fqn"), *off = pkl_dict_get(ks, "offset");
    if (!f || f->kind != PKL_STR) return bad(err, what, NULL, "MetadataIndex without fqn");
    dcp_storage s;
    int rc = storage_of(what, v, &s, err);
    if (rc) return rc;
    long j = nidx_get(names, f->s);
    if (j < 0) return 0; /* storage of an unknown key: ignored, like torch */
    dcp_item *x = &it[j];
    if (!x->is_tensor) {
        x->where = s;
        return 0;
    }
    int64_t ofs[FSDP_MAX_DIMS];
    int no = 0;
    if (!off || off->kind == PKL_NONE || pkl_int_tuple(off, ofs, FSDP_MAX_DIMS, &no) || no != x->ndim)
        return bad(err, what, f->s, "tensor storage index without matching offsets");
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

static int assign_storage(const char *what, const pkl_obj *sd, dcp_item *it, size_t cnt, const nidx *names,
                          fsdp_err *err) {
    chunk_orders o = {NULL, NULL};
    int rc = sort_chunks(it, cnt, &o, err);
    for (size_t i = 0; i < sd->n && !rc; i++)
        rc = storage_entry(what, sd->items[2 * i], sd->items[2 * i + 1], it, names, &o, err);
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

int dcp_parse_metadata_id(const void *buf, size_t len, const char *what, int whole, dcp_item **items, size_t *n,
                          char *version, size_t vcap, char *save_id, size_t scap, fsdp_err *err) {
    *items = NULL;
    *n = 0;
    pkl_doc *doc;
    const pkl_obj *root;
    int rc = pkl_parse(buf, len, what, &doc, &root, err);
    if (rc) return rc;
    const pkl_obj *st = pkl_state(root);
    if (!is_meta_class(root, "Metadata") || !st || st->kind != PKL_DICT) {
        pkl_free(doc);
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
        return bad(err, what, NULL, "Metadata without state_dict_metadata / storage_data dicts");
    }
    dcp_item *it = calloc(sdm->n ? sdm->n : 1, sizeof *it);
    if (!it) {
        pkl_free(doc);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    size_t cnt = 0;
    nidx names;
    nidx_init(&names);
    rc = parse_items(what, sdm, it, &cnt, &names, err);
    if (!rc) rc = assign_storage(what, sd, it, cnt, &names, err);
    if (!rc) rc = check_items(what, it, cnt, whole, err);
    nidx_free(&names);
    pkl_free(doc);
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
    return dcp_parse_metadata_id(buf, len, what, whole, items, n, version, vcap, NULL, 0, err);
}

int dcp_parse_metadata(const void *buf, size_t len, const char *what, dcp_item **items, size_t *n, char *version,
                       size_t vcap, fsdp_err *err) {
    return dcp_parse_metadata_ex(buf, len, what, 1, items, n, version, vcap, err);
}
