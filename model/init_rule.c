/* Init rules with torch.nn.init's definitions (see init_rule.h). */
#include "model/init_rule.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[INIT_KIND_COUNT] = {
    "none",           "normal",         "trunc_normal",  "uniform",       "zeros",
    "ones",           "constant",       "kaiming_uniform", "kaiming_normal", "xavier_uniform",
    "xavier_normal",  "default_linear", "default_embedding", "sincos_2d"};
static const char *const NL_NAMES[INIT_NL_COUNT] = {"leaky_relu", "linear", "sigmoid", "tanh", "relu", "selu"};

/* The arguments of each rule, in positional order (NULL-terminated). */
static const char *const ARGS_NORMAL[] = {"mean", "std", NULL};
static const char *const ARGS_TRUNC[] = {"mean", "std", "a", "b", NULL};
static const char *const ARGS_UNIFORM[] = {"a", "b", NULL};
static const char *const ARGS_CONSTANT[] = {"value", NULL};
static const char *const ARGS_KAIMING[] = {"a", "mode", "nonlinearity", NULL};
static const char *const ARGS_XAVIER[] = {"gain", NULL};
static const char *const ARGS_SINCOS[] = {"grid", "base", NULL};
static const char *const ARGS_NONE[] = {NULL};

static const char *const *args_of(init_kind k) {
    switch (k) {
    case INIT_NORMAL: return ARGS_NORMAL;
    case INIT_TRUNC_NORMAL: return ARGS_TRUNC;
    case INIT_UNIFORM: return ARGS_UNIFORM;
    case INIT_CONSTANT: return ARGS_CONSTANT;
    case INIT_KAIMING_UNIFORM:
    case INIT_KAIMING_NORMAL: return ARGS_KAIMING;
    case INIT_XAVIER_UNIFORM:
    case INIT_XAVIER_NORMAL: return ARGS_XAVIER;
    case INIT_SINCOS_2D: return ARGS_SINCOS;
    default: return ARGS_NONE;
    }
}

const char *init_kind_name(init_kind kind) {
    return kind >= 0 && kind < INIT_KIND_COUNT ? KIND_NAMES[kind] : "?";
}

void init_rule_default(init_kind kind, init_rule *out) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->std = 1.0;
    out->gain = 1.0;
    out->nonlin = INIT_NL_LEAKY_RELU;
    switch (kind) {
    case INIT_TRUNC_NORMAL: out->a = -2.0, out->b = 2.0; break;
    case INIT_UNIFORM: out->a = 0.0, out->b = 1.0; break;
    case INIT_SINCOS_2D: out->base = 10000.0; break;
    default: break;
    }
}

int init_rule_is_fixed(const init_rule *r) { return r->kind == INIT_SINCOS_2D; }

int init_rule_needs_fans(const init_rule *r) {
    return r->kind == INIT_KAIMING_UNIFORM || r->kind == INIT_KAIMING_NORMAL || r->kind == INIT_XAVIER_UNIFORM ||
           r->kind == INIT_XAVIER_NORMAL || r->kind == INIT_DEFAULT_LINEAR;
}

/* ---- parsing --------------------------------------------------------------------------- */

typedef struct parser {
    const char *text, *p;
    fsdp_err *err;
} parser;

static int perr(parser *ps, const char *what) {
    return fsdp_err_set(ps->err, FSDP_E_INVALID, "init rule '%s': %s (at character %d)", ps->text, what,
                        (int)(ps->p - ps->text) + 1);
}

static void skip_ws(parser *ps) {
    while (isspace((unsigned char)*ps->p)) ps->p++;
}

/* An identifier into buf; 0 if none. */
static size_t ident(parser *ps, char *buf, size_t cap) {
    size_t n = 0;
    skip_ws(ps);
    while ((isalnum((unsigned char)*ps->p) || *ps->p == '_') && n + 1 < cap) buf[n++] = *ps->p++;
    buf[n] = '\0';
    return n;
}

