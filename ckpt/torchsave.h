/* torch.save archives: tensors (_rebuild_tensor_v2 / _v3, any dtype, size/stride/storage
 * offset honoured) and plain Python values, read from a zip_reader; writing of one tensor
 * or one value in the layout DCP uses (records data.pkl, byteorder, data/0, version). */
#ifndef FSDP_CKPT_TORCHSAVE_H
#define FSDP_CKPT_TORCHSAVE_H

#include <stdint.h>
#include <stdio.h>

#include "ckpt/pickle.h"
#include "ckpt/zip.h"
#include "fsdp/tensor.h"

/* Where a tensor's values are inside an archive. */
typedef struct ts_tensor {
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t stride[FSDP_MAX_DIMS]; /* in elements */
    int64_t storage_offset;        /* in elements */
    int64_t storage_numel;
    int64_t numel;                 /* elements of the tensor */
    uint64_t need;                 /* bytes of its record it needs: its storage's bytes (a broadcast
                                      view, stride 0, returns more than it reads); UINT64_MAX when
                                      those or numel x element size do not fit 64 bits */
    char key[64];                  /* record data/<key> */
} ts_tensor;

/* Decodes a rebuild call (REDUCE(_rebuild_tensor_v2|_v3, args)) into *t; what names it. Every
 * size, stride and offset is checked (no overflow; the elements lie in the storage). */
int ts_tensor_from_pickle(const pkl_obj *o, const char *what, ts_tensor *t, fsdp_err *err);
/* The same from the rebuild function and its argument tuple. */
int ts_tensor_from_call(const pkl_obj *fn, const pkl_obj *args, const char *what, ts_tensor *t, fsdp_err *err);
/* Whether o is a tensor as torch.save writes one: a rebuild call, an nn.Parameter around one
 * (_rebuild_parameter / _rebuild_parameter_with_state) or a tensor subclass (_rebuild_from_type_v2);
 * 1 with the rebuild function and its arguments, else 0. */
int ts_tensor_unwrap(const pkl_obj *o, const pkl_obj **fn, const pkl_obj **args);
/* Checks that the tensor's record exists and holds the bytes it needs: "<what>: corrupt:
 * tensor <name> needs N bytes, the record has M (archive/data/K)". Allocates nothing. */
int ts_check_record(zip_reader *z, const ts_tensor *t, const char *name, fsdp_err *err);
/* Reads the box [off[d], off[d]+len[d]) of the tensor into dst (C order) as dst_dt. Reads only
 * the storage range the box spans; ts_check_record first. When the box is the whole tensor the
 * CRC-32 of its whole record is checked (zip_read_checked); a smaller box is read unchecked. */
int ts_read_box(zip_reader *z, const ts_tensor *t, const int64_t *off, const int64_t *len, void *dst,
                fsdp_dtype dst_dt, fsdp_err *err);
/* The same; *nan (may be NULL) becomes 1 when dst_dt is float32 and a value written is NaN,
 * checked while each piece is in cache. */
int ts_read_box_nan(zip_reader *z, const ts_tensor *t, const int64_t *off, const int64_t *len, void *dst,
                    fsdp_dtype dst_dt, int *nan, fsdp_err *err);

/* Parses data.pkl of an archive (the caller frees *doc). */
int ts_load_pickle(zip_reader *z, pkl_doc **doc, const pkl_obj **root, fsdp_err *err);
/* The one tensor an archive holds (a DCP tensor piece: data.pkl's root is the tensor), its record
 * checked (ts_check_record, name in its message). */
int ts_load_tensor(zip_reader *z, const char *name, ts_tensor *t, fsdp_err *err);

/* Writes one C-contiguous tensor as a torch.save archive at the stream's position. data may
 * be NULL with fill() supplying the bytes in pieces (streaming). Returns the archive length. */
typedef int (*ts_fill_fn)(void *user, zip_writer *zw, fsdp_err *err);
int ts_write_tensor(FILE *f, fsdp_dtype dt, int ndim, const int64_t *shape, const void *data, ts_fill_fn fill,
                    void *user, uint64_t *len, fsdp_err *err);
/* The rebuild call of a tensor whose storage is record data/<key>, into a pickle being written (ts_write_tensor's,
 * ckpt/pt_write.h's). */
void ts_w_tensor_ref(pkl_w *w, fsdp_dtype dt, int ndim, const int64_t *shape, const char *key);
/* Writes a pickled value (the caller supplies the protocol-2 pickle bytes) as an archive. */
int ts_write_value(FILE *f, const void *pickle, size_t n, uint64_t *len, fsdp_err *err);
/* The same with its records under archive/ (torch.save names them after the file it writes:
 * "metadata" for metadata.pt). */
int ts_write_value_named(FILE *f, const char *archive, const void *pickle, size_t n, uint64_t *len, fsdp_err *err);

/* The Storage class name torch uses for a dtype ("FloatStorage"), NULL for untyped-only dtypes. */
const char *ts_storage_class(fsdp_dtype dt);
/* The dtype of a Storage class name ("FloatStorage"), 0 when it names none. */
fsdp_dtype ts_storage_dtype(const char *cls);

/* A torch.save file in the legacy format of PyTorch < 1.6 (_use_new_zipfile_serialization=False;
 * ckpt/torchsave_legacy.c) presented as an archive: *z over the file (fd, size bytes) holds a
 * record data/<key> per storage (its bytes, no CRC-32), *doc / *root the saved object's pickle
 * (*pkl_bytes: the pickles' size). Every count, size and offset is checked against the file and
 * the storages' persistent ids; the magic number is the caller's to check (ckpt_pt_is_legacy). */
int ts_legacy_open(zip_reader *z, int fd, uint64_t size, const char *what, pkl_doc **doc, const pkl_obj **root,
                   size_t *pkl_bytes, fsdp_err *err);

#endif
