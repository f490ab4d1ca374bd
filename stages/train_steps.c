/* Stage `train-steps`: FSDP training of the model in the context, from its current step
 * up to `steps` (the total, like torchtitan's training.steps, so a resumed run continues
 * the same schedule). Per layer all-gather -> forward -> reshard; backward with all-gather
 * -> gradients -> reduce-scatter; clip by the global norm; AdamW on the shards.
 *
 * The state's placement picks the path (stages/train_backend.h): on the GPU the step of
 * train/train_fsdp_cuda.h (f32 or FSDP2-style bf16 mixed precision), otherwise the CPU step of
 * train/train_fsdp.h (f32); both with optional activation checkpointing, full or selective
 * (decoder_ac in decoder/decoder_model.h).
 *
 * with: steps (int, required: train until this global step), lr, warmup_steps,
 *       schedule_steps (the schedule's length, default steps), decay (none|linear|cosine|wsd),
 *       min_lr_ratio, decay_ratio / decay_type / min_lr_factor (wsd), no_decay (globs),
 *       grad_accum or micro_batch, eval_every / eval_batches / eval_data (stages/train_opts.h),
 *       betas ([b1, b2]), eps, weight_decay,
 *       max_grad_norm, log_every, metrics (JSONL path), save_every, save_path, save_async (periodic saves
 *       in the background, one in flight, each committed as soon as written), keep_last (K newest committed
 *       step-<N> kept), save_overwrite (a periodic save may replace an existing step-<N>; otherwise an error
 *       before the first step),
 *       mixed (none|bf16, GPU), ac (none|full|selective), reshard_after_forward (bool, GPU),
 *       head_chunk_rows (rows of logits per output-head chunk, 0 = automatic: 256 MiB),
 *       peak_tflops (device peak for MFU; GPU default 989, the H100 SXM dense bf16 peak)
 *
 * Metrics (JSONL per logged step and the run report): loss, grad_norm, lr, tokens, tokens_per_s
 * (global), mfu (percent, torchtitan's: model FLOPs per token from decoder_flops_per_token times the
 * tokens/s per rank over the peak; on the CPU only when peak_tflops is given), and the peak
 * memory: peak_device_mem_mib on the GPU, peak_rss_mib on the CPU. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_steps.h"
#include "ckpt/dcp.h"
#include "train/lr_schedule.h"
#include "runtime/crash.h"
#include "runtime/ctx_impl.h"
#include "train/data.h"
#include "runtime/fileio.h"
#include "ckpt/safetensors.h"
#include "stages/stages.h"
#include "model/mt_state.h"
#include "api/api_callbacks.h"
#include "api/api_hooks.h"
#include "stages/train_hooks.h"
#include "stages/train_backend.h"
#include "stages/train_calls.h"
#include "stages/train_opts.h"

/* The default peak for MFU on the GPU: H100 SXM dense bf16 (TFLOP/s). */
#define TRAIN_GPU_PEAK_TFLOPS 989.0

/* The metrics file's directory (mkdir -p). */
static int metrics_dir(const char *path, fsdp_err *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    return st_mkdirs(dir, err) ? fsdp_err_prefix(err, "train-steps: metrics") : 0;
}

