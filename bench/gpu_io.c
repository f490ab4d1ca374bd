/* bench/gpu_io: init, save and load of fsdp-run against PyTorch on the same machine, in the same
 * run (issue 7). PyTorch's figures come from ../shared/bench/torch_baseline.py (--part init,
 * --part dcp), ours from fsdp-run's run reports (--report):
 *
 *   init (GPU)   init-meta on runtime.device cuda            vs  meta-device model + to_empty + init_weights
 *   init (host)  init-cpu on runtime.device cpu, all threads vs  torch CPU init (all threads)
 *   save         init-meta (cuda) + save-dcp of the weights   vs  dcp.save of the model state dict (GPU tensors)
 *   load         load-ckpt (cuda) of that checkpoint          vs  dcp.load into GPU tensors (warm page cache)
 *
 *   build/bench/gpu_io [--torch ../shared/bench/torch_baseline.py] [--bin build/fsdp-run]
 *                      [--dir /tmp/fsdp-gpu-io] [--preset llama3_1b] [--init-preset llama3_8b]
 *                      [--device cuda|cpu] [--skip-cpu-init] [--budget SECONDS]
 *
 * --budget: a run that would start after it is not run, one still running at its end is stopped, and the
 * table holds what was measured (ours first, then PyTorch's).
 *
 * Without --torch (or without a python3 that imports torch) only our figures are printed. With
 * --device cpu it runs the same stages on the host (a smoke test for machines without a GPU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

typedef struct figures {
    double init_gpu_s, init_cpu_s, save_s, load_s, save_bytes, params;
    double cpu_threads;
} figures;

/* Runs the PyTorch baseline and picks one field of the JSON line whose "figure" is `figure`. */
typedef struct torch_pick {
    const char *figure, *field;
    double value;
    int found;
} torch_pick;

static void pick_line(json_t *j, void *user) {
    torch_pick *tp = user;
    const char *f = json_string_value(json_object_get(j, "figure"));
    json_t *x = json_object_get(j, tp->field);
    if (f && !strcmp(f, tp->figure) && json_is_number(x)) {
        tp->value = json_number_value(x);
        tp->found = 1;
    }
}

/* Not started when the budget is spent; its output goes to dir/torch.log, read after it ends. */
static int torch_run(const bench_budget *b, const char *dir, const char *py, const char *args, const char *figure,
                     const char *field, double *out) {
    if (bench_budget_spent(b, figure)) return -1;
    char cmd[8192], log[4200];
    snprintf(log, sizeof log, "%s/torch.log", dir);
    snprintf(cmd, sizeof cmd, "python3 '%s' %s >'%s' 2>&1", py, args, log);
    torch_pick tp = {figure, field, 0, 0};
    int rc = bench_sh_budget(b, cmd);
    FILE *f = fopen(log, "r");
    if (f) {
        bench_json_stream(f, pick_line, &tp);
        fclose(f);
    }
    if (rc == 0 && tp.found) *out = tp.value;
    return rc == 0 && tp.found ? 0 : -1;
}

/* One of our runs within the budget: 0 when it ran and succeeded. */
static int ours_run(const bench_budget *b, const char *what, const char *cmd) {
    return bench_budget_spent(b, what) ? -1 : bench_sh_budget(b, cmd);
}

static void ratio_line(const char *what, double ours_s, double torch_s, const char *unit_note) {
    if (ours_s <= 0) {
        printf("%-34s %10s %10s %8s\n", what, "failed", "", "");
        return;
    }
    if (torch_s > 0)
        printf("%-34s %9.3fs %9.3fs %7.2fx %s\n", what, ours_s, torch_s, torch_s / ours_s, unit_note);
    else
        printf("%-34s %9.3fs %10s %8s %s\n", what, ours_s, "-", "-", unit_note);
}

