/* The mixture-of-experts part of a decoder config (decoder_config.h): which layers have experts, and
 * the checks finalize runs on the expert sizes. */
#include "decoder/decoder_config.h"

#include <math.h>
#include <string.h>

int decoder_layer_is_moe(const decoder_config *c, int layer) {
    if (!c || c->n_experts <= 0 || layer < 0 || layer >= c->n_layers) return 0;
    const int step = c->moe_step > 0 ? c->moe_step : 1;
    if ((layer + 1) % step) return 0;
    if (layer < 64 * DECODER_DENSE_LAYER_WORDS && (c->dense_layers[layer / 64] >> (layer % 64)) & 1) return 0;
    return 1;
}

int decoder_moe_layers(const decoder_config *c) {
    int n = 0;
    for (int l = 0; c && l < c->n_layers; l++) n += decoder_layer_is_moe(c, l);
    return n;
}

int decoder_config_set_dense_layer(decoder_config *c, int layer, fsdp_err *err) {
    if (layer < 0 || layer >= 64 * DECODER_DENSE_LAYER_WORDS)
        return fsdp_err_set(err, FSDP_E_INVALID, "mlp_only_layers: layer %d is outside 0..%d", layer,
                            64 * DECODER_DENSE_LAYER_WORDS - 1);
    c->dense_layers[layer / 64] |= (uint64_t)1 << (layer % 64);
    return FSDP_OK;
}

/* The expert sizes of a config with experts (finalize): every number in range, the dense-layer list
 * within the model. */
int decoder_config_check_moe(const decoder_config *c, fsdp_err *err) {
    const decoder_arch_info *a = decoder_arch_get(c->arch);
    if (a && a->moe && c->n_experts == 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: arch %s is a mixture of experts: set n_experts, top_k and "
                            "moe_ffn_hidden (or read the model from its config.json with from_hf)", a->name);
    if (a && !a->moe && c->n_experts > 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: n_experts is set, but arch %s has no experts (mixture-of-"
                            "experts archs: qwen3_moe, olmoe, mixtral)", a->name);
    if (c->n_experts == 0) {
        if (c->top_k || c->moe_ffn_hidden)
            return fsdp_err_set(err, FSDP_E_INVALID, "model: top_k / moe_ffn_hidden are set but n_experts is 0");
        return FSDP_OK;
    }
    if (c->n_experts < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.n_experts must be >= 0 (got %d)", c->n_experts);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.top_k (num_experts_per_tok) is %d, expected 1..%d (the "
                            "number of experts)", c->top_k, c->n_experts);
    if (c->moe_ffn_hidden < 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.moe_ffn_hidden (moe_intermediate_size) must be > 0 (got %d)",
                            c->moe_ffn_hidden);
    if (c->moe_step < 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.moe_step (decoder_sparse_step) must be >= 1 (got %d)",
                            c->moe_step);
    if (c->norm_topk != 0 && c->norm_topk != 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.norm_topk must be true or false");
    if (!isfinite(c->router_aux_coef) || c->router_aux_coef < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model.router_aux_coef (router_aux_loss_coef) must be finite and "
                            ">= 0 (got %g)", c->router_aux_coef);
    for (int l = c->n_layers; l < 64 * DECODER_DENSE_LAYER_WORDS; l++)
        if ((c->dense_layers[l / 64] >> (l % 64)) & 1)
            return fsdp_err_set(err, FSDP_E_INVALID, "model: mlp_only_layers names layer %d, but the model has %d "
                                "layers", l, c->n_layers);
    if (!decoder_moe_layers(c))
        return fsdp_err_set(err, FSDP_E_INVALID, "model: %d experts, but decoder_sparse_step %d and mlp_only_layers "
                            "leave no layer with experts", c->n_experts, c->moe_step);
    return FSDP_OK;
}
