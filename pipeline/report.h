/* The run report (--report FILE): JSON written with Jansson, also when a stage fails. */
#ifndef FSDP_PIPELINE_REPORT_H
#define FSDP_PIPELINE_REPORT_H

#include <stddef.h>

#include "fsdp/error.h"
#include "runtime/ctx_impl.h"

typedef struct run_record {
    char *recipe;   /* recipe name */
    char *id;       /* stage id */
    char *stage;    /* stage name (uses) */
    const char *status; /* "ok", "failed", "skipped", "pending" */
    double seconds;
    ctx_metrics metrics;
    char *error;
} run_record;

typedef struct run_result {
    run_record *recs;
    size_t n, cap;
    char **recipes;       /* names */
    char **recipe_paths;
    size_t n_recipes;
    double start_wall, end_wall; /* UNIX time */
    int exit_code;
    int world_size;
} run_result;

int report_add_record(run_result *r, const char *recipe, const char *id, const char *stage);
int report_add_recipe(run_result *r, const char *name, const char *path);
void report_free(run_result *r);
/* Writes the JSON report atomically (path.tmp, then rename). */
int report_write(const run_result *r, const char *path, fsdp_err *err);

#endif
