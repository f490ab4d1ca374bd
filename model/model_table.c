/* The generic model table (see model_table.h). */
#include "model/model_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"

void mt_init(mt_table *t) { memset(t, 0, sizeof *t); }

static void free_strs(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static void free_part(mt_part *p) {
    free(p->name);
    free(p->prefix);
    free(p->source);
    free(p->where);
    free(p->from);
    free_strs(p->strip, p->n_strip);
    free_strs(p->keys, p->n_keys);
    free_strs(p->exclude, p->n_exclude);
}

void mt_free(mt_table *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->p[i].name);
    free(t->p);
    for (size_t i = 0; i < t->n_parts; i++) free_part(&t->parts[i]);
    free(t->parts);
    nidx_free(&t->names);
    free(t->trainer_cfg);
    mt_init(t);
}

void mt_destroy(mt_table *t) {
    mt_free(t);
    free(t);
}

void mt_move(mt_table *dst, mt_table *src) {
    *dst = *src;
    mt_init(src);
}

static char *dup_or_empty(const char *s) { return strdup(s ? s : ""); }

int mt_add_part(mt_table *t, const char *name, const char *prefix, const char *source, const char *where, int *idx,
                fsdp_err *err) {
    for (size_t i = 0; i < t->n_parts; i++)
        if (!strcmp(t->parts[i].name, name))
            return fsdp_err_set(err, FSDP_E_INVALID, "model: two parts are named '%s' (%s%s%s and %s%s%s); give each a "
                                "name of its own", name, t->parts[i].source, t->parts[i].where[0] ? " at " : "",
                                t->parts[i].where, source ? source : "", where && *where ? " at " : "",
                                where ? where : "");
    if (t->n_parts == t->cap_parts) {
        size_t cap = t->cap_parts ? 2 * t->cap_parts : 4;
        mt_part *np = realloc(t->parts, cap * sizeof *np);
        if (!np) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu model parts", cap);
        t->parts = np;
        t->cap_parts = cap;
    }
    mt_part *p = &t->parts[t->n_parts];
    memset(p, 0, sizeof *p);
    p->name = dup_or_empty(name);
    p->prefix = dup_or_empty(prefix);
    p->source = dup_or_empty(source);
    p->where = dup_or_empty(where);
    if (!p->name || !p->prefix || !p->source || !p->where) {
        free_part(p);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for model part %s", name);
    }
    if (idx) *idx = (int)t->n_parts;
    t->n_parts++;
    return 0;
}

/* Copies n strings into *out (NULL entries become ""). */
static int dup_strs(const char *const *v, size_t n, char ***out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (!n) return 0;
    if (!(*out = calloc(n, sizeof **out))) return -1;
    for (size_t i = 0; i < n; i++) {
        if (!((*out)[i] = dup_or_empty(v[i]))) return -1;
        *n_out = i + 1;
    }
    return 0;
}

int mt_part_set_source(mt_table *t, int part, const char *from, int format, const char *const *strip, size_t n_strip,
                       const char *const *keys, size_t n_keys, int keys_given, const char *const *exclude,
                       size_t n_exclude, fsdp_err *err) {
    if (part < 0 || (size_t)part >= t->n_parts) return fsdp_err_set(err, FSDP_E_INVALID, "model: part %d does not exist", part);
    mt_part *p = &t->parts[part];
    p->format = format;
    p->keys_given = keys_given;
    if (!(p->from = dup_or_empty(from)) || dup_strs(strip, n_strip, &p->strip, &p->n_strip) ||
        dup_strs(keys, n_keys, &p->keys, &p->n_keys) || dup_strs(exclude, n_exclude, &p->exclude, &p->n_exclude))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for the source of model part %s", p->name);
    return 0;
}

static int any_glob(char *const *globs, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (nmap_glob_match(globs[i], key, NULL) >= 0) return 1;
    return 0;
}

int mt_part_takes(const mt_part *p, const char *key) {
    if (any_glob(p->exclude, p->n_exclude, key)) return 0;
    return !p->keys_given || any_glob(p->keys, p->n_keys, key);
}