static const char *const DECAYS[] = {"none", "linear", "cosine", "wsd", NULL};
static const char *const WSD_TYPES[] = {"linear", "sqrt", "cosine", NULL};
static const char *const MIXED[] = {"none", "bf16", NULL};
static const char *const ACS[] = {"none", "full", "selective", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"steps", FSDP_T_INT, 1, NULL, NULL, "train until this global step (the schedule's length unless schedule_steps)"},
    {"schedule_steps", FSDP_T_INT, 0, NULL, NULL,
     "length of the lr schedule (default steps): steps 1000 with schedule_steps 10000 runs the first 1000 steps of a "
     "10000-step curve"},
    {"lr", FSDP_T_FLOAT, 0, "8e-4", NULL, "peak learning rate"},
    {"warmup_steps", FSDP_T_INT, 0, "0", NULL, "linear warmup lr*(s+1)/warmup_steps for s < warmup_steps"},
    {"decay", FSDP_T_STRING, 0, "linear", DECAYS,
     "after warmup: none, linear or cosine to min_lr_ratio*lr; or wsd (warmup-stable-decay, torchtitan's schedule)"},
    {"min_lr_ratio", FSDP_T_FLOAT, 0, "0.1", NULL, "final lr as a fraction of lr (linear, cosine)"},
    {"decay_ratio", FSDP_T_FLOAT, 0, NULL, NULL,
     "wsd: fraction of schedule_steps spent decaying (default: all steps after warmup)"},
    {"decay_type", FSDP_T_STRING, 0, NULL, WSD_TYPES, "wsd: shape of the decay, linear (default), sqrt or cosine"},
    {"min_lr_factor", FSDP_T_FLOAT, 0, NULL, NULL, "wsd: final lr as a fraction of lr (default 0)"},
    {"no_decay", FSDP_T_LIST, 0, NULL, NULL,
     "globs of parameter names trained without weight decay, e.g. [\"*norm*\", \"*.bias\"]"},
    {"freeze", FSDP_T_LIST, 0, NULL, NULL,
     "globs of parameter names not trained (PyTorch's requires_grad=False): no update, no moments, no weight decay, "
     "left out of the gradient norm and clipping; saved and loaded as before"},
    {"grad_accum", FSDP_T_INT, 0, NULL, NULL,
     "micro-batches per optimizer step (the rank's batch split in as many; one reduce-scatter per step)"},
    {"micro_batch", FSDP_T_INT, 0, NULL, NULL, "rows per micro-batch on each rank (instead of grad_accum)"},
    {"eval_every", FSDP_T_INT, 0, "0", NULL, "evaluate on eval_data every N steps and after the last (0 = never)"},
    {"eval_batches", FSDP_T_INT, 0, "1", NULL, "global batches of eval_data per evaluation (the same ones each time)"},
    {"eval_data", FSDP_T_MAP, 0, NULL, NULL,
     "held-out data: a map with data:'s keys (kind, path, dtype, order, seed); the rest is data:'s"},
    {"betas", FSDP_T_LIST, 0, "[0.9, 0.95]", NULL, "AdamW betas"},
    {"eps", FSDP_T_FLOAT, 0, "1e-8", NULL, "AdamW eps"},
    {"weight_decay", FSDP_T_FLOAT, 0, "0.1", NULL, "AdamW decoupled weight decay"},
    {"max_grad_norm", FSDP_T_FLOAT, 0, "1.0", NULL, "clip to this global gradient norm (0 = off)"},
    {"log_every", FSDP_T_INT, 0, "1", NULL, "log (and write metrics) every N steps"},
    {"metrics", FSDP_T_STRING, 0, NULL, NULL, "append one JSON line per logged step to this file"},
    {"save_every", FSDP_T_INT, 0, "0", NULL, "write a DCP checkpoint save_path/step-<N> every N steps (0 = never)"},
    {"save_path", FSDP_T_STRING, 0, NULL, NULL, "directory of the periodic checkpoints"},
    {"save_async", FSDP_T_BOOL, 0, "false", NULL,
     "periodic saves in the background (one in flight; each committed as soon as its files are written)"},
    {"keep_last", FSDP_T_INT, 0, "0", NULL,
     "keep the K newest committed step-<N> checkpoints, removing older ones once a newer one is committed (0 = all)"},
    {"save_overwrite", FSDP_T_BOOL, 0, "false", NULL,
     "let a periodic save replace an existing save_path/step-<N> checkpoint (otherwise: an error before training)"},
    {"mixed", FSDP_T_STRING, 0, "none", MIXED,
     "GPU precision: none (float32) or bf16 (bf16 compute and all-gathers, fp32 master weights, optimizer and "
     "reduce-scatter)"},
    {"ac", FSDP_T_STRING, 0, "none", ACS,
     "activation checkpointing: none; full (keep each layer's input, recompute its forward in the backward); or "
     "selective (keep the GEMM and attention outputs and the residual stream, recompute only the RMSNorm outputs "
     "and SwiGLU's product in the backward)"},
    {"reshard_after_forward", FSDP_T_BOOL, 0, "true", NULL,
     "GPU: free each gathered layer after its forward and gather it again in the backward (false: keep them all)"},
    {"flat_collectives", FSDP_T_BOOL, 0, "true", NULL,
     "one all-gather and one reduce-scatter per transformer block on a flat buffer (FSDP2's per-block parameter "
     "groups); false: one per parameter (the same values; for comparison)"},
    {"head_chunk_rows", FSDP_T_INT, 0, "0", NULL,
     "rows of the output head (logits, cross-entropy and their gradient) per chunk, so that at most that many rows "
     "of logits exist at once (0 = automatic: 256 MiB of logits per chunk)"},
    {"expert_parallel", FSDP_T_INT, 0, "1", NULL,
     "mixture of experts: ranks over which whole experts are placed and tokens dispatched by all-to-all (1 = off: "
     "FSDP gathers every expert); must divide the shard group's ranks, which must divide the experts"},
    {"peak_tflops", FSDP_T_FLOAT, 0, NULL, NULL,
     "peak TFLOP/s of one device for mfu (GPU default 989, H100 SXM bf16 dense; CPU: no mfu unless given)"},
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
    int64_t hc = fsdp_arg_int(with, "head_chunk_rows", 0);
    if (hc < 0 || hc > INT_MAX)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "head_chunk_rows"),
                           "train-steps: head_chunk_rows is %lld, expected 0 (automatic: 256 MiB of logits per chunk) "
                           "or a positive number of rows",
                           (long long)hc);
    if (fsdp_value_get(with, "peak_tflops") && !(fsdp_arg_float(with, "peak_tflops", 0) > 0))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "peak_tflops"),
                           "train-steps: peak_tflops must be > 0");
    if (fsdp_arg_int(with, "expert_parallel", 1) < 1)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "expert_parallel"),
                           "train-steps: expert_parallel must be >= 1 (1: off)");
    if (fsdp_arg_int(with, "keep_last", 0) < 0)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "keep_last"),
                           "train-steps: keep_last must be >= 0 (0 keeps every checkpoint)");
    if (fsdp_arg_int(with, "save_every", 0) > 0 && !fsdp_arg_str(with, "save_path", NULL))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "save_every"),
                           "train-steps: save_every needs save_path");
    return train_opts_check(with, err);
}

