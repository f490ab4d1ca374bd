/* The `model:` section -> a model table (see mt_spec.h). Table files are read with the recipe
 * loader's YAML reader (pipeline/yaml_load.h) so that their values carry file:line:col marks and the
 * same bounds as recipes. */
#include "model/mt_spec.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/namemap.h"
#include "model/mt_checks.h"
#include "model/mt_ckpt.h"
#include "model/mt_dims.h"
#include "model/mt_from.h"
#include "model/mt_yaml.h"
#include "pipeline/yaml_load.h"
#include "runtime/fileio.h"
#include "runtime/nearest.h"

typedef enum form { FORM_ARCH = 0, FORM_PARAMS, FORM_TABLE, FORM_FROM, FORM_PARTS } form;
static const char *const FORM_KEYS[] = {NULL, "params", "table", "from", "parts"};

/* Keys each table form accepts besides its own. */
static const char *const KEYS_PARAMS[] = {"params", "dims", "dtype", "init", "prefix", "name", "checks", "trainable",
                                          NULL};
static const char *const KEYS_TABLE[] = {"table", "dims", "dtype", "init", "prefix", "name", "checks", "trainable", NULL};
static const char *const KEYS_FROM[] = {"from", "format", "strip_prefix", "keys", "exclude", "transform", "dtype",
                                        "init", "prefix", "name", "checks", "trainable", NULL};
static const char *const KEYS_PARTS[] = {"parts", "dims", "checks", NULL};
/* Keys that belong to the table form only (an arch-form section with one of them mixes the forms). */
static const char *const TABLE_ONLY[] = {"dims", "dtype", "init", "prefix", "keys", "exclude", "strip_prefix",
                                         "format", "transform", "checks", "trainable", NULL};

typedef struct builder {
    mt_table *t;
    const mt_spec_opts *o;
    mt_dims *model_dims;
    int missing; /* set by a dims scope when a config file does not exist (validate) */
    int stopped; /* validate: a source is missing; what follows is only checked */
    unsigned char *checks_done; /* the model's checks already made (mt_checks_model) */
} builder;

static int in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

static void where_of(const fsdp_value *v, char *buf, size_t cap) {
    const char *file;
    int line, col;
    fsdp_value_where(v, &file, &line, &col);
    if (v) snprintf(buf, cap, "%s:%d:%d", file, line, col);
    else buf[0] = '\0';
}

/* The form of a model map or part (one table key at most). */
static int form_of(const fsdp_value *m, form *f, fsdp_err *err) {
    *f = FORM_ARCH;
    const fsdp_value *first = NULL;
    for (int k = FORM_PARAMS; k <= FORM_PARTS; k++) {
        const fsdp_value *v = fsdp_value_get(m, FORM_KEYS[k]);
        if (!v) continue;
        if (first)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "model: '%s' and '%s' are two ways of declaring the parameters; "
                               "use one (or compose them with parts)", FORM_KEYS[*f], FORM_KEYS[k]);
        first = v;
        *f = (form)k;
    }
    return 0;
}

static int check_keys(const fsdp_value *m, form f, int is_part, fsdp_err *err) {
    const char *const *ok = f == FORM_PARAMS ? KEYS_PARAMS : f == FORM_TABLE ? KEYS_TABLE
                            : f == FORM_FROM ? KEYS_FROM : KEYS_PARTS;
    const char *ctx = is_part ? "model part" : "model";
    for (size_t i = 0; i < fsdp_value_size(m); i++) {
        const char *k = fsdp_value_key(m, i);
        if (in_list(ok, k)) continue;
        const fsdp_value *v = fsdp_value_item(m, i);
        if (!strcmp(k, "parts") && is_part) return fsdp_err_at(err, FSDP_E_INVALID, v, "model: parts do not nest");
        if (!strcmp(k, "arch") || !strcmp(k, "preset") || !strcmp(k, "from_hf"))
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "%s: '%s' is the built-in arch form, this %s is a parameter table (%s); the two forms "
                               "do not mix: put the arch in a part of its own under parts",
                               ctx, k, ctx, FORM_KEYS[f]);
        char known[256] = "";
        size_t o = 0;
        for (const char *const *q = ok; *q && o < sizeof known; q++)
            o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", o ? ", " : "", *q);
        char hint[300];
        return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: unknown key '%s'%s for a table declared with '%s' (keys: %s)",
                           ctx, k, nearest_hint(k, known, hint, sizeof hint), FORM_KEYS[f], known);
    }
    return 0;
}

