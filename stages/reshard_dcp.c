/* Stage `reshard-dcp`: a checkpoint (a DCP directory saved by any number of ranks, safetensors, .pt)
 * rewritten as the DCP checkpoint `world` ranks' save-dcp writes (ckpt/ckpt_reshard.h: each tensor's
 * Shard(0) rows per rank, the same bytes and .metadata), streamed from file to file through a small
 * ring: no model state is built, and memory stays a few MiB whatever the tensors' size. On a run of
 * several ranks each writes its share of the data files in parallel (rank r of R the files of ranks
 * [r*world/R, (r+1)*world/R)) and rank 0 writes `.metadata` last from every rank's records, so the
 * destination holds the old checkpoint or the new one at every instant (ckpt/dcp_commit.c); a rank
 * that writes every row of a source record checks its CRC-32 (a one-process reshard checks all).
 *
 * with: src (required), dst (required), world (0: the ranks of this run), dtype (auto|f32|bf16),
 *       overwrite (bool, false) */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_agree.h"
#include "ckpt/ckpt_reshard.h"
#include "ckpt/dcp_rank_commit.h"
#include "ckpt/ckpt_stale.h"
#include "runtime/crash.h"
#include "stages/stages.h"

static const char *const DTYPES[] = {"auto", "f32", "bf16", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"src", FSDP_T_STRING, 1, NULL, NULL, "checkpoint to reshard (DCP of any number of ranks, safetensors, .pt)"},
    {"dst", FSDP_T_STRING, 1, NULL, NULL, "DCP directory written"},
    {"world", FSDP_T_INT, 0, "0", NULL, "ranks of the checkpoint written (0: the ranks of this run)"},
    {"dtype", FSDP_T_STRING, 0, "auto", DTYPES, "dtype of the tensors written (auto: each one's own)"},
    {"overwrite", FSDP_T_BOOL, 0, "false", NULL, "replace an existing checkpoint at dst"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const PROVIDES[] = {"checkpoint", NULL};

static int rsd_check(const fsdp_value *with, fsdp_err *err) {
    int64_t w = fsdp_arg_int(with, "world", 0);
    if (w < 0 || w > 65536)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "world"),
                           "reshard-dcp: world is %lld, expected 0 (the ranks of the run) or a number of ranks up to 65536",
                           (long long)w);
    const char *src = fsdp_arg_str(with, "src", ""), *dst = fsdp_arg_str(with, "dst", "");
    if (!strcmp(src, dst))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "dst"),
                           "reshard-dcp: dst is src (%s): write the resharded checkpoint to another directory", dst);
    return 0;
}

/* A tensor the stream cannot take, read whole (its rows as dt). */
static int read_whole(void *user, size_t i, fsdp_dtype dt, void **buf, fsdp_err *err) {
    ckpt_reader *r = user;
    const ckpt_entry *e = ckpt_entry_at(r, i);
    int64_t n = fsdp_numel(e->ndim, e->shape);
    size_t bytes;
    if (n < 0 || __builtin_mul_overflow((size_t)(n ? n : 1), fsdp_dtype_size(dt), &bytes))
        return fsdp_err_set(err, FSDP_E_FORMAT, "corrupt: tensor %s: its size overflows", e->name);
    *buf = malloc(bytes);
    if (!*buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (%zu bytes for tensor %s)", bytes, e->name);
    int rc = ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, *buf, dt, err);
    if (rc) free(*buf), *buf = NULL;
    return rc;
}

static int can_stream(void *user, size_t i) {
    (void)user, (void)i;
    return cks_enabled();
}

/* Rank 0 prepares dst (refuses a checkpoint unless overwrite, removes stale temporaries, picks the
 * generation); every rank learns the verdict and the generation. */
static int prepare(fsdp_ctx *ctx, comm *c, const char *dst, int overwrite, dcp_gen *gen, fsdp_err *err) {
    int rc = 0, who;
    memset(gen, 0, sizeof *gen);
    if (comm_rank(c) == 0) {
        stage_sweep_stale(ctx, dst);
        rc = dcp_prepare_dir(dst, overwrite, "reshard-dcp", "set overwrite: true to replace it", gen, NULL, NULL, err);
    }
    fsdp_err e2;
    int st = comm_agree(c, rc, &who, &e2);
    if (st && !rc) return fsdp_err_set(err, st, "reshard-dcp: rank %d could not prepare %s", who, dst);
    if (rc) return rc;
    return comm_bcast(c, gen, sizeof *gen, 0, err);
}

