/* Collectives per block against per parameter: the quickstart model's training step (recipes/
 * quickstart.yaml's model: dim 128, 4 layers, global batch 8 x 128 tokens) through fsdp-run on 1 rank
 * and on 2 ranks (mpirun), with train-steps flat_collectives true (one all-gather and one
 * reduce-scatter per block) and false (one per parameter), alternating in each repetition, medians.
 * The cores are split between the ranks: 1 rank runs `threads` OpenMP threads, each of 2 ranks half
 * of them. Prints steps/s of every case, the 2-rank / 1-rank ratio of each path (> 1: 2 ranks are
 * faster) and flat / per-parameter, and the collectives per step (the run report's metric).
 *
 *   build/bench/fsdp_flat [--bin build/fsdp-run] [--dir DIR] [--steps 40] [--reps 3] [--threads 2]
 *       [--layers 4]
 * The last line is JSON with every figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

typedef struct bcase {
    const char *name;
    int ranks, flat;
    double sps[32], coll;
} bcase;

static int run_case(const char *bin, const char *dir, int layers, int steps, int threads, bcase *c, int rep) {
    char recipe[4096], report[4096], text[4096], cmd[12288], prefix[256] = "";
    snprintf(recipe, sizeof recipe, "%s/%s.yaml", dir, c->name);
    snprintf(report, sizeof report, "%s/%s.json", dir, c->name);
    snprintf(text, sizeof text,
             "runtime: {device: cpu, seed: 0, threads: %d}\n"
             "model: {arch: llama3, preset: tiny, dim: 128, n_layers: %d, n_heads: 8, n_kv_heads: 4, max_seq_len: 128}\n"
             "data: {kind: synthetic, batch_size: 8, seq_len: 128}\n"
             "stages:\n  - {id: i, uses: init-meta}\n"
             "  - {id: w, uses: train-steps, with: {steps: 2, flat_collectives: %s}}\n"
             "  - {id: t, uses: train-steps, with: {steps: %d, flat_collectives: %s}}\n",
             c->ranks > 1 ? (threads / c->ranks > 0 ? threads / c->ranks : 1) : threads, layers,
             c->flat ? "true" : "false", steps + 2, c->flat ? "true" : "false");
    if (bench_write_text(recipe, text)) return -1;
    if (c->ranks > 1)
        snprintf(prefix, sizeof prefix, "mpirun --oversubscribe --bind-to none -np %d %s", c->ranks,
                 geteuid() == 0 ? "--allow-run-as-root" : "");
    snprintf(cmd, sizeof cmd, "%s %s -q %s --report %s", prefix, bin, recipe, report);
    if (bench_sh(cmd)) return -1;
    double tps = bench_stage_field(report, "t", "tokens_per_s");
    c->coll = bench_stage_field(report, "t", "collectives_per_step");
    if (!(tps > 0)) return -1;
    c->sps[rep] = tps / (8.0 * 128.0);
    return 0;
}

int main(int argc, char **argv) {
    const char *bin = "build/fsdp-run", *dir = "/tmp/fsdp-bench-flat";
    int steps = 40, reps = 3, threads = 2, layers = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "fsdp_flat: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || reps < 1 || reps > 32 || threads < 1 || layers < 1) {
        fprintf(stderr, "fsdp_flat: --steps, --threads, --layers >= 1 and --reps 1..32\n");
        return 2;
    }
    char mk[4200];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", dir);
    if (bench_sh(mk)) return 1;
    bcase cs[] = {{"one_flat", 1, 1, {0}, 0}, {"two_flat", 2, 1, {0}, 0}, {"one_param", 1, 0, {0}, 0},
                  {"two_param", 2, 0, {0}, 0}};
    const int nc = (int)(sizeof cs / sizeof *cs);
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < nc; k++)
            if (run_case(bin, dir, layers, steps, threads, &cs[k], r)) return 1;
    double m[4];
    for (int k = 0; k < nc; k++) {
        m[k] = bench_median(cs[k].sps, reps);
        printf("%-10s %d rank%s %-14s %8.2f steps/s  %5.0f collectives/step\n", cs[k].name, cs[k].ranks,
               cs[k].ranks > 1 ? "s" : " ", cs[k].flat ? "per block" : "per parameter", m[k], cs[k].coll);
    }
    double r_flat = m[1] / m[0], r_param = m[3] / m[2], flat_vs_param = m[1] / m[3];
    printf("2 ranks / 1 rank (steps/s): per block %.3f, per parameter %.3f; 2 ranks per block / per parameter %.3f\n",
           r_flat, r_param, flat_vs_param);
    printf("{\"layers\": %d, \"steps\": %d, \"reps\": %d, \"threads\": %d, \"one_rank_sps\": %.4f, "
           "\"two_ranks_flat_sps\": %.4f, \"one_rank_param_sps\": %.4f, \"two_ranks_param_sps\": %.4f, "
           "\"two_over_one_flat\": %.4f, \"two_over_one_param\": %.4f, \"flat_over_param_2ranks\": %.4f, "
           "\"collectives_flat\": %.0f, \"collectives_param\": %.0f}\n",
           layers, steps, reps, threads, m[0], m[1], m[2], m[3], r_flat, r_param, flat_vs_param, cs[1].coll, cs[3].coll);
    return 0;
}
