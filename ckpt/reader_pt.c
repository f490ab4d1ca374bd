/* ckpt_reader over torch.save files (.pt): a (nested) dict of tensors in one zip archive (or in
 * the legacy format of PyTorch < 1.6, presented as one: ckpt/torchsave_legacy.c);
 * tensors are read straight from their records (only the rows asked for). Opening checks that
 * every tensor's record holds the bytes it needs; a read of a whole tensor checks its record's
 * CRC-32, a read of some rows does not (see ckpt/zip.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/pt_optim.h"
#include "ckpt/reader_impl.h"
#include "ckpt/torchsave.h"
#include "runtime/fileio.h"

typedef struct pt_impl {
    int fd;
    zip_reader z;
    pkl_doc *doc;
    ts_tensor *t;
    char **names;
    char **texts; /* non-tensor values */
    const pkl_obj **values; /* their pickled objects (in doc) */
    pt_optim_map optim;     /* names of a classic checkpoint's optimizer ids */
    size_t n, cap;
    size_t pkl_bytes;          /* size of data.pkl */
    size_t visits_left;        /* walk's budget (a memo DAG must not expand without bound) */
    size_t text_left;          /* bytes of value text left */
} pt_impl;

/* walk (and the reprs of the values it meets) visits at most PT_VISITS_PER_BYTE x the pickle's
 * size + PT_VISITS_MIN values, and keeps at most PT_TEXT_PER_BYTE x its size + PT_TEXT_MIN
 * bytes of value text: a pickle that shares no container stays far below (each value it
 * reaches costs at least one opcode byte, and its text a few characters per byte), one that
 * shares a dict at every level ({a: d, b: d}, 24 levels deep in 1 KB) would expand to 2^24
 * entries. */
#define PT_VISITS_PER_BYTE 4
#define PT_VISITS_MIN 4096
#define PT_TEXT_PER_BYTE 16
#define PT_TEXT_MIN ((size_t)1 << 20)

static int expands(pt_impl *p, const char *what, size_t bound, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "%s: the state dict expands to more than %zu %s (the bound for its %zu-byte data.pkl): its "
                        "pickle shares containers (memo references) at many levels",
                        p->z.what, bound, what, p->pkl_bytes);
}

static int pt_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                      fsdp_err *err) {
    pt_impl *p = r->impl;
    ts_tensor *t = &p->t[i];
    int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) len[d] = t->shape[d];
    if (t->ndim > 0) {
        off[0] = r0;
        len[0] = r1 - r0;
    }
    int rc = ts_read_box_nan(&p->z, t, off, len, dst, dt, nan, err);
    return rc ? fsdp_err_prefix(err, "tensor %s", p->names[i]) : 0;
}

static const char *pt_text_op(ckpt_reader *r, size_t i) {
    pt_impl *p = r->impl;
    return p->texts[i];
}

static void pt_free(pt_impl *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->names[i]);
        free(p->texts[i]);
    }
    free(p->names);
    free(p->texts);
    free(p->values);
    pt_optim_free(&p->optim);
    free(p->t);
    pkl_free(p->doc);
    zip_close(&p->z);
    if (p->fd >= 0) close(p->fd);
    free(p);
}

static void pt_close_op(ckpt_reader *r) {
    pt_free(r->impl);
    ckpt_reader_free(r);
}

static const ckpt_ops PT_OPS = {pt_rows_op, pt_text_op, pt_close_op, NULL, NULL, NULL, NULL};

static int add(pt_impl *p, const char *name, const ts_tensor *t, char *text, fsdp_err *err) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        ts_tensor *nt = realloc(p->t, cap * sizeof *nt);
        if (nt) p->t = nt;
        char **nn = realloc(p->names, cap * sizeof *nn);
        if (nn) p->names = nn;
        char **nx = realloc(p->texts, cap * sizeof *nx);
        if (nx) p->texts = nx;
        const pkl_obj **nv = realloc(p->values, cap * sizeof *nv);
        if (nv) p->values = nv;
        if (!nt || !nn || !nx || !nv) {
            free(text);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        p->cap = cap;
    }
    p->names[p->n] = strdup(name);
    if (t) p->t[p->n] = *t;
    else memset(&p->t[p->n], 0, sizeof p->t[p->n]);
    p->texts[p->n] = text;
    p->values[p->n] = NULL;
    p->n++;
    return p->names[p->n - 1] ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
}

/* A dict: a dict, an OrderedDict made one by its SETITEMS, or an empty OrderedDict(). */
static int is_dict(const pkl_obj *o) {
    return o->kind == PKL_DICT ||
           (o->kind == PKL_REDUCE && pkl_is_global(o->fn, "collections", "OrderedDict") && o->args && o->args->n == 0);
}

