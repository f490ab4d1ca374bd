/* The CPU FSDP step (train/train_fsdp.h), on the model seen through model/model_blocks.h. */
#include "train/train_fsdp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kc.h"
#include "train/flat_group.h"
#include "train/train_moe.h"

#include "train/train_fsdp_internal.h"

void train_fsdp_free(train_fsdp *f) {
    if (!f) return;
    if (f->ws) f->m.ws_free(f->ws);
    for (int i = 0; f->groups && i < f->lay.n_blocks; i++) flat_group_free(f->groups[i]);
    free(f->groups);
    free(f->flat_scratch);
    free(f->layer);
    free(f->first);
    free(f->off);
    free(f->numel);
    free(f->acc_at);
    free(f->aux_buf);
    free(f->load);
    free(f->expert);
    if (f->ep_c) comm_destroy(f->ep_c);
    if (f->edp_c) comm_destroy(f->edp_c);
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

/* One flat group per layer (its parameters in the table's order, less the expert-parallel ones) and the
 * scratch they share. */
int train_fsdp_make_groups(train_fsdp *f, int world, int rank, fsdp_err *err) {
    const int L = f->lay.n_blocks;
    for (int i = 0; f->groups && i < L; i++) flat_group_free(f->groups[i]);
    free(f->groups);
    free(f->flat_scratch);
    f->flat_scratch = NULL;
    if (!(f->groups = calloc((size_t)L, sizeof *f->groups)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training: parameter groups)");
    size_t scratch = 1;
    for (int i = 0; i < L; i++) {
        state_param *ps[MODEL_BLOCKS_PARAMS_MAX];
        int n = 0;
        for (int k = f->first[i]; k < f->first[i + 1]; k++)
            if (!train_fsdp_is_ep(f, k)) ps[n++] = f->layer[k];
        int rc = flat_group_create(ps, n, world, rank, &f->groups[i], err);
        if (rc) return fsdp_err_prefix(err, "training: layer %d", i);
        size_t sn = flat_group_scratch_numel(f->groups[i]);
        if (sn > scratch) scratch = sn;
    }
    f->scratch_numel = scratch;
    if ((world > 1 || f->rep) && !(f->flat_scratch = malloc(scratch * sizeof(float))))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training: %zu floats of flat collective buffer)",
                            scratch);
    return 0;
}

int train_fsdp_set_replicas(train_fsdp *f, comm *world, comm *replicate, fsdp_err *err) {
    f->wc = world ? world : f->c;
    f->rep = replicate;
    /* one shard and replicas: the reduced block is all-reduced from the scratch too */
    if (replicate && !f->flat_scratch && !(f->flat_scratch = malloc(f->scratch_numel * sizeof(float))))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training: %zu floats of flat collective buffer)",
                            f->scratch_numel);
    return 0;
}

void train_fsdp_set_flat(train_fsdp *f, int flat) {
    if (f) f->per_param = !flat;
}

int train_fsdp_create(fsdp_state *s, model_blocks m, comm *c, int B, int T, train_fsdp **out, fsdp_err *err) {
    return train_fsdp_create_ac(s, m, c, B, T, 0, out, err);
}

int train_fsdp_create_ac(fsdp_state *s, model_blocks m, comm *c, int B, int T, int ac, train_fsdp **out,
                         fsdp_err *err) {
    return train_fsdp_create_opts(s, m, c, B, T, ac, 0, out, err);
}

/* The state's parameters of every piece of the model, checked against the model's sizes. */
static int find_params(train_fsdp *f, fsdp_err *err) {
    fsdp_state *s = f->s;
    const model_blocks_layout *lay = &f->lay;
    if (!(f->embed = need(s, lay->embed.name, lay->embed.numel, err)) ||
        !(f->norm = need(s, lay->norm.name, lay->norm.numel, err)) ||
        (!lay->tied && !(f->output = need(s, lay->output.name, lay->output.numel, err))))
        return err->code;
    if (lay->tied && state_find(s, lay->output.name))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "training: the model ties output to %s, but the state also holds an %s", lay->embed.name,
                            lay->output.name);
    for (int i = 0; i < lay->n_blocks; i++) {
        for (int k = f->first[i]; k < f->first[i + 1]; k++) {
            model_blocks_tensor p;
            f->m.block_param(f->m.impl, i, k - f->first[i], &p);
            if (!(f->layer[k] = need(s, p.name, p.numel, err))) return err->code;
            f->off[k] = p.offset;
            f->expert[k] = (unsigned char)p.expert;
        }
    }
    return 0;
}

