/* The FSDP training step on the GPU (train/train_fsdp_cuda.h): train_fsdp.c's order of
 * operations with device collectives on the COMM stream, model kernels on the COMPUTE stream
 * and events between them. Setup and teardown are in train_fsdp_cuda_setup.c. */
#include "train/train_fsdp_cuda_internal.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/kc.h"
#include "train/train_moe.h"

#define TRY(call)                   \
    do {                            \
        int try_rc_ = (call);       \
        if (try_rc_) return try_rc_; \
    } while (0)

static dev_stream comm_stream(const train_fsdp_cuda *f) { return dev_ctx_stream(f->d, DEV_STREAM_COMM); }

/* All-gathers p's shards into dst (f->dt): in bf16 each rank casts its f32 shard into its own
 * block of dst and the gather moves bf16 in place. On the COMM stream. */
static int gather_param(train_fsdp_cuda *f, const state_param *p, void *dst, fsdp_err *err) {
    size_t k = (size_t)(p - f->s->p);
    const size_t *cnt = f->blocks + k * (size_t)f->world;
    for (int r = 0; r < f->world; r++) f->bytes[r] = cnt[r] * f->es;
    const void *send = p->d_data;
    if (f->dt != FSDP_DT_F32) {
        void *own = (char *)dst + (size_t)f->own_off[k] * f->es;
        size_t n = state_param_local_numel(p);
        if (n) TRY(kcu_cast(own, f->dt, p->d_data, FSDP_DT_F32, (int64_t)n, comm_stream(f), err));
        send = own;
    }
    int rc = comm_dev_allgatherv(f->c, send, dst, f->bytes, comm_stream(f), err);
    return rc ? fsdp_err_prefix(err, "training (cuda): all-gather of %s", p->name) : 0;
}

/* Reduce-scatter (sum, f32) of p's full gradient into its local d_grad, on the COMM stream. */
static int reduce_param(train_fsdp_cuda *f, const state_param *p, const float *full, fsdp_err *err) {
    size_t k = (size_t)(p - f->s->p);
    int rc = comm_dev_reduce_scatterv_f32(f->c, full, p->d_grad, f->blocks + k * (size_t)f->world, comm_stream(f),
                                          err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): reduce-scatter of the gradient of %s", p->name);
    if (f->rep)
        rc = comm_dev_allreduce(f->rep, p->d_grad, state_param_local_numel(p), COMM_F32, COMM_SUM, comm_stream(f), err);
    return rc ? fsdp_err_prefix(err, "training (cuda): all-reduce over the replicas of the gradient of %s", p->name) : 0;
}

static int buf_of(const train_fsdp_cuda *f, int layer) { return f->opt.keep_gathered ? layer : layer % 2; }

/* Queues the all-gather of layer i into its buffer unless the buffer already holds it (the
 * parameters do not change within a step). */
static int issue_gather(train_fsdp_cuda *f, int i, fsdp_err *err) {
    int b = buf_of(f, i);
    if (f->buf_layer[b] == i) return 0;
    TRY(train_fsdp_cuda_event_wait(f->d, DEV_STREAM_COMM, f->use_done[b], err)); /* its last reader */
    if (!f->opt.per_param) TRY(train_fsdp_cuda_flat_gather(f, i, f->wbuf[b], err));
    for (int k = f->first[i]; k < f->first[i + 1]; k++) {
        void *dst = (char *)f->wbuf[b] + (size_t)f->off[k] * f->es;
        if (train_fsdp_cuda_is_ep(f, k)) TRY(train_fsdp_cuda_ep_gather(f, k, dst, err));
        else if (f->opt.per_param) TRY(gather_param(f, f->layer[k], dst, err));
    }
    TRY(train_fsdp_cuda_event_record(f->d, f->g_done[b], DEV_STREAM_COMM, err));
    f->buf_layer[b] = i;
    return 0;
}

