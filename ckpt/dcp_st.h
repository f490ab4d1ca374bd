/* DCP data files written with FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS)
 * (torch >= 2.8): after the byte items (torch.save archives as usual), a rank's file holds one
 * safetensors blob with all its tensor chunks keyed by fqn; the __metadata__ entry
 * DCP_SHARDING_INFO records each chunk's "saved_offsets". The .metadata's _StorageInfo of a tensor
 * chunk gives the blob's start as `offset` and the chunk's bytes as `length`
 * (torch/distributed/checkpoint/filesystem.py, _write_item and _write_files_from_queue). */
#ifndef FSDP_CKPT_DCP_ST_H
#define FSDP_CKPT_DCP_ST_H

#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"

/* 1 when the bytes at off of fd start a safetensors header (an 8-byte length, then '{') rather
 * than a zip archive. */
int dcp_st_is_piece(int fd, uint64_t off);

/* The parsed header of a file's blob, kept with the open file. */
typedef struct dcp_st_blob dcp_st_blob;
void dcp_st_blob_free(dcp_st_blob *b);

typedef struct dcp_st_tensor {
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    uint64_t at; /* absolute file offset of its bytes (C order) */
} dcp_st_tensor;

/* Tensor fqn of the blob at off of fd (a file of fsize bytes), parsing the header once into
 * *cache (reused while it is the same blob). Checks the header like a safetensors file's (dtype,
 * shape, offsets inside the file) and, when DCP_SHARDING_INFO lists fqn, that its saved_offsets
 * are the chunk's offsets (ndim of them). what names the file in errors. */
int dcp_st_locate(dcp_st_blob **cache, int fd, uint64_t fsize, uint64_t off, const char *fqn, int ndim,
                  const int64_t *chunk_offsets, const char *what, dcp_st_tensor *t, fsdp_err *err);

/* The box [off, off+len) of t into dst (C order) as dst_dt: one read when the box's rows are
 * contiguous in the file, else one per innermost run. */
int dcp_st_read_box(int fd, const dcp_st_tensor *t, const int64_t *off, const int64_t *len, void *dst,
                    fsdp_dtype dst_dt, const char *what, fsdp_err *err);

#endif
