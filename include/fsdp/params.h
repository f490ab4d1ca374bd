/* fsdp-run public API (stage ABI 1.2): the model's parameters and the optimizer state.
 *
 * Every parameter of the model in the context (a built-in arch or any table of named tensors,
 * trainable or not) is held as Shard(0) rows: this rank holds rows [row0, row0 + rows) of dim 0 of
 * the global shape (a 0-d parameter: its one value, on every rank). Values are float32 in memory and
 * are read and written here as float32 or any float dtype (bf16, f16, f64, ...) through host buffers
 * the caller owns; on a GPU run fsdp-run makes the host copy, so a plugin never calls CUDA.
 *
 * Rows are given as global row indices and must lie within this rank's rows. Calls marked
 * "collective" are made by every rank, in the same order, with the same arguments: every rank checks
 * that first, as collectives.h says (a mismatch or a missing rank fails every rank with a message). Every call returns 0 or an FSDP_E_* code
 * with err naming the stage, the call and what was wrong (an unknown index, rows outside this rank's,
 * a NULL buffer, a dtype that is not a float, no model in the context, a call outside a stage).
 * Structural calls (add, remove, resize) are refused inside a train-steps callback: the trainer holds
 * the parameters while it runs. A write is allowed while an async save is in flight: the save took
 * its own copy of the state when it started. */
#ifndef FSDP_PARAMS_H
#define FSDP_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_param_info {
    const char *name; /* valid until the parameters change (add, remove, resize) */
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* global */
    fsdp_dtype dtype;             /* the dtype checkpoints store */
    int64_t row0, rows;           /* this rank's rows of dim 0 */
    int64_t row_numel;            /* elements per row (1 for 1-D, numel for 0-d) */
    const char *part;             /* the model table's part ("" when the model has none) */
    int has_value;                /* 0: declared (init rule none) and not yet loaded or filled */
    int has_optimizer;            /* AdamW moments present */
} fsdp_param_info;

/* Parameters of the model in the context (0 without one), in the model's order. */
size_t fsdp_param_count(fsdp_ctx *ctx);
int fsdp_param_info_at(fsdp_ctx *ctx, size_t i, fsdp_param_info *out, fsdp_err *err);
/* The index of `name`, or -1 when the model has no such parameter (or there is no model). */
long fsdp_param_find(fsdp_ctx *ctx, const char *name);
/* The indices of the parameters whose names match `pattern` (`*` within one dotted component, `**`
 * across them), in model order: the first `cap` into idx, the total into *n. */
int fsdp_param_glob(fsdp_ctx *ctx, const char *pattern, size_t *idx, size_t cap, size_t *n, fsdp_err *err);

/* Rows [row0, row0 + rows) of parameter i into dst (rows * row_numel elements of dt). */
int fsdp_param_read(fsdp_ctx *ctx, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst, fsdp_err *err);
/* The same rows from src: the parameter then holds a value (has_value). */
int fsdp_param_write(fsdp_ctx *ctx, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt, const void *src,
                     fsdp_err *err);
/* Collective: the whole tensor of parameter i on rank `root` (dst: numel elements of dt, written on root
 * only; other ranks may pass NULL). */
int fsdp_param_gather(fsdp_ctx *ctx, size_t i, int root, fsdp_dtype dt, void *dst, fsdp_err *err);
/* Collective: root's whole tensor (src: numel elements of dt, read on root only) becomes every rank's
 * rows of parameter i. */
int fsdp_param_scatter(fsdp_ctx *ctx, size_t i, int root, fsdp_dtype dt, const void *src, fsdp_err *err);

/* Collective: adds a parameter of the given global shape and stored dtype, drawn by an init rule of the
 * model table (`normal(std=0.02)`, `zeros`, `ones`, `constant(v)`, `uniform(a, b)`, `none` ...; the
 * rule's random stream is seeded by runtime.seed and the name, as init-meta draws). It is saved,
 * reloaded and exported like every other parameter; it has no optimizer moments until a step makes
 * them (zeros). */