/* A scalar text key (NULL when absent); an error when present but not text. */
static int text_key(const fsdp_value *m, const char *key, const char **out, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(m, key);
    *out = NULL;
    if (!v) return 0;
    if (fsdp_value_type(v) != FSDP_V_SCALAR || !fsdp_value_text(v))
        return fsdp_err_at(err, FSDP_E_INVALID, v, "model: %s must be text", key);
    *out = fsdp_value_text(v);
    return 0;
}

/* validate: a source that does not exist (yet) stops the evaluation; 1 when it did. */
static int source_missing(builder *b, const char *path) {
    if (!b->o->validate || !fio_not_there_yet(path)) return 0;
    b->stopped = 1;
    b->t->incomplete = 1;
    return 1;
}

/* After an evaluation error: a config file of the dims that does not exist yet (validate) stops
 * the evaluation instead of failing. */
static int settle(builder *b, int rc) {
    if (rc && b->missing) {
        b->missing = 0;
        b->stopped = 1;
        b->t->incomplete = 1;
        return 0;
    }
    return rc;
}

/* The model's checks (model/mt_checks.h): their syntax, the sources' and the sizes already known before
 * the parts are built, */
static int checks_before(builder *b, const fsdp_value *checks, mt_dims *d, fsdp_err *err) {
    int rc = mt_checks_syntax(checks, err);
    if (rc || !checks) return rc;
    if (!(b->checks_done = calloc(fsdp_value_size(checks) + 1, 1))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int missing = b->missing;
    rc = mt_checks_run(checks, b->t, d, 1, b->o->validate, b->checks_done, err);
    b->missing = missing; /* a source that is not there yet defers the check, it does not stop the table */
    return rc;
}

/* the others after (not when a source is missing under validate: the table is incomplete). */
static int checks_after(builder *b, const fsdp_value *checks, mt_dims *d, fsdp_err *err) {
    if (!checks || b->stopped) return 0;
    return settle(b, mt_checks_run(checks, b->t, d, 0, b->o->validate, b->checks_done, err));
}

/* ---- the parts --------------------------------------------------------------------------------- */

typedef struct part_ctx {
    builder *b;
    const fsdp_value *v; /* the part's map */
    int idx;             /* its index in the table (-1 while checking only) */
    mt_dims *dims;       /* the part's own dims, chained to the model's */
} part_ctx;

static int defaults_of(const fsdp_value *m, fsdp_dtype *dt, init_rule *init, fsdp_err *err) {
    const fsdp_value *d = fsdp_value_get(m, "dtype"), *i = fsdp_value_get(m, "init");
    int rc = 0;
    if (d) rc = mt_yaml_dtype(d, dt, err);
    if (!rc && i) rc = mt_yaml_init_rule(i, init, err);
    return rc;
}

static int params_part(part_ctx *pc, fsdp_err *err) {
    mt_yaml_ctx c;
    memset(&c, 0, sizeof c);
    c.t = pc->b->t;
    c.part = pc->idx;
    c.dims = pc->dims;
    c.eval = !pc->b->stopped;
    int rc = defaults_of(pc->v, &c.dtype, &c.init, err);
    if (!rc) rc = mt_yaml_add(&c, fsdp_value_get(pc->v, "params"), err);
    return settle(pc->b, rc);
}

/* The table file's path: relative to the file that names it, else to the working directory. */
static void table_path(const fsdp_value *v, char *out, size_t cap) {
    const char *t = fsdp_value_text(v), *file;
    fsdp_value_where(v, &file, NULL, NULL);
    snprintf(out, cap, "%s", t);
    if (t[0] == '/' || !file || !strcmp(file, "--set")) return;
    char *dup = strdup(file);
    if (!dup) return;
    char cand[PATH_MAX];
    snprintf(cand, sizeof cand, "%s/%s", dirname(dup), t);
    free(dup);
    struct stat st;
    if (stat(cand, &st) == 0) snprintf(out, cap, "%s", cand);
}

static int table_file_body(part_ctx *pc, const fsdp_value *root, fsdp_err *err) {
    static const char *const FILE_KEYS[] = {"params", "dims", "dtype", "init", NULL};
    for (size_t i = 0; i < fsdp_value_size(root); i++)
        if (!in_list(FILE_KEYS, fsdp_value_key(root, i)))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(root, i),
                               "model table file: unknown key '%s' (params, dims, dtype, init)", fsdp_value_key(root, i));
    const fsdp_value *params = fsdp_value_get(root, "params");
    if (!params) return fsdp_err_at(err, FSDP_E_INVALID, root, "model table file: no 'params'");
    mt_dims *fd;
    int rc = mt_dims_new(fsdp_value_get(root, "dims"), pc->b->t, pc->b->o->validate ? &pc->b->missing : NULL, &fd, err);
    if (rc) return rc;
    mt_dims *chain[3] = {pc->dims, pc->b->model_dims, fd};
    mt_dims_set_chain(fd, chain, 3);
    mt_yaml_ctx c;
    memset(&c, 0, sizeof c);
    c.t = pc->b->t;
    c.part = pc->idx;
    c.dims = fd;
    c.eval = !pc->b->stopped;
    /* the recipe's dtype / init win over the file's */
    rc = defaults_of(root, &c.dtype, &c.init, err);
    if (!rc) rc = defaults_of(pc->v, &c.dtype, &c.init, err);
    if (!rc) rc = mt_dims_check_all(fd, err);
    if (!rc) rc = mt_yaml_add(&c, params, err);
    mt_dims_free(fd);
    return settle(pc->b, rc);
}

