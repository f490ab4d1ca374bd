/* ${var} and ${env:NAME} substitution.
 *
 * Each variable is resolved once, in place in the `vars` map, and every later reference reads the
 * resolved value: the work is proportional to what the substitution produces, and that is bounded
 * (one value at most VARS_MAX_TEXT bytes, the whole recipe VARS_MAX_WORK bytes; copies of list and
 * map variables count against the recipe's value budget). A variable's nesting level is 1 + the
 * deepest level it references; a chain of more than VARS_MAX_DEPTH variables is an error of its
 * own, distinct from a cycle ("refers to itself"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/recipe.h"
#include "runtime/nearest.h"

typedef enum { VS_TODO = 0, VS_BUSY, VS_DONE } var_state;

typedef struct {
    var_state state;
    int level;   /* 1 + the deepest level referenced (done variables) */
    long deeper; /* the referenced variable of that deepest level, or -1 */
} var_slot;

typedef struct {
    fsdp_value *vars; /* the `vars` map, resolved in place (NULL: none) */
    var_slot *slots;  /* one per entry of vars */
    size_t busy[VARS_MAX_DEPTH]; /* the variables being resolved, outermost first */
    int n_busy;
    size_t work; /* bytes produced by substitutions so far */
    val_budget *budget;
    fsdp_err *err;
} vars_ctx;

/* What one ${...} reference stands for. */
typedef struct {
    const char *text;       /* a scalar's text, or NULL */
    char *owned;            /* text when it is an environment value (freed by the caller) */
    const fsdp_value *node; /* a list or map variable */
    int level;              /* the variable's level (0 for the environment) */
    long index;             /* the variable, -1 for the environment */
    int cwd_only;           /* its value came from --set or the environment (recipe_paths.c) */
} var_ref;

static int subst_text(vars_ctx *vc, fsdp_value *where, const char *text, char **out, const fsdp_value **whole,
                      int *level, long *deeper);
static int subst_tree(vars_ctx *vc, fsdp_value *v, int *level, long *deeper);

/* "${a} -> ${b} -> ..." into buf. */
static void chain_add(char *buf, size_t cap, size_t *off, const char *name) {
    if (*off >= cap) return;
    int k = snprintf(buf + *off, cap - *off, "%s${%s}", *off ? " -> " : "", name);
    if (k > 0) *off += (size_t)k;
}

/* ${env:NAME} is the environment variable NAME (an error when unset), ${env:NAME:-default} the
 * default when NAME is unset or empty: per-rank or per-job paths under mpirun/srun, e.g.
 * ${env:OMPI_COMM_WORLD_RANK} or ${env:SLURM_JOB_ID}. The value is taken literally. */
static int env_value(const fsdp_value *where, const char *spec, char **out, fsdp_err *err) {
    char name[128];
    const char *dflt = strstr(spec, ":-");
    size_t nlen = dflt ? (size_t)(dflt - spec) : strlen(spec);
    if (nlen == 0 || nlen >= sizeof name)
        return fsdp_err_at(err, FSDP_E_INVALID, where, "bad environment reference '${env:%s}'", spec);
    memcpy(name, spec, nlen);
    name[nlen] = '\0';
    for (size_t i = 0; i < nlen; i++)
        if (!(name[i] == '_' || (name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= 'a' && name[i] <= 'z') ||
              (i > 0 && name[i] >= '0' && name[i] <= '9')))
            return fsdp_err_at(err, FSDP_E_INVALID, where,
                               "bad environment variable name '%s' in '${env:%s}' (letters, digits, '_')", name, spec);
    const char *v = getenv(name);
    if (!v || (!*v && dflt)) {
        if (!dflt)
            return fsdp_err_at(err, FSDP_E_INVALID, where,
                               "environment variable %s is not set (referenced as '${env:%s}'; "
                               "give a default with '${env:%s:-value}')",
                               name, spec, name);
        v = dflt + 2;
    }
    *out = strdup(v);
    return *out ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
}

/* The chain: the variables being resolved, then i, then from `from` on the deepest references of
 * resolved variables. */
