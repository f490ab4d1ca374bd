/* Llama's adapter to the generic model table (model/model_table.h): a Llama-family config is one
 * producer of a table (its parameters, from decoder_params_build: names, shapes and init rules) and
 * one trainer (train-steps). */
#ifndef FSDP_DECODER_DECODER_TABLE_H
#define FSDP_DECODER_DECODER_TABLE_H

#include "decoder/decoder_config.h"
#include "model/model_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Adds every parameter of a finalized config, as f32, to part `part` of t, each name prefixed by
 * that part's prefix. */
int decoder_table_add(const decoder_config *cfg, mt_table *t, int part, fsdp_err *err);

/* The whole model is this config: an empty table gets one part (named "llama3", no prefix, source
 * "llama3 (preset NAME)" or "llama3 (custom)"), its parameters, the trainer MT_TRAIN_LLAMA with cfg
 * and its kind; then mt_finalize. `where` (may be NULL) is the model section's position. */
int decoder_table_build(const decoder_config *cfg, const char *where, mt_table *t, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
