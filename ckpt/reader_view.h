/* A view: a checkpoint reader whose entries are made of another reader's (module prefix ckv_).
 *
 * A trainer's checkpoint layout differs from fsdp-run's in names, in tensors it fuses or splits and in the
 * order of rows inside them (layouts/). A view shows the same checkpoint in another layout without copying
 * it: each of its tensors is a list of runs, each run taking n rows of one source tensor,
 *   view rows v0, v0 + vstride, ..., v0 + (n-1)*vstride  <-  source rows s0, s0 + sstride, ...
 * (a rename is one run; a split of a fused tensor a run per part; a permutation of the rows inside each
 * head a run per head and half). Every row of a view tensor comes from exactly one run (checked), every
 * run's source has the view tensor's dtype and row shape. Reading rows [r0, r1) reads only the source rows
 * they need. An entry that is a source entry unchanged (any name) passes through whole: its values,
 * pickles, checksums and the byte streaming of `ckpt convert` go to the source (ckpt_view_same). */
#ifndef FSDP_CKPT_READER_VIEW_H
#define FSDP_CKPT_READER_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/reader.h"
#include "fsdp/error.h"

typedef struct ckv_run {
    size_t src;              /* source entry index */
    int64_t v0, vstride;     /* the view rows it fills */
    int64_t s0, sstride;     /* the source rows they come from */
    int64_t n;               /* rows */
} ckv_run;

/* Element pieces, for a tensor whose values lie in flat 1-D tensors (DeepSpeed's ZeRO partitions, cut
 * anywhere, even inside a row): view elements [v0, v0 + n) (row-major) <- elements [s0, s0 + n) of source
 * src, a 1-D tensor. */
typedef struct ckv_piece {
    size_t src;
    int64_t s0, v0, n;
} ckv_piece;

typedef struct ckv_builder ckv_builder;

/* A builder over src (kept open; the view owns it when own is 1 and closes it with itself). */
int ckv_new(ckpt_reader *src, int own, ckv_builder **out, fsdp_err *err);
void ckv_free(ckv_builder *b); /* a builder not finished (closes an owned source) */
/* A tensor of shape[ndim] made of runs (copied). */
int ckv_add_tensor(ckv_builder *b, const char *name, int ndim, const int64_t *shape, const ckv_run *runs, size_t n,
                   fsdp_err *err);
/* A tensor of shape[ndim] made of pieces (copied); every element given once. */
int ckv_add_pieces(ckv_builder *b, const char *name, int ndim, const int64_t *shape, const ckv_piece *p, size_t n,
                   fsdp_err *err);
/* Source entry src, tensor or value, unchanged under name. */
int ckv_add_same(ckv_builder *b, const char *name, size_t src, fsdp_err *err);
/* A value of the view's own: its pickle (PROTO ... STOP, copied) and its text as ckpt_value_text gives it
 * (e.g. the list of parameter names a layout's param group needs). */
int ckv_add_value(ckv_builder *b, const char *name, const void *pickle, size_t len, const char *text, fsdp_err *err);
/* The view (b is consumed, also on failure). Two entries of one name are an error naming it. */
int ckv_finish(ckv_builder *b, ckpt_reader **out, fsdp_err *err);

/* For a reader over others (a view, a union): the source entry that entry i is unchanged (-1 when it is made of
 * runs); for a reader of files -1. *src (may be NULL) = the source reader. */
long ckpt_view_same(const ckpt_reader *r, size_t i, ckpt_reader **src);
/* For a view: 1 when value i is the view's own (ckv_add_value), its pickle and text; else 0. */
int ckpt_view_value(const ckpt_reader *r, size_t i, const void **pickle, size_t *len, const char **text);
/* For a view: 1 when entry i is made of runs, which *runs / *n give (of source *src); else 0. */
int ckpt_view_runs(const ckpt_reader *r, size_t i, ckpt_reader **src, const ckv_run **runs, size_t *n);
/* The reader under a view (r itself for any other reader). */
ckpt_reader *ckpt_view_base(ckpt_reader *r);

#endif
