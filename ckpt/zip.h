/* The zip subset of torch.save archives: STORED records only, zip64 aware; reading works
 * over a memory buffer or over a byte range of a file (pread: only the central directory,
 * the local headers and the records asked for are read).
 *
 * Opening checks every record's local header against the central directory (signature,
 * name, method, and sizes and CRC unless a data descriptor defers them) and that no payload
 * overlaps another record or the directory; a record that fails keeps the error in .bad and
 * every read of it returns that error. Reads check the CRC-32 of every record they cover
 * whole, in the same pass as the copy; zip_read_checked and zip_verify also cover the rest of a
 * record. A read of only part of a record through zip_read cannot check it: the bytes it does
 * not read take part in the CRC. A reader (with its entries) is used by one thread at a time. */
#ifndef FSDP_CKPT_ZIP_H
#define FSDP_CKPT_ZIP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/ckpt_pread.h"
#include "ckpt/ckpt_pwrite.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

typedef struct zip_entry {
    char *name;          /* full record name, e.g. "archive/data/0" */
    uint64_t size;       /* uncompressed == stored size */
    uint64_t header_off; /* local header offset, relative to the archive start */
    uint64_t data_off;   /* payload offset, relative to the archive start (from the local header) */
    uint32_t crc;        /* CRC-32 from the central directory */
    uint16_t method;
    uint16_t flags;
    int crc_checked;     /* a read has checked the CRC of the whole record */
    int no_crc;          /* the record has no CRC-32 to check (a legacy torch.save storage) */
    char *bad;           /* why the record is unusable (local header, overlap), or NULL */
} zip_entry;

typedef struct zip_reader {
    const unsigned char *mem; /* in-memory archive, or NULL */
    int fd;                   /* file, when mem is NULL */
    uint64_t base, len;       /* the archive = [base, base+len) of the file / buffer */
    char *what;               /* name for messages */
    zip_entry *entries;
    size_t n;
    size_t *by_name;          /* entry indices sorted by name */
    char prefix[256];         /* common record prefix ("archive/") */
} zip_reader;

int zip_open_mem(zip_reader *z, const void *buf, size_t len, const char *what, fsdp_err *err);
int zip_open_fd(zip_reader *z, int fd, uint64_t base, uint64_t len, const char *what, fsdp_err *err);
void zip_close(zip_reader *z);
/* Finds a record by its name after the common prefix ("data.pkl", "data/0"); NULL if absent.
 * A binary search. */
zip_entry *zip_find(zip_reader *z, const char *suffix);
/* Reads [off, off+n) of a record's payload into dst (STORED only; compressed: error). When the
 * range is the whole record its CRC-32 is checked (a mismatch is an error naming the file and
 * record); a part of a record is read unchecked. */
int zip_read(zip_reader *z, zip_entry *e, uint64_t off, void *dst, size_t n, fsdp_err *err);
/* The same, and checks the whole record's CRC-32 whatever the range: the bytes outside it are
 * read through a bounded buffer, once per record (not again once a read has checked it). */
int zip_read_checked(zip_reader *z, zip_entry *e, uint64_t off, void *dst, size_t n, fsdp_err *err);
/* xf->n elements of xf->src_dt at byte off of a record into dst as xf->dst_dt, in one pass
 * (ckpt_pread.h: CRC, conversion and NaN check fused into the copy). The record's CRC-32 is
 * checked when the range is the whole record, and with `check` also for a part (as
 * zip_read_checked does). */
int zip_read_xf(zip_reader *z, zip_entry *e, uint64_t off, void *dst, ckpt_rd_xf *xf, int check, fsdp_err *err);
/* Checks a record's CRC-32 (reads it through a bounded buffer). */
int zip_verify(zip_reader *z, zip_entry *e, fsdp_err *err);
/* The whole record into a malloc'd buffer (records up to 1 GiB), CRC checked. */
int zip_read_all(zip_reader *z, zip_entry *e, void **out, size_t *len, fsdp_err *err);

/* ---- writer: stored records, 64-byte aligned payloads, data descriptors, zip64 ---------- */

typedef struct zip_writer {
    FILE *f;             /* output stream, positioned at the archive start */
    uint64_t start;      /* file offset of the archive start */
    uint64_t pos;        /* bytes written so far (relative) */
    struct zip_wrec {
        char *name;
        uint64_t off, size;
        uint32_t crc;
        uint64_t header_off;
    } *recs;
    size_t n, cap;
    int open_rec;        /* a record is being streamed */
    uint32_t crc;
    uint64_t rec_size, rec_expect;
    int failed;
} zip_writer;

int zip_writer_begin(zip_writer *w, FILE *f, fsdp_err *err);
/* A whole record. */
int zip_writer_add(zip_writer *w, const char *name, const void *data, size_t n, fsdp_err *err);
/* A record of a known size streamed in pieces: start, data..., end. */
int zip_writer_start(zip_writer *w, const char *name, uint64_t size, fsdp_err *err);
int zip_writer_data(zip_writer *w, const void *data, size_t n, fsdp_err *err);
/* The same as zip_writer_data for a stream on a file, by positional writes of several
 * threads (ckpt_pio.h) that also compute the CRC and start the write-back; the stream is
 * flushed before and positioned after the bytes. */
int zip_writer_data_par(zip_writer *w, const void *data, size_t n, fsdp_err *err);
/* n values of src (src_dt) appended as dst_dt. A payload larger than one piece goes through
 * ckpt_pwrite_conv (converted piece by piece into per-thread buffers, CRC taken while each piece
 * is in cache, positional writes of several threads; the stream must be on a file), a smaller
 * one through the stream's buffer; threads and pieces from the environment (ckpt_pwrite_opts_env). */
int zip_writer_data_conv(zip_writer *w, const void *src, fsdp_dtype src_dt, fsdp_dtype dst_dt, size_t n,
                         fsdp_err *err);
/* The same for n float32 values that gen produces piece by piece (ckpt_pwrite_gen; a small payload
 * produced whole first). */
int zip_writer_data_gen(zip_writer *w, ckpt_gen_fn gen, void *user, fsdp_dtype dst_dt, size_t n, fsdp_err *err);
int zip_writer_end_record(zip_writer *w, fsdp_err *err);
/* Central directory + zip64 end records + EOCD; returns the archive length in *len. */
int zip_writer_finish(zip_writer *w, uint64_t *len, fsdp_err *err);
void zip_writer_free(zip_writer *w);

#endif