/* Offloaded optimizer: once `after` (recorded on COMM after the reduce-scatter) completed, copy
 * the gradients and parameters of ps[0..n) to the pinned staging buffers on the COPY stream and
 * mark group g's event. */
static int download_group(train_fsdp_cuda *f, state_param *const *ps, int n, dev_event after, int g, fsdp_err *err) {
    TRY(train_fsdp_cuda_event_wait(f->d, DEV_STREAM_COPY, after, err));
    for (int j = 0; j < n; j++) {
        const state_param *p = ps[j];
        size_t k = (size_t)(p - f->s->p), bytes = state_param_local_numel(p) * sizeof(float);
        if (!bytes) continue;
        TRY(dev_copy_d2h(f->d, f->h_stage + f->h_off[k], p->d_grad, bytes, DEV_STREAM_COPY, err));
        TRY(dev_copy_d2h(f->d, f->h_stage + f->stage_total + f->h_off[k], p->d_data, bytes, DEV_STREAM_COPY, err));
    }
    return train_fsdp_cuda_event_record(f->d, f->ev_dl[g], DEV_STREAM_COPY, err);
}

/* Forward and the training head (loss and head gradients in one chunked pass; the loss's
 * denominator, the global token count, is known before). */
static int forward(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, double denom, int first,
                   int n_micro, fsdp_err *err) {
    const model_blocks_cuda *m = &f->m;
    const int L = f->lay.n_blocks;
    dev_ctx *d = f->d;
    /* the embedding, final norm and output weights stay gathered for the whole step */
    TRY(gather_param(f, f->embed, f->full_embed, err));
    TRY(gather_param(f, f->norm, f->full_norm, err));
    if (f->output) TRY(gather_param(f, f->output, f->full_output, err));
    TRY(train_fsdp_cuda_event_record(d, f->ev[TRAIN_FSDP_CUDA_EV_HEAD_W], DEV_STREAM_COMM, err));
    TRY(issue_gather(f, 0, err));
    TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMPUTE, f->ev[TRAIN_FSDP_CUDA_EV_HEAD_W], err));
    TRY(m->fwd_embed(f->ws, f->full_embed, tokens, labels, f->B, f->T, err));
    for (int i = 0; i < L; i++) {
        if (i + 1 < L) TRY(issue_gather(f, i + 1, err)); /* prefetch, overlaps layer i */
        int b = buf_of(f, i);
        TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMPUTE, f->g_done[b], err));
        TRY(m->fwd_block(f->ws, i, f->wbuf[b], err));
        TRY(train_fsdp_cuda_event_record(d, f->use_done[b], DEV_STREAM_COMPUTE, err));
    }
    if (f->lay.n_aux) {
        if (first) memset(&f->aux, 0, sizeof f->aux);
        TRY(train_moe_aux(m->aux_stats, m->aux_apply, f->ws, f->wc, f->aux_buf, f->lay.n_aux, n_micro, &f->aux, err));
    }
    if (f->load) train_moe_load_add(m->expert_load, f->ws, L, f->lay.n_experts, f->load, first);
    if (first) { /* later micro-batches of the step add to the head's gradients */
        TRY(dev_memset0(d, f->grad_norm, (size_t)f->lay.norm.numel * sizeof(float), DEV_STREAM_COMPUTE, err));
        /* tied: the head's gradient is the first half of the embedding's (grad_output == grad_embed) */
        TRY(dev_memset0(d, f->grad_output, (size_t)f->lay.output.numel * sizeof(float), DEV_STREAM_COMPUTE, err));
    }
    TRY(m->head_train(f->ws, f->full_norm, f->full_output, f->grad_norm, f->grad_output, denom, err));
    /* this rank's loss sum (summed over the micro-batches), all-reduced with the gradient norm at the end */
    const double *ls = m->loss_sums(f->ws);
    if (first) return dev_copy_d2d(d, f->d_stats, ls, sizeof(double), DEV_STREAM_COMPUTE, err);
    return kcu_acc_f64(f->d_stats, ls, 1, dev_ctx_stream(d, DEV_STREAM_COMPUTE), err);
}

