/* Llama-3 model configuration (torchtitan's architecture and parameter names).
 * Shared by the parameter table / init (model/llama_config.c, model/llama_params.c), the
 * forward/backward (model/llama_model.c) and the stages. */
#ifndef FSDP_MODEL_LLAMA_H
#define FSDP_MODEL_LLAMA_H

#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llama_rope_scaling { LLAMA_ROPE_NONE = 0, LLAMA_ROPE_LLAMA3 = 1 } llama_rope_scaling;

typedef struct llama_config {
    char preset[32];           /* "tiny", "debugmodel", "llama3_1b", "llama3_8b", "llama3_70b", or "" */
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;            /* == n_heads when not grouped */
    int vocab_size;
    int multiple_of;
    double ffn_dim_multiplier; /* <= 0 means None */
    double norm_eps;
    double rope_theta;
    int max_seq_len;
    int depth_init;            /* 1: init std of wo/w2/w3 = 0.02/sqrt(2*(layer+1)) */
    llama_rope_scaling rope_scaling;
    double rope_factor;            /* llama3 scaling: 8 */
    double rope_low_freq_factor;   /* 1 */
    double rope_high_freq_factor;  /* 4 */
    int rope_original_max_pos;     /* 8192 */
    /* derived by llama_config_finalize() */
    int head_dim;              /* dim / n_heads */
    int ffn_hidden;            /* multiple_of * ceil(int(mult * int(2*4*dim/3)) / multiple_of) */
} llama_config;

#ifdef __cplusplus
}
#endif
#endif
