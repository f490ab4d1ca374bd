/* The FSDP training step on the CPU (train/train_fsdp.h). */
#include "train/train_fsdp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kc.h"
#include "decoder/decoder_table.h"
#include "decoder/decoder_model.h"
#include "decoder/decoder_params.h"
#include "train/flat_group.h"

struct train_fsdp {
    fsdp_state *s;
    comm *c;
    decoder_config cfg;
    int B, T;
    decoder_model_ws *ws;
    state_param *embed, *norm, *output; /* output NULL with tied embeddings */
    int per_layer;                      /* parameters per layer (the table's) */
    decoder_param_kind kinds[DECODER_PARAMS_PER_LAYER_MAX];
    state_param **layer; /* n_layers * per_layer, in the flat layer order */
    int64_t layer_off[DECODER_PARAMS_PER_LAYER_MAX];
    int64_t layer_numel;
    float *full_layer, *grad_layer; /* one gathered layer and its gradient */
    float *full_embed, *full_norm, *full_output; /* full_output == full_embed when tied */
    float *grad_embed, *grad_norm, *grad_output; /* grad_output == grad_embed when tied */
    float *acc; /* gradient accumulation: every layer's full gradient (n_layers x layer_numel), or NULL */
    /* per-block collectives (train/flat_group.h): one group per layer, its scratch (the largest
     * group's); per_param: one all-gather / reduce-scatter per parameter instead (train_fsdp_set_flat) */
    flat_group **groups;
    float *flat_scratch;
    int per_param;
};

void train_fsdp_free(train_fsdp *f) {
    if (!f) return;
    decoder_model_ws_free(f->ws);
    for (int i = 0; f->groups && i < f->cfg.n_layers; i++) flat_group_free(f->groups[i]);
    free(f->groups);
    free(f->flat_scratch);
    free(f->layer);
    free(f->acc);
    free(f->full_layer);
    free(f->grad_layer);
    if (f->full_output != f->full_embed) free(f->full_output);
    if (f->grad_output != f->grad_embed) free(f->grad_output);
    free(f->full_embed);
    free(f->full_norm);
    free(f->grad_embed);
    free(f->grad_norm);
    free(f);
}

static state_param *need(fsdp_state *s, const char *name, int64_t numel, fsdp_err *err) {
    state_param *p = state_find(s, name);
    if (!p) {
        fsdp_err_set(err, FSDP_E_INVALID, "training: the model state has no parameter %s", name);
        return NULL;
    }
    if (state_param_numel(p) != numel) {
        fsdp_err_set(err, FSDP_E_INVALID, "training: parameter %s has %lld elements, the model config needs %lld", name,
                     (long long)state_param_numel(p), (long long)numel);
        return NULL;
    }
    return p;
}

/* One flat group per layer (its parameters in the table's order) and the scratch they share. */
static int make_groups(train_fsdp *f, int world, int rank, fsdp_err *err) {
    const int L = f->cfg.n_layers;
    if (!(f->groups = calloc((size_t)L, sizeof *f->groups)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training: parameter groups)");
    size_t scratch = 1;
    for (int i = 0; i < L; i++) {
        int rc = flat_group_create(f->layer + (size_t)i * (size_t)f->per_layer, f->per_layer, world, rank,
                                   &f->groups[i], err);
        if (rc) return fsdp_err_prefix(err, "training: layer %d", i);
        size_t n = flat_group_scratch_numel(f->groups[i]);
        if (n > scratch) scratch = n;
    }
    if (world > 1 && !(f->flat_scratch = malloc(scratch * sizeof(float))))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training: %zu floats of flat collective buffer)",
                            scratch);
    return 0;
}

void train_fsdp_set_flat(train_fsdp *f, int flat) {
    if (f) f->per_param = !flat;
}

int train_fsdp_create(fsdp_state *s, comm *c, int B, int T, train_fsdp **out, fsdp_err *err) {
    return train_fsdp_create_ac(s, c, B, T, 0, out, err);
}

int train_fsdp_create_ac(fsdp_state *s, comm *c, int B, int T, int ac, train_fsdp **out, fsdp_err *err) {
    return train_fsdp_create_opts(s, c, B, T, ac, 0, out, err);
}

