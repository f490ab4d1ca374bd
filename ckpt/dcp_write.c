/* Writing DCP checkpoints: per-rank data files and the `.metadata` pickle, in the structure
 * PyTorch 2.11 writes (checked against the fixtures' pickletools dumps). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/dcp.h"
#include "ckpt/dcp_group.h"
#include "ckpt/torchsave.h"
#include "runtime/crash.h"

#define META_MOD "torch.distributed.checkpoint.metadata"

static int fsync_path(const char *path, int dir, fsdp_err *err) {
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return fsdp_err_set(err, FSDP_E_IO, "%s: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0 && !dir) return fsdp_err_set(err, FSDP_E_IO, "%s: fsync: %s", path, strerror(errno));
    return 0;
}

int dcp_file_open_gen(dcp_file_writer *w, const char *dir, int rank, const dcp_gen *gen, tmpf_note_fn note,
                      void *user, fsdp_err *err) {
    memset(w, 0, sizeof *w);
    w->rank = rank;
    if (gen) w->gen = *gen;
    dcp_data_file_name(w->rel, sizeof w->rel, rank, w->gen.num);
    size_t n = strlen(dir) + 96;
    w->path = malloc(n);
    w->tmp = malloc(n);
    if (!w->path || !w->tmp) {
        free(w->path);
        free(w->tmp);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    snprintf(w->path, n, "%s/%s", dir, w->rel);
    snprintf(w->tmp, n, "%s/%s.tmp", dir, w->rel);
    int fd;
    int rc = tmpf_create(w->tmp, &fd, note, user, err);
    if (!rc && !(w->f = fdopen(fd, "wb"))) {
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot create %s: %s", w->tmp, strerror(errno));
        close(fd);
        unlink(w->tmp);
    }
    if (rc) {
        free(w->path);
        free(w->tmp);
        memset(w, 0, sizeof *w);
        return rc;
    }
    w->gen.id[DCP_GEN_ID_LEN] = '\0';
    /* large sequential writes */
    setvbuf(w->f, NULL, _IOFBF, 8 << 20);
    return 0;
}

int dcp_file_open(dcp_file_writer *w, const char *dir, int rank, fsdp_err *err) {
    return dcp_file_open_gen(w, dir, rank, NULL, NULL, NULL, err);
}

static void fill_rec(dcp_record *r, const char *fqn, int is_tensor) {
    memset(r, 0, sizeof *r);
    snprintf(r->fqn, sizeof r->fqn, "%s", fqn);
    r->is_tensor = is_tensor;
}

static int add_tensor(dcp_file_writer *w, const char *fqn, fsdp_dtype dt, int ndim, const int64_t *global_shape,
                      const int64_t *offsets, const int64_t *sizes, const void *data, ts_fill_fn fill, void *user,
                      dcp_record *rec, fsdp_err *err) {
    if (strlen(fqn) >= sizeof rec->fqn) return fsdp_err_set(err, FSDP_E_INVALID, "DCP: key too long: %s", fqn);
    fill_rec(rec, fqn, 1);
    rec->dtype = dt;
    rec->ndim = ndim;
    memcpy(rec->shape, global_shape, (size_t)ndim * sizeof *global_shape);
    memcpy(rec->offsets, offsets, (size_t)ndim * sizeof *offsets);
    memcpy(rec->sizes, sizes, (size_t)ndim * sizeof *sizes);
    uint64_t len;
    int rc = ts_write_tensor(w->f, dt, ndim, sizes, data, fill, user, &len, err);
    if (rc) return fsdp_err_prefix(err, "writing %s to %s", fqn, w->tmp);
    snprintf(rec->where.relative_path, sizeof rec->where.relative_path, "%s", w->rel);
    rec->where.offset = w->pos;
    rec->where.length = len;
    w->pos += len;
    crash_point("dcp.data.item", ++w->items, w->rank);
    return 0;
}

