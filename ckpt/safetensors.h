/* safetensors reader and writer (module prefix st_).
 *
 * Format (Hugging Face safetensors): an 8-byte little-endian header length N, N bytes of JSON
 * header {"<tensor>": {"dtype", "shape", "data_offsets": [begin, end)}, ..., "__metadata__":
 * {str: str}}, then the byte buffer; offsets are relative to 8 + N.
 *
 * Reader: st_open() maps each file (mmap, read-only) and parses and fully validates only the
 * JSON headers, each in one pass without a JSON tree (a header of millions of tensors costs a
 * small multiple of its size); tensor bytes are touched on demand (st_data, st_read_rows). It accepts
 *   - a single .safetensors file,
 *   - a Hugging Face sharded checkpoint: the `*.safetensors.index.json` file itself (weight_map ->
 *     shard files, each validated against the index), or
 *   - a directory holding `model.safetensors.index.json`, else `model.safetensors`, else exactly
 *     one `*.safetensors.index.json`, else exactly one `*.safetensors`.
 * Tensor names are unique across all shards. Tensors are listed file by file (shards in file-name
 * order), each file's tensors in data-offset order.
 *
 * Writer: st_writer_* writes one file streaming: the caller declares every tensor (name, dtype,
 * shape) and the optional __metadata__ first, st_writer_begin() fixes the layout and writes the
 * header, then the caller supplies each tensor's bytes, in any tensor order and in any number of
 * pieces per tensor (pieces of one tensor arrive in order); nothing is buffered. The layout and
 * header bytes match safetensors' own writer (tensors sorted by descending dtype alignment, then
 * by name; compact JSON with __metadata__ first; padded with spaces to a multiple of 8). The file
 * is written to `<path>.tmp` (locked by its writer while it exists: runtime/tmpfile.h; a FIFO there
 * is an error, never a hang), fsync'ed and renamed onto `<path>` by st_writer_finish(), which
 * replaces an existing file atomically.
 * st_shards_* does the same for a Hugging Face sharded checkpoint directory; over an existing one
 * (an index is there) the shards get new names and the index is replaced last
 * (safetensors_gen.c).
 */
#ifndef FSDP_CKPT_SAFETENSORS_H
#define FSDP_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_HEADER_SIZE 100000000ULL /* the reference reader's limit on N */

/* ------------------------------------------------------------------ dtypes */

/* The fsdp dtype of a safetensors dtype string ("F32", "BF16", ...); FSDP_DT_INVALID when the
 * string is not a safetensors dtype fsdp-run supports. */
fsdp_dtype st_dtype_parse(const char *s);
/* 1 when s is a dtype the safetensors format defines but fsdp-run cannot represent
 * (F4, F6_E2M3, F6_E3M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ). */
int st_dtype_is_foreign(const char *s);
/* Position of dt in safetensors' dtype order (increasing alignment: BOOL < U8 < I8 < F8_E5M2 <
 * F8_E4M3 < I16 < U16 < F16 < BF16 < I32 < U32 < F32 < C64 < F64 < I64 < U64); -1 when dt has no
 * safetensors name. The writer sorts by this rank, descending. */
int st_dtype_rank(fsdp_dtype dt);

/* ------------------------------------------------------------------ reader */

typedef struct st_tensor_info {
    const char *name;
    fsdp_dtype dtype;
    int ndim;                      /* 0 for a scalar */
    int64_t shape[FSDP_MAX_DIMS];
    uint64_t nbytes;               /* prod(shape) * element size */
    uint64_t offset;               /* absolute byte offset of the data in its file */
    size_t file;                   /* index for st_file_path() */
} st_tensor_info;

typedef struct st_reader st_reader;

/* Opens path (a file, an index json, or a directory; see above). On error *out is NULL and err
 * names the file (and tensor) at fault. */
int st_open(st_reader **out, const char *path, fsdp_err *err);
void st_close(st_reader *r);

size_t st_count(const st_reader *r);
const st_tensor_info *st_tensor(const st_reader *r, size_t i); /* NULL when i >= count */
const st_tensor_info *st_find(const st_reader *r, const char *name); /* NULL when absent */

