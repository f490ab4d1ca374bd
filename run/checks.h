/* Static checks of a recipe that need no state, run by `validate` and at the start of every run
 * beside the schema and size checks, each error with the file:line:col of its key:
 *   - train-steps: warmup_steps <= steps (and <= schedule_steps when given);
 *   - train-steps: the metrics file's directory exists or can be created (a real run creates it);
 *     the metrics path is not a directory;
 *   - train-steps: mixed: bf16 on a run that trains on the CPU (device cpu, a build without CUDA,
 *     or auto on a host without a GPU);
 *   - (transform globs that match no parameter of the recipe's model: run/sizes_transform.c, with the
 *     table run/sizes.c builds);
 *   - a chained recipe whose model: differs from the model of the state it continues (it has no
 *     init-meta or init-cpu stage of its own);
 *   - outputs a stage would refuse to replace (run/checks_outputs.c): a save-dcp path that
 *     already holds a checkpoint without overwrite: true, a save-safetensors output (or copy) that
 *     exists with overwrite: false, a periodic save (save_every) of a train-steps that starts at step 0
 *     onto an existing step-<N> without save_overwrite;
 *   - checkpoints a load-ckpt stage reads (run/checks_inputs.c): a path that does not exist and
 *     that no stage of the recipe (or of an earlier recipe of the chain) writes, a `DIR/latest` without
 *     a committed step, a run directory given for a checkpoint (its step-<N> named). */
#ifndef FSDP_RUN_CHECKS_H
#define FSDP_RUN_CHECKS_H

#include "pipeline/errlist.h"
#include "pipeline/recipe.h"
#include "run/sizes.h"

/* prev_model: the model section of the state r continues (NULL: none yet); prev_path its file. */
void checks_recipe(const recipe *r, const sizes_host *h, const fsdp_value *prev_model, errlist *el);

/* load-ckpt paths of r (prev: the recipes of the chain before it, whose outputs exist by then). */
void checks_inputs(const recipe *const *prev, size_t n_prev, const recipe *r, const sizes_host *h, errlist *el);

/* The outputs of r's save stages that exist and may not be replaced (each error at its path value),
 * the periodic saves of a train-steps that starts at step 0 included (chained: r continues an earlier
 * recipe's state, whose step is not known before it runs). */
void checks_outputs(const recipe *r, int chained, errlist *el);

#endif
