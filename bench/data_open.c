/* Opening training data (issue 16 item 5): every token id of the llm.c shards is scanned against the
 * vocabulary when the data opens. Ratios measured in one run:
 *
 *   build/bench/data_open [--tokens 16777216] [--shards 4] [--threads 2] [--work DIR]
 *
 * 1. growth: data_open of n, 2n and 4n tokens (kind llmc, --shards files by glob): time(2n)/time(n)
 *    and time(4n)/time(2n) (linear: about 2);
 * 2. the scan against reading the same bytes: data_open's time over a plain sum of the mapped uint16
 *    tokens by the same threads (the floor of any check that looks at every token);
 * 3. the scan's share of a step: data_open's time over the first data_batch of batch 8 x 1024.
 * Files are written under --work (default /tmp) and removed; seconds are printed for reference. */
#include <fcntl.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "train/data.h"

static int write_shards(const char *dir, int64_t n, int shards) {
    int64_t per = n / shards;
    uint16_t *buf = malloc((size_t)per * 2);
    if (!buf) return -1;
    for (int s = 0; s < shards; s++) {
        for (int64_t i = 0; i < per; i++) buf[i] = (uint16_t)((i * 2654435761u + (uint64_t)s) % 50257);
        int32_t hdr[256] = {20240520, 1, (int32_t)per};
        char path[4200];
        snprintf(path, sizeof path, "%s/shard_%03d.bin", dir, s);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(hdr, 4, 256, f) != 256 || fwrite(buf, 2, (size_t)per, f) != (size_t)per) {
            if (f) fclose(f);
            free(buf);
            return -1;
        }
        fclose(f);
    }
    free(buf);
    return 0;
}

/* Best of 3: seconds of data_open (and close) of the shards; the first data_batch in *first. */
static double time_open(const char *dir, double *first) {
    data_config c;
    memset(&c, 0, sizeof c);
    c.kind = DATA_LLMC;
    snprintf(c.path, sizeof c.path, "%s/shard_*.bin", dir);
    c.batch_size = 8;
    c.seq_len = 1024;
    double best = 1e30;
    static int32_t in[8 * 1024], lab[8 * 1024];
    for (int r = 0; r < 3; r++) {
        data_source *d;
        fsdp_err err;
        double t0 = bench_now();
        if (data_open(&c, 50257, 1, 0, &d, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            exit(1);
        }
        double t1 = bench_now();
        if (data_batch(d, (uint64_t)r, in, lab, &err)) exit(1);
        double t2 = bench_now();
        data_close(d);
        if (t1 - t0 < best) {
            best = t1 - t0;
            *first = t2 - t1;
        }
    }
    return best;
}

/* Best of 3: a parallel sum of every uint16 token of the shards (mapped the same way). */
static double time_sum(const char *dir, int shards, uint64_t *sink) {
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = bench_now();
        for (int s = 0; s < shards; s++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/shard_%03d.bin", dir, s);
            int fd = open(path, O_RDONLY);
            struct stat st;
            if (fd < 0 || fstat(fd, &st)) exit(1);
            const uint16_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            close(fd);
            if (m == MAP_FAILED) exit(1);
            size_t n = ((size_t)st.st_size - 1024) / 2;
            const uint16_t *t = m + 512;
            uint64_t acc = 0;
#pragma omp parallel for reduction(+ : acc) schedule(static)
            for (size_t i = 0; i < n; i++) acc += t[i];
            *sink += acc;
            munmap((void *)m, (size_t)st.st_size);
        }
        double dt = bench_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t n = 1 << 24;
    int shards = 4, threads = 2;
    const char *work = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--shards")) shards = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--work")) work = argv[i + 1];
    }
    omp_set_num_threads(threads);
    double t[3], first[3], sum[3];
    uint64_t sink = 0;
    for (int k = 0; k < 3; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/fsdp-bench-data-XXXXXX", work);
        if (!mkdtemp(dir) || write_shards(dir, n << k, shards)) {
            fprintf(stderr, "bench: cannot write shards under %s\n", work);
            return 1;
        }
        t[k] = time_open(dir, &first[k]);
        sum[k] = time_sum(dir, shards, &sink);
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        bench_sh(cmd);
        printf("data_open %lld tokens in %d shards: %.4f s (%.2f GB/s); sum of the tokens %.4f s; first batch %.6f s\n",
               (long long)(n << k), shards, t[k], (double)(n << k) * 2 / t[k] / 1e9, sum[k], first[k]);
    }
    printf("growth: time(2n)/time(n) = %.2f, time(4n)/time(2n) = %.2f (linear: 2)\n", t[1] / t[0], t[2] / t[1]);
    printf("scan vs a sum of the same tokens: %.2f, %.2f, %.2f\n", t[0] / sum[0], t[1] / sum[1], t[2] / sum[2]);
    printf("open vs the first batch of 8 x 1024: %.0f x (sink %llu)\n", t[2] / first[2], (unsigned long long)sink % 10);
    return 0;
}