/* Whether a list or tuple holds (at any depth) a tensor or a dict: then its items are walked as
 * `name.0`, `name.1`, ... (as DCP flattens them); a list of plain values stays one value. */
static int list_has_more(pt_impl *p, const pkl_obj *o, int depth) {
    if (depth > 64) return 0;
    for (size_t i = 0; i < o->n && p->visits_left; i++) {
        const pkl_obj *it = o->items[i], *fn, *args;
        p->visits_left--;
        if (is_dict(it) || ts_tensor_unwrap(it, &fn, &args)) return 1;
        if ((it->kind == PKL_LIST || it->kind == PKL_TUPLE) && list_has_more(p, it, depth + 1)) return 1;
    }
    return 0;
}

static int join(pt_impl *p, char *out, size_t cap, const char *prefix, const pkl_obj *k, fsdp_err *err) {
    const char *dot = *prefix ? "." : "";
    int n;
    if (k->kind == PKL_STR) n = snprintf(out, cap, "%s%s%s", prefix, dot, k->s);
    else if (k->kind == PKL_INT) n = snprintf(out, cap, "%s%s%lld", prefix, dot, (long long)k->i);
    else return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s: state dict key is not a string", p->z.what, prefix);
    if (n < 0 || (size_t)n >= cap)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: state dict key longer than %zu bytes under %s", p->z.what, cap,
                            prefix);
    return 0;
}

static int walk(pt_impl *p, const char *prefix, const pkl_obj *o, int depth, fsdp_err *err);

/* The optimizer of a classic training checkpoint, its integer ids named (pt_optim.h):
 * <prefix>.state.<name>.<k> and, as PyTorch flattens them, <prefix>.param_groups.<name>.<k> for
 * every parameter of every group. */
static int walk_optim(pt_impl *p, const char *prefix, const pkl_obj *o, int depth, fsdp_err *err) {
    char name[1024], sub[1024];
    int rc = 0;
    for (size_t i = 0; i < o->n && !rc; i++) {
        const pkl_obj *k = o->items[2 * i], *v = o->items[2 * i + 1];
        if ((rc = join(p, name, sizeof name, prefix, k, err))) break;
        int is_state = k->kind == PKL_STR && !strcmp(k->s, "state");
        int is_groups = k->kind == PKL_STR && !strcmp(k->s, "param_groups");
        if (!is_state && !is_groups) {
            rc = walk(p, name, v, depth + 1, err);
        } else if (is_state) {
            for (size_t j = 0; j < v->n && !rc; j++) {
                const pkl_obj *id = v->items[2 * j];
                const char *pn = id->kind == PKL_INT ? pt_optim_name(&p->optim, id->i) : NULL;
                if (pn) rc = snprintf(sub, sizeof sub, "%s.%s", name, pn) >= (int)sizeof sub
                                 ? fsdp_err_set(err, FSDP_E_FORMAT, "%s: key too long under %s", p->z.what, name)
                                 : 0;
                else rc = join(p, sub, sizeof sub, name, id, err);
                if (!rc) rc = walk(p, sub, v->items[2 * j + 1], depth + 2, err);
            }
        } else {
            for (size_t g = 0; g < v->n && !rc; g++) {
                const pkl_obj *grp = v->items[g], *ps = pkl_dict_get(grp, "params");
                for (size_t q = 0; q < ps->n && !rc; q++) {
                    const char *pn = pt_optim_name(&p->optim, ps->items[q]->i);
                    for (size_t h = 0; h < grp->n && !rc; h++) {
                        const pkl_obj *hk = grp->items[2 * h];
                        if (hk->kind == PKL_STR && !strcmp(hk->s, "params")) continue;
                        if (hk->kind != PKL_STR)
                            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s: a key that is not a string", p->z.what,
                                                name);
                        if (snprintf(sub, sizeof sub, "%s.%s.%s", name, pn, hk->s) >= (int)sizeof sub)
                            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: key too long under %s", p->z.what, name);
                        rc = walk(p, sub, grp->items[2 * h + 1], depth + 2, err);
                    }
                }
            }
        }
    }
    return rc;
}

