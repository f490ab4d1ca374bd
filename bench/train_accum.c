/* Gradient accumulation: the same global batch trained as 1, 2, 4 and 8 micro-batches per optimizer
 * step (train-steps grad_accum) through fsdp-run on the CPU path. For each N the run's tokens/s and
 * peak RSS (its report) are printed with their ratios to N = 1 measured in the same run: tokens/s
 * should stay about the same (accumulation adds one pass of all-gathers per micro-batch, no extra
 * FLOPs), and the peak memory falls as a micro-batch's activations shrink, down to the accumulator
 * (one float32 copy of every layer's gradient).
 *
 *   build/bench/train_accum [--bin build/fsdp-run] [--dir DIR] [--batch B] [--seq T] [--steps S]
 *       (defaults: the debugmodel preset, batch 32 x 256 tokens, 4 steps)
 * The last line is JSON: every N with tokens_per_s, peak_rss_mib and the ratios. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static int run_case(const char *bin, const char *dir, int batch, int seq, int steps, int n, double *tps,
                    double *rss) {
    char recipe[4096], report[4096], text[2048], cmd[8192];
    snprintf(recipe, sizeof recipe, "%s/accum-%d.yaml", dir, n);
    snprintf(report, sizeof report, "%s/accum-%d.json", dir, n);
    snprintf(text, sizeof text,
             "model: {preset: debugmodel}\n"
             "data: {kind: synthetic, batch_size: %d, seq_len: %d}\n"
             "stages:\n  - {id: i, uses: init-meta}\n"
             "  - {id: t, uses: train-steps, with: {steps: %d, grad_accum: %d}}\n",
             batch, seq, steps, n);
    if (bench_write_text(recipe, text)) return -1;
    snprintf(cmd, sizeof cmd, "%s -q %s --report %s", bin, recipe, report);
    if (bench_sh(cmd)) return -1;
    *tps = bench_stage_field(report, "t", "tokens_per_s");
    *rss = bench_stage_field(report, "t", "peak_rss_mib");
    return *tps > 0 && *rss > 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *bin = "build/fsdp-run", *dir = "/tmp/fsdp-bench-accum";
    int batch = 32, seq = 256, steps = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "train_accum: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (batch < 8 || batch % 8 || seq < 1 || steps < 1) {
        fprintf(stderr, "train_accum: --batch must be a positive multiple of 8, --seq and --steps positive\n");
        return 2;
    }
    char mk[4200];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", dir);
    if (bench_sh(mk)) return 1;
    const int ns[] = {1, 2, 4, 8};
    double tps[4], rss[4];
    for (int k = 0; k < 4; k++) {
        if (run_case(bin, dir, batch, seq, steps, ns[k], &tps[k], &rss[k])) {
            fprintf(stderr, "train_accum: grad_accum %d failed\n", ns[k]);
            return 1;
        }
        printf("grad_accum %d (%d rows per micro-batch): %.0f tokens/s (x%.2f of grad_accum 1), peak RSS %.1f MiB "
               "(x%.2f)\n",
               ns[k], batch / ns[k], tps[k], tps[k] / tps[0], rss[k], rss[k] / rss[0]);
    }
    printf("{\"batch\": %d, \"seq\": %d, \"cases\": [", batch, seq);
    for (int k = 0; k < 4; k++)
        printf("%s{\"grad_accum\": %d, \"tokens_per_s\": %.1f, \"peak_rss_mib\": %.1f, \"tps_ratio\": %.3f, "
               "\"rss_ratio\": %.3f}",
               k ? ", " : "", ns[k], tps[k], rss[k], tps[k] / tps[0], rss[k] / rss[0]);
    printf("]}\n");
    return 0;
}
