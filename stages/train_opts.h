/* train-steps' options beyond the step itself: the learning-rate schedule (schedule_steps, wsd),
 * the no_decay globs, gradient accumulation (grad_accum / micro_batch) and the held-out evaluation
 * (eval_every, eval_batches, eval_data), shared with the `eval` stage. */
#ifndef FSDP_STAGES_TRAIN_OPTS_H
#define FSDP_STAGES_TRAIN_OPTS_H

#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/value.h"
#include "train/lr_schedule.h"
#include "train/data.h"
#include "runtime/state.h"
#include "stages/train_backend.h"

/* The schedule of `with` (lr, warmup_steps, decay, min_lr_ratio, schedule_steps (default: steps),
 * decay_ratio, decay_type, min_lr_factor), validated; errors point at the key. */
int train_sched_from_with(const fsdp_value *with, lrs_config *out, fsdp_err *err);
/* The validate-time checks of those keys and of grad_accum / micro_batch / eval_*. */
int train_opts_check(const fsdp_value *with, fsdp_err *err);

/* One flag per state parameter (s->p[k]): 1 when its name matches a glob of the list `key` (no_decay,
 * freeze; fnmatch). *mask NULL when the list is absent or empty. A glob matching no parameter is an
 * error naming it. */
int train_glob_mask(const fsdp_value *with, const char *key, const fsdp_state *s, unsigned char **mask,
                    fsdp_err *err);

/* Micro-batches per optimizer step: grad_accum, or local_batch / micro_batch; the local batch must
 * divide evenly. stage: the stage's name for the messages. */
int train_micro_count(const fsdp_value *with, const char *stage, int64_t local_batch, int *n_micro, fsdp_err *err);

/* The held-out data: `eval_data` (a map with the keys of data:; keys it omits come from the data:
 * section, and its batch_size and seq_len must be the training ones) opened for this rank.
 * with_eval: the map (or NULL for the data: section itself). */
int train_eval_open(fsdp_ctx *ctx, const fsdp_value *eval_data, int vocab, int world, int rank,
                    const data_config *train_dc, data_source **out, fsdp_err *err);
/* The mean cross-entropy over every token of batches 0..n_batches-1 of `data` (not a mixture of experts'
 * load-balancing term: perplexity is exp of it; the same batches
 * every time, each as n_micro micro-batches of micro_elems tokens per rank, the backend's shape),
 * through the model in the backend's current state (no update; the forward and backward of
 * training, the gradients discarded). tokens / labels: scratch of the local batch. */
int train_eval_loss(train_backend *be, data_source *data, int64_t n_batches, int n_micro, int64_t micro_elems,
                    int32_t *tokens, int32_t *labels, double *loss, int64_t *ntokens, fsdp_err *err);

#endif