/* This rank's data files [lo, hi) of generation gen; their records (rank order) into *recs / *nrec. */
static int write_files(ckpt_reader *r, const char *dst, const dcp_gen *gen, int world, int lo, int hi, fsdp_dtype dt,
                       dcp_record **out, size_t *nout, fsdp_err *err) {
    size_t n = ckpt_count(r), per = n + 2, k = (size_t)(hi - lo);
    ckrs_entry *e = calloc(n ? n : 1, sizeof *e);
    dcp_file_writer *fw = calloc(k ? k : 1, sizeof *fw);
    dcp_record *recs = calloc(per * (k ? k : 1), sizeof *recs), **rr = calloc(k ? k : 1, sizeof *rr);
    size_t *nrec = calloc(k ? k : 1, sizeof *nrec);
    int rc = e && fw && recs && rr && nrec ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_entry *x = ckpt_entry_at(r, i);
        e[i].i = i, e[i].name = x->name, e[i].dt = x->is_tensor && dt ? dt : x->dtype;
    }
    size_t opened = 0;
    for (; !rc && opened < k; opened++) {
        rr[opened] = recs + opened * per;
        if ((rc = dcp_file_open_gen(&fw[opened], dst, lo + (int)opened, gen, NULL, NULL, err))) break;
    }
    ckrs_src s = {r, e, n, world, 1, 1, can_stream, read_whole, r, {0, 0, 0, 0, 0}, NULL};
    cks_opts_default(&s.o);
    cks_files fc = {0};
    if (!rc) rc = ckrs_write_ranks(&s, lo, hi, fw, &fc, rr, nrec, err);
    cks_files_free(&fc);
    for (size_t j = 0; j < opened; j++) {
        if (!rc) rc = dcp_file_close(&fw[j], err);
        else if (fw[j].f) dcp_file_abort(&fw[j]);
    }
    *nout = 0;
    for (size_t j = 0; !rc && j < k; j++) {
        memmove(recs + *nout, rr[j], nrec[j] * sizeof *recs);
        *nout += nrec[j];
    }
    free(e);
    free(fw);
    free(rr);
    free(nrec);
    if (rc) free(recs), recs = NULL;
    *out = recs;
    return rc;
}

/* Every rank's records to rank 0, which writes .metadata and removes the replaced checkpoint's
 * files; on any rank's failure no .metadata is written and every rank removes the files it wrote. */
static int commit(comm *c, const char *dst, const dcp_gen *gen, int world, int lo, int hi, int local_rc, fsdp_err *local_err,
                  const dcp_record *recs, size_t n, fsdp_err *err) {
    dcp_rank_commit k = {dst, *gen, world, lo, hi, "reshard-dcp", "reshard", NULL, NULL};
    return dcp_rank_commit_run(c, &k, local_rc, local_err, recs, n, err);
}

static int rsd_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    comm *c = stage_comm(ctx);
    int rank = comm_rank(c), size = comm_size(c);
    const char *src = fsdp_arg_str(with, "src", ""), *dst = fsdp_arg_str(with, "dst", "");
    const char *dts = fsdp_arg_str(with, "dtype", "auto");
    int world = (int)fsdp_arg_int(with, "world", 0);
    if (world <= 0) world = size;
    fsdp_dtype dt = strcmp(dts, "auto") ? fsdp_dtype_from_name(dts) : FSDP_DT_INVALID;
    dcp_gen gen;
    double t0 = stage_now();
    int rc = prepare(ctx, c, dst, fsdp_arg_bool(with, "overwrite", 0), &gen, err);
    if (rc) return rc;
    int lo = (int)((int64_t)rank * world / size), hi = (int)((int64_t)(rank + 1) * world / size);
    ckpt_reader *r = NULL;
    dcp_record *recs = NULL;
    size_t n = 0;
    fsdp_err lerr;
    fsdp_err_clear(&lerr);
    char at[4400];
    snprintf(at, sizeof at, "%s", src);
    int restarts = 0;
    int lrc = ckpt_open_agreed(c, CKPT_AUTO, NULL, NULL, at, sizeof at, &r, &restarts, &lerr);
    if (restarts)
        fsdp_log(ctx, FSDP_LOG_WARN, "reshard-dcp: %s changed while it was being opened (a save replaced it); read the "
                 "new save (%d restart%s)", src, restarts, restarts == 1 ? "" : "s");
    if (lrc) fsdp_err_prefix(&lerr, "reshard-dcp: src");
    if (!lrc) lrc = write_files(r, dst, &gen, world, lo, hi, dt, &recs, &n, &lerr);
    if (lrc && !strstr(lerr.msg, "reshard-dcp")) fsdp_err_prefix(&lerr, "reshard-dcp: %s -> %s", src, dst);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (recs[i].is_tensor) bytes += (uint64_t)fsdp_numel(recs[i].ndim, recs[i].sizes) * fsdp_dtype_size(recs[i].dtype);
    ckpt_close(r);
    rc = commit(c, dst, &gen, world, lo, hi, lrc, &lerr, recs, n, err);
    free(recs);
    if (!rc) {
        fsdp_ctx_metric(ctx, "bytes_written", (double)bytes);
        fsdp_log(ctx, FSDP_LOG_INFO, "resharded %s into %s: %d rank file(s) of %d written here (%.1f MB, %.2fs)", src,
                 dst, hi - lo, world, (double)bytes / 1e6, stage_now() - t0);
    }
    return rc;
}

const fsdp_stage_desc stage_reshard_dcp = {
    FSDP_STAGE_DESC_INIT,
    "reshard-dcp",
    "rewrite a checkpoint as `world` ranks' DCP save, file to file (streamed, no model state)",
    PARAMS,
    NULL,
    PROVIDES,
    rsd_run,
    rsd_check,
};
