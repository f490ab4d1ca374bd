/* Read planning for DCP tensors: which stored chunks a box of a tensor needs, and the part of each
 * (what torch's create_read_items_for_chunk_list computes for a load or a reshard). An index per
 * tensor (its non-empty chunks in slabs of the same extent along the dimension that tells them apart
 * best, the slabs with the running maximum of their ends, and within a slab the chunks sorted along a
 * second dimension the same way) answers a box in O(log n + s log n + k) for s slabs and k chunks
 * met, so that a load of one rank costs O(tensors x log chunks) and a reshard planning every rank of
 * M costs O(chunks log chunks + M x tensors x log chunks), not O(M x chunks): a grid's box (experts
 * of a group x rows of a Shard(1)) walks only the chunks it meets, not every chunk of its slab, whose
 * number grows with the world size. The searches walk the index's dense arrays, not the chunks'
 * records (at 4096 ranks those are hundreds of MB, each step a cache miss). */
#ifndef FSDP_CKPT_DCP_PLAN_H
#define FSDP_CKPT_DCP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/dcp.h"

typedef struct dcp_plan_ix {
    uint32_t *ord; /* non-empty chunk indices sorted by their extent along dim (start, then end), then by their
                      start along dim2 */
    size_t n;
    int dim;
    int dim2; /* the dimension that tells apart the chunks of one slab (-1: none) */
    /* slabs: the runs of ord with the same extent along dim, a grid's rows of chunks (the experts of one
     * expert-parallel group cut along another dim: Shard(1) within a group); in a Shard(0) layout each chunk
     * is its own slab */
    size_t ns;
    int64_t *sstart;  /* sstart[s]: slab s's start along dim */
    int64_t *smaxend; /* smaxend[s]: the largest end along dim of slabs 0 .. s */
    uint32_t *first;  /* first[s]: slab s's first position in ord, first[ns] = n (NULL when ns == n) */
    int64_t *start2;  /* start2[q]: chunk ord[q]'s start along dim2 (NULL when ns == n or dim2 < 0) */
    int64_t *maxend2; /* maxend2[q]: the largest end along dim2 from q's slab's first chunk to q (likewise) */
} dcp_plan_ix;

/* The index of tensor item x (its chunks as dcp_open checked them: in bounds). */
int dcp_plan_ix_build(const dcp_item *x, dcp_plan_ix *ix, fsdp_err *err);
void dcp_plan_ix_free(dcp_plan_ix *ix);

/* One read of a plan: chunk `chunk` of the tensor holds the box [at, at + len) (global coordinates)
 * of the box asked for; return non-zero to stop (that value is returned). */
typedef int (*dcp_plan_fn)(void *user, size_t chunk, const int64_t *at, const int64_t *len);

/* Calls fn for every stored chunk that meets the box [off, off + len) of x (each once, in the order of
 * the index), with the intersection. 0, or what fn returned. An empty box meets none. */
int dcp_plan_box(const dcp_item *x, const dcp_plan_ix *ix, const int64_t *off, const int64_t *len, dcp_plan_fn fn,
                 void *user);

#endif
