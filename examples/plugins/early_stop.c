/* Example plugin: `early-stop` ends train-steps when the evaluation loss has not improved for
 * `patience` evaluations, through the plugin API's callbacks (include/fsdp/callbacks.h). Put the
 * stage before train-steps (which evaluates every eval_every steps); the stop comes at the same step
 * on every rank, train-steps ends successfully, and the recipe's next stages (a save-dcp) run.
 *
 * Build:  cc -shared -fPIC -Iinclude examples/plugins/early_stop.c -o libearly_stop.so
 * Use:    plugins: [build/plugins/libearly_stop.so]
 *         stages:
 *           - {id: stop, uses: early-stop, with: {patience: 3, min_delta: 0.001}}
 *           - {id: train, uses: train-steps, after: [stop], with: {steps: 1000, eval_every: 50, eval_data: ...}} */
#include <math.h>
#include <stdlib.h>

#include "fsdp/callbacks.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {
    {"patience", FSDP_T_INT, 1, NULL, NULL, "evaluations without improvement before stopping"},
    {"min_delta", FSDP_T_FLOAT, 0, "0", NULL, "an improvement is a loss lower than the best by more than this"},
    {NULL, 0, 0, NULL, NULL, NULL}};

typedef struct watch {
    int64_t patience, bad;
    double min_delta, best;
} watch;

static int on_step(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user, fsdp_err *err) {
    (void)err;
    watch *w = user;
    if (!m->is_eval) return 0;
    if (m->eval_loss < w->best - w->min_delta) {
        w->best = m->eval_loss;
        w->bad = 0;
        return 0;
    }
    w->bad++;
    fsdp_log(ctx, FSDP_LOG_INFO, "early-stop: eval_loss %.6f at step %lld, best %.6f (%lld of %lld without improvement)",
             m->eval_loss, (long long)m->step, w->best, (long long)w->bad, (long long)w->patience);
    if (w->bad >= w->patience) *request |= FSDP_REQUEST_STOP;
    return 0;
}

static int check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *p = fsdp_value_get(with, "patience");
    int64_t n = 0;
    if (p && (fsdp_value_int(p, &n) || n < 1)) return fsdp_err_at(err, FSDP_E_INVALID, p, "early-stop: patience must be >= 1");
    return 0;
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    watch *w = malloc(sizeof *w);
    if (!w) return fsdp_err_set(err, FSDP_E_NOMEM, "early-stop: out of memory");
    w->patience = fsdp_arg_int(with, "patience", 1);
    w->min_delta = fsdp_arg_float(with, "min_delta", 0);
    w->best = INFINITY;
    w->bad = 0;
    return fsdp_callback_add(ctx, "early-stop", on_step, w, free, err);
}

static const fsdp_stage_desc STAGE = {FSDP_STAGE_DESC_INIT, "early-stop",
                                      "stop train-steps when the eval loss has not improved for `patience` evals",
                                      PARAMS, NULL, NULL, run, check};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &STAGE, err); }
