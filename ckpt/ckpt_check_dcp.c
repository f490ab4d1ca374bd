/* ckpt_check of a DCP checkpoint: every record the entries of .metadata point at, by its headers
 * only. dcp_open has already opened each data file (a regular file covering every range named in
 * it); here each distinct record (several keys may share one: save-dcp's aliases) is opened once,
 * in file order:
 *   - a torch.save archive: its end records, central directory and every local header (zip_open_fd
 *     checks them against each other), no record compressed, the tensor's data.pkl (a few hundred
 *     bytes) giving the dtype and shape of the chunk .metadata lists, and its data record holding
 *     the bytes they need; a byte item's archive holding data.pkl;
 *   - a safetensors piece (serialization_format=SAFETENSORS): its header lists the chunk with that
 *     dtype and shape, inside the file.
 * No tensor's bytes are read: that is ckpt_verify's CRC pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/dcp_st.h"
#include "ckpt/reader_impl.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"

/* One record an entry points at: a tensor chunk's (ch set) or a byte item's. */
typedef struct dck_ref {
    const dcp_storage *s;
    const dcp_item *x;
    const dcp_chunk *ch;
    size_t order;
} dck_ref;

typedef struct dck_ctx {
    dcp_ckpt *c;
    ckpt_check_report *rep;
    fsdp_err *err;
} dck_ctx;

static int cmp_ref(const void *a, const void *b) {
    const dck_ref *x = a, *y = b;
    int c = strcmp(x->s->relative_path, y->s->relative_path);
    if (c) return c;
    if (x->s->offset != y->s->offset) return x->s->offset < y->s->offset ? -1 : 1;
    if (x->s->length != y->s->length) return x->s->length < y->s->length ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int same_record(const dck_ref *a, const dck_ref *b) {
    return !strcmp(a->s->relative_path, b->s->relative_path) && a->s->offset == b->s->offset &&
           a->s->length == b->s->length;
}

/* A problem of ref's record, named by its key (unless msg names it already). */
static int problem(dck_ctx *k, const dck_ref *ref, const char *msg) {
    char tag[1100];
    snprintf(tag, sizeof tag, "%s %s", ref->ch ? "tensor" : "value", ref->x->fqn);
    int rc = strstr(msg, tag) ? ckpt_check_add(k->rep, "%s", msg) : ckpt_check_add(k->rep, "%s: %s", tag, msg);
    return rc ? fsdp_err_set(k->err, rc, "out of memory") : 0;
}

/* A problem from a failed call (its message in e); out of memory stops the check. */
static int problem_err(dck_ctx *k, const dck_ref *ref, const fsdp_err *e) {
    if (e->code == FSDP_E_NOMEM) return fsdp_err_set(k->err, FSDP_E_NOMEM, "%s", e->msg);
    return problem(k, ref, e->msg);
}

/* The stored dtype and shape against the chunk's in .metadata. */
static int check_piece_shape(dck_ctx *k, const dck_ref *ref, const char *what, fsdp_dtype dt, int nd,
                             const int64_t *shape) {
    const dcp_item *x = ref->x;
    if (dt == x->dtype && nd == x->ndim && !memcmp(shape, ref->ch->sizes, (size_t)nd * sizeof *shape)) return 0;
    char got[256], want[256], msg[1200];
    fsdp_shape_str(nd, shape, got, sizeof got);
    fsdp_shape_str(x->ndim, ref->ch->sizes, want, sizeof want);
    snprintf(msg, sizeof msg, "%s: the stored piece is %s %s, its chunk in .metadata is %s %s", what,
             fsdp_dtype_name(dt), got, fsdp_dtype_name(x->dtype), want);
    return problem(k, ref, msg);
}

/* Each chunk that points at a safetensors piece: listed in the blob's header, inside the file. */
static int check_st_refs(dck_ctx *k, struct dcp_file *f, const dck_ref *g, size_t n) {
    char what[4400];
    snprintf(what, sizeof what, "%s/%s", k->c->dir, g[0].s->relative_path);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const dck_ref *ref = &g[i];
        if (!ref->ch) {
            char msg[4600];
            snprintf(msg, sizeof msg, "%s@%llu: the record is a safetensors piece, not a value's torch.save archive", what,
                     (unsigned long long)ref->s->offset);
            rc = problem(k, ref, msg);
            continue;
        }
        dcp_st_tensor t;
        fsdp_err e;
        k->rep->records++;
        if (dcp_st_locate(&f->st, f->fd, f->size, ref->s->offset, ref->x->fqn, ref->x->ndim, ref->ch->offsets, what,
                          &t, &e))
            rc = problem_err(k, ref, &e);
        else rc = check_piece_shape(k, ref, what, t.dtype, t.ndim, t.shape);
    }
    return rc;
}

