/* The decoder family's configuration (Llama 3.x, Qwen2, Qwen3: the rows of decoder/decoder_arch.h;
 * torchtitan's architecture and parameter names).
 * Shared by the parameter table / init (decoder/decoder_config.c, decoder/decoder_params.c), the
 * forward/backward (model/decoder_model.c) and the stages. */
#ifndef FSDP_DECODER_DECODER_CONFIG_H
#define FSDP_DECODER_DECODER_CONFIG_H

#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/value.h"

#include "decoder/decoder_arch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mlp_only_layers may name layers below 64 * DECODER_DENSE_LAYER_WORDS. */
#define DECODER_DENSE_LAYER_WORDS 16

typedef struct decoder_config {
    char preset[32];           /* a preset's name (decoder_config_preset_name), or "" */
    decoder_arch arch;           /* the family (names, defaults, the HF config.json it writes) */
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
    decoder_rope_scaling rope_scaling;
    double rope_factor;            /* llama3 scaling: 8 (Llama 3.1), 32 (Llama 3.2) */
    double rope_low_freq_factor;   /* 1 */
    double rope_high_freq_factor;  /* 4 */
    int rope_original_max_pos;     /* 8192 */
    /* architecture switches (0 everywhere: torchtitan's Llama 3) */
    int qkv_bias;          /* wq, wk, wv carry a bias (Qwen2); wo never does */
    int qk_norm;           /* RMSNorm over head_dim on q and on k, per head, before RoPE (Qwen3) */
    int tie_embeddings;    /* the output head uses tok_embeddings.weight: ONE parameter, no output.weight */
    int head_dim_set;      /* explicit head_dim (Qwen3, HF head_dim); 0: dim / n_heads */
    int ffn_hidden_set;    /* explicit FFN width (HF intermediate_size); 0: torchtitan's formula */
    double init_std;       /* > 0: Hugging Face init (normal(0, init_std) matrices and embedding, zero
                              biases, unit norms); 0: torchtitan's init (decoder_params.h) */
    /* mixture of experts (n_experts 0: every layer has the dense SwiGLU MLP). A layer l is a MoE layer
     * when n_experts > 0, (l + 1) % moe_step == 0 and l is not in dense_layers (Qwen3-MoE's
     * decoder_sparse_step and mlp_only_layers; OLMoE and Mixtral: every layer). */
    int n_experts;          /* num_experts / num_local_experts */
    int top_k;              /* num_experts_per_tok */
    int moe_ffn_hidden;     /* an expert's width: moe_intermediate_size (Qwen3-MoE) or intermediate_size */
    int norm_topk;          /* the top-k probabilities are renormalised to sum to 1 (norm_topk_prob) */
    int moe_step;           /* decoder_sparse_step (>= 1) */
    uint64_t dense_layers[DECODER_DENSE_LAYER_WORDS]; /* mlp_only_layers, a bit per layer */
    double router_aux_coef; /* router_aux_loss_coef: the load-balancing loss's weight in the objective */
    int qk_norm_full;       /* with qk_norm: one RMSNorm over the whole q (k) projection, weights [H*hd]
                               ([KV*hd]) (OLMoE), instead of one per head over head_dim */
    /* The embedding's padding_idx (Hugging Face's pad_token_id: every class of the family builds
     * nn.Embedding(vocab, hidden, padding_idx=pad_token_id)): the lookup's backward gives that row no
     * gradient (on every path: CPU, GPU, accumulation, checkpointing, experts, HSDP; a tied head's own
     * gradient into it stays), and Hugging Face's init draws it as zeros. has_padding_idx 0: none. */
    int has_padding_idx;
    int padding_idx;        /* 0 <= padding_idx < vocab_size */
    /* derived by decoder_config_finalize() */
    int head_dim;              /* head_dim_set, or dim / n_heads */
    int ffn_hidden;            /* ffn_hidden_set, or multiple_of * ceil(int(mult * int(2*4*dim/3)) / multiple_of) */
} decoder_config;

