/* HSDP against 1-D FSDP (runtime.mesh, runtime/mesh.h) on this machine and on paper.
 *
 * Measured: the quickstart model (recipes/quickstart.yaml's: dim 128, 4 layers, global batch 8 x 128
 * tokens) through fsdp-run on 4 ranks split into two fake nodes of 2 (--fake-nodes 2): 1-D FSDP (every
 * parameter sharded over the 4 ranks, so every collective crosses the nodes) and HSDP 2 x 2 (sharded
 * inside a node, replicated across the two), alternating in each repetition, medians. Prints the step
 * time and the bytes each rank sends per step inside a node and across nodes (the run report's
 * bytes_sent_*_per_step: a ring's share of every collective's payload), and the same bytes computed from
 * the schedule, which the measurement checks.
 *
 * On paper: Llama 3 8B on 8 nodes x 8 GPUs, mixed bf16 (bf16 all-gathers, f32 reduce-scatters and
 * all-reduces), the schedule of the GPU step (every block gathered in the forward and again in the
 * backward, embedding / norm / output once, one reduce-scatter of every gradient; HSDP adds one f32
 * all-reduce of each reduced shard over the 8 replicas). Assumptions, stated: NVLink 450 GB/s per GPU
 * inside a node, 50 GB/s per GPU across nodes, and a collective whose group spans nodes moves all its
 * bytes at the inter-node rate; compute, latency and overlap are left out.
 *
 *   build/bench/hsdp [--bin build/fsdp-run] [--dir DIR] [--steps 20] [--reps 3] [--threads 2]
 * The last line is JSON with every figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

typedef struct bcase {
    const char *name, *mesh; /* runtime.mesh ("": 1-D) */
    double ms[32], intra, inter;
} bcase;

static int run_case(const char *bin, const char *dir, int steps, int threads, bcase *c, int rep) {
    char recipe[4096], report[4096], text[4096], cmd[12288];
    snprintf(recipe, sizeof recipe, "%s/%s.yaml", dir, c->name);
    snprintf(report, sizeof report, "%s/%s.json", dir, c->name);
    snprintf(text, sizeof text,
             "runtime: {device: cpu, seed: 0, threads: %d%s%s}\n"
             "model: {arch: llama3, preset: tiny, dim: 128, n_layers: 4, n_heads: 8, n_kv_heads: 4, max_seq_len: 128}\n"
             "data: {kind: synthetic, batch_size: 8, seq_len: 128}\n"
             "stages:\n  - {id: i, uses: init-meta}\n"
             "  - {id: w, uses: train-steps, with: {steps: 2}}\n"
             "  - {id: t, uses: train-steps, with: {steps: %d}}\n",
             threads / 4 > 0 ? threads / 4 : 1, *c->mesh ? ", mesh: " : "", c->mesh, steps + 2);
    if (bench_write_text(recipe, text)) return -1;
    snprintf(cmd, sizeof cmd, "mpirun --oversubscribe --bind-to none -np 4 %s %s --fake-nodes 2 -q %s --report %s",
             geteuid() == 0 ? "--allow-run-as-root" : "", bin, recipe, report);
    if (bench_sh(cmd)) return -1;
    double tps = bench_stage_field(report, "t", "tokens_per_s");
    c->intra = bench_stage_field(report, "t", "bytes_sent_intra_node_per_step");
    c->inter = bench_stage_field(report, "t", "bytes_sent_inter_node_per_step");
    if (!(tps > 0)) return -1;
    c->ms[rep] = 1e3 * (8.0 * 128.0) / tps;
    return 0;
}

/* What the schedule sends per rank and step, by the ring model: an all-gather or reduce-scatter over n
 * ranks sends (n-1)/n of its payload, an all-reduce twice that. blocks: elements of the blocks (gathered
 * twice), rest: of embedding, norm and output (gathered once); gb, rb: bytes per element of the gathers
 * and of the reductions; R x S the mesh (R = 1: 1-D over S). */
typedef struct sched_bytes {
    double intra, inter;
} sched_bytes;

static sched_bytes schedule(double blocks, double rest, double gb, double rb, int R, int S, int spans_shard) {
    double total = blocks + rest;
    double ag = (2 * blocks + rest) * gb * (S - 1) / S, rs = total * rb * (S - 1) / S;
    double ar = R > 1 ? 2.0 * (total / S) * rb * (R - 1) / R : 0;
    sched_bytes b = {0, 0};
    if (spans_shard) b.inter += ag + rs;
    else b.intra += ag + rs;
    b.inter += ar;
    return b;
}

