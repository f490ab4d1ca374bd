/* Reading DCP checkpoints: only the byte ranges a requested box needs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_pread.h"
#include "ckpt/dcp.h"
#include "ckpt/dcp_chunks.h"
#include "ckpt/dcp_plan.h"
#include "ckpt/dcp_st.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
#include "runtime/crash.h"
#include "runtime/fileio.h"

/* "checkpoint <message>" (fio_open_beneath's messages start with the directory) */
static int as_checkpoint(fsdp_err *err) {
    char m[FSDP_ERR_MSG_MAX];
    memcpy(m, err->msg, sizeof m);
    return fsdp_err_set(err, err->code, "checkpoint %.*s", (int)sizeof m - 16, m);
}

/* name (a file of the checkpoint open as c->dfd) read whole; opened beneath the directory
 * (runtime/fileio.h: a symlink out of it is refused), a FIFO or another non-regular file refused */
static int read_file(const dcp_ckpt *c, const char *name, void **buf, size_t *len, fsdp_err *err) {
    int fd;
    int rc = fio_open_beneath(c->dfd, c->dir, name, &fd, err);
    if (rc) return as_checkpoint(err);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size > ((off_t)1 << 34)) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: %s: cannot size the file", c->dir, name);
    }
    *len = (size_t)st.st_size;
    *buf = malloc(*len ? *len : 1);
    if (!*buf) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s/%s", c->dir, name);
    }
    char what[4400];
    snprintf(what, sizeof what, "checkpoint %s: %s", c->dir, name);
    rc = ckpt_pread_all(fd, *buf, *len, 0, what, NULL, err);
    close(fd);
    if (rc) free(*buf);
    return rc;
}

void dcp_close(dcp_ckpt *c) {
    if (!c) return;
    dcp_items_free(c->items, c->n);
    for (size_t i = 0; i < c->n_files; i++) {
        if (c->files[i].fd >= 0) close(c->files[i].fd);
        free(c->files[i].rel);
        dcp_st_blob_free(c->files[i].st);
    }
    free(c->files);
    if (c->dfd >= 0) close(c->dfd);
    nidx_free(&c->item_names);
    nidx_free(&c->file_names);
    for (size_t i = 0; c->plan && i < c->n; i++) dcp_plan_ix_free(&c->plan[i]);
    free(c->plan);
    free(c->dir);
    free(c);
}

/* The data file rel (open as fd) must belong to the save c's .metadata records: both without an
 * identity (PyTorch's), or the same one (dcp_gen.h). Otherwise an error. */
static int dcp_gen_check_file(dcp_ckpt *c, int fd, uint64_t size, const char *rel, fsdp_err *err) {
    char id[DCP_GEN_ID_LEN + 1];
    int has = dcp_gen_read_trailer(fd, size, id);
    if (c->rank_local || (!has && !c->id[0]) || (has && !strcmp(id, c->id))) return 0;
    if (!has)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "checkpoint %s: %s does not end with the identity of the save its .metadata records "
                            "(fsdp-run save %s): the file is truncated, or another save's or program's",
                            c->dir, rel, c->id);
    if (!c->id[0])
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "checkpoint %s: %s belongs to fsdp-run save %s, but .metadata records no fsdp-run save: "
                            "the file is another checkpoint's (or was replaced while being read)",
                            c->dir, rel, id);
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "checkpoint %s: %s belongs to save %s, but .metadata is save %s's: the checkpoint was "
                        "overwritten while it was being read, or the file is another checkpoint's",
                        c->dir, rel, id, c->id);
}

static struct dcp_file *get_file(dcp_ckpt *c, const char *rel, fsdp_err *err) {
    long known = nidx_get(&c->file_names, rel);
    if (known >= 0) return &c->files[known];
    if (c->n_files == c->files_cap) {
        size_t cap = c->files_cap ? 2 * c->files_cap : 8;
        struct dcp_file *nf = realloc(c->files, cap * sizeof *nf);
        if (!nf) {
            fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            return NULL;
        }
        c->files = nf;
        c->files_cap = cap;
    }
    struct dcp_file *f = &c->files[c->n_files];
    if (fio_open_beneath(c->dfd, c->dir, rel, &f->fd, err)) {
        as_checkpoint(err);
        return NULL;
    }
    struct stat st;
    fstat(f->fd, &st);
    f->size = (uint64_t)st.st_size;
    f->st = NULL;
    f->rel = strdup(rel);
    if (!f->rel || nidx_add(&c->file_names, f->rel, c->n_files, NULL) != 0) {
        close(f->fd);
        free(f->rel);
        fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        return NULL;
    }
    c->n_files++;
    pause_point("dcp.open.data", (long)c->n_files);
    return f;
}

