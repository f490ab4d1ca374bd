/* Internals shared by the ckpt_reader backends. */
#ifndef FSDP_CKPT_READER_IMPL_H
#define FSDP_CKPT_READER_IMPL_H

#include <pthread.h>

#include "ckpt/reader.h"
#include "runtime/name_index.h"

typedef struct ckpt_ops {
    /* nan (may be NULL): set to 1 when dst_dt is float32 and a value read is NaN */
    int (*read_rows)(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, int *nan,
                     fsdp_err *err);
    const char *(*value_text)(ckpt_reader *r, size_t i);
    void (*close)(ckpt_reader *r);
    /* the index of name, -1 when absent (NULL: ckpt_open builds the name index `names`) */
    long (*find)(const ckpt_reader *r, const char *name);
    /* Readers over other readers (a view, a union; NULL for a reader of files): the reader and index that entry i
     * is unchanged (-1 when none: made of others' rows); a check and a verification of the files beneath. */
    long (*same)(const ckpt_reader *r, size_t i, ckpt_reader **src);
    int (*verify)(ckpt_reader *r, size_t *records, fsdp_err *err);
    int (*check)(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err);
} ckpt_ops;

struct ckpt_reader {
    const ckpt_ops *ops;
    ckpt_format format;
    char *path;
    ckpt_entry *entries;
    size_t n;
    void *impl;
    nidx names; /* entry name -> index of its first entry (built by ckpt_open unless ops->find) */
    uint64_t identity; /* ckpt_identity (set by ckpt_open) */
    int restarts;      /* ckpt_restarts */
    /* a view's source (ckpt/reader_view.h); NULL for a reader of files and for a union (ops->same tells) */
    struct ckpt_reader *inner;
    /* references beyond the opener's (ckpt_reader_ref): ckpt_close closes at the last */
    int extra_refs;
    /* serialises ckpt_read_rows_shared on readers whose reads keep state (all but safetensors) */
    pthread_mutex_t lock;
};

/* A reader with room for n entries (zeroed) over impl; NULL when out of memory. */
ckpt_reader *ckpt_reader_alloc(const char *path, size_t n, const ckpt_ops *ops, ckpt_format format, void *impl);
/* Frees what ckpt_reader_alloc allocated (not impl). */
void ckpt_reader_free(ckpt_reader *r);

int ckpt_open_safetensors(const char *path, ckpt_reader **out, fsdp_err *err);
int ckpt_open_dcp(const char *path, ckpt_reader **out, fsdp_err *err);
int ckpt_open_pt(const char *path, ckpt_reader **out, fsdp_err *err);
/* The same over an open file (the reader owns fd, closed on failure too); path names it. */
int ckpt_open_pt_fd(int fd, const char *path, ckpt_reader **out, fsdp_err *err);
/* A Hugging Face directory of torch.save files (pytorch_model.bin, or the shards that
 * pytorch_model.bin.index.json lists), or that index itself (ckpt/reader_pt_index.c): every file
 * opened beneath the directory; the shards' entries together, the weight_map checked against them. */
int ckpt_open_pt_hf(const char *path, ckpt_reader **out, fsdp_err *err);
/* 1 when r was opened by ckpt_open_pt_hf over an index; then *n shards, shard k in *shard. */
int ckpt_pt_shards(const ckpt_reader *r, ckpt_reader *const **shard, size_t *n);
/* The shard reader and its entry index holding entry i of an index reader. */
void ckpt_pt_locate(const ckpt_reader *r, size_t i, ckpt_reader **shard, size_t *j);
/* 1 when path is a torch.save file in the legacy (pre-1.6, non-zip) format */
int ckpt_pt_is_legacy(const char *path);
/* ckpt_value_pickle of a reader opened by ckpt_open_pt */
int ckpt_pt_value_pickle(ckpt_reader *r, size_t i, void **buf, size_t *len, fsdp_err *err);
/* ckpt_verify of a reader opened by ckpt_open_pt */
int ckpt_verify_pt(ckpt_reader *r, size_t *records, fsdp_err *err);

/* Adds a problem to a ckpt_check report (counted; its message kept while fewer than
 * CKPT_CHECK_SHOWN are). Returns 0, or FSDP_E_NOMEM. */
int ckpt_check_add(ckpt_check_report *rep, const char *fmt, ...) FSDP_PRINTF(2, 3);
/* ckpt_check of a reader opened by ckpt_open_dcp (ckpt/ckpt_check_dcp.c) / ckpt_open_pt: the problems go
 * to rep; returns 0, or an error that stopped the check (out of memory). */
int ckpt_check_dcp(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err);
int ckpt_check_pt(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err);

#endif
