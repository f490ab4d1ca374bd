/* Hugging Face config.json <-> decoder_config (decoder/decoder_config.h) for the architectures of
 * decoder/decoder_arch.h (llama, qwen2, qwen3).
 *
 * Reading (decoder/hf_config.c) understands both forms transformers writes:
 *   transformers 4: top-level "rope_theta" and "rope_scaling" (null or {"rope_type" | "type", ...});
 *   transformers 5: "rope_parameters" {"rope_theta", "rope_type", ...} (also nested under the one
 *                   layer type "full_attention").
 * The architecture comes from "model_type" (else "architectures"[0]); "architectures", when present,
 * must name the causal LM class of that model_type. Keys a file leaves out take the transformers
 * config class's default (rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false, Qwen3
 * head_dim 128, num_key_value_heads = num_attention_heads, initializer_range 0.02). What fsdp-run
 * cannot train is an error naming the file, the key and the value: another model_type (e.g.
 * "mixtral"), hidden_act other than silu, attention_bias or mlp_bias true (Llama, Qwen3: o_proj and
 * MLP biases), sliding-window attention, a RoPE type other than default and llama3, a partial
 * rotary factor.
 *
 * Writing (decoder/hf_config_write.c) produces a config.json that transformers 4 and 5 both load with
 * AutoModelForCausalLM.from_pretrained: the transformers 4 form (top-level rope_theta and
 * rope_scaling), which transformers 5 converts to rope_parameters itself. */
#ifndef FSDP_DECODER_HF_CONFIG_H
#define FSDP_DECODER_HF_CONFIG_H

#include <stddef.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "decoder/decoder_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads path (a model directory holding config.json, or the file itself) into *cfg, finalized.
 * Errors name the file ("<dir>/config.json: ..."). Never blocks on a FIFO. */
int hf_config_read(const char *path, decoder_config *cfg, fsdp_err *err);
/* The same from JSON text (len bytes); `what` names it in messages. */
int hf_config_parse(const char *text, size_t len, const char *what, decoder_config *cfg, fsdp_err *err);

/* The config.json of a finalized cfg whose weights are stored as dtype (f32, bf16 or f16), as
 * malloc'd NUL-terminated JSON text (keys sorted, indented). */
int hf_config_to_json(const decoder_config *cfg, fsdp_dtype dtype, char **text, fsdp_err *err);
/* Writes dir/config.json atomically (a locked .tmp fsynced and renamed over it, then the
 * directory fsynced): a reader sees the old file or the new one, never a part. */
int hf_config_write(const decoder_config *cfg, fsdp_dtype dtype, const char *dir, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
