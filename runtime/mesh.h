/* The device mesh of a run (runtime.mesh): R replicas x S shards, FSDP2's 2-D (replicate, shard)
 * DeviceMesh. World rank w is replica w / S, shard rank w % S: a shard group is S consecutive ranks
 * (one node with `shard: auto`), a replicate group the ranks of one shard rank in every replica.
 * Parameters are sharded (Shard(0)) over the shard group and replicated over the replicate group;
 * the default (no runtime.mesh) is today's 1-D mesh, R = 1 and S = the world. */
#ifndef FSDP_RUNTIME_MESH_H
#define FSDP_RUNTIME_MESH_H

#include "fsdp/value.h"
#include "runtime/comm.h"

/* runtime.mesh as written: 0 stands for `auto`. */
typedef struct mesh_spec {
    int present; /* runtime.mesh given */
    int replicate, shard;
    const fsdp_value *node; /* the mesh's value (errors point at it), NULL when absent */
} mesh_spec;

/* Reads runtime.mesh of the runtime section (NULL: absent): a map with `replicate` and `shard`, each
 * a positive integer or `auto` (absent = auto). Errors point at the key. */
int mesh_spec_read(const fsdp_value *runtime, mesh_spec *sp, fsdp_err *err);

/* The mesh's R and S on `world` ranks; ranks_per_node: ranks of one node (0: not known, as when
 * validating without a launcher; `shard: auto` is then resolved at run time). Errors name the
 * numbers: R x S not the world, S or R not dividing it, and `shard: auto` finding one rank per node
 * on more than one rank (every parameter would be replicated whole on every rank). *S = 0 when
 * `shard: auto` cannot be resolved yet. */
int mesh_spec_resolve(const mesh_spec *sp, int world, int ranks_per_node, int *R, int *S, fsdp_err *err);

typedef struct mesh {
    int R, S;            /* replicas x shards = the world */
    int replica, shard_rank;
    comm *world;         /* borrowed */
    comm *shard;         /* the shard group: the world itself when R == 1 */
    comm *replicate;     /* the replicate group: NULL when R == 1 */
    int owns_shard;
} mesh;

/* Collective over world: the sub-communicators of an R x S mesh (comm_split). */
int mesh_create(comm *world, int R, int S, mesh **out, fsdp_err *err);
void mesh_free(mesh *m);

#endif
