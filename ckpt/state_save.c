/* Saving the sharded state as a PyTorch DCP checkpoint (see state_io.h). An existing checkpoint at
 * the path is replaced without ever leaving the path without a complete one: see ckpt/dcp_commit.c
 * for the file generations and the crash points of the sequence. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/ckpt_pipe.h"
#include "ckpt/dcp.h"
#include "ckpt/dcp_rank_commit.h"
#include "ckpt/dcp_side.h"
#include "ckpt/pickle.h"
#include "ckpt/save_plan.h"
#include "ckpt/state_io.h"
#include "runtime/crash.h"
#include "runtime/state_defer.h"

/* The files beside .metadata of a save (sio_side_file), owned (an async save keeps them until its
 * commit). */
typedef struct side_files {
    sio_side_file *f;
    size_t n;
} side_files;

static void side_free(side_files *sf) {
    for (size_t i = 0; i < sf->n; i++) {
        free((void *)sf->f[i].name);
        free((void *)sf->f[i].pickle);
    }
    free(sf->f);
    memset(sf, 0, sizeof *sf);
}

static int side_copy(const sio_save_opts *o, side_files *sf, fsdp_err *err) {
    memset(sf, 0, sizeof *sf);
    if (!o->n_files) return 0;
    sf->f = calloc(o->n_files, sizeof *sf->f);
    if (!sf->f) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < o->n_files; i++, sf->n++) {
        char *name = strdup(o->files[i].name);
        void *pk = malloc(o->files[i].len ? o->files[i].len : 1);
        sf->f[i].name = name;
        sf->f[i].pickle = pk;
        sf->f[i].len = o->files[i].len;
        if (!name || !pk) {
            sf->n++;
            side_free(sf);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        memcpy(pk, o->files[i].pickle, o->files[i].len);
    }
    return 0;
}

/* the commit's before_meta: rank 0 writes the files beside .metadata */
typedef struct side_job {
    const char *dir;
    const sio_side_file *f;
    size_t n;
} side_job;

static int write_side(void *user, fsdp_err *err) {
    const side_job *j = user;
    for (size_t i = 0; i < j->n; i++) {
        int rc = dcp_side_write(j->dir, j->f[i].name, j->f[i].pickle, j->f[i].len, err);
        if (rc) return fsdp_err_prefix(err, "save-dcp: files: %s", j->f[i].name);
    }
    return 0;
}

struct sio_async {
    comm *c;
    char *path;
    dcp_gen gen; /* of the data files (ckpt/dcp_commit.c) */
    save_plan plan;
    pthread_t th;
    int started;
    int rc;
    fsdp_err err;
    dcp_record *recs;
    size_t n_recs;
    atomic_int written;  /* the writer thread has returned (its file written, or failed) */
    int committed;       /* commit ran (sio_save_poll or sio_save_finish): its result is commit_rc */
    int commit_rc;
    fsdp_err commit_err;
    side_files files; /* written by rank 0 before .metadata */
};

static size_t item_numel(const save_item *it) { return (size_t)fsdp_numel(it->ndim, it->sizes); }

/* The downloads of every device item, in the order write_file writes the tensors. */
static int plan_downloads(const save_plan *p, const ckpt_sink *sink, ckpt_down *d, int *any, fsdp_err *err) {
    *any = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].is_tensor && p->items[i].on_dev) *any = 1;
    if (!*any) return 0;
    if (!sink) return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: %s is on the device and no staging sink was given",
                                   p->items[0].fqn);
    int rc = ckpt_sink_check(sink, err);
    if (rc) return rc;
    ckpt_down_init(d, sink);
    for (size_t i = 0; i < p->n && !rc; i++) {
        const save_item *it = &p->items[i];
        if (it->is_tensor && it->on_dev) rc = ckpt_down_add(d, (void *)it->data, item_numel(it) * sizeof(float), err);
    }
    if (rc) ckpt_down_free(d);
    return rc;
}

/* snapshot every tensor's values so the state may change while the file is written; device items
 * are downloaded through the sink (every download has completed on return) */
