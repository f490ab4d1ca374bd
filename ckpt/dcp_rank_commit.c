/* The commit of a checkpoint written by several ranks (see dcp_rank_commit.h). */
#include "ckpt/dcp_rank_commit.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/crash.h"

static void at(const dcp_rank_commit *k, const char *what, int rank) {
    char point[96];
    snprintf(point, sizeof point, "%s.%s", k->crash, what);
    crash_point(point, 1, rank);
}

/* some rank failed: no .metadata will name this write's data files, so each rank that completed
 * removes its own (the generation is this write's, or the directory holds no checkpoint) */
static int abandon(comm *c, const dcp_rank_commit *k, int agreed, int who, int local_rc, const fsdp_err *local_err,
                   fsdp_err *err) {
    for (int r = k->lo; r < k->hi && !local_rc; r++) {
        char name[64], p[4200];
        dcp_data_file_name(name, sizeof name, r, k->gen.num);
        snprintf(p, sizeof p, "%s/%s", k->dir, name);
        unlink(p);
    }
    fsdp_err e2;
    comm_barrier(c, &e2); /* before any rank returns (a failed rank may end the job at once) */
    if (local_rc) {
        if (err != local_err) *err = *local_err;
        return local_rc;
    }
    return fsdp_err_set(err, agreed, "%s: rank %d failed writing its part of %s; no .metadata written", k->who, who,
                        k->dir);
}

/* rank 0: every rank's records into .metadata, then the replaced generation's files removed; the gathered bytes
 * (*all) are freed once read, before .metadata is built */
static int write_metadata(const dcp_rank_commit *k, void **all, const size_t *sizes, int world, int rank,
                          fsdp_err *err) {
    size_t total = 0, nall;
    for (int r = 0; r < world; r++) total += sizes[r];
    dcp_record *allr = NULL;
    int rc = dcp_records_unpack(*all, total, &allr, &nall, err);
    free(*all);
    *all = NULL;
    if (!rc) {
        at(k, "gathered", rank);
        if (k->before_meta) rc = k->before_meta(k->user, err);
        if (!rc) rc = dcp_write_metadata_gen(k->dir, allr, nall, &k->gen, err);
        if (!rc) { /* the new checkpoint is in place and durable: the replaced one's files go */
            at(k, "committed", rank);
            dcp_remove_old_generations(k->dir, k->gen.num, k->world, allr, nall, NULL, NULL);
            at(k, "cleaned", rank);
        }
    }
    free(allr);
    return rc;
}

int dcp_rank_commit_run(comm *c, const dcp_rank_commit *k, int local_rc, const fsdp_err *local_err,
                        const dcp_record *recs, size_t n, fsdp_err *err) {
    int rank = comm_rank(c), who = -1;
    fsdp_err e2;
    fsdp_err_clear(&e2);
    int agreed = comm_agree(c, local_rc, &who, &e2);
    if (agreed) return abandon(c, k, agreed, who, local_rc, local_err, err);
    void *packed = NULL, *all = NULL;
    size_t plen = 0, *sizes = NULL;
    int rc = dcp_records_pack(recs, n, &packed, &plen, err);
    /* a rank that could not pack its records (out of memory) must not leave the others waiting in the gather */
    int prc = comm_agree(c, rc, &who, &e2);
    if (prc) {
        free(packed);
        return abandon(c, k, prc, who, rc, err, err);
    }
    rc = comm_gather_bytes(c, packed, plen, 0, &all, &sizes, err);
    free(packed);
    int mrc = 0;
    fsdp_err merr;
    fsdp_err_clear(&merr);
    if (!rc && rank == 0) mrc = write_metadata(k, &all, sizes, comm_size(c), rank, &merr);
    free(all);
    free(sizes);
    if (rc) return rc;
    /* all ranks return only once .metadata is durable (or know it failed) */
    int st = comm_agree(c, mrc, &who, &e2);
    if (st) {
        if (rank == 0) *err = merr;
        else fsdp_err_set(err, st, "%s: rank 0 could not write %s/.metadata", k->who, k->dir);
        return st;
    }
    return 0;
}