typedef struct train_metrics {
    int64_t step, tokens;
    double loss, gnorm, lr, tps, elapsed;
    double mfu; /* < 0: not reported */
    const char *mem_name;
    double mem_mib;
    const char *run_id, *run_start; /* which run wrote the line (fsdp_ctx_run_id) */
    const char *moe;                /* a mixture of experts' fields (train_moe_fields), or NULL */
} train_metrics;

/* A JSON number, or null when it is not finite (a skipped update's loss may be NaN). */
static const char *json_num(char *buf, size_t cap, double v) {
    if (isfinite(v)) snprintf(buf, cap, "%.9g", v);
    else snprintf(buf, cap, "null");
    return buf;
}

static int write_metrics(FILE *f, const train_metrics *m) {
    char mfu[64] = "", loss[32], gn[32];
    if (m->mfu >= 0) snprintf(mfu, sizeof mfu, ", \"mfu\": %.6g", m->mfu);
    return fprintf(f,
                   "{\"step\": %lld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %.9g, \"tokens\": %lld, "
                   "\"tokens_per_s\": %.6g%s, \"%s\": %.6g, \"elapsed_s\": %.6g, \"run_id\": \"%s\", "
                   "\"run_start\": \"%s\"%s}\n",
                   (long long)m->step, json_num(loss, sizeof loss, m->loss), json_num(gn, sizeof gn, m->gnorm), m->lr,
                   (long long)m->tokens, m->tps, mfu, m->mem_name, m->mem_mib, m->elapsed, m->run_id ? m->run_id : "",
                   m->run_start ? m->run_start : "", m->moe ? m->moe : "") < 0
               ? -1
               : fflush(f);
}

/* One evaluation at `step` on the held-out data: the log line, a metrics line {"step", "eval_loss",
 * "eval_tokens", "run_id", "run_start"} and the report's eval_loss / eval_tokens (the last evaluation's). */
static int train_eval_report(fsdp_ctx *ctx, train_backend *be, data_source *eval, int64_t batches, int n_micro,
                             int64_t micro_elems, int32_t *tokens, int32_t *labels, FILE *mf, int64_t step,
                             double *out_loss, fsdp_err *err) {
    double loss;
    int64_t n;
    int rc = train_eval_loss(be, eval, batches, n_micro, micro_elems, tokens, labels, &loss, &n, err);
    *out_loss = loss;
    if (rc) return fsdp_err_prefix(err, "train-steps: step %lld", (long long)step);
    fsdp_log(ctx, FSDP_LOG_INFO, "step %lld  eval_loss %.4f  (%lld tokens)", (long long)step, loss, (long long)n);
    fsdp_ctx_metric(ctx, "eval_loss", loss);
    fsdp_ctx_metric(ctx, "eval_tokens", (double)n);
    const char *id = fsdp_ctx_run_id(ctx), *start = fsdp_ctx_run_start(ctx);
    if (mf && (fprintf(mf, "{\"step\": %lld, \"eval_loss\": %.9g, \"eval_tokens\": %lld, \"run_id\": \"%s\", "
                           "\"run_start\": \"%s\"}\n",
                       (long long)step, loss, (long long)n, id ? id : "", start ? start : "") < 0 ||
               fflush(mf)))
        return fsdp_err_set(err, FSDP_E_IO, "train-steps: cannot write the metrics file");
    return 0;
}

/* " ac=full" / " ac=selective" for the run's log line; "" without checkpointing. */
static const char *train_ac_label(train_fsdp_ac ac) {
    return ac == TRAIN_FSDP_AC_FULL ? " ac=full" : ac == TRAIN_FSDP_AC_SELECTIVE ? " ac=selective" : "";
}

/* The GPU options of `with` (values checked by the schema). */
static int train_options(const fsdp_value *with, train_fsdp_cuda_options *o, fsdp_err *err) {
    memset(o, 0, sizeof *o);
    int rc = train_fsdp_mixed_from_name(fsdp_arg_str(with, "mixed", "none"), &o->mixed, err);
    if (!rc) rc = train_fsdp_ac_from_name(fsdp_arg_str(with, "ac", "none"), &o->ac, err);
    o->keep_gathered = !fsdp_arg_bool(with, "reshard_after_forward", 1);
    o->head_chunk_rows = (int)fsdp_arg_int(with, "head_chunk_rows", 0);
    o->per_param = !fsdp_arg_bool(with, "flat_collectives", 1);
    o->expert_parallel = (int)fsdp_arg_int(with, "expert_parallel", 1);
    return rc ? fsdp_err_prefix(err, "train-steps") : 0;
}

/* Before any step: no periodic save of this stage may land on an existing checkpoint unless
 * save_overwrite (rank 0 looks, every rank learns the verdict). */
