/* Recipe value tree: construction, merging, and the public read-only accessors. */
#include "pipeline/value_impl.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fsdp_value *val_new(fsdp_value_kind kind, const char *file, int line, int col) {
    fsdp_value *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->kind = kind;
    v->file = strdup(file ? file : "?");
    if (!v->file) {
        free(v);
        return NULL;
    }
    v->line = line;
    v->col = col;
    return v;
}

fsdp_value *val_scalar(const char *text, int quoted, const char *file, int line, int col) {
    fsdp_value *v = val_new(FSDP_V_SCALAR, file, line, col);
    if (!v) return NULL;
    v->text = strdup(text ? text : "");
    if (!v->text) {
        val_free(v);
        return NULL;
    }
    v->quoted = quoted;
    return v;
}

void val_free(fsdp_value *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        val_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_line);
    free(v->key_col);
    if (v->index) strmap_free(v->index);
    free(v->index);
    free(v->from_var);
    free(v->text);
    free(v->file);
    free(v);
}

static int grow(fsdp_value *v) {
    if (v->n < v->cap) return 0;
    size_t cap = v->cap ? v->cap * 2 : 4;
    fsdp_value **items = realloc(v->items, cap * sizeof *items);
    if (!items) return -1;
    v->items = items;
    if (v->kind == FSDP_V_MAP) {
        char **keys = realloc(v->keys, cap * sizeof *keys);
        if (!keys) return -1;
        v->keys = keys;
        int *kl = realloc(v->key_line, cap * sizeof *kl);
        if (!kl) return -1;
        v->key_line = kl;
        int *kc = realloc(v->key_col, cap * sizeof *kc);
        if (!kc) return -1;
        v->key_col = kc;
    }
    v->cap = cap;
    return 0;
}

const char *val_from_var(const fsdp_value *v) { return v ? v->from_var : NULL; }

fsdp_value *val_clone(const fsdp_value *v) {
    if (!v) return NULL;
    fsdp_value *c = v->kind == FSDP_V_SCALAR ? val_scalar(v->text, v->quoted, v->file, v->line, v->col)
                                             : val_new(v->kind, v->file, v->line, v->col);
    if (!c) return NULL;
    c->is_default = v->is_default;
    c->cwd_only = v->cwd_only;
    if (v->from_var && !(c->from_var = strdup(v->from_var))) {
        val_free(c);
        return NULL;
    }
    for (size_t i = 0; i < v->n; i++) {
        fsdp_value *ci = val_clone(v->items[i]);
        int rc = ci ? (v->kind == FSDP_V_MAP ? val_map_set(c, v->keys[i], ci, v->key_line[i], v->key_col[i])
                                             : val_list_push(c, ci))
                    : -1;
        if (rc) {
            val_free(c);
            return NULL;
        }
    }
    return c;
}

size_t val_count(const fsdp_value *v, int *height) {
    int h = 0;
    size_t n = v ? 1 : 0;
    for (size_t i = 0; v && i < v->n; i++) {
        int hi;
        n += val_count(v->items[i], &hi);
        if (hi + 1 > h) h = hi + 1;
    }
    if (height) *height = h;
    return n;
}

int val_list_push(fsdp_value *list, fsdp_value *item) {
    if (grow(list)) {
        val_free(item);
        return -1;
    }
    list->items[list->n++] = item;
    return 0;
}

long val_map_find(const fsdp_value *map, const char *key) {
    if (!map || map->kind != FSDP_V_MAP) return -1;
    if (map->index) {
        size_t i;
        return strmap_get(map->index, key, &i) ? (long)i : -1;
    }
    for (size_t i = 0; i < map->n; i++)
        if (!strcmp(map->keys[i], key)) return (long)i;
    return -1;
}

/* Drops the map's index and builds it again from its keys when it is large enough. Out of memory
 * leaves the map without an index: lookups scan then, slower but correct. */
static void reindex(fsdp_value *map) {
    if (map->index) strmap_free(map->index);
    free(map->index);
    map->index = NULL;
    if (map->n < VAL_INDEX_MIN) return;
    strmap *m = malloc(sizeof *m);
    if (!m) return;
    strmap_init(m);
    for (size_t i = 0; i < map->n; i++) {
        if (strmap_put(m, map->keys[i], i)) {
            strmap_free(m);
            free(m);
            return;
        }
    }
    map->index = m;
}

int val_map_set(fsdp_value *map, const char *key, fsdp_value *item, int key_line, int key_col) {
    long i = val_map_find(map, key);
    if (i >= 0) {
        val_free(map->items[i]);
        map->items[i] = item;
        map->key_line[i] = key_line;
        map->key_col[i] = key_col;
        return 0;
    }
    char *k = strdup(key);
    if (!k || grow(map)) {
        free(k);
        val_free(item);
        return -1;
    }
    if (map->index && strmap_put(map->index, k, map->n)) {
        free(k);
        val_free(item);
        return -1;
    }
    map->keys[map->n] = k;
    map->key_line[map->n] = key_line;
    map->key_col[map->n] = key_col;
    map->items[map->n++] = item;
    if (map->n == VAL_INDEX_MIN && !map->index) reindex(map);
    return 0;
}

