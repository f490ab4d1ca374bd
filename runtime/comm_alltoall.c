/* All-to-all with per-rank sizes (runtime/comm.h): MPI_Alltoallv in bytes, a copy on one process. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/comm_impl.h"

int comm_alltoallv(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                   fsdp_err *err) {
    comm_count(c, COMM_K_OTHER, comm_sum_sizes(send_bytes, c->size, 1));
    if (!c->is_mpi) {
        if (send_bytes[0] != recv_bytes[0])
            return fsdp_err_set(err, FSDP_E_INVALID, "all-to-all: %zu bytes sent to itself, %zu expected",
                                send_bytes[0], recv_bytes[0]);
        if (recv != send && send_bytes[0]) memmove(recv, send, send_bytes[0]);
        return 0;
    }
    const size_t n = (size_t)c->size;
    int *v = malloc(4 * n * sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (all-to-all of %zu ranks)", n);
    int *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    size_t so = 0, ro = 0;
    for (size_t r = 0; r < n; r++) {
        sc[r] = (int)send_bytes[r];
        rc[r] = (int)recv_bytes[r];
        sd[r] = (int)so;
        rd[r] = (int)ro;
        so += send_bytes[r];
        ro += recv_bytes[r];
        if (so > INT_MAX || ro > INT_MAX) {
            free(v);
            return fsdp_err_set(err, FSDP_E_INVALID, "all-to-all: more than %d bytes in one call", INT_MAX);
        }
    }
    int e = MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, c->world);
    free(v);
    if (e != MPI_SUCCESS) return fsdp_err_set(err, FSDP_E_COMM, "MPI_Alltoallv failed (error %d)", e);
    return 0;
}
