/* Every rank reading one save (see ckpt_agree.h). */
#include "ckpt/ckpt_agree.h"

#include <stdint.h>
#include <string.h>

/* every rank: the largest of the ranks' v[0..n) */
static int max_all(comm *c, int64_t *v, size_t n, fsdp_err *err) { return comm_allreduce(c, v, n, COMM_I64, COMM_MAX, err); }

/* One try: this rank's open (*r, or *lrc / *lerr); *verdict: 0 all opened one save, 1 some rank failed,
 * 2 they opened different saves; *changed: the checkpoint is another now than rank 0's (rank 0 decides). */
static int try_open(comm *c, ckpt_format fmt, const char *path, int resolved, ckpt_reader **r, int *lrc,
                    fsdp_err *lerr, int *verdict, int *changed, int *restarts, fsdp_err *err) {
    *r = NULL;
    *lrc = ckpt_open(path, fmt, r, lerr);
    uint64_t mine = *lrc ? 0 : ckpt_identity(*r), first = mine;
    int rc = comm_bcast(c, &first, sizeof first, 0, err);
    if (rc) return rc;
    int64_t v[3] = {*lrc != 0, !*lrc && mine != first, *r ? ckpt_restarts(*r) : 0};
    if ((rc = max_all(c, v, 3, err))) return rc;
    *verdict = v[1] ? 2 : v[0] ? 1 : 0;
    *restarts += (int)v[2];
    int64_t ch = *verdict == 2;
    if (*verdict == 1 && comm_rank(c) == 0) ch = resolved || ckpt_identity_at(path) != first;
    if ((rc = comm_bcast(c, &ch, sizeof ch, 0, err))) return rc;
    *changed = ch != 0;
    return 0;
}

/* the verdict of a last try as every rank's error */
static int give_up(comm *c, const char *path, int verdict, int lrc, const fsdp_err *lerr, fsdp_err *err) {
    if (verdict == 2)
        return fsdp_err_set(err, FSDP_E_IO,
                            "checkpoint %s was overwritten while the ranks were opening it, %d times in a row (the "
                            "ranks read different saves): load it again once the save into it is done",
                            path, CKPT_AGREE_TRIES);
    int who = -1;
    fsdp_err e2;
    int agreed = comm_agree(c, lrc, &who, &e2);
    if (lrc) {
        *err = *lerr;
        return lrc;
    }
    return fsdp_err_set(err, agreed ? agreed : FSDP_E_COMM, "rank %d could not open the checkpoint %s", who, path);
}

int ckpt_open_agreed(comm *c, ckpt_format fmt, ckpt_resolve_fn resolve, void *user, char *path, size_t cap,
                     ckpt_reader **out, int *restarts, fsdp_err *err) {
    *out = NULL;
    *restarts = 0;
    for (int attempt = 0;; attempt++) {
        int rc = resolve ? resolve(user, path, cap, err) : 0;
        if (rc) return rc;
        ckpt_reader *r;
        int lrc, verdict, changed;
        fsdp_err lerr;
        fsdp_err_clear(&lerr);
        if ((rc = try_open(c, fmt, path, resolve != NULL, &r, &lrc, &lerr, &verdict, &changed, restarts, err))) {
            ckpt_close(r);
            return rc;
        }
        if (!verdict) {
            *out = r;
            return 0;
        }
        ckpt_close(r);
        if (!changed || attempt + 1 == CKPT_AGREE_TRIES) return give_up(c, path, verdict, lrc, &lerr, err);
        (*restarts)++;
    }
}
