/* bench/save_pwrite (issue 18, item 1): one record payload of a DCP save written by
 * ckpt_pwrite_conv (ckpt/ckpt_pwrite.h) on 1 and N threads, f32 (straight from the array) and
 * bf16 (converted piece by piece), against, in the same run:
 *   - the ceiling: one pwrite of the bytes (no CRC, no conversion) + fsync;
 *   - the save before issue 18: CRC of the whole payload, then one write of it (f32), and for bf16
 *     a conversion of the whole array into a new buffer first (what state_save.c did).
 * Each measurement writes a new file in --dir, fsyncs it and removes it; alternating repetitions,
 * medians; the table prints GB/s of the written bytes and ratios. Put --dir on tmpfs (/dev/shm)
 * to see the CPU side alone (the page-cache copy, the CRC, the conversion), on a disk to see
 * write-back as well.
 *
 *   build/bench/save_pwrite [--dir DIR] [--mb 512] [--reps 5] [--threads 2] */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bench/bench_util.h"
#include "ckpt/ckpt_pwrite.h"

enum { M_CEIL, M_OLD_F32, M_NEW1_F32, M_NEWN_F32, M_OLD_BF16, M_NEW1_BF16, M_NEWN_BF16, M_COUNT };
static const char *const NAMES[M_COUNT] = {"ceiling: one pwrite, no CRC (f32)", "before: CRC, then one pwrite (f32)",
                                            "ckpt_pwrite_conv, 1 thread (f32)", "ckpt_pwrite_conv, N threads (f32)",
                                            "before: convert all, CRC, pwrite (bf16)", "ckpt_pwrite_conv, 1 thread (bf16)",
                                            "ckpt_pwrite_conv, N threads (bf16)"};
#define MAX_REPS 32

static int write_all(int fd, const char *p, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t r = pwrite(fd, p + done, n - done, (off_t)done);
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

static uint32_t crc_all(const char *p, size_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    for (size_t k; n; p += k, n -= k) {
        k = n > (1u << 30) ? (1u << 30) : n;
        c = crc32(c, (const unsigned char *)p, (uInt)k);
    }
    return (uint32_t)c;
}

/* seconds of one measurement (write + fsync), -1 on failure; *crc_out the CRC it computed */
static double one(int m, const char *path, const float *src, size_t n, int threads, uint32_t *crc_out) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    fsdp_err err;
    ckpt_pio_opts o = {0, 1, 1, 0};
    int bf16 = m >= M_OLD_BF16, rc = 0;
    uint32_t crc = 0;
    double t0 = bench_now();
    if (m == M_CEIL) rc = write_all(fd, (const char *)src, n * 4);
    else if (m == M_OLD_F32) {
        crc = crc_all((const char *)src, n * 4);
        rc = write_all(fd, (const char *)src, n * 4);
    } else if (m == M_OLD_BF16) {
        char *b = malloc(n * 2);
        rc = !b || fsdp_convert(b, FSDP_DT_BF16, src, FSDP_DT_F32, n, &err);
        if (!rc) {
            crc = crc_all(b, n * 2);
            rc = write_all(fd, b, n * 2);
        }
        free(b);
    } else {
        o.threads = (m == M_NEWN_F32 || m == M_NEWN_BF16) ? threads : 1;
        rc = ckpt_pwrite_conv(fd, src, FSDP_DT_F32, bf16 ? FSDP_DT_BF16 : FSDP_DT_F32, n, 0, &crc, path, &o, &err);
        if (rc) fprintf(stderr, "save_pwrite: %s\n", err.msg);
    }
    if (!rc) rc = fsync(fd);
    double s = bench_now() - t0;
    close(fd);
    unlink(path);
    *crc_out = crc;
    return rc ? -1 : s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/fsdp-save-pwrite";
    int mb = 512, reps = 5, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--mb")) mb = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: save_pwrite [--dir DIR] [--mb 512] [--reps 5] [--threads 2]\n");
            return 2;
        }
    }
    if (mb < 1 || reps < 1 || reps > MAX_REPS || threads < 1) {
        fprintf(stderr, "save_pwrite: --mb >= 1, --reps 1..%d, --threads >= 1\n", MAX_REPS);
        return 2;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "save_pwrite: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    size_t n = ((size_t)mb << 20) / 4;
    float *src = malloc(n * 4);
    if (!src) return 1;
    for (size_t i = 0; i < n; i++) src[i] = (float)(i % 1009) * 0.013f - 3.0f;
    char path[4200];
    snprintf(path, sizeof path, "%s/payload.bin", dir);
    static double v[M_COUNT][MAX_REPS];
    uint32_t crc[M_COUNT] = {0};
    for (int r = 0; r < reps; r++)
        for (int m = 0; m < M_COUNT; m++)
            if ((v[m][r] = one(m, path, src, n, threads, &crc[m])) < 0) {
                fprintf(stderr, "save_pwrite: %s failed in %s\n", NAMES[m], dir);
                return 1;
            }
    if (crc[M_OLD_F32] != crc[M_NEW1_F32] || crc[M_NEW1_F32] != crc[M_NEWN_F32] || crc[M_OLD_BF16] != crc[M_NEW1_BF16] ||
        crc[M_NEW1_BF16] != crc[M_NEWN_BF16]) {
        fprintf(stderr, "save_pwrite: the CRCs differ between the ways of writing\n");
        return 1;
    }
    double med[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) {
        qsort(v[m], (size_t)reps, sizeof(double), cmp_double);
        med[m] = reps % 2 ? v[m][reps / 2] : (v[m][reps / 2 - 1] + v[m][reps / 2]) / 2;
    }
    printf("save_pwrite: %d MiB of f32 into %s, %d threads, %d alternating repetitions, medians (write + fsync)\n\n", mb,
           dir, threads, reps);
    printf("| way | GB/s | vs before | vs ceiling |\n|---|---|---|---|\n");
    for (int m = 0; m < M_COUNT; m++) {
        int bf16 = m >= M_OLD_BF16;
        double bytes = (double)n * (bf16 ? 2 : 4), before = med[bf16 ? M_OLD_BF16 : M_OLD_F32];
        /* the ceiling in the bytes of this row: the f32 ceiling's rate */
        printf("| %s | %.2f | %.2fx | %.2fx |\n", NAMES[m], bytes / med[m] / 1e9, before / med[m],
               (bytes / med[m]) / ((double)n * 4 / med[M_CEIL]));
    }
    free(src);
    rmdir(dir);
    return 0;
}