static int table_part(part_ctx *pc, fsdp_err *err) {
    const fsdp_value *tv = fsdp_value_get(pc->v, "table");
    if (fsdp_value_type(tv) != FSDP_V_SCALAR || !fsdp_value_text(tv))
        return fsdp_err_at(err, FSDP_E_INVALID, tv, "model: table must be the path of a table file (YAML)");
    char path[PATH_MAX];
    table_path(tv, path, sizeof path);
    fsdp_dtype dt;
    init_rule init;
    int rc = defaults_of(pc->v, &dt, &init, err);
    if (rc) return rc;
    if (source_missing(pc->b, path)) return 0;
    fsdp_value *root;
    if ((rc = yaml_load_file(path, NULL, &root, err))) {
        char msg[FSDP_ERR_MSG_MAX - 256];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, tv, "model table file %s: %s", path, msg);
    }
    rc = table_file_body(pc, root, err);
    val_free(root);
    return rc;
}

/* The part's source and its key filters, recorded for load-ckpt `parts:` without `path`. */
static int record_source(part_ctx *pc, const char *path, ckpt_format fmt, const mt_strv *strip, const mt_strv *keys,
                         int keys_given, const mt_strv *excl, fsdp_err *err) {
    return mt_part_set_source(pc->b->t, pc->idx, path, (int)fmt, (const char *const *)strip->v, strip->n,
                              (const char *const *)keys->v, keys->n, keys_given, (const char *const *)excl->v, excl->n,
                              err);
}

/* Adds the checkpoint's tensors, then applies the part's transforms (their sizes may use dims of
 * tensors the part just declared). */
static int from_source(part_ctx *pc, const char *path, mt_ckpt_opts *o, fsdp_err *err) {
    int rc = mt_ckpt_add(pc->b->t, pc->idx, path, o, err);
    if (rc) {
        char msg[FSDP_ERR_MSG_MAX - 256];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, fsdp_value_get(pc->v, "from"), "%s", msg);
    }
    return settle(pc->b, mt_from_transforms(pc->b->t, pc->idx, fsdp_value_get(pc->v, "transform"), pc->dims, 1, err));
}