int dcp_record_is_archive(dcp_ckpt *c, const dcp_storage *s) {
    fsdp_err e;
    struct dcp_file *f = s->relative_path[0] ? get_file(c, s->relative_path, &e) : NULL;
    unsigned char m[4];
    return f && pread(f->fd, m, sizeof m, (off_t)s->offset) == (ssize_t)sizeof m && !memcmp(m, "PK\x03\x04", 4);
}

/* kind: "tensor" or "value" (a missing data file's error names what it holds) */
static int check_range(dcp_ckpt *c, const char *kind, const char *fqn, const dcp_storage *s, fsdp_err *err) {
    struct dcp_file *f = get_file(c, s->relative_path, err);
    if (!f) return fsdp_err_prefix(err, "%s %s", kind, fqn);
    if (s->offset > f->size || s->length > f->size - s->offset)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "checkpoint %s: .metadata places %s at bytes [%llu, %llu) of %s, but that file has only "
                            "%llu bytes (truncated or mismatched)",
                            c->dir, fqn, (unsigned long long)s->offset, (unsigned long long)(s->offset + s->length),
                            s->relative_path, (unsigned long long)f->size);
    return 0;
}

/* The rank-local metadata files of dir (`__<r>.metadata`), sorted by rank. */
typedef struct rank_meta {
    int rank;
    char *name;
    dcp_item *items;
    size_t n;
} rank_meta;

static int cmp_rank_meta(const void *a, const void *b) {
    const rank_meta *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void free_rank_metas(rank_meta *m, size_t n) {
    for (size_t i = 0; m && i < n; i++) {
        free(m[i].name);
        dcp_items_free(m[i].items, m[i].n);
    }
    free(m);
}

static int list_rank_local(const char *dir, rank_meta **out, size_t *n, fsdp_err *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", dir, strerror(errno));
    struct dirent *de;
    size_t cap = 0;
    int rc = 0;
    while ((de = readdir(d)) && !rc) {
        int r;
        char tail[8];
        if (sscanf(de->d_name, "__%d.metadat%1s", &r, tail) != 2 || strcmp(strrchr(de->d_name, '.'), ".metadata"))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            rank_meta *m = realloc(*out, cap * sizeof *m);
            if (!m) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                break;
            }
            *out = m;
        }
        rank_meta *m = &(*out)[*n];
        memset(m, 0, sizeof *m);
        m->rank = r;
        if (!(m->name = strdup(de->d_name))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else (*n)++;
    }
    closedir(d);
    if (!rc) qsort(*out, *n, sizeof **out, cmp_rank_meta);
    return rc;
}

/* An item of part m that merges into x: they must describe the same value. */
static int same_kind(const char *dir, const rank_meta *m, const dcp_item *x, const dcp_item *y, fsdp_err *err) {
    if (x->is_tensor == y->is_tensor &&
        (!x->is_tensor || (x->dtype == y->dtype && x->ndim == y->ndim &&
                           !memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof *x->shape))))
        return 0;
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "checkpoint %s: %s: corrupt rank-local metadata: %s describes it differently (%s) than an "
                        "earlier rank", dir, y->fqn, m->name,
                        x->is_tensor != y->is_tensor ? "tensor vs value" : "dtype or size");
}

/* Every part's items into one list: the first occurrence of a key (in rank order) keeps its place;
 * the chunks of a tensor listed by several ranks are concatenated in rank order. */
