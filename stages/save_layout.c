/* save-dcp's `layout: NAME` (stages/stages.h): the state saved in fsdp-run's layout into a staging DCP beside the
 * path (<path>.fsdp-canon), then that checkpoint seen in layout NAME (layouts/layout.h) written at the path as
 * `ckpt convert --to NAME` writes it: a DCP layout by every rank (each its share of the rank files, rank 0 the side
 * file and `.metadata` last), a layout of parts part by part (DCP parts the same way; torch.save parts by rank 0),
 * DeepSpeed ZeRO by rank 0; then the staging checkpoint is removed. Every rank agrees on each step's outcome. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_reshard.h"
#include "ckpt/dcp_rank_commit.h"
#include "ckpt/safetensors.h"
#include "layouts/lay_deepspeed.h"
#include "layouts/layout.h"
#include "runtime/fileio.h"
#include "stages/stages.h"

#define SL_MAX_OPTS 16

typedef struct sl_job {
    fsdp_ctx *ctx;
    comm *c;
    const lay_layout *L;
    ckpt_reader *canon, *v; /* the staged checkpoint; it in L's names */
    int world, overwrite;
    const char *side_dir;   /* rank 0 writes L's side file here before the last `.metadata` (NULL: not now) */
} sl_job;

/* Every rank's outcome agreed on: an error of any rank is every rank's. */
static int agree(comm *c, int rc, fsdp_err *local, const char *what, fsdp_err *err) {
    int who;
    fsdp_err e2;
    int st = comm_agree(c, rc, &who, &e2);
    if (rc) {
        *err = *local;
        return rc;
    }
    return st ? fsdp_err_set(err, st, "save-dcp: rank %d failed %s", who, what) : 0;
}

/* The outcome of a step rank 0 did alone, rank 0's error (its message) every rank's. */
static int from_root(comm *c, int rc, const fsdp_err *local, const char *what, fsdp_err *err) {
    fsdp_err e = *local;
    e.code = rc;
    if (comm_bcast(c, &e, sizeof e, 0, err)) return fsdp_err_prefix(err, "save-dcp: %s", what);
    if (!e.code) return 0;
    *err = e;
    return e.code;
}

static int side_before_meta(void *user, fsdp_err *err) {
    sl_job *j = user;
    return j->side_dir ? lay_side_write(j->L, j->canon, j->side_dir, err) : 0;
}

static int can_stream(void *user, size_t i) {
    (void)user, (void)i;
    return cks_enabled();
}

static int read_whole(void *user, size_t i, fsdp_dtype dt, void **buf, fsdp_err *err) {
    ckpt_reader *r = user;
    const ckpt_entry *e = ckpt_entry_at(r, i);
    int64_t n = fsdp_numel(e->ndim, e->shape);
    if (!(*buf = malloc((size_t)(n ? n : 1) * fsdp_dtype_size(dt))))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", e->name);
    int rc = ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, *buf, dt, err);
    if (rc) free(*buf), *buf = NULL;
    return rc;
}

/* This rank's rank files [lo, hi) of the view's entries under prefix pre ("" all) into DCP dst; *recs / *n. */
static int write_files(sl_job *j, const char *pre, const char *dst, const dcp_gen *gen, int lo, int hi,
                       dcp_record **out, size_t *nout, fsdp_err *err) {
    size_t n = ckpt_count(j->v), per = n + 2, k = (size_t)(hi - lo), ne = 0;
    ckrs_entry *e = calloc(n ? n : 1, sizeof *e);
    dcp_file_writer *fw = calloc(k ? k : 1, sizeof *fw);
    dcp_record *recs = calloc(per * (k ? k : 1), sizeof *recs), **rr = calloc(k ? k : 1, sizeof *rr);
    size_t *nrec = calloc(k ? k : 1, sizeof *nrec), opened = 0;
    int rc = e && fw && recs && rr && nrec ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_entry *x = ckpt_entry_at(j->v, i);
        if (strncmp(x->name, pre, strlen(pre))) continue;
        int nest, tail;
        unsigned mask;
        e[ne].i = i, e[ne].name = x->name, e[ne].dt = x->dtype;
        if (lay_nest(j->L, x->name, &nest, &tail, &mask))
            e[ne].nest = (int16_t)nest, e[ne].tail = (int16_t)tail, e[ne].int_mask = (uint16_t)mask;
        ne++;
    }
    for (; !rc && opened < k; opened++) {
        rr[opened] = recs + opened * per;
        if ((rc = dcp_file_open_gen(&fw[opened], dst, lo + (int)opened, gen, NULL, NULL, err))) break;
    }
    ckrs_src s = {j->v, e, ne, j->world, 0, 1, can_stream, read_whole, j->v, {0, 0, 0, 0, 0}, NULL};
    cks_opts_default(&s.o);
    cks_files fc = {0};
    if (!rc) rc = ckrs_write_ranks(&s, lo, hi, fw, &fc, rr, nrec, err);
    cks_files_free(&fc);
    for (size_t q = 0; q < opened; q++) {
        if (!rc) rc = dcp_file_close(&fw[q], err);
        else if (fw[q].f) dcp_file_abort(&fw[q]);
    }
    *nout = 0;
    for (size_t q = 0; !rc && q < k; q++) {
        memmove(recs + *nout, rr[q], nrec[q] * sizeof *recs);
        *nout += nrec[q];
    }
    free(e), free(fw), free(rr), free(nrec);
    if (rc) free(recs), recs = NULL;
    *out = recs;
    return rc;
}