int main(int argc, char **argv) {
    const char *bin = "build/fsdp-run", *dir = "/tmp/fsdp-bench-hsdp";
    int steps = 20, reps = 3, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "hsdp: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || reps < 1 || reps > 32 || threads < 1) {
        fprintf(stderr, "hsdp: --steps, --threads >= 1 and --reps 1..32\n");
        return 2;
    }
    char mk[4200];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", dir);
    if (bench_sh(mk)) return 1;
    bcase cs[] = {{"fsdp_1d", "", {0}, 0, 0}, {"hsdp_2x2", "{replicate: 2, shard: 2}", {0}, 0, 0}};
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++)
            if (run_case(bin, dir, steps, threads, &cs[k], r)) return 1;
    /* the quickstart model: 4 blocks of 4 x 128 x 128 (attention: wq, wo; wk, wv 64 rows) + 3 x 128 x 352
     * (ffn) + 2 x 128 (norms); embedding and output 256 x 128 each (tiny preset's vocab), final norm 128 */
    const double qblock = 4 * (2.0 * 128 * 128 + 2.0 * 64 * 128 + 3.0 * 128 * 352 + 2 * 128);
    const double qrest = 2.0 * 256 * 128 + 128;
    sched_bytes q1 = schedule(qblock, qrest, 4, 4, 1, 4, 1), q2 = schedule(qblock, qrest, 4, 4, 2, 2, 0);
    printf("measured (4 ranks on 2 fake nodes, %d steps, median of %d):\n", steps, reps);
    double m[2];
    for (int k = 0; k < 2; k++) {
        m[k] = bench_median(cs[k].ms, reps);
        sched_bytes s = k ? q2 : q1;
        printf("  %-9s %8.2f ms/step  sent per rank and step: %9.0f B inside a node, %9.0f B across nodes "
               "(schedule: %9.0f, %9.0f)\n",
               cs[k].name, m[k], cs[k].intra, cs[k].inter, s.intra, s.inter);
    }
    printf("  HSDP 2 x 2 / 1-D: step time %.3f, inter-node bytes %.3f\n", m[1] / m[0], cs[1].inter / cs[0].inter);
    /* Llama 3 8B: 32 blocks of 218,112,000 (attention 4096 x 4096 x 2 + 1024 x 4096 x 2, ffn 3 x 4096 x
     * 14336, 2 norms); embedding and output 128256 x 4096 each, final norm 4096 */
    const double lblock = 32 * (2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 4096 * 14336 + 2 * 4096);
    const double lrest = 2.0 * 128256 * 4096 + 4096;
    const double nvl = 450e9, ib = 50e9;
    sched_bytes l1 = schedule(lblock, lrest, 2, 4, 1, 64, 1), l2 = schedule(lblock, lrest, 2, 4, 8, 8, 0);
    double t1 = l1.intra / nvl + l1.inter / ib, t2 = l2.intra / nvl + l2.inter / ib;
    printf("on paper: Llama 3 8B (%.3g parameters), 8 nodes x 8 GPUs, mixed bf16; NVLink 450 GB/s, 50 GB/s "
           "across nodes per GPU:\n",
           lblock + lrest);
    printf("  1-D FSDP over 64: %.2f GB inside a node, %.2f GB across nodes per GPU and step: %.3f s of transfers\n",
           l1.intra / 1e9, l1.inter / 1e9, t1);
    printf("  HSDP 8 x 8:       %.2f GB inside a node, %.2f GB across nodes (the f32 all-reduce of one 1/8 shard): "
           "%.3f s\n",
           l2.intra / 1e9, l2.inter / 1e9, t2);
    printf("  HSDP / 1-D: inter-node bytes %.3f, transfer time %.3f\n", l2.inter / l1.inter, t2 / t1);
    printf("{\"steps\": %d, \"reps\": %d, \"threads\": %d, \"fsdp_1d_ms\": %.3f, \"hsdp_2x2_ms\": %.3f, "
           "\"hsdp_over_1d_time\": %.4f, \"fsdp_1d_intra_bytes\": %.0f, \"fsdp_1d_inter_bytes\": %.0f, "
           "\"hsdp_intra_bytes\": %.0f, \"hsdp_inter_bytes\": %.0f, \"paper_8b_1d_inter_gb\": %.3f, "
           "\"paper_8b_hsdp_intra_gb\": %.3f, \"paper_8b_hsdp_inter_gb\": %.3f, \"paper_8b_1d_s\": %.4f, "
           "\"paper_8b_hsdp_s\": %.4f}\n",
           steps, reps, threads, m[0], m[1], m[1] / m[0], cs[0].intra, cs[0].inter, cs[1].intra, cs[1].inter,
           l1.inter / 1e9, l2.intra / 1e9, l2.inter / 1e9, t1, t2);
    return 0;
}