static int from_part(part_ctx *pc, fsdp_err *err) {
    mt_ckpt_opts o;
    memset(&o, 0, sizeof o);
    const char *path, *fmt;
    mt_strv strip = {0}, keys = {0}, excl = {0};
    int keys_given = 0, excl_given = 0, eval = !pc->b->stopped;
    int rc = text_key(pc->v, "from", &path, err);
    if (!rc) rc = text_key(pc->v, "format", &fmt, err);
    if (!rc) rc = mt_from_strip(fsdp_value_get(pc->v, "strip_prefix"), &strip, err);
    if (!rc && fmt && ckpt_format_from_name(fmt, &o.format))
        rc = fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(pc->v, "format"),
                         "model: format '%s' (auto, dcp, safetensors, pt)", fmt);
    const fsdp_value *dv = fsdp_value_get(pc->v, "dtype"), *iv = fsdp_value_get(pc->v, "init");
    if (!rc && dv) rc = mt_yaml_dtype(dv, &o.dtype, err);
    if (!rc && iv) rc = mt_yaml_init_rule(iv, &o.init, err);
    if (!rc) rc = settle(pc->b, mt_from_globs(fsdp_value_get(pc->v, "keys"), "keys", pc->dims, eval, &keys, &keys_given, err));
    eval = eval && !pc->b->stopped;
    if (!rc) rc = settle(pc->b, mt_from_globs(fsdp_value_get(pc->v, "exclude"), "exclude", pc->dims, eval, &excl, &excl_given, err));
    eval = eval && !pc->b->stopped;
    o.strip = (const char *const *)strip.v;
    o.n_strip = strip.n;
    o.keys = (const char *const *)keys.v;
    o.n_keys = keys.n;
    o.keys_given = keys_given;
    o.exclude = (const char *const *)excl.v;
    o.n_exclude = excl.n;
    if (!rc && !eval) rc = mt_from_transforms(pc->b->t, pc->idx, fsdp_value_get(pc->v, "transform"), pc->dims, 0, err);
    else if (!rc && !source_missing(pc->b, path)) rc = from_source(pc, path, &o, err);
    if (!rc) rc = record_source(pc, path, o.format, &strip, &keys, keys_given, &excl, err);
    mt_strv_free(&strip);
    mt_strv_free(&keys);
    mt_strv_free(&excl);
    return rc;
}

/* trainable: false on a part: every parameter it declared is a buffer (saved and loaded, never trained). */
static int part_trainable(mt_table *t, int part, const fsdp_value *m, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(m, "trainable");
    int on = 1;
    if (v && fsdp_value_bool(v, &on)) return fsdp_err_at(err, FSDP_E_INVALID, v, "model: trainable must be true or false");
    for (size_t i = 0; i < t->n && !on; i++)
        if (t->p[i].part == part) t->p[i].frozen = 1;
    return 0;
}

/* FSDP_E_INVALID at m when the caller gave no built-in architecture (a, NULL). */
static int no_arch(const mt_arch *a, const fsdp_value *m, fsdp_err *err) {
    if (a) return 0;
    return fsdp_err_at(err, FSDP_E_INVALID, m, "model: the built-in arch form (arch/preset) is not available here");
}

static int arch_part(part_ctx *pc, fsdp_err *err) {
    const mt_arch *a = pc->b->o->arch;
    int rc = no_arch(a, pc->v, err);
    if (rc) return rc;
    fsdp_value *m = val_clone(pc->v);
    if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    val_map_remove(m, "name");
    val_map_remove(m, "prefix");
    rc = a->add_part(m, pc->b->stopped ? NULL : pc->b->t, pc->idx, err);
    val_free(m);
    return rc;
}