void mt_part_describe(const mt_table *t, int part, char *buf, size_t cap) {
    if (part < 0 || (size_t)part >= t->n_parts) {
        snprintf(buf, cap, "an unknown part");
        return;
    }
    const mt_part *p = &t->parts[part];
    snprintf(buf, cap, "part '%s' (%s%s%s)", p->name, p->source, p->where[0] ? ", " : "", p->where);
}

fsdp_dtype mt_dtype_from_name(const char *name) {
    if (!name) return FSDP_DT_INVALID;
    fsdp_dtype dt = fsdp_dtype_from_name(name);
    return dt == FSDP_DT_F32 || dt == FSDP_DT_BF16 || dt == FSDP_DT_F16 ? dt : FSDP_DT_INVALID;
}

static int check_param(const mt_table *t, const mt_param *p, fsdp_err *err) {
    if (!p->name || !p->name[0]) return fsdp_err_set(err, FSDP_E_INVALID, "model: a parameter has an empty name");
    size_t len = strlen(p->name);
    if (len > MT_NAME_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter name '%.64s...' is %zu bytes long (at most %d)",
                            p->name, len, MT_NAME_MAX);
    if (p->part < 0 || (size_t)p->part >= t->n_parts)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s belongs to no part", p->name);
    if (p->ndim < 0 || p->ndim > FSDP_MAX_DIMS)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s has %d dims (at most %d)", p->name, p->ndim,
                            FSDP_MAX_DIMS);
    for (int d = 0; d < p->ndim; d++)
        if (p->shape[d] < 0)
            return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s: dim %d is negative (%lld)", p->name, d,
                                (long long)p->shape[d]);
    if (fsdp_numel(p->ndim, p->shape) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s: its element count overflows int64", p->name);
    if (p->dtype != FSDP_DT_F32 && p->dtype != FSDP_DT_BF16 && p->dtype != FSDP_DT_F16)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s: dtype %s (a parameter is f32, bf16 or f16)",
                            p->name, fsdp_dtype_name(p->dtype));
    return 0;
}

static int same_shape(const mt_param *a, const mt_param *b) {
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape);
}

int mt_add(mt_table *t, const mt_param *p, fsdp_err *err) {
    int rc = check_param(t, p, err);
    if (rc) return rc;
    long prev = mt_find(t, p->name);
    if (prev >= 0) {
        const mt_param *q = &t->p[prev];
        char a[512], b[512], sa[128], sb[128];
        mt_part_describe(t, q->part, a, sizeof a);
        mt_part_describe(t, p->part, b, sizeof b);
        if (!same_shape(q, p))
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "model: shape conflict: parameter %s is %s in %s and %s in %s", p->name,
                                fsdp_shape_str(q->ndim, q->shape, sa, sizeof sa), a,
                                fsdp_shape_str(p->ndim, p->shape, sb, sizeof sb), b);
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s is declared twice: by %s and by %s", p->name, a,
                            b);
    }
    if (t->n >= MT_PARAMS_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter %s: the model has %d parameters already (at most %d)",
                            p->name, MT_PARAMS_MAX, MT_PARAMS_MAX);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        mt_param *np = cap < SIZE_MAX / sizeof *np ? realloc(t->p, cap * sizeof *np) : NULL;
        if (!np) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu model parameters", cap);
        t->p = np;
        t->cap = cap;
    }
    mt_param *dst = &t->p[t->n];
    *dst = *p;
    dst->name = strdup(p->name);
    if (!dst->name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for parameter %s", p->name);
    if (nidx_add(&t->names, dst->name, t->n, NULL) != 0) {
        free(dst->name);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory indexing parameter %s", p->name);
    }
    t->n++;
    return 0;
}

int mt_remove(mt_table *t, size_t i, fsdp_err *err) {
    if (i >= t->n) return fsdp_err_set(err, FSDP_E_INVALID, "model: parameter index %zu of %zu", i, t->n);
    free(t->p[i].name);
    memmove(t->p + i, t->p + i + 1, (t->n - i - 1) * sizeof *t->p);
    t->n--;
    nidx_free(&t->names);
    nidx_init(&t->names);
    for (size_t k = 0; k < t->n; k++)
        if (nidx_add(&t->names, t->p[k].name, k, NULL) != 0)
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory indexing the model's parameters");
    return 0;
}