int train_fsdp_create_opts(fsdp_state *s, comm *c, int B, int T, int ac, int head_chunk_rows, train_fsdp **out,
                           fsdp_err *err) {
    *out = NULL;
    if (decoder_head_chunk_check(head_chunk_rows, "training", err)) return FSDP_E_INVALID;
    if (!s->trainer_cfg) return fsdp_err_set(err, FSDP_E_INVALID, "training: the state has no model config");
    if (s->layout != STATE_SHARDED)
        return fsdp_err_set(err, FSDP_E_INVALID, "training: parameters are not sharded (run `shard` after init-cpu)");
    int rc = decoder_model_check(decoder_state_config(s), err);
    if (rc) return rc;
    train_fsdp *f = calloc(1, sizeof *f);
    if (!f) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    f->s = s;
    f->c = c;
    f->cfg = *decoder_state_config(s);
    f->B = B;
    f->T = T;
    const decoder_config *cfg = &f->cfg;
    int64_t V = cfg->vocab_size, d = cfg->dim;
    const int tied = cfg->tie_embeddings;
    f->layer_numel = decoder_model_layer_numel(cfg);
    f->per_layer = decoder_params_layer_kinds(cfg, f->kinds);
    /* offsets of a layer's tensors inside its block, from the model's own layout */
    decoder_model_layer lw;
    float *base = (float *)(uintptr_t)64; /* only differences are used */
    decoder_model_layer_bind(cfg, base, &lw);
    for (int k = 0; k < f->per_layer; k++) f->layer_off[k] = *decoder_model_layer_slot(&lw, f->kinds[k]) - base;
    f->layer = calloc((size_t)cfg->n_layers * (size_t)f->per_layer, sizeof *f->layer);
    f->full_layer = malloc((size_t)f->layer_numel * sizeof(float));
    f->grad_layer = malloc((size_t)f->layer_numel * sizeof(float));
    f->full_embed = malloc((size_t)(V * d) * sizeof(float));
    f->full_output = tied ? f->full_embed : malloc((size_t)(V * d) * sizeof(float));
    f->full_norm = malloc((size_t)d * sizeof(float));
    f->grad_embed = malloc((size_t)(V * d) * sizeof(float));
    f->grad_output = tied ? f->grad_embed : malloc((size_t)(V * d) * sizeof(float));
    f->grad_norm = malloc((size_t)d * sizeof(float));
    if (!f->layer || !f->full_layer || !f->grad_layer || !f->full_embed || !f->full_output || !f->full_norm ||
        !f->grad_embed || !f->grad_output || !f->grad_norm) {
        train_fsdp_free(f);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training buffers)");
    }
    if (!(f->embed = need(s, "tok_embeddings.weight", V * d, err)) || !(f->norm = need(s, "norm.weight", d, err)) ||
        (!tied && !(f->output = need(s, "output.weight", V * d, err)))) {
        train_fsdp_free(f);
        return err->code;
    }
    if (tied && state_find(s, "output.weight")) {
        train_fsdp_free(f);
        return fsdp_err_set(err, FSDP_E_INVALID, "training: the model ties output to tok_embeddings.weight, but the "
                            "state also holds an output.weight");
    }
    for (int i = 0; i < cfg->n_layers; i++) {
        for (int k = 0; k < f->per_layer; k++) {
            decoder_param p;
            decoder_param_describe(cfg, f->kinds[k], i, &p);
            if (!(f->layer[i * f->per_layer + k] = need(s, p.name, p.numel, err))) {
                train_fsdp_free(f);
                return err->code;
            }
        }
    }
    if ((rc = state_alloc_grads(s, err)) || (rc = make_groups(f, comm_size(c), comm_rank(c), err))) {
        train_fsdp_free(f);
        return rc;
    }
    decoder_model_ws_opts wo = {ac, head_chunk_rows};
    f->ws = decoder_model_ws_create_opts(cfg, B, T, &wo, err);
    if (!f->ws) {
        train_fsdp_free(f);
        return err->code ? err->code : FSDP_E_NOMEM;
    }
    *out = f;
    return 0;
}

/* The parameter slots of a full-layer buffer, in the group's order. */
static void layer_slots(const train_fsdp *f, float *base, float **slots) {
    for (int k = 0; k < f->per_layer; k++) slots[k] = base + f->layer_off[k];
}

static int gather_layer(train_fsdp *f, int i, decoder_model_layer *lw, fsdp_err *err) {
    if (!f->per_param) {
        float *full[DECODER_PARAMS_PER_LAYER_MAX];
        layer_slots(f, f->full_layer, full);
        int rc = flat_group_gather(f->groups[i], f->c, f->flat_scratch, full, err);
        if (rc) return fsdp_err_prefix(err, "training: all-gather of layer %d", i);
        decoder_model_layer_bind(&f->cfg, f->full_layer, lw);
        return 0;
    }
    for (int k = 0; k < f->per_layer; k++) {
        state_param *p = f->layer[i * f->per_layer + k];
        int rc = state_unshard(p, p->data, f->c, f->full_layer + f->layer_off[k], err);
        if (rc) return rc;
    }
    decoder_model_layer_bind(&f->cfg, f->full_layer, lw);
    return 0;
}