static int merge_parts(const char *dir, rank_meta *parts, size_t np, dcp_ckpt *c, fsdp_err *err) {
    size_t total = 0;
    for (size_t p = 0; p < np; p++) total += parts[p].n;
    c->items = calloc(total + 1, sizeof *c->items); /* and the sentinel owning the parts' file names */
    size_t *where = malloc((total ? total : 1) * sizeof *where); /* part item -> merged item */
    int rc = c->items && where ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    /* pass 1: merged keys and chunk counts */
    for (size_t p = 0, k = 0; p < np && !rc; p++)
        for (size_t i = 0; i < parts[p].n && !rc; i++, k++) {
            dcp_item *y = &parts[p].items[i];
            size_t prev;
            int dup = nidx_add(&c->item_names, y->fqn, c->n, &prev);
            if (dup < 0) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            } else if (!dup) {
                where[k] = c->n;
                c->items[c->n] = *y; /* takes fqn; the chunks are re-laid in pass 2 */
                c->items[c->n].chunks = NULL; /* the part keeps (and frees) its own chunk array */
                c->items[c->n].coords = NULL;
                c->items[c->n].n_chunks = 0;
                y->fqn = NULL, y->value_text = NULL;
                c->n++;
            } else {
                where[k] = prev;
                rc = same_kind(dir, &parts[p], &c->items[prev], y, err);
            }
            if (!rc && y->is_tensor) c->items[where[k]].n_chunks += y->n_chunks;
        }
    /* pass 2: each merged tensor's chunks in one array (their file names stay the parts': c takes them) */
    for (size_t j = 0; j < c->n && !rc; j++) {
        dcp_item *x = &c->items[j];
        if (!x->is_tensor) continue;
        rc = dcp_item_chunks_alloc(x, x->n_chunks, x->n_chunks, err);
        x->n_chunks = 0;
    }
    for (size_t p = 0, k = 0; p < np && !rc; p++)
        for (size_t i = 0; i < parts[p].n; i++, k++) {
            dcp_item *y = &parts[p].items[i], *x = &c->items[where[k]];
            if (!y->is_tensor) continue;
            for (size_t q = 0; q < y->n_chunks; q++) {
                dcp_chunk *to = &x->chunks[x->n_chunks++];
                memcpy(to->offsets, y->chunks[q].offsets, (size_t)x->ndim * sizeof *to->offsets);
                memcpy(to->sizes, y->chunks[q].sizes, (size_t)x->ndim * sizeof *to->sizes);
                to->where = y->chunks[q].where;
            }
        }
    for (size_t p = 0; p < np && !rc; p++) {
        dcp_names **pn = &parts[p].items[parts[p].n].names;
        if (!c->items[c->n].names) c->items[c->n].names = *pn;
        else dcp_names_chain(c->items[c->n].names, *pn);
        *pn = NULL;
    }
    free(where);
    return rc;
}

/* Merges the rank-local `__<r>.metadata` files of a checkpoint without `.metadata` into c->items
 * (O(N log N) for N items and chunks in all). Each file lists its rank's chunks only; a chunk
 * several ranks list alike (a replicated value) is kept once; the merged chunks must tile each
 * tensor. */
static int merge_rank_local(const char *dir, dcp_ckpt *c, fsdp_err *err) {
    rank_meta *parts;
    size_t np;
    int rc = list_rank_local(dir, &parts, &np, err);
    for (size_t p = 0; p < np && !rc; p++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, parts[p].name);
        void *buf;
        size_t len;
        if ((rc = read_file(c, parts[p].name, &buf, &len, err))) break;
        rc = dcp_parse_metadata_ex(buf, len, path, 0, &parts[p].items, &parts[p].n, c->version, sizeof c->version, err);
        free(buf);
    }
    if (!rc && np == 0)
        rc = fsdp_err_set(err, FSDP_E_FORMAT,
                          "checkpoint %s is incomplete: there is no .metadata (the save did not finish, or this is not "
                          "a DCP checkpoint)",
                          dir);
    if (!rc) rc = merge_parts(dir, parts, np, c, err);
    free_rank_metas(parts, np);
    char what[4200];
    snprintf(what, sizeof what, "%s/__*.metadata", dir);
    for (size_t i = 0; !rc && i < c->n; i++) {
        dcp_item *x = &c->items[i];
        if (!x->is_tensor) continue;
        if (!(rc = dcp_chunks_dedup(x, err))) rc = dcp_check_tiling(what, x, err);
    }
    return rc;
}

static uint64_t fnv1a(const void *p, size_t n) { return dcp_hash_end(dcp_hash_bytes(DCP_HASH_START, p, n)); }