/* Files: 1 for a single file; the shards (sorted by name) for an index. */
size_t st_file_count(const st_reader *r);
const char *st_file_path(const st_reader *r, size_t file);
/* The descriptor the reader holds open for that file (the one it mapped and checked), or -1; its size. */
int st_file_fd(const st_reader *r, size_t file);
uint64_t st_file_size(const st_reader *r, size_t file);
/* The index json path, or NULL when a single file was opened. */
const char *st_index_path(const st_reader *r);
/* metadata.total_size of the index; -1 when absent or when no index was opened. */
int64_t st_index_total_size(const st_reader *r);

/* __metadata__ of one file (string -> string, in header order). */
size_t st_metadata_count(const st_reader *r, size_t file);
int st_metadata_at(const st_reader *r, size_t file, size_t i, const char **key, const char **value);
const char *st_metadata_get(const st_reader *r, size_t file, const char *key); /* NULL if absent */

/* Zero-copy view of a tensor's bytes inside the mapping (valid until st_close). The pointer may
 * be misaligned for the element size in files from old writers; see st_is_aligned. */
const void *st_data(const st_reader *r, const st_tensor_info *t);
int st_is_aligned(const st_reader *r, const st_tensor_info *t);

/* Number of dim-0 rows (1 for a scalar) and elements per row (prod(shape[1:]), 1 for a scalar). */
int64_t st_rows(const st_tensor_info *t);
int64_t st_row_numel(const st_tensor_info *t);

/* Copies rows [r0, r1) of dim 0 into dst converted to dst_dt (FSDP_DT_INVALID = as stored), via
 * fsdp_convert. dst must be aligned for dst_dt and hold (r1-r0)*st_row_numel(t) elements. A
 * scalar has one row. Misaligned mapped data is copied through an aligned bounce buffer. */
int st_read_rows(const st_reader *r, const st_tensor_info *t, int64_t r0, int64_t r1, void *dst,
                 fsdp_dtype dst_dt, fsdp_err *err);
/* The whole tensor (all rows). */
int st_read(const st_reader *r, const st_tensor_info *t, void *dst, fsdp_dtype dst_dt, fsdp_err *err);
/* st_find + st_read; FSDP_E_INVALID naming the tensor and the checkpoint when absent. */
int st_read_named(const st_reader *r, const char *name, void *dst, fsdp_dtype dst_dt, fsdp_err *err);

/* ------------------------------------------------------------------ writer (one file) */

typedef struct st_writer st_writer;

/* Creates a writer for path; nothing touches the file system before st_writer_begin. */
int st_writer_new(st_writer **out, const char *path, fsdp_err *err);
/* Adds one __metadata__ entry (kept in call order; a repeated key is an error). */
int st_writer_set_metadata(st_writer *w, const char *key, const char *value, fsdp_err *err);
/* Declares a tensor; *idx (may be NULL) receives its index (0, 1, ... in declaration order). */
int st_writer_declare(st_writer *w, const char *name, fsdp_dtype dt, int ndim, const int64_t *shape,
                      size_t *idx, fsdp_err *err);
/* Fixes the layout (duplicate names are an error here), creates `<path>.tmp`, writes the header. */
int st_writer_begin(st_writer *w, fsdp_err *err);
/* Appends len bytes to tensor idx (its bytes so far + len must not exceed its size). */
int st_writer_write(st_writer *w, size_t idx, const void *data, size_t len, fsdp_err *err);
/* Checks that every tensor is complete, fsyncs, renames `<path>.tmp` to path, fsyncs the directory. */
/* For a caller writing tensor idx's bytes itself (positional writes on *fd, e.g. a streamed copy):
 * where its next byte goes; then st_writer_wrote accounts for len bytes written there (failed: the
 * write failed, the writer is failed and its temporary removed by st_writer_free). */
int st_writer_target(st_writer *w, size_t idx, int *fd, uint64_t *off, fsdp_err *err);
int st_writer_wrote(st_writer *w, size_t idx, uint64_t len, int failed, fsdp_err *err);
int st_writer_finish(st_writer *w, fsdp_err *err);
/* Frees the writer; if it was not finished, the temporary file is removed. */
void st_writer_free(st_writer *w);

/* Layout queries (after st_writer_begin): the data size, the file size, and the declared index
 * of the tensor at position pos in file order (the order that writes most sequentially). */