int dcp_file_add_tensor(dcp_file_writer *w, const char *fqn, fsdp_dtype dt, int ndim, const int64_t *global_shape,
                        const int64_t *offsets, const int64_t *sizes, const void *data, dcp_record *rec,
                        fsdp_err *err) {
    return add_tensor(w, fqn, dt, ndim, global_shape, offsets, sizes, data, NULL, NULL, rec, err);
}

int dcp_file_add_tensor_fill(dcp_file_writer *w, const char *fqn, fsdp_dtype dt, int ndim,
                             const int64_t *global_shape, const int64_t *offsets, const int64_t *sizes,
                             ts_fill_fn fill, void *user, dcp_record *rec, fsdp_err *err) {
    if (!fill) return fsdp_err_set(err, FSDP_E_INVALID, "DCP: no fill function for %s", fqn);
    return add_tensor(w, fqn, dt, ndim, global_shape, offsets, sizes, NULL, fill, user, rec, err);
}

int dcp_file_add_pickle(dcp_file_writer *w, const char *fqn, const void *pickle, size_t n, dcp_record *rec,
                        fsdp_err *err) {
    if (strlen(fqn) >= sizeof rec->fqn) return fsdp_err_set(err, FSDP_E_INVALID, "DCP: key too long: %s", fqn);
    fill_rec(rec, fqn, 0);
    uint64_t len;
    if (ts_write_value(w->f, pickle, n, &len, err)) return fsdp_err_prefix(err, "writing %s to %s", fqn, w->tmp);
    snprintf(rec->where.relative_path, sizeof rec->where.relative_path, "%s", w->rel);
    rec->where.offset = w->pos;
    rec->where.length = len;
    w->pos += len;
    crash_point("dcp.data.item", ++w->items, w->rank);
    return 0;
}

