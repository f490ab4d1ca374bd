/* A model's checks (see mt_checks.h). */
#include "model/mt_checks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "model/mt_json.h"
#include "runtime/fileio.h"

typedef enum check_kind { CHECK_PATH = 0, CHECK_CONFIG, CHECK_THAT, CHECK_HAS, CHECK_KINDS } check_kind;
static const char *const KIND_KEYS[CHECK_KINDS] = {"path", "config", "that", "has"};
/* keys each kind takes besides its own and `message` */
static const char *const EXTRA[CHECK_KINDS][3] = {{"is", NULL}, {"key", "in", NULL}, {NULL}, {NULL}};

/* Failures, one line each. */
typedef struct fails {
    char text[FSDP_ERR_MSG_MAX - 512];
    size_t len;
    int n;
} fails;

static void fail(fails *f, const fsdp_value *at, const char *msg, const char *detail) {
    const char *file;
    int line, col;
    fsdp_value_where(at, &file, &line, &col);
    if (f->len + 8 >= sizeof f->text) return;
    int w = snprintf(f->text + f->len, sizeof f->text - f->len, "\n  %s:%d:%d: %s (%s)", file, line, col, msg, detail);
    if (w > 0) f->len += (size_t)w < sizeof f->text - f->len ? (size_t)w : sizeof f->text - f->len - 1;
    f->n++;
}

static int finish(const fails *f, fsdp_err *err) {
    if (!f->n) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID, "model: %d check%s failed:%s", f->n, f->n == 1 ? "" : "s", f->text);
}

static int kind_of(const fsdp_value *c, check_kind *k, fsdp_err *err) {
    if (fsdp_value_type(c) != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, c, "model: checks: each check is a map (path, config, that or has, with "
                           "message)");
    int found = -1;
    for (int i = 0; i < CHECK_KINDS; i++) {
        if (!fsdp_value_get(c, KIND_KEYS[i])) continue;
        if (found >= 0)
            return fsdp_err_at(err, FSDP_E_INVALID, c, "model: checks: a check has one of path, config, that, has");
        found = i;
    }
    if (found < 0) return fsdp_err_at(err, FSDP_E_INVALID, c, "model: checks: a check needs path, config, that or has");
    *k = (check_kind)found;
    return 0;
}

static int check_entry_syntax(const fsdp_value *c, fsdp_err *err) {
    check_kind k;
    int rc = kind_of(c, &k, err);
    if (rc) return rc;
    for (size_t i = 0; i < fsdp_value_size(c); i++) {
        const char *key = fsdp_value_key(c, i);
        int ok = !strcmp(key, KIND_KEYS[k]) || !strcmp(key, "message");
        for (int j = 0; EXTRA[k][j] && !ok; j++) ok = !strcmp(key, EXTRA[k][j]);
        if (!ok)
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(c, i), "model: checks: unknown key '%s' in a %s check",
                               key, KIND_KEYS[k]);
    }
    const fsdp_value *msg = fsdp_value_get(c, "message"), *main = fsdp_value_get(c, KIND_KEYS[k]);
    if (!fsdp_value_text(msg) || !*fsdp_value_text(msg))
        return fsdp_err_at(err, FSDP_E_INVALID, c, "model: checks: a check needs a message (what the user did wrong)");
    if (fsdp_value_type(main) != FSDP_V_SCALAR || !fsdp_value_text(main))
        return fsdp_err_at(err, FSDP_E_INVALID, main, "model: checks: %s must be text", KIND_KEYS[k]);
    const char *is = fsdp_value_text(fsdp_value_get(c, "is"));
    if (k == CHECK_PATH && (!is || (strcmp(is, "dir") && strcmp(is, "file") && strcmp(is, "any"))))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(c, "is") ? fsdp_value_get(c, "is") : c,
                           "model: checks: a path check needs is: dir, file or any");
    if (k == CHECK_CONFIG && (!fsdp_value_text(fsdp_value_get(c, "key")) ||
                              fsdp_value_type(fsdp_value_get(c, "in")) != FSDP_V_LIST))
        return fsdp_err_at(err, FSDP_E_INVALID, c, "model: checks: a config check needs key: KEY and in: [VALUES]");
    return 0;
}

