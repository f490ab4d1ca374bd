/* bench/dcp_multirank: saves and loads a >= 2 GiB model state (fp32 weights of a Llama-3 with
 * a 128256 x 2048 embedding and output, 1 layer) as DCP with 1, 2 and 4 ranks (mpirun) and
 * prints GB/s next to `cp` of the same checkpoint, measured in the same run. The stage times
 * come from the run report (--report).
 *
 *   build/bench/dcp_multirank [--dir DIR] [--bin build/fsdp-run] [--ranks 1,2,4] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

int main(int argc, char **argv) {
    const char *dir = "/tmp/fsdp-dcp-multirank", *bin = "build/fsdp-run", *ranks = "1,2,4";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--ranks")) ranks = argv[i + 1];
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    const char *model = "model: {preset: llama3_1b, n_layers: 1}\n";
    char save_recipe[4200], load_recipe[4200];
    snprintf(save_recipe, sizeof save_recipe, "%s/save.yaml", dir);
    snprintf(load_recipe, sizeof load_recipe, "%s/load.yaml", dir);
    FILE *f = fopen(save_recipe, "w");
    fprintf(f, "%svars: {out: x}\nruntime: {stream: false}\nstages:\n  - {id: init, uses: init-meta}\n"
               "  - {id: save, uses: save-dcp, with: {path: \"${out}\", overwrite: true}}\n", model);
    fclose(f);
    f = fopen(load_recipe, "w");
    fprintf(f, "%svars: {ckpt: x}\nstages:\n  - {id: load, uses: load-ckpt, with: {path: \"${ckpt}\"}}\n", model);
    fclose(f);
    const char *root = geteuid() == 0 ? " --allow-run-as-root" : "";
    printf("dcp_multirank: llama3_1b with 1 layer (fp32 weights), save-dcp / load-ckpt per world size\n");
    char list[64];
    snprintf(list, sizeof list, "%s", ranks);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int np = atoi(tok);
        char ck[4300], rep[4300], rep2[4300];
        snprintf(ck, sizeof ck, "%s/ckpt_ws%d", dir, np);
        snprintf(rep, sizeof rep, "%s/save_ws%d.json", dir, np);
        snprintf(rep2, sizeof rep2, "%s/load_ws%d.json", dir, np);
        snprintf(cmd, sizeof cmd, "mpirun --oversubscribe -np %d%s %s -q --report %s %s --set vars.out=%s", np, root, bin,
                 rep, save_recipe, ck);
        if (bench_sh(cmd)) return 1;
        bench_sh("sync");
        /* cp of the same checkpoint, then drop the copy */
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s.copy' && sync", ck, ck);
        double t0 = bench_now();
        if (bench_sh(cmd)) return 1;
        double t_cp = bench_now() - t0;
        snprintf(cmd, sizeof cmd, "rm -rf '%s.copy'", ck);
        bench_sh(cmd);
        snprintf(cmd, sizeof cmd, "mpirun --oversubscribe -np %d%s %s -q --report %s %s --set vars.ckpt=%s", np, root, bin,
                 rep2, load_recipe, ck);
        if (bench_sh(cmd)) return 1;
        snprintf(cmd, sizeof cmd, "du -sb '%s' | cut -f1 > '%s/bytes'", ck, dir);
        bench_sh(cmd);
        char bp[4300];
        snprintf(bp, sizeof bp, "%s/bytes", dir);
        FILE *b = fopen(bp, "r");
        double bytes = 0;
        if (b && fscanf(b, "%lf", &bytes) != 1) bytes = 0;
        if (b) fclose(b);
        double ts = bench_stage_field(rep, "save", NULL), tl = bench_stage_field(rep2, "load", NULL);
        double gb = bytes / 1e9;
        printf("ranks %d: %.2f GB  save %.2f s %.2f GB/s (%.2fx cp)  load %.2f s %.2f GB/s (%.2fx cp)  cp %.2f s %.2f GB/s\n",
               np, gb, ts, gb / ts, t_cp / ts, tl, gb / tl, t_cp / tl, t_cp, gb / t_cp);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck);
        bench_sh(cmd);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_sh(cmd);
    return 0;
}