int main(int argc, char **argv) {
    const char *py = NULL, *bin = "build/fsdp-run", *dir = "/tmp/fsdp-gpu-io", *preset = "llama3_1b",
               *init_preset = "llama3_8b", *device = "cuda";
    int skip_cpu_init = 0;
    double budget_s = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--skip-cpu-init")) skip_cpu_init = 1;
        else if (v && !strcmp(argv[i], "--torch")) py = v, i++;
        else if (v && !strcmp(argv[i], "--bin")) bin = v, i++;
        else if (v && !strcmp(argv[i], "--dir")) dir = v, i++;
        else if (v && !strcmp(argv[i], "--preset")) preset = v, i++;
        else if (v && !strcmp(argv[i], "--init-preset")) init_preset = v, i++;
        else if (v && !strcmp(argv[i], "--device")) device = v, i++;
        else if (v && !strcmp(argv[i], "--budget")) budget_s = atof(v), i++;
        else {
            fprintf(stderr, "usage: gpu_io [--torch torch_baseline.py] [--bin fsdp-run] [--dir DIR] [--preset P] "
                            "[--init-preset P] [--device cuda|cpu] [--skip-cpu-init] [--budget SECONDS]\n");
            return 2;
        }
    }
    char cmd[8192], path[4096], rep[4096], text[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    figures us = {0}, pt = {0};
    bench_budget budget;
    bench_budget_start(&budget, budget_s);
    int have_torch = py && bench_sh("python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (py && !have_torch) printf("gpu_io: python3 cannot import torch: no PyTorch baseline in this run\n");

    /* ---- fsdp-run ---- */
    /* init on the device (init only, the large preset) */
    snprintf(path, sizeof path, "%s/init_dev.yaml", dir);
    snprintf(text, sizeof text,
             "version: 1\nname: gpu_io_init\nruntime: {device: %s, seed: 0}\nmodel: {arch: llama3, preset: %s}\n"
             "stages:\n  - {id: warm, uses: init-meta, with: {}}\n  - {id: init, uses: init-meta}\n",
             device, init_preset);
    /* the first init-meta warms the device (context, allocator, kernels), as PyTorch's baseline does */
    if (bench_write_text(path, text)) return 1;
    snprintf(rep, sizeof rep, "%s/init_dev.json", dir);
    snprintf(cmd, sizeof cmd, "%s -q --report '%s' '%s'", bin, rep, path);
    us.init_gpu_s =
        ours_run(&budget, "fsdp-run init on the device", cmd) == 0 ? bench_stage_field(rep, "init", NULL) : -1;

    /* host init of the main preset, all threads */
    if (!skip_cpu_init) {
        snprintf(path, sizeof path, "%s/init_cpu.yaml", dir);
        snprintf(text, sizeof text,
                 "version: 1\nname: gpu_io_init_cpu\nruntime: {device: cpu, seed: 0}\n"
                 "model: {arch: llama3, preset: %s}\nstages:\n  - {id: init, uses: init-cpu}\n",
                 preset);
        if (bench_write_text(path, text)) return 1;
        snprintf(rep, sizeof rep, "%s/init_cpu.json", dir);
        snprintf(cmd, sizeof cmd, "%s -q --report '%s' '%s'", bin, rep, path);
        us.init_cpu_s =
            ours_run(&budget, "fsdp-run init on the host", cmd) == 0 ? bench_stage_field(rep, "init", NULL) : -1;
    }

    /* save of the weights from the device, then load into the device (warm page cache) */
    snprintf(path, sizeof path, "%s/save.yaml", dir);
    snprintf(text, sizeof text,
             "version: 1\nname: gpu_io_save\nruntime: {device: %s, seed: 0}\nmodel: {arch: llama3, preset: %s}\n"
             "stages:\n  - {id: init, uses: init-meta}\n  - {id: save, uses: save-dcp, with: {path: '%s/ours_dcp'}}\n",
             device, preset, dir);
    if (bench_write_text(path, text)) return 1;
    snprintf(rep, sizeof rep, "%s/save.json", dir);
    snprintf(cmd, sizeof cmd, "%s -q --report '%s' '%s'", bin, rep, path);
    if (ours_run(&budget, "fsdp-run save-dcp", cmd) == 0) {
        us.save_s = bench_stage_field(rep, "save", NULL);
        us.params = bench_stage_field(rep, "init", "params");
        snprintf(cmd, sizeof cmd, "du -sb '%s/ours_dcp' | cut -f1", dir);
        FILE *p = popen(cmd, "r");
        if (p) {
            if (fscanf(p, "%lf", &us.save_bytes) != 1) us.save_bytes = 0;
            pclose(p);
        }
    } else {
        us.save_s = -1;
    }
    snprintf(path, sizeof path, "%s/load.yaml", dir);
    snprintf(text, sizeof text,
             "version: 1\nname: gpu_io_load\nruntime: {device: %s, seed: 0}\nmodel: {arch: llama3, preset: %s}\n"
             "stages:\n  - {id: load, uses: load-ckpt, with: {path: '%s/ours_dcp'}}\n",
             device, preset, dir);
    if (bench_write_text(path, text)) return 1;
    snprintf(rep, sizeof rep, "%s/load.json", dir);
    snprintf(cmd, sizeof cmd, "%s -q --report '%s' '%s'", bin, rep, path);
    us.load_s = us.save_s > 0 && ours_run(&budget, "fsdp-run load-ckpt", cmd) == 0
                    ? bench_stage_field(rep, "load", NULL)
                    : -1;

    /* ---- PyTorch, after ours (separate processes; with a budget, ours are the figures kept) ---- */
    if (have_torch) {
        char a[1024];
        snprintf(a, sizeof a, "--part init --preset %s", init_preset);
        if (torch_run(&budget, dir, py, a, "torch_meta_init_gpu_f32", "s", &pt.init_gpu_s)) pt.init_gpu_s = -1;
        if (!skip_cpu_init) {
            snprintf(a, sizeof a, "--part init --preset %s --cpu-init", preset);
            if (torch_run(&budget, dir, py, a, "torch_cpu_init_f32", "s", &pt.init_cpu_s)) pt.init_cpu_s = -1;
            torch_run(&budget, dir, py, a, "torch_cpu_init_f32", "threads", &pt.cpu_threads);
        }
        snprintf(a, sizeof a, "--part dcp --preset %s --dir '%s/torch_dcp'", preset, dir);
        if (torch_run(&budget, dir, py, a, "torch_dcp_save", "s", &pt.save_s)) pt.save_s = -1;
        torch_run(&budget, dir, py, a, "torch_dcp_save", "bytes", &pt.save_bytes);
        double load = -1;
        if (torch_run(&budget, dir, py, a, "torch_dcp_load_warm_cache", "s", &load) == 0) pt.load_s = load;
        snprintf(cmd, sizeof cmd, "rm -rf '%s/torch_dcp'", dir);
        bench_sh(cmd);
    }

    /* ---- table ---- */
    printf("\ngpu_io: device %s; init %s, save/load %s (%.0f parameters, %.2f GB checkpoint)\n", device,
           init_preset, preset, us.params, us.save_bytes / 1e9);
    printf("%-34s %10s %10s %8s\n", "", "fsdp-run", "PyTorch", "speedup");
    char what[128];
    snprintf(what, sizeof what, "init on %s (%s)", device, init_preset);
    ratio_line(what, us.init_gpu_s, pt.init_gpu_s, "");
    if (!skip_cpu_init) {
        snprintf(what, sizeof what, "init on the host (%s)", preset);
        char note[64] = "";
        if (pt.cpu_threads > 0) snprintf(note, sizeof note, "(PyTorch %.0f threads)", pt.cpu_threads);
        ratio_line(what, us.init_cpu_s, pt.init_cpu_s, note);
    }
    char note[128];
    snprintf(note, sizeof note, "ours %.2f GB/s, PyTorch %.2f GB/s", us.save_s > 0 ? us.save_bytes / us.save_s / 1e9 : 0,
             pt.save_s > 0 ? pt.save_bytes / pt.save_s / 1e9 : 0);
    snprintf(what, sizeof what, "save-dcp (%s weights)", preset);
    ratio_line(what, us.save_s, pt.save_s, note);
    snprintf(note, sizeof note, "ours %.2f GB/s, PyTorch %.2f GB/s", us.load_s > 0 ? us.save_bytes / us.load_s / 1e9 : 0,
             pt.load_s > 0 ? pt.save_bytes / pt.load_s / 1e9 : 0);
    snprintf(what, sizeof what, "load-ckpt (%s, warm cache)", preset);
    ratio_line(what, us.load_s, pt.load_s, note);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/ours_dcp'", dir);
    bench_sh(cmd);
    int failed = us.init_gpu_s <= 0 || us.save_s <= 0 || us.load_s <= 0 || (!skip_cpu_init && us.init_cpu_s <= 0);
    return failed ? 1 : 0;
}