static int nested_too_deep(vars_ctx *vc, const fsdp_value *where, size_t i, long from) {
    char chain[1024] = "";
    size_t off = 0;
    for (int k = 0; k < vc->n_busy; k++) chain_add(chain, sizeof chain, &off, vc->vars->keys[vc->busy[k]]);
    chain_add(chain, sizeof chain, &off, vc->vars->keys[i]);
    for (long j = from; j >= 0 && vc->slots[j].state == VS_DONE; j = vc->slots[j].deeper)
        chain_add(chain, sizeof chain, &off, vc->vars->keys[j]);
    return fsdp_err_at(vc->err, FSDP_E_INVALID, where, "variables nested deeper than %d: %s", VARS_MAX_DEPTH, chain);
}

/* Resolves variable i in place (once). */
static int resolve(vars_ctx *vc, size_t i, const fsdp_value *where) {
    var_slot *sl = &vc->slots[i];
    if (sl->state == VS_DONE) return 0;
    if (sl->state == VS_BUSY) {
        char chain[1024] = "";
        size_t off = 0;
        int k = 0;
        while (k < vc->n_busy && vc->busy[k] != i) k++;
        for (; k < vc->n_busy; k++) chain_add(chain, sizeof chain, &off, vc->vars->keys[vc->busy[k]]);
        chain_add(chain, sizeof chain, &off, vc->vars->keys[i]);
        return fsdp_err_at(vc->err, FSDP_E_INVALID, where, "variable '${%s}' refers to itself: %s", vc->vars->keys[i],
                           chain);
    }
    if (vc->n_busy == VARS_MAX_DEPTH) return nested_too_deep(vc, where, i, -1);
    sl->state = VS_BUSY;
    vc->busy[vc->n_busy++] = i;
    fsdp_value *v = vc->vars->items[i];
    int level = 0, rc = 0;
    long deeper = -1;
    if (v->kind == FSDP_V_LIST || v->kind == FSDP_V_MAP) {
        rc = subst_tree(vc, v, &level, &deeper);
    } else if (v->kind == FSDP_V_SCALAR && strchr(v->text, '$')) {
        char *t = NULL;
        const fsdp_value *whole = NULL;
        rc = subst_text(vc, v, v->text, &t, &whole, &level, &deeper);
        if (!rc && whole) {
            /* the variable is another list or map variable */
            size_t n = val_count(whole, NULL);
            if (n > VAL_MAX_COPIES - vc->budget->copies) {
                rc = fsdp_err_at(vc->err, FSDP_E_INVALID, v, "the recipe expands to more than %d values (${var} copies)",
                                 VAL_MAX_COPIES);
            } else {
                fsdp_value *c = val_clone(whole);
                if (!c) {
                    rc = fsdp_err_set(vc->err, FSDP_E_NOMEM, "out of memory");
                } else {
                    vc->budget->copies += n;
                    val_free(v);
                    vc->vars->items[i] = c;
                }
            }
        } else if (!rc) {
            free(v->text);
            v->text = t;
        }
    }
    vc->n_busy--;
    if (rc) return rc;
    if (level + 1 > VARS_MAX_DEPTH) return nested_too_deep(vc, where, i, deeper);
    sl->level = level + 1;
    sl->deeper = deeper;
    sl->state = VS_DONE;
    return 0;
}

static int lookup(vars_ctx *vc, const fsdp_value *where, const char *name, var_ref *ref) {
    memset(ref, 0, sizeof *ref);
    ref->index = -1;
    if (strncmp(name, "env:", 4) == 0) {
        int rc = env_value(where, name + 4, &ref->owned, vc->err);
        ref->text = ref->owned;
        ref->cwd_only = 1;
        return rc;
    }
    long i = val_map_find(vc->vars, name);
    if (i < 0) {
        char known[512] = "";
        size_t off = 0;
        for (size_t k = 0; k < fsdp_value_size(vc->vars) && off < sizeof known; k++)
            off += (size_t)snprintf(known + off, sizeof known - off, "%s%s", k ? ", " : "", vc->vars->keys[k]);
        char hint[300];
        return fsdp_err_at(vc->err, FSDP_E_INVALID, where, "undefined variable '${%s}'%s (defined in vars: %s)", name,
                           nearest_hint(name, known, hint, sizeof hint), off ? known : "none");
    }
    int rc = resolve(vc, (size_t)i, where);
    if (rc) return rc;
    const fsdp_value *v = vc->vars->items[i];
    ref->index = i;
    ref->level = vc->slots[i].level;
    ref->cwd_only = v->cwd_only || (v->file && !strncmp(v->file, "--set", 5));
    if (v->kind == FSDP_V_LIST || v->kind == FSDP_V_MAP)
        ref->node = v;
    else
        ref->text = v->kind == FSDP_V_SCALAR ? v->text : "";
    return 0;
}

