/* Read planning for DCP tensors: which stored chunks a box of a tensor needs, and the part of each
 * (what torch's create_read_items_for_chunk_list computes for a load or a reshard). An index per
 * tensor (its non-empty chunks sorted by their start along the dimension that tells them apart best,
 * with the running maximum of their ends) answers a box in O(log n + k) for k chunks met, so that
 * a load of one rank costs O(tensors x log chunks) and a reshard planning every rank of M costs
 * O(chunks log chunks + M x tensors), not O(M x chunks). */
#ifndef FSDP_CKPT_DCP_PLAN_H
#define FSDP_CKPT_DCP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/dcp.h"

typedef struct dcp_plan_ix {
    uint32_t *ord;   /* non-empty chunk indices sorted by offsets[dim] */
    int64_t *maxend; /* maxend[q]: the largest offsets[dim] + sizes[dim] of ord[0 .. q] */
    size_t n;
    int dim;
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