/* A number, or sqrt(N) (Python's math.sqrt(5) is how nn.Linear writes its slope). */
static int number(parser *ps, double *out) {
    skip_ws(ps);
    if (!strncmp(ps->p, "sqrt(", 5) || !strncmp(ps->p, "math.sqrt(", 10)) {
        ps->p = strchr(ps->p, '(') + 1;
        double v;
        if (number(ps, &v)) return ps->err->code;
        skip_ws(ps);
        if (*ps->p != ')') return perr(ps, "expected ')' after the argument of sqrt");
        ps->p++;
        if (!(v >= 0)) return perr(ps, "sqrt of a negative number");
        *out = sqrt(v);
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(ps->p, &end);
    if (end == ps->p || errno == ERANGE || !isfinite(v)) return perr(ps, "expected a finite number");
    ps->p = end;
    *out = v;
    return 0;
}

static int set_arg(parser *ps, init_rule *r, const char *name) {
    char word[32];
    if (!strcmp(name, "mode") || !strcmp(name, "nonlinearity")) {
        skip_ws(ps);
        int quoted = *ps->p == '\'' || *ps->p == '"';
        char q = *ps->p;
        if (quoted) ps->p++;
        if (!ident(ps, word, sizeof word)) return perr(ps, "expected a name");
        if (quoted) {
            if (*ps->p != q) return perr(ps, "unterminated quote");
            ps->p++;
        }
        if (!strcmp(name, "mode")) {
            if (strcmp(word, "fan_in") && strcmp(word, "fan_out")) return perr(ps, "mode must be fan_in or fan_out");
            r->fan_out_mode = !strcmp(word, "fan_out");
            return 0;
        }
        for (int i = 0; i < INIT_NL_COUNT; i++)
            if (!strcmp(word, NL_NAMES[i])) {
                r->nonlin = (init_nonlinearity)i;
                return 0;
            }
        if (!strncmp(word, "conv", 4)) {
            r->nonlin = INIT_NL_LINEAR; /* conv1d .. conv_transpose3d: gain 1 */
            return 0;
        }
        return perr(ps, "nonlinearity must be one of leaky_relu, linear, conv*, sigmoid, tanh, relu, selu");
    }
    double v;
    if (number(ps, &v)) return ps->err->code;
    if (!strcmp(name, "mean")) r->mean = v;
    else if (!strcmp(name, "std")) r->std = v;
    else if (!strcmp(name, "a")) r->a = v;
    else if (!strcmp(name, "b")) r->b = v;
    else if (!strcmp(name, "value")) r->value = v;
    else if (!strcmp(name, "gain")) r->gain = v;
    else if (!strcmp(name, "base")) r->base = v;
    else if (!strcmp(name, "grid")) {
        /* the side of the grid: a whole number (S*S rows must fit an int64 with room for D) */
        if (!(v >= 1 && v <= 2147483647.0 && v == floor(v)))
            return perr(ps, "grid must be a whole number >= 1 (the side S of the S x S grid)");
        r->grid = (int64_t)v;
    }
    return 0;
}

static int arg_index(const char *const *names, const char *name) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return i;
    return -1;
}

/* padding_idx=N: a whole number >= 0 (a row of dim 0) */
static int set_padding_idx(parser *ps, init_rule *r) {
    double v;
    if (number(ps, &v)) return ps->err->code;
    if (!(v >= 0 && v <= 9.0e15 && v == floor(v))) return perr(ps, "padding_idx must be a whole number >= 0 (a row)");
    if (r->has_zero_row) return perr(ps, "an argument given twice");
    r->has_zero_row = 1;
    r->zero_row = (int64_t)v;
    return 0;
}

/* Whether the text at p is `padding_idx` followed by '='. */
static int at_padding_idx(const char *p) {
    while (isspace((unsigned char)*p)) p++;
    if (strncmp(p, "padding_idx", 11)) return 0;
    p += 11;
    while (isspace((unsigned char)*p)) p++;
    return *p == '=';
}

