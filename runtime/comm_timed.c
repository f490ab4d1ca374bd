/* A duplicated communicator and an exchange of small records with a deadline (runtime/comm.h): what
 * the plugin API's collectives agree on before any payload moves, so that a rank that never calls
 * ends the others' wait with a message rather than a hang. */
#include "runtime/comm.h"
#include "runtime/comm_impl.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMM_TIMED_TAG 7433

int comm_dup(comm *c, comm **out, fsdp_err *err) {
    *out = NULL;
    if (!c->is_mpi) {
        int rc = comm_create_single(out, err);
        if (!rc) (*out)->local_rank = c->local_rank, (*out)->node = c->node;
        return rc;
    }
    comm *d = calloc(1, sizeof *d);
    if (!d) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = MPI_Comm_dup(c->world, &d->world);
    if (rc != MPI_SUCCESS) {
        free(d);
        return fsdp_err_set(err, FSDP_E_COMM, "MPI_Comm_dup failed (code %d)", rc);
    }
    MPI_Comm_set_errhandler(d->world, MPI_ERRORS_RETURN);
    d->is_mpi = 1;
    d->rank = c->rank, d->size = c->size;
    d->local_rank = c->local_rank, d->local_size = c->local_size;
    d->node = c->node, d->nodes = c->nodes, d->spans_nodes = c->spans_nodes;
    *out = d;
    return 0;
}

const char *comm_broken(const comm *c) { return c && c->broken[0] ? c->broken : NULL; }

void comm_set_broken(comm *c, const char *why) {
    if (c && !c->broken[0]) snprintf(c->broken, sizeof c->broken, "%s", why && *why ? why : "failed");
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Polls the requests until every one completed or the deadline passed: 0, or 1 on a timeout. Each
 * completed request becomes MPI_REQUEST_NULL (MPI_Testsome), so a timeout tells which came. A short
 * sleep after the first millisecond keeps a waiting rank from spinning a core. */
static int poll_until(MPI_Request *req, int n, double t0, double timeout_s, int *mpi_rc) {
    int *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) {
        *mpi_rc = MPI_ERR_NO_MEM;
        return 0;
    }
    int late = 0;
    for (;;) {
        int outcount = 0;
        *mpi_rc = MPI_Testsome(n, req, &outcount, idx, MPI_STATUSES_IGNORE);
        if (*mpi_rc != MPI_SUCCESS || outcount == MPI_UNDEFINED) break;
        double now = mono_now();
        if (now - t0 >= timeout_s) {
            late = 1;
            break;
        }
        if (!outcount && now - t0 > 1e-3) {
            struct timespec d = {0, now - t0 > 0.1 ? 2000000L : 50000L};
            nanosleep(&d, NULL);
        }
    }
    free(idx);
    return late;
}

/* After a timeout: the receives that did not come are cancelled; the sends are left to MPI (their
 * buffers stay with c until it is destroyed). */
static void abandon(comm *c, MPI_Request *req, int n, void *bufs) {
    for (int i = 0; i < n; i++) {
        if (req[i] == MPI_REQUEST_NULL) continue;
        if (i < c->size) MPI_Cancel(&req[i]);
        MPI_Request_free(&req[i]);
    }
    free(c->stale);
    c->stale = bufs;
}

uint64_t comm_exchange_count(const comm *c) { return c->exchanges; }

int comm_exchange_timed(comm *c, const void *mine, size_t n, void *all, double timeout_s, unsigned char *arrived,
                        fsdp_err *err) {
    uint64_t seq = c->exchanges++;
    memset(arrived, 0, (size_t)c->size);
    arrived[c->rank] = 1;
    if (c->broken[0]) return fsdp_err_set(err, FSDP_E_COMM, "an earlier exchange failed: %s", c->broken);
    memcpy((char *)all + (size_t)c->rank * n, mine, n);
    comm_count(c, COMM_K_OTHER, (uint64_t)n * (uint64_t)c->size);
    if (!c->is_mpi || c->size == 1) return 0;
    /* receives land in a buffer of our own, so that one abandoned after a timeout never writes into
     * the caller's; requests 0..size-1 receive, size..2*size-1 send (this rank's own slots unused) */
    size_t sz = (size_t)c->size;
    char *buf = malloc(sz * n + n + 2 * sz * sizeof(MPI_Request));
    if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    char *out = buf + n;
    MPI_Request *req = (MPI_Request *)(void *)(out + sz * n);
    memcpy(buf, mine, n);
    int rc = MPI_SUCCESS;
    for (int r = 0; r < c->size; r++) {
        req[r] = req[sz + (size_t)r] = MPI_REQUEST_NULL;
        if (r == c->rank || rc != MPI_SUCCESS) continue;
        rc = MPI_Irecv(out + (size_t)r * n, (int)n, MPI_BYTE, r, COMM_TIMED_TAG, c->world, &req[r]);
        if (rc == MPI_SUCCESS) rc = MPI_Isend(buf, (int)n, MPI_BYTE, r, COMM_TIMED_TAG, c->world, &req[sz + (size_t)r]);
    }
    double t0 = mono_now();
    int late = rc == MPI_SUCCESS ? poll_until(req, 2 * c->size, t0, timeout_s, &rc) : 0;
    if (rc != MPI_SUCCESS || late) {
        for (int r = 0; r < c->size; r++) arrived[r] = r == c->rank || req[r] == MPI_REQUEST_NULL;
        abandon(c, req, 2 * c->size, buf);
        if (rc != MPI_SUCCESS) {
            comm_set_broken(c, "a message failed");
            return fsdp_err_set(err, FSDP_E_COMM, "exchange %llu: MPI failed (code %d)", (unsigned long long)seq, rc);
        }
        char why[96];
        snprintf(why, sizeof why, "exchange %llu timed out after %.3g s", (unsigned long long)seq, mono_now() - t0);
        comm_set_broken(c, why);
        return fsdp_err_set(err, FSDP_E_COMM, "%s", why);
    }
    for (int r = 0; r < c->size; r++)
        if (r != c->rank) memcpy((char *)all + (size_t)r * n, out + (size_t)r * n, n);
    free(buf);
    return 0;
}