/* `.metadata` parsed into c (its hash and save identity kept) */
static int read_metadata(dcp_ckpt *c, fsdp_err *err) {
    char path[4200], save_id[128];
    snprintf(path, sizeof path, "%s/.metadata", c->dir);
    void *buf;
    size_t len;
    int rc = read_file(c, ".metadata", &buf, &len, err);
    if (rc) return rc;
    c->meta_hash = fnv1a(buf, len);
    /* buf is given back page by page as it is parsed: a 4096-rank .metadata is 450 MB */
    rc = dcp_parse_metadata_id(buf, len, path, 1, DCP_PARSE_CONSUME, &c->items, &c->n, c->version, sizeof c->version, save_id,
                               sizeof save_id, err);
    free(buf);
    dcp_gen_from_save_id(save_id, c->id);
    for (size_t i = 0; !rc && i < c->n; i++) {
        int dup = nidx_add(&c->item_names, c->items[i].fqn, i, NULL);
        if (dup < 0) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else if (dup) /* dcp_parse_metadata refuses them: cannot happen */
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s: key listed twice", path, c->items[i].fqn);
    }
    return rc;
}

/* One attempt of dcp_open: the metadata read, every data file it names opened and checked. */
static int open_once(const char *dir, dcp_ckpt **out, fsdp_err *err) {
    dcp_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    *out = c;
    c->dfd = -1;
    int rc = fio_open_dir(dir, &c->dfd, err);
    if (rc) return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", dir, strerror(errno));
    struct stat st;
    if (fstatat(c->dfd, ".metadata", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        rc = read_metadata(c, err);
    } else {
        c->rank_local = 1;
        rc = merge_rank_local(dir, c, err);
    }
    if (!rc) pause_point("dcp.open.metadata", 1);
    for (size_t i = 0; !rc && i < c->n; i++) {
        dcp_item *x = &c->items[i];
        if (!x->is_tensor) rc = check_range(c, "value", x->fqn, &x->where, err);
        for (size_t k = 0; !rc && x->is_tensor && k < x->n_chunks; k++)
            if (x->chunks[k].where.relative_path[0]) rc = check_range(c, "tensor", x->fqn, &x->chunks[k].where, err);
    }
    for (size_t i = 0; !rc && i < c->n_files; i++)
        rc = dcp_gen_check_file(c, c->files[i].fd, c->files[i].size, c->files[i].rel, err);
    if (!rc && !(c->plan = calloc(c->n ? c->n : 1, sizeof *c->plan)))
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < c->n; i++) rc = dcp_plan_ix_build(&c->items[i], &c->plan[i], err);
    return rc;
}

/* after a failed attempt: whether `.metadata` is now another than the one c read */
static int metadata_changed(dcp_ckpt *c) {
    if (!c->meta_hash) return 0;
    void *buf;
    size_t len;
    fsdp_err e;
    if (read_file(c, ".metadata", &buf, &len, &e)) return 0;
    int changed = fnv1a(buf, len) != c->meta_hash;
    free(buf);
    return changed;
}

int dcp_open(const char *dir, dcp_ckpt **out, fsdp_err *err) {
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0) return fsdp_err_set(err, FSDP_E_IO, "checkpoint %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: not a directory", dir);
    for (int attempt = 0;; attempt++) {
        dcp_ckpt *c = NULL;
        int rc = open_once(dir, &c, err);
        if (!rc) {
            c->restarts = attempt;
            *out = c;
            return 0;
        }
        int changed = c && metadata_changed(c);
        dcp_close(c);
        if (!changed) return rc;
        if (attempt + 1 == DCP_OPEN_TRIES) {
            char last[FSDP_ERR_MSG_MAX];
            memcpy(last, err->msg, sizeof last);
            return fsdp_err_set(err, FSDP_E_IO,
                                "checkpoint %s was overwritten while it was being read, %d times in a row (a writer is "
                                "saving into it): read it again once that save is done (last: %.1500s)",
                                dir, DCP_OPEN_TRIES, last);
        }
    }
}

int dcp_data_fd(dcp_ckpt *c, const char *rel, int *fd, uint64_t *size, fsdp_err *err) {
    struct dcp_file *f = get_file(c, rel, err);
    if (!f) return err->code;
    *fd = f->fd;
    *size = f->size;
    return 0;
}

long dcp_find(const dcp_ckpt *c, const char *fqn) { return nidx_get(&c->item_names, fqn); }

static int open_blob(dcp_ckpt *c, const dcp_storage *s, zip_reader *z, fsdp_err *err) {
    struct dcp_file *f = get_file(c, s->relative_path, err);
    if (!f) return err->code;
    char what[4400];
    snprintf(what, sizeof what, "%s/%s@%llu", c->dir, s->relative_path, (unsigned long long)s->offset);
    return zip_open_fd(z, f->fd, s->offset, s->length, what, err);
}