/* The backward after the training head: head gradients out, then the layers and the embedding.
 * Gradient accumulation (f->gacc: every layer's full gradient): the gradients of each micro-batch add
 * up there (and in the head's and embedding's full buffers); the reduce-scatters and the offloaded
 * optimizer's downloads run only with the last micro-batch, once per parameter and step. */
static int backward(train_fsdp_cuda *f, int first, int last, fsdp_err *err) {
    const model_blocks_cuda *m = &f->m;
    dev_ctx *d = f->d;
    const int L = f->lay.n_blocks;
    if (f->output && first)
        TRY(dev_memset0(d, f->grad_embed, (size_t)f->lay.embed.numel * sizeof(float), DEV_STREAM_COMPUTE, err));
    TRY(issue_gather(f, L - 1, err));
    if (last) {
        TRY(train_fsdp_cuda_event_record(d, f->ev[TRAIN_FSDP_CUDA_EV_HEAD_G], DEV_STREAM_COMPUTE, err));
        TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMM, f->ev[TRAIN_FSDP_CUDA_EV_HEAD_G], err));
        TRY(reduce_param(f, f->norm, f->grad_norm, err));
        if (f->output) TRY(reduce_param(f, f->output, f->grad_output, err));
    }
    if (last && f->offload) {
        state_param *head[2] = {f->norm, f->output};
        TRY(train_fsdp_cuda_event_record(d, f->ev[TRAIN_FSDP_CUDA_EV_HEAD_RS], DEV_STREAM_COMM, err));
        TRY(download_group(f, head, f->output ? 2 : 1, f->ev[TRAIN_FSDP_CUDA_EV_HEAD_RS], L, err));
    }
    for (int i = L - 1; i >= 0; i--) {
        if (i >= 1) TRY(issue_gather(f, i - 1, err)); /* prefetch, overlaps layer i */
        int b = buf_of(f, i), gb = i % 2;
        float *g = f->gacc ? f->gacc + f->acc_at[i] : f->gbuf[gb];
        TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMPUTE, f->g_done[b], err));
        /* the gradient buffer's previous reduce-scatter (layer i+2) must be done */
        if (!f->gacc) TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMPUTE, f->rs_done[gb], err));
        if (!f->gacc || first)
            TRY(dev_memset0(d, g, (size_t)f->bnumel[i] * sizeof(float), DEV_STREAM_COMPUTE, err));
        TRY(m->bwd_block(f->ws, i, f->wbuf[b], g, err));
        TRY(train_fsdp_cuda_event_record(d, f->use_done[b], DEV_STREAM_COMPUTE, err));
        if (!last) continue;
        TRY(train_fsdp_cuda_event_record(d, f->gl_ready[gb], DEV_STREAM_COMPUTE, err));
        TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMM, f->gl_ready[gb], err));
        state_param **ps = f->layer + f->first[i];
        const int np = f->first[i + 1] - f->first[i];
        if (!f->opt.per_param) TRY(train_fsdp_cuda_flat_reduce(f, i, g, err));
        for (int k = f->first[i]; k < f->first[i + 1]; k++) {
            if (train_fsdp_cuda_is_ep(f, k)) TRY(train_fsdp_cuda_ep_reduce(f, k, g + f->off[k], err));
            else if (f->opt.per_param) TRY(reduce_param(f, f->layer[k], g + f->off[k], err));
        }
        TRY(train_fsdp_cuda_event_record(d, f->rs_done[gb], DEV_STREAM_COMM, err));
        if (f->offload) TRY(download_group(f, ps, np, f->rs_done[gb], i, err));
    }
    TRY(m->bwd_embed(f->ws, f->grad_embed, err));
    if (!last) return 0;
    TRY(train_fsdp_cuda_event_record(d, f->ev[TRAIN_FSDP_CUDA_EV_EMBED_G], DEV_STREAM_COMPUTE, err));
    TRY(train_fsdp_cuda_event_wait(d, DEV_STREAM_COMM, f->ev[TRAIN_FSDP_CUDA_EV_EMBED_G], err));
    TRY(reduce_param(f, f->embed, f->grad_embed, err));
    if (f->offload) {
        TRY(train_fsdp_cuda_event_record(d, f->ev[TRAIN_FSDP_CUDA_EV_EMBED_RS], DEV_STREAM_COMM, err));
        TRY(download_group(f, &f->embed, 1, f->ev[TRAIN_FSDP_CUDA_EV_EMBED_RS], L + 1, err));
    }
    return 0;
}

