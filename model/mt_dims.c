/* Named dims and their expressions (see mt_dims.h). */
#include "model/mt_dims.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "ckpt/namemap.h"
#include "model/mt_json.h"
#include "ckpt/reader.h"
#include "runtime/fileio.h"
#include "runtime/nearest.h"

/* Deepest chain of definitions referring to others. */
#define MT_DIMS_DEPTH 32
#define DIM_NAME_MAX 128

typedef enum def_kind { DEF_INT, DEF_EXPR, DEF_SHAPE, DEF_CONFIG, DEF_COUNT } def_kind;

typedef struct def {
    const char *name;
    const fsdp_value *v; /* the definition (positions) */
    def_kind kind;
    const char *text;    /* DEF_EXPR: the expression; DEF_SHAPE: the parameter; DEF_CONFIG: the file; DEF_COUNT: the glob */
    const char *key;     /* DEF_CONFIG: the JSON key; DEF_COUNT: the checkpoint */
    int64_t dim;         /* DEF_SHAPE */
    int state;           /* 0 not evaluated, 1 being evaluated, 2 done */
    int64_t value;
} def;

struct mt_dims {
    def *defs;
    size_t n;
    const mt_table *t;
    int *missing;
    mt_dims *chain[MT_DIMS_CHAIN_MAX];
    int n_chain;
};

/* The names being evaluated, outermost first (cycle messages). */
typedef struct stack {
    const char *names[MT_DIMS_DEPTH];
    int depth;
} stack;

typedef struct parser {
    mt_dims *d;
    const char *text, *p;
    const fsdp_value *at;
    fsdp_err *err;
    int eval; /* 0: check syntax and names only */
    stack *st;
} parser;

static int eval_def(mt_dims *owner, def *df, stack *st, fsdp_err *err);

/* ---- scopes ----------------------------------------------------------------------------------- */

/* The map forms: {shape: PARAMETER, dim: N}, {config: FILE.json, key: KEY}, {count: GLOB, in: CHECKPOINT}. */
static const struct {
    const char *first, *second, *what;
    def_kind kind;
} MAP_FORMS[] = {{"shape", "dim", "parameter name", DEF_SHAPE},
                 {"config", "key", "file name", DEF_CONFIG},
                 {"count", "in", "glob", DEF_COUNT}};
#define N_MAP_FORMS (sizeof MAP_FORMS / sizeof *MAP_FORMS)

static int parse_map_def(def *df, const fsdp_value *v, fsdp_err *err) {
    int f = -1;
    for (int i = 0; i < (int)N_MAP_FORMS; i++) {
        if (!fsdp_value_get(v, MAP_FORMS[i].first)) continue;
        if (f >= 0)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "model dims: %s: give one of %s, not both", df->name,
                               "shape, config and count");
        f = i;
    }
    if (f < 0)
        return fsdp_err_at(err, FSDP_E_INVALID, v,
                           "model dims: %s: a map must be {shape: PARAMETER, dim: N}, {config: FILE.json, key: KEY} or "
                           "{count: GLOB, in: CHECKPOINT}",
                           df->name);
    const char *first = MAP_FORMS[f].first, *second = MAP_FORMS[f].second;
    for (size_t i = 0; i < fsdp_value_size(v); i++) {
        const char *k = fsdp_value_key(v, i);
        char known[128], hint[300];
        snprintf(known, sizeof known, "%s, %s", first, second);
        if (strcmp(k, first) && strcmp(k, second))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(v, i), "model dims: %s: unknown key '%s'%s (%s)",
                               df->name, k, nearest_hint(k, known, hint, sizeof hint), known);
    }
    const fsdp_value *a = fsdp_value_get(v, first), *b = fsdp_value_get(v, second);
    if (fsdp_value_type(a) != FSDP_V_SCALAR || !fsdp_value_text(a))
        return fsdp_err_at(err, FSDP_E_INVALID, a, "model dims: %s: %s must be a %s", df->name, first, MAP_FORMS[f].what);
    df->text = fsdp_value_text(a);
    df->kind = MAP_FORMS[f].kind;
    if (df->kind == DEF_SHAPE) {
        if (!b || fsdp_value_int(b, &df->dim) || df->dim < -FSDP_MAX_DIMS || df->dim >= FSDP_MAX_DIMS)
            return fsdp_err_at(err, FSDP_E_INVALID, b ? b : v, "model dims: %s: dim must be an integer in [%d, %d]",
                               df->name, -FSDP_MAX_DIMS, FSDP_MAX_DIMS - 1);
        return 0;
    }
    if (!b || fsdp_value_type(b) != FSDP_V_SCALAR || !fsdp_value_text(b))
        return fsdp_err_at(err, FSDP_E_INVALID, b ? b : v, "model dims: %s: %s must be %s", df->name, second,
                           df->kind == DEF_CONFIG ? "a (dotted) JSON key" : "a checkpoint path");
    df->key = fsdp_value_text(b);
    if (df->kind == DEF_COUNT && nmap_glob_check(df->text, NULL, err)) {
        char msg[FSDP_ERR_MSG_MAX - 256];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, FSDP_E_INVALID, a, "model dims: %s: %s", df->name, msg);
    }
    return 0;
}