static int snapshot(save_plan *p, const ckpt_sink *sink, fsdp_err *err) {
    ckpt_down d;
    int any_dev;
    int rc = plan_downloads(p, sink, &d, &any_dev, err);
    if (rc) return rc;
    size_t total = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].is_tensor && (p->items[i].data || p->items[i].deferred))
            total += (size_t)fsdp_numel(p->items[i].ndim, p->items[i].sizes);
    p->snapshot = malloc((total ? total : 1) * sizeof(float));
    if (!p->snapshot) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory snapshotting %zu values", total);
    size_t off = 0;
    for (size_t i = 0; i < p->n && !rc; i++) {
        save_item *it = &p->items[i];
        if (!it->is_tensor || (!it->data && !it->deferred)) continue;
        size_t n = item_numel(it);
        if (it->deferred) { /* produced into the snapshot */
            if ((rc = state_param_fill(it->deferred, 0, n, p->snapshot + off, err))) break;
            it->deferred = NULL;
        } else if (!it->on_dev) {
            ckpt_copy_par(p->snapshot + off, it->data, n * sizeof(float), NULL);
        } else {
            /* this item's chunks, in plan order: item i+1's first download runs while these are copied */
            char *dst = (char *)(p->snapshot + off);
            for (size_t left = n * sizeof(float); left && !rc;) {
                void *buf;
                size_t b;
                if ((rc = ckpt_down_next(&d, &buf, &b, err))) break;
                ckpt_copy_par(dst, buf, b, NULL);
                dst += b;
                left -= b;
            }
            if (rc) break;
            it->on_dev = 0;
        }
        it->data = p->snapshot + off;
        off += n;
    }
    if (any_dev) {
        fsdp_err e2;
        int frc = ckpt_down_finish(&d, rc ? &e2 : err);
        if (!rc) rc = frc;
        ckpt_down_free(&d);
    }
    return rc;
}

/* Streams one device item's payload: its chunks from the download pipeline, converted to the
 * item's dtype, appended to the zip record (the bytes dcp_file_add_tensor would write). */
typedef struct dev_fill {
    ckpt_down *down;
    const save_item *it;
} dev_fill;

static int fill_from_dev(void *user, zip_writer *zw, fsdp_err *err) {
    dev_fill *f = user;
    int rc = 0;
    for (size_t left = item_numel(f->it) * sizeof(float); left && !rc;) {
        void *buf;
        size_t b;
        if ((rc = ckpt_down_next(f->down, &buf, &b, err))) break;
        if (b > left) return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: download plan out of step at %s", f->it->fqn);
        left -= b;
        /* converted to the stored dtype piece by piece as it is written (no staging copy) */
        rc = zip_writer_data_conv(zw, buf, FSDP_DT_F32, f->it->dtype, b / sizeof(float), err);
    }
    return rc;
}

/* A host item's payload: written straight from the state's array when it is stored in f32,
 * converted piece by piece into per-thread buffers otherwise (ckpt_pwrite.h). */
typedef struct host_fill {
    const float *src;
    size_t n;
    fsdp_dtype dtype;
} host_fill;

static int fill_from_host(void *user, zip_writer *zw, fsdp_err *err) {
    const host_fill *f = user;
    return zip_writer_data_conv(zw, f->src, FSDP_DT_F32, f->dtype, f->n, err);
}

/* A deferred item's payload: its rows produced piece by piece into the write buffers. */
static int gen_deferred(void *user, uint64_t e0, size_t n, float *dst, fsdp_err *err) {
    return state_param_fill(user, (int64_t)e0, n, dst, err);
}

static int fill_from_src(void *user, zip_writer *zw, fsdp_err *err) {
    const save_item *it = user;
    return zip_writer_data_gen(zw, gen_deferred, (void *)it->deferred, it->dtype, item_numel(it), err);
}

/* Once the items are written: each alias's record is its item's under its own key, and every record
 * carries its planner_data path. */
static void plan_records(const save_plan *p, dcp_record *recs) {
    for (size_t i = 0; i < p->n; i++) {
        const save_item *it = &p->items[i];
        if (it->alias_of >= 0) {
            recs[i] = recs[it->alias_of];
            snprintf(recs[i].fqn, sizeof recs[i].fqn, "%s", it->fqn);
        }
        recs[i].nest = (int16_t)it->nest;
        recs[i].int_mask = (uint16_t)it->int_mask;
    }
}