int dcp_file_add_value(dcp_file_writer *w, const char *fqn, const void *value_ops, size_t n, dcp_record *rec,
                       fsdp_err *err) {
    pkl_w pw;
    pkl_w_init(&pw);
    pkl_w_proto(&pw, 2);
    unsigned char *b = malloc(pw.len + n + 1);
    if (!b) {
        pkl_w_free(&pw);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    memcpy(b, pw.buf, pw.len);
    memcpy(b + pw.len, value_ops, n);
    b[pw.len + n] = '.';
    int rc = dcp_file_add_pickle(w, fqn, b, pw.len + n + 1, rec, err);
    free(b);
    pkl_w_free(&pw);
    return rc;
}

/* The temporary is renamed while it is still open, so its lock (tmpfile.h) covers it until it has
 * its final name. */
int dcp_file_close(dcp_file_writer *w, fsdp_err *err) {
    int rc = 0, renamed = 0;
    if (w->gen.id[0]) { /* after the last record: the save's identity (ckpt/dcp_gen.h) */
        unsigned char t[DCP_GEN_TRAILER];
        dcp_gen_trailer(&w->gen, w->rank, t);
        if (fwrite(t, 1, sizeof t, w->f) != sizeof t)
            rc = fsdp_err_set(err, FSDP_E_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    }
    if (!rc && fflush(w->f) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    if (!rc) crash_point("dcp.data.written", 1, w->rank);
    if (!rc && fsync(fileno(w->f)) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "%s: fsync failed: %s", w->tmp, strerror(errno));
    if (!rc) crash_point("dcp.data.synced", 1, w->rank);
    if (!rc && rename(w->tmp, w->path) != 0)
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot rename %s: %s", w->tmp, strerror(errno));
    renamed = !rc;
    if (renamed) crash_point("dcp.data.renamed", 1, w->rank);
    if (fclose(w->f) != 0 && !rc) rc = fsdp_err_set(err, FSDP_E_IO, "%s: close failed: %s", w->path, strerror(errno));
    w->f = NULL;
    if (!rc) {
        /* the new name must be durable before any .metadata refers to it */
        char *dir = strdup(w->path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (!dir) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else {
            if (slash) *slash = '\0';
            rc = fsync_path(slash ? dir : ".", 1, err);
        }
        free(dir);
    }
    if (rc) unlink(renamed ? w->path : w->tmp);
    free(w->path);
    free(w->tmp);
    w->path = w->tmp = NULL;
    return rc;
}

void dcp_file_abort(dcp_file_writer *w) {
    if (w->f) fclose(w->f);
    if (w->tmp) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    memset(w, 0, sizeof *w);
}

/* ---- .metadata ------------------------------------------------------------------------- */

static void dataclass_begin(pkl_w *w, const char *mod, const char *cls) {
    pkl_w_global(w, mod, cls);
    pkl_w_empty_tuple(w);
    pkl_w_newobj(w);
}

static void uuid4(char *out, size_t cap) {
    unsigned char b[16];
    int ok = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        ok = fread(b, 1, 16, f) == 16;
        fclose(f);
    }
    if (!ok) {
        uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        for (int i = 0; i < 16; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (unsigned char)(x >> 56);
        }
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    snprintf(out, cap, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* planner_data path of a key, as torchtitan's state dict nests it: model parameters are
 * top-level keys (one element), `optimizer`, `train_state`, `lr_scheduler` and `dataloader`
 * hold flattened dicts (two elements: the section and the rest of the key). */
static void section_path(pkl_w *w, const char *fqn) {
    static const char *const SECTIONS[] = {"optimizer.", "train_state.", "lr_scheduler.", "dataloader."};
    for (size_t i = 0; i < sizeof SECTIONS / sizeof *SECTIONS; i++) {
        size_t n = strlen(SECTIONS[i]);
        if (!strncmp(fqn, SECTIONS[i], n) && fqn[n]) {
            char head[32];
            snprintf(head, sizeof head, "%.*s", (int)(n - 1), fqn);
            pkl_w_str(w, head);
            pkl_w_str(w, fqn + n);
            pkl_w_tuple_n(w, 2);
            return;
        }
    }
    pkl_w_str(w, fqn);
    pkl_w_tuple_n(w, 1);
}

/* The record's planner_data path (dcp_record.nest): its first nest components, the middle, its last tail. */
static void key_path(pkl_w *w, const dcp_record *r) {
    if (r->nest <= 0) {
        section_path(w, r->fqn);
        return;
    }
    pkl_w_mark(w);
    const char *p = r->fqn;
    for (int k = 0; k < r->nest && *p; k++) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        char part[sizeof r->fqn];
        snprintf(part, sizeof part, "%.*s", (int)len, p);
        if (k < 16 && (r->int_mask >> k) & 1) pkl_w_int(w, strtoll(part, NULL, 10));
        else pkl_w_str(w, part);
        p += len + (dot ? 1 : 0);
        if (!dot) p = "";
    }
    const char *end = p + strlen(p), *cut = end; /* the tail: the last r->tail components */
    for (int t = 0; t < r->tail && cut > p; t++) {
        const char *q = cut - 1;
        while (q > p && *q != '.') q--;
        cut = q;
    }
    if (cut > p) {
        char mid[sizeof r->fqn];
        snprintf(mid, sizeof mid, "%.*s", (int)(cut - p), p);
        pkl_w_str(w, mid);
        p = cut + 1;
    }
    while (p < end && *p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        char part[sizeof r->fqn];
        snprintf(part, sizeof part, "%.*s", (int)len, p);
        pkl_w_str(w, part);
        p += len + (dot ? 1 : 0);
        if (!dot) break;
    }
    pkl_w_tuple(w);
}

static int64_t vol(const dcp_record *r) {
    int64_t v = 1;
    for (int d = 0; d < r->ndim; d++) v *= r->sizes[d];
    return v;
}

int dcp_write_metadata(const char *dir, const dcp_record *recs, size_t n, fsdp_err *err) {
    return dcp_write_metadata_gen(dir, recs, n, NULL, err);
}

/* The records grouped by key (dcp_records_group): group k is order[starts[k] .. starts[k + 1]). */
typedef struct meta_groups {
    const dcp_record *recs;
    size_t *order, *starts, nk;
} meta_groups;

/* TensorProperties of a tensor: its dtype, strided layout, no grad, no pinned memory, contiguous. */
static void write_tensor_properties(pkl_w *w, const dcp_record *r) {
    dataclass_begin(w, META_MOD, "TensorProperties");
    pkl_w_mark(w);
    pkl_w_global(w, "torch", fsdp_dtype_torch_name(r->dtype));
    pkl_w_global(w, "torch.serialization", "_get_layout");
    pkl_w_str(w, "torch.strided");
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    pkl_w_bool(w, 0);
    pkl_w_global(w, META_MOD, "_MEM_FORMAT_ENCODING");
    pkl_w_int(w, 0);
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    pkl_w_bool(w, 0);
    pkl_w_tuple(w);
    pkl_w_build(w);
}

/* TensorStorageMetadata of group k: properties, size and one ChunkStorageMetadata per record. */
static void write_tensor_storage(pkl_w *w, const meta_groups *g, size_t k) {
    const dcp_record *r = &g->recs[g->order[g->starts[k]]];
    dataclass_begin(w, META_MOD, "TensorStorageMetadata");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "properties");
    write_tensor_properties(w, r);
    pkl_w_str(w, "size");
    pkl_w_size(w, r->shape, r->ndim);
    pkl_w_str(w, "chunks");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t q = g->starts[k]; q < g->starts[k + 1]; q++) {
        size_t i = g->order[q];
        dataclass_begin(w, META_MOD, "ChunkStorageMetadata");
        pkl_w_empty_dict(w);
        pkl_w_mark(w);
        pkl_w_str(w, "offsets");
        pkl_w_size(w, g->recs[i].offsets, r->ndim);
        pkl_w_str(w, "sizes");
        pkl_w_size(w, g->recs[i].sizes, r->ndim);
        pkl_w_setitems(w);
        pkl_w_build(w);
    }
    pkl_w_appends(w);
    pkl_w_setitems(w);
    pkl_w_build(w);
}

/* Metadata.state_dict_metadata: each key's storage metadata (tensor or bytes). */
static void write_state_dict_metadata(pkl_w *w, const meta_groups *g) {
    pkl_w_str(w, "state_dict_metadata");
    pkl_w_empty_dict(w);
    for (size_t k = 0; k < g->nk; k++) {
        const dcp_record *r = &g->recs[g->order[g->starts[k]]];
        pkl_w_mark(w);
        pkl_w_str(w, r->fqn);
        if (!r->is_tensor) {
            /* torch 2.11 pickles it without a state */
            dataclass_begin(w, META_MOD, "BytesStorageMetadata");
        } else {
            write_tensor_storage(w, g, k);
        }
        pkl_w_setitems(w);
    }
}

/* Metadata.planner_data: each key's path in the state dict. */
static void write_planner_data(pkl_w *w, const meta_groups *g) {
    pkl_w_str(w, "planner_data");
    pkl_w_empty_dict(w);
    for (size_t k = 0; k < g->nk; k++) {
        pkl_w_mark(w);
        pkl_w_str(w, g->recs[g->order[g->starts[k]]].fqn);
        key_path(w, &g->recs[g->order[g->starts[k]]]);
        pkl_w_setitems(w);
    }
}

/* One storage_data entry: the record's MetadataIndex (index idx for tensors) to its _StorageInfo. */
static void write_storage_entry(pkl_w *w, const dcp_record *r, int64_t idx) {
    pkl_w_mark(w);
    dataclass_begin(w, META_MOD, "MetadataIndex");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "fqn");
    pkl_w_str(w, r->fqn);
    pkl_w_str(w, "index");
    if (r->is_tensor) {
        pkl_w_int(w, idx);
        pkl_w_str(w, "offset");
        pkl_w_size(w, r->offsets, r->ndim);
    } else {
        pkl_w_none(w);
    }
    pkl_w_setitems(w);
    pkl_w_build(w);
    dataclass_begin(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "relative_path");
    pkl_w_str(w, r->where.relative_path);
    pkl_w_str(w, "offset");
    pkl_w_int(w, (int64_t)r->where.offset);
    pkl_w_str(w, "length");
    pkl_w_int(w, (int64_t)r->where.length);
    pkl_w_setitems(w);
    pkl_w_build(w);
    pkl_w_setitems(w);
}

/* Metadata.storage_data: where every record's bytes are (tensor chunks numbered per key). */
static void write_storage_data(pkl_w *w, const meta_groups *g) {
    pkl_w_str(w, "storage_data");
    pkl_w_empty_dict(w);
    for (size_t k = 0; k < g->nk; k++) {
        int64_t idx = 0;
        for (size_t q = g->starts[k]; q < g->starts[k + 1]; q++) {
            const dcp_record *r = &g->recs[g->order[q]];
            write_storage_entry(w, r, r->is_tensor ? idx++ : 0);
        }
    }
}

/* Metadata.storage_meta (checkpoint id, the generation's save id or a fresh UUID) and version. */
static void write_storage_meta(pkl_w *w, const char *dir, const dcp_gen *gen) {
    char uuid[64];
    if (gen && gen->id[0]) dcp_gen_save_id(gen, uuid, sizeof uuid);
    else uuid4(uuid, sizeof uuid);
    pkl_w_str(w, "storage_meta");
    dataclass_begin(w, META_MOD, "StorageMeta");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "checkpoint_id");
    pkl_w_str(w, dir);
    pkl_w_str(w, "save_id");
    pkl_w_str(w, uuid);
    pkl_w_str(w, "load_id");
    pkl_w_none(w);
    pkl_w_str(w, "modules");
    pkl_w_empty_list(w);
    pkl_w_setitems(w);
    pkl_w_build(w);
    pkl_w_str(w, "version");
    pkl_w_str(w, "1.0.0");
}

/* Replaces <dir>/.metadata with the pickle (through .metadata.tmp) and syncs the directory. */
static int write_metadata_file(const char *dir, const pkl_w *w, fsdp_err *err) {
    size_t plen = strlen(dir) + 32;
    char *tmp = malloc(plen), *fin = malloc(plen);
    int rc = 0;
    if (!tmp || !fin) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) {
        snprintf(tmp, plen, "%s/.metadata.tmp", dir);
        snprintf(fin, plen, "%s/.metadata", dir);
        rc = tmpf_write_replace(tmp, fin, w->buf, w->len, "dcp.meta", err);
        if (!rc) rc = fsync_path(dir, 1, err);
    }
    free(tmp);
    free(fin);
    return rc;
}

int dcp_write_metadata_gen(const char *dir, const dcp_record *recs, size_t n, const dcp_gen *gen, fsdp_err *err) {
    /* unique keys in first-seen order: group k is order[starts[k] .. starts[k + 1]) */
    meta_groups g = {recs, NULL, NULL, 0};
    int grc = dcp_records_group(recs, n, &g.order, &g.starts, &g.nk, err);
    if (grc) return grc;
    pkl_w w;
    pkl_w_init(&w);
    if (pkl_w_memo_on(&w)) {
        free(g.order);
        free(g.starts);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    pkl_w_proto(&w, 2);
    dataclass_begin(&w, META_MOD, "Metadata");
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    write_state_dict_metadata(&w, &g);
    write_planner_data(&w, &g);
    write_storage_data(&w, &g);
    write_storage_meta(&w, dir, gen);
    pkl_w_setitems(&w);
    pkl_w_build(&w);
    pkl_w_stop(&w);
    free(g.order);
    free(g.starts);
    if (w.oom) {
        pkl_w_free(&w);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    (void)vol;
    int rc = write_metadata_file(dir, &w, err);
    pkl_w_free(&w);
    return rc;
}