static int check_save_targets(fsdp_ctx *ctx, const fsdp_state *s, const fsdp_value *with, int64_t steps, fsdp_err *err) {
    int64_t every = fsdp_arg_int(with, "save_every", 0);
    const char *base = fsdp_arg_str(with, "save_path", "");
    if (every <= 0 || fsdp_arg_bool(with, "save_overwrite", 0)) return 0;
    comm *c = stage_comm(ctx);
    int64_t found = -1;
    ckpt_step_dir *v = NULL;
    size_t n = 0;
    fsdp_err lerr;
    /* the step-<N> directories there (a listing error is the save's to report) */
    if (comm_rank(c) == 0 && !ckpt_steps_list(base, &v, &n, &lerr))
        for (size_t i = 0; i < n && found < 0; i++) {
            char dir[4200];
            ckpt_steps_dir(dir, sizeof dir, base, v[i].step);
            if (v[i].step > s->train_step && v[i].step <= steps && v[i].step % every == 0 && dcp_dir_has_checkpoint(dir))
                found = v[i].step;
        }
    free(v);
    int rc = comm_bcast(c, &found, sizeof found, 0, err);
    if (rc || found < 0) return rc;
    char dir[4200];
    ckpt_steps_dir(dir, sizeof dir, base, found);
    return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "save_every"),
                       "train-steps: the periodic save of step %lld would replace the checkpoint %s; resume from it "
                       "(load-ckpt path: %s/latest), choose another save_path, or set save_overwrite: true",
                       (long long)found, dir, base);
}

/* The run's async save (if any) is committed as soon as every rank has written its file. */
static int poll_saves(fsdp_ctx *ctx, fsdp_err *err) {
    int rc = ctx_poll_finishers(ctx, err);
    return rc ? fsdp_err_prefix(err, "train-steps: periodic save") : 0;
}

/* The run report's metrics of the stage: the last loss and norm, steps, tokens/s over the whole
 * stage (global), FLOPs per token, MFU and the peak memory. */
static void train_final_metrics(fsdp_ctx *ctx, const train_backend *be, train_fsdp_ac ac, double loss, double gnorm,
                                int64_t steps, double seconds, int64_t tokens_per_step, int world, double flops_tok,
                                double peak_tflops) {
    fsdp_ctx_metric_str(ctx, "ac", ac == TRAIN_FSDP_AC_FULL        ? "full"
                                   : ac == TRAIN_FSDP_AC_SELECTIVE ? "selective"
                                                                   : "none");
    fsdp_ctx_metric(ctx, "final_loss", loss);
    fsdp_ctx_metric(ctx, "final_grad_norm", gnorm);
    fsdp_ctx_metric(ctx, "steps", (double)steps);
    double tps_all = seconds > 0 ? (double)(steps * tokens_per_step) / seconds : 0;
    fsdp_ctx_metric(ctx, "tokens_per_s", tps_all);
    fsdp_ctx_metric(ctx, "flops_per_token", flops_tok);
    if (peak_tflops > 0) {
        fsdp_ctx_metric(ctx, "peak_tflops", peak_tflops);
        fsdp_ctx_metric(ctx, "mfu", train_mfu_percent(flops_tok, tps_all / world, peak_tflops));
    }
    const char *mem_name;
    double mem = train_backend_peak_mib(be, &mem_name);
    fsdp_ctx_metric(ctx, mem_name, mem);
}

/* What train_run carries between its steps: the stage's settings, the open data and backend, and
 * the progress of the step loop. */
typedef struct train_run_state {
    fsdp_ctx *ctx;
    const fsdp_value *with;
    fsdp_state *s;
    comm *c;
    int64_t steps, log_every, save_every, eval_every, eval_batches;
    train_fsdp_hparams hp;
    lrs_config sched;
    const char *metrics_path, *save_path;
    stage_save_policy save_pol;
    data_config dc;
    data_source *data, *eval;
    int64_t B, T;
    train_backend be;
    train_fsdp_cuda_options gopt;
    FILE *mf;
    int n_micro;
    unsigned char *no_decay;
    int32_t *tokens, *labels;
    double peak_tflops, flops_tok;
    /* the step loop */
    fsdp_progress *prog;
    double t0, t_last, loss, gnorm;
    train_fsdp_result res; /* the last step's (ce_loss, aux_loss, expert_load of a mixture of experts) */
    int64_t first, tok_since;
    train_calls calls;
    double step_tps; /* the last step's tokens/s (global) */
    int stop;        /* a callback asked to stop after this step */
    train_hooks hooks; /* the pre-update hooks' bridge (stages/train_hooks.h) */
    int64_t skipped; /* updates the pre-update hooks skipped */
} train_run_state;

/* The model must be a built-in arch with valid values; places the state on the run's device
 * (fills tr->s and tr->c). */
