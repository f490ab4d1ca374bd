/* bench/gpu_train: training throughput and numerics of fsdp-run against PyTorch FSDP2 (eager and
 * torch.compile) on the same GPU, in the same run, from the same initial weights and token stream
 * (issue 8). PyTorch runs ../shared/bench/torch_baseline.py --part train; fsdp-run runs
 * load-ckpt + train-steps on runtime.device cuda with `mixed: bf16`.
 *
 *   build/bench/gpu_train [--torch ../shared/bench/torch_baseline.py] [--bin build/fsdp-run]
 *       [--dir /tmp/fsdp-gpu-train] [--preset llama3_1b] [--batch 4] [--seq 2048] [--steps 20]
 *       [--mixed bf16|none] [--ac none|full|selective] [--skip-eager] [--skip-compile] [--device cuda|cpu]
 *       [--budget SECONDS]
 *
 * --budget: fsdp-run runs first, then PyTorch eager, then compiled; a side that would start after the
 * budget is not run, one still running at its end is stopped, and the table holds what was measured.
 *
 * Both sides: AdamW lr 3e-4 constant, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, gradient
 * clipping at 1.0, world of 1; step s reads the s-th block of batch x (seq + 1) tokens of one
 * uint32 stream (data.order: sequential). Step time: the median of the steps after the fifth.
 * The last-20-steps mean loss of both is printed with their relative difference (run with
 * --steps 200 for the numerics check). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

typedef struct result {
    int ok;
    double step_s, tokens_per_s, mfu, peak_gib, last20_loss, first_loss;
} result;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of v[from..n) */
static double median_from(double *v, int n, int from) {
    if (from >= n) from = n - 1;
    if (from < 0) return -1;
    qsort(v + from, (size_t)(n - from), sizeof *v, cmp_d);
    return v[from + (n - from) / 2];
}

static void train_line(json_t *j, void *user) {
    result *r = user;
    const char *f = json_string_value(json_object_get(j, "figure"));
    if (!f || strcmp(f, "torch_fsdp2_train")) return;
    r->ok = 1;
    r->step_s = json_number_value(json_object_get(j, "median_step_s"));
    r->tokens_per_s = json_number_value(json_object_get(j, "tokens_per_s"));
    r->mfu = json_number_value(json_object_get(j, "mfu"));
    r->peak_gib = json_number_value(json_object_get(j, "peak_mem_gib"));
    r->last20_loss = json_number_value(json_object_get(j, "last20_mean_loss"));
}

/* PyTorch's side, its output in out (read after it ends: it may be stopped at the budget's end) */
static int torch_train(const bench_budget *b, const char *py, const char *args, const char *out, result *r) {
    char cmd[12000];
    snprintf(cmd, sizeof cmd, "python3 '%s' --part train %s >'%s' 2>&1", py, args, out);
    int rc = bench_sh_budget(b, cmd);
    FILE *f = fopen(out, "r");
    if (f) {
        bench_json_stream(f, train_line, r);
        fclose(f);
    }
    if (rc) r->ok = 0;
    return rc == 0 && r->ok ? 0 : -1;
}

/* number field of a JSON object, trying several names; NAN when none is there */
static double num_any(json_t *o, const char *const *names) {
    for (; *names; names++) {
        json_t *x = json_object_get(o, *names);
        if (json_is_number(x)) return json_number_value(x);
    }
    return NAN;
}

/* our metrics JSONL (one line per step) and run report */
static int ours_parse(const char *metrics, const char *report, int B, int T, result *r) {
    FILE *f = fopen(metrics, "r");
    if (!f) {
        perror(metrics);
        return -1;
    }
    double *dt = NULL, *loss = NULL, prev = 0;
    int n = 0, cap = 0;
    char line[8192];
    static const char *const step_names[] = {"step_s", NULL};
    static const char *const el_names[] = {"elapsed_s", NULL};
    static const char *const mfu_names[] = {"mfu", NULL};
    static const char *const peak_mib[] = {"peak_device_mem_mib", "peak_rss_mib", NULL};
    double peak = NAN;
    double mfu_sum = 0;
    int mfu_n = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            double *a = realloc(dt, (size_t)cap * sizeof *a), *b = realloc(loss, (size_t)cap * sizeof *b);
            if (a) dt = a;
            if (b) loss = b;
            if (!a || !b) {
                json_decref(j);
                break;
            }
        }
        double s = num_any(j, step_names), el = num_any(j, el_names);
        if (isnan(s)) s = el - prev;
        prev = el;
        dt[n] = s;
        loss[n] = json_number_value(json_object_get(j, "loss"));
        double m = num_any(j, mfu_names); /* percent, as torchtitan logs it */
        if (!isnan(m) && n >= 5) mfu_sum += m / 100.0, mfu_n++;
        double pk = num_any(j, peak_mib);
        if (!isnan(pk) && (isnan(peak) || pk > peak)) peak = pk;
        n++;
        json_decref(j);
    }
    fclose(f);
    if (n == 0) {
        free(dt);
        free(loss);
        fprintf(stderr, "gpu_train: no steps in %s\n", metrics);
        return -1;
    }
    double tail = 0;
    int k0 = n > 20 ? n - 20 : 0;
    for (int k = k0; k < n; k++) tail += loss[k];
    r->last20_loss = tail / (n - k0);
    r->first_loss = loss[0];
    r->step_s = median_from(dt, n, 5);
    r->tokens_per_s = (double)B * T / r->step_s;
    r->mfu = mfu_n ? mfu_sum / mfu_n : NAN;
    free(dt);
    free(loss);
    /* peak memory: the largest per-step figure (device memory on the GPU, RSS on the CPU) */
    (void)report;
    r->peak_gib = peak / 1024.0;
    r->ok = 1;
    return 0;
}