/* Every stream after the work queued so far on the others (the previous step's optimizer and
 * uploads, the previous micro-batch's backward) and the other way round. */
static int join_streams(dev_ctx *d, fsdp_err *err) {
    TRY(dev_stream_wait(d, DEV_STREAM_COMPUTE, DEV_STREAM_COPY, err));
    TRY(dev_stream_wait(d, DEV_STREAM_COMPUTE, DEV_STREAM_COMM, err));
    TRY(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, err));
    return dev_stream_wait(d, DEV_STREAM_COPY, DEV_STREAM_COMPUTE, err);
}

/* Queues forward, backward, the global gradient sum of squares and its all-reduce with the loss
 * sum (d_stats), then their copy to the pinned h_stats (event EV_STATS on COMM). No host
 * synchronisation; *nvalid: the global token count (host labels, host all-reduce). */
static int queue_grads(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                       int64_t *nvalid, fsdp_err *err) {
    if (!f || !tokens || !labels)
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): no trainer, tokens or labels");
    dev_ctx *d = f->d;
    if (n_micro < 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): %d micro-batches, expected >= 1", n_micro);
    /* global number of tokens in the mean (every micro-batch of every rank): the head's 1/denom is
     * needed before its forward */
    const int64_t mb = (int64_t)f->B * f->T;
    int64_t nv = 0;
    for (int64_t i = 0; i < mb * n_micro; i++) nv += labels[i] != f->lay.ignore_index;
    TRY(comm_allreduce(f->wc, &nv, 1, COMM_I64, COMM_SUM, err));
    *nvalid = nv;
    if (n_micro > 1) TRY(train_fsdp_cuda_alloc_acc(f, err));
    float *gacc = f->gacc;
    if (n_micro == 1) f->gacc = NULL; /* one micro-batch: the two rotating layer buffers */
    for (int b = 0; b < f->nbuf; b++) f->buf_layer[b] = -1;
    int rc = 0;
    for (int m = 0; m < n_micro && !rc; m++) {
        rc = join_streams(d, err);
        if (!rc) rc = forward(f, tokens + m * mb, labels + m * mb, (double)(nv > 0 ? nv : 1), m == 0, n_micro, err);
        if (!rc) rc = backward(f, m == 0, m == n_micro - 1, err);
    }
    f->gacc = gacc;
    if (rc) return rc;
    if (f->load) TRY(train_moe_load_reduce(f->wc, f->load, (size_t)f->lay.n_blocks * (size_t)f->lay.n_experts, err));
    /* global gradient norm: local sum of squares, all-reduced with the loss sum in one call */
    TRY(dev_stream_wait(d, DEV_STREAM_COMPUTE, DEV_STREAM_COMM, err));
    TRY(kcu_list_grad_sumsq(f->list, f->d_stats + 1, dev_ctx_stream(d, DEV_STREAM_COMPUTE), err));
    TRY(dev_stream_wait(d, DEV_STREAM_COMM, DEV_STREAM_COMPUTE, err));
    rc = comm_dev_allreduce(f->c, f->d_stats, 2, COMM_F64, COMM_SUM, comm_stream(f), err);
    /* HSDP: the gradient norm is the shard group's (the replicas hold the same shards); the loss sums
     * every replica's too */
    if (!rc && f->rep) rc = comm_dev_allreduce(f->rep, f->d_stats, 1, COMM_F64, COMM_SUM, comm_stream(f), err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): all-reduce of the loss and gradient norm");
    /* read back asynchronously: the host looks at it only once the rest of the step is queued */
    TRY(dev_copy_d2h(d, f->h_stats, f->d_stats, 2 * sizeof(double), DEV_STREAM_COMM, err));
    return train_fsdp_cuda_event_record(d, f->ev[TRAIN_FSDP_CUDA_EV_STATS], DEV_STREAM_COMM, err);
}

