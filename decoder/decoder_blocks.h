/* The decoder family (Llama 3.x, Qwen2, Qwen3) behind model/model_blocks.h, the interface the FSDP
 * step (train/) trains through: the blocks are the transformer layers (their parameters in the
 * parameter table's order, decoder_params.h, laid out as decoder_model_layer_bind's flat block), the
 * embedding tok_embeddings.weight, the head norm.weight and output.weight (tok_embeddings.weight when
 * tied). The pieces are decoder_model.h's (CPU, decoder_blocks.c) and decoder_cuda.h's (GPU,
 * decoder_blocks_cuda.c); each workspace holds a decoder_model_ws / decoder_cuda_ws and its own copy
 * of the config, so cfg needs to live only while the trainer is created. */
#ifndef FSDP_DECODER_DECODER_BLOCKS_H
#define FSDP_DECODER_DECODER_BLOCKS_H

#include "decoder/decoder_config.h"
#include "model/model_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU implementation for cfg (impl = cfg). */
model_blocks decoder_blocks_cpu(const decoder_config *cfg);
/* The GPU implementation for cfg (impl = cfg; .host is decoder_blocks_cpu(cfg)). */
model_blocks_cuda decoder_blocks_cuda(const decoder_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
