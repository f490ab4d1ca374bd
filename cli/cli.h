/* Command-line interface of fsdp-run. */
#ifndef FSDP_CLI_CLI_H
#define FSDP_CLI_CLI_H

#include <stdio.h>

#include "pipeline/registry.h"
#include "runtime/comm.h"

/* The whole program: registers the built-in stages and dispatches; returns the exit code
 * (0 success, 1 runtime failure, 2 usage or validation error). */
int fsdp_cli_main(int argc, char **argv);
/* The same over a caller-provided registry and streams (tests register their own stages). */
int fsdp_cli_run(fsdp_registry *reg, int argc, char **argv, FILE *out, FILE *log);
/* ... with a communicator (NULL: a world of 1). */
int fsdp_cli_run_comm(fsdp_registry *reg, int argc, char **argv, FILE *out, FILE *log, comm *cm);

/* A recipe path as given when it is there (NULL), else, for a relative path, the same path in the
 * checkout this fsdp-run was built in when it is there there (malloc'd; NULL when not). */
char *cli_recipe_path(const char *given);

#endif
