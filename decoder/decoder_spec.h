/* The arch form of a recipe's `model:` section -> a decoder config (module prefix decoder_spec_): the
 * keys, a preset, and `from_hf: DIR` (a Hugging Face config.json, decoder/hf_config.h) as the base the
 * other keys override. Above decoder_config (the struct, its presets and checks) and hf_config. */
#ifndef FSDP_DECODER_DECODER_SPEC_H
#define FSDP_DECODER_DECODER_SPEC_H

#include "decoder/decoder_config.h"
#include "fsdp/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds *cfg from a recipe's `model:` map (NULL or null = empty map): starts from
 * decoder_config_defaults(), applies `preset` (whatever its position in the map), then every other
 * key in map order, then decoder_config_finalize(). Keys: arch (must be llama3), preset, dim,
 * n_layers, n_heads, n_kv_heads (null = n_heads), vocab_size, multiple_of, ffn_dim_multiplier
 * (null = None), norm_eps, rope_theta, max_seq_len, depth_init (bool), rope_scaling (none|llama3),
 * rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos.
 * Unknown keys, wrong types and out-of-range values are errors at the value's file:line:col. */
int decoder_spec_from_value(decoder_config *cfg, const fsdp_value *model, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
