/* The compact form of a DCP `.metadata` while it is parsed (internal to ckpt/dcp_meta*.c): the
 * ChunkStorageMetadata, MetadataIndex and _StorageInfo objects, millions of them in a checkpoint saved
 * by thousands of ranks, are folded as the pickle reader builds them (pkl_parse_fold) into flat tables,
 * and the lists and dicts they go into keep a run of table entries instead of a tree: a chunk costs
 * about 70 bytes while its `.metadata` is parsed instead of 2 KB. Only what passes every check
 * dcp_meta.c makes of such an object is folded; anything else stays in the tree, where dcp_meta.c
 * reports it as it always did. */
#ifndef FSDP_CKPT_DCP_META_FOLD_H
#define FSDP_CKPT_DCP_META_FOLD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/dcp.h"

/* A folded object's tag (pkl_obj.i of a PKL_FOLDED node): its kind above bit 56, its table index below. */
enum { DCP_FOLD_CHUNK = 1, DCP_FOLD_INDEX = 2, DCP_FOLD_STORAGE = 3 };
#define DCP_FOLD_SHIFT 56

typedef struct dcp_fold_index {
    const char *fqn; /* the parse's string (valid while its document is) */
    uint64_t at;     /* its offsets in dcp_fold.ints */
    int ndim;        /* -1: offset None */
} dcp_fold_index;

typedef struct dcp_fold_storage {
    const char *rel; /* the parse's string */
    uint64_t offset, length;
} dcp_fold_storage;

typedef struct dcp_fold_pair {
    uint32_t ix, st; /* a MetadataIndex -> _StorageInfo entry of storage_data, both folded */
} dcp_fold_pair;

typedef struct dcp_fold {
    /* per folded chunk: ndim, its offsets, its sizes (build order) */
    int64_t *coords;
    size_t n_coords, cap_coords;
    /* the folded MetadataIndex offsets */
    int64_t *ints;
    size_t n_ints, cap_ints;
    dcp_fold_index *ix;
    size_t n_ix, cap_ix;
    dcp_fold_storage *st;
    size_t n_st, cap_st;
    dcp_fold_pair *pairs;
    size_t n_pairs, cap_pairs;
    /* the list whose run of chunks ends the coords table, the dict whose run ends the pairs table */
    const void *run_list, *run_dict;
    uint64_t run_end; /* where run_list's run ends in coords */
} dcp_fold;

/* The class name of o when it is one of DCP's metadata classes (either module torch has used), else NULL. */
const char *dcp_meta_class(const pkl_obj *o);

/* Hooks for pkl_parse_fold with f as their user (zeroed first; dcp_fold_free after); consume: pkl_fold's. */
void dcp_fold_hooks(dcp_fold *f, pkl_fold *hooks, int consume);
void dcp_fold_free(dcp_fold *f);

/* Taken runs: a list's folded chunks are coords entries from l->i, l->len of them (each 1 + 2 ndim
 * values); a dict's folded entries are pairs [d->i, d->i + d->len). The tree's own items follow them. */
static inline int dcp_fold_kind(const pkl_obj *o) {
    return o && o->kind == PKL_FOLDED ? (int)((uint64_t)o->i >> DCP_FOLD_SHIFT) : 0;
}
static inline uint64_t dcp_fold_at(const pkl_obj *o) { return (uint64_t)o->i & ((1ull << DCP_FOLD_SHIFT) - 1); }

#endif
