/* A table from what a checkpoint holds (module prefix mt_ckpt_): every tensor of a DCP directory, a
 * safetensors file, an HF directory or index, or a torch.save .pt file becomes a parameter with the
 * checkpoint's name, shape and dtype. Only the header is read (ckpt_open: DCP .metadata, safetensors
 * JSON headers, the .pt pickle), never tensor data, so a 7B model's table costs milliseconds.
 * fsdp-run's own bookkeeping keys (optimizer.*, train_state.*, lr_scheduler.*, dataloader.*) and
 * non-tensor values are not parameters. */
#ifndef FSDP_MODEL_MT_CKPT_H
#define FSDP_MODEL_MT_CKPT_H

#include <stddef.h>

#include "ckpt/reader.h"
#include "model/model_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_ckpt_opts {
    ckpt_format format;
    const char *const *strip;       /* prefix alternatives: keys starting with one of them (the first that */
    size_t n_strip;                 /* matches is removed; "" matches every key); n_strip 0: all keys as they are */
    const char *const *keys;        /* globs (ckpt/namemap.h syntax) on the stripped key: keep these */
    size_t n_keys;                  /* 0 and !keys_given: keep every key */
    int keys_given;                 /* keys were asked for (their brace ranges may have expanded to none) */
    const char *const *exclude;     /* globs: drop these */
    size_t n_exclude;
    fsdp_dtype dtype;               /* FSDP_DT_INVALID: each tensor's own dtype (f32, bf16 or f16) */
    init_rule init;                 /* kind INIT_NONE: the values must be loaded */
} mt_ckpt_opts;

/* Adds the tensors of the checkpoint at path to part `part` of t (names get the part's prefix). A
 * tensor whose dtype is not f32/bf16/f16 (e.g. int64 position ids) is an error naming it, unless
 * excluded or o->dtype converts it; a `keys` or `exclude` glob matching no key is an error naming it;
 * so is a checkpoint that yields no parameter. */
int mt_ckpt_add(mt_table *t, int part, const char *path, const mt_ckpt_opts *o, fsdp_err *err);

/* key without the first of the n prefixes it starts with ("" matches every key); NULL when it starts
 * with none of them. */
const char *mt_ckpt_strip(const char *key, const char *const *strip, size_t n);
/* 1 for fsdp-run's bookkeeping keys that are not model parameters (optimizer., train_state., ...). */
int mt_ckpt_is_bookkeeping(const char *key);

#ifdef __cplusplus
}
#endif
#endif