int mt_checks_syntax(const fsdp_value *checks, fsdp_err *err) {
    if (!checks) return 0;
    if (fsdp_value_type(checks) != FSDP_V_LIST)
        return fsdp_err_at(err, FSDP_E_INVALID, checks, "model: checks must be a list of checks");
    for (size_t i = 0; i < fsdp_value_size(checks); i++) {
        int rc = check_entry_syntax(fsdp_value_item(checks, i), err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- sources ------------------------------------------------------------------------------------ */


static void path_check(const fsdp_value *c, int validate, fails *f) {
    const char *path = fsdp_value_text(fsdp_value_get(c, "path")), *is = fsdp_value_text(fsdp_value_get(c, "is"));
    const char *msg = fsdp_value_text(fsdp_value_get(c, "message"));
    struct stat st;
    char detail[4400];
    if (validate && fio_not_there_yet(path)) return;
    if (!*path) {
        snprintf(detail, sizeof detail, "the path is empty");
    } else if (stat(path, &st) != 0) {
        snprintf(detail, sizeof detail, "%s: %s", path, strerror(errno));
    } else if (strcmp(is, "any") && !strcmp(is, "dir") != !!S_ISDIR(st.st_mode)) {
        snprintf(detail, sizeof detail, "%s is %s, expected a %s", path, S_ISDIR(st.st_mode) ? "a directory" : "a file",
                 !strcmp(is, "dir") ? "directory" : "file");
    } else {
        return;
    }
    fail(f, c, msg, detail);
}


/* A JSON scalar against a recipe scalar: text, number or boolean. */
static int json_equals(json_t *j, const fsdp_value *want) {
    const char *t = fsdp_value_text(want);
    double x;
    int b;
    if (!t) return 0;
    if (json_is_string(j)) return !strcmp(json_string_value(j), t);
    if (json_is_boolean(j)) return !fsdp_value_bool(want, &b) && b == json_is_true(j);
    if (json_is_number(j)) return !fsdp_value_float(want, &x) && x == json_number_value(j);
    return json_is_null(j) && !strcmp(t, "null");
}

static void config_check(const fsdp_value *c, int validate, fails *f) {
    const char *file = fsdp_value_text(fsdp_value_get(c, "config")), *key = fsdp_value_text(fsdp_value_get(c, "key"));
    const char *msg = fsdp_value_text(fsdp_value_get(c, "message"));
    const fsdp_value *in = fsdp_value_get(c, "in");
    char detail[4400];
    struct stat st;
    if (validate && fio_not_there_yet(file)) return;
    if (stat(file, &st) != 0) {
        snprintf(detail, sizeof detail, "%s: %s", file, strerror(errno));
        fail(f, c, msg, detail);
        return;
    }
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    json_t *v = root ? mt_json_at(root, key) : NULL;
    int ok = 0;
    for (size_t i = 0; v && i < fsdp_value_size(in) && !ok; i++) ok = json_equals(v, fsdp_value_item(in, i));
    if (!root) snprintf(detail, sizeof detail, "%s is not JSON: %s (line %d)", file, je.text, je.line);
    else if (!v) snprintf(detail, sizeof detail, "%s has no key %s", file, key);
    else if (!ok) {
        char *val = json_dumps(v, JSON_ENCODE_ANY);
        snprintf(detail, sizeof detail, "%s has %s = %s", file, key, val ? val : "?");
        free(val);
    }
    if (!root || !v || !ok) fail(f, c, msg, detail);
    json_decref(root);
}

/* ---- the model ---------------------------------------------------------------------------------- */

static const char *const OPS[] = {">=", "<=", "==", "!=", ">", "<", NULL};

static int compare(int64_t a, const char *op, int64_t b) {
    if (!strcmp(op, ">=")) return a >= b;
    if (!strcmp(op, "<=")) return a <= b;
    if (!strcmp(op, "==")) return a == b;
    if (!strcmp(op, "!=")) return a != b;
    if (!strcmp(op, ">")) return a > b;
    return a < b;
}

/* early: a dim it needs is not known yet (a parameter of a later part): *deferred set, nothing reported */
static int that_check(const fsdp_value *c, mt_dims *d, int early, int *deferred, fails *f, fsdp_err *err) {
    const fsdp_value *tv = fsdp_value_get(c, "that");
    const char *text = fsdp_value_text(tv), *at = NULL, *op = NULL;
    for (int i = 0; OPS[i] && !at; i++)
        if ((at = strstr(text, OPS[i]))) op = OPS[i];
    if (!at)
        return fsdp_err_at(err, FSDP_E_INVALID, tv, "model: checks: that '%s' compares nothing (==, !=, <, <=, >, >=)",
                           text);
    char lhs[512];
    snprintf(lhs, sizeof lhs, "%.*s", (int)(at - text), text);
    int64_t a, b;
    int rc = mt_dims_eval(d, lhs, tv, &a, err);
    if (!rc) rc = mt_dims_eval(d, at + strlen(op), tv, &b, err);
    if (rc && early && rc != FSDP_E_NOMEM) {
        *deferred = 1;
        fsdp_err_clear(err);
        return 0;
    }
    if (rc) return rc;
    if (compare(a, op, b)) return 0;
    char detail[700];
    snprintf(detail, sizeof detail, "%s: %lld %s %lld is false", text, (long long)a, op, (long long)b);
    fail(f, c, fsdp_value_text(fsdp_value_get(c, "message")), detail);
    return 0;
}

int mt_checks_run(const fsdp_value *checks, const mt_table *t, mt_dims *d, int early, int validate,
                  unsigned char *done, fsdp_err *err) {
    fails f;
    memset(&f, 0, sizeof f);
    for (size_t i = 0; i < fsdp_value_size(checks); i++) {
        const fsdp_value *c = fsdp_value_item(checks, i);
        check_kind k;
        int rc = kind_of(c, &k, err), deferred = 0;
        if (rc) return rc;
        if (done[i] || (early && k == CHECK_HAS)) continue;
        if (k == CHECK_PATH) path_check(c, validate, &f);
        else if (k == CHECK_CONFIG) config_check(c, validate, &f);
        else if (k == CHECK_THAT && (rc = that_check(c, d, early, &deferred, &f, err))) return rc;
        done[i] = !deferred;
        const char *name = fsdp_value_text(fsdp_value_get(c, "has"));
        if (k == CHECK_HAS && mt_find(t, name) < 0) {
            char detail[600];
            snprintf(detail, sizeof detail, "the model declares no %s", name);
            fail(&f, c, fsdp_value_text(fsdp_value_get(c, "message")), detail);
        }
    }
    return finish(&f, err);
}