/* Each block's parameter count and elements (model_blocks' block_shape, or the layout's), the index
 * of its first parameter and where its gradient starts in the accumulator. */
static int block_shapes(train_fsdp *f, fsdp_err *err) {
    const model_blocks_layout *lay = &f->lay;
    const int L = lay->n_blocks;
    f->first = calloc((size_t)L + 1, sizeof *f->first);
    f->numel = calloc((size_t)L + 1, sizeof *f->numel);
    f->acc_at = calloc((size_t)L + 1, sizeof *f->acc_at);
    if (!f->first || !f->numel || !f->acc_at) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training)");
    for (int i = 0; i < L; i++) {
        int per = lay->per_block;
        int64_t numel = lay->block_numel;
        if (f->m.block_shape) f->m.block_shape(f->m.impl, i, &per, &numel);
        if (per < 0 || per > lay->per_block || per > MODEL_BLOCKS_PARAMS_MAX || numel > lay->block_numel)
            return fsdp_err_set(err, FSDP_E_INVALID, "training: block %d of %d parameters and %lld elements (at most %d "
                                "and %lld)", i, per, (long long)numel, lay->per_block < MODEL_BLOCKS_PARAMS_MAX ?
                                lay->per_block : MODEL_BLOCKS_PARAMS_MAX, (long long)lay->block_numel);
        f->first[i + 1] = f->first[i] + per;
        f->numel[i] = numel;
        f->acc_at[i + 1] = f->acc_at[i] + numel;
    }
    if (!(f->off = calloc((size_t)f->first[L] + 1, sizeof *f->off)) ||
        !(f->expert = calloc((size_t)f->first[L] + 1, sizeof *f->expert)) ||
        !(f->layer = calloc((size_t)f->first[L] + 1, sizeof *f->layer)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training)");
    return 0;
}