/* (arg, ..., name=arg, ...) after the rule's name */
static int parse_args(parser *ps, init_rule *r) {
    const char *const *names = args_of(r->kind);
    int given[8] = {0}, pos = 0, kw = 0;
    ps->p++; /* '(' */
    skip_ws(ps);
    if (*ps->p == ')') {
        ps->p++;
        return 0;
    }
    for (;;) {
        const char *save = ps->p;
        char name[32];
        int idx = -1, pad = 0;
        if (ident(ps, name, sizeof name) && (skip_ws(ps), *ps->p == '=')) {
            ps->p++;
            pad = !strcmp(name, "padding_idx") && r->kind != INIT_NONE && r->kind != INIT_SINCOS_2D;
            if (!pad && (idx = arg_index(names, name)) < 0) {
                char m[160];
                snprintf(m, sizeof m, "%s takes no argument '%s'", KIND_NAMES[r->kind], name);
                return perr(ps, m);
            }
            kw = 1;
        } else {
            ps->p = save;
            if (kw) return perr(ps, "a positional argument after a keyword argument");
            if (!names[pos]) return perr(ps, "too many arguments");
            idx = pos++;
        }
        if (!pad && given[idx]) return perr(ps, "an argument given twice");
        if (!pad) given[idx] = 1;
        int rc = pad ? set_padding_idx(ps, r) : set_arg(ps, r, names[idx]);
        if (rc) return rc;
        skip_ws(ps);
        if (*ps->p == ')') {
            ps->p++;
            return 0;
        }
        if (*ps->p != ',') return perr(ps, "expected ',' or ')'");
        ps->p++;
    }
}

/* The values each rule needs before it can draw anything (as torch checks them). */
static int check_values(parser *ps, const init_rule *r) {
    switch (r->kind) {
    case INIT_NORMAL:
    case INIT_TRUNC_NORMAL:
        if (!(r->std > 0)) return perr(ps, "std must be > 0");
        if (r->kind == INIT_TRUNC_NORMAL && !(r->a < r->b)) return perr(ps, "the bounds must satisfy a < b");
        return 0;
    case INIT_UNIFORM:
        if (!(r->a <= r->b)) return perr(ps, "the bounds must satisfy a <= b");
        return 0;
    case INIT_XAVIER_UNIFORM:
    case INIT_XAVIER_NORMAL:
        if (!(r->gain >= 0)) return perr(ps, "gain must be >= 0");
        return 0;
    case INIT_SINCOS_2D:
        if (r->grid <= 0) return perr(ps, "sincos_2d needs its grid: sincos_2d(grid=S) for a [S*S, D] parameter");
        if (!(r->base > 0)) return perr(ps, "base must be > 0");
        return 0;
    default: return 0;
    }
}

int init_rule_parse(const char *text, init_rule *out, fsdp_err *err) {
    parser ps = {text ? text : "", text ? text : "", err};
    char name[32];
    if (!ident(&ps, name, sizeof name)) return perr(&ps, "expected a rule name (normal, trunc_normal, uniform, ...)");
    int kind = -1;
    for (int i = 0; i < INIT_KIND_COUNT; i++)
        if (!strcmp(name, KIND_NAMES[i])) kind = i;
    if (!strcmp(name, "zero")) kind = INIT_ZEROS;
    if (!strcmp(name, "one")) kind = INIT_ONES;
    if (kind < 0) {
        char m[512];
        snprintf(m, sizeof m,
                 "unknown rule '%s' (one of: normal, trunc_normal, uniform, zeros, ones, constant, kaiming_uniform, "
                 "kaiming_normal, xavier_uniform, xavier_normal, default_linear, default_embedding, sincos_2d, none)",
                 name);
        return perr(&ps, m);
    }
    init_rule_default((init_kind)kind, out);
    skip_ws(&ps);
    int rc = 0;
    if (*ps.p == '(') {
        if (!args_of(out->kind)[0]) {
            const char *q = ps.p + 1;
            while (isspace((unsigned char)*q)) q++;
            if (*q != ')' && !(at_padding_idx(q) && kind != INIT_NONE)) {
                char m[96];
                snprintf(m, sizeof m, "%s takes no arguments", KIND_NAMES[kind]);
                return perr(&ps, m);
            }
        }
        rc = parse_args(&ps, out);
    } else if (kind == INIT_CONSTANT) {
        return perr(&ps, "constant needs its value: constant(v)");
    }
    if (rc) return rc;
    skip_ws(&ps);
    if (*ps.p) return perr(&ps, "unexpected text after the rule");
    return check_values(&ps, out);
}