static int train_place_model(train_run_state *tr, fsdp_err *err) {
    fsdp_ctx *ctx = tr->ctx;
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "train-steps: no model in the context");
    if (!s->trainer_cfg)
        return fsdp_err_set(err, FSDP_E_INVALID, "train-steps: cannot train a %s (it trains the built-in archs: "
                            "model: {arch: llama3, ...})", s->model ? mt_kind(s->model) : "model without a Llama config");
    int vrc = mt_state_check_values(s, "train-steps", err);
    if (vrc) return vrc;
    tr->c = stage_comm(ctx);
    /* the state goes where the run's device is (runtime.device): the GPU step needs every
     * parameter on the device and the NCCL communicator (at every world size), the CPU step
     * host memory */
    int on_gpu = 0;
    int prc = stage_place_state(ctx, s, &on_gpu, err);
    if (!prc && on_gpu) prc = stage_device_nccl(ctx, err);
    if (prc) return fsdp_err_prefix(err, "train-steps");
    tr->s = s;
    train_calls_init(ctx, &tr->calls);
    return 0;
}

/* The stage's settings: steps, AdamW hyperparameters, LR schedule, logging and periodic saves. */
static int train_read_settings(train_run_state *tr, fsdp_err *err) {
    const fsdp_value *with = tr->with;
    tr->steps = fsdp_arg_int(with, "steps", 0);
    const fsdp_value *betas = fsdp_value_get(with, "betas");
    fsdp_value_float(fsdp_value_item(betas, 0), &tr->hp.beta1);
    fsdp_value_float(fsdp_value_item(betas, 1), &tr->hp.beta2);
    tr->hp.eps = fsdp_arg_float(with, "eps", 1e-8);
    tr->hp.weight_decay = fsdp_arg_float(with, "weight_decay", 0.1);
    tr->hp.max_norm = fsdp_arg_float(with, "max_grad_norm", 1.0);
    int rc = train_sched_from_with(with, &tr->sched, err);
    if (rc) return rc;
    tr->log_every = fsdp_arg_int(with, "log_every", 1);
    tr->metrics_path = fsdp_arg_str(with, "metrics", NULL);
    tr->save_every = fsdp_arg_int(with, "save_every", 0);
    tr->save_path = fsdp_arg_str(with, "save_path", "");
    stage_save_policy pol = {fsdp_arg_bool(with, "save_async", 0), fsdp_arg_bool(with, "save_overwrite", 0),
                             fsdp_arg_int(with, "keep_last", 0)};
    tr->save_pol = pol;
    return 0;
}

/* Opens the training data (the data section, seeded by runtime.seed) for this rank. */
static int train_open_data(train_run_state *tr, fsdp_err *err) {
    const fsdp_value *rt = fsdp_ctx_section(tr->ctx, "runtime");
    int rc = data_config_from_value(fsdp_ctx_section(tr->ctx, "data"), (uint64_t)fsdp_arg_int(rt, "seed", 0), &tr->dc,
                                    err);
    if (!rc) rc = data_config_model(&tr->dc, fsdp_ctx_section(tr->ctx, "model"), err);
    if (rc) return rc;
    return data_open(&tr->dc, decoder_state_config(tr->s)->vocab_size, comm_size(tr->c), comm_rank(tr->c), &tr->data, err);
}

/* freeze: the parameters it names and the declared buffers are not trained while this stage runs
 * (train_run_free thaws them). */
static int train_freeze(train_run_state *tr, fsdp_err *err) {
    unsigned char *m = NULL;
    int rc = train_glob_mask(tr->with, "freeze", tr->s, &m, err);
    if (rc) return rc;
    size_t n = 0;
    int64_t elems = 0, total = 0;
    for (size_t k = 0; k < tr->s->n; k++) {
        state_param *p = &tr->s->p[k];
        p->frozen = m && m[k];
        total += fsdp_numel(p->ndim, p->shape);
        if (!state_param_trained(p)) n++, elems += fsdp_numel(p->ndim, p->shape);
    }
    free(m);
    if (n)
        fsdp_log(tr->ctx, FSDP_LOG_INFO, "train-steps: %zu of %zu parameters not trained (freeze, trainable: false): "
                 "%lld of %lld elements", n, tr->s->n, (long long)elems, (long long)total);
    fsdp_ctx_metric(tr->ctx, "frozen_params", (double)n);
    return 0;
}

/* Batch buffers, micro-batches, the no-decay mask, evaluation data, the backend, the MFU inputs
 * and the metrics file (what train_run_free releases). */
