/* Name patterns of a parameter table (module prefix mt_names_): braces expand, as in a shell.
 *   `layers.{0..L-1}.attn.q_proj.weight`   a range: every integer from the first bound to the second,
 *                                          inclusive (empty when the second is smaller); the bounds
 *                                          are dims expressions (model/mt_dims.h)
 *   `self_attn.{q,k,v}_proj.weight`        alternatives (literal text, no nesting)
 * Several groups expand to every combination, leftmost varying slowest. At most MT_NAMES_MAX names
 * come from one pattern. */
#ifndef FSDP_MODEL_MT_NAMES_H
#define FSDP_MODEL_MT_NAMES_H

#include <stddef.h>

#include "fsdp/error.h"
#include "fsdp/value.h"
#include "model/mt_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_NAMES_MAX (1 << 20)

typedef struct mt_names {
    char **v;
    size_t n;
} mt_names;

/* Expands pattern (the scalar `at`, for positions) into out (free with mt_names_free). With
 * eval == 0 only the syntax and the dims of the ranges are checked (out is left empty). */
int mt_names_expand(const char *pattern, mt_dims *d, const fsdp_value *at, int eval, mt_names *out, fsdp_err *err);
void mt_names_free(mt_names *n);

#ifdef __cplusplus
}
#endif
#endif
