/* A flat parameter group (FSDP2's per-block parameter group): the row shards of several parameters
 * collected so that one all-gather and one reduce-scatter move them all.
 *
 * Flat layout, rank-major: rank r's block holds rank r's rows of every parameter of the group, in
 * the group's order, one after the other; the blocks follow in rank order. Each rank packs its own
 * shards into its block, one all-gather fills every block, and each (rank, parameter) segment is
 * copied out to where those rows sit in the parameter's full tensor. The gradient goes the other way:
 * the full gradients are packed rank-major, one reduce-scatter sums them and leaves this rank's
 * block, whose segments are the local gradients. Shards are torch.chunk row ranges
 * (runtime/shard.h): uneven, possibly empty for some ranks; 0-d (replicated) parameters cannot be
 * in a group.
 *
 * The layout is plain data (flat_group_seg), so the GPU trainer makes the same copies on the
 * device; flat_group_gather / flat_group_reduce_scatter are the host versions (comm_allgatherv,
 * comm_reduce_scatterv_f32). */
#ifndef FSDP_TRAIN_FLAT_GROUP_H
#define FSDP_TRAIN_FLAT_GROUP_H

#include <stddef.h>

#include "fsdp/error.h"
#include "runtime/comm.h"
#include "runtime/state.h"

/* Where rank r's rows of parameter k are: flat[flat_off .. +n) and full_k[full_off .. +n) (elements). */
typedef struct flat_group_seg {
    size_t flat_off, full_off, n;
} flat_group_seg;

typedef struct flat_group {
    int n_params, world, rank;
    state_param **ps;     /* n_params */
    size_t *counts;       /* world: elements of each rank's block */
    size_t *displs;       /* world: offset of each rank's block in the flat buffer */
    size_t *bytes;        /* world: counts[r] * sizeof(float) (the f32 all-gather's sizes) */
    flat_group_seg *segs; /* world * n_params: segs[r * n_params + k] */
    size_t total;         /* elements of the whole flat buffer (the sum of counts) */
} flat_group;

/* A group of ps[0..n) for `rank` of `world`; each parameter's rows must be the ones shard_rows gives
 * that rank. FSDP_E_INVALID naming the parameter otherwise, or for a 0-d one. */
int flat_group_create(state_param *const *ps, int n, int world, int rank, flat_group **out, fsdp_err *err);
void flat_group_free(flat_group *g);
/* Host scratch the two collectives need: total + this rank's count elements. */
size_t flat_group_scratch_numel(const flat_group *g);
/* Every parameter's full tensor from the ranks' p->data: full[k] receives parameter k
 * (state_param_numel elements). scratch: flat_group_scratch_numel floats. World 1: plain copies. */
int flat_group_gather(const flat_group *g, comm *c, float *scratch, float *const *full, fsdp_err *err);
/* Sum over the ranks of the full gradients full[k], each rank's rows into its p->grad. rep (NULL:
 * none): HSDP's replicate group, over which the reduced block is then all-reduced (one call) before
 * it is copied out, so that p->grad holds the sum over every replica's ranks. */
int flat_group_reduce_scatter(const flat_group *g, comm *c, comm *rep, const float *const *full, float *scratch,
                              fsdp_err *err);

#endif
