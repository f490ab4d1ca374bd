/* The recipe's `model:` section -> a model table (module prefix mt_spec_).
 *
 * Two forms, never mixed (a key of one in the other is an error naming it and where):
 *
 *   the built-in arch form (trainable):   model: {arch: llama3, preset: debugmodel, dim: ..., ...}
 *     the keys of the architecture the caller passes (mt_spec_opts.arch: decoder/decoder_table.h's
 *     decoder_table_arch, whose table and trainer are the decoder family's); train-steps can train it.
 *
 *   the table form (any model; every stage but train-steps):
 *     model: {params: [ENTRY...], dims: {...}, dtype: f32, init: RULE}        an inline table
 *     model: {table: FILE.yaml, dims: {...}}                                  a table file
 *     model: {from: CHECKPOINT, keys: [GLOB...], exclude: [GLOB...], strip_prefix: P, format: auto,
 *             dtype: bf16, init: RULE}                                        what a checkpoint holds
 *     model: {dims: {...}, parts: [PART...]}                                  several composed
 *   Each single form above takes `prefix` (prepended to its names) and `name` too, and is a PART of
 *   `parts:`; a part may also be a built-in arch ({name, prefix, arch: llama3, preset: ...}). ENTRY
 *   syntax: model/mt_yaml.h; dims: model/mt_dims.h (a part's dims, then the model's, then a table
 *   file's own dims, first match wins). A table file is YAML with `params` and optional `dims`,
 *   `dtype`, `init`; its path is relative to the file that names it (else to the working directory).
 *   Checkpoint paths are relative to the working directory, as in load-ckpt. Part names default to
 *   the prefix without its trailing dot, else "part<N>" (1-based); they are unique, and load-ckpt
 *   `parts:` selects by them.
 *
 * Composition adds every part's parameters in order into one table: a name two parts declare is an
 * error naming both (with both shapes when they differ). The composed model has no trainer. */
#ifndef FSDP_MODEL_MT_SPEC_H
#define FSDP_MODEL_MT_SPEC_H

#include "fsdp/value.h"
#include "model/model_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A built-in trainable architecture, for the arch form and the arch parts of `parts:`. The room that
 * knows the architecture provides it (decoder/decoder_table.h: decoder_table_arch); model/ names none. */
typedef struct mt_arch {
    /* The whole model is the arch form `model` (its keys checked by mt_spec_check_arch_keys): builds
     * the empty table t (one part, its parameters, the trainer, the kind; mt_finalize). `where` (may be
     * NULL) is the section's file:line:col. */
    int (*build)(const fsdp_value *model, const char *where, mt_table *t, fsdp_err *err);
    /* Checks the arch part m (its keys without name and prefix) and adds its parameters to part `part`
     * of t (t NULL: only the check, the table being incomplete). */
    int (*add_part)(const fsdp_value *m, mt_table *t, int part, fsdp_err *err);
} mt_arch;

typedef struct mt_spec_opts {
    /* validate: a source file (checkpoint, table file, config file) that does not exist yet does not
     * fail: the table is left incomplete (out->incomplete = 1), the rest of the section is still
     * checked for its syntax, keys, dims names and init rules. */
    int validate;
    /* The built-in architecture; NULL: an arch form or arch part is an error saying so. */
    const mt_arch *arch;
} mt_spec_opts;

/* 1 when the section uses the table form (it has params, table, from or parts). */
int mt_spec_is_table(const fsdp_value *model);

/* The arch form's check of its own: no key of the table form in it (dims, prefix, dtype, ...), an
 * error naming the key and where. 0 for a table-form section. */
int mt_spec_check_arch_keys(const fsdp_value *model, fsdp_err *err);

/* Builds *out (initialised here) from a `model:` section; on error *out is freed. */
int mt_spec_build(const fsdp_value *model, const mt_spec_opts *o, mt_table *out, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