/* The view's entries under pre as the DCP checkpoint dst of j->world ranks, written by every rank. */
static int write_dcp(sl_job *j, const char *pre, const char *dst, fsdp_err *err) {
    int rank = comm_rank(j->c), size = comm_size(j->c), rc = 0;
    dcp_gen gen;
    memset(&gen, 0, sizeof gen);
    fsdp_err local;
    fsdp_err_clear(&local);
    if (rank == 0)
        rc = dcp_prepare_dir(dst, j->overwrite, "save-dcp", "set overwrite: true to replace it", &gen, NULL, NULL, &local);
    if ((rc = agree(j->c, rc, &local, "preparing the layout's directory", err))) return rc;
    if ((rc = comm_bcast(j->c, &gen, sizeof gen, 0, err))) return rc;
    int lo = (int)((int64_t)rank * j->world / size), hi = (int)((int64_t)(rank + 1) * j->world / size);
    dcp_record *recs = NULL;
    size_t n = 0;
    int lrc = write_files(j, pre, dst, &gen, lo, hi, &recs, &n, &local);
    dcp_rank_commit k = {dst, gen, j->world, lo, hi, "save-dcp", "save", side_before_meta, j};
    rc = dcp_rank_commit_run(j->c, &k, lrc, &local, recs, n, err);
    free(recs);
    return rc;
}

/* A layout of parts into dir: DCP parts by every rank, torch.save parts and the side file by rank 0. */
static int write_parts_into(sl_job *j, const char *dir, fsdp_err *err) {
    fsdp_err local;
    fsdp_err_clear(&local);
    int rc = comm_rank(j->c) == 0 ? st_mkdirs(dir, &local) : 0;
    if ((rc = agree(j->c, rc, &local, "creating the layout's directory", err))) return rc;
    for (size_t k = 0; k < j->L->n_parts && !rc; k++) {
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, j->L->parts[k]);
        if (!lay_part_is_file(j->L, k)) {
            rc = write_dcp(j, j->L->part_keys[k], sub, err);
            continue;
        }
        int lrc = 0;
        if (comm_rank(j->c) == 0) {
            if (!j->overwrite && access(sub, F_OK) == 0)
                lrc = fsdp_err_set(&local, FSDP_E_INVALID, "save-dcp: %s exists (set overwrite: true to replace it)", sub);
            else lrc = lay_part_write_file(j->L, j->v, k, sub, &local);
        }
        rc = from_root(j->c, lrc, &local, "writing the layout's torch.save files", err);
    }
    if (rc) return rc;
    int lrc = comm_rank(j->c) == 0 ? lay_side_write(j->L, j->canon, dir, &local) : 0;
    return from_root(j->c, lrc, &local, "writing the layout's side file", err);
}

/* A new directory of parts is staged as <dir>.partial and renamed once every part is written, so that a failure
 * leaves nothing at dir (the stage removed); an existing one (overwrite) has each part replaced. */
static int write_parts(sl_job *j, const char *dir, fsdp_err *err) {
    char stage[4400];
    int fresh = 0, rank = comm_rank(j->c);
    snprintf(stage, sizeof stage, "%s.partial", dir);
    if (rank == 0 && (fresh = access(dir, F_OK) != 0)) fio_remove_tree(stage); /* an interrupted save's */
    int rc = comm_bcast(j->c, &fresh, sizeof fresh, 0, err);
    if (!rc) rc = write_parts_into(j, fresh ? stage : dir, err);
    if (!fresh) return rc;
    fsdp_err local;
    fsdp_err_clear(&local);
    int lrc = 0;
    if (rank == 0 && !rc && rename(stage, dir) != 0)
        lrc = fsdp_err_set(&local, FSDP_E_IO, "save-dcp: cannot rename %s to %s: %s", stage, dir, strerror(errno));
    if (rank == 0 && (rc || lrc)) fio_remove_tree(stage);
    return rc ? rc : from_root(j->c, lrc, &local, "renaming the layout's directory", err);
}