/* The default name of a part: its prefix without the trailing dot, else part<N>. */
static void default_name(const char *prefix, size_t n, char *out, size_t cap) {
    size_t len = prefix ? strlen(prefix) : 0;
    if (len && prefix[len - 1] == '.') len--;
    if (len) snprintf(out, cap, "%.*s", (int)len, prefix);
    else snprintf(out, cap, "part%zu", n + 1);
}

static void source_of(const fsdp_value *m, form f, char *out, size_t cap) {
    const char *preset = fsdp_value_text(fsdp_value_get(m, "preset"));
    switch (f) {
    case FORM_PARAMS: snprintf(out, cap, "inline table"); break;
    case FORM_TABLE: snprintf(out, cap, "table file %s", fsdp_value_text(fsdp_value_get(m, "table"))); break;
    case FORM_FROM: snprintf(out, cap, "checkpoint %s", fsdp_value_text(fsdp_value_get(m, "from"))); break;
    default: snprintf(out, cap, "llama3 (%s%s)", preset ? "preset " : "custom", preset ? preset : ""); break;
    }
}

/* One part (a map of one form; the whole section when it is a single table form). */
static int build_part(builder *b, const fsdp_value *m, int is_part, fsdp_err *err) {
    if (fsdp_value_type(m) != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, m, "model: a part is a map (params, table, from or an arch)");
    form f;
    int rc = form_of(m, &f, err);
    if (!rc && f == FORM_PARTS) return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(m, "parts"), "model: parts do not nest");
    if (!rc && f != FORM_ARCH) rc = check_keys(m, f, is_part, err);
    if (!rc && f == FORM_ARCH && !fsdp_value_get(m, "arch") && !fsdp_value_get(m, "preset"))
        rc = fsdp_err_at(err, FSDP_E_INVALID, m, "model: a part needs params, table, from, or an arch (arch/preset)");
    const char *name = NULL, *prefix = NULL;
    if (!rc) rc = text_key(m, "name", &name, err);
    if (!rc) rc = text_key(m, "prefix", &prefix, err);
    if (rc) return rc;
    char dflt[256], source[PATH_MAX + 64], where[PATH_MAX + 64];
    if (!name && !is_part && !prefix) snprintf(dflt, sizeof dflt, "model");
    else if (!name) default_name(prefix, b->t->n_parts, dflt, sizeof dflt);
    source_of(m, f, source, sizeof source);
    where_of(m, where, sizeof where);
    part_ctx pc = {b, m, -1, NULL};
    if ((rc = mt_add_part(b->t, name ? name : dflt, prefix, source, where, &pc.idx, err))) {
        char msg[FSDP_ERR_MSG_MAX - 256];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, rc, fsdp_value_get(m, "name") ? fsdp_value_get(m, "name") : m, "%s", msg);
    }
    if (f == FORM_ARCH) return arch_part(&pc, err);
    rc = mt_dims_new(fsdp_value_get(m, "dims"), b->t, b->o->validate ? &b->missing : NULL, &pc.dims, err);
    if (rc) return rc;
    mt_dims *chain[2] = {pc.dims, b->model_dims};
    mt_dims_set_chain(pc.dims, chain, b->model_dims ? 2 : 1);
    rc = mt_dims_check_all(pc.dims, err);
    const fsdp_value *checks = fsdp_value_get(m, "checks");
    if (!rc && checks && is_part)
        rc = fsdp_err_at(err, FSDP_E_INVALID, checks, "model: checks belong to the model (beside parts), not to a part");
    if (!rc) rc = checks_before(b, checks, pc.dims, err);
    if (!rc) rc = f == FORM_PARAMS ? params_part(&pc, err) : f == FORM_TABLE ? table_part(&pc, err) : from_part(&pc, err);
    if (!rc) rc = part_trainable(b->t, pc.idx, m, err);
    if (!rc) rc = checks_after(b, checks, pc.dims, err);
    mt_dims_free(pc.dims);
    return rc;
}

