/* Writing a checkpoint's entries as the data file of one rank of an M-rank DCP save, streamed
 * (ckpt_stream.h): the bytes save-dcp on M ranks writes for the same state. Each tensor of n-d is
 * split along dim 0 as FSDP2's Shard(0) (runtime/shard.h: ceil(rows / M) per rank, an empty shard
 * recorded at offset = rows); a 0-d tensor is written once, by rank 0; the non-tensor values go to
 * rank 0 byte for byte, except the per-rank dataloader entries (dataloader.dp_rank_<r>,
 * dataloader.world_size), which are written for the M ranks as save-dcp writes them (only when the
 * source has some). Used by `fsdp-run ckpt convert --to dcp [--world M]` (every rank's file from one
 * process) and the reshard-dcp stage (each rank its own file). */
#ifndef FSDP_CKPT_RESHARD_H
#define FSDP_CKPT_RESHARD_H

#include <stddef.h>

#include "ckpt/ckpt_stream.h"
#include "ckpt/dcp.h"
#include "ckpt/reader.h"

/* One entry to write: entry i of the reader under name, tensors as dt; or a stack (ckpt/namemap.h
 * "Stacks": torchtitan's grouped experts from per-expert HF tensors): entries parts[0 .. nparts) of
 * the reader, each of one shape, stacked along a new dim 0 into a tensor of ndim / shape (nparts by
 * the parts' shape); i is then parts[0]. */
typedef struct ckrs_entry {
    size_t i;
    const char *name;
    fsdp_dtype dt;
    const size_t *parts; /* NULL: not a stack */
    size_t nparts;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    /* its planner_data path (dcp_record's nest, tail, int_mask); nest 0: by torchtitan's sections */
    int16_t nest, tail;
    uint16_t int_mask;
} ckrs_entry;

/* Tensor i as dt whole into a malloc'd *buf, for tensors the stream cannot take (a .pt source, rows
 * permuted by a name mapping); *stream = 0 there. */
typedef int (*ckrs_read_fn)(void *user, size_t i, fsdp_dtype dt, void **buf, fsdp_err *err);
typedef int (*ckrs_stream_fn)(void *user, size_t i);
typedef int (*ckrs_alias_fn)(void *user, size_t i, size_t j);

typedef struct ckrs_src {
    ckpt_reader *r;
    const ckrs_entry *e;
    size_t n;
    int world;           /* M */
    int regen_loader;    /* rewrite the dataloader entries for M ranks (--world given) */
    int values_first;    /* each file's values before its tensors (save-dcp's and PyTorch's order);
                            0: one file (rank 0 of 1), every entry in the given order */
    ckrs_stream_fn can_stream; /* NULL: every tensor the reader can stream */
    ckrs_read_fn read_whole;
    void *user;
    cks_opts o;
    /* Entries i and j of the reader whose stored pieces are the same (i an alias of j,
     * ckpt_entry.is_alias) give the same bytes: 1 (NULL: always). Then, when j is written before i
     * as the same dtype, i is written as an alias: records of its own under its name that point at
     * j's bytes, none written twice (as save-dcp writes its aliases). */
    ckrs_alias_fn same_bytes;
} ckrs_src;

/* Appends the parts of ranks [lo, hi) to fw[0 .. hi-lo) (opened by the caller: dcp_file_open_gen):
 * each file its values, then its tensors in the source's order; the records of rank lo + j into
 * recs[j] (room for n + 2 each), nrec[j] of them. Ranks are written tensor by tensor, so that the
 * source's records are read once, in order, and their CRC-32s checked (a range of ranks that does
 * not cover every row of a record reads it unchecked, as any partial read). */
int ckrs_write_ranks(const ckrs_src *s, int lo, int hi, dcp_file_writer *fw, cks_files *fc, dcp_record **recs,
                     size_t *nrec, fsdp_err *err);

/* The stacked entry k of s (ckrs_entry.parts) written as ckrs_write_ranks writes a tensor: the chunk
 * of each rank of [lo, hi) (Shard(0) of the stack: whole parts, or rows of the parts at its ends when
 * the ranks outnumber them) streamed part piece by piece into one record, parts the stream cannot take
 * read whole through s->read_whole. ckpt_reshard_stack.c. */
int ckrs_write_stack(const ckrs_src *s, size_t k, int lo, int hi, dcp_file_writer *fw, cks_files *fc,
                     dcp_record **recs, size_t *nrec, fsdp_err *err);

/* 1 for dataloader.dp_rank_<r> and dataloader.world_size. */
int ckrs_is_loader_key(const char *name);

#endif
