/* torch.save files in the legacy format of PyTorch < 1.6 (_use_new_zipfile_serialization=False),
 * as torch/serialization.py's _legacy_save writes them: five pickles one after another (the magic
 * number, the protocol version 1001, the system info, the object with its storages as persistent
 * ids ('storage', torch.<T>Storage, key, location, numel, view_metadata), the list of storage
 * keys), then each storage in that list's order: its element count as 8 little-endian bytes and
 * its bytes. ts_legacy_open presents the file as an archive whose record data/<key> is a
 * storage's bytes, so that the zip format's tensor code reads it unchanged. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/torchsave.h"
#include "runtime/checked.h"

#define LEGACY_PROTOCOL 1001
#define LEGACY_PICKLES 5
#define LEGACY_HEAD_MAX ((size_t)1 << 30) /* the pickles: at most 1 GiB, as a zip data.pkl */

typedef struct lg_storage {
    const char *key;
    fsdp_dtype dtype;
    int64_t numel;
} lg_storage;

typedef struct lg_walk {
    lg_storage *s;
    size_t n, cap, visits_left;
    const char *what;
    fsdp_err *err;
} lg_walk;

/* The five pickles at the start of the file: the buffer read grows until they fit (or the file
 * or LEGACY_HEAD_MAX ends). *end: where the storages start. */
static int read_pickles(int fd, uint64_t size, const char *what, pkl_doc **doc, const pkl_obj **root, uint64_t *end,
                        fsdp_err *err) {
    size_t cap = size < ((uint64_t)1 << 20) ? (size_t)size : (size_t)1 << 20;
    for (;;) {
        unsigned char *buf = malloc(cap ? cap : 1);
        if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", what);
        int rc = ckpt_pread_all(fd, buf, cap, 0, what, NULL, err), truncated = 0;
        size_t at = 0;
        for (int k = 0; k < LEGACY_PICKLES && !rc; k++) {
            size_t used;
            rc = pkl_parse_prefix(buf + at, cap - at, what, &doc[k], &root[k], &used, &truncated, err);
            at += used;
        }
        free(buf);
        if (!rc) {
            *end = at;
            return 0;
        }
        for (int k = 0; k < LEGACY_PICKLES; k++) pkl_free(doc[k]), doc[k] = NULL;
        if (!truncated || cap >= size || cap >= LEGACY_HEAD_MAX) return rc;
        cap = size - cap < cap ? (size_t)size : cap * 2;
        if (cap > LEGACY_HEAD_MAX) cap = LEGACY_HEAD_MAX;
    }
}

/* One persistent id ('storage', torch.<T>Storage, key, location, numel[, view_metadata]). */
static int add_storage(lg_walk *w, const pkl_obj *pid) {
    const pkl_obj *const *it = (const pkl_obj *const *)pid->items;
    if (pid->kind != PKL_TUPLE || pid->n < 5 || it[0]->kind != PKL_STR || strcmp(it[0]->s, "storage") ||
        it[1]->kind != PKL_GLOBAL || strcmp(it[1]->s, "torch") || it[2]->kind != PKL_STR || it[4]->kind != PKL_INT ||
        it[4]->i < 0)
        return fsdp_err_set(w->err, FSDP_E_FORMAT, "%s: corrupt: a persistent id that is not a storage", w->what);
    if (pid->n > 5 && it[5]->kind != PKL_NONE)
        return fsdp_err_set(w->err, FSDP_E_FORMAT, "%s: storage %s is a view of another storage (PyTorch < 0.4), "
                            "which fsdp-run does not read", w->what, it[2]->s);
    fsdp_dtype dt = ts_storage_dtype(it[1]->name);
    if (!dt)
        return fsdp_err_set(w->err, FSDP_E_FORMAT, "%s: storage %s: unsupported storage class torch.%s", w->what,
                            it[2]->s, it[1]->name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        lg_storage *ns = realloc(w->s, cap * sizeof *ns);
        if (!ns) return fsdp_err_set(w->err, FSDP_E_NOMEM, "out of memory");
        w->s = ns, w->cap = cap;
    }
    w->s[w->n++] = (lg_storage){it[2]->s, dt, it[4]->i};
    return 0;
}

/* Every persistent id of the object (a memo DAG is bounded by visits_left). */
static int walk(lg_walk *w, const pkl_obj *o) {
    if (!o) return 0;
    if (w->visits_left == 0)
        return fsdp_err_set(w->err, FSDP_E_FORMAT, "%s: the pickle expands to too many values (it shares "
                            "containers at many levels)", w->what);
    w->visits_left--;
    if (o->kind == PKL_PERSID) return o->args ? add_storage(w, o->args) : 0;
    size_t n = o->kind == PKL_DICT ? 2 * o->n : (o->kind == PKL_TUPLE || o->kind == PKL_LIST) ? o->n : 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) rc = walk(w, o->items[i]);
    if (!rc && (o->kind == PKL_REDUCE || o->kind == PKL_OBJ)) {
        rc = walk(w, o->args);
        if (!rc) rc = walk(w, o->state);
    }
    return rc;
}

static int cmp_storage(const void *a, const void *b) {
    return strcmp(((const lg_storage *)a)->key, ((const lg_storage *)b)->key);
}

