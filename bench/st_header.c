/* Large safetensors headers (issue 25 item 5): a header of millions of tiny tensors, read by the
 * reader and inspected, against reading the same header bytes, measured in one run:
 *
 *   build/bench/st_header [--tensors 1600000] [--dir /tmp] [--bin build/fsdp-run] [--reps 3]
 *
 * The file holds --tensors tensors "l.<i/64>.<i%64>.w" (U8, shape [0], data_offsets [0, 0]: the
 * default makes a 99.8 MB header, just under the format's 100 MB limit, with the names listed
 * out of their sorted order). Printed, best of --reps each:
 *   read     the 8-byte length and the header bytes into memory (the floor of any reader);
 *   st_open  st_open + st_close (parse, validation, name index) over read;
 *   ckpt     ckpt_open + ckpt_close (the checkpoint reader over it) over read;
 *   inspect  `fsdp-run ckpt inspect FILE > /dev/null`, wall over read, and its peak resident set
 *            over the header's size.
 * Seconds are printed for reference; the file is removed at the end. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"

/* Writes the file (the length field last); its header length in *hlen. */
static int write_file(const char *path, size_t n, uint64_t *hlen) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t len = 0;
    int bad = fwrite(&len, 8, 1, f) != 1 || fputs("{\"__metadata__\":{\"format\":\"pt\"}", f) < 0;
    for (size_t i = 0; i < n && !bad; i++)
        bad = fprintf(f, ",\"l.%zu.%zu.w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}", i / 64, i % 64) < 0;
    if (!bad) bad = fputc('}', f) == EOF;
    long end = bad ? -1 : ftell(f);
    len = end > 8 ? (uint64_t)end - 8 : 0; /* little-endian hosts: the field is the integer's bytes */
    if (!bad) bad = fseek(f, 0, SEEK_SET) || fwrite(&len, 8, 1, f) != 1;
    *hlen = len;
    return fclose(f) || bad || len > ST_MAX_HEADER_SIZE ? -1 : 0;
}

static double time_read(const char *path, uint64_t hlen) {
    char *buf = malloc(hlen + 8);
    int fd = open(path, O_RDONLY);
    double t0 = bench_now();
    size_t got = 0;
    while (buf && fd >= 0 && got < hlen + 8) {
        ssize_t k = read(fd, buf + got, hlen + 8 - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    double el = bench_now() - t0;
    if (fd >= 0) close(fd);
    free(buf);
    return got == hlen + 8 ? el : -1;
}

static double time_st_open(const char *path) {
    st_reader *r;
    fsdp_err err;
    double t0 = bench_now();
    if (st_open(&r, path, &err)) {
        fprintf(stderr, "st_header: %s\n", err.msg);
        return -1;
    }
    st_close(r);
    return bench_now() - t0;
}

static double time_ckpt_open(const char *path) {
    ckpt_reader *r;
    fsdp_err err;
    double t0 = bench_now();
    if (ckpt_open(path, CKPT_AUTO, &r, &err)) {
        fprintf(stderr, "st_header: %s\n", err.msg);
        return -1;
    }
    ckpt_close(r);
    return bench_now() - t0;
}

static double best(double a, double b) { return a < 0 ? b : b < 0 ? a : (a < b ? a : b); }

int main(int argc, char **argv) {
    size_t n = 1600000;
    int reps = 3;
    const char *dir = "/tmp", *bin = FSDP_BUILD_DIR "/fsdp-run";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tensors")) n = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--tensors N] [--dir DIR] [--bin FSDP_RUN] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    char path[4096], cmd[8400];
    snprintf(path, sizeof path, "%s/st_header_%d.safetensors", dir, (int)getpid());
    uint64_t hlen;
    if (write_file(path, n, &hlen)) {
        fprintf(stderr, "st_header: cannot write %s (or its header exceeds the 100 MB limit)\n", path);
        unlink(path);
        return 1;
    }
    double rd = -1, so = -1, co = -1, ins = -1;
    long rss = 0;
    snprintf(cmd, sizeof cmd, "%s ckpt inspect %s > /dev/null", bin, path);
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        rd = best(rd, time_read(path, hlen));
        so = best(so, time_st_open(path));
        co = best(co, time_ckpt_open(path));
        long k = 0;
        ins = best(ins, bench_run(cmd, &k));
        if (k > rss) rss = k;
    }
    unlink(path);
    if (rd <= 0 || so < 0 || co < 0 || ins < 0) return 1;
    printf("safetensors header: %zu tensors, %.1f MB (%.0f bytes a tensor)\n", n, (double)hlen / 1e6,
           (double)hlen / (double)n);
    printf("  read      %8.3f s\n", rd);
    printf("  st_open   %8.3f s  %6.1fx read\n", so, so / rd);
    printf("  ckpt_open %8.3f s  %6.1fx read\n", co, co / rd);
    printf("  inspect   %8.3f s  %6.1fx read, peak RSS %.0f MB = %.1fx the header\n", ins, ins / rd,
           (double)rss / 1024.0, (double)rss * 1024.0 / (double)hlen);
    return 0;
}
