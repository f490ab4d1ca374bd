/* fsdp-run entry point: the only place that calls exit(). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "pipeline/cli.h"

int main(int argc, char **argv) {
    /* GNU OpenMP spin-waits between parallel regions by default, which starves OpenBLAS's
     * own threads (2-3x slower training on small machines). libgomp reads the policy when
     * it loads, so it is set here and the program re-executed once. */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("FSDP_NO_REEXEC")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        setenv("FSDP_NO_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        /* if that fails, carry on with the default policy */
    }
    int rc = fsdp_cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    exit(rc);
}