/* Waits for the statistics queued by queue_grads (not for the rest of the step's work). */
static int read_stats(train_fsdp_cuda *f, int64_t nvalid, train_fsdp_result *res, fsdp_err *err) {
    int rc = train_fsdp_cuda_event_sync(f->ev[TRAIN_FSDP_CUDA_EV_STATS], err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): reading the loss and gradient norm");
    res->ce_loss = nvalid > 0 ? f->h_stats[0] / (double)nvalid : 0.0;
    res->has_aux = f->lay.n_aux > 0;
    res->aux_loss = res->has_aux ? f->aux.loss : 0.0;
    res->loss = res->ce_loss + (res->has_aux ? f->aux.weighted : 0.0);
    res->expert_load = f->load;
    res->load_blocks = f->load ? f->lay.n_blocks : 0;
    res->load_experts = f->load ? f->lay.n_experts : 0;
    res->tokens = nvalid;
    res->grad_norm = f->h_stats[1] >= 0 ? sqrt(f->h_stats[1]) : NAN;
    return 0;
}

int train_fsdp_cuda_grads(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, train_fsdp_result *res,
                          fsdp_err *err) {
    return train_fsdp_cuda_grads_accum(f, tokens, labels, 1, res, err);
}

int train_fsdp_cuda_grads_accum(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                                train_fsdp_result *res, fsdp_err *err) {
    if (!res) return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): no result");
    int64_t nvalid = 0;
    TRY(queue_grads(f, tokens, labels, n_micro, &nvalid, err));
    return read_stats(f, nvalid, res, err);
}

static int non_finite(const train_fsdp_result *res, int64_t step, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_NUMERIC,
                        "training step %lld: non-finite loss (%g) or gradient norm (%g); nothing was updated",
                        (long long)step, res->loss, res->grad_norm);
}

/* AdamW on the CPU for each downloaded group, in the order the copies were queued; each updated
 * parameter is uploaded at once on the COPY stream. */
static int offloaded_adamw(train_fsdp_cuda *f, double coef, const kc_adamw_hparams *ah,
                           const unsigned char *no_decay, int64_t step, fsdp_err *err) {
    const int L = f->lay.n_blocks;
    for (int j = 0; j < L + 2; j++) {
        int g = j == 0 ? L : j <= L ? L - j : L + 1; /* head, layers L-1..0, embedding */
        state_param *head[2] = {f->norm, f->output};
        state_param **ps = g == L ? head : g == L + 1 ? &f->embed : f->layer + f->first[g];
        int n = g == L ? (f->output ? 2 : 1) : g == L + 1 ? 1 : f->first[g + 1] - f->first[g];
        TRY(train_fsdp_cuda_event_sync(f->ev_dl[g], err));
        for (int q = 0; q < n; q++) {
            state_param *p = ps[q];
            size_t k = (size_t)(p - f->s->p), cnt = state_param_local_numel(p);
            if (!cnt || !state_param_trained(p)) continue;
            float *hg = f->h_stage + f->h_off[k], *hp = f->h_stage + f->stage_total + f->h_off[k];
            if (coef < 1.0) kc_scale(hg, (int64_t)cnt, (float)coef);
            kc_adamw_hparams h = *ah;
            if (no_decay && no_decay[k]) h.weight_decay = 0.0;
            kc_adamw_step(hp, hg, p->exp_avg, p->exp_avg_sq, (int64_t)cnt, &h, step);
            TRY(dev_copy_h2d(f->d, p->d_data, hp, cnt * sizeof(float), DEV_STREAM_COPY, err));
        }
    }
    /* the next work on the compute stream sees the new parameters */
    return dev_stream_wait(f->d, DEV_STREAM_COMPUTE, DEV_STREAM_COPY, err);
}

