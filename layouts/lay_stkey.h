/* OLMo's safetensors key encoding (olmo/safetensors_util.py; layouts/lay_stkey.c): a name is
 * base64url(pickle((keys, value_is_pickled))). */
#ifndef FSDP_LAYOUTS_LAY_STKEY_H
#define FSDP_LAYOUTS_LAY_STKEY_H

#include <stddef.h>

#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "fsdp/error.h"

#define LAY_STKEY_NAME 1024 /* bytes of a decoded (dotted) or an encoded name */

/* The dotted key of an encoded name ("state.transformer.wte.weight.exp_avg") and whether its value is pickled. */
int lay_stkey_decode(const char *enc, char *dotted, size_t cap, int *pickled, fsdp_err *err);
/* The encoded name of key tuple keys[0 .. n) (1 to 3 components), OLMo's encode_key(STKey(keys, pickled)) byte for
 * byte; -1 when it does not fit cap or has another number of components. */
int lay_stkey_name(const char *const *keys, size_t n, int pickled, char *out, size_t cap);
/* A pickle's bytes as base64url text (padded with '='); -1 when cap is too small. */
int lay_stkey_encode(const void *pickle, size_t n, char *out, size_t cap);
/* A twin file read under its decoded names, its pickled values as values (a dict flattened, a list of dicts by
 * index: param_groups.<i>.<option>), as the torch.save file it is the twin of reads. */
int lay_stkey_open(const char *path, ckpt_reader **out, fsdp_err *err);

#endif