static int train_setup(train_run_state *tr, fsdp_err *err) {
    const fsdp_value *with = tr->with;
    fsdp_state *s = tr->s;
    comm *c = tr->c;
    int64_t B = tr->B, T = tr->T;
    int rc;
    tr->tokens = malloc((size_t)(B * T) * sizeof *tr->tokens);
    tr->labels = malloc((size_t)(B * T) * sizeof *tr->labels);
    if (!tr->tokens || !tr->labels) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if ((rc = train_micro_count(with, "train-steps", B, &tr->n_micro, err)) ||
        (rc = train_glob_mask(with, "no_decay", s, &tr->no_decay, err)) || (rc = train_freeze(tr, err)))
        return rc;
    tr->hp.no_decay = tr->no_decay;
    train_hooks_attach(&tr->hooks, tr->ctx, s, &tr->hp);
    if (tr->eval_every > 0 && fsdp_value_get(with, "eval_data") &&
        (rc = train_eval_open(tr->ctx, fsdp_value_get(with, "eval_data"), decoder_state_config(s)->vocab_size, comm_size(c),
                              comm_rank(c), &tr->dc, &tr->eval, err)))
        return rc;
    if ((rc = train_options(with, &tr->gopt, err))) return rc;
    if ((rc = train_backend_open(tr->ctx, s, c, (int)(B / tr->n_micro), (int)T, &tr->gopt, &tr->be, err))) return rc;
    train_backend_reset_peak(&tr->be);
    /* MFU: model FLOPs per token against one device's peak (given, or the GPU default) */
    tr->peak_tflops = fsdp_arg_float(with, "peak_tflops", tr->be.on_gpu ? TRAIN_GPU_PEAK_TFLOPS : 0);
    tr->flops_tok = decoder_flops_per_token(decoder_state_config(s), T);
    /* its directory made now, not at validation (a refused run creates nothing); never blocks on a FIFO where the
     * metrics file should be */
    if (tr->metrics_path && comm_rank(c) == 0 && (rc = metrics_dir(tr->metrics_path, err))) return rc;
    if (tr->metrics_path && comm_rank(c) == 0 && (rc = fio_fopen_append(tr->metrics_path, NULL, &tr->mf, err))) {
        fsdp_err_prefix(err, "train-steps: metrics file");
        return rc;
    }
    return 0;
}

/* The log lines that open the training: the steps, batch, ranks, device and micro-batches. */
static void train_log_start(const train_run_state *tr) {
    fsdp_log(tr->ctx, FSDP_LOG_INFO, "training steps %lld..%lld: global batch %lld x %lld tokens, %d ranks, %s%s%s",
             (long long)tr->s->train_step + 1, (long long)tr->steps, (long long)tr->dc.batch_size, (long long)tr->T,
             comm_size(tr->c), tr->be.on_gpu ? "GPU" : "CPU",
             tr->be.on_gpu && tr->gopt.mixed == TRAIN_FSDP_MIXED_BF16 ? " bf16" : "", train_ac_label(tr->gopt.ac));
    if (tr->n_micro > 1)
        fsdp_log(tr->ctx, FSDP_LOG_INFO, "gradient accumulation: %d micro-batches of %lld rows per rank and step",
                 tr->n_micro, (long long)(tr->B / tr->n_micro));
}

/* The metrics fields of a mixture of experts into buf: ", "ce_loss": .., "aux_loss": .., "expert_load":
 * {"<layer>": [tokens per expert], ..}, "expert_load_min_max": {"<layer>": min / max, ..}" (the step's
 * tokens over every rank; a ratio of 1 is a perfectly balanced layer). */
static void train_moe_fields(const train_run_state *tr, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, ", \"ce_loss\": %.9g, \"aux_loss\": %.9g", tr->res.ce_loss,
                                 tr->res.aux_loss);
    const train_fsdp_result *r = &tr->res;
    for (int pass = 0; r->expert_load && pass < 2 && at < cap; pass++) {
        at += (size_t)snprintf(buf + at, cap - at, pass ? "}, \"expert_load_min_max\": {" : ", \"expert_load\": {");
        int n = 0;
        for (int b = 0; b < r->load_blocks && at < cap; b++) {
            const int64_t *row = r->expert_load + (size_t)b * (size_t)r->load_experts;
            if (row[0] < 0) continue;
            int64_t lo = row[0], hi = row[0];
            at += (size_t)snprintf(buf + at, cap - at, "%s\"%d\": ", n++ ? ", " : "", b);
            for (int e = 0; e < r->load_experts && at < cap; e++) {
                lo = row[e] < lo ? row[e] : lo;
                hi = row[e] > hi ? row[e] : hi;
                if (!pass) at += (size_t)snprintf(buf + at, cap - at, "%s%lld", e ? ", " : "[", (long long)row[e]);
            }
            if (at >= cap) break;
            at += pass ? (size_t)snprintf(buf + at, cap - at, "%.6g", hi > 0 ? (double)lo / (double)hi : 1.0)
                       : (size_t)snprintf(buf + at, cap - at, "]");
        }
    }
    if (r->expert_load && at < cap) snprintf(buf + at, cap - at, "}");
}