/* An error of reading tensor fqn names it (once). */
static int name_tensor(fsdp_err *err, const char *fqn, int rc) {
    char tag[1100];
    snprintf(tag, sizeof tag, "tensor %s", fqn);
    return strstr(err->msg, tag) ? rc : fsdp_err_prefix(err, "%s", tag);
}

/* Copies a box of vol elements in C order (il) into dst's box layout (dst_stride) at tgt. */
static void scatter_box(int nd, const int64_t *il, int64_t vol, const int64_t *dst_stride, size_t esz,
                        const char *tmp, char *tgt) {
    int64_t idx[FSDP_MAX_DIMS] = {0};
    int64_t inner = nd ? il[nd - 1] : 1;
    for (int64_t e = 0; e < vol; e += inner) {
        size_t doff = 0;
        for (int d = 0; d < nd; d++) doff += (size_t)(idx[d] * dst_stride[d]);
        memcpy(tgt + doff * esz, tmp + (size_t)e * esz, (size_t)inner * esz);
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < il[d]) break;
            idx[d] = 0;
        }
    }
}

/* The intersection (so, il: in the chunk's coordinates) of a chunk stored in a safetensors piece. */
static int read_st_chunk(dcp_ckpt *c, struct dcp_file *f, const dcp_item *x, const dcp_chunk *ch, const int64_t *so,
                         const int64_t *il, const int64_t *len, const int64_t *dst_stride, char *tgt,
                         fsdp_dtype dst_dt, int *nan, fsdp_err *err) {
    char what[4400];
    snprintf(what, sizeof what, "%s/%s", c->dir, ch->where.relative_path);
    dcp_st_tensor t;
    int nd = x->ndim;
    int rc = dcp_st_locate(&f->st, f->fd, f->size, ch->where.offset, x->fqn, nd, ch->offsets, what, &t, err);
    if (!rc && (t.ndim != nd || t.dtype != x->dtype || memcmp(t.shape, ch->sizes, (size_t)nd * sizeof *t.shape)))
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: stored piece of %s has another dtype or shape than its chunk in "
                                              ".metadata", what, x->fqn);
    if (rc) return rc;
    int64_t vol = 1, full_rows = 1;
    for (int d = 0; d < nd; d++) {
        vol *= il[d];
        if (d > 0 && il[d] != len[d]) full_rows = 0;
    }
    int check = nan && dst_dt == FSDP_DT_F32;
    if (full_rows) {
        rc = dcp_st_read_box(f->fd, &t, so, il, tgt, dst_dt, what, err);
        if (!rc && check && ckpt_f32_has_nan((const float *)tgt, (size_t)vol)) *nan = 1;
        return rc;
    }
    size_t esz = fsdp_dtype_size(dst_dt);
    char *tmp = malloc((size_t)vol * esz);
    if (!tmp) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    rc = dcp_st_read_box(f->fd, &t, so, il, tmp, dst_dt, what, err);
    if (!rc && check && ckpt_f32_has_nan((const float *)tmp, (size_t)vol)) *nan = 1;
    if (!rc) scatter_box(nd, il, vol, dst_stride, esz, tmp, tgt);
    free(tmp);
    return rc;
}

int dcp_read_box(dcp_ckpt *c, size_t i, const int64_t *off, const int64_t *len, void *dst, fsdp_dtype dst_dt,
                 fsdp_err *err) {
    return dcp_read_box_nan(c, i, off, len, dst, dst_dt, NULL, err);
}

/* A box being read (dcp_read_box_nan): where it goes, and the NaN flag. */
typedef struct box_read {
    dcp_ckpt *c;
    const dcp_item *x;
    const int64_t *off, *len;
    int64_t dst_stride[FSDP_MAX_DIMS];
    char *dst;
    fsdp_dtype dst_dt;
    int *nan;
    fsdp_err *err;
} box_read;

