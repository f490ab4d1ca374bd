/* An init rule's values as a deferred producer (runtime/state_defer.h): the rows of the parameter's
 * stream are drawn when a writer or a materialisation asks for them, the values init_fill_jobs would
 * have written (each element's value depends on its index alone). */
#ifndef FSDP_MODEL_INIT_DEFER_H
#define FSDP_MODEL_INIT_DEFER_H

#include "model/init_fill.h"
#include "runtime/state_defer.h"

/* p's data becomes job's values for its local rows (job: stream, dist or table, zero row, dtype; its e0,
 * n and outputs are ignored), drawn with seed. */
int init_defer_param(fsdp_state *s, state_param *p, const init_job *job, uint64_t seed, fsdp_err *err);

#endif