/* The step's log line and metrics-file record (tokens/s since the last one). */
static int train_log_step(train_run_state *tr, fsdp_err *err) {
    fsdp_state *s = tr->s;
    double now = stage_now();
    double tps = now > tr->t_last ? (double)tr->tok_since / (now - tr->t_last) : 0;
    train_metrics m = {s->train_step, s->tokens_seen, tr->loss, tr->gnorm, tr->hp.lr, tps, now - tr->t0, -1, NULL, 0,
                       NULL, NULL, NULL};
    if (tr->peak_tflops > 0) m.mfu = train_mfu_percent(tr->flops_tok, tps / comm_size(tr->c), tr->peak_tflops);
    m.mem_mib = train_backend_peak_mib(&tr->be, &m.mem_name);
    m.run_id = fsdp_ctx_run_id(tr->ctx);
    m.run_start = fsdp_ctx_run_start(tr->ctx);
    char moe[16384], extra[20480];
    moe[0] = '\0';
    if (tr->res.has_aux) train_moe_fields(tr, moe, sizeof moe);
    size_t off = (size_t)snprintf(extra, sizeof extra, "%s%s", moe, tr->res.skipped ? ", \"skipped\": true" : "");
    api_step_metrics_take(tr->ctx, extra + off, sizeof extra - off);
    m.moe = extra;
    if (tr->res.has_aux) {
        fsdp_log(tr->ctx, FSDP_LOG_INFO, "step %lld/%lld  loss %.4f (ce %.4f, aux %.4f)  grad_norm %.4f  lr %.3g  %.0f tok/s",
                 (long long)s->train_step, (long long)tr->steps, tr->loss, tr->res.ce_loss, tr->res.aux_loss,
                 tr->gnorm, tr->hp.lr, tps);
    } else {
        fsdp_log(tr->ctx, FSDP_LOG_INFO, "step %lld/%lld  loss %.4f  grad_norm %.4f  lr %.3g  %.0f tok/s",
                 (long long)s->train_step, (long long)tr->steps, tr->loss, tr->gnorm, tr->hp.lr, tps);
    }
    if (tr->mf && write_metrics(tr->mf, &m))
        return fsdp_err_set(err, FSDP_E_IO, "train-steps: cannot write metrics file %s", tr->metrics_path);
    tr->t_last = now;
    tr->tok_since = 0;
    return 0;
}

/* One optimizer step on the next batch, then the resume entries of the state advance. */
static int train_take_step(train_run_state *tr, fsdp_err *err) {
    fsdp_state *s = tr->s;
    int64_t step = s->train_step; /* 0-based index of this step */
    const double scale = s->lr_scale > 0 ? s->lr_scale : 1.0; /* fsdp_optim_set_lr */
    tr->hp.lr = lrs_at(&tr->sched, step) * scale;
    int rc;
    api_step_metrics_clear(tr->ctx); /* a step's metrics are its own */
    if ((rc = data_batch(tr->data, s->data_pos, tr->tokens, tr->labels, err))) return rc;
    train_fsdp_result r;
    double t0 = stage_now();
    train_calls_begin(&tr->calls);
    if ((rc = train_backend_step_accum(&tr->be, tr->tokens, tr->labels, tr->n_micro, &tr->hp, &r, err))) {
        fsdp_err_prefix(err, "train-steps: step %lld", (long long)step + 1);
        return rc;
    }
    train_calls_end(&tr->calls);
    if (r.skipped) {
        tr->skipped++;
        fsdp_log(tr->ctx, FSDP_LOG_WARN, "step %lld: update skipped by a pre-update hook (loss %.6g, grad_norm %.6g): "
                 "weights and optimizer state as they were", (long long)step + 1, r.loss, r.grad_norm);
    }
    s->train_step++;
    /* what PyTorch's param_groups / LambdaLR hold now (the checkpoints' resume entries) */
    s->lr_initial = tr->sched.lr;
    s->lr_next = lrs_at(&tr->sched, s->train_step) * scale;
    s->has_lr_schedule = 1;
    s->data_pos++;
    s->tokens_seen += tr->dc.batch_size * tr->T;
    tr->tok_since += tr->dc.batch_size * tr->T;
    tr->loss = r.loss;
    tr->gnorm = r.grad_norm;
    tr->res = r;
    double dt = stage_now() - t0;
    tr->step_tps = dt > 0 ? (double)(tr->dc.batch_size * tr->T) / dt : 0;
    return 0;
}

/* The plugins' callbacks (include/fsdp/callbacks.h) after the step and after its evaluation (evaled):
 * a save request saves now (unless the periodic save does at this step), a stop request ends the loop. */
static int train_callbacks(train_run_state *tr, int evaled, double eval_loss, fsdp_err *err) {
    if (!api_callbacks_count(tr->ctx)) return 0;
    fsdp_state *s = tr->s;
    fsdp_step_metrics m = {0, s->train_step, tr->loss, tr->gnorm, tr->hp.lr, tr->step_tps, NAN};
    unsigned req = 0, r = 0;
    int rc = api_callbacks_run(tr->ctx, &m, &req, err);
    if (!rc && evaled) {
        m.is_eval = 1;
        m.eval_loss = eval_loss;
        rc = api_callbacks_run(tr->ctx, &m, &r, err);
        req |= r;
    }
    if (rc) return fsdp_err_prefix(err, "train-steps");
    int periodic = tr->save_every > 0 && s->train_step % tr->save_every == 0;
    if ((req & FSDP_REQUEST_SAVE) && !periodic && !*tr->save_path) { /* nowhere to save: said, the run goes on */
        const char *who = api_callbacks_saver(tr->ctx);
        fsdp_log(tr->ctx, FSDP_LOG_WARN, "train-steps: step %lld: %s%s%s asked for a save, and this train-steps has no "
                 "save_path: nothing saved (set save_path to keep such saves)", (long long)s->train_step,
                 who ? "callback '" : "a callback (on another rank)", who ? who : "", who ? "'" : "");
    } else if ((req & FSDP_REQUEST_SAVE) && !periodic) {
        fsdp_log(tr->ctx, FSDP_LOG_INFO, "step %lld: a callback asked for a save", (long long)s->train_step);
        if ((rc = stage_save_dcp_step(tr->ctx, s, tr->save_path, &tr->save_pol, err))) return rc;
    }
    if (req & FSDP_REQUEST_STOP) {
        tr->stop = 1;
        fsdp_log(tr->ctx, FSDP_LOG_INFO, "step %lld: a callback asked to stop: train-steps ends here (of %lld steps)",
                 (long long)s->train_step, (long long)tr->steps);
        fsdp_ctx_metric(tr->ctx, "stopped_at_step", (double)s->train_step);
    }
    return 0;
}

