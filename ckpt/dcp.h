/* PyTorch Distributed Checkpoint (DCP) directories: `.metadata` (a pickle of
 * torch.distributed.checkpoint.metadata.Metadata) and `__<rank>_<n>.distcp` files whose
 * items are torch.save archives. See ../shared/docs/dcp-format.md. */
#ifndef FSDP_CKPT_DCP_H
#define FSDP_CKPT_DCP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/dcp_gen.h"
#include "ckpt/pickle.h"
#include "ckpt/torchsave.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "runtime/tmpfile.h"
#include "runtime/name_index.h"

#define DCP_REL_PATH_MAX 256 /* a data file's name, its NUL included */

/* Where a value or chunk a reader found is stored. A checkpoint saved by thousands of ranks lists millions
 * of chunks, so the file name is one shared string: "" when there is no storage entry, else the name as
 * the reader interned it (owned by its items, dcp_items_free). */
typedef struct dcp_storage {
    const char *relative_path;
    uint64_t offset, length;
} dcp_storage;

/* A chunk's offsets and sizes (item->ndim of each) point into its item's coords, or into the table of
 * coordinates the parse folded them into (kept by the item array's sentinel, with the file names). */
typedef struct dcp_chunk {
    int64_t *offsets;
    int64_t *sizes;
    dcp_storage where;
} dcp_chunk;

/* The file names the parse of one `.metadata` interned (dcp_meta.c); an item array's sentinel holds them. */
typedef struct dcp_names dcp_names;

typedef struct dcp_item {
    char *fqn;
    int is_tensor;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* global */
    dcp_chunk *chunks;
    size_t n_chunks;
    int64_t *coords;              /* offsets and sizes of the chunks that do not point into the folded table */
    dcp_storage where;            /* byte items */
    char *value_text;             /* decoded byte item (lazily), repr-like */
    /* An array of items from dcp_parse_metadata or dcp_open has one more, zeroed, entry after its last:
     * it holds the file names their storage points at (dcp_items_free frees them). */
    dcp_names *names;
} dcp_item;

/* n chunks for x (of x->ndim dims), no storage (""); the last `own` of them with zeroed offsets and sizes in
 * x->coords (the others' pointers are the caller's to set); x's chunks and coords before are freed. 0, or
 * FSDP_E_NOMEM. */
int dcp_item_chunks_alloc(dcp_item *x, size_t n, size_t own, fsdp_err *err);

typedef struct dcp_ckpt {
    char *dir;
    int dfd; /* the directory, open: every file is opened beneath it (runtime/fileio.h) */
    dcp_item *items;
    size_t n;
    char version[32];
    char id[DCP_GEN_ID_LEN + 1]; /* the save's identity from .metadata (dcp_gen.h); "" for none */
    uint64_t meta_hash;          /* FNV-1a of the .metadata read (0: rank-local metadata) */
    int rank_local;              /* read from `__<r>.metadata` files (no identities) */
    int restarts;                /* how many times the checkpoint changed while it was being opened */
    /* open .distcp files (by relative path) */
    struct dcp_file {
        char *rel;
        int fd;
        uint64_t size;
        struct dcp_st_blob *st; /* parsed safetensors header (dcp_st.h), when its tensors are one */
    } *files;
    size_t n_files, files_cap;
    nidx item_names, file_names; /* fqn -> index in items, rel -> index in files */
    struct dcp_plan_ix *plan;    /* per item: its chunks indexed for read planning (dcp_plan.h) */
} dcp_ckpt;

/* Reads `.metadata` (or merges rank-local `__<r>.metadata` files); a directory without
 * either is an incomplete checkpoint. Validates every tensor's chunks (in bounds, no
 * overlap, full coverage) and that every storage range lies inside its file.
 *
 * One save, or an error: right after `.metadata` every data file it names is opened and kept open
 * (a later overwrite cannot change what this reader sees), and each file's save identity must be
 * the one `.metadata` records (dcp_gen.h). When anything fails after `.metadata` was read and
 * `.metadata` has changed meanwhile (a writer replaced the checkpoint), the open starts again from
 * the new `.metadata` (c->restarts counts it), at most DCP_OPEN_TRIES times in all, then fails
 * naming the directory and "overwritten while it was being read". Every file (`.metadata`, data
 * files) is opened beneath the directory: a symlink leading out of it is refused. */
#define DCP_OPEN_TRIES 4
int dcp_open(const char *dir, dcp_ckpt **out, fsdp_err *err);
void dcp_close(dcp_ckpt *c);
/* The descriptor (and size) of data file rel as dcp_open opened and checked it (c keeps it). */
int dcp_data_fd(dcp_ckpt *c, const char *rel, int *fd, uint64_t *size, fsdp_err *err);
/* Index of the item named fqn, or -1: O(log n). */
long dcp_find(const dcp_ckpt *c, const char *fqn);
/* Reads the box [off, off+len) of tensor item i into dst (C order) converted to dst_dt,
 * reading only the byte ranges of the chunks it intersects. */
