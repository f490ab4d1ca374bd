/* A model's `checks:` (module prefix mt_checks_): what must hold of its sources and sizes, checked
 * when the table is built (so `fsdp-run validate` and the planning of a run report them before any
 * tensor is read), each with the user's own message. Every failed check is reported, one line each.
 *
 *   checks:
 *     - {path: "${llm}", is: dir, message: "vars.llm must be a Hugging Face directory"}
 *     - {config: "${llm}/config.json", key: model_type, in: [qwen2], message: "the LLM must be a Qwen2"}
 *     - {that: "vit_positions >= vit_side * vit_side", message: "the ViT's position table is too small"}
 *     - {has: vit_model.vision_model.post_layernorm.weight, message: "vars.vit is not a SigLIP vision tower"}
 *
 * path    the path exists and is a directory (`is: dir`), a file (`is: file`) or either (`is: any`);
 *         before the parts
 * config  the JSON file's value at the dotted key is one of `in` (text, number or boolean, compared as
 *         such); a missing file or key fails; before the parts
 * that    two dims expressions (model/mt_dims.h) compared with == != < <= > >=; before the parts when
 *         its dims are known then (a config key, a count of a source's tensors), else after them
 * has     the model declares this parameter; after the parts
 * Under `validate` a path that does not exist yet, in a directory that does not exist either (what an
 * earlier recipe of a chain writes), and whatever depends on it, is not checked. */
#ifndef FSDP_MODEL_MT_CHECKS_H
#define FSDP_MODEL_MT_CHECKS_H

#include "fsdp/error.h"
#include "fsdp/value.h"
#include "model/model_table.h"
#include "model/mt_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The syntax of every entry (keys, kinds, `message`), without evaluating anything. */
int mt_checks_syntax(const fsdp_value *checks, fsdp_err *err);
/* Makes every check not made yet (done[i] set when check i is made; the caller zeroes done, one
 * flag per check) and reports every failure. early (before the parts): the path and config checks and
 * the that checks whose dims are known then (a config key, a count of a source's tensors, ...); the
 * others wait for the parts. validate: a path that is not there yet is not checked. */
int mt_checks_run(const fsdp_value *checks, const mt_table *t, mt_dims *d, int early, int validate,
                  unsigned char *done, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
