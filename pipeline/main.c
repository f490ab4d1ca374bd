/* fsdp-run entry point: the only place that calls exit(). */
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/cli.h"

/* GNU OpenMP spin-waits between parallel regions by default, which starves OpenBLAS's own threads
 * (2-3x slower training on small machines). libgomp reads OMP_WAIT_POLICY once, in its constructor,
 * before main: the executable's .preinit_array runs before any shared library's constructor, so the
 * passive policy is set there (unless the user set one), without re-executing the program. */
static void wait_policy_passive(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    if (!getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "passive", 0);
}
__attribute__((section(".preinit_array"), used)) static void (*const fsdp_preinit)(int, char **, char **) =
    wait_policy_passive;

int main(int argc, char **argv) {
    int rc = fsdp_cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    exit(rc);
}