/* `options: {NAME: VALUE}` as "NAME=VALUE" strings (malloc'd, *n of them). */
static int options_of(const fsdp_value *with, char **out, size_t *n, fsdp_err *err) {
    const fsdp_value *m = fsdp_value_get(with, "options");
    *n = 0;
    for (size_t k = 0; k < fsdp_value_size(m); k++) {
        const char *key = fsdp_value_key(m, k), *val = fsdp_value_text(fsdp_value_item(m, k));
        if (*n == SL_MAX_OPTS || !key || !val)
            return fsdp_err_at(err, FSDP_E_INVALID, m, "save-dcp: options: expected at most %d settings NAME: VALUE",
                               SL_MAX_OPTS);
        size_t len = strlen(key) + strlen(val) + 2;
        if (!(out[*n] = malloc(len))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        snprintf(out[(*n)++], len, "%s=%s", key, val);
    }
    return 0;
}

int stage_save_layout_check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *lv = fsdp_value_get(with, "layout"), *ov = fsdp_value_get(with, "options");
    const char *name = lv ? fsdp_value_text(lv) : NULL;
    if (!lv) return ov ? fsdp_err_at(err, FSDP_E_INVALID, ov, "save-dcp: options: are settings of a layout, and there "
                                                              "is no layout:") : 0;
    char names[512];
    const lay_layout *L = name ? lay_find(name) : NULL;
    int ds = lay_ds_stage_of(name);
    if (!L && !ds)
        return fsdp_err_at(err, FSDP_E_INVALID, lv, "save-dcp: layout: '%s' is none of %s, deepspeed-zero1|2|3",
                           name ? name : "?", lay_names(names, sizeof names));
    static const char *const alone[] = {"async", "prefix", "aliases", "fresh_optimizer", "files"};
    for (size_t k = 0; k < sizeof alone / sizeof *alone; k++) {
        const fsdp_value *v = fsdp_value_get(with, alone[k]);
        if (v && (strcmp(alone[k], "async") || fsdp_arg_bool(with, "async", 0)))
            return fsdp_err_at(err, FSDP_E_INVALID, v, "save-dcp: %s does not go with layout: (the layout names the keys "
                               "and files; a layout's save is synchronous)", alone[k]);
    }
    for (size_t k = 0; k < fsdp_value_size(ov); k++) {
        const char *key = fsdp_value_key(ov, k);
        int known = key && (ds ? !strcmp(key, "gradient_clipping") || (ds == 3 && !strcmp(key, "sub_group_size"))
                               : lay_option_known(L, key, strlen(key)));
        if (!known)
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(ov, k), "save-dcp: options: %s: layout %s keeps no "
                               "such setting in its checkpoint", key ? key : "?", name);
    }
    return 0;
}

/* The staged checkpoint in layout L (or DeepSpeed ZeRO stage ds) written at path. */
static int write_layout(sl_job *j, int ds, char **opts, size_t nopt, const char *path, fsdp_err *err) {
    const fsdp_state *s = state_get(j->ctx);
    lay_facts f = {s->hf.n_heads, s->hf.n_kv_heads, NULL, (const char *const *)opts, nopt};
    fsdp_err local;
    fsdp_err_clear(&local);
    if (ds) {
        lay_ds_wopts o = {ds, j->world, -1, 0, NULL, j->overwrite, NULL, NULL};
        int rc = lay_ds_wopts_options((const char *const *)opts, nopt, &o, &local);
        if ((rc = agree(j->c, rc, &local, "reading the DeepSpeed options", err))) return rc;
        if (comm_rank(j->c) == 0) rc = lay_ds_write(j->canon, &f, path, &o, &local);
        return from_root(j->c, rc, &local, "writing the DeepSpeed checkpoint", err);
    }
    int rc = lay_view(j->canon, 0, j->L, LAY_FROM_CANON, &f, &j->v, NULL, &local);
    if ((rc = agree(j->c, rc, &local, "seeing the checkpoint in the layout", err))) return rc;
    if (j->L->n_parts) return write_parts(j, path, err);
    j->side_dir = path;
    return write_dcp(j, "", path, err);
}

int stage_save_layout(fsdp_ctx *ctx, const fsdp_value *with, const char *staged, const char *path, fsdp_err *err) {
    const char *name = fsdp_arg_str(with, "layout", "");
    sl_job j = {ctx, stage_comm(ctx), lay_find(name), NULL, NULL, comm_size(stage_comm(ctx)),
                fsdp_arg_bool(with, "overwrite", 0), NULL};
    int64_t w = fsdp_arg_int(with, "world", 0);
    if (w > 0) j.world = (int)w;
    char *opts[SL_MAX_OPTS];
    size_t nopt = 0;
    fsdp_err local;
    fsdp_err_clear(&local);
    int rc = options_of(with, opts, &nopt, &local);
    if (!rc) rc = ckpt_open(staged, CKPT_DCP, &j.canon, &local);
    if (!(rc = agree(j.c, rc, &local, "opening the staged checkpoint", err)))
        rc = write_layout(&j, lay_ds_stage_of(name), opts, nopt, path, err);
    if (j.v) ckpt_close(j.v);
    if (j.canon) ckpt_close(j.canon);
    for (size_t k = 0; k < nopt; k++) free(opts[k]);
    fsdp_err e2; /* every rank done with the staging; rank 0 removes it before any rank returns (a failed stage ends
                    the job) */
    if (comm_barrier(j.c, &e2) == 0 && comm_rank(j.c) == 0) fio_remove_tree(staged);
    comm_barrier(j.c, &e2);
    if (!rc) fsdp_log(ctx, FSDP_LOG_INFO, "save-dcp: %s written in layout %s (%d rank%s)", path, name, j.world,
                      j.world == 1 ? "" : "s");
    return rc;
}
