/* Example plugin: `resize-embeddings` grows (or shrinks) the token embedding and an untied output
 * head to a new vocabulary size, as transformers' resize_token_embeddings does after new special
 * tokens are added (Bagel adds its own): kept rows keep their values, new rows are the mean of the
 * old rows (transformers' mean-resizing; it then adds noise of covariance 1e-9 x the rows', about
 * 3e-5 of their spread, which this leaves out) or drawn by an init rule, and their optimizer moments
 * are zeros. Through include/fsdp/params.h: the checkpoints written afterwards, the Hugging Face export
 * (config.json's vocab_size) and train-steps all see the new vocabulary.
 *
 * Build:  cc -shared -fPIC -Iinclude examples/plugins/resize_embeddings.c -o libresize_embeddings.so
 * Use:    stages:
 *           - {id: grow, uses: resize-embeddings, after: [load], with: {vocab_size: 152064}}
 *         Hugging Face names: with: {vocab_size: 152064, embedding: model.embed_tokens.weight,
 *                                    output: lm_head.weight} */
#include <string.h>

#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {
    {"vocab_size", FSDP_T_INT, 1, NULL, NULL, "the new number of rows"},
    {"embedding", FSDP_T_STRING, 0, "tok_embeddings.weight", NULL, "the embedding's parameter name"},
    {"output", FSDP_T_STRING, 0, "output.weight", NULL, "the output head's name (skipped when absent: tied)"},
    {"init", FSDP_T_STRING, 0, "mean", NULL, "new rows: mean (of the old rows) or an init rule (normal(std=0.02), ...)"},
    {NULL, 0, 0, NULL, NULL, NULL}};

static const char *const NEEDS[] = {"params", NULL};

static int check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(with, "vocab_size");
    int64_t n = 0;
    if (v && (fsdp_value_int(v, &n) || n < 1 || n > 2147483647))
        return fsdp_err_at(err, FSDP_E_INVALID, v, "resize-embeddings: vocab_size must be in [1, 2^31)");
    return 0;
}

static int resize(fsdp_ctx *ctx, const char *name, int64_t vocab, const char *rule, int required, fsdp_err *err) {
    long i = fsdp_param_find(ctx, name);
    if (i < 0)
        return required ? fsdp_err_set(err, FSDP_E_INVALID, "resize-embeddings: the model has no parameter %s", name) : 0;
    fsdp_param_info in;
    int rc = fsdp_param_info_at(ctx, (size_t)i, &in, err);
    if (!rc) rc = fsdp_param_resize(ctx, (size_t)i, vocab, rule, FSDP_DT_F32, NULL, err);
    if (!rc)
        fsdp_log(ctx, FSDP_LOG_INFO, "resize-embeddings: %s: %lld -> %lld rows", name, (long long)in.shape[0],
                 (long long)vocab);
    return rc;
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    int64_t vocab = fsdp_arg_int(with, "vocab_size", 0);
    const char *init = fsdp_arg_str(with, "init", "mean");
    const char *rule = strcmp(init, "mean") ? init : NULL;
    int rc = resize(ctx, fsdp_arg_str(with, "embedding", "tok_embeddings.weight"), vocab, rule, 1, err);
    const char *out = fsdp_arg_str(with, "output", "output.weight");
    if (!rc && *out) rc = resize(ctx, out, vocab, rule, 0, err);
    if (!rc) fsdp_ctx_metric(ctx, "vocab_size", (double)vocab);
    return rc;
}

static const fsdp_stage_desc STAGE = {FSDP_STAGE_DESC_INIT, "resize-embeddings",
                                      "resize the token embedding and output head to a new vocabulary",
                                      PARAMS, NEEDS, NULL, run, check};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &STAGE, err); }
