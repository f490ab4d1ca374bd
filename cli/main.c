/* fsdp-run entry point: the only place that calls exit(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* GNU OpenMP spin-waits between parallel regions by default (GOMP_SPINCOUNT 300000), which starves
 * OpenBLAS's own threads (2-8x slower training on small machines), so fsdp-run waits passively unless
 * OMP_WAIT_POLICY is set. libgomp reads the policy once, in its constructor, before main. The executable's
 * .preinit_array runs before every library's constructor, but a setenv there does not reach libgomp:
 * glibc (2.36) installs the start-up environment array (envp) as the process's environment after the
 * preinit functions and before the libraries' constructors. What does reach them is that array itself:
 * the preinit replaces the shell's `_` entry (the last command's path, which nothing here reads) with
 * OMP_WAIT_POLICY=passive in place. Without a `_` entry, main executes the program once more with the
 * policy set (the libraries then load twice; FSDP_NO_REEXEC stops a loop). */
static char passive_entry[] = "OMP_WAIT_POLICY=passive";

static void wait_policy_passive(int argc, char **argv, char **envp) {
    (void)argc, (void)argv;
    if (!envp) return;
    for (char **e = envp; *e; e++)
        if (!strncmp(*e, "OMP_WAIT_POLICY=", 16)) return; /* the user's */
    for (char **e = envp; *e; e++)
        if (!strncmp(*e, "_=", 2)) {
            *e = passive_entry;
            return;
        }
}
__attribute__((section(".preinit_array"), used)) static void (*const fsdp_preinit)(int, char **, char **) =
    wait_policy_passive;

int main(int argc, char **argv) {
    if (!getenv("OMP_WAIT_POLICY")) {
        /* neither the user nor the preinit set it: libgomp started spin-waiting */
        setenv("OMP_WAIT_POLICY", "passive", 1);
        if (!getenv("FSDP_NO_REEXEC")) {
            setenv("FSDP_NO_REEXEC", "1", 1);
            execv("/proc/self/exe", argv); /* if that fails, carry on with the default policy */
        }
    }
    int rc = fsdp_cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    exit(rc);
}