static int walk(pt_impl *p, const char *prefix, const pkl_obj *o, int depth, fsdp_err *err) {
    if (depth > 64) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: state dict nested too deeply", p->z.what);
    if (p->visits_left == 0)
        return expands(p, "values", PT_VISITS_PER_BYTE * p->pkl_bytes + PT_VISITS_MIN, err);
    p->visits_left--;
    char name[1024];
    if (o == p->optim.optim) return walk_optim(p, prefix, o, depth, err);
    if (is_dict(o)) {
        for (size_t i = 0; i < o->n; i++) {
            int rc = join(p, name, sizeof name, prefix, o->items[2 * i], err);
            if (!rc) rc = walk(p, name, o->items[2 * i + 1], depth + 1, err);
            if (rc) return rc;
        }
        return 0;
    }
    const pkl_obj *fn, *args;
    if (ts_tensor_unwrap(o, &fn, &args) ||
        (o->kind == PKL_REDUCE && o->fn && o->fn->kind == PKL_GLOBAL && !strcmp(o->fn->s, "torch._utils"))) {
        ts_tensor t;
        char what[1200];
        snprintf(what, sizeof what, "%s: %s", p->z.what, prefix);
        int rc = ts_tensor_unwrap(o, &fn, &args) ? ts_tensor_from_call(fn, args, what, &t, err)
                                                 : ts_tensor_from_pickle(o, what, &t, err);
        if (!rc) rc = ts_check_record(&p->z, &t, prefix, err);
        if (rc) return rc;
        return add(p, prefix, &t, NULL, err);
    }
    if ((o->kind == PKL_LIST || o->kind == PKL_TUPLE) && list_has_more(p, o, depth)) {
        for (size_t i = 0; i < o->n; i++) {
            if (snprintf(name, sizeof name, "%s%s%zu", prefix, *prefix ? "." : "", i) >= (int)sizeof name)
                return fsdp_err_set(err, FSDP_E_FORMAT, "%s: key longer than %zu bytes under %s", p->z.what,
                                    sizeof name, prefix);
            int rc = walk(p, name, o->items[i], depth + 1, err);
            if (rc) return rc;
        }
        return 0;
    }
    char *text = pkl_repr_budget(o, &p->visits_left);
    if (!text) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t tl = strlen(text) + 1;
    if (p->visits_left == 0 || tl > p->text_left) {
        free(text);
        return p->visits_left == 0 ? expands(p, "values", PT_VISITS_PER_BYTE * p->pkl_bytes + PT_VISITS_MIN, err)
                                   : expands(p, "bytes of value text", PT_TEXT_PER_BYTE * p->pkl_bytes + PT_TEXT_MIN, err);
    }
    p->text_left -= tl;
    int rc = add(p, prefix, NULL, text, err);
    if (!rc) p->values[p->n - 1] = o;
    return rc;
}

/* The format of PyTorch < 1.6 (torch.save(..., _use_new_zipfile_serialization=False)): pickles
 * one after another, the first the magic number 0x1950a86a20f9469cfc6c as a LONG1. */
static int legacy_format(int fd) {
    static const unsigned char magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    unsigned char head[sizeof magic];
    return pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && !memcmp(head, magic, sizeof magic);
}

int ckpt_pt_is_legacy(const char *path) {
    int fd;
    fsdp_err e;
    if (fio_open_read(path, NULL, &fd, &e)) return 0;
    int legacy = legacy_format(fd);
    close(fd);
    return legacy;
}

int ckpt_open_pt(const char *path, ckpt_reader **out, fsdp_err *err) {
    int fd;
    int rc = fio_open_read(path, NULL, &fd, err); /* never blocks on a FIFO */
    return rc ? rc : ckpt_open_pt_fd(fd, path, out, err);
}