/* The rule's own arguments (no padding_idx) in buf. */
static void format_args(const init_rule *r, char *buf, size_t cap) {
    const char *n = init_kind_name(r->kind);
    switch (r->kind) {
    case INIT_NORMAL: snprintf(buf, cap, "%s(mean=%.17g, std=%.17g)", n, r->mean, r->std); break;
    case INIT_TRUNC_NORMAL:
        snprintf(buf, cap, "%s(mean=%.17g, std=%.17g, a=%.17g, b=%.17g)", n, r->mean, r->std, r->a, r->b);
        break;
    case INIT_UNIFORM: snprintf(buf, cap, "%s(a=%.17g, b=%.17g)", n, r->a, r->b); break;
    case INIT_CONSTANT: snprintf(buf, cap, "%s(value=%.17g)", n, r->value); break;
    case INIT_KAIMING_UNIFORM:
    case INIT_KAIMING_NORMAL:
        snprintf(buf, cap, "%s(a=%.17g, mode=%s, nonlinearity=%s)", n, r->a, r->fan_out_mode ? "fan_out" : "fan_in",
                 NL_NAMES[r->nonlin]);
        break;
    case INIT_XAVIER_UNIFORM:
    case INIT_XAVIER_NORMAL: snprintf(buf, cap, "%s(gain=%.17g)", n, r->gain); break;
    case INIT_SINCOS_2D: snprintf(buf, cap, "%s(grid=%lld, base=%.17g)", n, (long long)r->grid, r->base); break;
    default: snprintf(buf, cap, "%s", n); break;
    }
}

void init_rule_format(const init_rule *r, char *buf, size_t cap) {
    format_args(r, buf, cap);
    if (!r->has_zero_row || !cap) return;
    size_t len = strlen(buf);
    char tail[48];
    snprintf(tail, sizeof tail, "padding_idx=%lld)", (long long)r->zero_row);
    if (len && buf[len - 1] == ')') snprintf(buf + len - 1, cap - (len - 1), ", %s", tail);
    else snprintf(buf + len, cap - len, "(%s", tail);
}

/* ---- resolution into a distribution -------------------------------------------------------- */

int init_fans(int ndim, const int64_t *shape, int64_t *fan_in, int64_t *fan_out, const char *what, fsdp_err *err) {
    if (ndim < 2)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: fan in and fan out can not be computed for a tensor of %d dimension%s (the rule needs "
                            "a weight of 2 or more)",
                            what, ndim, ndim == 1 ? "" : "s");
    double rf = 1;
    for (int d = 2; d < ndim; d++) rf *= (double)shape[d];
    double fi = (double)shape[1] * rf, fo = (double)shape[0] * rf;
    if (fi > 9.0e18 || fo > 9.0e18)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: the fans of its shape overflow int64", what);
    *fan_in = (int64_t)fi;
    *fan_out = (int64_t)fo;
    return 0;
}

/* torch.nn.init.calculate_gain(nonlinearity, a) */
static double gain_of(init_nonlinearity nl, double a) {
    switch (nl) {
    case INIT_NL_TANH: return 5.0 / 3.0;
    case INIT_NL_RELU: return sqrt(2.0);
    case INIT_NL_SELU: return 0.75;
    case INIT_NL_LEAKY_RELU: return sqrt(2.0 / (1.0 + a * a));
    default: return 1.0;
    }
}

/* U(-bound, bound), or the constant 0 when bound is 0 (torch draws uniform_(-0, 0) = 0) */
static int symmetric_uniform(double bound, const char *what, rng_dist *d, fsdp_err *err) {
    if (bound == 0.0) {
        rng_dist_const(d, 0.0f);
        return 0;
    }
    int rc = rng_dist_uniform_ab(d, -bound, bound, err);
    return rc ? fsdp_err_prefix(err, "%s", what) : 0;
}

static int normal_or_zero(double std, const char *what, rng_dist *d, fsdp_err *err) {
    if (std == 0.0) {
        rng_dist_const(d, 0.0f);
        return 0;
    }
    int rc = rng_dist_normal(d, 0.0, std, err);
    return rc ? fsdp_err_prefix(err, "%s", what) : 0;
}

