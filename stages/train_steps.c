/* Stage `train-steps`: FSDP training of the model in the context, from its current step
 * up to `steps` (the total, like torchtitan's training.steps, so a resumed run continues
 * the same schedule). Per layer all-gather -> forward -> reshard; backward with all-gather
 * -> gradients -> reduce-scatter; clip by the global norm; AdamW on the shards.
 *
 * with: steps (int, required: train until this global step), lr, warmup_steps,
 *       decay (none|linear|cosine), min_lr_ratio, betas ([b1, b2]), eps, weight_decay,
 *       max_grad_norm, log_every, metrics (JSONL path), save_every, save_path */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/llama_fsdp.h"
#include "model/lr_schedule.h"
#include "runtime/data.h"
#include "stages/stages.h"

static const char *const DECAYS[] = {"none", "linear", "cosine", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"steps", FSDP_T_INT, 1, NULL, NULL, "train until this global step (the schedule's length)"},
    {"lr", FSDP_T_FLOAT, 0, "8e-4", NULL, "peak learning rate"},
    {"warmup_steps", FSDP_T_INT, 0, "0", NULL, "linear warmup lr*(s+1)/warmup_steps for s < warmup_steps"},
    {"decay", FSDP_T_STRING, 0, "linear", DECAYS, "after warmup: none, linear or cosine to min_lr_ratio*lr"},
    {"min_lr_ratio", FSDP_T_FLOAT, 0, "0.1", NULL, "final lr as a fraction of lr"},
    {"betas", FSDP_T_LIST, 0, "[0.9, 0.95]", NULL, "AdamW betas"},
    {"eps", FSDP_T_FLOAT, 0, "1e-8", NULL, "AdamW eps"},
    {"weight_decay", FSDP_T_FLOAT, 0, "0.1", NULL, "AdamW decoupled weight decay"},
    {"max_grad_norm", FSDP_T_FLOAT, 0, "1.0", NULL, "clip to this global gradient norm (0 = off)"},
    {"log_every", FSDP_T_INT, 0, "1", NULL, "log (and write metrics) every N steps"},
    {"metrics", FSDP_T_STRING, 0, NULL, NULL, "append one JSON line per logged step to this file"},
    {"save_every", FSDP_T_INT, 0, "0", NULL, "write a DCP checkpoint save_path/step-<N> every N steps (0 = never)"},
    {"save_path", FSDP_T_STRING, 0, NULL, NULL, "directory of the periodic checkpoints"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params", NULL};
static const char *const PROVIDES[] = {"params", "optimizer", NULL};

static int train_check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *b = fsdp_value_get(with, "betas");
    double x;
    if (fsdp_value_size(b) != 2 || fsdp_value_float(fsdp_value_item(b, 0), &x) ||
        fsdp_value_float(fsdp_value_item(b, 1), &x))
        return fsdp_err_at(err, FSDP_E_INVALID, b, "train-steps: betas must be a list of two numbers");
    if (fsdp_arg_int(with, "steps", 0) < 0)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "steps"), "train-steps: steps must be >= 0");
    if (fsdp_arg_int(with, "log_every", 1) < 1)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "log_every"), "train-steps: log_every must be >= 1");
    if (fsdp_arg_int(with, "save_every", 0) > 0 && !fsdp_arg_str(with, "save_path", NULL))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "save_every"),
                           "train-steps: save_every needs save_path");
    return 0;
}

static int write_metrics(FILE *f, int64_t step, double loss, double gnorm, double lr, int64_t tokens, double tps,
                         double elapsed) {
    return fprintf(f,
                   "{\"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, \"tokens\": %lld, "
                   "\"tokens_per_s\": %.6g, \"elapsed_s\": %.6g}\n",
                   (long long)step, loss, gnorm, lr, (long long)tokens, tps, elapsed) < 0
               ? -1
               : fflush(f);
}

