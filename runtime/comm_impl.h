/* The communicator's representation, shared by runtime/comm.c (single, MPI) and
 * runtime/comm_nccl.c (device collectives). Not part of the public interface. */
#ifndef FSDP_RUNTIME_COMM_IMPL_H
#define FSDP_RUNTIME_COMM_IMPL_H

#include <mpi.h>

#include "runtime/comm.h"

struct comm {
    int is_mpi;
    int rank, size, local_rank;
    MPI_Comm world;
    int owns_mpi; /* we called MPI_Init */
    void *nccl;   /* ncclComm_t once comm_dev_init succeeded, else NULL */
    int nccl_device; /* CUDA ordinal the NCCL communicator was created on */
    struct nccl_api *napi; /* NCCL's functions (runtime/nccl_api.h), loaded by the first comm_dev_init */
    uint64_t calls[COMM_KINDS]; /* comm_calls: calls of each kind so far */
};

/* Counts one call of kind k (comm_calls). */
static inline void comm_count(comm *c, comm_kind k) { c->calls[k]++; }

/* Destroys the NCCL communicator, if any (comm_destroy calls it). */
void comm_dev_release(comm *c);

#endif
