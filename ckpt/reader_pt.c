/* ckpt_reader over torch.save files (.pt): a (nested) dict of tensors in one zip archive;
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

static int pt_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, fsdp_err *err) {
    pt_impl *p = r->impl;
    ts_tensor *t = &p->t[i];
    int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) len[d] = t->shape[d];
    if (t->ndim > 0) {
        off[0] = r0;
        len[0] = r1 - r0;
    }
    int rc = ts_read_box(&p->z, t, off, len, dst, dt, err);
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

static const ckpt_ops PT_OPS = {pt_rows_op, pt_text_op, pt_close_op};

static int add(pt_impl *p, const char *name, const ts_tensor *t, char *text, fsdp_err *err) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        ts_tensor *nt = realloc(p->t, cap * sizeof *nt);
        if (nt) p->t = nt;
        char **nn = realloc(p->names, cap * sizeof *nn);
        if (nn) p->names = nn;
        char **nx = realloc(p->texts, cap * sizeof *nx);
        if (nx) p->texts = nx;
        if (!nt || !nn || !nx) {
            free(text);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        p->cap = cap;
    }
    p->names[p->n] = strdup(name);
    if (t) p->t[p->n] = *t;
    else memset(&p->t[p->n], 0, sizeof p->t[p->n]);
    p->texts[p->n] = text;
    p->n++;
    return p->names[p->n - 1] ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
}

static int walk(pt_impl *p, const char *prefix, const pkl_obj *o, int depth, fsdp_err *err) {
    if (depth > 64) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: state dict nested too deeply", p->z.what);
    if (p->visits_left == 0)
        return expands(p, "values", PT_VISITS_PER_BYTE * p->pkl_bytes + PT_VISITS_MIN, err);
    p->visits_left--;
    if (o->kind == PKL_DICT) {
        for (size_t i = 0; i < o->n; i++) {
            const pkl_obj *k = o->items[2 * i];
            char name[1024];
            if (k->kind == PKL_STR) snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", k->s);
            else if (k->kind == PKL_INT) snprintf(name, sizeof name, "%s%s%lld", prefix, *prefix ? "." : "", (long long)k->i);
            else return fsdp_err_set(err, FSDP_E_FORMAT, "%s: state dict key is not a string", p->z.what);
            int rc = walk(p, name, o->items[2 * i + 1], depth + 1, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (o->kind == PKL_REDUCE && o->fn && o->fn->kind == PKL_GLOBAL && !strcmp(o->fn->s, "torch._utils")) {
        ts_tensor t;
        char what[1200];
        snprintf(what, sizeof what, "%s: %s", p->z.what, prefix);
        int rc = ts_tensor_from_pickle(o, what, &t, err);
        if (!rc) rc = ts_check_record(&p->z, &t, prefix, err);
        if (rc) return rc;
        return add(p, prefix, &t, NULL, err);
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
    return add(p, prefix, NULL, text, err);
}

int ckpt_open_pt(const char *path, ckpt_reader **out, fsdp_err *err) {
    pt_impl *p = calloc(1, sizeof *p);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int orc = fio_open_read(path, NULL, &p->fd, err); /* never blocks on a FIFO */
    if (orc) {
        free(p);
        return orc;
    }
    struct stat st;
    fstat(p->fd, &st);
    int rc = zip_open_fd(&p->z, p->fd, 0, (uint64_t)st.st_size, path, err);
    const pkl_obj *root = NULL;
    if (!rc) rc = ts_load_pickle(&p->z, &p->doc, &root, err);
    if (!rc) {
        p->pkl_bytes = (size_t)zip_find(&p->z, "data.pkl")->size; /* <= 1 GiB (ts_load_pickle) */
        p->visits_left = PT_VISITS_PER_BYTE * p->pkl_bytes + PT_VISITS_MIN;
        p->text_left = PT_TEXT_PER_BYTE * p->pkl_bytes + PT_TEXT_MIN;
    }
    if (!rc) {
        if (root->kind == PKL_DICT) rc = walk(p, "", root, 0, err);
        else if (root->kind == PKL_REDUCE) rc = walk(p, "tensor", root, 0, err);
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
            e->nbytes = (uint64_t)p->t[i].numel * fsdp_dtype_size(e->dtype); /* <= its record's size */
        }
    }
    *out = r;
    return 0;
}

int ckpt_verify_pt(ckpt_reader *r, size_t *records, fsdp_err *err) {
    pt_impl *p = r->impl;
    *records = 0;
    for (size_t k = 0; k < p->z.n; k++, ++*records) {
        zip_entry *e = &p->z.entries[k];
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