/* What an archive whose records are sound holds: the tensor every chunk of the group says (one
 * data.pkl, parsed once), or a value's data.pkl. */
static int check_contents(dck_ctx *k, zip_reader *z, const dck_ref *g, size_t n) {
    int loaded = 0, rc = 0;
    ts_tensor t;
    for (size_t i = 0; i < n && !rc; i++) {
        const dck_ref *ref = &g[i];
        if (!ref->ch) {
            if (!zip_find(z, "data.pkl")) rc = problem(k, ref, "no data.pkl record (not a torch.save archive)");
            continue;
        }
        if (!loaded) {
            fsdp_err e;
            if (ts_load_tensor(z, ref->x->fqn, &t, &e)) return problem_err(k, ref, &e);
            loaded = 1;
        }
        rc = check_piece_shape(k, ref, z->what, t.dtype, t.ndim, t.shape);
    }
    return rc;
}

/* The torch.save archive the group's entries share: its directory and local headers, then what it
 * holds (only when every record of it is sound: one problem per broken record). */
static int check_archive(dck_ctx *k, struct dcp_file *f, const dck_ref *g, size_t n) {
    char what[4400];
    snprintf(what, sizeof what, "%s/%s@%llu", k->c->dir, g[0].s->relative_path, (unsigned long long)g[0].s->offset);
    zip_reader z;
    fsdp_err e;
    if (zip_open_fd(&z, f->fd, g[0].s->offset, g[0].s->length, what, &e)) return problem_err(k, &g[0], &e);
    size_t before = k->rep->problems;
    int rc = 0;
    for (size_t i = 0; i < z.n && !rc; i++) {
        const zip_entry *ze = &z.entries[i];
        char msg[FSDP_ERR_MSG_MAX];
        k->rep->records++;
        if (ze->bad) {
            rc = problem(k, &g[0], ze->bad);
        } else if (ze->method != 0) {
            snprintf(msg, sizeof msg, "%s: zip record %s is compressed (method %u); torch.save stores its records",
                     what, ze->name, ze->method);
            rc = problem(k, &g[0], msg);
        }
    }
    if (!rc && k->rep->problems == before) rc = check_contents(k, &z, g, n);
    zip_close(&z);
    return rc;
}

static int check_record(dck_ctx *k, const dck_ref *g, size_t n) {
    long fi = nidx_get(&k->c->file_names, g[0].s->relative_path);
    if (fi < 0) return problem(k, &g[0], "its data file was not opened"); /* dcp_open opens every one */
    struct dcp_file *f = &k->c->files[fi];
    if (dcp_st_is_piece(f->fd, g[0].s->offset)) return check_st_refs(k, f, g, n);
    return check_archive(k, f, g, n);
}

int ckpt_check_dcp(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err) {
    dcp_ckpt *c = r->impl;
    size_t n = 0, m = 0;
    for (size_t i = 0; i < c->n; i++) n += c->items[i].is_tensor ? c->items[i].n_chunks : 1;
    dck_ref *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        for (size_t j = 0; j < (x->is_tensor ? x->n_chunks : 1); j++) {
            const dcp_chunk *ch = x->is_tensor ? &x->chunks[j] : NULL;
            const dcp_storage *s = ch ? &ch->where : &x->where;
            if (!s->relative_path[0]) continue; /* an empty shard without a record */
            v[m] = (dck_ref){s, x, ch, m};
            m++;
        }
    }
    qsort(v, m, sizeof *v, cmp_ref);
    rep->files = c->n_files;
    dck_ctx k = {c, rep, err};
    int rc = 0;
    for (size_t i = 0, j; i < m && !rc; i = j) {
        for (j = i + 1; j < m && same_record(&v[i], &v[j]);) j++;
        rc = check_record(&k, v + i, j - i);
    }
    free(v);
    return rc;
}