static int train_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s || !s->has_cfg) return fsdp_err_set(err, FSDP_E_INVALID, "train-steps: no model in the context");
    comm *c = stage_comm(ctx);
    /* this training step runs on the host: a state on the GPU comes to host memory first */
    if (state_on_device(s)) {
        fsdp_log(ctx, FSDP_LOG_INFO, "train-steps: the step runs on the CPU; moving the state to host memory");
        int mrc = state_to_host(s, err);
        if (mrc) return fsdp_err_prefix(err, "train-steps");
    }
    int64_t steps = fsdp_arg_int(with, "steps", 0);
    const fsdp_value *betas = fsdp_value_get(with, "betas");
    llama_fsdp_hparams hp;
    fsdp_value_float(fsdp_value_item(betas, 0), &hp.beta1);
    fsdp_value_float(fsdp_value_item(betas, 1), &hp.beta2);
    hp.eps = fsdp_arg_float(with, "eps", 1e-8);
    hp.weight_decay = fsdp_arg_float(with, "weight_decay", 0.1);
    hp.max_norm = fsdp_arg_float(with, "max_grad_norm", 1.0);
    lrs_config sched;
    sched.lr = fsdp_arg_float(with, "lr", 8e-4);
    sched.warmup_steps = fsdp_arg_int(with, "warmup_steps", 0);
    sched.steps = steps > 0 ? steps : 1;
    sched.min_lr_ratio = fsdp_arg_float(with, "min_lr_ratio", 0.1);
    lrs_decay_from_name(fsdp_arg_str(with, "decay", "linear"), &sched.decay);
    int rc = lrs_validate(&sched, err);
    if (rc) return fsdp_err_prefix(err, "train-steps");
    int64_t log_every = fsdp_arg_int(with, "log_every", 1);
    const char *metrics_path = fsdp_arg_str(with, "metrics", NULL);
    int64_t save_every = fsdp_arg_int(with, "save_every", 0);
    const char *save_path = fsdp_arg_str(with, "save_path", "");
    if (s->train_step >= steps) {
        fsdp_log(ctx, FSDP_LOG_INFO, "already at step %lld of %lld: nothing to train", (long long)s->train_step,
                 (long long)steps);
        return 0;
    }
    /* data */
    const fsdp_value *rt = fsdp_ctx_section(ctx, "runtime");
    data_config dc;
    rc = data_config_from_value(fsdp_ctx_section(ctx, "data"), (uint64_t)fsdp_arg_int(rt, "seed", 0), &dc, err);
    if (rc) return rc;
    data_source *data;
    if ((rc = data_open(&dc, s->cfg.vocab_size, comm_size(c), comm_rank(c), &data, err))) return rc;
    int64_t B = data_local_batch(data), T = dc.seq_len;
    llama_fsdp *f = NULL;
    FILE *mf = NULL;
    int32_t *tokens = malloc((size_t)(B * T) * sizeof *tokens), *labels = malloc((size_t)(B * T) * sizeof *labels);
    if (!tokens || !labels) {
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = llama_fsdp_create(s, c, (int)B, (int)T, &f, err))) goto out;
    if (metrics_path && comm_rank(c) == 0 && !(mf = fopen(metrics_path, "a"))) {
        rc = fsdp_err_set(err, FSDP_E_IO, "train-steps: cannot open metrics file %s: %s", metrics_path, strerror(errno));
        goto out;
    }
    fsdp_log(ctx, FSDP_LOG_INFO, "training steps %lld..%lld: global batch %lld x %lld tokens, %d ranks",
             (long long)s->train_step + 1, (long long)steps, (long long)dc.batch_size, (long long)T, comm_size(c));
    fsdp_progress *prog = fsdp_progress_begin(ctx, "train", (double)(steps - s->train_step), "steps");
    double t0 = stage_now(), t_last = t0;
    int64_t first = s->train_step, tok_since = 0;
    double loss = 0, gnorm = 0;
    while (s->train_step < steps) {
        int64_t step = s->train_step; /* 0-based index of this step */
        hp.lr = lrs_at(&sched, step);
        if ((rc = data_batch(data, s->data_pos, tokens, labels, err))) break;
        llama_fsdp_result r;
        if ((rc = llama_fsdp_step(f, tokens, labels, &hp, &r, err))) {
            fsdp_err_prefix(err, "train-steps: step %lld", (long long)step + 1);
            break;
        }
        s->train_step++;
        s->data_pos++;
        s->tokens_seen += dc.batch_size * T;
        tok_since += dc.batch_size * T;
        loss = r.loss;
        gnorm = r.grad_norm;
        if (s->train_step % log_every == 0 || s->train_step == steps) {
            double now = stage_now();
            double tps = now > t_last ? (double)tok_since / (now - t_last) : 0;
            fsdp_log(ctx, FSDP_LOG_INFO, "step %lld/%lld  loss %.4f  grad_norm %.4f  lr %.3g  %.0f tok/s",
                     (long long)s->train_step, (long long)steps, loss, gnorm, hp.lr, tps);
            if (mf && write_metrics(mf, s->train_step, loss, gnorm, hp.lr, s->tokens_seen, tps, now - t0)) {
                rc = fsdp_err_set(err, FSDP_E_IO, "train-steps: cannot write metrics file %s", metrics_path);
                break;
            }
            t_last = now;
            tok_since = 0;
        }
        char status[64];
        snprintf(status, sizeof status, "loss %.4f", loss);
        fsdp_progress_update(prog, (double)(s->train_step - first), status);
        if (save_every > 0 && s->train_step % save_every == 0) {
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/step-%lld", save_path, (long long)s->train_step);
            if ((rc = stage_save_dcp_to(ctx, s, dir, 1, 1, err))) break;
        }
    }
    fsdp_progress_end(prog);
    fsdp_ctx_metric(ctx, "final_loss", loss);
    fsdp_ctx_metric(ctx, "final_grad_norm", gnorm);
    fsdp_ctx_metric(ctx, "steps", (double)(s->train_step - first));
    double el = stage_now() - t0;
    fsdp_ctx_metric(ctx, "tokens_per_s", el > 0 ? (double)((s->train_step - first) * dc.batch_size * T) / el : 0);
out:
    if (mf) fclose(mf);
    llama_fsdp_free(f);
    free(tokens);
    free(labels);
    data_close(data);
    return rc;
}

const fsdp_stage_desc stage_train_steps = {
    FSDP_STAGE_DESC_INIT,
    "train-steps",
    "FSDP training: per-layer all-gather, forward, backward, reduce-scatter, clipping, AdamW",
    PARAMS,
    NEEDS,
    PROVIDES,
    train_run,
    train_check,
};
