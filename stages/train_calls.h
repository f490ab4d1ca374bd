/* Collectives issued by train-steps' steps (comm_calls / comm_bytes around each step; evaluations and
 * saves left out), over every communicator of the run's mesh: the world, the shard group and the
 * replicate group (runtime/mesh.h). */
#ifndef FSDP_STAGES_TRAIN_CALLS_H
#define FSDP_STAGES_TRAIN_CALLS_H

#include <stdint.h>

#include "fsdp/ctx.h"
#include "runtime/comm.h"

#define TRAIN_CALLS_COMMS 3

typedef struct train_calls {
    comm *c[TRAIN_CALLS_COMMS]; /* distinct communicators (NULL: unused) */
    uint64_t before[TRAIN_CALLS_COMMS][COMM_KINDS], sum[TRAIN_CALLS_COMMS][COMM_KINDS];
    uint64_t bbefore[TRAIN_CALLS_COMMS][COMM_KINDS], bsum[TRAIN_CALLS_COMMS][COMM_KINDS];
    int64_t steps;
} train_calls;

/* The communicators of ctx's mesh (once, before the first step). */
void train_calls_init(fsdp_ctx *ctx, train_calls *t);
void train_calls_begin(train_calls *t);
void train_calls_end(train_calls *t);

/* The report's collectives_per_step (every kind) and per kind, and the bytes each rank sends per step
 * inside one node and across nodes (bytes_sent_intra_node_per_step, bytes_sent_inter_node_per_step:
 * a ring's share of each collective, (n-1)/n of an all-gather's or reduce-scatter's payload and twice
 * that of an all-reduce's, counted across nodes when the group spans nodes); one log line. */
void train_calls_report(fsdp_ctx *ctx, const train_calls *t, int per_param);

#endif
