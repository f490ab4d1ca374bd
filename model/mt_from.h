/* What a `from:` part (a part declared from a checkpoint's header, model/mt_ckpt.h) says about its
 * source (module prefix mt_from_): the prefix alternatives its keys may carry, the key globs it
 * takes or leaves out (with brace ranges over dims, model/mt_names.h), and the transforms that turn a
 * stored tensor into the declared parameter.
 *
 *   strip_prefix: vision_model.                 keys must start with it; it is removed
 *   strip_prefix: [vision_model., ""]           alternatives, the first that matches is removed ("" matches
 *                                               any key: keys with or without the prefix)
 *   keys:    ["encoder.layers.{0..L-1}.**", "post_layernorm.*"]    brace ranges expand over the dims; a
 *   exclude: ["head.**"]                                           range may expand to no glob at all
 *   transform:                                  the parameter is source.permute(P).reshape(S), as torch
 *     embeddings.patch_embedding.weight: {permute: [0, 2, 3, 1], reshape: [hidden, -1]}
 *
 * A transform's key is a glob on the stripped key; it must match a tensor of the part. `permute` is a
 * permutation of the source tensor's dims (default: none); `reshape` sizes are integers, dims
 * expressions or one -1 (inferred; default: the permuted shape). The element count must not change:
 * a mismatch is an error naming the tensor, its stored shape and the transform, before anything is
 * read. The declared parameter gets the new shape and records the stored one (mt_param.src_*), and
 * a load from the part's source (load-ckpt `parts:` without `path`) applies the transform while
 * reading. In PyTorch: `w.permute(*P).reshape(*S)`. */
#ifndef FSDP_MODEL_MT_FROM_H
#define FSDP_MODEL_MT_FROM_H

#include <stddef.h>

#include "fsdp/error.h"
#include "fsdp/value.h"
#include "model/model_table.h"
#include "model/mt_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_strv {
    char **v;
    size_t n;
} mt_strv;

void mt_strv_free(mt_strv *s);

/* `keys` / `exclude`: a glob or a list of globs, brace groups expanded in d (eval 0: checked only, out
 * left empty). *given: 1 when v is present. Every resulting glob is checked (ckpt/namemap.h syntax). */
int mt_from_globs(const fsdp_value *v, const char *what, mt_dims *d, int eval, mt_strv *out, int *given,
                  fsdp_err *err);
/* `strip_prefix`: a prefix or a list of alternatives ("" allowed in a list). */
int mt_from_strip(const fsdp_value *v, mt_strv *out, fsdp_err *err);
/* `transform`: applies every entry to the parameters of part `part` (names relative to its prefix);
 * eval 0: the syntax and the dims names are checked only. */
int mt_from_transforms(mt_table *t, int part, const fsdp_value *map, mt_dims *d, int eval, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