/* The gathered pieces and their full gradients (host float32). */
static int alloc_buffers(train_fsdp *f, fsdp_err *err) {
    const model_blocks_layout *lay = &f->lay;
    const size_t E = (size_t)lay->embed.numel, N = (size_t)lay->norm.numel, O = (size_t)lay->output.numel;
    const int tied = lay->tied;
    f->full_layer = malloc((size_t)f->layer_numel * sizeof(float));
    f->grad_layer = malloc((size_t)f->layer_numel * sizeof(float));
    f->full_embed = malloc(E * sizeof(float));
    f->full_output = tied ? f->full_embed : malloc(O * sizeof(float));
    f->full_norm = malloc(N * sizeof(float));
    f->grad_embed = malloc(E * sizeof(float));
    f->grad_output = tied ? f->grad_embed : malloc(O * sizeof(float));
    f->grad_norm = malloc(N * sizeof(float));
    if (lay->n_aux > 0 && !(f->aux_buf = calloc((size_t)lay->n_aux, sizeof *f->aux_buf)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training buffers)");
    if (lay->n_experts > 0 && f->m.expert_load &&
        !(f->load = calloc((size_t)lay->n_blocks * (size_t)lay->n_experts, sizeof *f->load)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training buffers)");
    if (!f->full_layer || !f->grad_layer || !f->full_embed || !f->full_output || !f->full_norm ||
        !f->grad_embed || !f->grad_output || !f->grad_norm)
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training buffers)");
    return 0;
}

int train_fsdp_create_opts(fsdp_state *s, model_blocks m, comm *c, int B, int T, int ac, int head_chunk_rows,
                           train_fsdp **out, fsdp_err *err) {
    *out = NULL;
    model_blocks_ws_opts wo = {ac, head_chunk_rows};
    if (m.check_opts(m.impl, &wo, "training", err)) return FSDP_E_INVALID;
    if (s->layout != STATE_SHARDED)
        return fsdp_err_set(err, FSDP_E_INVALID, "training: parameters are not sharded (run `shard` after init-cpu)");
    int rc = m.check(m.impl, err);
    if (rc) return rc;
    train_fsdp *f = calloc(1, sizeof *f);
    if (!f) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    f->s = s;
    f->c = c;
    f->wc = c;
    f->m = m;
    m.layout(m.impl, &f->lay);
    f->B = B;
    f->T = T;
    f->layer_numel = f->lay.block_numel;
    if (f->lay.per_block < 0 || f->lay.per_block > MODEL_BLOCKS_PARAMS_MAX) {
        train_fsdp_free(f);
        return fsdp_err_set(err, FSDP_E_INVALID, "training: a block of %d parameters (at most %d)", f->lay.per_block,
                            MODEL_BLOCKS_PARAMS_MAX);
    }
    if (f->lay.n_aux && (!m.aux_stats || !m.aux_apply)) {
        train_fsdp_free(f);
        return fsdp_err_set(err, FSDP_E_INVALID, "training: the model declares an auxiliary loss but no way to compute it");
    }
    if ((rc = block_shapes(f, err)) || (rc = alloc_buffers(f, err)) || (rc = find_params(f, err)) || (rc = state_alloc_grads(s, err)) ||
        (rc = train_fsdp_make_groups(f, comm_size(c), comm_rank(c), err))) {
        train_fsdp_free(f);
        return rc;
    }
    f->ws = m.ws_create(m.impl, B, T, &wo, err);
    if (!f->ws) {
        train_fsdp_free(f);
        return err->code ? err->code : FSDP_E_NOMEM;
    }
    *out = f;
    return 0;
}

/* The slots of layer i's flat group (its parameters that are not expert-parallel) in base. */
static void layer_slots(const train_fsdp *f, int i, float *base, float **slots) {
    int n = 0;
    for (int k = f->first[i]; k < f->first[i + 1]; k++)
        if (!train_fsdp_is_ep(f, k)) slots[n++] = base + f->off[k];
}

/* Layer i's parameters all-gathered into full_layer (the expert-parallel ones: this ep rank's experts). */
static int gather_layer(train_fsdp *f, int i, fsdp_err *err) {
    int rc;
    for (int k = f->first[i]; f->ep > 1 && k < f->first[i + 1]; k++)
        if (f->expert[k] && (rc = train_fsdp_ep_gather(f, k, f->full_layer + f->off[k], err))) return rc;
    if (!f->per_param) {
        float *full[MODEL_BLOCKS_PARAMS_MAX];
        layer_slots(f, i, f->full_layer, full);
        rc = flat_group_gather(f->groups[i], f->c, f->flat_scratch, full, err);
        if (rc) return fsdp_err_prefix(err, "training: all-gather of layer %d", i);
        return 0;
    }
    for (int k = f->first[i]; k < f->first[i + 1]; k++) {
        state_param *p = f->layer[k];
        if (train_fsdp_is_ep(f, k)) continue;
        if ((rc = state_unshard(p, p->data, f->c, f->full_layer + f->off[k], err))) return rc;
    }
    return 0;
}

/* p's full gradient reduce-scattered into p->grad over the shard group, then (HSDP) all-reduced
 * over the replicas: the sum over every rank. */
static int reduce_param(train_fsdp *f, state_param *p, const float *full, fsdp_err *err) {
    int rc = state_reduce_scatter(p, full, f->c, p->grad, err);
    if (!rc && f->rep) rc = comm_allreduce(f->rep, p->grad, state_param_local_numel(p), COMM_F32, COMM_SUM, err);
    return rc;
}

/* Layer i's full gradient g (a full-layer buffer) reduce-scattered into its parameters' p->grad. */
static int reduce_layer(train_fsdp *f, int i, float *g, fsdp_err *err) {
    int rc;
    for (int k = f->first[i]; f->ep > 1 && k < f->first[i + 1]; k++)
        if (f->expert[k] && (rc = train_fsdp_ep_reduce(f, k, g + f->off[k], err))) return rc;
    if (!f->per_param) {
        float *full[MODEL_BLOCKS_PARAMS_MAX];
        layer_slots(f, i, g, full);
        rc = flat_group_reduce_scatter(f->groups[i], f->c, f->rep, (const float *const *)full, f->flat_scratch, err);
        return rc ? fsdp_err_prefix(err, "training: reduce-scatter of layer %d", i) : 0;
    }
    for (int k = f->first[i]; k < f->first[i + 1]; k++) {
        if (train_fsdp_is_ep(f, k)) continue;
        if ((rc = reduce_param(f, f->layer[k], g + f->off[k], err))) return rc;
    }
    return 0;
}

static int micro_forward(train_fsdp *f, const int32_t *tokens, const int32_t *labels, double denom, int first,
                         int n_micro, double *lsum, model_blocks_aux *aux, fsdp_err *err) {
    const model_blocks *m = &f->m;
    int rc;
    /* forward: gather each piece right before it runs */
    if ((rc = state_unshard(f->embed, f->embed->data, f->c, f->full_embed, err))) return rc;
    if ((rc = m->fwd_embed(f->ws, f->full_embed, tokens, labels, f->B, f->T, err))) return rc;
    for (int i = 0; i < f->lay.n_blocks; i++) {
        if ((rc = gather_layer(f, i, err))) return rc;
        if ((rc = m->fwd_block(f->ws, i, f->full_layer, err))) return rc;
    }
    if (f->lay.n_aux &&
        (rc = train_moe_aux(m->aux_stats, m->aux_apply, f->ws, f->wc, f->aux_buf, f->lay.n_aux, n_micro, aux, err)))
        return rc;
    if (f->load) train_moe_load_add(m->expert_load, f->ws, f->lay.n_blocks, f->lay.n_experts, f->load, first);
    if ((rc = state_unshard(f->norm, f->norm->data, f->c, f->full_norm, err))) return rc;
    if (f->output && (rc = state_unshard(f->output, f->output->data, f->c, f->full_output, err))) return rc;
    /* the head's forward and backward in one pass over chunks of rows: the loss differentiated is
     * the global sum / global count (known before the head) on every rank; reduce-scatter sums the
     * ranks' contributions into each shard. Tied: the head's gradient is the first half of the
     * embedding's, which the embedding backward adds to before the one reduce-scatter. */
    if (first) {
        memset(f->grad_norm, 0, (size_t)f->lay.norm.numel * sizeof(float));
        memset(f->grad_output, 0, (size_t)f->lay.output.numel * sizeof(float));
    }
    double loss_sum = 0;
    if ((rc = m->head_train(f->ws, f->full_norm, f->full_output, f->grad_norm, f->grad_output, denom, &loss_sum, err)))
        return rc;
    *lsum += loss_sum;
    return 0;
}

/* The backward of one micro-batch after its head. With accumulation (f->acc: every layer's full
 * gradient) the layers' gradients add up there over the step's micro-batches; the reduce-scatters
 * (one per parameter and step, as FSDP2 with set_requires_gradient_sync(False) until the last
 * micro-batch) run only on the last micro-batch. */
static int micro_backward(train_fsdp *f, int first, int last, fsdp_err *err) {
    int rc;
    if (last && (rc = reduce_param(f, f->norm, f->grad_norm, err))) return rc;
    if (last && f->output && (rc = reduce_param(f, f->output, f->grad_output, err))) return rc;
    for (int i = f->lay.n_blocks - 1; i >= 0; i--) {
        if ((rc = gather_layer(f, i, err))) return rc;
        float *g = f->acc ? f->acc + f->acc_at[i] : f->grad_layer;
        if (!f->acc || first) memset(g, 0, (size_t)f->numel[i] * sizeof(float));
        if ((rc = f->m.bwd_block(f->ws, i, f->full_layer, g, err))) return rc;
        if (last && (rc = reduce_layer(f, i, g, err))) return rc;
    }
    if (first && !f->lay.tied) memset(f->grad_embed, 0, (size_t)f->lay.embed.numel * sizeof(float));
    if ((rc = f->m.bwd_embed(f->ws, f->grad_embed, err))) return rc;
    if (last && (rc = reduce_param(f, f->embed, f->grad_embed, err))) return rc;
    return 0;
}

/* The full-gradient accumulator of every layer (n_layers x layer_numel floats), allocated once. */
static int ensure_acc(train_fsdp *f, fsdp_err *err) {
    if (f->acc) return 0;
    size_t n = (size_t)f->acc_at[f->lay.n_blocks];
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
    for (int64_t i = 0; i < mb * n_micro; i++) nvalid += labels[i] != f->lay.ignore_index;
    if ((rc = comm_allreduce(f->wc, &nvalid, 1, COMM_I64, COMM_SUM, err))) return rc;
    if (n_micro > 1 && (rc = ensure_acc(f, err))) return rc;
    float *acc = f->acc;
    if (n_micro == 1) f->acc = NULL; /* one micro-batch: the rotating layer buffer and no copy */
    double lsum = 0, denom = (double)(nvalid > 0 ? nvalid : 1);
    model_blocks_aux aux = {0, 0};
    for (int m = 0; m < n_micro && !rc; m++) {
        rc = micro_forward(f, tokens + m * mb, labels + m * mb, denom, m == 0, n_micro, &lsum, &aux, err);
        if (!rc) rc = micro_backward(f, m == 0, m == n_micro - 1, err);
    }
    f->acc = acc;
    if (rc) return rc;
    if ((rc = comm_allreduce(f->wc, &lsum, 1, COMM_F64, COMM_SUM, err))) return rc;
    res->ce_loss = nvalid > 0 ? lsum / (double)nvalid : 0.0;
    res->aux_loss = aux.loss;
    res->has_aux = f->lay.n_aux > 0;
    res->loss = res->ce_loss + aux.weighted;
    res->tokens = nvalid;
    res->expert_load = NULL;
    res->load_blocks = res->load_experts = 0;
    if (f->load) {
        const size_t n = (size_t)f->lay.n_blocks * (size_t)f->lay.n_experts;
        if ((rc = train_moe_load_reduce(f->wc, f->load, n, err))) return rc;
        res->expert_load = f->load;
        res->load_blocks = f->lay.n_blocks;
        res->load_experts = f->lay.n_experts;
    }
    /* global gradient norm over the shard group's shards (the replicas hold the same ones), of the
     * trained parameters only (clip_grad_norm_ over those with a gradient) */
    double sumsq = 0;
    for (size_t k = 0; k < f->s->n; k++) {
        state_param *p = &f->s->p[k];
        if (p->grad && state_param_trained(p)) sumsq += kc_sumsq(p->grad, (int64_t)state_param_local_numel(p));
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
    double lr_scale = 1.0;
    res->skipped = 0;
    if (hp->pre_update) {
        if ((rc = hp->pre_update(hp->pre_user, res, &res->skipped, &lr_scale, err))) return rc;
        if (res->skipped) return 0; /* weights, moments and the step count as they were */
    }
    if (!isfinite(res->loss) || !isfinite(res->grad_norm))
        return fsdp_err_set(err, FSDP_E_NUMERIC,
                            "training step %lld: non-finite loss (%g) or gradient norm (%g); nothing was updated",
                            (long long)s->opt_step + 1, res->loss, res->grad_norm);
    if ((rc = state_alloc_optimizer(s, err))) return rc;
    double coef = hp->max_norm > 0 ? kc_clip_coef(res->grad_norm, hp->max_norm) : 1.0;
    int64_t step = s->opt_step + 1;
    kc_adamw_hparams ah = {hp->lr * lr_scale, hp->beta1, hp->beta2, hp->eps, hp->weight_decay};
    for (size_t k = 0; k < s->n; k++) {
        state_param *p = &s->p[k];
        if (!state_param_trained(p)) continue; /* requires_grad=False: no update, not clipped */
        int64_t n = (int64_t)state_param_local_numel(p);
        if (coef < 1.0) kc_scale(p->grad, n, (float)coef);
        ah.weight_decay = hp->no_decay && hp->no_decay[k] ? 0.0 : hp->weight_decay;
        kc_adamw_step(p->data, p->grad, p->exp_avg, p->exp_avg_sq, n, &ah, step);
    }
    s->opt_step = step;
    s->lr = ah.lr;
    s->beta1 = hp->beta1;
    s->beta2 = hp->beta2;
    s->eps = hp->eps;
    s->weight_decay = hp->weight_decay;
    return 0;
}
