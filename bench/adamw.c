/* The AdamW step on the CPU (kc_adamw_step: evaluated in double, rounded once) against what bounds it,
 * measured in the same run: the memory traffic of a step (read p, g, m, v; write p, m, v) and, with
 * --python, torch.optim.AdamW on one float32 tensor of the same size (foreach=False, the single-tensor
 * path, and fused=True), on the same number of threads.
 *
 *   build/bench/adamw [--numel N] [--reps R] [--threads T] [--python PY]   (defaults 16M, 9, 2)
 *
 * Prints the median seconds of each and the ratios (the floor's / ours: 1.0 is memory speed; torch's /
 * ours: above 1.0 is faster than torch), then one JSON line. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "kernels/cpu/kc.h"

#define MAX_REPS 64

typedef struct opts {
    long numel;
    int reps, threads;
    const char *python;
} opts;

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){16L << 20, 9, 2, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "adamw: %s needs a value\n", a), 2;
        if (!strcmp(a, "--numel")) o->numel = atol(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--python")) o->python = v;
        else return fprintf(stderr, "adamw: unknown option %s (--numel, --reps, --threads, --python)\n", a), 2;
        i++;
    }
    if (o->numel < 1 || o->reps < 1 || o->reps > MAX_REPS || o->threads < 1)
        return fprintf(stderr, "adamw: --numel >= 1, 1 <= --reps <= %d, --threads >= 1\n", MAX_REPS), 2;
    return 0;
}

/* The traffic of a step without its arithmetic: p, g, m, v read, p, m, v written. */
static void traffic(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, long n) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) {
        float s = g[i] * 0.0f;
        p[i] += s;
        m[i] += s;
        v[i] += s;
    }
}

/* Median seconds of torch.optim.AdamW steps on one float32 tensor of n elements (-1 on failure). */
static double torch_step(const opts *o, const char *variant) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s -c 'import torch, time\n"
             "torch.set_num_threads(%d)\n"
             "p = torch.nn.Parameter(torch.randn(%ld) * 0.02); p.grad = torch.randn(%ld) * 1e-3\n"
             "opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, %s)\n"
             "opt.step(); ts = []\n"
             "for _ in range(%d):\n"
             "    t = time.perf_counter(); opt.step(); ts.append(time.perf_counter() - t)\n"
             "print(sorted(ts)[len(ts) // 2])'",
             o->python, o->threads, o->numel, o->numel, variant, o->reps);
    FILE *f = popen(cmd, "r");
    double s = -1;
    if (!f || fscanf(f, "%lf", &s) != 1) s = -1;
    if (f && pclose(f) != 0) s = -1;
    return s;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) return 2;
    omp_set_num_threads(o.threads);
    const long n = o.numel;
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *m = malloc((size_t)n * 4), *v = malloc((size_t)n * 4);
    if (!p || !g || !m || !v) return fprintf(stderr, "adamw: out of memory for %ld elements\n", n), 1;
    uint64_t s = 1;
    for (long i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(s >> 11) / 9007199254740992.0;
        p[i] = (float)(0.04 * (u - 0.5)), g[i] = (float)(2e-3 * (0.5 - u)), m[i] = 0.1f * g[i], v[i] = 0.05f * g[i] * g[i];
    }
    const kc_adamw_hparams h = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    double ours[MAX_REPS], floor_[MAX_REPS];
    kc_adamw_step(p, g, m, v, n, &h, 1);
    traffic(p, g, m, v, n);
    for (int r = 0; r < o.reps; r++) {
        double t0 = bench_now();
        kc_adamw_step(p, g, m, v, n, &h, r + 2);
        double t1 = bench_now();
        traffic(p, g, m, v, n);
        floor_[r] = bench_now() - t1, ours[r] = t1 - t0;
    }
    const double mo = bench_median(ours, o.reps), mf = bench_median(floor_, o.reps);
    printf("adamw: %ld elements, %d threads: ours %.4f s (%.3f ns/element), memory traffic %.4f s: floor/ours %.2f\n",
           n, o.threads, mo, mo / (double)n * 1e9, mf, mf / mo);
    double ts = -1, tf = -1;
    if (o.python) {
        ts = torch_step(&o, "foreach=False");
        tf = torch_step(&o, "fused=True");
        if (ts > 0) printf("adamw: torch foreach=False %.4f s: torch/ours %.2f\n", ts, ts / mo);
        if (tf > 0) printf("adamw: torch fused=True %.4f s: torch/ours %.2f\n", tf, tf / mo);
        if (ts < 0 || tf < 0) fprintf(stderr, "adamw: a torch run failed (%s)\n", o.python);
    }
    printf("{\"numel\": %ld, \"threads\": %d, \"ours_s\": %.6g, \"floor_s\": %.6g, \"torch_single_s\": %.6g, "
           "\"torch_fused_s\": %.6g}\n", n, o.threads, mo, mf, ts, tf);
    free(p), free(g), free(m), free(v);
    return 0;
}