uint64_t st_writer_data_size(const st_writer *w);
uint64_t st_writer_file_size(const st_writer *w);
size_t st_writer_count(const st_writer *w);
size_t st_writer_file_order(const st_writer *w, size_t pos);
/* 1 when all of tensor idx's bytes were written. */
int st_writer_complete(const st_writer *w, size_t idx);

/* One tensor held in memory, for st_save. */
typedef struct st_entry {
    const char *name;
    fsdp_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data; /* prod(shape) * element size bytes; may be NULL when fill is used */
} st_entry;

/* Producer callback for st_save: write tensor idx's bytes with st_writer_write(w, idx, ...). */
typedef int (*st_fill_fn)(void *user, st_writer *w, size_t idx, fsdp_err *err);

/* Writes n tensors (and meta_n key/value pairs meta[2*i], meta[2*i+1]) to path in one call.
 * With fill == NULL the bytes come from entries[i].data; otherwise fill is called once per
 * tensor, in file order, and must write that tensor completely. */
int st_save(const char *path, const st_entry *entries, size_t n, const char *const *meta,
            size_t meta_n, st_fill_fn fill, void *user, fsdp_err *err);

/* ------------------------------------------------------------------ writer (HF shards) */

typedef struct st_shards st_shards;

/* A sharded checkpoint in directory dir (created if missing): `<base>-0000k-of-0000n.safetensors`
 * and `<base>.safetensors.index.json` ({"metadata": {"total_size": N}, "weight_map": {...}}, keys
 * sorted, indent 2). base NULL = "model". Tensors go to shards in declaration order; a shard is
 * closed before it would exceed max_shard_bytes (0 = no limit); a larger tensor gets a shard of
 * its own. The index is always written, also for one shard. */
int st_shards_new(st_shards **out, const char *dir, const char *base, uint64_t max_shard_bytes,
                  fsdp_err *err);
/* __metadata__ written into every shard (e.g. "format" -> "pt"). */
int st_shards_set_metadata(st_shards *s, const char *key, const char *value, fsdp_err *err);
int st_shards_declare(st_shards *s, const char *name, fsdp_dtype dt, int ndim, const int64_t *shape,
                      size_t *idx, fsdp_err *err);
/* Plans the shards. A shard file is created on the first write to one of its tensors and
 * finished (fsync + rename) as soon as all its tensors are complete. */
int st_shards_begin(st_shards *s, fsdp_err *err);
int st_shards_write(st_shards *s, size_t idx, const void *data, size_t len, fsdp_err *err);
/* Finishes every shard (all tensors must be complete) and writes the index last. */
int st_shards_finish(st_shards *s, fsdp_err *err);
void st_shards_free(st_shards *s);
/* mkdir -p of dir (an existing non-directory on the way is an error). */
int st_mkdirs(const char *dir, fsdp_err *err);
/* 1 when a save-safetensors output is already there: base NULL, anything at path (a single file's
 * name); else path is an HF directory whose <base>.safetensors.index.json exists. */
int st_output_exists(const char *path, const char *base);
/* The file a one-file save-safetensors writes for `path` (README "save-safetensors: file or
 * directory"): a path ending in .safetensors is the file; with Hugging Face names (hf) any other path
 * is the export's directory, and the file is path/model.safetensors (config.json beside it, so that
 * from_pretrained(path) opens it); without them the path is the file as written. 1 when it is a
 * directory. */
int st_export_file(const char *path, int hf, char *out, size_t cap);
/* Beside the one file `file` (DIR/model.safetensors): DIR/model.safetensors.index.json naming every tensor of it
 * ({"metadata": {"total_size": N}, "weight_map": {name: "model.safetensors"}}), written atomically: the
 * loaders that open a Hugging Face directory by its index (OLMo-core's load_hf_model) take it too. */
int st_write_index_of(const char *file, fsdp_err *err);
size_t st_shards_count(const st_shards *s);                 /* after begin */
size_t st_shards_of(const st_shards *s, size_t idx);        /* shard of tensor idx, after begin */
const char *st_shards_file(const st_shards *s, size_t shard); /* file name (no directory) */

#ifdef __cplusplus
}
#endif
#endif