static int valid_name(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return 0;
    size_t n = 0;
    for (; *s; s++, n++)
        if (!(isalnum((unsigned char)*s) || *s == '_')) return 0;
    return n < DIM_NAME_MAX;
}

int mt_dims_new(const fsdp_value *map, const mt_table *t, int *missing, mt_dims **out, fsdp_err *err) {
    *out = NULL;
    fsdp_value_kind k = fsdp_value_type(map);
    if (k != FSDP_V_NULL && k != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, map, "model: dims must be a map of name: size");
    mt_dims *d = calloc(1, sizeof *d);
    size_t n = fsdp_value_size(map);
    if (!d || !(d->defs = calloc(n ? n : 1, sizeof *d->defs))) {
        free(d);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu dims", n);
    }
    d->t = t;
    d->missing = missing;
    d->chain[0] = d;
    d->n_chain = 1;
    for (size_t i = 0; i < n; i++) {
        def *df = &d->defs[d->n];
        df->name = fsdp_value_key(map, i);
        df->v = fsdp_value_item(map, i);
        int rc = 0;
        if (!valid_name(df->name))
            rc = fsdp_err_at(err, FSDP_E_INVALID, df->v,
                             "model dims: '%s' is not a dim name (letters, digits and _, not starting with a digit)",
                             df->name);
        else if (fsdp_value_type(df->v) == FSDP_V_MAP)
            rc = parse_map_def(df, df->v, err);
        else if (fsdp_value_type(df->v) != FSDP_V_SCALAR)
            rc = fsdp_err_at(err, FSDP_E_INVALID, df->v, "model dims: %s must be an integer, an expression or a map",
                             df->name);
        else if (fsdp_value_int(df->v, &df->value) == 0)
            df->kind = DEF_INT, df->state = 2;
        else
            df->kind = DEF_EXPR, df->text = fsdp_value_text(df->v);
        if (rc) {
            mt_dims_free(d);
            return rc;
        }
        d->n++;
    }
    *out = d;
    return 0;
}

void mt_dims_free(mt_dims *d) {
    if (!d) return;
    free(d->defs);
    free(d);
}

void mt_dims_set_chain(mt_dims *d, mt_dims *const *chain, int n) {
    if (n > MT_DIMS_CHAIN_MAX) n = MT_DIMS_CHAIN_MAX;
    for (int i = 0; i < n; i++) d->chain[i] = chain[i];
    d->n_chain = n;
}