int train_fsdp_cuda_step(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels,
                         const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err) {
    return train_fsdp_cuda_step_accum(f, tokens, labels, 1, hp, res, err);
}

int train_fsdp_cuda_step_accum(train_fsdp_cuda *f, const int32_t *tokens, const int32_t *labels, int n_micro,
                               const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err) {
    if (!hp || !res) return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): no hyper-parameters or result");
    int64_t nvalid = 0;
    TRY(queue_grads(f, tokens, labels, n_micro, &nvalid, err));
    fsdp_state *s = f->s;
    int64_t step = s->opt_step + 1;
    kc_adamw_hparams ah = {hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay};
    kcu_stream cs = dev_ctx_stream(f->d, DEV_STREAM_COMPUTE);
    res->skipped = 0;
    if (hp->pre_update) {
        /* the hook decides on the statistics: read them before the update is queued */
        double lr_scale = 1.0;
        TRY(read_stats(f, nvalid, res, err));
        TRY(hp->pre_update(hp->pre_user, res, &res->skipped, &lr_scale, err));
        if (res->skipped) return 0; /* weights, moments and the step count as they were */
        ah.lr *= lr_scale;
    }
    if (f->offload) {
        /* the CPU optimizer needs the clip coefficient on the host: wait for the statistics */
        TRY(read_stats(f, nvalid, res, err));
        if (!isfinite(res->loss) || !isfinite(res->grad_norm)) return non_finite(res, step, err);
        double coef = hp->max_norm > 0 ? kc_clip_coef(res->grad_norm, hp->max_norm) : 1.0;
        TRY(state_alloc_optimizer(s, err)); /* host moments (zeroed) where missing */
        TRY(offloaded_adamw(f, coef, &ah, hp->no_decay, step, err));
        /* the device gradients end clipped too, like the CPU path's */
        if (coef < 1.0) TRY(kcu_list_grad_scale(f->list, (float)coef, cs, err));
    } else {
        /* clipping and the update from the all-reduced statistics on the device, without a host
         * round trip; a non-finite loss or norm makes both change nothing (kcu_clip_coef's flag) */
        TRY(dev_stream_wait(f->d, DEV_STREAM_COMPUTE, DEV_STREAM_COMM, err));
        TRY(kcu_clip_coef(f->d_stats, hp->max_norm, f->d_clip, cs, err));
        TRY(kcu_list_grad_scale_dev(f->list, f->d_clip, cs, err));
        if (hp->no_decay) { /* AdamW in two launches: with weight decay, and without for the no_decay ones */
            TRY(train_fsdp_cuda_split_lists(f, hp->no_decay, err));
            kc_adamw_hparams ah0 = ah;
            ah0.weight_decay = 0.0;
            if (f->list_wd) TRY(kcu_adamw_step_guarded(f->list_wd, &ah, step, f->d_clip, cs, err));
            if (f->list_nowd) TRY(kcu_adamw_step_guarded(f->list_nowd, &ah0, step, f->d_clip, cs, err));
        } else {
            TRY(kcu_adamw_step_guarded(f->list, &ah, step, f->d_clip, cs, err));
        }
        /* every piece of the step is queued: now the loss and norm (the optimizer may still run) */
        TRY(read_stats(f, nvalid, res, err));
        if (!isfinite(res->loss) || !isfinite(res->grad_norm)) return non_finite(res, step, err);
    }
    s->has_optimizer = 1;
    s->opt_step = step;
    s->lr = ah.lr;
    s->beta1 = hp->beta1;
    s->beta2 = hp->beta2;
    s->eps = hp->eps;
    s->weight_decay = hp->weight_decay;
    return 0;
}