/* One iteration of the loop: the step, its log line, evaluation, progress, periodic save. */
static int train_iteration(train_run_state *tr, fsdp_err *err) {
    fsdp_state *s = tr->s;
    int rc;
    if ((rc = train_take_step(tr, err))) return rc;
    double eval_loss = NAN;
    int evaled = tr->eval && tr->eval_every > 0 && (s->train_step % tr->eval_every == 0 || s->train_step == tr->steps);
    if (evaled && (rc = train_eval_report(tr->ctx, &tr->be, tr->eval, tr->eval_batches, tr->n_micro,
                                          (tr->B / tr->n_micro) * tr->T, tr->tokens, tr->labels, tr->mf, s->train_step,
                                          &eval_loss, err)))
        return rc;
    if ((rc = train_callbacks(tr, evaled, eval_loss, err))) return rc;
    /* the step's line after its callbacks (their fsdp_step_metric values are in it) */
    if ((s->train_step % tr->log_every == 0 || s->train_step == tr->steps) && (rc = train_log_step(tr, err))) return rc;
    char status[64];
    snprintf(status, sizeof status, "loss %.4f", tr->loss);
    fsdp_progress_update(tr->prog, (double)(s->train_step - tr->first), status);
    if (tr->save_every > 0 && s->train_step % tr->save_every == 0 &&
        (rc = stage_save_dcp_step(tr->ctx, s, tr->save_path, &tr->save_pol, err)))
        return rc;
    if ((rc = poll_saves(tr->ctx, err))) return rc;
    crash_point("train.step", (long)s->train_step, comm_rank(tr->c));
    return 0;
}

/* The step loop up to `steps`, then the stage's final metrics (also after a failed step). */
static int train_loop(train_run_state *tr, fsdp_err *err) {
    fsdp_state *s = tr->s;
    tr->prog = fsdp_progress_begin(tr->ctx, "train", (double)(tr->steps - s->train_step), "steps");
    tr->t0 = stage_now();
    tr->t_last = tr->t0;
    tr->first = s->train_step;
    int rc = 0;
    rc = train_hooks_event(tr->ctx, FSDP_HOOK_TRAIN_START, s->train_step, NULL, err);
    while (!rc && s->train_step < tr->steps && !tr->stop)
        if ((rc = train_iteration(tr, err))) break;
    if (!rc) rc = train_hooks_event(tr->ctx, FSDP_HOOK_TRAIN_END, s->train_step, NULL, err);
    if (tr->skipped) fsdp_ctx_metric(tr->ctx, "skipped_updates", (double)tr->skipped);
    fsdp_progress_end(tr->prog);
    train_final_metrics(tr->ctx, &tr->be, tr->gopt.ac, tr->loss, tr->gnorm, s->train_step - tr->first,
                        stage_now() - tr->t0, tr->dc.batch_size * tr->T, comm_size(tr->c), tr->flops_tok,
                        tr->peak_tflops);
    train_calls_report(tr->ctx, &tr->calls, tr->gopt.per_param);
    return rc;
}

/* Releases what train_setup and train_open_data opened. */
static void train_run_free(train_run_state *tr) {
    free(tr->no_decay);
    for (size_t k = 0; tr->s && k < tr->s->n; k++) tr->s->p[k].frozen = 0;
    data_close(tr->eval);
    if (tr->mf) fclose(tr->mf);
    train_backend_close(&tr->be);
    free(tr->tokens);
    free(tr->labels);
    data_close(tr->data);
}

static int train_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    train_run_state tr;
    memset(&tr, 0, sizeof tr);
    tr.ctx = ctx;
    tr.with = with;
    int rc = train_place_model(&tr, err);
    if (rc) return rc;
    if ((rc = train_read_settings(&tr, err))) return rc;
    if ((rc = check_save_targets(ctx, tr.s, with, tr.steps, err))) return rc;
    if (tr.s->train_step >= tr.steps) {
        fsdp_log(ctx, FSDP_LOG_INFO, "already at step %lld of %lld: nothing to train", (long long)tr.s->train_step,
                 (long long)tr.steps);
        return 0;
    }
    if ((rc = train_open_data(&tr, err))) return rc;
    tr.B = data_local_batch(tr.data);
    tr.T = tr.dc.seq_len;
    tr.n_micro = 1;
    tr.eval_every = fsdp_arg_int(with, "eval_every", 0);
    tr.eval_batches = fsdp_arg_int(with, "eval_batches", 1);
    if (!(rc = train_setup(&tr, err))) {
        train_log_start(&tr);
        rc = train_loop(&tr, err);
    }
    train_run_free(&tr);
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