int dcp_read_box(dcp_ckpt *c, size_t i, const int64_t *off, const int64_t *len, void *dst, fsdp_dtype dst_dt,
                 fsdp_err *err);
/* The same; *nan (may be NULL) becomes 1 when dst_dt is float32 and a value read is NaN (checked
 * while each piece is in cache, ckpt_pread.h). */
int dcp_read_box_nan(dcp_ckpt *c, size_t i, const int64_t *off, const int64_t *len, void *dst, fsdp_dtype dst_dt,
                     int *nan, fsdp_err *err);
/* Decodes byte item i: its pickled value as a tree (the caller frees *doc). */
int dcp_read_value(dcp_ckpt *c, size_t i, pkl_doc **doc, const pkl_obj **root, fsdp_err *err);
/* The byte item as text (ints "5", floats "0.001", tuples "(0.9, 0.95)", strings "'x'"); an error
 * naming the value when it does not decode (e.g. its pickle names a global outside the allow-list). */
int dcp_value(dcp_ckpt *c, size_t i, const char **text, fsdp_err *err);
/* The same, NULL when it does not decode. */
const char *dcp_value_text(dcp_ckpt *c, size_t i);
/* The byte item's pickle (its data.pkl record, byte for byte, after it decoded); *buf malloc'd. */
int dcp_value_pickle(dcp_ckpt *c, size_t i, void **buf, size_t *len, fsdp_err *err);
/* Checks the CRC-32 of every record of every torch.save piece the items point at (each piece read
 * once, in file order, nothing kept: a piece several items share, as save-dcp's aliases do, is
 * checked and counted once); *records counts them. An error names the tensor or value (the first
 * that points at the piece), file and record. */
int dcp_verify(dcp_ckpt *c, size_t *records, fsdp_err *err);
/* 1 when the record s is a torch.save archive (a zip at its offset), whose bytes are its item's
 * whatever names it: several items with one such record share it (save-dcp's aliases). 0 for a
 * safetensors piece (serialization_format=SAFETENSORS: every chunk of a file records the blob's
 * start, the name picks the tensor) or an unreadable record. */
int dcp_record_is_archive(dcp_ckpt *c, const dcp_storage *s);
/* Decodes a Metadata pickle buffer into items (used by dcp_open and the fuzzer). */
int dcp_parse_metadata(const void *buf, size_t len, const char *what, dcp_item **items, size_t *n, char *version,
                       size_t vcap, fsdp_err *err);
void dcp_items_free(dcp_item *items, size_t n);

/* ---- writer ----------------------------------------------------------------------------- */

/* Where a writer put a record (its own copy of the file name). */
typedef struct dcp_rec_storage {
    char relative_path[DCP_REL_PATH_MAX];
    uint64_t offset, length;
} dcp_rec_storage;

/* A record of where one item (or one chunk of one tensor) was written. */
typedef struct dcp_record {
    char fqn[512];
    int is_tensor;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];   /* global */
    int64_t offsets[FSDP_MAX_DIMS]; /* of this chunk */
    int64_t sizes[FSDP_MAX_DIMS];
    dcp_rec_storage where;
    /* Its planner_data path (how dcp.save's flattening nested the key; dcp_to_torch_save rebuilds
     * the state dict from it). nest 0: by torchtitan's sections (a top-level parameter, or
     * ("optimizer", rest) ...). nest k > 0: the first k dotted components of fqn are elements of their
     * own, as ints where bit j of int_mask is set (a list index), and the rest of fqn one more
     * element: "model.a.b" with nest 1 is ("model", "a.b"); "optimizer.param_groups.0.lr" with nest
     * 3 and int_mask 4 is ("optimizer", "param_groups", 0, "lr"). */
    int16_t nest;
    uint16_t int_mask;
    /* with nest > 0: the last `tail` dotted components are elements of their own too, the middle one element
     * ("optimizer_state.state.a.b.exp_avg" with nest 2 and tail 1 is ("optimizer_state", "state", "a.b",
     * "exp_avg"): a torch optimizer state_dict nested under a key) */
    int16_t tail;
} dcp_record;

/* One rank's data file (dcp_data_file_name), written into dir as `<name>.tmp` (created by
 * tmpf_create: locked by this writer until it is closed) and renamed by dcp_file_close (fsynced,
 * then the directory). Items are appended; each append returns its record. */
typedef struct dcp_file_writer {
    FILE *f;
    char *path, *tmp;
    char rel[64];
    uint64_t pos;
    int rank;
    long items;
    dcp_gen gen; /* the save's identity, written as the file's trailer at close (none when "") */
} dcp_file_writer;

/* Generation 0 (`__<rank>_0.distcp`), without a save identity (pair it with dcp_write_metadata). */
int dcp_file_open(dcp_file_writer *w, const char *dir, int rank, fsdp_err *err);
/* Rank's data file of generation gen (see dcp_commit.c), its trailer carrying gen's identity; note
 * reports a stale temporary removed. */
