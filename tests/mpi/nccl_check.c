/* Run under mpirun (or alone, world of 1) by tests/test_comm_nccl.cc on a machine with GPUs:
 * every device collective of the communicator (NCCL), with the uneven block sizes that
 * torch.chunk shards give, against values computed on the host. One GPU per rank (the rank's
 * node-local index). Prints "nccl_check ok (world N)" on rank 0 and exits 0, or prints the first
 * mismatch and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/shard.h"

#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "rank %d: check failed at line %d: ", rank, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            rc = 1;                                                                \
            goto out;                                                              \
        }                                                                          \
    } while (0)

static int run(comm *c, dev_ctx *d) {
    fsdp_err err;
    int rc = 0, rank = comm_rank(c), world = comm_size(c);
    void *st = dev_ctx_stream(d, DEV_STREAM_COMM);
    size_t *bytes = calloc((size_t)world, sizeof *bytes), *counts = calloc((size_t)world, sizeof *counts);
    unsigned char *h_all = NULL, *d_mine = NULL, *d_all = NULL;
    float *h_full = NULL, *h_got = NULL, *d_full = NULL, *d_part = NULL, *d_x = NULL;
    double *d_dbl = NULL;
    CHECK(bytes && counts, "out of memory");
    CHECK(comm_dev_init(c, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(comm_dev_backend(c), "nccl"), "backend");

    /* all-gather of uneven byte blocks: rank r sends 3r+1 bytes of value r+1 */
    size_t total = 0;
    for (int r = 0; r < world; r++) total += (bytes[r] = 3 * (size_t)r + 1);
    h_all = malloc(total);
    CHECK(h_all, "out of memory");
    CHECK(dev_alloc(d, bytes[rank], (void **)&d_mine, &err) == 0, "%s", err.msg);
    CHECK(dev_alloc(d, total, (void **)&d_all, &err) == 0, "%s", err.msg);
    memset(h_all, rank + 1, bytes[rank]);
    CHECK(dev_upload(d, d_mine, h_all, bytes[rank], &err) == 0, "%s", err.msg);
    CHECK(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, &err) == 0, "%s", err.msg);
    CHECK(comm_dev_allgatherv(c, d_mine, d_all, bytes, st, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_sync(d, DEV_STREAM_COMM, &err) == 0, "%s", err.msg);
    CHECK(dev_download(d, h_all, d_all, total, &err) == 0, "%s", err.msg);
    for (int r = 0, off = 0; r < world; r++)
        for (size_t k = 0; k < bytes[r]; k++, off++) CHECK(h_all[off] == r + 1, "allgatherv byte %d", off);

    /* reduce-scatter of a [7, 3] gradient split as torch.chunk splits dim 0 (uneven, maybe empty) */
    const int64_t rows = 7, rn = 3;
    size_t n = (size_t)(rows * rn);
    for (int r = 0; r < world; r++) {
        int64_t r0, nr;
        shard_rows(rows, world, r, &r0, &nr);
        counts[r] = (size_t)(nr * rn);
    }
    h_full = malloc(n * sizeof *h_full);
    h_got = malloc(n * sizeof *h_got);
    CHECK(h_full && h_got, "out of memory");
    for (size_t i = 0; i < n; i++) h_full[i] = (float)(i + 1) * (float)(rank + 1);
    CHECK(dev_alloc(d, n * sizeof(float), (void **)&d_full, &err) == 0, "%s", err.msg);
    CHECK(dev_alloc(d, n * sizeof(float), (void **)&d_part, &err) == 0, "%s", err.msg);
    CHECK(dev_upload(d, d_full, h_full, n * sizeof(float), &err) == 0, "%s", err.msg);
    CHECK(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, &err) == 0, "%s", err.msg);
    CHECK(comm_dev_reduce_scatterv_f32(c, d_full, d_part, counts, st, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_sync(d, DEV_STREAM_COMM, &err) == 0, "%s", err.msg);
    if (counts[rank]) CHECK(dev_download(d, h_got, d_part, counts[rank] * sizeof(float), &err) == 0, "%s", err.msg);
    size_t first = 0;
    for (int r = 0; r < rank; r++) first += counts[r];
    float ranks_sum = (float)(world * (world + 1) / 2);
    for (size_t k = 0; k < counts[rank]; k++)
        CHECK(h_got[k] == (float)(first + k + 1) * ranks_sum, "reduce-scatter element %zu: %g", k, h_got[k]);

    /* all-reduce (sum of f32, max of f64) and broadcast from the last rank */
    for (size_t i = 0; i < n; i++) h_full[i] = (float)rank + 0.5f;
    CHECK(dev_upload(d, d_full, h_full, n * sizeof(float), &err) == 0, "%s", err.msg);
    CHECK(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, &err) == 0, "%s", err.msg);
    CHECK(comm_dev_allreduce(c, d_full, n, COMM_F32, COMM_SUM, st, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_sync(d, DEV_STREAM_COMM, &err) == 0, "%s", err.msg);
    CHECK(dev_download(d, h_got, d_full, n * sizeof(float), &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < n; i++)
        CHECK(h_got[i] == (float)(world * (world - 1)) / 2.0f + 0.5f * (float)world, "allreduce %zu: %g", i, h_got[i]);
    double hd[2] = {(double)rank, -(double)rank};
    CHECK(dev_alloc(d, sizeof hd, (void **)&d_dbl, &err) == 0, "%s", err.msg);
    CHECK(dev_upload(d, d_dbl, hd, sizeof hd, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, &err) == 0, "%s", err.msg);
    CHECK(comm_dev_allreduce(c, d_dbl, 2, COMM_F64, COMM_MAX, st, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_sync(d, DEV_STREAM_COMM, &err) == 0, "%s", err.msg);
    CHECK(dev_download(d, hd, d_dbl, sizeof hd, &err) == 0, "%s", err.msg);
    CHECK(hd[0] == world - 1 && hd[1] == 0.0, "allreduce max %g %g", hd[0], hd[1]);
    char msg[16] = "";
    if (rank == world - 1) strcpy(msg, "from-last");
    CHECK(dev_alloc(d, sizeof msg, (void **)&d_x, &err) == 0, "%s", err.msg);
    CHECK(dev_upload(d, d_x, msg, sizeof msg, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, &err) == 0, "%s", err.msg);
    CHECK(comm_dev_bcast(c, d_x, sizeof msg, world - 1, st, &err) == 0, "%s", err.msg);
    CHECK(dev_stream_sync(d, DEV_STREAM_COMM, &err) == 0, "%s", err.msg);
    CHECK(dev_download(d, msg, d_x, sizeof msg, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(msg, "from-last"), "bcast got '%s'", msg);
    /* a bad root is an error, not a hang */
    CHECK(comm_dev_bcast(c, d_x, sizeof msg, world, st, &err) == FSDP_E_INVALID, "bad root accepted");
out:
    dev_free(d, d_mine, &err);
    dev_free(d, d_all, &err);
    dev_free(d, d_full, &err);
    dev_free(d, d_part, &err);
    dev_free(d, d_dbl, &err);
    dev_free(d, d_x, &err);
    free(h_all);
    free(h_full);
    free(h_got);
    free(bytes);
    free(counts);
    return rc;
}

int main(void) {
    fsdp_err err;
    comm *c = NULL;
    if (comm_create(&c, &err)) {
        fprintf(stderr, "nccl_check: %s\n", err.msg);
        return 1;
    }
    dev_options o = {comm_local_rank(c), 0};
    dev_ctx *d = dev_ctx_create(&o, &err);
    int rc;
    if (!d) {
        fprintf(stderr, "rank %d: %s\n", comm_rank(c), err.msg);
        rc = 1;
    } else {
        rc = run(c, d);
    }
    fsdp_err e2;
    int who = -1;
    int any = comm_agree(c, rc, &who, &e2);
    if (!any && comm_rank(c) == 0) printf("nccl_check ok (world %d)\n", comm_size(c));
    comm_destroy(c); /* the NCCL communicator before the device context */
    dev_ctx_free(d);
    return any ? 1 : 0;
}
