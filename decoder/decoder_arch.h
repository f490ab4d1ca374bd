/* The table of trainable architectures (the rows decoder_config starts from): what each is called in a
 * recipe and in a Hugging Face config.json, and the defaults its config starts from. Everything
 * that differs between them is data here and in decoder_config; the model code reads only the
 * switches of decoder_config (qkv_bias, qk_norm, tie_embeddings, head_dim, rope scaling, norm_eps).
 *
 *   arch    HF model_type / class          qkv bias  qk-norm  defaults (recipe-declared model)
 *   llama3  llama  / LlamaForCausalLM      no        no       torchtitan's (norm_eps 1e-5, llama3 RoPE
 *                                                             scaling 8/1/4/8192, torchtitan init)
 *   qwen2   qwen2  / Qwen2ForCausalLM      q, k, v   no       norm_eps 1e-6, theta 1e6, no scaling,
 *                                                             HF init (normal 0.02)
 *   qwen3   qwen3  / Qwen3ForCausalLM      no        yes      as qwen2
 *   qwen3_moe  qwen3_moe / Qwen3MoeForCausalLM  no   yes      as qwen3; experts (norm_topk_prob read,
 *                                                             decoder_sparse_step, mlp_only_layers)
 *   olmoe   olmoe  / OlmoeForCausalLM      no        yes (over the whole projection)  experts,
 *                                                             norm_topk_prob read (false by default)
 *   mixtral mixtral / MixtralForCausalLM   no        no       experts, top-k always renormalised,
 *                                                             block_sparse_moe names
 * Qwen2.5 checkpoints are model_type qwen2. */
#ifndef FSDP_DECODER_DECODER_ARCH_H
#define FSDP_DECODER_DECODER_ARCH_H

#include <stddef.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum decoder_rope_scaling { DECODER_ROPE_NONE = 0, DECODER_ROPE_LLAMA3 = 1 } decoder_rope_scaling;

/* The trainable architecture families (decoder/decoder_arch.c holds their table: names, the Hugging
 * Face model_type and class, defaults). They differ only in data: the switches of decoder_config
 * (decoder/decoder_config.h: qkv_bias, qk_norm, tie_embeddings, head_dim, rope scaling, norm_eps) feed one forward and
 * backward. DECODER_ARCH_LLAMA3 is torchtitan's Llama 3.x (and Hugging Face's `llama`). */
typedef enum decoder_arch {
    DECODER_ARCH_LLAMA3 = 0,
    DECODER_ARCH_QWEN2 = 1,
    DECODER_ARCH_QWEN3 = 2,
    DECODER_ARCH_QWEN3_MOE = 3,
    DECODER_ARCH_OLMOE = 4,
    DECODER_ARCH_MIXTRAL = 5,
    DECODER_ARCH_COUNT
} decoder_arch;

/* How an architecture's Hugging Face checkpoint names its experts (runtime/state.h's moe_style). */
typedef enum decoder_moe_names { DECODER_MOE_NAMES_NONE = 0, DECODER_MOE_NAMES_MLP = 1, DECODER_MOE_NAMES_MIXTRAL = 2 } decoder_moe_names;

typedef struct decoder_arch_info {
    decoder_arch arch;
    const char *name;       /* model.arch in a recipe */
    const char *model_type; /* config.json "model_type" */
    const char *hf_class;   /* config.json "architectures"[0] */
    int qkv_bias;           /* fixed by the architecture (Qwen2 hard-codes bias on q/k/v) */
    int qk_norm;
    /* defaults of a recipe-declared model of this arch */
    double norm_eps, rope_theta;
    decoder_rope_scaling rope_scaling;
    double init_std; /* 0: torchtitan init */
    /* Hugging Face config class defaults, for keys a config.json leaves out */
    double hf_norm_eps, hf_rope_theta;
    int hf_head_dim; /* 0: hidden_size / num_attention_heads */
    /* mixture of experts */
    int moe;               /* a mixture-of-experts family: its config.json must give the experts */
    int qk_norm_full;      /* q/k norms over the whole projection (OLMoE) */
    int norm_topk_fixed;   /* -1: norm_topk_prob is read from the config; 0/1: the family's fixed rule */
    decoder_moe_names moe_names;
    int moe_every_layer;   /* no decoder_sparse_step / mlp_only_layers: every layer is MoE */
    /* Hugging Face config class defaults of the experts, for keys a config.json leaves out */
    int hf_n_experts, hf_top_k;
    double hf_aux_coef;
    /* the config class's pad_token_id when config.json has no such key (-1: None); the class passes it to
     * nn.Embedding as padding_idx */
    int hf_pad_token_id;
} decoder_arch_info;

/* The entry of arch, NULL when out of range. */
const decoder_arch_info *decoder_arch_get(decoder_arch arch);
/* By recipe name ("llama3"; "llama" is accepted too), NULL when unknown. */
const decoder_arch_info *decoder_arch_by_name(const char *name);
/* By config.json model_type, NULL when unknown. */
const decoder_arch_info *decoder_arch_by_model_type(const char *model_type);
/* By config.json class name ("Qwen2ForCausalLM"), NULL when unknown. */
const decoder_arch_info *decoder_arch_by_class(const char *hf_class);
/* "llama3, qwen2, qwen3" (recipe names) or "llama, qwen2, qwen3" (model types) into buf. */
void decoder_arch_list(int model_types, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
