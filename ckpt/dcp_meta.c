/* DCP `.metadata` -> items: tensors with their chunks and storage, byte items. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"

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

static int64_t volume(const int64_t *sizes, int nd) {
    int64_t v = 1;
    for (int d = 0; d < nd; d++) v *= sizes[d];
    return v;
}

static int check_chunks(const char *what, dcp_item *it, fsdp_err *err) {
    int64_t total = volume(it->shape, it->ndim), covered = 0;
    for (size_t a = 0; a < it->n_chunks; a++) {
        dcp_chunk *c = &it->chunks[a];
        int64_t v = volume(c->sizes, it->ndim);
        for (int d = 0; d < it->ndim; d++)
            if (c->sizes[d] < 0 || c->offsets[d] < 0) return bad(err, what, it->fqn, "negative chunk offset or size");
        if (v == 0) continue; /* empty shards may carry any offset */
        for (int d = 0; d < it->ndim; d++)
            if (c->offsets[d] + c->sizes[d] > it->shape[d]) {
                char m[160];
                snprintf(m, sizeof m, "chunk %zu reaches index %lld of dim %d (size %lld)", a,
                         (long long)(c->offsets[d] + c->sizes[d]), d, (long long)it->shape[d]);
                return bad(err, what, it->fqn, m);
            }
        for (size_t b = 0; b < a; b++) {
            dcp_chunk *o = &it->chunks[b];
            if (volume(o->sizes, it->ndim) == 0) continue;
            int overlap = 1;
            for (int d = 0; d < it->ndim && overlap; d++)
                if (c->offsets[d] >= o->offsets[d] + o->sizes[d] || o->offsets[d] >= c->offsets[d] + c->sizes[d])
                    overlap = 0;
            if (overlap) return bad(err, what, it->fqn, "two chunks overlap");
        }
        covered += v;
    }
    if (covered != total) {
        char m[160];
        snprintf(m, sizeof m, "the chunks cover %lld of %lld elements (the checkpoint is missing pieces)",
                 (long long)covered, (long long)total);
        return bad(err, what, it->fqn, m);
    }
    return 0;
}

int dcp_parse_metadata(const void *buf, size_t len, const char *what, dcp_item **items, size_t *n, char *version,
                       size_t vcap, fsdp_err *err) {
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
    for (size_t i = 0; i < sdm->n && !rc; i++) {
        const pkl_obj *k = sdm->items[2 * i], *v = sdm->items[2 * i + 1];
        if (k->kind != PKL_STR) {
            rc = bad(err, what, NULL, "state_dict_metadata key is not a string");
            break;
        }
        dcp_item *x = &it[cnt++];
        x->fqn = strdup(k->s);
        if (!x->fqn) {
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            break;
        }
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
    /* storage: (fqn, offsets) -> where */
    for (size_t i = 0; i < sd->n && !rc; i++) {
        const pkl_obj *k = sd->items[2 * i], *v = sd->items[2 * i + 1];
        const pkl_obj *ks = pkl_state(k);
        if (!is_meta_class(k, "MetadataIndex") || !ks) {
            rc = bad(err, what, NULL, "storage_data key is not a MetadataIndex");
            break;
        }
        const pkl_obj *f = pkl_dict_get(ks, "fqn"), *off = pkl_dict_get(ks, "offset");
        if (!f || f->kind != PKL_STR) {
            rc = bad(err, what, NULL, "MetadataIndex without fqn");
            break;
        }
        dcp_storage s;
        if ((rc = storage_of(what, v, &s, err))) break;
        size_t j = 0;
        while (j < cnt && strcmp(it[j].fqn, f->s)) j++;
        if (j == cnt) continue; /* storage of an unknown key: ignored, like torch */
        dcp_item *x = &it[j];
        if (!x->is_tensor) {
            x->where = s;
            continue;
        }
        int64_t o[FSDP_MAX_DIMS];
        int no = 0;
        if (!off || off->kind == PKL_NONE || pkl_int_tuple(off, o, FSDP_MAX_DIMS, &no) || no != x->ndim) {
            rc = bad(err, what, f->s, "tensor storage index without matching offsets");
            break;
        }
        for (size_t c = 0; c < x->n_chunks; c++)
            if (!memcmp(x->chunks[c].offsets, o, (size_t)no * sizeof *o)) x->chunks[c].where = s;
    }
    for (size_t j = 0; j < cnt && !rc; j++) {
        dcp_item *x = &it[j];
        if (!x->is_tensor) {
            if (!x->where.relative_path[0]) rc = bad(err, what, x->fqn, "no storage entry for this value");
            continue;
        }
        for (size_t c = 0; c < x->n_chunks && !rc; c++)
            if (!x->chunks[c].where.relative_path[0] && volume(x->chunks[c].sizes, x->ndim) > 0)
                rc = bad(err, what, x->fqn, "a chunk has no storage entry");
        if (!rc) rc = check_chunks(what, x, err);
    }
    pkl_free(doc);
    if (rc) {
        dcp_items_free(it, cnt);
        return rc;
    }
    *items = it;
    *n = cnt;
    return 0;
}