/* ---- decoder/decoder_config.c ----------------------------------------------------------------
 *
 * Presets (torchtitan's flavors; exact numbers in decoder_config.c):
 *   tiny         the fixture model (shared/fixtures/torch-2.11/tiny): dim 64, 2 layers, 4 heads,
 *                2 kv heads, vocab 256, multiple_of 32, theta 1e4, max_seq_len 64, no rope scaling
 *   debugmodel   torchtitan "debugmodel" (6,163,712 params)
 *   llama3_1b    torchtitan "1B" (untied output here; torchtitan >= 2026-04 ties it)
 *   llama3_8b    torchtitan "8B" (8,030,261,248 params)
 *   llama3_70b   torchtitan "70B" (70,553,706,496 params)
 *   llama3_405b  torchtitan "405B" (405,853,388,800 params)
 * Every preset but tiny uses llama3 RoPE scaling (factor 8, low 1, high 4, original 8192) and
 * max_seq_len 131072, like torchtitan >= v0.2.0, which applies it unconditionally and replaces
 * max_seq_len with the training sequence length. */

/* torchtitan's TransformerModelArgs defaults, with the sizes (dim, n_layers, n_heads,
 * vocab_size) unset (0) so that finalize insists on them: n_kv_heads 0 (= n_heads),
 * multiple_of 256, ffn_dim_multiplier None, norm_eps 1e-5, rope_theta 10000,
 * max_seq_len 131072, depth_init 1, llama3 scaling 8/1/4/8192. */
void decoder_config_defaults(decoder_config *cfg);

/* Replaces *cfg with a preset (finalized). Unknown names list the known ones. */
int decoder_config_preset(decoder_config *cfg, const char *name, fsdp_err *err);
/* The preset's arch, sizes and switches into cfg, not finalized; an unknown name (null_text is shown
 * for NULL) is FSDP_E_INVALID listing the presets and the nearest one. */
int decoder_config_apply_preset(decoder_config *cfg, const char *name, const char *null_text, fsdp_err *err);
/* Resets cfg to decoder_config_defaults() with the arch's defaults and switches (sizes unset). */
void decoder_config_arch_defaults(const decoder_arch_info *a, decoder_config *cfg);

/* Name of the i-th preset, NULL past the end. */
const char *decoder_config_preset_name(int i);

/* Validates and fills head_dim and ffn_hidden (n_kv_heads 0 becomes n_heads): all sizes > 0,
 * dim % n_heads == 0, n_heads % n_kv_heads == 0, head_dim even, positive finite norm_eps and
 * rope_theta, ffn_dim_multiplier None or > 0, llama3 scaling with factor > 0,
 * high_freq_factor > low_freq_factor > 0, original_max_pos > 0; ffn_hidden and the parameter
 * count must fit (int, int64). ffn_hidden follows torchtitan / refmodel.py exactly:
 * h = int(2*(4*dim)/3); if mult: h = int(mult*h); F = multiple_of * ceil(h / multiple_of). */
int decoder_config_finalize(decoder_config *cfg, fsdp_err *err);

/* Whether layer l of cfg has a mixture of experts (see n_experts) instead of the dense MLP. */
int decoder_layer_is_moe(const decoder_config *cfg, int layer);
/* The number of MoE layers of cfg. */
int decoder_moe_layers(const decoder_config *cfg);
/* The expert fields of a config (decoder_config_finalize calls it): each an error naming the key. */
int decoder_config_check_moe(const decoder_config *cfg, fsdp_err *err);
/* Marks layer l as dense (mlp_only_layers); FSDP_E_INVALID when l is out of the bitmask's range. */
int decoder_config_set_dense_layer(decoder_config *cfg, int layer, fsdp_err *err);

/* The token whose embedding row gets no gradient (cfg->padding_idx), or -1 when there is none. */
int decoder_padding_idx(const decoder_config *cfg);

/* Total number of parameters of a finalized config (untied output), -1 when invalid. */
int64_t decoder_param_count(const decoder_config *cfg);
/* Parameter elements rank 0 holds when every parameter is Shard(0) over `world` ranks (the largest
 * shard: ceil(rows / world) rows of each); world 1 gives decoder_param_count. -1 when invalid. */
int64_t decoder_param_count_shard(const decoder_config *cfg, int world);

/* torchtitan's MFU FLOPs per token: 6 * (N - vocab*dim) + 12 * n_layers * n_heads * head_dim *
 * seq_len, with N = decoder_param_count (tok_embeddings excluded, output.weight included) less the
 * experts no token uses (MoE layers x (n_experts - top_k) x 3 x moe_ffn_hidden x dim: active parameters).
 * -1 when cfg is invalid or seq_len < 0. */
double decoder_flops_per_token(const decoder_config *cfg, int64_t seq_len);

#ifdef __cplusplus
}
#endif
#endif