/* Layer i's full gradient g (a full-layer buffer) reduce-scattered into its parameters' p->grad. */
static int reduce_layer(train_fsdp *f, int i, float *g, fsdp_err *err) {
    if (!f->per_param) {
        float *full[DECODER_PARAMS_PER_LAYER_MAX];
        layer_slots(f, g, full);
        int rc = flat_group_reduce_scatter(f->groups[i], f->c, (const float *const *)full, f->flat_scratch, err);
        return rc ? fsdp_err_prefix(err, "training: reduce-scatter of layer %d", i) : 0;
    }
    for (int k = 0; k < f->per_layer; k++) {
        state_param *p = f->layer[i * f->per_layer + k];
        int rc = state_reduce_scatter(p, g + f->layer_off[k], f->c, p->grad, err);
        if (rc) return rc;
    }
    return 0;
}

/* Forward and the training head of one micro-batch (tokens, labels: B x T): the head's gradients
 * accumulate into grad_norm / grad_output (zeroed by the caller before the first micro-batch);
 * *lsum += this rank's loss sum. denom: the global token count of the whole step. */
static int micro_forward(train_fsdp *f, const int32_t *tokens, const int32_t *labels, double denom, int first,
                         double *lsum, fsdp_err *err) {
    const decoder_config *cfg = &f->cfg;
    int64_t V = cfg->vocab_size, d = cfg->dim;
    int rc;
    /* forward: gather each piece right before it runs */
    if ((rc = state_unshard(f->embed, f->embed->data, f->c, f->full_embed, err))) return rc;
    if ((rc = decoder_fwd_embed(cfg, f->full_embed, tokens, labels, f->B, f->T, f->ws, err))) return rc;
    for (int i = 0; i < cfg->n_layers; i++) {
        decoder_model_layer lw;
        if ((rc = gather_layer(f, i, &lw, err))) return rc;
        if ((rc = decoder_fwd_layer(cfg, &lw, i, f->ws, err))) return rc;
    }
    if ((rc = state_unshard(f->norm, f->norm->data, f->c, f->full_norm, err))) return rc;
    if (f->output && (rc = state_unshard(f->output, f->output->data, f->c, f->full_output, err))) return rc;
    /* the head's forward and backward in one pass over chunks of rows: the loss differentiated is
     * the global sum / global count (known before the head) on every rank; reduce-scatter sums the
     * ranks' contributions into each shard. Tied: the head's gradient is the first half of the
     * embedding's, which the embedding backward adds to before the one reduce-scatter. */
    if (first) {
        memset(f->grad_norm, 0, (size_t)d * sizeof(float));
        memset(f->grad_output, 0, (size_t)(V * d) * sizeof(float));
    }
    decoder_model_loss loss;
    if ((rc = decoder_head_train(cfg, f->full_norm, f->full_output, f->grad_norm, f->grad_output, denom, f->ws, &loss,
                               err)))
        return rc;
    *lsum += loss.loss_sum;
    return 0;
}

/* The backward of one micro-batch after its head. With accumulation (f->acc: every layer's full
 * gradient) the layers' gradients add up there over the step's micro-batches; the reduce-scatters
 * (one per parameter and step, as FSDP2 with set_requires_gradient_sync(False) until the last
 * micro-batch) run only on the last micro-batch. */
static int micro_backward(train_fsdp *f, int first, int last, fsdp_err *err) {
    const decoder_config *cfg = &f->cfg;
    int64_t V = cfg->vocab_size, d = cfg->dim;
    int rc;
    if (last && (rc = state_reduce_scatter(f->norm, f->grad_norm, f->c, f->norm->grad, err))) return rc;
    if (last && f->output && (rc = state_reduce_scatter(f->output, f->grad_output, f->c, f->output->grad, err)))
        return rc;
    for (int i = cfg->n_layers - 1; i >= 0; i--) {
        decoder_model_layer lw, lg;
        if ((rc = gather_layer(f, i, &lw, err))) return rc;
        float *g = f->acc ? f->acc + (size_t)i * (size_t)f->layer_numel : f->grad_layer;
        if (!f->acc || first) memset(g, 0, (size_t)f->layer_numel * sizeof(float));
        decoder_model_layer_bind(cfg, g, &lg);
        if ((rc = decoder_bwd_layer(cfg, &lw, &lg, i, f->ws, err))) return rc;
        if (last && (rc = reduce_layer(f, i, g, err))) return rc;
    }
    if (first && !cfg->tie_embeddings) memset(f->grad_embed, 0, (size_t)(V * d) * sizeof(float));
    if ((rc = decoder_bwd_embed(cfg, f->grad_embed, f->ws, err))) return rc;
    if (last && (rc = state_reduce_scatter(f->embed, f->grad_embed, f->c, f->embed->grad, err))) return rc;
    return 0;
}

