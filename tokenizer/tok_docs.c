#include "tok_docs.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tok_utf8.h"

int tok_read_file(const char *file, char **buf, size_t *n, fsdp_err *err) {
    int fd;
    int rc = fio_open_read(file, NULL, &fd, err);
    if (rc) return rc;
    struct stat sb;
    if (fstat(fd, &sb)) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot stat: %s", file, strerror(errno));
    }
    *n = (size_t)sb.st_size;
    *buf = malloc(*n + 1);
    if (!*buf) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for %zu bytes", file, *n);
    }
    size_t got = 0;
    while (got < *n) {
        ssize_t r = read(fd, *buf + got, *n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            free(*buf);
            *buf = NULL;
            return fsdp_err_set(err, FSDP_E_IO, "%s: read failed after %zu of %zu bytes%s%s", file, got, *n,
                                e ? ": " : " (the file shrank)", e ? strerror(e) : "");
        }
        got += (size_t)r;
    }
    (*buf)[*n] = 0;
    close(fd);
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int tok_docs_is_jsonl(const char *path) { return ends_with(path, ".jsonl") || ends_with(path, ".ndjson"); }

int tok_docs_open_as(tok_docs *d, const char *path, const char *field, int jsonl, fsdp_err *err) {
    memset(d, 0, sizeof *d);
    snprintf(d->path, sizeof d->path, "%s", path);
    snprintf(d->field, sizeof d->field, "%s", field ? field : "text");
    d->jsonl = jsonl;
    if (d->jsonl) return fio_fopen_read(path, NULL, &d->f, err);
    return 0;
}

int tok_docs_open(tok_docs *d, const char *path, const char *field, fsdp_err *err) {
    return tok_docs_open_as(d, path, field, tok_docs_is_jsonl(path), err);
}

/* s[0..n) into t->fix, repaired when it is not UTF-8. */
static int repaired(tok_text *t, const char *s, size_t n, size_t *invalid, const char **out, size_t *on) {
    size_t ok = tok_utf8_valid(s, n);
    if (ok == n) {
        *out = s;
        *on = n;
        return 0;
    }
    size_t need = ok + 3 * (n - ok) + 1;
    if (need > t->fix_cap) {
        char *p = realloc(t->fix, need);
        if (!p) return -1;
        t->fix = p;
        t->fix_cap = need;
    }
    memcpy(t->fix, s, ok);
    size_t replaced = 0, m = ok + tok_utf8_repair(s + ok, n - ok, t->fix + ok, &replaced);
    t->fix[m] = 0;
    *invalid += replaced;
    *out = t->fix;
    *on = m;
    return 0;
}

static int text_set(tok_text *t, const char *s, size_t n) {
    if (n + 1 > t->cap) {
        char *p = realloc(t->p, n + 1);
        if (!p) return -1;
        t->p = p;
        t->cap = n + 1;
    }
    memmove(t->p, s, n);
    t->p[n] = 0;
    t->n = n;
    return 0;
}

static const char *type_name(json_t *v) {
    return json_is_null(v) ? "null" : json_is_array(v) ? "array" : json_is_object(v) ? "object"
           : json_is_boolean(v) ? "boolean" : "number";
}

int tok_doc_text(const char *path, size_t line, const char *field, int jsonl, const char *raw, size_t n, tok_text *out,
                 size_t *invalid, fsdp_err *err) {
    const char *s;
    size_t sn;
    if (repaired(out, raw, n, invalid, &s, &sn)) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    if (!jsonl) return text_set(out, s, sn) ? fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path) : 0;
    json_error_t je;
    json_t *j = json_loadb(s, sn, JSON_ALLOW_NUL, &je);
    if (!j) return fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: not a JSON line (column %d): %s", path, line, je.column, je.text);
    json_t *v = json_object_get(j, field);
    int rc = 0;
    if (!json_is_object(j)) rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: expected a JSON object", path, line);
    else if (!v)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: no field \"%s\" (data's `field:` names the text's field)", path,
                          line, field);
    else if (!json_is_string(v))
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: field \"%s\" is a %s, not a string", path, line, field, type_name(v));
    else if (text_set(out, json_string_value(v), json_string_length(v)))
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    json_decref(j);
    return rc;
}

void tok_text_free(tok_text *t) {
    free(t->p);
    free(t->fix);
    memset(t, 0, sizeof *t);
}

int tok_docs_next_raw(tok_docs *d, const char **raw, size_t *len, fsdp_err *err) {
    if (!d->jsonl) {
        if (d->done) return 0;
        d->done = 1;
        free(d->buf);
        d->buf = NULL;
        int rc = tok_read_file(d->path, &d->buf, len, err);
        if (rc) return rc;
        d->cap = *len + 1;
        *raw = d->buf;
        return 1;
    }
    for (;;) {
        errno = 0;
        ssize_t n = getline(&d->buf, &d->cap, d->f);
        if (n < 0) {
            if (ferror(d->f)) return fsdp_err_set(err, FSDP_E_IO, "%s: read failed: %s", d->path, strerror(errno));
            return 0;
        }
        d->line++;
        size_t k = (size_t)n;
        while (k && (d->buf[k - 1] == '\n' || d->buf[k - 1] == '\r' || d->buf[k - 1] == ' ' || d->buf[k - 1] == '\t')) k--;
        size_t s = 0;
        while (s < k && (d->buf[s] == ' ' || d->buf[s] == '\t')) s++;
        if (s == k) continue;
        *raw = d->buf + s;
        *len = k - s;
        return 1;
    }
}

int tok_docs_next(tok_docs *d, const char **doc, size_t *len, fsdp_err *err) {
    const char *raw;
    size_t n;
    int rc = tok_docs_next_raw(d, &raw, &n, err);
    if (rc != 1) return rc;
    rc = tok_doc_text(d->path, d->line, d->field, d->jsonl, raw, n, &d->text, &d->invalid, err);
    if (rc) return rc;
    *doc = d->text.p;
    *len = d->text.n;
    return 1;
}

void tok_docs_close(tok_docs *d) {
    if (d->f) fclose(d->f);
    free(d->buf);
    tok_text_free(&d->text);
    memset(d, 0, sizeof *d);
}
