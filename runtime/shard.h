/* FSDP2 sharding math: per-parameter Shard(0) with torch.chunk semantics. */
#ifndef FSDP_RUNTIME_SHARD_H
#define FSDP_RUNTIME_SHARD_H

#include <stdint.h>

/* chunk = ceil(d0 / world); rank r owns rows [r*chunk, min(d0, (r+1)*chunk)), possibly
 * empty. For an empty shard *row0 is d0 (the offset PyTorch >= 2.8 records). */
void shard_rows(int64_t d0, int world, int rank, int64_t *row0, int64_t *rows);

#endif
