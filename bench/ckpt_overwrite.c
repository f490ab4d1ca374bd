/* bench/ckpt_overwrite: what the atomic replacement of a checkpoint costs. For debugmodel states of
 * L, 2L, 4L, 8L layers it times (best of --reps, from the run report) a save-dcp into an empty
 * directory and a save-dcp overwrite: true over the checkpoint of the previous save (new data files
 * beside the old ones, .metadata renamed, the old files removed: ckpt/dcp_commit.c), and prints
 * overwrite/fresh per size and time(2n)/time(n) per doubling (~2 = linear), all measured in the
 * same run. The peak directory size of an overwrite (old + new generation) is the old checkpoint
 * plus the new one.
 *
 *   build/bench/ckpt_overwrite [--dir DIR] [--bin build/fsdp-run] [--layers L] [--reps N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static double best_save(const char *bin, const char *recipe, const char *dir, const char *ck, int layers, int fresh,
                        int reps) {
    char cmd[9000], rep[4300];
    snprintf(rep, sizeof rep, "%s/report.json", dir);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        if (fresh) {
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck);
            bench_sh(cmd);
        }
        bench_sh("sync");
        snprintf(cmd, sizeof cmd, "%s -q --report %s %s --set model.n_layers=%d --set vars.out=%s", bin, rep, recipe,
                 layers, ck);
        if (bench_sh(cmd)) return -1;
        double t = bench_stage_field(rep, "save", NULL);
        if (t > 0 && t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/fsdp-ckpt-overwrite", *bin = "build/fsdp-run";
    int layers = 4, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    char cmd[8400], recipe[4300], ck[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    snprintf(recipe, sizeof recipe, "%s/save.yaml", dir);
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    if (bench_write_text(recipe, "model: {preset: debugmodel}\nvars: {out: x}\nruntime: {stream: false}\nstages:\n  - {id: init, uses: init-meta}\n"
                                 "  - {id: save, uses: save-dcp, with: {path: \"${out}\", overwrite: true}}\n"))
        return 1;
    printf("ckpt_overwrite: debugmodel, save-dcp into an empty directory vs overwrite: true (best of %d)\n", reps);
    double prev_f = 0, prev_o = 0;
    for (int k = 0, l = layers; k < 4; k++, l *= 2) {
        double tf = best_save(bin, recipe, dir, ck, l, 1, reps);
        double to = best_save(bin, recipe, dir, ck, l, 0, reps);
        if (tf < 0 || to < 0) return 1;
        printf("layers %3d: fresh %.3f s  overwrite %.3f s  overwrite/fresh %.2f", l, tf, to, to / tf);
        if (k) printf("  per doubling: fresh %.2f  overwrite %.2f", tf / prev_f, to / prev_o);
        printf("\n");
        prev_f = tf;
        prev_o = to;
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_sh(cmd);
    return 0;
}
