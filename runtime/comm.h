/* Communicator: one interface over the `single` (world of 1) and `mpi` (host buffers)
 * backends, plus device collectives (comm_dev_*: `nccl`, device buffers) in
 * runtime/comm_nccl.c. Nothing here re-implements a collective: MPI and NCCL do the work. */
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
/* Rank among the processes of this (real) node: it chooses the GPU, fake nodes or not. */
int comm_local_rank(const comm *c);
int comm_local_size(const comm *c); /* processes of this node (of a fake node under FSDP_FAKE_NODES) */
/* Nodes: the ranks that share memory (MPI_Comm_split_type MPI_COMM_TYPE_SHARED), never a guess from
 * a launcher's variables. FSDP_FAKE_NODES=K (set by `--fake-nodes K`) splits the ranks instead into K
 * nodes of consecutive ranks, to test multi-node layouts on one machine (K must divide the world).
 * comm_node: this rank's node, numbered in the order of the nodes' lowest ranks; comm_nodes: how many
 * nodes c's ranks are on; comm_spans_nodes: 1 when that is more than one. */
int comm_node(const comm *c);
int comm_nodes(const comm *c);
int comm_spans_nodes(const comm *c);
/* This node's host name ("host/fake-node-K" under FSDP_FAKE_NODES). */
void comm_host_name(const comm *c, char *buf, size_t size);
/* Sub-communicator (collective over c): the ranks of c with the same color, ordered by key
 * (MPI_Comm_split; a world of 1 gives a world of 1). It keeps this rank's node facts; its own
 * collectives (and comm_dev_init's NCCL communicator) involve only its ranks. Free with
 * comm_destroy before c. */
int comm_split(comm *c, int color, int key, comm **out, fsdp_err *err);
const char *comm_backend(const comm *c); /* "single" or "mpi" (host collectives) */
/* A communicator of c's ranks, in c's order, whose messages never meet c's (MPI_Comm_dup): the plugin
 * API's collectives run on one, so that a plugin's call is never matched with the trainer's own.
 * Collective over c. Free with comm_destroy before c. */
int comm_dup(comm *c, comm **out, fsdp_err *err);
/* Every rank's `n`-byte record to every rank, with a deadline (runtime/comm_timed.c): all receives
 * size * n bytes, rank by rank. Point-to-point messages are polled until every rank's record came or
 * timeout_s passed. Returns 0 when all came; on a timeout FSDP_E_COMM, with arrived[r] = 1 for each
 * rank whose record came (this rank's included), and c is broken:
 * every later exchange on it fails at once with the first one's reason (its messages may still be in
 * flight). A world of 1 copies. */
int comm_exchange_timed(comm *c, const void *mine, size_t n, void *all, double timeout_s, unsigned char *arrived,
                        fsdp_err *err);
/* The exchanges made on c so far: the next one's sequence number (0, 1, ...). */
uint64_t comm_exchange_count(const comm *c);
/* Marks c broken with `why` (comm_exchange_timed's later calls fail with it); comm_broken: the
 * reason, or NULL while c is not broken. */
void comm_set_broken(comm *c, const char *why);
const char *comm_broken(const comm *c);

int comm_barrier(comm *c, fsdp_err *err);
int comm_bcast(comm *c, void *buf, size_t bytes, int root, fsdp_err *err);
/* In-place all-reduce of count elements. */
int comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, fsdp_err *err);
/* All-gather of variable-size byte blocks: rank r contributes send (recv_bytes[r] bytes);
 * recv receives all blocks concatenated in rank order. */
int comm_allgatherv(comm *c, const void *send, void *recv, const size_t *recv_bytes, fsdp_err *err);
/* Reduce-scatter (sum) of float32: send holds the whole vector (sum of counts elements, in
 * rank order); rank r receives its counts[r] summed elements in recv. */
/* All-to-all with per-rank sizes: rank r sends send_bytes[q] bytes (packed in rank order in send) to
 * each rank q and receives recv_bytes[q] from each (packed in rank order in recv). Counted as
 * COMM_K_OTHER. */
int comm_alltoallv(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                   fsdp_err *err);
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

/* Calls of each kind of collective made on c since it was created, host (comm_*) and device
 * (comm_dev_*) together, at every world size (a world of 1 counts its calls too): the trainers'
 * message count per step is read from the difference around a step. comm_agree counts as an
 * all-reduce (and a broadcast when a rank failed); the >2 GiB fallbacks count their pieces. */
typedef enum comm_kind {
    COMM_K_ALLGATHER = 0, /* comm_allgatherv, comm_dev_allgatherv */
    COMM_K_REDUCE_SCATTER, /* comm_reduce_scatterv_f32, comm_dev_reduce_scatterv_f32 */
    COMM_K_ALLREDUCE,      /* comm_allreduce, comm_dev_allreduce */
    COMM_K_BCAST,          /* comm_bcast, comm_dev_bcast */
    COMM_K_OTHER,          /* barrier, scatter, gather */
    COMM_KINDS
} comm_kind;
uint64_t comm_calls(const comm *c, comm_kind k);
/* Payload bytes of those calls: the whole buffer of a collective (an all-gather's or reduce-scatter's
 * every block, an all-reduce's or broadcast's buffer), not what a rank puts on the wire. */
uint64_t comm_bytes(const comm *c, comm_kind k);
/* The sum over every kind. */
uint64_t comm_calls_total(const comm *c);

/* ---- device collectives (NCCL) ------------------------------------------------------------
 * One GPU per rank. comm_dev_init creates the NCCL communicator on the calling thread's current
 * CUDA device (dev_ctx_create selects it): rank 0 makes the unique id, MPI broadcasts it, every
 * rank calls ncclCommInitRank; a world of 1 uses NCCL too (one rank), so the same code runs at
 * every size. Collectively called by every rank; calling it again is a no-op. FSDP_E_DEVICE with
 * the CUDA/NCCL message when built without CUDA, without a GPU or when NCCL fails.
 *
 * The comm_dev_* collectives take device buffers and queue their work on `stream` (a
 * cudaStream_t, runtime/device.h's dev_stream); they return once the work is queued. Counts and
 * byte sizes are identical on every rank; blocks of 0 elements are allowed. */
int comm_dev_init(comm *c, fsdp_err *err);
int comm_dev_ready(const comm *c);
/* "nccl" once comm_dev_init succeeded, else NULL. */
const char *comm_dev_backend(const comm *c);
/* All-gather of variable-size byte blocks (rank r sends bytes[r] bytes from send; recv receives
 * all blocks concatenated in rank order). send may alias recv's own block. */
int comm_dev_allgatherv(comm *c, const void *send, void *recv, const size_t *bytes, void *stream, fsdp_err *err);
/* Reduce-scatter (sum) of float32: send holds sum(counts) elements in rank order; rank r receives
 * its counts[r] summed elements in recv (which must not overlap send). */
int comm_dev_reduce_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, void *stream,
                                 fsdp_err *err);
/* In-place all-reduce of count elements (COMM_F32, COMM_F64, COMM_I64 or COMM_U8). */
int comm_dev_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, void *stream, fsdp_err *err);
int comm_dev_bcast(comm *c, void *buf, size_t bytes, int root, void *stream, fsdp_err *err);
/* comm_alltoallv of device buffers on `stream` (one NCCL group of sends and receives; counted as
 * COMM_K_OTHER). */
int comm_dev_alltoallv(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                       void *stream, fsdp_err *err);

#endif
