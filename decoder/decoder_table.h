/* The decoder family's adapter to the generic model table (model/model_table.h) and the sharded
 * state (runtime/state.h): a decoder config is one producer of a table (its parameters, from
 * decoder_params_build: names, shapes and init rules), the arch form of `model:` (decoder_table_arch,
 * given to mt_spec_build) and one trainer (train-steps), whose config the table and the state keep
 * opaque (trainer_cfg) and this file reads and sets. */
#ifndef FSDP_DECODER_DECODER_TABLE_H
#define FSDP_DECODER_DECODER_TABLE_H

#include "decoder/decoder_config.h"
#include "model/model_table.h"
#include "model/mt_spec.h"
#include "runtime/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Adds every parameter of a finalized config, as f32, to part `part` of t, each name prefixed by
 * that part's prefix. */
int decoder_table_add(const decoder_config *cfg, mt_table *t, int part, fsdp_err *err);

/* The whole model is this config: an empty table gets one part (named "llama3", no prefix, source
 * "llama3 (preset NAME)" or "llama3 (custom)"), its parameters, the trainer MT_TRAIN_DECODER with a
 * copy of cfg and its kind; then mt_finalize. `where` (may be NULL) is the model section's position. */
int decoder_table_build(const decoder_config *cfg, const char *where, mt_table *t, fsdp_err *err);

/* The decoder family as the `model:` section's built-in architecture (model/mt_spec.h). */
extern const mt_arch decoder_table_arch;

/* The decoder config of a table whose trainer is the decoder family's; NULL for any other table. */
const decoder_config *decoder_table_config(const mt_table *t);

/* The decoder config of the state's trainer (s->trainer_cfg); NULL when the model has none. */
const decoder_config *decoder_state_config(const fsdp_state *s);
/* Gives the state a copy of cfg as its trainer's config (replacing any) and the Hugging Face naming
 * facts that go with it (s->hf); cfg NULL clears both. */
int decoder_state_set_config(fsdp_state *s, const decoder_config *cfg, fsdp_err *err);
/* Dim 0 of the state's parameter `name` became `rows` (the plugin API's resize): when the state has a
 * decoder and that is its embedding (or its untied output head), vocab_size follows it, so that an
 * export writes the new vocabulary and train-steps checks the other matrix against it. */
int decoder_state_param_resized(fsdp_state *s, const char *name, int64_t rows, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
