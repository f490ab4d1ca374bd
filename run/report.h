/* The run report (--report FILE): JSON written with Jansson, also when a stage fails. */
#ifndef FSDP_RUN_REPORT_H
#define FSDP_RUN_REPORT_H

#include <stddef.h>

#include "fsdp/error.h"
#include "runtime/ctx_impl.h"

/* One metric over the ranks (world > 1). */
typedef struct report_rank_stat {
    char *name;
    double min, max, sum;
    int n; /* ranks that reported it */
} report_rank_stat;

typedef struct run_record {
    char *recipe;   /* recipe name */
    char *id;       /* stage id */
    char *stage;    /* stage name (uses) */
    const char *status; /* "ok", "failed", "skipped", "pending" */
    double seconds;
    ctx_metrics metrics;  /* rank 0's */
    report_rank_stat *ranks; /* every rank's (run/report_ranks.h); none on one rank */
    size_t n_ranks;
    char *error;
} run_record;

/* A stage that a false `when:` removed from its recipe (listed under "not_run"). */
typedef struct run_not_run {
    char *recipe, *id, *stage, *when;
} run_not_run;

typedef struct run_result {
    run_record *recs;
    size_t n, cap;
    char **recipes;       /* names */
    char **recipe_paths;
    size_t n_recipes;
    double start_wall, end_wall; /* UNIX time */
    int exit_code;
    int world_size;
    int mesh_r, mesh_s;   /* the last recipe's runtime.mesh (0 x 0: none, 1-D) */
    int nodes;            /* nodes the ranks are on */
    char **hosts;         /* rank 0: every rank's host name (n_hosts) */
    int n_hosts;
    char run_id[48];      /* "" when the run did not start */
    char *error;          /* the validation error(s) when the recipes were refused before running */
    run_not_run *not_run;
    size_t n_not_run;
} run_result;

int report_add_record(run_result *r, const char *recipe, const char *id, const char *stage);
int report_add_recipe(run_result *r, const char *name, const char *path);
int report_add_not_run(run_result *r, const char *recipe, const char *id, const char *stage, const char *when);
void report_free(run_result *r);
/* Writes the JSON report atomically (path.tmp, then rename). */
int report_write(const run_result *r, const char *path, fsdp_err *err);

#endif