int val_map_remove(fsdp_value *map, const char *key) {
    long i = val_map_find(map, key);
    if (i < 0) return 0;
    val_free(map->items[i]);
    free(map->keys[i]);
    for (size_t j = (size_t)i + 1; j < map->n; j++) {
        map->items[j - 1] = map->items[j];
        map->keys[j - 1] = map->keys[j];
        map->key_line[j - 1] = map->key_line[j];
        map->key_col[j - 1] = map->key_col[j];
    }
    map->n--;
    reindex(map);
    return 1;
}

int val_set_text(fsdp_value *v, const char *text) {
    char *t = strdup(text);
    if (!t) return -1;
    free(v->text);
    v->text = t;
    return 0;
}

fsdp_value *val_get_mut(fsdp_value *map, const char *key) {
    long i = val_map_find(map, key);
    return i < 0 ? NULL : map->items[i];
}

fsdp_value *val_merge(fsdp_value *dst, fsdp_value *src) {
    if (!dst) return src;
    if (!src) return dst;
    if (dst->kind != FSDP_V_MAP || src->kind != FSDP_V_MAP) {
        val_free(dst);
        return src;
    }
    for (size_t i = 0; i < src->n; i++) {
        long j = val_map_find(dst, src->keys[i]);
        fsdp_value *s = src->items[i];
        src->items[i] = NULL;
        if (j >= 0) {
            dst->items[j] = val_merge(dst->items[j], s);
        } else if (val_map_set(dst, src->keys[i], s, src->key_line[i], src->key_col[i])) {
            val_free(src);
            return dst;
        }
    }
    val_free(src);
    return dst;
}

int val_text_is_null(const char *t) {
    return !t || !*t || !strcmp(t, "~") || !strcmp(t, "null") || !strcmp(t, "Null") || !strcmp(t, "NULL");
}

int val_text_is_word(const char *t) {
    size_t n = 0;
    for (; t[n]; n++) {
        char c = t[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("_.-*/", c);
        if (!ok || n >= VAL_WORD_MAX) return 0;
    }
    return n > 0;
}

/* ---- flow text ------------------------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static int needs_quotes(const char *t) {
    if (!*t) return 1;
    if (strpbrk(t, ",:[]{}#&*!|>'\"%@`\n\t") || isspace((unsigned char)t[0]) ||
        isspace((unsigned char)t[strlen(t) - 1]))
        return 1;
    return 0;
}

static void flow(sbuf *b, const fsdp_value *v) {
    switch (v ? v->kind : FSDP_V_NULL) {
    case FSDP_V_NULL: sb_str(b, "null"); break;
    case FSDP_V_SCALAR:
        if (needs_quotes(v->text) || (v->quoted && val_text_is_null(v->text))) {
            sb_str(b, "\"");
            for (const char *p = v->text; *p; p++) {
                if (*p == '"' || *p == '\\') sb_str(b, "\\");
                if (*p == '\n') {
                    sb_str(b, "\\n");
                    continue;
                }
                sb_put(b, p, 1);
            }
            sb_str(b, "\"");
        } else {
            sb_str(b, v->text);
        }
        break;
    case FSDP_V_LIST:
        sb_str(b, "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i) sb_str(b, ", ");
            flow(b, v->items[i]);
        }
        sb_str(b, "]");
        break;
    case FSDP_V_MAP:
        sb_str(b, "{");
        for (size_t i = 0; i < v->n; i++) {
            if (i) sb_str(b, ", ");
            sb_str(b, v->keys[i]);
            sb_str(b, ": ");
            flow(b, v->items[i]);
        }
        sb_str(b, "}");
        break;
    }
}

char *val_to_flow(const fsdp_value *v) {
    sbuf b = {0};
    flow(&b, v);
    if (b.oom) {
        free(b.buf);
        return NULL;
    }
    if (!b.buf) return strdup("");
    return b.buf;
}

/* ---- public accessors ------------------------------------------------------ */

fsdp_value_kind fsdp_value_type(const fsdp_value *v) {
    if (!v) return FSDP_V_NULL;
    if (v->kind == FSDP_V_SCALAR && !v->quoted && val_text_is_null(v->text)) return FSDP_V_NULL;
    return v->kind;
}

const char *fsdp_value_text(const fsdp_value *v) {
    return fsdp_value_type(v) == FSDP_V_SCALAR ? v->text : NULL;
}

int fsdp_value_quoted(const fsdp_value *v) { return fsdp_value_type(v) == FSDP_V_SCALAR && v->quoted; }

size_t fsdp_value_size(const fsdp_value *v) {
    return v && (v->kind == FSDP_V_LIST || v->kind == FSDP_V_MAP) ? v->n : 0;
}

const fsdp_value *fsdp_value_item(const fsdp_value *v, size_t i) {
    return v && (v->kind == FSDP_V_LIST || v->kind == FSDP_V_MAP) && i < v->n ? v->items[i] : NULL;
}

const char *fsdp_value_key(const fsdp_value *map, size_t i) {
    return map && map->kind == FSDP_V_MAP && i < map->n ? map->keys[i] : NULL;
}

const fsdp_value *fsdp_value_get(const fsdp_value *map, const char *key) {
    long i = val_map_find(map, key);
    return i < 0 ? NULL : map->items[i];
}

const fsdp_value *fsdp_value_path(const fsdp_value *root, const char *dotted) {
    const fsdp_value *v = root;
    const char *p = dotted;
    char part[256];
    while (v && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof part) return NULL;
        memcpy(part, p, n);
        part[n] = '\0';
        v = fsdp_value_get(v, part);
        p = dot ? dot + 1 : p + n;
    }
    return v;
}

