/* The stage DAG of one recipe: dependency resolution, cycle detection, topological order
 * (ties broken by file order) and the state contract (needs / provides). */
#ifndef FSDP_PIPELINE_DAG_H
#define FSDP_PIPELINE_DAG_H

#include <stddef.h>

#include "pipeline/recipe.h"
#include "pipeline/registry.h"

/* A set of state names (small; linear search). */
typedef struct dag_state {
    char **names;
    size_t n, cap;
} dag_state;

int dag_state_add(dag_state *s, const char *name);
int dag_state_has(const dag_state *s, const char *name);
void dag_state_free(dag_state *s);

/* The graph's structure alone (no stage descriptor needed): every `after:` id that names no stage, then, when all
 * do, a cycle, each into el at its place; 1 when any was found. validate reports them with every other error of
 * the recipe (unknown stage kinds, parameters) in one run. */
typedef struct errlist errlist;
int dag_check_graph(const recipe *r, errlist *el);
/* Computes the execution order of r's stages (indices into r->stages) into order[n_stages].
 * `initial` is the state available before the recipe (from earlier chained recipes);
 * on success every stage's provides are added to `after_state` (may be NULL). Descriptors
 * must be resolved (r->stages[i].desc). */
int dag_plan(const recipe *r, const fsdp_registry *reg, const dag_state *initial, size_t *order,
             dag_state *after_state, fsdp_err *err);

#endif
