/* FSDP2 sharding math (runtime/shard.h): Shard(0) rows with torch.chunk semantics. */
#include "runtime/shard.h"

#include "runtime/checked.h"

void shard_rows(int64_t d0, int world, int rank, int64_t *row0, int64_t *rows) {
    if (world <= 1 || d0 <= 0) {
        *row0 = 0;
        *rows = d0 > 0 || world <= 1 ? d0 : 0;
        return;
    }
    /* ceil(d0 / world) and rank * chunk without overflow for any d0 (the shape may come from a file) */
    int64_t chunk = d0 / world + (d0 % world != 0), start, end;
    if (rank < 0 || chk_mul_i64(rank, chunk, &start) || start >= d0) {
        *row0 = d0;
        *rows = 0;
        return;
    }
    end = chunk > d0 - start ? d0 : start + chunk;
    *row0 = start;
    *rows = end - start;
}