/* The full-gradient accumulator of every layer (n_layers x layer_numel floats), allocated once. */
static int ensure_acc(train_fsdp *f, fsdp_err *err) {
    if (f->acc) return 0;
    size_t n = (size_t)f->cfg.n_layers * (size_t)f->layer_numel;
    f->acc = malloc(n * sizeof(float));
    if (!f->acc)
        return fsdp_err_set(err, FSDP_E_NOMEM,
                            "out of memory: gradient accumulation keeps every layer's full gradient (%zu floats)", n);
    return 0;
}

int train_fsdp_grads_accum(train_fsdp *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                           train_fsdp_result *res, fsdp_err *err) {
    if (n_micro < 1) return fsdp_err_set(err, FSDP_E_INVALID, "training: %d micro-batches, expected >= 1", n_micro);
    int rc;
    const int64_t mb = (int64_t)f->B * f->T;
    /* global number of tokens in the mean: every micro-batch of every rank */
    int64_t nvalid = 0;
    for (int64_t i = 0; i < mb * n_micro; i++) nvalid += labels[i] != DECODER_MODEL_IGNORE_INDEX;
    if ((rc = comm_allreduce(f->c, &nvalid, 1, COMM_I64, COMM_SUM, err))) return rc;
    if (n_micro > 1 && (rc = ensure_acc(f, err))) return rc;
    float *acc = f->acc;
    if (n_micro == 1) f->acc = NULL; /* one micro-batch: the rotating layer buffer and no copy */
    double lsum = 0, denom = (double)(nvalid > 0 ? nvalid : 1);
    for (int m = 0; m < n_micro && !rc; m++) {
        rc = micro_forward(f, tokens + m * mb, labels + m * mb, denom, m == 0, &lsum, err);
        if (!rc) rc = micro_backward(f, m == 0, m == n_micro - 1, err);
    }
    f->acc = acc;
    if (rc) return rc;
    if ((rc = comm_allreduce(f->c, &lsum, 1, COMM_F64, COMM_SUM, err))) return rc;
    res->loss = nvalid > 0 ? lsum / (double)nvalid : 0.0;
    res->tokens = nvalid;
    /* global gradient norm over every rank's shards */
    double sumsq = 0;
    for (size_t k = 0; k < f->s->n; k++) {
        state_param *p = &f->s->p[k];
        if (p->grad) sumsq += kc_sumsq(p->grad, (int64_t)state_param_local_numel(p));
    }
    if ((rc = comm_allreduce(f->c, &sumsq, 1, COMM_F64, COMM_SUM, err))) return rc;
    res->grad_norm = sqrt(sumsq);
    return 0;
}

int train_fsdp_grads(train_fsdp *f, const int32_t *tokens, const int32_t *labels, train_fsdp_result *res,
                     fsdp_err *err) {
    return train_fsdp_grads_accum(f, tokens, labels, 1, res, err);
}

int train_fsdp_step(train_fsdp *f, const int32_t *tokens, const int32_t *labels, const train_fsdp_hparams *hp,
                    train_fsdp_result *res, fsdp_err *err) {
    return train_fsdp_step_accum(f, tokens, labels, 1, hp, res, err);
}

int train_fsdp_step_accum(train_fsdp *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                          const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err) {
    int rc = train_fsdp_grads_accum(f, tokens, labels, n_micro, res, err);
    if (rc) return rc;
    fsdp_state *s = f->s;
    if (!isfinite(res->loss) || !isfinite(res->grad_norm))
        return fsdp_err_set(err, FSDP_E_NUMERIC,
                            "training step %lld: non-finite loss (%g) or gradient norm (%g); nothing was updated",
                            (long long)s->opt_step + 1, res->loss, res->grad_norm);
    if ((rc = state_alloc_optimizer(s, err))) return rc;
    double coef = hp->max_norm > 0 ? kc_clip_coef(res->grad_norm, hp->max_norm) : 1.0;
    int64_t step = s->opt_step + 1;
    kc_adamw_hparams ah = {hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay};
    for (size_t k = 0; k < s->n; k++) {
        state_param *p = &s->p[k];
        int64_t n = (int64_t)state_param_local_numel(p);
        if (coef < 1.0) kc_scale(p->grad, n, (float)coef);
        ah.weight_decay = hp->no_decay && hp->no_decay[k] ? 0.0 : hp->weight_decay;
        kc_adamw_step(p->data, p->grad, p->exp_avg, p->exp_avg_sq, n, &ah, step);
    }
    s->opt_step = step;
    s->lr = hp->lr;
    s->beta1 = hp->beta1;
    s->beta2 = hp->beta2;
    s->eps = hp->eps;
    s->weight_decay = hp->weight_decay;
    return 0;
}
