/* The checkpoint read engine: positional reads of a stored tensor's bytes straight into their
 * destination, several threads at once, with everything a load does to those bytes done in the
 * same pass while each piece is in cache: the CRC-32 of the stored bytes, the widening or
 * rounding to the destination dtype (through a small per-thread buffer, never a bounce buffer
 * of the whole tensor), and the NaN check of float32 values. Each thread takes whole pieces, so
 * the page faults of a fresh destination are taken by the thread that fills it.
 *
 * Run-time switches (read at each call, for tests and measurements):
 *   FSDP_LOAD_FAST=0     the fallback path: the whole range read first (into the destination, or
 *                        a bounce buffer of its size when the dtypes differ), zlib's CRC-32, then a
 *                        separate conversion pass and NaN pass; the values are the same, bit for bit
 *   FSDP_LOAD_THREADS=N  reader threads (default: OpenMP's maximum, at most 8)
 *   FSDP_LOAD_PIECE=B    stored bytes per piece (default 8 MiB, down to 1 MiB so that every thread
 *                        has one; tests set a few KiB so that small tensors take many pieces) */
#ifndef FSDP_CKPT_PREAD_H
#define FSDP_CKPT_PREAD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt_pio.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

typedef struct ckpt_rd_xf {
    size_t n;          /* elements */
    fsdp_dtype src_dt; /* as stored */
    fsdp_dtype dst_dt; /* as written into dst (equal to src_dt: a plain copy) */
    int want_crc;      /* compute the CRC-32 of the n stored elements' bytes */
    int want_nan;      /* dst_dt float32: tell whether a written value is NaN */
    uint32_t crc;      /* out (want_crc): zlib's crc32 of the stored bytes */
    int nan;           /* out (want_nan): 1 when a NaN was written */
} ckpt_rd_xf;

/* 0 when FSDP_LOAD_FAST=0 selects the fallback path, else 1. */
int ckpt_load_fast(void);

/* Reader threads: FSDP_LOAD_THREADS when set (1..256), else 0 (the defaults). */
int ckpt_load_threads(void);

/* Reads xf->n elements of xf->src_dt at file offset off and writes them as xf->dst_dt into dst.
 * A file that ends early is a format error "<what>: the file ends before byte B (truncated?)", a
 * failed read an I/O error naming the byte, whichever thread met it; a dtype pair fsdp_convert
 * refuses is its error. o may be NULL (the defaults; FSDP_LOAD_THREADS overrides its threads). */
int ckpt_pread_xf(int fd, void *dst, uint64_t off, ckpt_rd_xf *xf, const char *what, const ckpt_pio_opts *o,
                  fsdp_err *err);

/* 1 when one of the n float32 values is a NaN (vectorised; no FP compare, so -ffast-math safe). */
int ckpt_f32_has_nan(const float *p, size_t n);

#endif
