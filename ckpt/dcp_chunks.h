/* The chunk geometry of DCP tensor items (internal to ckpt/dcp_*.c): checks that a tensor's
 * chunks are well-formed and tile it exactly, and finds chunks by their offsets. Every check is
 * O(n log n) (or O(n 2^d log n) for d dims in which the chunks differ) for n chunks: a
 * `.metadata` with one tensor of 40k chunks takes milliseconds, not minutes. */
#ifndef FSDP_CKPT_DCP_CHUNKS_H
#define FSDP_CKPT_DCP_CHUNKS_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/dcp.h"

/* dcp_parse_metadata, for one rank-local `__<r>.metadata` when whole is 0: every check but the
 * tiling (each rank lists only its own chunks; dcp_open checks the merged list). */
int dcp_parse_metadata_ex(const void *buf, size_t len, const char *what, int whole, dcp_item **items, size_t *n,
                          char *version, size_t vcap, fsdp_err *err);
/* The same, and StorageMeta.save_id into save_id (cap scap; "" when absent; NULL: not wanted), with flags: */
enum {
    DCP_PARSE_CONSUME = 1, /* buf is scratch the parse gives back to the system as it reads it (pkl_fold.consume) */
    DCP_PARSE_TREE = 2     /* no folding (dcp_meta_fold.h): the whole pickle tree first, as before (tests) */
};
int dcp_parse_metadata_id(const void *buf, size_t len, const char *what, int whole, int flags, dcp_item **items,
                          size_t *n, char *version, size_t vcap, char *save_id, size_t scap, fsdp_err *err);

/* The tensor's own metadata: its size has no negative dim, and its element count and byte count
 * (x dtype size) fit int64. what names the file ("<dir>/.metadata"). */
int dcp_check_tensor_size(const char *what, const dcp_item *it, fsdp_err *err);

/* Each chunk alone: offsets and sizes non-negative; a non-empty chunk lies inside the tensor
 * (checked without overflow), and, when it has a storage entry, its elements x dtype size fit the
 * storage length (so no read can allocate more than the file holds). */
int dcp_check_chunk_bounds(const char *what, const dcp_item *it, fsdp_err *err);

/* The non-empty chunks tile the tensor exactly: every element in exactly one chunk (no overlap,
 * no hole). Call after dcp_check_chunk_bounds. The error names the overlapping pair or the count
 * of missing elements. */
int dcp_check_tiling(const char *what, const dcp_item *it, fsdp_err *err);

/* Chunk indices of it sorted by offsets (lexicographic, then by index); ord has n_chunks entries. */
void dcp_chunks_sort(const dcp_item *it, size_t *ord);
/* The range [*lo, *hi) of ord (sorted by dcp_chunks_sort) whose chunks start at offsets. */
void dcp_chunks_find(const dcp_item *it, const size_t *ord, const int64_t *offsets, size_t *lo, size_t *hi);

/* File names kept once (dcp_names.c): intern returns the table's copy of s ("" for ""; NULL when out of
 * memory); chain makes t own more too; free frees t and all it owns. */
dcp_names *dcp_names_new(void);
const char *dcp_names_intern(dcp_names *t, const char *s);
void dcp_names_chain(dcp_names *t, dcp_names *more);
/* t owns block from now on (freed with it): chunk coordinates items point into. 0, or -1 out of memory. */
int dcp_names_keep(dcp_names *t, void *block);
void dcp_names_free(dcp_names *t);

/* Drops every chunk equal (same offsets and sizes) to an earlier one, keeping the first; the
 * order of the rest is kept. For replicas listed by several rank-local `__<r>.metadata` files. */
int dcp_chunks_dedup(dcp_item *it, fsdp_err *err);

#endif