/* a uint32 stream of `n` tokens in [0, vocab) from splitmix64 (seeded) */
static int write_tokens(const char *path, size_t n, uint32_t vocab) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint64_t x = 0x5eed;
    uint32_t buf[4096];
    for (size_t done = 0; done < n;) {
        size_t m = n - done < 4096 ? n - done : 4096;
        for (size_t i = 0; i < m; i++) {
            uint64_t z = (x += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            buf[i] = (uint32_t)((z ^ (z >> 31)) % vocab);
        }
        if (fwrite(buf, sizeof *buf, m, f) != m) {
            fclose(f);
            return -1;
        }
        done += m;
    }
    return fclose(f);
}

static void row(const char *name, const result *r, const result *ours) {
    if (!r->ok) {
        printf("%-22s %12s\n", name, "failed / not run");
        return;
    }
    printf("%-22s %9.1f k %9.4f s %7.1f%% %8.1f GiB %10.4f", name, r->tokens_per_s / 1e3, r->step_s, 100 * r->mfu,
           r->peak_gib, r->last20_loss);
    if (ours && ours->ok && ours != r)
        printf("   ours/this %.2fx tokens/s, loss diff %+.2f%%", ours->tokens_per_s / r->tokens_per_s,
               100 * (ours->last20_loss - r->last20_loss) / r->last20_loss);
    printf("\n");
}

