/* Which node each rank is on, and sub-communicators (see comm.h): nodes come from MPI's
 * shared-memory split (or FSDP_FAKE_NODES, for tests on one machine); sub-communicators from
 * MPI_Comm_split. */
#include "runtime/comm.h"
#include "runtime/comm_impl.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int mpi_fail(fsdp_err *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fsdp_err_set(err, FSDP_E_COMM, "%s failed: %.*s", what, len, msg);
}

/* FSDP_FAKE_NODES as a number of nodes: 0 when unset, -1 when not a positive integer. */
static long fake_nodes(void) {
    const char *v = getenv("FSDP_FAKE_NODES");
    if (!v || !*v) return 0;
    char *end = NULL;
    errno = 0;
    long k = strtol(v, &end, 10);
    return errno || *end || k < 1 || k > INT_MAX ? -1 : k;
}

/* Every rank of c's value `mine` all-gathered: *distinct, how many different values there are, and
 * *below, how many of those are lower than mine (so values number from 0 in their order). */
static int count_distinct(comm *c, int mine, int *distinct, int *below, fsdp_err *err) {
    int *v = malloc((size_t)c->size * sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = MPI_Allgather(&mine, 1, MPI_INT, v, 1, MPI_INT, c->world);
    if (rc != MPI_SUCCESS) {
        free(v);
        return mpi_fail(err, rc, "MPI_Allgather (nodes)");
    }
    *distinct = *below = 0;
    for (int r = 0; r < c->size; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++) first = v[q] != v[r];
        *distinct += first;
        *below += first && v[r] < mine;
    }
    free(v);
    return 0;
}

/* nodes and this rank's node from every rank's node key (the lowest world rank of its node): nodes are
 * numbered in the order of their keys. */
static int number_nodes(comm *c, int key, fsdp_err *err) {
    int rc = count_distinct(c, key, &c->nodes, &c->node, err);
    c->spans_nodes = c->nodes > 1;
    return rc;
}

int comm_find_nodes(comm *c, fsdp_err *err) {
    long fake = fake_nodes();
    if (fake < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "FSDP_FAKE_NODES=\"%s\" is not a positive number of nodes",
                            getenv("FSDP_FAKE_NODES"));
    if (fake > 0 && c->size % fake)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "FSDP_FAKE_NODES=%ld does not divide the %d ranks into nodes of equal size", fake, c->size);
    /* the real node: its local rank chooses the GPU, fake nodes or not */
    MPI_Comm local;
    int rc = MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Comm_split_type (ranks of this node)");
    MPI_Comm_rank(local, &c->local_rank);
    MPI_Comm_size(local, &c->local_size);
    int key = c->rank;
    rc = MPI_Allreduce(MPI_IN_PLACE, &key, 1, MPI_INT, MPI_MIN, local);
    MPI_Comm_free(&local);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Allreduce (ranks of this node)");
    if (fake > 0) {
        c->local_size = c->size / (int)fake;
        key = c->rank - c->rank % c->local_size;
    }
    return number_nodes(c, key, err);
}

void comm_host_name(const comm *c, char *buf, size_t size) {
    char host[256];
    if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    if (fake_nodes() > 0) snprintf(buf, size, "%s/fake-node-%d", host, c ? c->node : 0);
    else snprintf(buf, size, "%s", host);
}

int comm_split(comm *c, int color, int key, comm **out, fsdp_err *err) {
    *out = NULL;
    if (!c->is_mpi) return comm_create_single(out, err);
    comm *s = calloc(1, sizeof *s);
    if (!s) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = MPI_Comm_split(c->world, color, key, &s->world);
    if (rc != MPI_SUCCESS) {
        free(s);
        return mpi_fail(err, rc, "MPI_Comm_split");
    }
    s->is_mpi = 1;
    MPI_Comm_set_errhandler(s->world, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->world, &s->rank);
    MPI_Comm_size(s->world, &s->size);
    s->local_rank = c->local_rank;
    s->local_size = c->local_size;
    /* the parent's node numbers, counted over the sub-communicator's ranks */
    s->node = c->node;
    int below;
    rc = count_distinct(s, c->node, &s->nodes, &below, err);
    if (rc) {
        comm_destroy(s);
        return rc;
    }
    s->spans_nodes = s->nodes > 1;
    *out = s;
    return 0;
}
