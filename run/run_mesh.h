/* runtime.mesh in a run (runtime/mesh.h): checked with the recipe, made current in the context when
 * the recipe starts, and the ranks' hosts for the log and the report. */
#ifndef FSDP_RUN_RUN_MESH_H
#define FSDP_RUN_RUN_MESH_H

#include "fsdp/value.h"
#include "run/report.h"
#include "run/sizes.h"
#include "runtime/comm.h"

/* Ranks of one node the recipe is checked for: the launcher's node (MPI's shared-memory split) when
 * launched with several ranks, world / FSDP_FAKE_NODES when set, SLURM_NTASKS_PER_NODE inside an
 * allocation, 1 for a world of 1, else 0 (not known). */
int run_ranks_per_node(comm *c, int world);

/* Reads and resolves the runtime section's mesh for h's world into h->mesh_r, mesh_s, shard_world;
 * an error (pointing at runtime.mesh) names the numbers that do not fit. */
int run_mesh_check(const fsdp_value *runtime, sizes_host *h, fsdp_err *err);

/* Collective: the recipe's mesh made the context's (unchanged when it is the current one). A state
 * sharded over another number of ranks is an error (it cannot be re-sharded in place). */
int run_mesh_setup(fsdp_ctx *ctx, const fsdp_value *runtime, fsdp_err *err);

/* Collective: every rank's host name gathered into res (rank 0) and, with several ranks, the nodes
 * logged. */
void run_mesh_hosts(fsdp_ctx *ctx, run_result *res);

#endif
