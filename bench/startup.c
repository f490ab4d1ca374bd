/* bench/startup: the start-up wall time of `fsdp-run --version` and `fsdp-run validate RECIPE` against
 * `/bin/true` (a process that only starts and exits), measured in the same run, interleaved, each
 * started with posix_spawn (no shell) and its output sent to /dev/null. Prints the median and the
 * minimum of each, and the medians as ratios to /bin/true's.
 *
 *   build/bench/startup [--bin build/fsdp-run] [--recipe recipes/quickstart.yaml] [--reps N] */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

extern char **environ;

/* Wall seconds of one run of argv (stdout and stderr to /dev/null); -1 when it fails. */
static double spawn_once(char *const *argv) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    double t0 = bench_now();
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1;
    int st;
    if (waitpid(pid, &st, 0) < 0) return -1;
    double el = bench_now() - t0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? el : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *bin = "build/fsdp-run", *recipe = "recipes/quickstart.yaml";
    int reps = 40;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--recipe")) recipe = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (reps < 1) reps = 1;
    char *cmds[3][4] = {{"/bin/true", NULL},
                        {(char *)bin, "--version", NULL},
                        {(char *)bin, "validate", (char *)recipe, NULL}};
    const char *names[3] = {"/bin/true", "fsdp-run --version", "fsdp-run validate"};
    double *t[3];
    for (int c = 0; c < 3; c++)
        if (!(t[c] = calloc((size_t)reps, sizeof *t[c]))) return 1;
    for (int c = 0; c < 3; c++) /* warm the page cache */
        if (spawn_once(cmds[c]) < 0) {
            fprintf(stderr, "startup: %s failed\n", names[c]);
            return 1;
        }
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < 3; c++)
            if ((t[c][r] = spawn_once(cmds[c])) < 0) {
                fprintf(stderr, "startup: %s failed\n", names[c]);
                return 1;
            }
    double med[3];
    printf("start-up wall time, %d runs each (interleaved), %s:\n", reps, bin);
    for (int c = 0; c < 3; c++) {
        qsort(t[c], (size_t)reps, sizeof *t[c], cmp_double);
        med[c] = t[c][reps / 2];
        printf("  %-20s median %7.2f ms  min %7.2f ms  median/true %5.1fx\n", names[c], med[c] * 1e3, t[c][0] * 1e3,
               med[c] / med[0]);
        free(t[c]);
    }
    return 0;
}
