/* Writing a torch.save file of many tensors and plain values (module prefix ptw_), as torch.save writes a state
 * dict: the caller builds the saved object's pickle (ckpt/pickle.h writer calls) and puts each tensor into it with ptw_tensor*, which
 * writes the rebuild call (a storage of its own, data/<k>) and streams the tensor's bytes into the archive as the
 * next record. The records come before data.pkl, which torch.load does not mind (it finds them by name). The
 * file is written as <path>.tmp (runtime/tmpfile.h), fsynced and renamed onto path by ptw_finish; any error
 * leaves no file at path that was not there and removes the temporary. */
#ifndef FSDP_CKPT_PT_WRITE_H
#define FSDP_CKPT_PT_WRITE_H

#include <stdint.h>

#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "fsdp/error.h"

typedef struct ptw_file ptw_file;

/* archive: the records' top folder (torch.save names it after the file: "model" for model.pt). */
int ptw_begin(const char *path, const char *archive, ptw_file **out, fsdp_err *err);
/* The pickle being built (PROTO 2 written already). */
pkl_w *ptw_pickle(ptw_file *t);
/* Tensor i of r (its rows streamed in bounded pieces) as dt (0: its own dtype). */
int ptw_tensor_from(ptw_file *t, ckpt_reader *r, size_t i, fsdp_dtype dt, fsdp_err *err);
/* A C-contiguous tensor in memory. */
int ptw_tensor_mem(ptw_file *t, fsdp_dtype dt, int ndim, const int64_t *shape, const void *data, fsdp_err *err);
/* A tensor whose bytes the caller streams: begin (writes its rebuild call), data... (exactly numel x element size
 * bytes in all), end. */
int ptw_tensor_begin(ptw_file *t, fsdp_dtype dt, int ndim, const int64_t *shape, fsdp_err *err);
int ptw_tensor_data(ptw_file *t, const void *data, size_t n, fsdp_err *err);
int ptw_tensor_end(ptw_file *t, fsdp_err *err);
/* The non-tensor value i of r, written into the pickle as the same value (its own pickle parsed and written
 * again: memo references do not cross pickles). */
int ptw_value_from(ptw_file *t, ckpt_reader *r, size_t i, fsdp_err *err);
/* The same into any pickle being written (a value of r parsed and written again; no storage allowed). */
int ptw_value_into(pkl_w *p, ckpt_reader *r, size_t i, fsdp_err *err);
/* The non-tensor value i of r parsed (*doc freed by the caller with pkl_free). */
int ptw_value_parse(ckpt_reader *r, size_t i, pkl_doc **doc, const pkl_obj **root, fsdp_err *err);
/* STOP, data.pkl, byteorder, version, the central directory; fsync and rename. Frees t. */
int ptw_finish(ptw_file *t, fsdp_err *err);
/* Removes the temporary and frees t (NULL: nothing). */
void ptw_abort(ptw_file *t);

#endif
