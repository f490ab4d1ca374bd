/* bench/ckpt_io: converts a >= 2 GiB safetensors checkpoint (generated here) to DCP and back
 * with `fsdp-run ckpt convert`, and prints GB/s next to `cp` of the same file measured in the
 * same run, plus the converter's peak RSS against the largest tensor.
 *
 *   build/bench/ckpt_io [--gib N] [--dir DIR] [--bin build/fsdp-run] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ckpt/safetensors.h"

int main(int argc, char **argv) {
    double gib = 2.0;
    const char *dir = "/tmp/fsdp-ckpt-io", *bin = "build/fsdp-run";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--gib")) gib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
    }
    char cmd[8192], src[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    bench_timed(cmd, NULL);
    snprintf(src, sizeof src, "%s/src.safetensors", dir);
    /* 256 MiB tensors (f32 [16384, 4096], the size of a 8B model's embedding shard) */
    int64_t shape[2] = {16384, 4096};
    size_t tbytes = (size_t)(shape[0] * shape[1]) * 4;
    int nt = (int)(gib * (double)(1ull << 30) / (double)tbytes + 0.999);
    st_writer *w;
    fsdp_err err;
    if (st_writer_new(&w, src, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t *idx = calloc((size_t)nt, sizeof *idx);
    for (int i = 0; i < nt; i++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.weight", i);
        if (st_writer_declare(w, name, FSDP_DT_F32, 2, shape, &idx[i], &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    if (st_writer_begin(w, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    float *buf = malloc(tbytes);
    for (int i = 0; i < nt; i++) {
        for (size_t k = 0; k < tbytes / 4; k++) buf[k] = (float)(k % 1000) * 1e-3f + (float)i;
        if (st_writer_write(w, idx[i], buf, tbytes, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    if (st_writer_finish(w, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    st_writer_free(w);
    free(buf);
    free(idx);
    double bytes = (double)nt * (double)tbytes;
    printf("ckpt_io: %d tensors of %.0f MiB, %.2f GiB\n", nt, (double)tbytes / (1 << 20), bytes / (1ull << 30));
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/copy.safetensors' && sync", src, dir);
    double t_cp = bench_timed(cmd, NULL);
    double rss1, rss2;
    snprintf(cmd, sizeof cmd, "%s ckpt convert '%s' '%s/dcp' --to dcp >/dev/null && sync", bin, src, dir);
    double t_to = bench_timed(cmd, &rss1);
    snprintf(cmd, sizeof cmd, "%s ckpt convert '%s/dcp' '%s/back.safetensors' >/dev/null && sync", bin, dir, dir);
    double t_back = bench_timed(cmd, &rss2);
    snprintf(cmd, sizeof cmd, "%s ckpt diff '%s' '%s/back.safetensors' >/dev/null", bin, src, dir);
    bench_timed(cmd, NULL);
    double gb = bytes / 1e9;
    printf("cp                      %6.2f s  %6.2f GB/s\n", t_cp, gb / t_cp);
    printf("safetensors -> DCP      %6.2f s  %6.2f GB/s  ratio to cp %.2f  peak RSS %.0f MiB (%.2fx the largest tensor)\n",
           t_to, gb / t_to, t_cp / t_to, rss1, rss1 / ((double)tbytes / (1 << 20)));
    printf("DCP -> safetensors      %6.2f s  %6.2f GB/s  ratio to cp %.2f  peak RSS %.0f MiB (%.2fx the largest tensor)\n",
           t_back, gb / t_back, t_cp / t_back, rss2, rss2 / ((double)tbytes / (1 << 20)));
    printf("round trip identical (fsdp-run ckpt diff)\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_timed(cmd, NULL);
    return 0;
}