int main(int argc, char **argv) {
    const char *py = NULL, *bin = "build/fsdp-run", *dir = "/tmp/fsdp-gpu-train", *preset = "llama3_1b",
               *mixed = "bf16", *ac = "none", *device = "cuda";
    int B = 4, T = 2048, steps = 20, skip_eager = 0, skip_compile = 0;
    double budget_s = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--skip-eager")) skip_eager = 1;
        else if (!strcmp(argv[i], "--skip-compile")) skip_compile = 1;
        else if (v && !strcmp(argv[i], "--torch")) py = v, i++;
        else if (v && !strcmp(argv[i], "--bin")) bin = v, i++;
        else if (v && !strcmp(argv[i], "--dir")) dir = v, i++;
        else if (v && !strcmp(argv[i], "--preset")) preset = v, i++;
        else if (v && !strcmp(argv[i], "--mixed")) mixed = v, i++;
        else if (v && !strcmp(argv[i], "--ac")) ac = v, i++;
        else if (v && !strcmp(argv[i], "--device")) device = v, i++;
        else if (v && !strcmp(argv[i], "--batch")) B = atoi(v), i++;
        else if (v && !strcmp(argv[i], "--seq")) T = atoi(v), i++;
        else if (v && !strcmp(argv[i], "--steps")) steps = atoi(v), i++;
        else if (v && !strcmp(argv[i], "--budget")) budget_s = atof(v), i++;
        else {
            fprintf(stderr, "usage: gpu_train [--torch torch_baseline.py] [--bin fsdp-run] [--dir DIR] [--preset P] "
                            "[--batch B] [--seq T] [--steps N] [--mixed bf16|none] [--ac none|full|selective] [--skip-eager] "
                            "[--skip-compile] [--device cuda|cpu] [--budget SECONDS]\n");
            return 2;
        }
    }
    if (B <= 0 || T <= 0 || steps <= 0) {
        fprintf(stderr, "gpu_train: batch, seq and steps must be positive\n");
        return 2;
    }
    bench_budget budget;
    bench_budget_start(&budget, budget_s);
    char cmd[8192], path[4096], text[8192], w[4096], toks[4096], metrics[4096], rep[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    snprintf(w, sizeof w, "%s/init.safetensors", dir);
    snprintf(toks, sizeof toks, "%s/tokens.u32", dir);

    /* the initial weights (our init, torchtitan names) and the token stream, shared by both */
    snprintf(path, sizeof path, "%s/make_init.yaml", dir);
    snprintf(text, sizeof text,
             "version: 1\nname: gpu_train_init\nruntime: {device: %s, seed: 0}\nmodel: {arch: llama3, preset: %s}\n"
             "stages:\n  - {id: init, uses: init-meta}\n  - {id: save, uses: save-safetensors, with: {path: '%s'}}\n",
             device, preset, w);
    if (bench_write_text(path, text)) return 1;
    snprintf(cmd, sizeof cmd, "%s -q '%s'", bin, path);
    if (bench_sh(cmd)) return 1;
    /* vocabulary of the preset, from the checkpoint inspector's shape of tok_embeddings */
    uint32_t vocab = 0;
    snprintf(cmd, sizeof cmd, "%s ckpt inspect '%s' | grep tok_embeddings.weight | head -1", bin, w);
    FILE *p = popen(cmd, "r");
    if (p) {
        char line[1024];
        if (fgets(line, sizeof line, p)) {
            char *br = strchr(line, '[');
            if (br) vocab = (uint32_t)strtoul(br + 1, NULL, 10);
        }
        pclose(p);
    }
    if (vocab == 0) {
        fprintf(stderr, "gpu_train: cannot read the vocabulary size of %s\n", w);
        return 1;
    }
    if (write_tokens(toks, (size_t)steps * (size_t)B * (size_t)(T + 1), vocab)) return 1;

    /* ---- fsdp-run first (with a budget, the figure kept when PyTorch's are cut off) ---- */
    result eager = {0}, compiled = {0}, ours = {0};
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(rep, sizeof rep, "%s/report.json", dir);
    snprintf(path, sizeof path, "%s/train.yaml", dir);
    snprintf(text, sizeof text,
             "version: 1\nname: gpu_train\nruntime: {device: %s, seed: 0}\nmodel: {arch: llama3, preset: %s}\n"
             "data: {kind: tokens, path: '%s', dtype: uint32, order: sequential, batch_size: %d, seq_len: %d}\n"
             "stages:\n  - {id: load, uses: load-ckpt, with: {path: '%s'}}\n"
             "  - id: train\n    uses: train-steps\n"
             "    with: {steps: %d, lr: 3e-4, warmup_steps: 0, decay: none, betas: [0.9, 0.95], eps: 1e-8,\n"
             "           weight_decay: 0.1, max_grad_norm: 1.0, log_every: 1, metrics: '%s', mixed: %s, ac: %s}\n",
             device, preset, toks, B, T, w, steps, metrics, mixed, ac);
    if (bench_write_text(path, text)) return 1;
    snprintf(cmd, sizeof cmd, "%s -q --report '%s' '%s'", bin, rep, path);
    if (!bench_budget_spent(&budget, "fsdp-run")) {
        int rc = bench_sh_budget(&budget, cmd);
        int stopped = rc != 0 && bench_budget_spent(&budget, "the rest of fsdp-run's steps");
        if (stopped) printf("gpu_train: fsdp-run's figures are those of the steps it ran before the budget's end\n");
        if (rc == 0 || stopped) ours_parse(metrics, rep, B, T, &ours);
    }

    /* ---- PyTorch ---- */
    int have_torch = py && bench_sh("python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (py && !have_torch) printf("gpu_train: python3 cannot import torch: no PyTorch baseline in this run\n");
    char a[8192];
    /* the baseline script knows none and full: `--ac selective` compares against PyTorch without
     * checkpointing (selective recomputes no GEMM, so that is the step time it should approach) */
    snprintf(a, sizeof a, "--preset %s --batch %d --seq %d --steps %d --lr 3e-4 --init '%s' --tokens '%s'%s", preset, B,
             T, steps, w, toks, strcmp(ac, "full") ? "" : " --ac full");
    char tout[4200];
    snprintf(tout, sizeof tout, "%s/torch_eager.log", dir);
    if (have_torch && !skip_eager && !bench_budget_spent(&budget, "PyTorch FSDP2 eager"))
        torch_train(&budget, py, a, tout, &eager);
    if (have_torch && !skip_compile && !bench_budget_spent(&budget, "PyTorch FSDP2 compile")) {
        char ac2[8300];
        snprintf(ac2, sizeof ac2, "%s --compile", a);
        snprintf(tout, sizeof tout, "%s/torch_compile.log", dir);
        torch_train(&budget, py, ac2, tout, &compiled);
    }

    /* ---- table ---- */
    printf("\ngpu_train: %s, batch %d x %d tokens, %d steps, world 1, mixed %s, ac %s (median step after the 5th)\n",
           preset, B, T, steps, mixed, ac);
    printf("%-22s %11s %11s %8s %12s %10s\n", "", "tokens/s", "step", "MFU", "peak mem", "loss(20)");
    row("fsdp-run", &ours, NULL);
    row("PyTorch FSDP2 eager", &eager, &ours);
    row("PyTorch FSDP2 compile", &compiled, &ours);
    snprintf(cmd, sizeof cmd, "rm -f '%s' '%s'", w, toks);
    bench_sh(cmd);
    return ours.ok ? 0 : 1;
}
