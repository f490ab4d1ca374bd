/* Run under mpirun by tests/test_comm.cc: checks every collective of the communicator and
 * the state's shard / unshard / reduce-scatter on this world size. Prints "comm_check ok"
 * on rank 0 and exits 0, or prints the first mismatch and exits 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/shard.h"
#include "runtime/state.h"

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "rank %d: check failed at line %d: ", rank, __LINE__);    \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

static int run(comm *c) {
    fsdp_err err;
    int rank = comm_rank(c), world = comm_size(c);
    CHECK(comm_barrier(c, &err) == 0, "%s", err.msg);
    /* all-reduce sum / max */
    double d[2] = {rank + 1.0, (double)rank};
    CHECK(comm_allreduce(c, d, 2, COMM_F64, COMM_SUM, &err) == 0, "%s", err.msg);
    CHECK(d[0] == world * (world + 1) / 2.0, "sum %g", d[0]);
    int64_t m = rank * 10;
    CHECK(comm_allreduce(c, &m, 1, COMM_I64, COMM_MAX, &err) == 0, "%s", err.msg);
    CHECK(m == (world - 1) * 10, "max %lld", (long long)m);
    /* broadcast */
    char msg[16] = "";
    if (rank == world - 1) strcpy(msg, "from-last");
    CHECK(comm_bcast(c, msg, sizeof msg, world - 1, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(msg, "from-last"), "bcast got '%s'", msg);
    /* variable all-gather: rank r contributes r+1 bytes of value r */
    size_t *sizes = malloc((size_t)world * sizeof *sizes);
    size_t total = 0;
    for (int r = 0; r < world; r++) total += (sizes[r] = (size_t)r + 1);
    unsigned char *mine = malloc((size_t)rank + 1), *all = malloc(total);
    memset(mine, rank, (size_t)rank + 1);
    CHECK(comm_allgatherv(c, mine, all, sizes, &err) == 0, "%s", err.msg);
    size_t off = 0;
    for (int r = 0; r < world; r++)
        for (size_t k = 0; k < sizes[r]; k++, off++) CHECK(all[off] == r, "allgatherv byte %zu", off);
    /* gather of bytes to root 0 */
    void *g = NULL;
    size_t *gs = NULL;
    CHECK(comm_gather_bytes(c, mine, (size_t)rank + 1, 0, &g, &gs, &err) == 0, "%s", err.msg);
    if (rank == 0) {
        CHECK(!memcmp(g, all, total), "gather_bytes content");
        for (int r = 0; r < world; r++) CHECK(gs[r] == sizes[r], "gather size %d", r);
    }
    free(g);
    free(gs);
    free(mine);
    free(all);
    free(sizes);
    /* agreement on a failure of the last rank */
    int who = -2;
    int st = comm_agree(c, rank == world - 1 ? 7 : 0, &who, &err);
    CHECK(st == 7 && who == world - 1, "agree %d who %d", st, who);
    CHECK(comm_agree(c, 0, &who, &err) == 0, "agree none");
    /* state: full on rank 0 -> shards; unshard gives back the full tensor; reduce-scatter */
    fsdp_state s;
    memset(&s, 0, sizeof s);
    s.layout = STATE_FULL;
    s.rank = rank;
    s.world = world;
    int64_t shp[2] = {7, 3}, shp1[1] = {5}, shp0[1] = {0};
    CHECK(state_add_param(&s, "w", 2, shp, 0, &err) == 0, "%s", err.msg);
    CHECK(state_add_param(&s, "v", 1, shp1, -1, &err) == 0, "%s", err.msg);
    CHECK(state_add_param(&s, "step", 0, shp0, -1, &err) == 0, "%s", err.msg);
    CHECK(state_alloc_optimizer(&s, &err) == 0, "%s", err.msg);
    if (rank == 0) {
        for (int i = 0; i < 21; i++) s.p[0].data[i] = (float)i, s.p[0].exp_avg[i] = (float)(100 + i);
        for (int i = 0; i < 5; i++) s.p[1].data[i] = (float)(i * i);
        s.p[2].data[0] = 5.0f;
    }
    CHECK(state_shard(&s, c, &err) == 0, "%s", err.msg);
    int64_t r0, rows;
    shard_rows(7, world, rank, &r0, &rows);
    CHECK(s.p[0].row0 == r0 && s.p[0].rows == rows, "rows of w");
    for (int64_t i = 0; i < rows * 3; i++) {
        CHECK(s.p[0].data[i] == (float)(r0 * 3 + i), "w shard value %lld", (long long)i);
        CHECK(s.p[0].exp_avg[i] == (float)(100 + r0 * 3 + i), "exp_avg shard value");
    }
    CHECK(s.p[2].data[0] == 5.0f, "replicated 0-d value");
    float full[21];
    CHECK(state_unshard(&s.p[0], s.p[0].data, c, full, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 21; i++) CHECK(full[i] == (float)i, "unshard %d", i);
    float gfull[21], glocal[21];
    for (int i = 0; i < 21; i++) gfull[i] = (float)(i + rank);
    CHECK(state_reduce_scatter(&s.p[0], gfull, c, glocal, &err) == 0, "%s", err.msg);
    for (int64_t i = 0; i < rows * 3; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) want += (float)(r0 * 3 + i + r);
        CHECK(glocal[i] == want, "reduce-scatter %lld: %g vs %g", (long long)i, glocal[i], want);
    }
    for (size_t i = 0; i < s.n; i++) {
        free(s.p[i].name);
        free(s.p[i].data);
        free(s.p[i].exp_avg);
        free(s.p[i].exp_avg_sq);
        free(s.p[i].grad);
    }
    free(s.p);
    nidx_free(&s.names);
    if (rank == 0) printf("comm_check ok (%s, world %d)\n", comm_backend(c), world);
    return 0;
}

int main(void) {
    comm *c;
    fsdp_err err;
    if (comm_create(&c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rc = run(c);
    if (rc) comm_abort(c, 1);
    comm_destroy(c);
    return rc;
}
