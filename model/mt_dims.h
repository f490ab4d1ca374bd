/* Named dims of a parameter table (module prefix mt_dims_): sizes declared once and used in shapes
 * and name ranges (`shape: [heads*head_dim, hidden]`, `layers.{0..n_layers-1}.x`).
 *
 * A scope is a YAML map of name -> definition, each one of
 *   an integer                         hidden: 64
 *   an expression of other dims        head_dim: hidden / heads
 *   a shape of a declared parameter    hidden: {shape: language_model.model.norm.weight, dim: 0}
 *                                      (dim may count from the end: -1 is the last)
 *   a key of a JSON file               heads: {config: ckpt/llm/config.json, key: num_attention_heads}
 *                                      (key: a dotted path into nested objects; the value an integer)
 *   a count of a checkpoint's tensors  layers: {count: "**layers.*.layer_norm1.weight", in: ckpt/vit}
 *                                      (how many tensor names match the glob; the header only)
 * Definitions are evaluated when first used and remembered, so a shape reference may name a
 * parameter of any part declared before the part that uses it. Expressions: integers, dim names,
 * + - * ( ), `/` (exact division: a remainder is an error), `//` (floor division), `%`, unary minus;
 * int64 arithmetic with overflow checks. A definition that refers to itself (directly or through
 * others) is an error naming the cycle.
 *
 * A name is looked up along the scope's chain (mt_dims_set_chain), first match wins: the recipe's
 * part dims, then the model's, then a table file's own (defaults the recipe may override). Every
 * error names file:line:col of the definition or of the expression that failed. */
#ifndef FSDP_MODEL_MT_DIMS_H
#define FSDP_MODEL_MT_DIMS_H

#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/value.h"
#include "model/model_table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_DIMS_CHAIN_MAX 4

typedef struct mt_dims mt_dims;

/* A scope over `map` (NULL or null: an empty scope; anything but a map is an error at it). t is the
 * table shape references look into (it may grow while the scope lives). `missing`, when not NULL,
 * turns a config file that does not exist into FSDP_E_IO with *missing = 1 (validate: the file may
 * appear later) instead of an ordinary error. The chain starts as this scope alone. */
int mt_dims_new(const fsdp_value *map, const mt_table *t, int *missing, mt_dims **out, fsdp_err *err);
void mt_dims_free(mt_dims *d);
/* The scopes names are looked up in, in order (d itself must be one of them; at most
 * MT_DIMS_CHAIN_MAX). Every scope's chain must outlive its use. */
void mt_dims_set_chain(mt_dims *d, mt_dims *const *chain, int n);

/* Evaluates an expression (text, e.g. "heads*head_dim" or "64") in d's chain; `at` positions errors. */
int mt_dims_eval(mt_dims *d, const char *expr, const fsdp_value *at, int64_t *out, fsdp_err *err);
/* Evaluates a shape entry: an integer scalar or an expression (a list or map is an error at it). */
int mt_dims_eval_value(mt_dims *d, const fsdp_value *v, int64_t *out, fsdp_err *err);
/* Checks an expression without evaluating it: its syntax and that every name is a dim of the chain. */
int mt_dims_check(mt_dims *d, const char *expr, const fsdp_value *at, fsdp_err *err);
/* Checks every definition of the scope the same way (syntax, names, the map forms' keys). */
int mt_dims_check_all(mt_dims *d, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
