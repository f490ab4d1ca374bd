/* `fsdp-run ckpt convert --model SPEC`: the model a converted checkpoint holds, so that an export
 * with Hugging Face names carries the config.json transformers opens it with. */
#ifndef FSDP_CLI_CKPT_CLI_MODEL_H
#define FSDP_CLI_CKPT_CLI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "decoder/decoder_config.h"

/* SPEC is a preset name (decoder_config_preset_name) or a Hugging Face model directory / config.json. */
int ckpt_cli_model_load(const char *spec, decoder_config *cfg, fsdp_err *err);

/* One tensor of the converted checkpoint under its Hugging Face name. */
typedef struct ckpt_cli_tensor {
    const char *name;
    int ndim;
    const int64_t *shape;
} ckpt_cli_tensor;

/* The n tensors are exactly the model's parameters (names and shapes): an error names the first
 * tensor the model has no parameter for, of the wrong shape, or the parameters missing. */
int ckpt_cli_model_check(const decoder_config *cfg, const ckpt_cli_tensor *t, size_t n, fsdp_err *err);

/* config.json in the directory of dst (a .safetensors file). */
int ckpt_cli_model_write_config(const decoder_config *cfg, fsdp_dtype dtype, const char *dst, fsdp_err *err);

#endif
