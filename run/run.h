/* Planning (load + validate every recipe) and running them in one context. */
#ifndef FSDP_RUN_RUN_H
#define FSDP_RUN_RUN_H

#include <stdio.h>

#include "pipeline/recipe.h"
#include "pipeline/registry.h"
#include "runtime/comm.h"

typedef struct run_opts {
    int dry_run;          /* print the plan, run nothing */
    int validate_only;    /* check only */
    const char *report;   /* JSON report path or NULL */
    int verbosity;        /* 0 -q, 1 normal, 2 -v */
    FILE *out;            /* plan / validation results (stdout) */
    FILE *log;            /* log lines and errors (stderr) */
    const char **sets;    /* --set arguments */
    size_t n_sets;
    comm *comm;           /* the communicator (NULL: a world of 1) */
} run_opts;

/* Everything the planner produced for a chain of recipes. */
typedef struct run_plan {
    recipe **recipes;
    size_t **orders;
    char **notes; /* --dry-run: each recipe's resolved model and memory per rank (sizes_describe), or NULL */
    size_t n;
} run_plan;

/* Loads and validates every recipe (plugins loaded into reg). */
int run_plan_build(fsdp_registry *reg, const char *const *paths, size_t n, const run_opts *o, run_plan *plan,
                   fsdp_err *err);
void run_plan_free(run_plan *plan);
/* Prints the execution plan. */
void run_plan_print(const run_plan *plan, FILE *out);
/* The whole `fsdp-run RECIPE...` / `validate` flow; returns the process exit code. */
int run_main(fsdp_registry *reg, const char *const *paths, size_t n, const run_opts *o);

#endif
