/* The Llama-3 parameter table: every parameter of a config in torchtitan's order and names, with
 * its global shape and init rule. Sharding, checkpoints, init and the optimizer walk this table.
 *
 * Order (torchtitan's named_parameters(), as in the fixtures' reference.json "param_names"):
 *   tok_embeddings.weight
 *   for each layer i: layers.{i}.attention.wq/wk/wv/wo.weight,
 *                     layers.{i}.feed_forward.w1/w2/w3.weight,
 *                     layers.{i}.attention_norm.weight, layers.{i}.ffn_norm.weight
 *   norm.weight, output.weight
 *
 * Init rules (torchtitan init_weights, refmodel.py):
 *   tok_embeddings            normal(0, 1)
 *   wq, wk, wv, w1            trunc_normal(0, 0.02, a=-2, b=2)   (absolute bounds, torch defaults)
 *   wo, w2, w3                trunc_normal(0, init_std, a=-2, b=2), init_std = 0.02/sqrt(2(i+1))
 *                             with depth_init, else 0.02/sqrt(2 n_layers)
 *   attention_norm, ffn_norm, norm   ones
 *   output                    trunc_normal(0, dim^-0.5, a=-3 dim^-0.5, b=3 dim^-0.5) */
#ifndef FSDP_MODEL_LLAMA_PARAMS_H
#define FSDP_MODEL_LLAMA_PARAMS_H

#include <stdint.h>

#include "fsdp/error.h"
#include "model/init_rule.h"
#include "model/llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llama_param_kind {
    LLAMA_P_TOK_EMBEDDINGS = 0,
    LLAMA_P_WQ,
    LLAMA_P_WK,
    LLAMA_P_WV,
    LLAMA_P_WO,
    LLAMA_P_W1,
    LLAMA_P_W2,
    LLAMA_P_W3,
    LLAMA_P_ATTENTION_NORM,
    LLAMA_P_FFN_NORM,
    LLAMA_P_NORM,
    LLAMA_P_OUTPUT,
    LLAMA_P_KIND_COUNT
} llama_param_kind;

/* Parameters per transformer layer, in table order (LLAMA_P_WQ .. LLAMA_P_FFN_NORM). */
#define LLAMA_PARAMS_PER_LAYER 9

#define LLAMA_PARAM_NAME_MAX 64

typedef struct llama_param {
    char name[LLAMA_PARAM_NAME_MAX]; /* torchtitan FQN, e.g. "layers.3.feed_forward.w2.weight" */
    llama_param_kind kind;
    int layer;        /* transformer layer, -1 for tok_embeddings, norm and output */
    int ndim;         /* 2, or 1 for norms */
    int64_t shape[2]; /* global (unsharded) shape; shape[1] = 1 for 1-D */
    int64_t numel;
    int64_t row_numel; /* elements per row of dim 0 (shape[1], or 1 for 1-D) */
    int64_t offset;    /* elements before this parameter in table order */
    init_rule init;   /* model/init_rule.h */
} llama_param;

typedef struct llama_params {
    llama_param *p;
    int n;         /* 3 + LLAMA_PARAMS_PER_LAYER * n_layers */
    int64_t total; /* sum of numel == llama_param_count(cfg) */
} llama_params;

/* Builds the table of a finalized config. Free with llama_params_free. */
int llama_params_build(const llama_config *cfg, llama_params *out, fsdp_err *err);
void llama_params_free(llama_params *t);

/* Table index of a name, -1 when absent. */
int llama_params_find(const llama_params *t, const char *name);
/* Table index of (kind, layer); layer is ignored for the non-layer kinds. -1 when out of range. */
int llama_params_index(const llama_params *t, llama_param_kind kind, int layer);

/* "tok_embeddings.weight", "attention.wq.weight", ... : the FQN suffix of a kind. */
const char *llama_param_kind_name(llama_param_kind kind);

#ifdef __cplusplus
}
#endif
#endif
