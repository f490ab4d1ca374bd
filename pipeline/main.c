/* fsdp-run entry point: the only place that calls exit(). */
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/cli.h"

int main(int argc, char **argv) {
    int rc = fsdp_cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    exit(rc);
}