static int write_file(const char *path, int rank, const dcp_gen *gen, save_plan *p, float opt_step, const ckpt_sink *sink,
                      dcp_record **recs, size_t *nrec, fsdp_err *err) {
    *recs = calloc(p->n ? p->n : 1, sizeof **recs);
    *nrec = 0;
    if (!*recs) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    ckpt_down down;
    int any_dev;
    int rc = plan_downloads(p, sink, &down, &any_dev, err);
    if (rc) return rc;
    dev_fill fill = {&down, NULL};
    dcp_file_writer fw;
    if ((rc = dcp_file_open_gen(&fw, path, rank, gen, NULL, NULL, err))) {
        if (any_dev) ckpt_down_free(&down);
        return rc;
    }
    /* values first, then tensors (PyTorch's order inside a file); the records in plan order */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        for (size_t i = 0; i < p->n && !rc; i++) {
            save_item *it = &p->items[i];
            if (it->is_tensor != pass || it->alias_of >= 0) continue;
            dcp_record *r = &(*recs)[i];
            if (!it->is_tensor) {
                rc = dcp_file_add_value(&fw, it->fqn, it->value, it->value_len, r, err);
                continue;
            }
            if (it->deferred) {
                rc = dcp_file_add_tensor_fill(&fw, it->fqn, it->dtype, it->ndim, it->shape, it->offsets, it->sizes,
                                              fill_from_src, it, r, err);
                continue;
            }
            if (it->on_dev) {
                fill.it = it;
                rc = dcp_file_add_tensor_fill(&fw, it->fqn, it->dtype, it->ndim, it->shape, it->offsets, it->sizes,
                                              fill_from_dev, &fill, r, err);
                continue;
            }
            host_fill hf = {it->data ? it->data : &opt_step, item_numel(it), it->dtype};
            rc = dcp_file_add_tensor_fill(&fw, it->fqn, it->dtype, it->ndim, it->shape, it->offsets, it->sizes,
                                          fill_from_host, &hf, r, err);
        }
    }
    if (any_dev) {
        fsdp_err e2;
        int frc = ckpt_down_finish(&down, rc ? &e2 : err);
        if (!rc) rc = frc;
        ckpt_down_free(&down);
    }
    if (rc) {
        dcp_file_abort(&fw);
        return rc;
    }
    plan_records(p, *recs);
    *nrec = p->n;
    return dcp_file_close(&fw, err);
}

/* Rank 0 prepares the directory (dcp_prepare_dir: refuses a checkpoint unless overwrite, removes
 * stale temporaries, picks the generation of the new data files); everyone learns its verdict and
 * the generation before writing. Nothing of an existing checkpoint is touched here: it is replaced
 * by the rename of the new .metadata in commit (see ckpt/dcp_commit.c). */
static int prepare_dir(const char *path, comm *c, const sio_save_opts *o, dcp_gen *gen, fsdp_err *err) {
    int rc = 0, rank = comm_rank(c);
    memset(gen, 0, sizeof *gen);
    if (rank == 0)
        rc = dcp_prepare_dir(path, o->overwrite, "save-dcp", "set overwrite: true to replace it", gen, NULL, NULL,
                             err);
    int who;
    fsdp_err e2;
    fsdp_err_clear(&e2);
    int agreed = comm_agree(c, rc, &who, &e2);
    if (agreed && !rc) {
        char msg[FSDP_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "save-dcp: rank %d could not prepare %s", who, path);
        return fsdp_err_set(err, agreed, "%s", msg);
    }
    if (rc) return rc;
    if ((rc = comm_bcast(c, gen, sizeof *gen, 0, err))) return rc;
    crash_point("save.prepared", 1, rank);
    return 0;
}

/* gather every rank's records, rank 0 writes the files beside .metadata and then .metadata, everyone
 * waits for it */
static int commit(comm *c, const char *path, const dcp_gen *gen, const sio_side_file *files, size_t n_files, int local_rc,
                  fsdp_err *local_err, dcp_record *recs, size_t n, fsdp_err *err) {
    int rank = comm_rank(c);
    side_job sj = {path, files, n_files};
    dcp_rank_commit k = {path, *gen, comm_size(c), rank, rank + 1, "save-dcp", "save", n_files ? write_side : NULL, &sj};
    return dcp_rank_commit_run(c, &k, local_rc, local_err, recs, n, err);
}

int sio_save(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, fsdp_err *err) {
    return sio_save_staged(s, c, path, o, NULL, err);
}