static def *find_in(mt_dims *s, const char *name, size_t len) {
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->defs[i].name) == len && !strncmp(s->defs[i].name, name, len)) return &s->defs[i];
    return NULL;
}

/* The scope and definition a name resolves to along d's chain. */
static def *lookup(mt_dims *d, const char *name, size_t len, mt_dims **owner) {
    for (int i = 0; i < d->n_chain; i++) {
        def *df = find_in(d->chain[i], name, len);
        if (df) {
            *owner = d->chain[i];
            return df;
        }
    }
    return NULL;
}

static void known_names(mt_dims *d, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->n_chain; i++)
        for (size_t k = 0; k < d->chain[i]->n && o + 4 < cap; k++) {
            int w = snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", d->chain[i]->defs[k].name);
            if (w < 0) break;
            o += (size_t)w;
        }
    if (!o) snprintf(buf, cap, "none declared");
}

/* ---- expressions ------------------------------------------------------------------------------- */

static int perr(parser *ps, const char *fmt, const char *arg) {
    char what[512];
    snprintf(what, sizeof what, fmt, arg);
    return fsdp_err_at(ps->err, FSDP_E_INVALID, ps->at, "model: '%s': %s", ps->text, what);
}

static void skip_ws(parser *ps) {
    while (isspace((unsigned char)*ps->p)) ps->p++;
}

static int parse_sum(parser *ps, int64_t *out);

static int overflow(parser *ps) { return perr(ps, "%s", "the value overflows int64"); }

static int parse_name(parser *ps, int64_t *out) {
    const char *s = ps->p;
    while (isalnum((unsigned char)*ps->p) || *ps->p == '_') ps->p++;
    size_t len = (size_t)(ps->p - s);
    mt_dims *owner = NULL;
    def *df = lookup(ps->d, s, len, &owner);
    if (!df) {
        char known[512], name[DIM_NAME_MAX + 1];
        known_names(ps->d, known, sizeof known);
        snprintf(name, sizeof name, "%.*s", (int)(len < DIM_NAME_MAX ? len : DIM_NAME_MAX), s);
        return fsdp_err_at(ps->err, FSDP_E_INVALID, ps->at, "model: '%s': unknown dim '%s' (dims: %s)", ps->text, name,
                           known);
    }
    if (!ps->eval) {
        *out = 1;
        return 0;
    }
    int rc = eval_def(owner, df, ps->st, ps->err);
    *out = df->value;
    return rc;
}

static int parse_primary(parser *ps, int64_t *out) {
    skip_ws(ps);
    char c = *ps->p;
    if (c == '(') {
        ps->p++;
        int rc = parse_sum(ps, out);
        if (rc) return rc;
        skip_ws(ps);
        if (*ps->p != ')') return perr(ps, "%s", "a ')' is missing");
        ps->p++;
        return 0;
    }
    if (c == '-' || c == '+') {
        ps->p++;
        int64_t v;
        int rc = parse_primary(ps, &v);
        if (rc) return rc;
        if (c == '-' && __builtin_sub_overflow((int64_t)0, v, out)) return overflow(ps);
        if (c == '+') *out = v;
        return 0;
    }
    if (isdigit((unsigned char)c)) {
        errno = 0;
        char *end;
        long long v = strtoll(ps->p, &end, 10);
        if (errno == ERANGE) return overflow(ps);
        ps->p = end;
        *out = v;
        return 0;
    }
    if (isalpha((unsigned char)c) || c == '_') return parse_name(ps, out);
    if (!c) return perr(ps, "%s", "the expression ends early");
    char ch[2] = {c, 0};
    return perr(ps, "unexpected '%s' (dims expressions use integers, dim names, + - * / // %% and parentheses)", ch);
}