int ckpt_open_pt_fd(int fd, const char *path, ckpt_reader **out, fsdp_err *err) {
    pt_impl *p = calloc(1, sizeof *p);
    if (!p) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    p->fd = fd;
    struct stat st;
    fstat(p->fd, &st);
    const pkl_obj *root = NULL;
    int rc;
    if (legacy_format(p->fd)) { /* PyTorch < 1.6: its storages become records data/<key> */
        rc = ts_legacy_open(&p->z, p->fd, (uint64_t)st.st_size, path, &p->doc, &root, &p->pkl_bytes, err);
    } else {
        rc = zip_open_fd(&p->z, p->fd, 0, (uint64_t)st.st_size, path, err);
        if (!rc) rc = ts_load_pickle(&p->z, &p->doc, &root, err);
        if (!rc) p->pkl_bytes = (size_t)zip_find(&p->z, "data.pkl")->size; /* <= 1 GiB (ts_load_pickle) */
    }
    if (!rc) {
        p->visits_left = PT_VISITS_PER_BYTE * p->pkl_bytes + PT_VISITS_MIN;
        p->text_left = PT_TEXT_PER_BYTE * p->pkl_bytes + PT_TEXT_MIN;
    }
    if (!rc) rc = pt_optim_find(root, &p->optim, err);
    if (!rc) {
        if (is_dict(root)) rc = walk(p, "", root, 0, err);
        else if (root->kind == PKL_REDUCE) rc = walk(p, "tensor", root, 0, err);
        else if ((root->kind == PKL_LIST || root->kind == PKL_TUPLE) && list_has_more(p, root, 0))
            rc = walk(p, "", root, 0, err);
        else rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: not a state dict (the pickle's top is not a dict)", path);
    }
    /* the records no tensor named (a tensor's own broken record failed the walk, naming it) */
    for (size_t i = 0; !rc && i < p->z.n; i++)
        if (p->z.entries[i].bad) rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s", p->z.entries[i].bad);
    ckpt_reader *r = rc ? NULL : ckpt_reader_alloc(path, p->n, &PT_OPS, CKPT_PT, p);
    if (!rc && !r) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (rc) {
        pt_free(p);
        return rc;
    }
    for (size_t i = 0; i < p->n; i++) {
        ckpt_entry *e = &r->entries[i];
        e->name = p->names[i];
        e->is_tensor = p->texts[i] == NULL;
        e->chunks = 1;
        if (e->is_tensor) {
            e->dtype = p->t[i].dtype;
            e->ndim = p->t[i].ndim;
            memcpy(e->shape, p->t[i].shape, sizeof e->shape);
            e->nbytes = (uint64_t)p->t[i].numel * fsdp_dtype_size(e->dtype); /* fits: t.need */
        }
    }
    *out = r;
    return 0;
}

int ckpt_verify_pt(ckpt_reader *r, size_t *records, fsdp_err *err) {
    ckpt_reader *const *sh;
    size_t ns;
    *records = 0;
    if (ckpt_pt_shards(r, &sh, &ns)) { /* an HF index: each shard */
        for (size_t k = 0; k < ns; k++) {
            size_t n = 0;
            int rc = ckpt_verify_pt(sh[k], &n, err);
            *records += n;
            if (rc) return rc;
        }
        return 0;
    }
    pt_impl *p = r->impl;
    for (size_t k = 0; k < p->z.n; k++) {
        zip_entry *e = &p->z.entries[k];
        if (e->no_crc) continue; /* the legacy format's records carry no checksum: nothing to verify */
        ++*records;
        int rc = zip_verify(&p->z, e, err);
        if (!rc) continue;
        /* name the tensor whose storage the record holds */
        const char *key = e->name + strlen(p->z.prefix);
        for (size_t i = 0; i < p->n; i++)
            if (!p->texts[i] && !strncmp(key, "data/", 5) && !strcmp(key + 5, p->t[i].key))
                return fsdp_err_prefix(err, "tensor %s", p->names[i]);
        return rc;
    }
    return 0;
}

/* Opening checked every record's local header and every tensor's record size (and stopped at the
 * first problem); a tensor's record must also be stored, not compressed, for a read to take it. */
int ckpt_check_pt(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err) {
    ckpt_reader *const *sh;
    size_t ns;
    if (ckpt_pt_shards(r, &sh, &ns)) { /* an HF index: each shard */
        size_t files = 0, records = 0;
        for (size_t k = 0; k < ns; k++) {
            int rc = ckpt_check_pt(sh[k], rep, err);
            files += rep->files, records += rep->records;
            if (rc) return rc;
        }
        rep->files = files, rep->records = records;
        return 0;
    }
    pt_impl *p = r->impl;
    rep->files = 1;
    rep->records = p->z.n;
    for (size_t i = 0; i < p->n; i++) {
        if (p->texts[i]) continue;
        char rec[80];
        snprintf(rec, sizeof rec, "data/%s", p->t[i].key);
        const zip_entry *e = zip_find(&p->z, rec);
        if (!e || e->method == 0) continue; /* a missing record failed the open */
        if (ckpt_check_add(rep, "tensor %s: %s: zip record %s is compressed (method %u); torch.save stores its records",
                           p->names[i], p->z.what, e->name, e->method))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    return 0;
}

/* a value's pickle: at most this many nodes (a memo DAG is written expanded) */
#define PT_VALUE_NODES ((size_t)1 << 20)

int ckpt_pt_value_pickle(ckpt_reader *r, size_t i, void **buf, size_t *len, fsdp_err *err) {
    ckpt_reader *const *sh;
    size_t ns;
    if (ckpt_pt_shards(r, &sh, &ns) && i < r->n) { /* an HF index: the shard's entry */
        ckpt_reader *s;
        size_t j;
        ckpt_pt_locate(r, i, &s, &j);
        return ckpt_pt_value_pickle(s, j, buf, len, err);
    }
    pt_impl *p = r->impl;
    if (i >= p->n || !p->values[i])
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: entry #%zu is not a value", p->z.what, i);
    pkl_w w;
    pkl_w_init(&w);
    int bad = pkl_w_obj(&w, p->values[i], PT_VALUE_NODES);
    if (bad || w.oom) {
        pkl_w_free(&w);
        return w.oom ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory")
                     : fsdp_err_set(err, FSDP_E_FORMAT,
                                    "%s: value %s cannot be copied: it holds a tensor storage or expands to more than "
                                    "%zu values",
                                    p->z.what, p->names[i], PT_VALUE_NODES);
    }
    *buf = w.buf;
    *len = w.len;
    return 0;
}