int fsdp_param_add(fsdp_ctx *ctx, const char *name, int ndim, const int64_t *shape, fsdp_dtype dtype,
                   const char *init_rule, fsdp_err *err);
/* Collective: removes parameter i (and its moments): indices after it shift down by one. */
int fsdp_param_remove(fsdp_ctx *ctx, size_t i, fsdp_err *err);
/* Collective: dim 0 of parameter i becomes new_rows. Kept rows keep their values (and moments); new
 * rows come from `given` (root's (new_rows - old) * row_numel elements of dt, read on rank 0; the other
 * ranks may pass NULL) when rank 0's is not NULL, else from `init_rule` (NULL: the rows' mean, as transformers' mean-resizing does for
 * embeddings). Moments of new rows are zeros. */
int fsdp_param_resize(fsdp_ctx *ctx, size_t i, int64_t new_rows, const char *init_rule, fsdp_dtype dt,
                      const void *given, fsdp_err *err);

/* Collective (stage ABI 1.2): trainable 0 makes parameter i a buffer: saved, loaded, resharded and
 * exported like every other parameter, never trained (no update, no weight decay, no moments: those it
 * had are dropped; its gradient out of the norm and the clipping), as an EMA copy, a frozen tower or a
 * statistic is kept; trainable 1 makes it a parameter again (zero moments at its next step). Refused
 * inside a train-steps callback. The model table's `trainable: false` (a part's or an entry's) declares
 * the same. */
int fsdp_param_set_trainable(fsdp_ctx *ctx, size_t i, int trainable, fsdp_err *err);
/* (stage ABI 1.2) 1 when train-steps trains parameter i, 0 when it is a buffer or frozen by the running
 * train-steps' `freeze:`, -1 for an unknown index or no model. */
int fsdp_param_trainable(fsdp_ctx *ctx, size_t i);

/* (stage ABI 1.2) Inside a pre-update hook (include/fsdp/callbacks.h): rows of parameter i's gradient
 * of this step, reduced over the ranks (this rank's rows of the mean gradient) and not yet clipped, as
 * fsdp_param_read reads values. FSDP_E_INVALID elsewhere, and for a parameter that is not trained. */
int fsdp_param_read_grad(fsdp_ctx *ctx, size_t i, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst,
                         fsdp_err *err);

/* ---- optimizer state (AdamW) ----------------------------------------------------------------- */

typedef enum fsdp_moment { FSDP_EXP_AVG = 0, FSDP_EXP_AVG_SQ = 1 } fsdp_moment;

/* The optimizer's step count (PyTorch's state['step']); -1 when the model has no optimizer state. */
int64_t fsdp_optim_step(fsdp_ctx *ctx);
/* Sets the step count (every rank must set the same value). */
int fsdp_optim_set_step(fsdp_ctx *ctx, int64_t step, fsdp_err *err);
/* The learning rate the next step uses (the schedule's, times any scale set below); 0 before any. */
double fsdp_optim_lr(fsdp_ctx *ctx);
/* The learning rate of the next step, and of the schedule after it scaled alike (a `reduce on
 * plateau`); recorded in the checkpoints' param_groups as PyTorch's would be. Every rank must set the
 * same value. */
int fsdp_optim_set_lr(fsdp_ctx *ctx, double lr, fsdp_err *err);
/* Rows [row0, row0 + rows) of a moment of parameter i (float32 values, as dt); FSDP_E_INVALID when the
 * parameter has no moments. */
int fsdp_optim_read(fsdp_ctx *ctx, size_t i, fsdp_moment m, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst,
                    fsdp_err *err);
/* The same rows written (moments are created, zeros, when the model had none). */
int fsdp_optim_write(fsdp_ctx *ctx, size_t i, fsdp_moment m, int64_t row0, int64_t rows, fsdp_dtype dt,
                     const void *src, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
