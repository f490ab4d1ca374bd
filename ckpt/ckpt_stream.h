/* Streaming copy of stored tensor bytes from checkpoint files into another file (ckpt convert,
 * reshard): a tensor's bytes as they lie in its source files (ckpt_span.c resolves them) are moved
 * in pieces of a few MiB through a small ring of buffers, a reader thread reading (and checking the
 * source's CRC-32 where it stores one, and the destination's when the bytes are the same) while the
 * calling thread converts the dtype and writes, or, without a conversion, has the kernel copy the
 * piece file to file (copy_file_range: no copy through user memory, what cp does). Memory is the
 * ring's, not the tensor's. */
#ifndef FSDP_CKPT_STREAM_H
#define FSDP_CKPT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/reader.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

/* One contiguous byte range of a source file holding rows [row0, row0 + rows) of a tensor (C
 * order, the tensor's dtype). check: crc is the CRC-32 of exactly these len bytes (a whole zip
 * record), verified once all of them have been read in order. */
typedef struct cks_seg {
    int fd;
    uint64_t off, len;
    int64_t row0, rows;
    int check;
    uint32_t crc;
    uint32_t run; /* running CRC of the bytes read in order so far */
    uint64_t done;
    /* pieces read ahead of done (a stack's experts taken in the output file's order, which sorts expert 10
     * before 2): their CRCs kept until the bytes before them are in; freed by cks_src_free */
    struct cks_crc_piece {
        uint64_t at, n;
        uint32_t crc;
    } *ahead;
    size_t nahead, cap_ahead;
    const char *what; /* the file, for messages (owned by the cks_files it came from) */
    const char *tensor; /* the tensor its bytes belong to, for messages (NULL: the cks_src's name) */
    struct cks_seg *whole; /* a part of segment *whole from its byte whole_at (cks_src_append): the stored CRC and
                              its running check are whole's, the parts read in order adding to it */
    uint64_t whole_at;
    char rec[200];    /* checked: "@<archive offset>: zip record <name>", for messages */
} cks_seg;

#define CKS_MAX_SLOTS 16

/* Files opened while resolving tensors, kept open until cks_files_free, and the ring's buffers,
 * reused by every copy of the tensors resolved with it (fresh buffers per tensor would cost their
 * page faults again each time). */
typedef struct cks_files {
    struct cks_file {
        char *path;
        int fd;
        uint64_t size;
    } *f;
    size_t n, cap;
    char *buf[CKS_MAX_SLOTS], *cvt;
    size_t buf_cap, cvt_cap;
} cks_files;

/* Tensor entry i of a reader as byte ranges of its files, in row order. */
typedef struct cks_src {
    const char *name;
    fsdp_dtype dtype;
    int64_t rows;
    uint64_t row_bytes; /* bytes of one row (one element for a 0-d tensor) */
    cks_seg *seg;
    size_t n;
    cks_files *fc; /* what it was resolved with (its buffers) */
} cks_src;

typedef struct cks_opts {
    size_t piece; /* bytes of one source piece (rounded down to whole elements; >= one element); a copy's first
                     piece is an eighth of it and each next one twice the one before, so that its writes start
                     early */
    int slots;    /* buffers in the ring (2 to CKS_MAX_SLOTS) */
    int cfr;      /* FSDP_CONVERT_CFR=1: where the dtype stays and no CRC-32 is computed or checked, the
                     kernel copies each piece from file to file (copy_file_range; on another file system, or
                     where the kernel cannot, the piece goes through the ring); else each piece is read into
                     the ring and written */
    int writeback; /* each written piece's whole pages handed to write-back at once (sync_file_range, no wait:
                      the disk writes while the next pieces are copied, and the fsync at the end finds little
                      left); measured 0.80x the wall time of writing them all back at the end (cp + sync) */
    int direct;    /* a piece that starts at a 4 KiB boundary of the output has its whole blocks written with
                      O_DIRECT (ckpt_pwrite.h), as saves do; FSDP_SAVE_DIRECT=0 turns it off */
} cks_opts;

/* The defaults (8 MiB pieces, 4 slots, writes from the ring with early write-back), then FSDP_CONVERT_WRITEBACK=0
 * (write-back at the fsync only), FSDP_CONVERT_PIECE=<bytes> (tests
 * make it small) and FSDP_CONVERT_CFR=1 (the kernel copies the pieces no CRC-32 needs: copy_file_range,
 * the reader reading nothing; measured 1.2x slower than the ring on llama3_1b, equal on a MoE's small
 * tensors). */
void cks_opts_default(cks_opts *o);
/* 0 when FSDP_CONVERT_STREAM=0: the ckpt tools take their whole-tensor path instead. */
int cks_enabled(void);

void cks_files_free(cks_files *fc);
/* Opens path (once) read-only: its fd and size; what names the file in messages. */
int cks_files_open(cks_files *fc, const char *path, int *fd, uint64_t *size, const char **what, fsdp_err *err);
/* The same for a file a reader already holds open as fd (of size bytes): fc keeps a dup of it under
 * path, so that the bytes streamed are those of the file the reader checked, whatever happened to
 * the name since (ckpt/dcp.h: dcp_open). */
int cks_files_adopt(cks_files *fc, const char *path, int src_fd, uint64_t src_size, int *fd, uint64_t *size,
                    const char **what, fsdp_err *err);

/* Resolves tensor i of r into s. *ok = 0 (and s empty) when its stored bytes are not plain row
 * ranges this module can stream (a .pt file, chunks split along another dim than 0, a record
 * with other bytes than the tensor's): the caller reads it whole instead. Errors are those of a
 * corrupt source (named). */
int cks_src_resolve(ckpt_reader *r, size_t i, cks_files *fc, cks_src *s, int *ok, fsdp_err *err);
void cks_src_free(cks_src *s);
/* Rows [r0, r1) of s appended to v (zeroed before the first call) as rows of one element of s's dtype, so that
 * several tensors' bytes, or parts of them, are copied by one cks_copy_rows as one tensor's; errors in them name
 * tensor (kept by the caller) and their files; a stored CRC is still checked once all of its record has been
 * read in order (through s's segments, which must outlive v). 0 when appended; 1 when s cannot join v (another
 * dtype than v's); -1 when out of memory. v is freed with cks_src_free. */
int cks_src_append(cks_src *v, cks_src *s, int64_t r0, int64_t r1, const char *tensor);

/* Rows [r0, r1) of s (read in increasing order across calls: a segment's CRC is checked once its
 * last byte has been read) converted to dst_dt, written at out_off of out_fd. *out_crc (when not
 * NULL) receives the CRC-32 of the bytes written. Errors name the tensor and the file. */
int cks_copy_rows(cks_src *s, int64_t r0, int64_t r1, fsdp_dtype dst_dt, int out_fd, uint64_t out_off,
                  uint32_t *out_crc, const cks_opts *o, const char *out_what, fsdp_err *err);

#endif
