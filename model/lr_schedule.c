/* Learning-rate schedule (see lr_schedule.h). */
#include "model/lr_schedule.h"

#include <math.h>
#include <string.h>

int lrs_validate(const lrs_config *c, fsdp_err *err) {
    if (!c) return fsdp_err_set(err, FSDP_E_INVALID, "lr schedule: no config");
    if (!isfinite(c->lr) || c->lr < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "lr must be finite and >= 0 (got %g)", c->lr);
    if (c->steps < 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "steps must be >= 1 (got %lld)",
                            (long long)c->steps);
    if (c->warmup_steps < 0 || c->warmup_steps > c->steps)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "warmup_steps must be in [0, steps = %lld] (got %lld)",
                            (long long)c->steps, (long long)c->warmup_steps);
    if (!(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1))
        return fsdp_err_set(err, FSDP_E_INVALID, "min_lr_ratio must be in [0, 1] (got %g)",
                            c->min_lr_ratio);
    if (c->decay != LRS_DECAY_NONE && c->decay != LRS_DECAY_LINEAR && c->decay != LRS_DECAY_COSINE)
        return fsdp_err_set(err, FSDP_E_INVALID, "lr decay: unknown kind %d", (int)c->decay);
    return FSDP_OK;
}

double lrs_at(const lrs_config *c, int64_t s) {
    if (s < 0) s = 0;
    const int64_t w = c->warmup_steps;
    if (s < w) return c->lr * (double)(s + 1) / (double)w;
    if (c->decay == LRS_DECAY_NONE) return c->lr;
    int64_t span = c->steps - w > 1 ? c->steps - w : 1;
    double p = (double)(s - w) / (double)span;
    if (p > 1.0) p = 1.0;
    const double r = c->min_lr_ratio;
    if (c->decay == LRS_DECAY_LINEAR) return c->lr * (1.0 - (1.0 - r) * p);
    const double pi = 3.14159265358979323846;
    return c->lr * (r + (1.0 - r) * 0.5 * (1.0 + cos(pi * p)));
}

static const char *const NAMES[] = {"none", "linear", "cosine"};

int lrs_decay_from_name(const char *name, lrs_decay *out) {
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, NAMES[i])) {
            *out = (lrs_decay)i;
            return 0;
        }
    return -1;
}

const char *lrs_decay_name(lrs_decay d) {
    return d >= LRS_DECAY_NONE && d <= LRS_DECAY_COSINE ? NAMES[d] : "?";
}
