/* A torch.save file of many tensors and plain values, as torch.save writes a state dict: the caller builds the
 * saved object's pickle (ckpt/pickle.h writer calls) and puts each tensor into it with ts_tree_tensor*, which
 * writes the rebuild call (a storage of its own, data/<k>) and streams the tensor's bytes into the archive as the
 * next record. The records come before data.pkl, which torch.load does not mind (it finds them by name). The
 * file is written as <path>.tmp (runtime/tmpfile.h), fsynced and renamed onto path by ts_tree_finish; any error
 * leaves no file at path that was not there and removes the temporary. */
#ifndef FSDP_CKPT_TORCHSAVE_TREE_H
#define FSDP_CKPT_TORCHSAVE_TREE_H

#include <stdint.h>

#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "fsdp/error.h"

typedef struct ts_tree ts_tree;

/* archive: the records' top folder (torch.save names it after the file: "model" for model.pt). */
int ts_tree_begin(const char *path, const char *archive, ts_tree **out, fsdp_err *err);
/* The pickle being built (PROTO 2 written already). */
pkl_w *ts_tree_pickle(ts_tree *t);
/* Tensor i of r (its rows streamed in bounded pieces) as dt (0: its own dtype). */
int ts_tree_tensor_from(ts_tree *t, ckpt_reader *r, size_t i, fsdp_dtype dt, fsdp_err *err);
/* A C-contiguous tensor in memory. */
int ts_tree_tensor_mem(ts_tree *t, fsdp_dtype dt, int ndim, const int64_t *shape, const void *data, fsdp_err *err);
/* A tensor whose bytes the caller streams: begin (writes its rebuild call), data... (exactly numel x element size
 * bytes in all), end. */
int ts_tree_tensor_begin(ts_tree *t, fsdp_dtype dt, int ndim, const int64_t *shape, fsdp_err *err);
int ts_tree_tensor_data(ts_tree *t, const void *data, size_t n, fsdp_err *err);
int ts_tree_tensor_end(ts_tree *t, fsdp_err *err);
/* The non-tensor value i of r, written into the pickle as the same value (its own pickle parsed and written
 * again: memo references do not cross pickles). */
int ts_tree_value_from(ts_tree *t, ckpt_reader *r, size_t i, fsdp_err *err);
/* STOP, data.pkl, byteorder, version, the central directory; fsync and rename. Frees t. */
int ts_tree_finish(ts_tree *t, fsdp_err *err);
/* Removes the temporary and frees t (NULL: nothing). */
void ts_tree_abort(ts_tree *t);

/* The rebuild call of a tensor whose storage is record data/<key> (shared with ts_write_tensor). */
void ts_w_tensor_ref(pkl_w *w, fsdp_dtype dt, int ndim, const int64_t *shape, const char *key);

#endif