int dcp_file_open_gen(dcp_file_writer *w, const char *dir, int rank, const dcp_gen *gen, tmpf_note_fn note,
                      void *user, fsdp_err *err);
/* A tensor chunk (C-contiguous data of dtype dt with shape sizes) at global offsets. */
int dcp_file_add_tensor(dcp_file_writer *w, const char *fqn, fsdp_dtype dt, int ndim, const int64_t *global_shape,
                        const int64_t *offsets, const int64_t *sizes, const void *data, dcp_record *rec,
                        fsdp_err *err);
/* The same with the payload streamed: fill() writes exactly numel(sizes) * dtype size bytes
 * through zip_writer_data / zip_writer_data_par (the same file as dcp_file_add_tensor of them). */
int dcp_file_add_tensor_fill(dcp_file_writer *w, const char *fqn, fsdp_dtype dt, int ndim,
                             const int64_t *global_shape, const int64_t *offsets, const int64_t *sizes,
                             ts_fill_fn fill, void *user, dcp_record *rec, fsdp_err *err);
/* A non-tensor value, given as protocol-2 pickle bytes of the value (no PROTO/STOP needed:
 * pass the opcodes of the value only; see dcp_pickle_* helpers). */
int dcp_file_add_value(dcp_file_writer *w, const char *fqn, const void *value_ops, size_t n, dcp_record *rec,
                       fsdp_err *err);
/* A non-tensor value given as a whole pickle (PROTO ... STOP, e.g. from ckpt_value_pickle),
 * stored as it is. */
int dcp_file_add_pickle(dcp_file_writer *w, const char *fqn, const void *pickle, size_t n, dcp_record *rec,
                        fsdp_err *err);
int dcp_file_close(dcp_file_writer *w, fsdp_err *err);
void dcp_file_abort(dcp_file_writer *w);

/* Writes `.metadata` from all ranks' records (any order; chunks are listed per tensor in the
 * order given): to `.metadata.tmp`, fsync, rename, fsync of the directory. Its save_id is a uuid4
 * (no identity: for data files written without one). */
int dcp_write_metadata(const char *dir, const dcp_record *recs, size_t n, fsdp_err *err);
/* The same, recording gen's identity as the save_id (the data files were opened with gen). */
int dcp_write_metadata_gen(const char *dir, const dcp_record *recs, size_t n, const dcp_gen *gen, fsdp_err *err);

/* ---- replacing a checkpoint (dcp_commit.c: why and how) ---------------------------------- */

/* The data file name of rank in generation gen: `__<rank>_0.distcp` (gen 0), `__<rank>_0.g<gen>.distcp`. */
void dcp_data_file_name(char *out, size_t cap, int rank, unsigned gen);
/* 1 when name is a data file name dcp_data_file_name gives (any rank and generation; not its .tmp). */
int dcp_is_data_file_name(const char *name);
/* 1 when dir holds `.metadata` or a rank-local `__<r>.metadata` (a checkpoint, complete or not). */
int dcp_dir_has_checkpoint(const char *dir);
/* 1 for the temporaries DCP writers create (`*.distcp.tmp`, `*.metadata.tmp`). */
int dcp_tmp_owned(const char *name);
/* Before a save into dir: creates it (mkdir -p; an existing non-directory is an error), refuses an
 * existing checkpoint unless overwrite ("<who>: <dir> already holds a checkpoint (<hint>)",
 * FSDP_E_INVALID), removes stale temporaries (reported through note) and picks the generation of the
 * new data files, with a new identity: 0 when there is no checkpoint, else one above the highest
 * generation of any data file in dir (names are never reused while a checkpoint is there). */
int dcp_prepare_dir(const char *dir, int overwrite, const char *who, const char *hint, dcp_gen *gen,
                    tmpf_note_fn note, void *user, fsdp_err *err);
/* After the new `.metadata` (from recs) is durable: removes the replaced checkpoint's files (data
 * files neither referenced by recs nor generation gen's of ranks < world, rank-local metadata, stale
 * temporaries). Failures are reported through note only: the new checkpoint is complete either way.
 * Returns the number of files removed. */
int dcp_remove_old_generations(const char *dir, unsigned gen, int world, const dcp_record *recs, size_t n,
                               tmpf_note_fn note, void *user);

/* Records <-> bytes, for gathering them from every rank (ckpt/dcp_records.c): each record as its fields' bytes
 * only (the fqn and file name by their lengths, the dims up to ndim), about 130 bytes for a chunk of a 2-D
 * tensor where the struct holds 1 KB, so that the coordinator of a 4096-rank save of Llama-3 405B (4.66M chunks)
 * receives 0.6 GB instead of 4.7 GB. The bytes are this build's (host byte order), read back by the same
 * binary on every rank; unpack checks every length and count against the buffer and fails naming the byte. */
int dcp_records_pack(const dcp_record *recs, size_t n, void **out, size_t *len, fsdp_err *err);
int dcp_records_unpack(const void *buf, size_t len, dcp_record **recs, size_t *n, fsdp_err *err);

#endif