static int parse_product(parser *ps, int64_t *out) {
    int rc = parse_primary(ps, out);
    while (!rc) {
        skip_ws(ps);
        char c = *ps->p;
        int floor_div = c == '/' && ps->p[1] == '/';
        if (c != '*' && c != '/' && c != '%') break;
        ps->p += floor_div ? 2 : 1;
        int64_t r;
        if ((rc = parse_primary(ps, &r))) break;
        if (!ps->eval) continue;
        if (c == '*') {
            if (__builtin_mul_overflow(*out, r, out)) return overflow(ps);
            continue;
        }
        if (r == 0) return perr(ps, "%s", "division by zero");
        if (*out == INT64_MIN && r == -1) return overflow(ps);
        int64_t q = *out / r, m = *out % r;
        if (c == '%') {
            *out = m != 0 && ((m < 0) != (r < 0)) ? m + r : m;
        } else if (floor_div) {
            *out = m != 0 && ((m < 0) != (r < 0)) ? q - 1 : q;
        } else if (m != 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "%lld / %lld leaves a remainder (use // to round down)", (long long)*out,
                     (long long)r);
            return perr(ps, "%s", msg);
        } else {
            *out = q;
        }
    }
    return rc;
}

static int parse_sum(parser *ps, int64_t *out) {
    int rc = parse_product(ps, out);
    while (!rc) {
        skip_ws(ps);
        char c = *ps->p;
        if (c != '+' && c != '-') break;
        ps->p++;
        int64_t r;
        if ((rc = parse_product(ps, &r))) break;
        if (!ps->eval) continue;
        if (c == '+' ? __builtin_add_overflow(*out, r, out) : __builtin_sub_overflow(*out, r, out))
            return overflow(ps);
    }
    return rc;
}

static int run_expr(mt_dims *d, const char *text, const fsdp_value *at, int eval, stack *st, int64_t *out,
                    fsdp_err *err) {
    parser ps = {d, text ? text : "", text ? text : "", at, err, eval, st};
    if (!text || !*text) return fsdp_err_at(err, FSDP_E_INVALID, at, "model: an empty size expression");
    int64_t v = 0;
    int rc = parse_sum(&ps, &v);
    if (rc) return rc;
    skip_ws(&ps);
    if (*ps.p) {
        char rest[64];
        snprintf(rest, sizeof rest, "%.32s", ps.p);
        return perr(&ps, "unexpected '%s'", rest);
    }
    *out = v;
    return 0;
}

/* ---- the map forms ---------------------------------------------------------------------------- */

static int shape_def(mt_dims *s, def *df, fsdp_err *err) {
    long i = mt_find(s->t, df->text);
    if (i < 0)
        return fsdp_err_at(err, FSDP_E_INVALID, df->v,
                           "model dims: %s: no parameter %s among the parts declared before this use", df->name,
                           df->text);
    const mt_param *p = &s->t->p[i];
    int64_t k = df->dim < 0 ? p->ndim + df->dim : df->dim;
    if (k < 0 || k >= p->ndim) {
        char shp[128];
        return fsdp_err_at(err, FSDP_E_INVALID, df->v, "model dims: %s: %s has shape %s, no dim %lld", df->name,
                           p->name, fsdp_shape_str(p->ndim, p->shape, shp, sizeof shp), (long long)df->dim);
    }
    df->value = p->shape[k];
    return 0;
}


static int config_def(mt_dims *s, def *df, fsdp_err *err) {
    if (s->missing && fio_not_there_yet(df->text)) {
        *s->missing = 1;
        return fsdp_err_at(err, FSDP_E_IO, df->v, "model dims: %s: %s does not exist (yet)", df->name, df->text);
    }
    FILE *f;
    int rc = fio_fopen_read(df->text, NULL, &f, err);
    if (rc) {
        char msg[FSDP_ERR_MSG_MAX - 256];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, df->v, "model dims: %s: %s", df->name, msg);
    }
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root)
        return fsdp_err_at(err, FSDP_E_FORMAT, df->v, "model dims: %s: %s is not JSON: %s (line %d)", df->name,
                           df->text, je.text, je.line);
    json_t *v = mt_json_at(root, df->key);
    if (!v || !json_is_integer(v)) {
        rc = fsdp_err_at(err, FSDP_E_INVALID, df->v, "model dims: %s: %s has %s at key %s", df->name, df->text,
                         v ? "no integer" : "nothing", df->key);
    } else {
        df->value = (int64_t)json_integer_value(v);
    }
    json_decref(root);
    return rc;
}

