/* Example plugin: `spike-guard` skips the optimizer update of a step whose loss spikes, as torchtitan and
 * Megatron skip a step on a spike, through the pre-update hook of stage ABI 1.2 (include/fsdp/callbacks.h):
 * a loss above `factor` x the mean of the last `window` losses of updated steps (once there are
 * `min_steps` of them), or a loss or gradient norm that is not finite, skips this step's update: weights,
 * moments and AdamW's step count stay bitwise as they were, the batch is consumed. Each step's metrics
 * line gets spike_guard.ratio (the loss over the window's mean) and, on a skip, spike_guard.skipped 1.
 * After `max_skips` skips in a row (0: never) the run fails, naming the step. It reads train-steps'
 * settings at train start (fsdp_ctx_stage_args) and logs each checkpoint saved (the after-save hook). Its
 * window and counts go into every checkpoint (fsdp_plugin_state_set, key spike_guard.state) and come
 * back at train start after a load-ckpt of one: a resumed run judges as the uninterrupted one would.
 *
 * Build:  cc -shared -fPIC -Iinclude examples/plugins/spike_guard.c -o libspike_guard.so -lm
 * Use:    plugins: [build/plugins/libspike_guard.so]
 *         stages:
 *           - {id: guard, uses: spike-guard, with: {factor: 2.0, window: 20}}
 *           - {id: train, uses: train-steps, after: [guard], with: {steps: 1000}} */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#include "fsdp/callbacks.h"
#include "fsdp/ckpt.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {
    {"factor", FSDP_T_FLOAT, 0, "2.0", NULL, "a loss above factor x the recent mean is a spike"},
    {"window", FSDP_T_INT, 0, "20", NULL, "the losses of the last N updated steps make the mean"},
    {"min_steps", FSDP_T_INT, 0, "5", NULL, "updated steps before the guard judges"},
    {"max_skips", FSDP_T_INT, 0, "0", NULL, "fail the run after this many skips in a row (0: never)"},
    {NULL, 0, 0, NULL, NULL, NULL}};

typedef struct guard {
    double factor;
    int64_t window, min_steps, max_skips;
    double *loss; /* ring of the window's losses */
    int64_t n, next, in_a_row, total;
} guard;

static void guard_free(void *p) {
    guard *g = p;
    if (g) free(g->loss);
    free(g);
}

static double mean(const guard *g) {
    int64_t k = g->n < g->window ? g->n : g->window;
    double s = 0;
    for (int64_t i = 0; i < k; i++) s += g->loss[i];
    return k ? s / (double)k : NAN;
}

#define STATE_KEY "spike_guard.state"

/* The guard's counters then its window of losses, as bytes of the checkpoints. */
static int save_state(fsdp_ctx *ctx, const guard *g, fsdp_err *err) {
    int64_t head[5] = {g->window, g->n, g->next, g->in_a_row, g->total};
    size_t n = sizeof head + (size_t)g->window * sizeof(double);
    unsigned char *b = malloc(n);
    if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "spike-guard: out of memory");
    memcpy(b, head, sizeof head);
    memcpy(b + sizeof head, g->loss, (size_t)g->window * sizeof(double));
    int rc = fsdp_plugin_state_set(ctx, STATE_KEY, b, n, err);
    free(b);
    return rc;
}

static void load_state(fsdp_ctx *ctx, guard *g) {
    const void *data;
    size_t n;
    fsdp_err e;
    int64_t head[5];
    if (fsdp_plugin_state_get(ctx, STATE_KEY, &data, &n, &e)) return; /* a fresh run */
    memcpy(head, data, n < sizeof head ? n : sizeof head);
    if (n != sizeof head + (size_t)g->window * sizeof(double) || head[0] != g->window) {
        fsdp_log(ctx, FSDP_LOG_WARN, "spike-guard: the checkpoint's window is not of %lld losses: starting afresh",
                 (long long)g->window);
        return;
    }
    g->n = head[1], g->next = head[2], g->in_a_row = head[3], g->total = head[4];
    memcpy(g->loss, (const unsigned char *)data + sizeof head, (size_t)g->window * sizeof(double));
    fsdp_log(ctx, FSDP_LOG_INFO, "spike-guard: resumed from the checkpoint (%lld losses seen, %lld updates skipped)",
             (long long)g->n, (long long)g->total);
}