typedef struct {
    char *buf;
    size_t len, cap;
} tbuf;

static int tbuf_put(vars_ctx *vc, const fsdp_value *where, tbuf *b, const char *s, size_t n, const char *name) {
    if (n > VARS_MAX_TEXT - b->len)
        return fsdp_err_at(vc->err, FSDP_E_INVALID, where,
                           "substituting variables makes a value longer than %d bytes (at '${%s}')", VARS_MAX_TEXT,
                           name ? name : "...");
    if (n > VARS_MAX_WORK - vc->work)
        return fsdp_err_at(vc->err, FSDP_E_INVALID, where,
                           "substituting variables produces more than %d bytes in all (the recipe's ${var} references)",
                           VARS_MAX_WORK);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) return fsdp_err_set(vc->err, FSDP_E_NOMEM, "out of memory");
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
    vc->work += n;
    return 0;
}

/* Reads the name of the reference at p ("${name}") into name; returns the position after '}'. */
static const char *ref_name(vars_ctx *vc, const fsdp_value *where, const char *text, const char *p, char *name,
                            size_t cap, int *rc) {
    const char *end = strchr(p + 2, '}');
    if (!end) {
        *rc = fsdp_err_at(vc->err, FSDP_E_INVALID, where, "unterminated '${' in '%.200s'", text);
        return NULL;
    }
    size_t nlen = (size_t)(end - p - 2);
    if (nlen == 0 || nlen >= cap) {
        *rc = fsdp_err_at(vc->err, FSDP_E_INVALID, where, "bad variable reference in '%.200s'", text);
        return NULL;
    }
    memcpy(name, p + 2, nlen);
    name[nlen] = '\0';
    return end + 1;
}

/* Expands ${name} in text into *out. If the whole text is one reference to a list/map variable,
 * *whole is set to it and *out is NULL. `$${` is a literal `${`. *level and *deeper follow the
 * deepest variable referenced. */
static int subst_text(vars_ctx *vc, fsdp_value *where, const char *text, char **out, const fsdp_value **whole,
                      int *level, long *deeper) {
    tbuf b = {0};
    const char *p = text;
    int rc = 0;
    *whole = NULL;
    *out = NULL;
    while (*p && !rc) {
        if (p[0] == '$' && p[1] == '$' && p[2] == '{') {
            rc = tbuf_put(vc, where, &b, "${", 2, NULL);
            p += 3;
            continue;
        }
        if (!(p[0] == '$' && p[1] == '{')) {
            const char *q = strchr(p + 1, '$');
            size_t n = q ? (size_t)(q - p) : strlen(p);
            rc = tbuf_put(vc, where, &b, p, n, NULL);
            p += n;
            continue;
        }
        char name[128];
        const char *after = ref_name(vc, where, text, p, name, sizeof name, &rc);
        if (!after) break;
        var_ref ref;
        if ((rc = lookup(vc, where, name, &ref))) break;
        if (ref.level > *level) {
            *level = ref.level;
            *deeper = ref.index;
        }
        if (ref.node) {
            if (p == text && *after == '\0') {
                free(b.buf);
                *whole = ref.node;
                return 0;
            }
            rc = fsdp_err_at(vc->err, FSDP_E_INVALID, where,
                             "variable '${%s}' is a list or map and can only stand alone as a value", name);
            break;
        }
        if (p == text && ref.cwd_only) where->cwd_only = 1; /* a path led by it is the working directory's */
        rc = tbuf_put(vc, where, &b, ref.text, strlen(ref.text), name);
        free(ref.owned);
        p = after;
    }
    if (rc) {
        free(b.buf);
        return rc;
    }
    *out = b.buf ? b.buf : strdup("");
    return *out ? 0 : fsdp_err_set(vc->err, FSDP_E_NOMEM, "out of memory");
}

