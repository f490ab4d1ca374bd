/* bench/ckpt_lifecycle: what periodic saves cost the training loop. For debugmodel states of L and 2L
 * layers it times (best of --reps, the train-steps stage from the run report) --steps steps with no
 * save, with a synchronous save every --every steps, and with save_async: true (one save in flight,
 * committed as soon as written; keep_last: 2 in both), and prints sync/none and async/none per size,
 * all measured in the same run: async/none near 1 means the writes are hidden behind the steps (on a
 * CPU run the writer thread competes with the step's threads for the same cores).
 *
 *   build/bench/ckpt_lifecycle [--dir DIR] [--bin build/fsdp-run] [--layers L] [--steps N] [--every N] [--reps N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static double best_train(const char *bin, const char *recipe, const char *dir, int layers, const char *mode, int reps) {
    char cmd[9000], rep[4300];
    snprintf(rep, sizeof rep, "%s/report.json", dir);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s/ck'", dir);
        bench_sh(cmd);
        snprintf(cmd, sizeof cmd, "%s -q --report %s %s --set model.n_layers=%d --set vars.dir=%s/ck %s", bin, rep,
                 recipe, layers, dir, mode);
        if (bench_sh(cmd)) return -1;
        double t = bench_stage_field(rep, "t", NULL);
        if (t > 0 && t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/fsdp-ckpt-lifecycle", *bin = "build/fsdp-run";
    int layers = 2, reps = 2, steps = 12, every = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--every")) every = atoi(argv[i + 1]);
    }
    char cmd[8400], recipe[4300], text[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    snprintf(recipe, sizeof recipe, "%s/train.yaml", dir);
    snprintf(text, sizeof text,
             "model: {preset: debugmodel}\nvars: {dir: x}\n"
             "data: {kind: text, path: data/quickstart.txt, batch_size: 2, seq_len: 64}\nstages:\n"
             "  - {id: i, uses: init-meta}\n"
             "  - {id: t, uses: train-steps, after: [i], with: {steps: %d, save_every: 0, save_path: \"${dir}\", "
             "keep_last: 2, save_async: false}}\n",
             steps);
    if (bench_write_text(recipe, text)) return 1;
    char sync_mode[128], async_mode[160];
    snprintf(sync_mode, sizeof sync_mode, "--set stages.t.with.save_every=%d", every);
    snprintf(async_mode, sizeof async_mode, "%s --set stages.t.with.save_async=true", sync_mode);
    const char *modes[3] = {"", sync_mode, async_mode};
    printf("ckpt_lifecycle: debugmodel, %d train steps: no save / a save every %d steps / an async save every %d "
           "steps (best of %d)\n", steps, every, every, reps);
    for (int k = 0, l = layers; k < 2; k++, l *= 2) {
        double t[3];
        for (int m = 0; m < 3; m++)
            if ((t[m] = best_train(bin, recipe, dir, l, modes[m], reps)) < 0) return 1;
        printf("layers %3d: sync/none %.2f  async/none %.2f  async/sync %.2f\n", l, t[1] / t[0], t[2] / t[0],
               t[2] / t[1]);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_sh(cmd);
    return 0;
}