/* Sorted by key, one per key (the persistent ids of one storage agree). */
static int unique_storages(lg_walk *w) {
    if (w->n) qsort(w->s, w->n, sizeof *w->s, cmp_storage); /* never qsort(NULL, 0) */
    size_t m = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (m && !strcmp(w->s[m - 1].key, w->s[i].key)) {
            if (w->s[m - 1].dtype != w->s[i].dtype || w->s[m - 1].numel != w->s[i].numel)
                return fsdp_err_set(w->err, FSDP_E_FORMAT, "%s: corrupt: storage %s is described twice, differently",
                                    w->what, w->s[i].key);
            continue;
        }
        w->s[m++] = w->s[i];
    }
    w->n = m;
    return 0;
}

/* The records: storage keys[i] at its place after the pickles, each count and size checked. */
static int place_storages(zip_reader *z, const lg_walk *w, const pkl_obj *keys, uint64_t at, uint64_t size,
                          fsdp_err *err) {
    if (keys->kind != PKL_LIST || keys->n != w->n)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: the list of storage keys does not name the %zu "
                            "storages of the state dict", z->what, w->n);
    z->entries = calloc(w->n ? w->n : 1, sizeof *z->entries);
    z->by_name = calloc(w->n ? w->n : 1, sizeof *z->by_name);
    if (!z->entries || !z->by_name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    z->n = w->n; /* sorted by key: by name */
    for (size_t i = 0; i < w->n; i++) z->by_name[i] = i;
    for (size_t k = 0; k < keys->n; k++) {
        const pkl_obj *key = keys->items[k];
        lg_storage probe = {key->kind == PKL_STR ? key->s : "", 0, 0};
        const lg_storage *s =
            key->kind == PKL_STR && w->n ? bsearch(&probe, w->s, w->n, sizeof *w->s, cmp_storage) : NULL;
        zip_entry *e = s ? &z->entries[s - w->s] : NULL;
        if (!e || e->name)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: storage key #%zu of the list is %s", z->what, k,
                                e ? "listed twice" : "not a storage of the state dict");
        if (!(e->name = malloc(strlen(s->key) + 6))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        strcpy(e->name, "data/");
        strcat(e->name, s->key);
        unsigned char h[8];
        uint64_t bytes, stop;
        if (at > size || size - at < 8)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: truncated: storage %s (%lld elements) starts at byte %llu, "
                                "the file has %llu", z->what, s->key, (long long)s->numel, (unsigned long long)at,
                                (unsigned long long)size);
        int rc = ckpt_pread_all(z->fd, h, 8, at, z->what, NULL, err);
        if (rc) return fsdp_err_prefix(err, "storage %s", s->key);
        uint64_t count = 0;
        for (int b = 7; b >= 0; b--) count = count << 8 | h[b];
        if (count != (uint64_t)s->numel)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: storage %s holds %llu elements at byte %llu, its "
                                "persistent id says %lld", z->what, s->key, (unsigned long long)count,
                                (unsigned long long)at, (long long)s->numel);
        if (chk_mul_u64(count, fsdp_dtype_size(s->dtype), &bytes) || chk_add_u64(at + 8, bytes, &stop) || stop > size)
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: truncated: storage %s needs %llu elements of %s from byte %llu, the file has "
                                "%llu bytes", z->what, s->key, (unsigned long long)count,
                                fsdp_dtype_name(s->dtype), (unsigned long long)(at + 8), (unsigned long long)size);
        e->size = bytes, e->data_off = at + 8, e->header_off = at, e->no_crc = 1;
        at = stop;
    }
    return 0;
}

/* The magic number is checked by the caller; the protocol version and byte order here. */
static int check_header(const pkl_obj *const *root, const char *what, fsdp_err *err) {
    if (root[1]->kind != PKL_INT || root[1]->i != LEGACY_PROTOCOL)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: legacy torch.save: unsupported protocol version (expected %d)",
                            what, LEGACY_PROTOCOL);
    const pkl_obj *le = pkl_dict_get(root[2], "little_endian");
    if (!le || le->kind != PKL_BOOL || !le->i)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: legacy torch.save written on a big-endian machine, which "
                            "fsdp-run does not read", what);
    return 0;
}

int ts_legacy_open(zip_reader *z, int fd, uint64_t size, const char *what, pkl_doc **doc, const pkl_obj **root,
                   size_t *pkl_bytes, fsdp_err *err) {
    memset(z, 0, sizeof *z);
    z->fd = fd, z->len = size;
    *doc = NULL;
    *root = NULL;
    if (!(z->what = strdup(what))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    pkl_doc *docs[LEGACY_PICKLES] = {0};
    const pkl_obj *roots[LEGACY_PICKLES] = {0};
    uint64_t end = 0;
    int rc = read_pickles(fd, size, what, docs, roots, &end, err);
    if (!rc) rc = check_header(roots, what, err);
    lg_walk w = {NULL, 0, 0, 0, what, err};
    if (!rc) {
        w.visits_left = 4 * (size_t)end + 4096;
        rc = walk(&w, roots[3]);
    }
    if (!rc) rc = unique_storages(&w);
    if (!rc) rc = place_storages(z, &w, roots[4], end, size, err);
    free(w.s);
    for (int k = 0; k < LEGACY_PICKLES; k++)
        if (k != 3 || rc) pkl_free(docs[k]);
    if (rc) {
        zip_close(z);
        return rc;
    }
    *doc = docs[3];
    *root = roots[3];
    *pkl_bytes = (size_t)end;
    return 0;
}
