#include "runtime/shard.h"

void shard_rows(int64_t d0, int world, int rank, int64_t *row0, int64_t *rows) {
    if (world <= 1) {
        *row0 = 0;
        *rows = d0;
        return;
    }
    int64_t chunk = (d0 + world - 1) / world;
    int64_t start = (int64_t)rank * chunk;
    if (start >= d0) {
        *row0 = d0;
        *rows = 0;
        return;
    }
    int64_t end = start + chunk < d0 ? start + chunk : d0;
    *row0 = start;
    *rows = end - start;
}
