/* The commit of a checkpoint written by several ranks (ckpt/dcp_rank_commit.c): save-dcp's and
 * reshard-dcp's last step. */
#ifndef FSDP_CKPT_DCP_RANK_COMMIT_H
#define FSDP_CKPT_DCP_RANK_COMMIT_H

#include "ckpt/dcp.h"
#include "runtime/comm.h"

typedef struct dcp_rank_commit {
    const char *dir;   /* the checkpoint directory */
    dcp_gen gen;       /* the generation and identity of the data files just written */
    int world;         /* the checkpoint's rank files (old generations are removed against it) */
    int lo, hi;        /* this rank wrote the rank files [lo, hi) */
    const char *who;   /* "save-dcp": the start of messages */
    const char *crash; /* "save": crash points <crash>.gathered, .committed, .cleaned */
    /* Rank 0, once every rank's data file is written and before `.metadata` is (NULL: nothing): e.g.
     * the files beside it (ckpt/dcp_side.h). A failure is the commit's: no `.metadata` written. */
    int (*before_meta)(void *user, fsdp_err *err);
    void *user;
} dcp_rank_commit;

/* Every rank calls it with its own outcome (local_rc, local_err) and records. When any rank
 * failed, no .metadata is written, each rank that succeeded removes its files, and every rank
 * returns an error (its own, or one naming the rank that failed). Otherwise the records are
 * gathered, rank 0 writes .metadata (the commit) and removes the replaced generation, and every
 * rank returns once the .metadata is durable, or with the error that it could not be written. */
int dcp_rank_commit_run(comm *c, const dcp_rank_commit *k, int local_rc, const fsdp_err *local_err,
                        const dcp_record *recs, size_t n, fsdp_err *err);

#endif