int mt_spec_check_arch_keys(const fsdp_value *model, fsdp_err *err) {
    if (mt_spec_is_table(model)) return 0;
    for (size_t i = 0; i < fsdp_value_size(model); i++) {
        const char *k = fsdp_value_key(model, i);
        if (in_list(TABLE_ONLY, k) || !strcmp(k, "name"))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(model, i),
                               "model: '%s' belongs to a parameter table (params, table, from or parts), not to the "
                               "built-in arch form (arch, preset, dim, ...)",
                               k);
    }
    return 0;
}

static int arch_section(const fsdp_value *model, const mt_arch *a, mt_table *t, fsdp_err *err) {
    int rc = mt_spec_check_arch_keys(model, err);
    if (!rc) rc = no_arch(a, model, err);
    char where[PATH_MAX + 64];
    where_of(model, where, sizeof where);
    return rc ? rc : a->build(model, model ? where : NULL, t, err);
}

static void describe_kind(const fsdp_value *model, form f, mt_table *t) {
    if (f != FORM_PARTS) {
        snprintf(t->kind, sizeof t->kind, "parameter table (%s)", t->n_parts ? t->parts[0].source : "?");
        return;
    }
    size_t o = (size_t)snprintf(t->kind, sizeof t->kind, "composed model (%zu parts:", t->n_parts);
    for (size_t i = 0; i < t->n_parts && o < sizeof t->kind; i++)
        o += (size_t)snprintf(t->kind + o, sizeof t->kind - o, "%s %s", i ? "," : "", t->parts[i].name);
    if (o < sizeof t->kind) snprintf(t->kind + o, sizeof t->kind - o, ")");
    (void)model;
}

int mt_spec_is_table(const fsdp_value *model) {
    if (fsdp_value_type(model) != FSDP_V_MAP) return 0;
    for (int k = FORM_PARAMS; k <= FORM_PARTS; k++)
        if (fsdp_value_get(model, FORM_KEYS[k])) return 1;
    return 0;
}

static int table_section(const fsdp_value *model, builder *b, fsdp_err *err) {
    form f;
    int rc = form_of(model, &f, err);
    if (!rc && f != FORM_PARTS) return build_part(b, model, 0, err);
    if (!rc) rc = check_keys(model, f, 0, err);
    if (rc) return rc;
    const fsdp_value *parts = fsdp_value_get(model, "parts");
    if (fsdp_value_type(parts) != FSDP_V_LIST || !fsdp_value_size(parts))
        return fsdp_err_at(err, FSDP_E_INVALID, parts, "model: parts must be a non-empty list of parts");
    rc = mt_dims_new(fsdp_value_get(model, "dims"), b->t, b->o->validate ? &b->missing : NULL, &b->model_dims, err);
    if (!rc) rc = mt_dims_check_all(b->model_dims, err);
    const fsdp_value *checks = fsdp_value_get(model, "checks");
    if (!rc) rc = checks_before(b, checks, b->model_dims, err);
    for (size_t i = 0; i < fsdp_value_size(parts) && !rc; i++) rc = build_part(b, fsdp_value_item(parts, i), 1, err);
    if (!rc) rc = checks_after(b, checks, b->model_dims, err);
    mt_dims_free(b->model_dims);
    b->model_dims = NULL;
    return rc;
}

int mt_spec_build(const fsdp_value *model, const mt_spec_opts *o, mt_table *out, fsdp_err *err) {
    static const mt_spec_opts none = {0};
    mt_init(out);
    int rc;
    if (fsdp_value_type(model) != FSDP_V_NULL && fsdp_value_type(model) != FSDP_V_MAP)
        rc = fsdp_err_at(err, FSDP_E_INVALID, model, "model must be a map of model settings");
    else if (!mt_spec_is_table(model))
        rc = arch_section(model, o ? o->arch : NULL, out, err);
    else {
        builder b = {out, o ? o : &none, NULL, 0, 0, NULL};
        form f;
        rc = table_section(model, &b, err);
        free(b.checks_done);
        if (!rc && !b.stopped) rc = mt_finalize(out, err);
        if (!rc && !form_of(model, &f, err)) describe_kind(model, f, out);
    }
    if (rc) mt_free(out);
    return rc;
}
