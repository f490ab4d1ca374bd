/* Learning-rate schedule: linear warmup, then none / linear / cosine decay, or WSD.
 *
 * For a 0-based step s, with W = warmup_steps, S = steps, r = min_lr_ratio:
 *   s < W:                 lr * (s + 1) / W
 *   s >= W, p = clamp((s - W) / max(1, S - W), 0, 1):
 *     none:                lr
 *     linear:              lr * (1 - (1 - r) * p)
 *     cosine:              lr * (r + (1 - r) * 0.5 * (1 + cos(pi * p)))
 * (max(1, S - W) as in the fixtures' generator: with S == W there is no decay phase and no
 * division by zero.) The arithmetic is done in that order in double, so that lr 1e-3, W 2,
 * linear, r 0.1, S 5 gives exactly the fixture's 5e-4, 1e-3, 1e-3, 7e-4, 4e-4.
 *
 * wsd (warmup-stable-decay, MiniCPM / OLMo; torchtitan's lr_scheduler with the same keys and the
 * same per-step values): D = round_half_even(S * decay_ratio) decay steps (decay_ratio < 0: none
 * given, D = S - W), stable steps S - W - D, f = min_lr_factor:
 *   s >= S:                s = S (the value after the schedule's end)
 *   s < W:                 lr * (s + 1) / (W + 1)
 *   s < S - D or D == 0:   lr
 *   else, p = (s + 1 - (S - D)) / (D + 1):
 *     linear: a = 1 - p;  sqrt: a = 1 - sqrt(p);  cosine: a = 0.5 * (1 + cos(pi * p))
 *     lr * (f + (1 - f) * a) */
#ifndef FSDP_TRAIN_LR_SCHEDULE_H
#define FSDP_TRAIN_LR_SCHEDULE_H

#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lrs_decay { LRS_DECAY_NONE = 0, LRS_DECAY_LINEAR, LRS_DECAY_COSINE, LRS_DECAY_WSD } lrs_decay;
/* The shape of wsd's decay phase (torchtitan's decay_type). */
typedef enum lrs_wsd_type { LRS_WSD_LINEAR = 0, LRS_WSD_SQRT, LRS_WSD_COSINE } lrs_wsd_type;

typedef struct lrs_config {
    double lr;            /* peak learning rate, finite, >= 0 */
    int64_t warmup_steps; /* >= 0, <= steps */
    int64_t steps;        /* total optimizer steps, >= 1 */
    lrs_decay decay;
    double min_lr_ratio;  /* in [0, 1]: the final lr is lr * min_lr_ratio (none / linear / cosine) */
    /* wsd only */
    double decay_ratio;   /* in [0, 1], or < 0 for "not given" (decay from the end of warmup) */
    lrs_wsd_type decay_type;
    double min_lr_factor; /* in [0, 1] */
} lrs_config;

/* Checks the fields; errors name the offending key (lr, warmup_steps, steps, min_lr_ratio, decay_ratio,
 * min_lr_factor; wsd: warmup_steps + decay steps <= steps). */
int lrs_validate(const lrs_config *c, fsdp_err *err);

/* The learning rate of 0-based step s of a validated config (s < 0 is treated as 0, s >= steps
 * keeps the final value). */
double lrs_at(const lrs_config *c, int64_t step);

/* wsd: the number of decay steps D (see above); 0 for the other kinds. */
int64_t lrs_wsd_decay_steps(const lrs_config *c);

/* "none", "linear", "cosine", "wsd" <-> lrs_decay; from_name returns -1 for an unknown name. */
int lrs_decay_from_name(const char *name, lrs_decay *out);
const char *lrs_decay_name(lrs_decay d);
/* "linear", "sqrt", "cosine" <-> lrs_wsd_type; -1 for an unknown name. */
int lrs_wsd_type_from_name(const char *name, lrs_wsd_type *out);

#ifdef __cplusplus
}
#endif
#endif
