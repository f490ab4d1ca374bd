/* Single-process training step on the CPU kernels (decoder/decoder_single.h). */
#include "decoder/decoder_single.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int decoder_single_init(decoder_single_state *st, const decoder_config *cfg, int B_max, int T_max, fsdp_err *err) {
    memset(st, 0, sizeof *st);
    int rc = decoder_model_check(cfg, err);
    if (rc) return rc;
    st->cfg = *cfg;
    st->numel = decoder_model_numel(cfg);
    if (st->numel <= 0 || (uint64_t)st->numel > SIZE_MAX / sizeof(float))
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder train: %lld parameters do not fit in memory",
                            (long long)st->numel);
    size_t bytes = (size_t)st->numel * sizeof(float);
    float **bufs[4] = {&st->params, &st->grads, &st->exp_avg, &st->exp_avg_sq};
    decoder_model_weights *views[4] = {&st->w, &st->g, &st->m, &st->v};
    for (int i = 0; i < 4; i++) {
        *bufs[i] = calloc(1, bytes);
        if (!*bufs[i]) {
            decoder_single_free(st);
            return fsdp_err_set(err, FSDP_E_NOMEM, "decoder train: cannot allocate %zu bytes for %lld parameters", bytes,
                                (long long)st->numel);
        }
        rc = decoder_model_weights_bind(cfg, *bufs[i], views[i], err);
        if (rc) {
            decoder_single_free(st);
            return rc;
        }
    }
    st->ws = decoder_model_ws_create(cfg, B_max, T_max, err);
    if (!st->ws) {
        decoder_single_free(st);
        return err ? err->code : FSDP_E_RUNTIME;
    }
    return FSDP_OK;
}

void decoder_single_free(decoder_single_state *st) {
    if (!st) return;
    decoder_model_weights_unbind(&st->w);
    decoder_model_weights_unbind(&st->g);
    decoder_model_weights_unbind(&st->m);
    decoder_model_weights_unbind(&st->v);
    free(st->params);
    free(st->grads);
    free(st->exp_avg);
    free(st->exp_avg_sq);
    decoder_model_ws_free(st->ws);
    memset(st, 0, sizeof *st);
}

void decoder_single_set_stats(decoder_single_state *st, kc_stats *stats) {
    st->stats = stats;
    decoder_model_ws_set_stats(st->ws, stats);
}

int decoder_single_step(decoder_single_state *st, const int32_t *tokens, const int32_t *labels, int B, int T, double lr,
                     const decoder_single_hparams *hp, decoder_single_result *res, fsdp_err *err) {
    if (!st || !st->params || !st->ws)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder train: state not initialised");
    if (!labels) return fsdp_err_set(err, FSDP_E_INVALID, "decoder train: a training step needs labels");
    if (!hp) return fsdp_err_set(err, FSDP_E_INVALID, "decoder train: no hyper-parameters");
    if (!(lr >= 0.0) || !isfinite(lr) || !(hp->beta1 >= 0.0 && hp->beta1 < 1.0) ||
        !(hp->beta2 >= 0.0 && hp->beta2 < 1.0) || !(hp->eps >= 0.0) || !(hp->weight_decay >= 0.0))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder train: invalid hyper-parameters (lr %g, betas %g/%g, eps %g, weight_decay %g)", lr,
                            hp->beta1, hp->beta2, hp->eps, hp->weight_decay);
    const int64_t step = st->step + 1;
    memset(st->grads, 0, (size_t)st->numel * sizeof(float));
    decoder_model_loss loss;
    int rc = decoder_model_forward_backward(&st->cfg, &st->w, &st->g, tokens, labels, B, T, 0.0, st->ws, &loss, err);
    if (rc) return fsdp_err_prefix(err, "decoder train step %lld", (long long)step);
    double norm = sqrt(kc_sumsq(st->grads, st->numel));
    if (!isfinite(loss.loss) || !isfinite(norm))
        return fsdp_err_set(err, FSDP_E_NUMERIC, "decoder train step %lld: non-finite loss %g or gradient norm %g",
                            (long long)step, loss.loss, norm);
    double coef = 1.0;
    if (hp->max_norm > 0.0) {
        coef = kc_clip_coef(norm, hp->max_norm);
        if (coef < 1.0) kc_scale(st->grads, st->numel, (float)coef);
    }
    kc_adamw_hparams ah = {lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay};
    kc_adamw_step(st->params, st->grads, st->exp_avg, st->exp_avg_sq, st->numel, &ah, step);
    st->step = step;
    if (res) {
        res->loss = loss.loss;
        res->n_valid = loss.n_valid;
        res->grad_norm = norm;
        res->clip_coef = coef;
    }
    return FSDP_OK;
}
