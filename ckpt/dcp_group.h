/* Grouping DCP write records by key (internal to ckpt/dcp_write.c): O(n log n) for n records. */
#ifndef FSDP_CKPT_DCP_GROUP_H
#define FSDP_CKPT_DCP_GROUP_H

#include <stddef.h>

#include "ckpt/dcp.h"

/* The records grouped by fqn: group k (keys in first-seen order) is order[starts[k] .. starts[k+1]),
 * its records in the order given. A value key (not a tensor) written twice, or a key written both
 * as a tensor and as a value, is an error naming it. The caller frees *order and *starts. */
int dcp_records_group(const dcp_record *recs, size_t n, size_t **order, size_t **starts, size_t *nk, fsdp_err *err);

#endif