/* {count: GLOB, in: CHECKPOINT}: the checkpoint's tensors whose names match (its header only). */
static int count_def(mt_dims *s, def *df, fsdp_err *err) {
    if (s->missing && fio_not_there_yet(df->key)) {
        *s->missing = 1;
        return fsdp_err_at(err, FSDP_E_IO, df->v, "model dims: %s: %s does not exist (yet)", df->name, df->key);
    }
    ckpt_reader *r;
    int rc = ckpt_open(df->key, CKPT_AUTO, &r, err);
    if (rc) {
        char msg[FSDP_ERR_MSG_MAX - 256];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, df->v, "model dims: %s: %s", df->name, msg);
    }
    int64_t n = 0;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        n += e->is_tensor && nmap_glob_match(df->text, e->name, NULL) >= 0;
    }
    ckpt_close(r);
    df->value = n;
    return 0;
}

static int eval_def(mt_dims *owner, def *df, stack *st, fsdp_err *err) {
    if (df->state == 2) return 0;
    if (df->state == 1 || st->depth >= MT_DIMS_DEPTH) {
        char path[1024];
        size_t o = 0;
        for (int i = 0; i < st->depth && o + 4 < sizeof path; i++) {
            int w = snprintf(path + o, sizeof path - o, "%s -> ", st->names[i]);
            if (w < 0) break;
            o += (size_t)w;
        }
        snprintf(path + (o < sizeof path ? o : sizeof path - 1), sizeof path - (o < sizeof path ? o : sizeof path - 1),
                 "%s", df->name);
        return fsdp_err_at(err, FSDP_E_INVALID, df->v, "model dims: %s %s (%s)", df->name,
                           df->state == 1 ? "is defined in terms of itself" : "nests too deeply", path);
    }
    df->state = 1;
    st->names[st->depth++] = df->name;
    int rc;
    if (df->kind == DEF_EXPR) rc = run_expr(owner, df->text, df->v, 1, st, &df->value, err);
    else if (df->kind == DEF_SHAPE) rc = shape_def(owner, df, err);
    else if (df->kind == DEF_COUNT) rc = count_def(owner, df, err);
    else rc = config_def(owner, df, err);
    st->depth--;
    df->state = rc ? 0 : 2;
    return rc;
}

int mt_dims_eval(mt_dims *d, const char *expr, const fsdp_value *at, int64_t *out, fsdp_err *err) {
    stack st = {{0}, 0};
    return run_expr(d, expr, at, 1, &st, out, err);
}

int mt_dims_eval_value(mt_dims *d, const fsdp_value *v, int64_t *out, fsdp_err *err) {
    if (fsdp_value_type(v) != FSDP_V_SCALAR)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: a size must be an integer or an expression of dims");
    if (fsdp_value_int(v, out) == 0) return 0;
    return mt_dims_eval(d, fsdp_value_text(v), v, out, err);
}

int mt_dims_check(mt_dims *d, const char *expr, const fsdp_value *at, fsdp_err *err) {
    stack st = {{0}, 0};
    int64_t ignored;
    return run_expr(d, expr, at, 0, &st, &ignored, err);
}

int mt_dims_check_all(mt_dims *d, fsdp_err *err) {
    for (size_t i = 0; i < d->n; i++) {
        def *df = &d->defs[i];
        if (df->kind != DEF_EXPR) continue;
        int rc = mt_dims_check(d, df->text, df->v, err);
        if (rc) return rc;
    }
    return 0;
}
