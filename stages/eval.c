/* Stage `eval`: the validation loss of the model in the context, once, on held-out data (for a
 * checkpoint: load-ckpt, then eval). The mean cross-entropy over every token of `eval_batches`
 * global batches (batches 0.. of the data, the same ones train-steps' eval_every uses), computed
 * by the training step's forward (and backward, the gradients discarded) on the CPU or GPU path
 * without any update; logged, and eval_loss / eval_tokens in the report.
 *
 * with: eval_data (a map with data:'s keys; those it leaves out are data:'s; default data: itself),
 *       eval_batches, micro_batch (rows per rank per forward, default the whole rank's batch),
 *       mixed (none|bf16, GPU) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_callbacks.h"
#include "train/data.h"
#include "stages/stages.h"
#include "model/mt_state.h"
#include "stages/train_backend.h"
#include "stages/train_opts.h"

static const char *const MIXED[] = {"none", "bf16", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"eval_data", FSDP_T_MAP, 0, NULL, NULL,
     "held-out data: a map with data:'s keys (kind, path, dtype, order, seed); the rest is data:'s (default: data:)"},
    {"eval_batches", FSDP_T_INT, 0, "1", NULL, "global batches to evaluate (batches 0.. of the data)"},
    {"micro_batch", FSDP_T_INT, 0, NULL, NULL, "rows per forward on each rank (default: the rank's whole batch)"},
    {"mixed", FSDP_T_STRING, 0, "none", MIXED, "GPU precision: none (float32) or bf16 (as train-steps)"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params", NULL};

static int eval_check(const fsdp_value *with, fsdp_err *err) {
    if (fsdp_arg_int(with, "eval_batches", 1) < 1)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "eval_batches"),
                           "eval: eval_batches is %lld, expected an integer >= 1",
                           (long long)fsdp_arg_int(with, "eval_batches", 1));
    if (fsdp_value_get(with, "micro_batch") && fsdp_arg_int(with, "micro_batch", 1) < 1)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "micro_batch"),
                           "eval: micro_batch is %lld, expected an integer >= 1",
                           (long long)fsdp_arg_int(with, "micro_batch", 1));
    const fsdp_value *ed = fsdp_value_get(with, "eval_data");
    data_config dc;
    /* without its own kind the keys are checked with data:'s when the stage runs */
    if (fsdp_value_get(ed, "kind") && data_config_from_value(ed, 0, &dc, err))
        return fsdp_err_prefix(err, "eval: eval_data");
    const fsdp_value *path = fsdp_value_get(ed, "path");
    if (path && fsdp_value_text(path)) {
        FILE *f = fopen(fsdp_value_text(path), "rb");
        if (!f)
            return fsdp_err_at(err, FSDP_E_IO, path, "eval: eval_data.path: cannot read %s", fsdp_value_text(path));
        fclose(f);
    }
    return 0;
}

static int eval_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s || !s->trainer_cfg)
        return fsdp_err_set(err, FSDP_E_INVALID, "eval: no model of a built-in arch in the context (init or load one "
                            "first)");
    int rc = mt_state_check_values(s, "eval", err);
    if (rc) return rc;
    comm *c = stage_comm(ctx);
    int on_gpu = 0;
    rc = stage_place_state(ctx, s, &on_gpu, err);
    if (!rc && on_gpu) rc = stage_device_nccl(ctx, err);
    if (rc) return fsdp_err_prefix(err, "eval");
    const fsdp_value *rt = fsdp_ctx_section(ctx, "runtime");
    data_config dc;
    rc = data_config_from_value(fsdp_ctx_section(ctx, "data"), (uint64_t)fsdp_arg_int(rt, "seed", 0), &dc, err);
    if (!rc) rc = data_config_model(&dc, fsdp_ctx_section(ctx, "model"), err);
    if (rc) return rc;
    const fsdp_value *ed = fsdp_value_get(with, "eval_data");
    data_source *data = NULL;
    rc = ed ? train_eval_open(ctx, ed, decoder_state_config(s)->vocab_size, comm_size(c), comm_rank(c), &dc, &data, err)
            : data_open(&dc, decoder_state_config(s)->vocab_size, comm_size(c), comm_rank(c), &data, err);
    if (rc) return fsdp_err_prefix(err, "eval");
    int64_t B = data_local_batch(data), T = dc.seq_len;
    int n_micro = 1;
    train_backend be;
    memset(&be, 0, sizeof be);
    train_fsdp_cuda_options o;
    memset(&o, 0, sizeof o);
    int32_t *tokens = malloc((size_t)(B * T) * sizeof *tokens), *labels = malloc((size_t)(B * T) * sizeof *labels);
    if (!tokens || !labels) rc = fsdp_err_set(err, FSDP_E_NOMEM, "eval: out of memory");
    if (!rc) rc = train_micro_count(with, "eval", B, &n_micro, err);
    if (!rc) rc = train_fsdp_mixed_from_name(fsdp_arg_str(with, "mixed", "none"), &o.mixed, err);
    if (!rc) rc = train_backend_open(ctx, s, c, (int)(B / n_micro), (int)T, &o, &be, err);
    double loss = 0;
    int64_t n = 0, batches = fsdp_arg_int(with, "eval_batches", 1);
    if (!rc) rc = train_eval_loss(&be, data, batches, n_micro, (B / n_micro) * T, tokens, labels, &loss, &n, err);
    if (!rc) {
        fsdp_log(ctx, FSDP_LOG_INFO, "eval at step %lld: eval_loss %.6f over %lld tokens (%lld batches)",
                 (long long)s->train_step, loss, (long long)n, (long long)batches);
        fsdp_ctx_metric(ctx, "eval_loss", loss);
        fsdp_ctx_metric(ctx, "eval_tokens", (double)n);
        fsdp_ctx_metric(ctx, "eval_step", (double)s->train_step);
    }
    if (!rc && api_callbacks_count(ctx)) {
        /* the plugins' callbacks (include/fsdp/callbacks.h) see the evaluation; there is no loop to stop */
        fsdp_step_metrics m = {1, s->train_step, NAN, NAN, s->lr, 0, loss};
        unsigned req = 0;
        rc = api_callbacks_run(ctx, &m, &req, err);
        if (!rc && req)
            fsdp_log(ctx, FSDP_LOG_INFO, "eval: a callback asked to %s; outside train-steps that is ignored",
                     req & FSDP_REQUEST_STOP ? "stop" : "save");
    }
    train_backend_close(&be);
    free(tokens);
    free(labels);
    data_close(data);
    return rc ? fsdp_err_prefix(err, "eval") : 0;
}

const fsdp_stage_desc stage_eval = {
    FSDP_STAGE_DESC_INIT,
    "eval",
    "validation loss of the current model on held-out data (no update)",
    PARAMS,
    NEEDS,
    NULL,
    eval_run,
    eval_check,
};