static int fan_rules(const init_rule *r, int ndim, const int64_t *shape, const char *what, rng_dist *d,
                     fsdp_err *err) {
    int64_t fi, fo;
    if (r->kind == INIT_DEFAULT_LINEAR && ndim < 2) {
        /* a bias: U(+-1/sqrt(fan_in)) with its weight's fan_in (0 when the weight has none) */
        if (r->fan_in <= 0)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "%s: default_linear on a bias needs its layer's weight (the table looks for the "
                                "sibling '.weight' of the same module)",
                                what);
        return symmetric_uniform(1.0 / sqrt((double)r->fan_in), what, d, err);
    }
    int rc = init_fans(ndim, shape, &fi, &fo, what, err);
    if (rc) return rc;
    switch (r->kind) {
    case INIT_DEFAULT_LINEAR:
        /* kaiming_uniform(a=sqrt(5)): gain = sqrt(2 / 6), bound = sqrt(3) gain / sqrt(fan_in) */
        if (fi == 0) return symmetric_uniform(0.0, what, d, err);
        return symmetric_uniform(sqrt(3.0) * sqrt(2.0 / 6.0) / sqrt((double)fi), what, d, err);
    case INIT_KAIMING_UNIFORM:
    case INIT_KAIMING_NORMAL: {
        int64_t fan = r->fan_out_mode ? fo : fi;
        if (fan == 0)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: %s of a tensor with a zero %s", what,
                                init_kind_name(r->kind), r->fan_out_mode ? "fan_out" : "fan_in");
        double std = gain_of(r->nonlin, r->a) / sqrt((double)fan);
        return r->kind == INIT_KAIMING_UNIFORM ? symmetric_uniform(sqrt(3.0) * std, what, d, err)
                                               : normal_or_zero(std, what, d, err);
    }
    default: { /* xavier */
        if (fi + fo == 0) return fsdp_err_set(err, FSDP_E_INVALID, "%s: xavier init of an empty tensor", what);
        double std = r->gain * sqrt(2.0 / (double)(fi + fo));
        return r->kind == INIT_XAVIER_UNIFORM ? symmetric_uniform(sqrt(3.0) * std, what, d, err)
                                              : normal_or_zero(std, what, d, err);
    }
    }
}

int init_rule_dist(const init_rule *r, int ndim, const int64_t *shape, const char *what, rng_dist *d, fsdp_err *err) {
    int rc = 0;
    if (!what) what = "init";
    switch (r->kind) {
    case INIT_NONE:
        return fsdp_err_set(err, FSDP_E_INVALID, "%s has no init rule (it must be loaded or copied)", what);
    case INIT_SINCOS_2D:
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: sincos_2d is a fixed table, not a distribution (init_job_for_rule fills it)", what);
    case INIT_NORMAL:
    case INIT_DEFAULT_EMBEDDING:
        rc = rng_dist_normal(d, r->kind == INIT_NORMAL ? r->mean : 0.0, r->kind == INIT_NORMAL ? r->std : 1.0, err);
        break;
    case INIT_TRUNC_NORMAL: rc = rng_dist_trunc_normal(d, r->mean, r->std, r->a, r->b, err); break;
    case INIT_UNIFORM:
        if (r->a == r->b) rng_dist_const(d, (float)r->a);
        else rc = rng_dist_uniform_ab(d, r->a, r->b, err);
        break;
    case INIT_ZEROS: rng_dist_const(d, 0.0f); break;
    case INIT_ONES: rng_dist_const(d, 1.0f); break;
    case INIT_CONSTANT:
        if (!isfinite(r->value) || fabs(r->value) > 3.4028234663852886e38)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: constant %g is not a float32 value", what, r->value);
        rng_dist_const(d, (float)r->value);
        break;
    default: return fan_rules(r, ndim, shape, what, d, err);
    }
    return rc ? fsdp_err_prefix(err, "%s", what) : 0;
}

int init_rule_zero_range(const init_rule *r, int ndim, const int64_t *shape, int64_t e0, int64_t e1, const char *what,
                         int64_t *z0, int64_t *z1, fsdp_err *err) {
    *z0 = *z1 = 0;
    if (!r->has_zero_row) return 0;
    if (!what) what = "init";
    if (ndim < 1 || r->zero_row < 0 || r->zero_row >= shape[0])
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: padding_idx %lld is not a row of its %lld (expected 0 <= "
                            "padding_idx < dim 0)", what, (long long)r->zero_row, ndim < 1 ? 0LL : (long long)shape[0]);
    int64_t row = 1;
    for (int d = 1; d < ndim; d++) row *= shape[d];
    *z0 = r->zero_row * row > e0 ? r->zero_row * row : e0;
    *z1 = (r->zero_row + 1) * row < e1 ? (r->zero_row + 1) * row : e1;
    if (*z1 < *z0) *z1 = *z0;
    return 0;
}

uint64_t init_stream(const char *name) { return rng_fnv1a64(name); }
