/* Streamed copies (ckpt_stream.h) of a checkpoint's tensors into the two writers of the ckpt tools:
 * a safetensors file (st_writer) and a DCP data file (dcp_file_writer). */
#ifndef FSDP_CKPT_STREAM_OUT_H
#define FSDP_CKPT_STREAM_OUT_H

#include "ckpt/ckpt_stream.h"
#include "ckpt/dcp.h"
#include "ckpt/safetensors.h"

/* Tensor s (all its rows) as dt into declared tensor idx of w; what names w's file in errors. */
int cks_to_st(cks_src *s, fsdp_dtype dt, st_writer *w, size_t idx, const char *what, const cks_opts *o,
              fsdp_err *err);
/* Rows [r0, r1) of s as dt: all of declared tensor idx of w (e.g. one expert of a stack). */
int cks_rows_to_st(cks_src *s, int64_t r0, int64_t r1, fsdp_dtype dt, st_writer *w, size_t idx, const char *what,
                   const cks_opts *o, fsdp_err *err);
/* Where declared tensor idx of a safetensors writer comes from: rows [r0, r1) of src as dt (src NULL: not
 * streamed by cks_runs_to_st; the caller writes it). */
typedef struct cks_st_from {
    cks_src *src;
    int64_t r0, r1;
    fsdp_dtype dt;
} cks_st_from;
/* Every run of tensors next to each other in w's file whose bytes stream from from[] (by declared index) with the
 * same dtypes, written in one ring pass per run (many small tensors, a mixture's experts, in whole pieces rather
 * than one small copy after another); done[idx] = 1 for each tensor written. Errors name the source tensor. */
int cks_runs_to_st(st_writer *w, const cks_st_from *from, char *done, const char *what, const cks_opts *o,
                   fsdp_err *err);
/* Rows [r0, r1) of tensor s as dt appended to fw as the chunk of global tensor name (shape: s's
 * rows by its trailing dims) at row offset r0; *rec its record. */
int cks_to_dcp(cks_src *s, int64_t r0, int64_t r1, const char *name, fsdp_dtype dt, int ndim, const int64_t *shape,
               dcp_file_writer *fw, const cks_opts *o, dcp_record *rec, fsdp_err *err);

#endif
