/* The table syntax (module prefix mt_yaml_): parameters declared in a recipe's `model:` section or a
 * table file, as a list of entries (or a map of name -> entry without `name`):
 *
 *   - {name: "model.layers.{0..L-1}.self_attn.{q,k}_norm.weight", shape: [head_dim], init: ones}
 *   - {name: fc1.weight, shape: [hidden, vit_hidden], dtype: bf16, init: default_linear}
 *   - {name: scale, shape: []}                          0-d; no init: it must be loaded or copied
 *   - {like: "model.layers.*.mlp.*.weight", as: "model.layers.*.mlp_moe_gen.*.weight"}
 *
 * name     a pattern with brace groups (model/mt_names.h); each name gets the part's prefix
 * shape    a list of sizes: integers or dims expressions (model/mt_dims.h); [] is a 0-d tensor
 * dtype    f32 | bf16 | f16 (default: the part's `dtype`, else f32)
 * init     an init rule (model/init_rule.h: `normal(0, 0.02)`, `default_linear`, `ones`, ...; default:
 *          the part's `init`, else none)
 * like/as  derive one parameter from every parameter already declared (by any earlier part or entry)
 *          whose name, relative to the part's prefix, matches the glob `like` (ckpt/namemap.h globs:
 *          `*` within a component, `**` across them); its name is `as` with the captures filled in;
 *          shape and dtype are the matched parameter's unless given; init is the entry's, else the
 *          part's, else none (to be copied, e.g. by transform copy). A `like` that matches nothing is an
 *          error.
 * unless_declared  true: each name is declared only when no earlier part or entry declares it (a default
 *          for a tensor a source may or may not hold: a tied LLM checkpoint stores no lm_head.weight,
 *          and a model that unties it declares its own, drawn from its init rule)
 * Unknown keys, a missing name or shape, bad sizes, unknown dims, bad dtypes and bad init rules are
 * errors naming the file:line:col of the value. */
#ifndef FSDP_MODEL_MT_YAML_H
#define FSDP_MODEL_MT_YAML_H

#include "fsdp/value.h"
#include "model/model_table.h"
#include "model/mt_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_yaml_ctx {
    mt_table *t;
    int part;        /* the part the entries belong to (its prefix is prepended) */
    mt_dims *dims;   /* the dims the entries see (with their chain set) */
    fsdp_dtype dtype;/* default dtype (FSDP_DT_INVALID: f32) */
    init_rule init;  /* default init rule (kind INIT_NONE: none) */
    int eval;        /* 0: check the entries without declaring anything (validate, sources unread) */
} mt_yaml_ctx;

/* Declares (or with eval == 0 checks) the entries of `params`: a list of entry maps, or a map of
 * name -> entry. */
int mt_yaml_add(const mt_yaml_ctx *c, const fsdp_value *params, fsdp_err *err);

/* An init rule from a recipe value (a scalar in the init_rule.h syntax); errors at v. */
int mt_yaml_init_rule(const fsdp_value *v, init_rule *out, fsdp_err *err);
/* A parameter dtype from a recipe value (f32, bf16, f16 or their torch names); errors at v. */
int mt_yaml_dtype(const fsdp_value *v, fsdp_dtype *out, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
