/* A load-ckpt whose values can wait (runtime/state_defer.h): the parameter's local rows stay in the
 * checkpoint, read (and un-permuted for HF q/k rows, NaN-checked when strict) when a writer or a
 * materialisation asks for them. Used by ckpt/state_load.c (sio_load_opts.defer). */
#ifndef FSDP_CKPT_STATE_LOAD_DEFER_H
#define FSDP_CKPT_STATE_LOAD_DEFER_H

#include "ckpt/namemap.h"
#include "ckpt/reader.h"
#include "runtime/state_defer.h"

/* p's data becomes rows [p->row0, p->row0 + p->rows) of tensor ci of r (which it keeps open by a
 * reference), permuted per info (NULL: none), rounded to round, NaN refused when check_nan (an error
 * naming the tensor and the checkpoint when the rows are read). */
int sio_defer_rows(fsdp_state *s, state_param *p, ckpt_reader *r, size_t ci, const nmap_info *info, fsdp_dtype round,
                   int check_nan, fsdp_err *err);

#endif