/* Substitutes the scalar v->items[i]. */
static int subst_item(vars_ctx *vc, fsdp_value *v, size_t i, int *level, long *deeper) {
    fsdp_value *c = v->items[i];
    char *t;
    const fsdp_value *whole;
    /* exactly "${NAME}" (no env:, nothing around it): the var the user sets for this value */
    size_t tl = strlen(c->text);
    char *var = tl > 3 && !strncmp(c->text, "${", 2) && c->text[tl - 1] == '}' && !strchr(c->text + 2, '$') &&
                        strncmp(c->text + 2, "env:", 4)
                    ? strndup(c->text + 2, tl - 3)
                    : NULL;
    int rc = subst_text(vc, c, c->text, &t, &whole, level, deeper);
    if (rc) return free(var), rc;
    if (!whole) {
        free(c->text);
        c->text = t;
        free(c->from_var);
        c->from_var = var;
        return 0;
    }
    size_t n = val_count(whole, NULL);
    if (n > VAL_MAX_COPIES - vc->budget->copies)
        return free(var), fsdp_err_at(vc->err, FSDP_E_INVALID, c,
                           "the recipe expands to more than %d values (${var} copies: this one copies %zu, %zu copied "
                           "before it)",
                           VAL_MAX_COPIES, n, vc->budget->copies);
    fsdp_value *cl = val_clone(whole);
    char *file = strdup(c->file);
    if (!cl || !file) {
        val_free(cl);
        free(file);
        free(var);
        return fsdp_err_set(vc->err, FSDP_E_NOMEM, "out of memory");
    }
    vc->budget->copies += n;
    free(cl->file);
    cl->file = file;
    free(cl->from_var);
    cl->from_var = var;
    cl->line = c->line;
    cl->col = c->col;
    val_free(c);
    v->items[i] = cl;
    return 0;
}

static int subst_tree(vars_ctx *vc, fsdp_value *v, int *level, long *deeper) {
    for (size_t i = 0; i < v->n; i++) {
        fsdp_value *c = v->items[i];
        int rc = 0;
        if (c->kind == FSDP_V_SCALAR && strchr(c->text, '$'))
            rc = subst_item(vc, v, i, level, deeper);
        else if (c->kind == FSDP_V_LIST || c->kind == FSDP_V_MAP)
            rc = subst_tree(vc, c, level, deeper);
        if (rc) return rc;
    }
    return 0;
}

int recipe_substitute_vars(fsdp_value *root, val_budget *budget, fsdp_err *err) {
    fsdp_value *vars = val_get_mut(root, "vars");
    if (vars && fsdp_value_type(vars) != FSDP_V_NULL && vars->kind != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, vars, "vars: expected a map of name: value");
    val_budget local = {0, 0};
    vars_ctx vc = {0};
    vc.vars = vars && vars->kind == FSDP_V_MAP ? vars : NULL;
    vc.budget = budget ? budget : &local;
    vc.err = err;
    if (vc.vars && vc.vars->n && !(vc.slots = calloc(vc.vars->n, sizeof *vc.slots)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0, level = 0;
    long deeper = -1;
    /* the variables among themselves first (each once), then everything else */
    for (size_t i = 0; vc.vars && i < vc.vars->n && !rc; i++) rc = resolve(&vc, i, vc.vars->items[i]);
    for (size_t i = 0; i < root->n && !rc; i++) {
        if (root->items[i] == vars) continue;
        fsdp_value *c = root->items[i];
        if (c->kind == FSDP_V_SCALAR && strchr(c->text, '$'))
            rc = subst_item(&vc, root, i, &level, &deeper);
        else if (c->kind == FSDP_V_LIST || c->kind == FSDP_V_MAP)
            rc = subst_tree(&vc, c, &level, &deeper);
    }
    free(vc.slots);
    return rc;
}
