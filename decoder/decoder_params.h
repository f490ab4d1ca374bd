/* The parameter table of a decoder-family config (llama3, qwen2, qwen3): every parameter in
 * torchtitan's order and names, with its global shape and init rule. Sharding, checkpoints, init,
 * the model's flat layout and the optimizer walk this table: it is the single source of a config's
 * parameter list.
 *
 * Order (torchtitan's named_parameters(), as in the fixtures' reference.json "param_names"):
 *   tok_embeddings.weight
 *   for each layer i: layers.{i}.attention.wq.weight  [+ layers.{i}.attention.wq.bias]   (qkv_bias)
 *                     layers.{i}.attention.wk.weight  [+ .bias], layers.{i}.attention.wv.weight [+ .bias],
 *                     layers.{i}.attention.wo.weight,
 *                     [layers.{i}.attention.q_norm.weight, layers.{i}.attention.k_norm.weight]  (qk_norm)
 *                     layers.{i}.feed_forward.w1/w2/w3.weight  (dense layers), or
 *                     layers.{i}.moe.experts.w1/w2/w3, layers.{i}.moe.router.gate.weight  (MoE layers),
 *                     layers.{i}.attention_norm.weight, layers.{i}.ffn_norm.weight
 *   norm.weight, output.weight (absent with tie_embeddings: the head uses tok_embeddings.weight)
 * Shapes: wq [H*hd, d], wk/wv [KV*hd, d], wo [d, H*hd] (hd = head_dim, which may differ from
 * d / H), biases [rows of their weight], q_norm/k_norm [hd] (qk_norm_full: [H*hd], [KV*hd]),
 * w1/w3 [F, d], w2 [d, F], norms [d]; experts w1/w3 [E, Fm, d], w2 [E, d, Fm], router [E, d] (E experts
 * of width Fm = moe_ffn_hidden: torchtitan's GroupedExperts and TokenChoiceTopKRouter).
 * q/k rows (and the q/k biases and q/k-norm weights) are in torchtitan's interleaved RoPE layout
 * (ckpt/namemap.h permutes them to and from Hugging Face's).
 *
 * Init rules, torchtitan (cfg->init_std == 0; init_weights of refmodel.py):
 *   tok_embeddings            normal(0, 1); tied: output's rule (torchtitan skips the embedding's
 *                             init when it is the output head's weight)
 *   wq, wk, wv, w1            trunc_normal(0, 0.02, a=-2, b=2)   (absolute bounds, torch defaults)
 *   wo, w2, w3                trunc_normal(0, init_std, a=-2, b=2), init_std = 0.02/sqrt(2(i+1))
 *                             with depth_init, else 0.02/sqrt(2 n_layers)
 *   attention_norm, ffn_norm, norm, q_norm, k_norm   ones
 *   wq/wk/wv biases           zeros
 *   output                    trunc_normal(0, dim^-0.5, a=-3 dim^-0.5, b=3 dim^-0.5)
 * Hugging Face (cfg->init_std > 0, _init_weights of transformers' Llama/Qwen2/Qwen3): every matrix
 * and the embedding normal(0, init_std), biases zeros, norms ones. */
#ifndef FSDP_DECODER_DECODER_PARAMS_H
#define FSDP_DECODER_DECODER_PARAMS_H

#include <stdint.h>

#include "fsdp/error.h"
#include "model/init_rule.h"
#include "decoder/decoder_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum decoder_param_kind {
    DECODER_P_TOK_EMBEDDINGS = 0,
    DECODER_P_WQ,
    DECODER_P_WK,
    DECODER_P_WV,
    DECODER_P_WO,
    DECODER_P_W1,
    DECODER_P_W2,
    DECODER_P_W3,
    DECODER_P_ATTENTION_NORM,
    DECODER_P_FFN_NORM,
    DECODER_P_NORM,
    DECODER_P_OUTPUT,
    DECODER_P_WQ_BIAS, /* qkv_bias */
    DECODER_P_WK_BIAS,
    DECODER_P_WV_BIAS,
    DECODER_P_Q_NORM, /* qk_norm */
    DECODER_P_K_NORM,
    DECODER_P_EXPERTS_W1, /* a MoE layer's grouped experts [E, F, d], [E, d, F], [E, F, d] and router [E, d] */
    DECODER_P_EXPERTS_W2,
    DECODER_P_EXPERTS_W3,
    DECODER_P_ROUTER,
    DECODER_P_KIND_COUNT
} decoder_param_kind;

/* Parameters per transformer layer: 9 (Llama), 12 with q/k/v biases, 11 with q/k norms, one more with
 * experts (router). */
#define DECODER_PARAMS_PER_LAYER_MAX 14

#define DECODER_PARAM_NAME_MAX 64

typedef struct decoder_param {
    char name[DECODER_PARAM_NAME_MAX]; /* torchtitan FQN, e.g. "layers.3.feed_forward.w2.weight" */
    decoder_param_kind kind;
    int layer;        /* transformer layer, -1 for tok_embeddings, norm and output */
    int ndim;         /* 2, 1 for norms, 3 for grouped experts */
    int64_t shape[3]; /* global (unsharded) shape; the dims past ndim are 1 */
    int64_t numel;
    int64_t row_numel; /* elements per row of dim 0 (the product of the other dims; 1 for 1-D) */
    int64_t offset;    /* elements before this parameter in table order */
    init_rule init;   /* model/init_rule.h */
} decoder_param;

typedef struct decoder_params {
    decoder_param *p;
    int n;         /* 1 + the layers' parameters + (tied ? 1 : 2) */
    int64_t total; /* sum of numel == decoder_param_count(cfg) */
    int n_layers;
    int *layer_start;               /* [n_layers + 1]: table index of each layer's first parameter */
    int *layer_moe;                 /* [n_layers]: 1 when the layer has experts */
    int slot[2][DECODER_P_KIND_COUNT]; /* [moe][kind]: a layer kind's position in a dense (0) or MoE (1) block;
                                          -1 when such a layer has none */
    int tied;                       /* no output.weight: the head uses tok_embeddings.weight */
} decoder_params;

/* Builds the table of a finalized config. Free with decoder_params_free. */
int decoder_params_build(const decoder_config *cfg, decoder_params *out, fsdp_err *err);
void decoder_params_free(decoder_params *t);

/* Table index of a name, -1 when absent. */
int decoder_params_find(const decoder_params *t, const char *name);
/* Table index of (kind, layer); layer is ignored for the non-layer kinds. -1 when out of range or
 * when the config has no such parameter (a bias without qkv_bias, output with tied embeddings). */
int decoder_params_index(const decoder_params *t, decoder_param_kind kind, int layer);

/* The kinds of layer `layer`'s block in table order (kinds has room for DECODER_PARAMS_PER_LAYER_MAX);
 * returns their number. A MoE layer (decoder_layer_is_moe) has the grouped experts and the router
 * where a dense one has feed_forward.w1/w2/w3. */
int decoder_params_layer_kinds(const decoder_config *cfg, int layer, decoder_param_kind *kinds);
/* Name, shape and init rule of (kind, layer) of a finalized cfg into p (offset 0). */
void decoder_param_describe(const decoder_config *cfg, decoder_param_kind kind, int layer, decoder_param *p);
/* Whether kind is a per-layer kind. */
int decoder_param_kind_is_layer(decoder_param_kind kind);

/* "tok_embeddings.weight", "attention.wq.weight", ... : the FQN suffix of a kind. */
const char *decoder_param_kind_name(decoder_param_kind kind);

#ifdef __cplusplus
}
#endif
#endif
