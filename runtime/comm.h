/* Communicator: one interface over the `single` (world of 1) and `mpi` (host buffers)
 * backends; `nccl` (device buffers) is in runtime/comm_nccl.c when CUDA is built.
 * Nothing here re-implements a collective: MPI does the work. */
#ifndef FSDP_RUNTIME_COMM_H
#define FSDP_RUNTIME_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

typedef struct comm comm;

typedef enum comm_dtype { COMM_F32 = 0, COMM_F64, COMM_I64, COMM_U8 } comm_dtype;
typedef enum comm_op { COMM_SUM = 0, COMM_MAX, COMM_MIN } comm_op;

/* Detects the launcher: under mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK,
 * SLURM_NTASKS with PMI) initialises MPI; otherwise a world of 1 without MPI. */
int comm_create(comm **out, fsdp_err *err);
int comm_create_single(comm **out, fsdp_err *err);
/* True when this process was started by an MPI launcher. */
int comm_launched_by_mpi(void);
void comm_destroy(comm *c);

int comm_rank(const comm *c);
int comm_size(const comm *c);
int comm_local_rank(const comm *c); /* rank among the processes of this node */
const char *comm_backend(const comm *c); /* "single" or "mpi" */

int comm_barrier(comm *c, fsdp_err *err);
int comm_bcast(comm *c, void *buf, size_t bytes, int root, fsdp_err *err);
/* In-place all-reduce of count elements. */
int comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, fsdp_err *err);
/* All-gather of variable-size byte blocks: rank r contributes send (recv_bytes[r] bytes);
 * recv receives all blocks concatenated in rank order. */
int comm_allgatherv(comm *c, const void *send, void *recv, const size_t *recv_bytes, fsdp_err *err);
/* Reduce-scatter (sum) of float32: send holds the whole vector (sum of counts elements, in
 * rank order); rank r receives its counts[r] summed elements in recv. */
int comm_reduce_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, fsdp_err *err);
/* Scatter of float32 from root: send (significant on root) holds sum(counts) elements in
 * rank order; rank r receives counts[r] elements in recv. */
int comm_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, int root, fsdp_err *err);
/* Gather variable-size bytes to root: on root *out is malloc'd (concatenation in rank order)
 * and *sizes (malloc'd, one per rank) gives each block's length. */
int comm_gather_bytes(comm *c, const void *send, size_t n, int root, void **out, size_t **sizes, fsdp_err *err);
/* Agreement on failure: every rank passes its local status (0 ok); returns the first
 * failing rank's status on every rank (and that rank's index in *who), 0 if none failed. */
int comm_agree(comm *c, int status, int *who, fsdp_err *err);
/* Ends the whole job now (MPI_Abort under MPI); used when one rank fails alone. */
void comm_abort(comm *c, int code);

#endif