int sio_save_staged(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, const ckpt_sink *sink,
                    fsdp_err *err) {
    int rank = comm_rank(c);
    dcp_gen gen;
    int rc = sio_save_check(s, comm_size(c), o, err);
    if (!rc) rc = prepare_dir(path, c, o, &gen, err);
    if (rc) return rc;
    save_plan p = {0};
    fsdp_err lerr;
    fsdp_err_clear(&lerr);
    dcp_record *recs = NULL;
    size_t n = 0;
    int lrc = splan_build(s, rank, comm_size(c), o, &p, &lerr);
    if (!lrc) lrc = write_file(path, rank, &gen, &p, (float)s->opt_step, sink, &recs, &n, &lerr);
    splan_free(&p);
    rc = commit(c, path, &gen, o->files, o->n_files, lrc, &lerr, recs, n, err);
    free(recs);
    return rc;
}

static void *async_main(void *arg) {
    sio_async *a = arg;
    fsdp_err_clear(&a->err);
    a->rc = write_file(a->path, comm_rank(a->c), &a->gen, &a->plan, 0, NULL, &a->recs, &a->n_recs, &a->err);
    atomic_store(&a->written, 1);
    return NULL;
}

int sio_save_begin(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, sio_async **out, fsdp_err *err) {
    return sio_save_begin_staged(s, c, path, o, NULL, out, err);
}

int sio_save_begin_staged(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, const ckpt_sink *sink,
                          sio_async **out, fsdp_err *err) {
    *out = NULL;
    dcp_gen gen;
    int rc = sio_save_check(s, comm_size(c), o, err);
    if (!rc) rc = prepare_dir(path, c, o, &gen, err);
    if (rc) return rc;
    sio_async *a = calloc(1, sizeof *a);
    if (!a || !(a->path = strdup(path))) {
        free(a);
        a = NULL;
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    if (!rc) {
        a->c = c;
        a->gen = gen;
        rc = splan_build(s, comm_rank(c), comm_size(c), o, &a->plan, err);
        if (!rc) rc = side_copy(o, &a->files, err);
    }
    /* the optimizer step (0-d tensors) is captured now too */
    if (!rc) rc = snapshot(&a->plan, sink, err);
    if (!rc) {
        for (size_t i = 0; i < a->plan.n; i++) {
            save_item *it = &a->plan.items[i];
            if (it->is_tensor && !it->data && it->alias_of < 0) {
                /* point the 0-d step tensors at a private float */
                float *f = malloc(sizeof *f);
                if (!f) {
                    rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                    break;
                }
                *f = (float)s->opt_step;
                it->data = f;
                it->value = (unsigned char *)f; /* freed with the plan */
            }
        }
    }
    /* every rank learns whether all snapshots were taken before any writes */
    int who = -1;
    fsdp_err e2;
    fsdp_err_clear(&e2);
    int agreed = comm_agree(c, rc, &who, &e2);
    if (!rc && agreed) rc = fsdp_err_set(err, agreed, "save-dcp: rank %d could not snapshot its shards", who);
    if (!rc && pthread_create(&a->th, NULL, async_main, a) != 0)
        rc = fsdp_err_set(err, FSDP_E_RUNTIME, "save-dcp: cannot start the writer thread");
    if (rc) {
        sio_async_free(a);
        return rc;
    }
    a->started = 1;
    *out = a;
    return 0;
}

/* joins the writer and commits (collective); once */
static int finish_now(sio_async *a) {
    if (a->started) {
        pthread_join(a->th, NULL);
        a->started = 0;
    }
    fsdp_err_clear(&a->commit_err);
    a->commit_rc = commit(a->c, a->path, &a->gen, a->files.f, a->files.n, a->rc, &a->err, a->recs, a->n_recs,
                          &a->commit_err);
    a->committed = 1;
    return a->commit_rc;
}

int sio_save_poll(sio_async *a, int *done, fsdp_err *err) {
    *done = a->committed;
    if (a->committed) return 0;
    /* every rank's writer has returned: the minimum of the flags over the ranks */
    int64_t all = atomic_load(&a->written);
    int rc = comm_allreduce(a->c, &all, 1, COMM_I64, COMM_MIN, err);
    if (rc || !all) return rc;
    *done = 1;
    finish_now(a);
    return 0;
}

int sio_save_finish(sio_async *a, fsdp_err *err) {
    if (!a->committed) finish_now(a);
    if (a->commit_rc) *err = a->commit_err;
    return a->commit_rc;
}

const char *sio_async_path(const sio_async *a) { return a->path; }

void sio_async_free(sio_async *a) {
    if (!a) return;
    if (a->started) pthread_join(a->th, NULL);
    splan_free(&a->plan);
    side_free(&a->files);
    free(a->recs);
    free(a->path);
    free(a);
}
