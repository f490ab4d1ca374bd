/* The communicator's representation, shared by runtime/comm.c (single, MPI) and
 * runtime/comm_nccl.c (device collectives). Not part of the public interface. */
#ifndef FSDP_RUNTIME_COMM_IMPL_H
#define FSDP_RUNTIME_COMM_IMPL_H

#include <mpi.h>

#include "runtime/comm.h"

struct comm {
    int is_mpi;
    int rank, size, local_rank;
    int local_size, node, nodes; /* ranks of this node, this node's index, nodes of the communicator */
    int spans_nodes;             /* 1 when the ranks are on more than one node */
    MPI_Comm world;
    int owns_mpi; /* we called MPI_Init */
    void *nccl;   /* ncclComm_t once comm_dev_init succeeded, else NULL */
    int nccl_device; /* CUDA ordinal the NCCL communicator was created on */
    struct nccl_api *napi; /* NCCL's functions (runtime/nccl_api.h), loaded by the first comm_dev_init */
    uint64_t calls[COMM_KINDS]; /* comm_calls: calls of each kind so far */
    uint64_t bytes[COMM_KINDS]; /* comm_bytes: payload bytes of those calls */
    uint64_t exchanges;         /* comm_exchange_timed calls so far (the next one's sequence number) */
    char broken[160];           /* why an exchange timed out ("" while none did) */
    void *stale;                /* that exchange's buffers, which its messages may still reach */
};

/* Counts one call of kind k moving `bytes` of payload (comm_calls, comm_bytes). */
static inline void comm_count(comm *c, comm_kind k, uint64_t bytes) {
    c->calls[k]++;
    c->bytes[k] += bytes;
}

/* The sum of v[0..n) times unit (the payload of a collective with per-rank sizes). */
static inline uint64_t comm_sum_sizes(const size_t *v, int n, size_t unit) {
    uint64_t t = 0;
    for (int i = 0; i < n; i++) t += (uint64_t)v[i] * unit;
    return t;
}

/* Fills c's local_rank, local_size, node, nodes and spans_nodes (runtime/comm_nodes.c): from MPI's
 * shared-memory split, or from FSDP_FAKE_NODES. Collective over c->world. */
int comm_find_nodes(comm *c, fsdp_err *err);

/* Destroys the NCCL communicator, if any (comm_destroy calls it). */
void comm_dev_release(comm *c);

#endif