int fsdp_value_int(const fsdp_value *v, int64_t *out) {
    const char *t = fsdp_value_text(v);
    if (!t) return -1;
    const char *s = t;
    while (*s == ' ') s++;
    if (!*s) return -1;
    char *end;
    errno = 0;
    long long x;
    if ((s[0] == '0' && (s[1] == 'x' || s[1] == 'X')))
        x = strtoll(s, &end, 16);
    else {
        /* accept underscores as digit separators (1_000_000), as YAML 1.1 does */
        char tmp[64];
        size_t k = 0;
        for (const char *q = s; *q && k + 1 < sizeof tmp; q++)
            if (*q != '_') tmp[k++] = *q;
        tmp[k] = '\0';
        if (strlen(s) >= sizeof tmp) return -1;
        x = strtoll(tmp, &end, 10);
        if (errno || end == tmp) return -1;
        while (*end == ' ') end++;
        if (*end) return -1;
        *out = x;
        return 0;
    }
    if (errno || end == s) return -1;
    while (*end == ' ') end++;
    if (*end) return -1;
    *out = x;
    return 0;
}

int fsdp_value_float(const fsdp_value *v, double *out) { return val_text_float(fsdp_value_text(v), out); }

int val_text_float(const char *t, double *out) {
    if (!t) return -1;
    while (*t == ' ') t++;
    if (!strcmp(t, ".inf") || !strcmp(t, ".Inf") || !strcmp(t, ".INF") || !strcmp(t, "+.inf")) {
        *out = INFINITY;
        return 0;
    }
    if (!strcmp(t, "-.inf") || !strcmp(t, "-.Inf") || !strcmp(t, "-.INF")) {
        *out = -INFINITY;
        return 0;
    }
    if (!strcmp(t, ".nan") || !strcmp(t, ".NaN") || !strcmp(t, ".NAN")) {
        *out = NAN;
        return 0;
    }
    if (!*t || isalpha((unsigned char)*t)) return -1; /* reject "inf", "nan", words */
    char *end;
    errno = 0;
    double x = strtod(t, &end);
    if (errno == ERANGE && x != 0) return -1;
    if (end == t) return -1;
    while (*end == ' ') end++;
    if (*end) return -1;
    for (const char *q = t; *q; q++)
        if (*q == 'x' || *q == 'X' || *q == 'n' || *q == 'N' || *q == 'i' || *q == 'I') return -1;
    *out = x;
    return 0;
}

int fsdp_value_bool(const fsdp_value *v, int *out) { return val_text_bool(fsdp_value_text(v), out); }

int val_text_bool(const char *t, int *out) {
    if (!t) return -1;
    static const char *yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (!strcmp(t, yes[i])) {
            *out = 1;
            return 0;
        }
        if (!strcmp(t, no[i])) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

void fsdp_value_where(const fsdp_value *v, const char **file, int *line, int *col) {
    if (file) *file = v ? v->file : "?";
    if (line) *line = v ? v->line : 0;
    if (col) *col = v ? v->col : 0;
}

int fsdp_err_at(fsdp_err *err, int code, const fsdp_value *v, const char *fmt, ...) {
    char msg[FSDP_ERR_MSG_MAX - 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* a value given whole by a recipe var: the knob the user turns is the var (unless the message says so) */
    char knob[256] = "";
    if (v && v->from_var && !strstr(msg, "vars."))
        snprintf(knob, sizeof knob, " (this value is the recipe's var %.64s: --set vars.%.64s=... changes it)", v->from_var,
                 v->from_var);
    if (v)
        return fsdp_err_set(err, code, "%.400s:%d:%d: %s%s", v->file, v->line, v->col, msg, knob);
    return fsdp_err_set(err, code, "%s", msg);
}

const char *fsdp_arg_str(const fsdp_value *with, const char *key, const char *dflt) {
    const char *t = fsdp_value_text(fsdp_value_get(with, key));
    return t ? t : dflt;
}

int64_t fsdp_arg_int(const fsdp_value *with, const char *key, int64_t dflt) {
    int64_t x;
    return fsdp_value_int(fsdp_value_get(with, key), &x) == 0 ? x : dflt;
}

double fsdp_arg_float(const fsdp_value *with, const char *key, double dflt) {
    double x;
    return fsdp_value_float(fsdp_value_get(with, key), &x) == 0 ? x : dflt;
}

int fsdp_arg_bool(const fsdp_value *with, const char *key, int dflt) {
    int x;
    return fsdp_value_bool(fsdp_value_get(with, key), &x) == 0 ? x : dflt;
}