/* The part [io, io + il) of a torch.save chunk ch (so: in its coordinates) into the box at tgt. */
static int read_ts_chunk(box_read *b, const dcp_chunk *ch, const int64_t *so, const int64_t *il, char *tgt) {
    const dcp_item *x = b->x;
    int nd = x->ndim;
    size_t esz = fsdp_dtype_size(b->dst_dt);
    zip_reader z;
    int rc = open_blob(b->c, &ch->where, &z, b->err);
    if (rc) return rc; /* e.g. the file cut short since it was opened */
    ts_tensor t;
    rc = ts_load_tensor(&z, x->fqn, &t, b->err);
    if (!rc && (t.ndim != nd || memcmp(t.shape, ch->sizes, (size_t)nd * sizeof *t.shape)))
        rc = fsdp_err_set(b->err, FSDP_E_FORMAT, "checkpoint %s: %s: stored piece has another shape than its chunk",
                          b->c->dir, x->fqn);
    int64_t vol = 1;
    int full_rows = 1; /* intersection spans whole trailing dims of the destination box */
    for (int d = 0; d < nd; d++) {
        vol *= il[d];
        if (d > 0 && il[d] != b->len[d]) full_rows = 0;
    }
    int piece_nan = 0, *pn = b->nan ? &piece_nan : NULL;
    if (!rc && full_rows) {
        rc = ts_read_box_nan(&z, &t, so, il, tgt, b->dst_dt, pn, b->err);
    } else if (!rc) { /* read the intersection into a temporary then scatter into dst's box layout */
        void *tmp = malloc((size_t)vol * esz);
        if (!tmp) rc = fsdp_err_set(b->err, FSDP_E_NOMEM, "out of memory");
        else rc = ts_read_box_nan(&z, &t, so, il, tmp, b->dst_dt, pn, b->err);
        if (!rc) scatter_box(nd, il, vol, b->dst_stride, esz, tmp, tgt);
        free(tmp);
    }
    zip_close(&z);
    if (!rc && piece_nan) *b->nan = 1;
    return rc;
}

/* dcp_plan_fn: one chunk's part of the box */
static int read_planned(void *user, size_t k, const int64_t *io, const int64_t *il) {
    box_read *b = user;
    const dcp_item *x = b->x;
    const dcp_chunk *ch = &x->chunks[k];
    int nd = x->ndim;
    int64_t so[FSDP_MAX_DIMS];
    char *tgt = b->dst;
    size_t esz = fsdp_dtype_size(b->dst_dt);
    for (int d = 0; d < nd; d++) {
        so[d] = io[d] - ch->offsets[d];
        tgt += (size_t)((io[d] - b->off[d]) * b->dst_stride[d]) * esz;
    }
    struct dcp_file *sf = get_file(b->c, ch->where.relative_path, b->err);
    int rc;
    if (!sf) rc = b->err->code;
    else if (dcp_st_is_piece(sf->fd, ch->where.offset))
        rc = read_st_chunk(b->c, sf, x, ch, so, il, b->len, b->dst_stride, tgt, b->dst_dt, b->nan, b->err);
    else rc = read_ts_chunk(b, ch, so, il, tgt);
    return rc ? name_tensor(b->err, x->fqn, rc) : 0;
}

int dcp_read_box_nan(dcp_ckpt *c, size_t i, const int64_t *off, const int64_t *len, void *dst, fsdp_dtype dst_dt,
                     int *nan, fsdp_err *err) {
    if (nan) *nan = 0;
    dcp_item *x = &c->items[i];
    if (!x->is_tensor) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: %s is not a tensor", c->dir, x->fqn);
    box_read b = {c, x, off, len, {0}, dst, dst_dt, nan, err};
    int64_t s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        if (off[d] < 0 || len[d] < 0 || off[d] + len[d] > x->shape[d])
            return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: box outside tensor %s", c->dir, x->fqn);
        b.dst_stride[d] = s;
        s *= len[d];
    }
    if (s == 0) return 0;
    return dcp_plan_box(x, &c->plan[i], off, len, read_planned, &b);
}

int dcp_read_value(dcp_ckpt *c, size_t i, pkl_doc **doc, const pkl_obj **root, fsdp_err *err) {
    dcp_item *x = &c->items[i];
    if (x->is_tensor) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: %s is a tensor", c->dir, x->fqn);
    zip_reader z;
    int rc = open_blob(c, &x->where, &z, err);
    if (rc) return rc;
    rc = ts_load_pickle(&z, doc, root, err);
    zip_close(&z);
    return rc;
}