long mt_find_part(const mt_table *t, const char *name) {
    for (size_t i = 0; t && name && i < t->n_parts; i++)
        if (!strcmp(t->parts[i].name, name)) return (long)i;
    return -1;
}

long mt_find(const mt_table *t, const char *name) {
    long i = t && name ? nidx_get(&t->names, name) : -1;
    return i >= 0 && (size_t)i < t->n ? i : -1;
}

int64_t mt_param_numel(const mt_param *p) { return fsdp_numel(p->ndim, p->shape); }

int64_t mt_param_row_numel(const mt_param *p) { return p->ndim <= 1 ? 1 : fsdp_numel(p->ndim - 1, p->shape + 1); }

int64_t mt_total(const mt_table *t) {
    int64_t total = 0;
    for (size_t i = 0; i < t->n; i++)
        if (__builtin_add_overflow(total, mt_param_numel(&t->p[i]), &total)) return -1;
    return total;
}

int64_t mt_shard_numel(const mt_table *t, int world) {
    if (world < 1) return -1;
    int64_t total = 0, x;
    for (size_t i = 0; i < t->n; i++) {
        const mt_param *p = &t->p[i];
        if (p->ndim == 0) x = 1;
        else if (__builtin_mul_overflow(p->shape[0] / world + (p->shape[0] % world != 0), mt_param_row_numel(p), &x))
            return -1;
        if (__builtin_add_overflow(total, x, &total)) return -1;
    }
    return total;
}

const char *mt_kind(const mt_table *t) { return t->kind[0] ? t->kind : "empty model"; }

int mt_can_train(const mt_table *t) { return t->trainer == MT_TRAIN_DECODER; }

int mt_param_dist(const mt_param *p, rng_dist *d, fsdp_err *err) {
    char what[MT_NAME_MAX + 32];
    snprintf(what, sizeof what, "init of %s", p->name);
    return init_rule_dist(&p->init, p->ndim, p->shape, what, d, err);
}

int mt_param_init_job(const mt_param *p, init_job *j, fsdp_err *err) {
    char what[MT_NAME_MAX + 32];
    snprintf(what, sizeof what, "init of %s", p->name);
    j->stream = init_stream(p->name);
    return init_job_for_rule(j, &p->init, p->ndim, p->shape, what, err);
}

/* The fan_in of a default_linear bias: its sibling `<module>.weight`'s (a bias named `<module>.bias`,
 * or any 1-D tensor whose last component is replaced by `weight`). */
static int bias_fan_in(const mt_table *t, const mt_param *p, fsdp_err *err, char *part_desc, size_t cap) {
    const char *dot = strrchr(p->name, '.');
    size_t stem = dot ? (size_t)(dot - p->name) + 1 : 0;
    char sib[MT_NAME_MAX + 16];
    snprintf(sib, sizeof sib, "%.*sweight", (int)stem, p->name);
    long w = mt_find(t, sib);
    mt_part_describe(t, p->part, part_desc, cap);
    if (w < 0 || !strcmp(sib, p->name))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: %s (%s): default_linear on a 1-D tensor takes the fan_in of its layer's weight "
                            "%s, which the model does not declare",
                            p->name, part_desc, sib);
    const mt_param *q = &t->p[w];
    int64_t fi, fo;
    if (init_fans(q->ndim, q->shape, &fi, &fo, q->name, err))
        return fsdp_err_prefix(err, "model: %s (%s): default_linear takes the fan_in of %s", p->name, part_desc,
                               q->name);
    ((mt_param *)p)->init.fan_in = fi;
    return 0;
}

int mt_finalize(mt_table *t, fsdp_err *err) {
    char desc[512];
    for (size_t i = 0; i < t->n; i++) {
        mt_param *p = &t->p[i];
        if (p->init.kind == INIT_DEFAULT_LINEAR && p->ndim < 2 && p->init.fan_in <= 0) {
            int rc = bias_fan_in(t, p, err, desc, sizeof desc);
            if (rc) return rc;
        }
        if (p->init.kind == INIT_NONE) continue;
        init_job j;
        if (mt_param_init_job(p, &j, err)) {
            mt_part_describe(t, p->part, desc, sizeof desc);
            return fsdp_err_prefix(err, "model (%s)", desc);
        }
    }
    return 0;
}