static int pre_update(fsdp_ctx *ctx, const fsdp_step_metrics *m, fsdp_update *u, void *user, fsdp_err *err) {
    guard *g = user;
    double mu = mean(g), ratio = isfinite(mu) && mu > 0 ? m->loss / mu : NAN;
    int bad = !isfinite(m->loss) || !isfinite(m->grad_norm) || (g->n >= g->min_steps && ratio > g->factor);
    int rc = fsdp_step_metric(ctx, "spike_guard.ratio", ratio, err);
    if (rc) return rc;
    if (!bad) {
        g->loss[g->next] = m->loss;
        g->next = (g->next + 1) % g->window;
        g->n++;
        g->in_a_row = 0;
        return save_state(ctx, g, err);
    }
    u->skip = 1;
    g->in_a_row++;
    g->total++;
    if ((rc = save_state(ctx, g, err))) return rc;
    fsdp_log(ctx, FSDP_LOG_WARN, "spike-guard: step %lld: loss %.6g is %.3g x the mean of the last %lld (%.6g): update "
             "skipped (%lld in a row)", (long long)m->step, m->loss, ratio, (long long)(g->n < g->window ? g->n : g->window),
             mu, (long long)g->in_a_row);
    if (g->max_skips > 0 && g->in_a_row >= g->max_skips)
        return fsdp_err_set(err, FSDP_E_NUMERIC, "spike-guard: %lld updates skipped in a row (max_skips) at step %lld",
                            (long long)g->in_a_row, (long long)m->step);
    return fsdp_step_metric(ctx, "spike_guard.skipped", 1, err);
}

static int on_event(fsdp_ctx *ctx, const fsdp_hook_event *ev, void *user, fsdp_err *err) {
    (void)err;
    guard *g = user;
    if (ev->kind == FSDP_HOOK_TRAIN_START) {
        load_state(ctx, g);
        const fsdp_value *t = fsdp_ctx_stage_args(ctx);
        fsdp_log(ctx, FSDP_LOG_INFO, "spike-guard: watching train-steps to step %lld (save_path %s)",
                 (long long)fsdp_arg_int(t, "steps", 0), fsdp_arg_str(t, "save_path", "none"));
    } else if (ev->kind == FSDP_HOOK_AFTER_SAVE) {
        fsdp_log(ctx, FSDP_LOG_INFO, "spike-guard: %s saved at step %lld, %lld updates skipped so far", ev->path,
                 (long long)ev->step, (long long)g->total);
    }
    return 0;
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    guard *g = calloc(1, sizeof *g);
    if (!g) return fsdp_err_set(err, FSDP_E_NOMEM, "spike-guard: out of memory");
    g->factor = fsdp_arg_float(with, "factor", 2.0);
    g->window = fsdp_arg_int(with, "window", 20);
    g->min_steps = fsdp_arg_int(with, "min_steps", 5);
    g->max_skips = fsdp_arg_int(with, "max_skips", 0);
    int rc = 0;
    if (g->window < 1 || g->min_steps < 1 || g->max_skips < 0 || !(g->factor > 0))
        rc = fsdp_err_set(err, FSDP_E_INVALID, "spike-guard: window and min_steps >= 1, max_skips >= 0, factor > 0");
    if (!rc && !(g->loss = calloc((size_t)g->window, sizeof *g->loss)))
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "spike-guard: out of memory");
    if (rc) {
        guard_free(g);
        return rc;
    }
    /* the guard is freed with its pre-update hook; the event hooks only borrow it */
    if ((rc = fsdp_pre_update_add(ctx, "spike-guard", pre_update, g, guard_free, err))) return rc;
    if ((rc = fsdp_hook_add(ctx, "spike-guard", FSDP_HOOK_TRAIN_START, on_event, g, NULL, err))) return rc;
    return fsdp_hook_add(ctx, "spike-guard", FSDP_HOOK_AFTER_SAVE, on_event, g, NULL, err);
}

static const fsdp_stage_desc STAGE = {FSDP_STAGE_DESC_INIT, "spike-guard", "skip the update of a step whose loss spikes",
                                      PARAMS, NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &STAGE, err); }