int dcp_value(dcp_ckpt *c, size_t i, const char **text, fsdp_err *err) {
    dcp_item *x = &c->items[i];
    *text = NULL;
    if (x->is_tensor) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: %s is a tensor", c->dir, x->fqn);
    if (!x->value_text) {
        pkl_doc *doc;
        const pkl_obj *root;
        int rc = dcp_read_value(c, i, &doc, &root, err);
        if (rc) return fsdp_err_prefix(err, "value %s", x->fqn);
        x->value_text = pkl_repr(root);
        pkl_free(doc);
        if (!x->value_text) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    *text = x->value_text;
    return 0;
}

const char *dcp_value_text(dcp_ckpt *c, size_t i) {
    const char *t;
    fsdp_err err;
    return dcp_value(c, i, &t, &err) ? NULL : t;
}

int dcp_value_pickle(dcp_ckpt *c, size_t i, void **buf, size_t *len, fsdp_err *err) {
    dcp_item *x = &c->items[i];
    *buf = NULL;
    if (x->is_tensor) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint %s: %s is a tensor", c->dir, x->fqn);
    const char *t;
    int rc = dcp_value(c, i, &t, err); /* parses: a global outside the allow-list is refused here */
    if (rc) return rc;
    zip_reader z;
    if ((rc = open_blob(c, &x->where, &z, err))) return fsdp_err_prefix(err, "value %s", x->fqn);
    zip_entry *e = zip_find(&z, "data.pkl");
    for (size_t k = 0; !rc && k < z.n; k++)
        if (!strncmp(z.entries[k].name + strlen(z.prefix), "data/", 5))
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: value %s holds tensor storages (record %s)", c->dir,
                              x->fqn, z.entries[k].name);
    if (!rc) rc = e ? zip_read_all(&z, e, buf, len, err)
                    : fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: value %s has no data.pkl", c->dir, x->fqn);
    zip_close(&z);
    return rc;
}

/* Every record of the archive at s, checked (a safetensors piece carries no checksum). */
static int verify_blob(dcp_ckpt *c, const dcp_storage *s, size_t *records, fsdp_err *err) {
    struct dcp_file *f = get_file(c, s->relative_path, err);
    if (!f) return err->code;
    if (dcp_st_is_piece(f->fd, s->offset)) return 0;
    zip_reader z;
    int rc = open_blob(c, s, &z, err);
    if (rc) return rc;
    for (size_t k = 0; !rc && k < z.n; k++, ++*records) rc = zip_verify(&z, &z.entries[k], err);
    zip_close(&z);
    return rc;
}

/* A stored piece and the first item that points at it (several may: save-dcp's aliases). */
typedef struct piece_ref {
    const dcp_storage *s;
    const dcp_item *x;
    size_t order; /* item order, so that the first item names a shared piece */
} piece_ref;

static int cmp_piece(const void *a, const void *b) {
    const piece_ref *x = a, *y = b;
    int c = strcmp(x->s->relative_path, y->s->relative_path);
    if (c) return c;
    if (x->s->offset != y->s->offset) return x->s->offset < y->s->offset ? -1 : 1;
    if (x->s->length != y->s->length) return x->s->length < y->s->length ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int same_piece(const piece_ref *a, const piece_ref *b) {
    return !strcmp(a->s->relative_path, b->s->relative_path) && a->s->offset == b->s->offset &&
           a->s->length == b->s->length;
}

/* Every distinct stored piece once, in file order (entries that share a record, such as save-dcp's
 * aliases, are checked and counted once). */
int dcp_verify(dcp_ckpt *c, size_t *records, fsdp_err *err) {
    *records = 0;
    size_t n = 0, k = 0;
    for (size_t i = 0; i < c->n; i++) n += c->items[i].is_tensor ? c->items[i].n_chunks : 1;
    piece_ref *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        for (size_t j = 0; j < (x->is_tensor ? x->n_chunks : 1); j++) {
            const dcp_storage *s = x->is_tensor ? &x->chunks[j].where : &x->where;
            if (!s->relative_path[0]) continue; /* an empty shard without a record */
            v[k].s = s;
            v[k].x = x;
            v[k].order = k;
            k++;
        }
    }
    qsort(v, k, sizeof *v, cmp_piece);
    int rc = 0;
    for (size_t i = 0; i < k && !rc; i++) {
        if (i > 0 && same_piece(&v[i], &v[i - 1])) continue;
        rc = verify_blob(c, v[i].s, records, err);
        if (rc) fsdp_err_prefix(err, "%s %s", v[i].x->is_tensor ? "tensor" : "value", v[i].x->fqn);
    }
    free(v);
    return rc;
}
