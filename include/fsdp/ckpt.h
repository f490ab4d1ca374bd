/* fsdp-run public API (stage ABI 1.2): reading checkpoints from a plugin.
 *
 * Any checkpoint fsdp-run reads (a DCP directory of any world size or mesh, a safetensors file, an
 * HF directory or its index, a torch.save .pt): its tensors by name, any rows of dim 0, as float32 or
 * another float dtype. Each rank opens and reads on its own (no collective). Errors name the stage,
 * the call and the checkpoint. */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_ckpt fsdp_ckpt;

int fsdp_ckpt_open(fsdp_ctx *ctx, const char *path, fsdp_ckpt **out, fsdp_err *err);
void fsdp_ckpt_close(fsdp_ckpt *c);
/* Tensor `name`'s global shape and stored dtype; FSDP_E_INVALID naming it when the checkpoint has no such tensor. */
int fsdp_ckpt_shape(fsdp_ckpt *c, const char *name, int *ndim, int64_t *shape, fsdp_dtype *dtype, fsdp_err *err);
/* Rows [row0, row0 + rows) of tensor `name` (a 0-d tensor: row 0) into dst as dt. */
int fsdp_ckpt_read(fsdp_ckpt *c, const char *name, int64_t row0, int64_t rows, fsdp_dtype dt, void *dst,
                   fsdp_err *err);

/* ---- stage ABI 1.2: a plugin's state in the checkpoints ---------------------------------------
 * Named bytes a plugin keeps with the model's state: saved in every checkpoint fsdp-run writes in its
 * own layout (save-dcp, train-steps' periodic and requested saves) as the value plugin_state.<key>
 * (a pickled Python bytes object, rank 0's value), and given back by a
 * load-ckpt of such a checkpoint (which replaces the state's). key: "<prefix>.<name>", 1-128 of a-z, A-Z,
 * 0-9, '_', '-', '.', the prefix the plugin's own (its stage kind). n 0 removes the key. Needs a model. */
int fsdp_plugin_state_set(fsdp_ctx *ctx, const char *key, const void *data, size_t n, fsdp_err *err);
/* The bytes under key: 0 with *data (valid until the next set or load) and *n, FSDP_E_INVALID when the
 * state holds none (a fresh run). */
int fsdp_plugin_state_get(fsdp_ctx *ctx, const char *key, const void **data, size_t *n, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
