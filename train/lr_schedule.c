/* Learning-rate schedule (see lr_schedule.h). */
#include "train/lr_schedule.h"

#include <math.h>
#include <string.h>

int64_t lrs_wsd_decay_steps(const lrs_config *c) {
    if (c->decay != LRS_DECAY_WSD) return 0;
    if (c->decay_ratio < 0) return c->steps - c->warmup_steps;
    /* Python's round(): half to even, which nearbyint does in the default rounding mode */
    return (int64_t)nearbyint((double)c->steps * c->decay_ratio);
}

static int check_wsd(const lrs_config *c, fsdp_err *err) {
    if (c->decay_ratio >= 0 && !(c->decay_ratio <= 1))
        return fsdp_err_set(err, FSDP_E_INVALID, "decay_ratio must be in [0, 1] (got %g)", c->decay_ratio);
    if (!(c->min_lr_factor >= 0 && c->min_lr_factor <= 1))
        return fsdp_err_set(err, FSDP_E_INVALID, "min_lr_factor must be in [0, 1] (got %g)", c->min_lr_factor);
    if (c->decay_type != LRS_WSD_LINEAR && c->decay_type != LRS_WSD_SQRT && c->decay_type != LRS_WSD_COSINE)
        return fsdp_err_set(err, FSDP_E_INVALID, "decay_type: unknown kind %d", (int)c->decay_type);
    int64_t d = lrs_wsd_decay_steps(c);
    if (c->warmup_steps + d > c->steps)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decay_ratio: warmup_steps %lld + %lld decay steps (round(%lld x %g)) is more than the "
                            "schedule's %lld steps (no room for the stable phase)",
                            (long long)c->warmup_steps, (long long)d, (long long)c->steps, c->decay_ratio,
                            (long long)c->steps);
    return FSDP_OK;
}

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
    if (c->decay == LRS_DECAY_WSD) return check_wsd(c, err);
    if (!(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1))
        return fsdp_err_set(err, FSDP_E_INVALID, "min_lr_ratio must be in [0, 1] (got %g)",
                            c->min_lr_ratio);
    if (c->decay != LRS_DECAY_NONE && c->decay != LRS_DECAY_LINEAR && c->decay != LRS_DECAY_COSINE)
        return fsdp_err_set(err, FSDP_E_INVALID, "lr decay: unknown kind %d", (int)c->decay);
    return FSDP_OK;
}

static const double PI = 3.14159265358979323846;

static double wsd_at(const lrs_config *c, int64_t s) {
    const int64_t w = c->warmup_steps, d = lrs_wsd_decay_steps(c), ws = c->steps - d;
    if (s > c->steps) s = c->steps;
    if (s < w) return c->lr * ((double)(s + 1) / (double)(w + 1));
    if (s < ws || d == 0) return c->lr;
    double p = (double)(s + 1 - ws) / (double)(d + 1);
    double a = c->decay_type == LRS_WSD_LINEAR ? 1.0 - p
               : c->decay_type == LRS_WSD_SQRT ? 1.0 - sqrt(p)
                                               : 0.5 * (1.0 + cos(PI * p));
    const double f = c->min_lr_factor;
    return c->lr * (f + (1.0 - f) * a);
}

double lrs_at(const lrs_config *c, int64_t s) {
    if (s < 0) s = 0;
    if (c->decay == LRS_DECAY_WSD) return wsd_at(c, s);
    const int64_t w = c->warmup_steps;
    if (s < w) return c->lr * (double)(s + 1) / (double)w;
    if (c->decay == LRS_DECAY_NONE) return c->lr;
    int64_t span = c->steps - w > 1 ? c->steps - w : 1;
    double p = (double)(s - w) / (double)span;
    if (p > 1.0) p = 1.0;
    const double r = c->min_lr_ratio;
    if (c->decay == LRS_DECAY_LINEAR) return c->lr * (1.0 - (1.0 - r) * p);
    return c->lr * (r + (1.0 - r) * 0.5 * (1.0 + cos(PI * p)));
}

static const char *const NAMES[] = {"none", "linear", "cosine", "wsd"};
static const char *const WSD_TYPES[] = {"linear", "sqrt", "cosine"};

int lrs_decay_from_name(const char *name, lrs_decay *out) {
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, NAMES[i])) {
            *out = (lrs_decay)i;
            return 0;
        }
    return -1;
}

const char *lrs_decay_name(lrs_decay d) {
    return d >= LRS_DECAY_NONE && d <= LRS_DECAY_WSD ? NAMES[d] : "?";
}

int lrs_wsd_type_from_name(const char *name, lrs_wsd_type *out) {
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, WSD_TYPES[i])) {
            *out = (lrs_wsd_type)i;
            return 0;
        }
    return -1;
}
