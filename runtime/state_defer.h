/* Deferred parameter values (issue 40's streamed bootstrap): a parameter's local rows need not be held.
 * Its value can instead be a producer (state_src) that writes any range of its local elements on demand:
 * the rows of an init stream, the rows of a checkpoint tensor, or another parameter's producer (a copy).
 * A checkpoint writer pulls each piece from the producer straight into its write buffers
 * (state_param_fill), so a rank holds a few buffers instead of its shard; anything else that needs the
 * values materialises them first (state_param_materialize), with the bytes the producer gives, which are
 * the bytes the eager path writes.
 *
 * Producers are shared (reference-counted: a copy shares its source's) and must be callable from
 * several threads at once on different ranges. Only host arrays of a sharded state are deferred. */
#ifndef FSDP_RUNTIME_STATE_DEFER_H
#define FSDP_RUNTIME_STATE_DEFER_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/ctx.h"
#include "runtime/state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct state_src state_src;
/* Elements [e0, e0 + n) of the parameter's LOCAL rows (element 0: the first local row's first) as
 * float32 into dst. Errors name what failed (the tensor, the file). */
typedef int (*state_src_fill_fn)(const state_src *src, int64_t e0, size_t n, float *dst, fsdp_err *err);

struct state_src {
    state_src_fill_fn fill;
    void (*destroy)(state_src *src); /* frees the producer (called by the last state_src_unref) */
    int refs;                        /* references (state_src_init: 1) */
    int64_t numel;                   /* local elements it produces */
};

/* Sets up *src (embedded first in a producer's own struct) with one reference. */
void state_src_init(state_src *src, state_src_fill_fn fill, void (*destroy)(state_src *), int64_t numel);
state_src *state_src_ref(state_src *src);
void state_src_unref(state_src *src);

/* 1 when the running stage may leave values deferred: runtime.stream is on and every later stage reads
 * deferred values (run/run.c sets it per stage). */
int state_defer_allowed(const fsdp_ctx *ctx);

/* p's data becomes src's values (a new reference; NULL: NaN, a parameter without a value), rounded to
 * round (FSDP_DT_BF16 / FSDP_DT_F16; 0: none); its host rows are freed. Only a host (or unallocated) data
 * array of a parameter whose other arrays are absent; FSDP_E_INVALID otherwise. src->numel must be p's
 * local element count. */
int state_param_defer(fsdp_state *s, state_param *p, state_src *src, fsdp_dtype round, fsdp_err *err);

/* Local elements [e0, e0 + n) of p's data into dst: produced when deferred, copied from its host rows
 * otherwise (FSDP_E_INVALID for a device array). Thread-safe for a deferred parameter. */
int state_param_fill(const state_param *p, int64_t e0, size_t n, float *dst, fsdp_err *err);

/* p's data held in host memory (its producer run over all its rows on every thread, then released); a
 * parameter that is not deferred is left alone. An error names the parameter; p stays deferred. */
int state_param_materialize(fsdp_state *s, state_param *p, fsdp_err *err);
/* Every deferred parameter materialised (*count, may be NULL: how many were). */
int state_materialize(fsdp_state *s, size_t *count, fsdp_err *err);
/* Deferred parameters of s (0 for NULL). */
size_t state_deferred_count(const fsdp_state *s);
/* Drops p's deferral without producing its values (its data becomes absent: the caller allocates it). */
void state_param_undefer(state_param *p);

#ifdef __cplusplus
}
#endif
#endif
