/* Parameter init rules with torch.nn.init's definitions, drawn by the counter-based RNG
 * (runtime/rng.h), so the values are a pure function of (seed, parameter name, element index):
 * the same on every world size, every sharding and every device.
 *
 * Recipe syntax (init_rule_parse), Python-like calls with positional or keyword arguments:
 *   normal(mean=0, std=1)                    N(mean, std^2)
 *   trunc_normal(mean=0, std=1, a=-2, b=2)   N(mean, std^2) restricted to [a, b] (absolute bounds)
 *   uniform(a=0, b=1)                        U(a, b)
 *   zeros | ones | constant(value)
 *   kaiming_uniform(a=0, mode=fan_in, nonlinearity=leaky_relu)
 *                                            U(-bound, bound), bound = gain * sqrt(3 / fan)
 *   kaiming_normal(a=0, mode=fan_in, nonlinearity=leaky_relu)
 *                                            N(0, std^2), std = gain / sqrt(fan)
 *   xavier_uniform(gain=1)                   U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out))
 *   xavier_normal(gain=1)                    N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out))
 *   default_linear                           what nn.Linear does at construction: a weight (2-D or more)
 *                                            gets kaiming_uniform(a=sqrt(5)), i.e. U(+-1/sqrt(fan_in));
 *                                            a bias (1-D) gets U(+-1/sqrt(fan_in)) with the fan_in of its
 *                                            layer's weight (init_rule.fan_in, filled in by the table
 *                                            from the sibling `<module>.weight`)
 *   default_embedding                        what nn.Embedding does: N(0, 1)
 *   sincos_2d(grid=S, base=10000)            no draw: the fixed 2-D sine-cosine position table of MAE / DiT,
 *                                            numpy's get_2d_sincos_pos_embed(D, S) (MAE's util/pos_embed.py,
 *                                            which Bagel's PositionEmbedding uses) cast to float32, for a
 *                                            parameter of shape [S*S, D], D a positive multiple of 4 (see
 *                                            model/init_sincos.h); the same on every seed
 *   none                                     no rule: the parameter must be loaded or copied
 * Every rule that draws or sets values also takes the keyword padding_idx=N (N >= 0, a row of dim 0):
 * that row is zeros whatever the rule, as nn.Embedding(padding_idx=N) and transformers' _init_weights
 * leave it ("normal(0, 0.02, padding_idx=0)", "default_embedding(padding_idx=1)").
 * Fans are torch's (_calculate_fan_in_and_fan_out) of the FULL (unsharded) shape: fan_in =
 * shape[1] * receptive, fan_out = shape[0] * receptive, receptive = prod(shape[2:]); a rule that
 * needs them on a tensor of fewer than 2 dims is an error (as in torch), except default_linear's
 * bias. Gains are torch.nn.init.calculate_gain's: linear, conv*, sigmoid 1; tanh 5/3; relu sqrt(2);
 * leaky_relu sqrt(2 / (1 + a^2)); selu 3/4.
 *
 * Values are drawn in float32 by the transforms of runtime/rng_math.h (uniform: fma(u, b - a, a)
 * with u in (0, 1); normal: Box-Muller; truncated normal: torch's inverse-CDF algorithm): the
 * distributions are torch's, the random stream is our own. */
#ifndef FSDP_MODEL_INIT_RULE_H
#define FSDP_MODEL_INIT_RULE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "runtime/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum init_kind {
    INIT_NONE = 0, /* no rule: the value must come from a load or a copy */
    INIT_NORMAL,
    INIT_TRUNC_NORMAL,
    INIT_UNIFORM,
    INIT_ZEROS,
    INIT_ONES,
    INIT_CONSTANT,
    INIT_KAIMING_UNIFORM,
    INIT_KAIMING_NORMAL,
    INIT_XAVIER_UNIFORM,
    INIT_XAVIER_NORMAL,
    INIT_DEFAULT_LINEAR,
    INIT_DEFAULT_EMBEDDING,
    INIT_SINCOS_2D, /* a fixed table, not a distribution (init_rule_is_fixed) */
    INIT_KIND_COUNT
} init_kind;

typedef enum init_nonlinearity {
    INIT_NL_LEAKY_RELU = 0, /* kaiming's default */
    INIT_NL_LINEAR,
    INIT_NL_SIGMOID,
    INIT_NL_TANH,
    INIT_NL_RELU,
    INIT_NL_SELU,
    INIT_NL_COUNT
} init_nonlinearity;

typedef struct init_rule {
    init_kind kind;
    double mean, std;           /* normal, trunc_normal */
    double a, b;                /* trunc_normal bounds, uniform bounds; kaiming: a = negative slope */
    double value;               /* constant */
    double gain;                /* xavier */
    int fan_out_mode;           /* kaiming: 1 = mode fan_out */
    init_nonlinearity nonlin;   /* kaiming */
    int64_t fan_in;             /* default_linear on a 1-D bias: its weight's fan_in (0: not known) */
    int64_t grid;               /* sincos_2d: the side S of the S x S grid (0: not given) */
    double base;                /* sincos_2d: the base of the frequencies (10000) */
    int has_zero_row;           /* padding_idx given: row zero_row of dim 0 is zeros */
    int64_t zero_row;
} init_rule;

/* A rule with torch's default arguments for kind. */
void init_rule_default(init_kind kind, init_rule *out);
/* Parses the recipe syntax above ("trunc_normal(0, 0.02, a=-0.04, b=0.04)"); an error names the
 * text and what is wrong (unknown rule, argument, bad number). */
int init_rule_parse(const char *text, init_rule *out, fsdp_err *err);
/* The rule as text in the recipe syntax with every argument (parses back to the same rule). */
void init_rule_format(const init_rule *r, char *buf, size_t cap);
const char *init_kind_name(init_kind kind);
/* Whether the rule's values are a fixed table of the element index rather than a distribution
 * (sincos_2d): it has no rng_dist (init_rule_dist refuses it); init_fill.h's init_job_for_rule fills
 * both kinds. */
int init_rule_is_fixed(const init_rule *r);
/* Whether the rule needs the fans of the full shape (kaiming, xavier, default_linear). */
int init_rule_needs_fans(const init_rule *r);

/* torch's fans of a full shape: FSDP_E_INVALID (naming `what`) for fewer than 2 dims. */
int init_fans(int ndim, const int64_t *shape, int64_t *fan_in, int64_t *fan_out, const char *what, fsdp_err *err);

/* The distribution of rule r for a parameter of FULL shape (ndim, shape), `what` naming it in
 * errors. INIT_NONE is FSDP_E_INVALID ("has no init rule"), and so is a fixed table (sincos_2d). */
int init_rule_dist(const init_rule *r, int ndim, const int64_t *shape, const char *what, rng_dist *d, fsdp_err *err);

/* The elements [*z0, *z1) of the FULL parameter (flat row-major) that rule r leaves zero (its padding_idx
 * row) within the elements [e0, e1) (a rank's rows, say); an empty range (*z0 == *z1) without one or
 * outside them. FSDP_E_INVALID naming `what` when the row is not one of the shape's. */
int init_rule_zero_range(const init_rule *r, int ndim, const int64_t *shape, int64_t e0, int64_t e1, const char *what,
                         int64_t *z0, int64_t *z1, fsdp_err *err);

/* The RNG stream of a parameter: rng_fnv1a64(name) (the one Llama's init has always used). */
uint64_t init_stream(const char *name);

#ifdef __cplusplus
}
#endif
#endif
