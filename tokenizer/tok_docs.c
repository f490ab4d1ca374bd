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

int tok_docs_open(tok_docs *d, const char *path, const char *field, fsdp_err *err) {
    memset(d, 0, sizeof *d);
    snprintf(d->path, sizeof d->path, "%s", path);
    snprintf(d->field, sizeof d->field, "%s", field ? field : "text");
    d->jsonl = tok_docs_is_jsonl(path);
    if (d->jsonl) return fio_fopen_read(path, NULL, &d->f, err);
    return 0;
}

/* The text in d->text, repaired when it is not UTF-8. */
static int set_text(tok_docs *d, const char *s, size_t n, fsdp_err *err) {
    size_t ok = tok_utf8_valid(s, n);
    size_t need = ok == n ? n + 1 : ok + 3 * (n - ok) + 1;
    if (need > d->fix_cap) {
        char *p = realloc(d->fix, need);
        if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", d->path);
        d->fix = p;
        d->fix_cap = need;
    }
    memcpy(d->fix, s, ok);
    size_t m = ok, replaced = 0;
    if (ok < n) m += tok_utf8_repair(s + ok, n - ok, d->fix + ok, &replaced);
    d->fix[m] = 0;
    d->invalid += replaced;
    d->text = d->fix;
    d->text_n = m;
    return 0;
}

static int next_text(tok_docs *d, const char **doc, size_t *len, fsdp_err *err) {
    if (d->done) return 0;
    d->done = 1;
    char *buf;
    size_t n;
    int rc = tok_read_file(d->path, &buf, &n, err);
    if (rc) return rc;
    rc = set_text(d, buf, n, err);
    free(buf);
    if (rc) return rc;
    *doc = d->text;
    *len = d->text_n;
    return 1;
}

static int field_of(tok_docs *d, const char *line, size_t n, const char **doc, size_t *len, fsdp_err *err) {
    json_error_t je;
    json_t *j = json_loadb(line, n, JSON_ALLOW_NUL, &je);
    if (!j)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: not a JSON line (column %d): %s", d->path, d->line, je.column,
                            je.text);
    json_t *v = json_object_get(j, d->field);
    int rc = 0;
    if (!json_is_object(j)) rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: expected a JSON object", d->path, d->line);
    else if (!v)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: no field \"%s\" (data's `field:` names the text's field)",
                          d->path, d->line, d->field);
    else if (!json_is_string(v))
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: field \"%s\" is a %s, not a string", d->path, d->line, d->field,
                          json_is_null(v) ? "null" : json_is_array(v) ? "array" : json_is_object(v) ? "object" : "number");
    if (!rc) {
        size_t vn = json_string_length(v);
        if (vn + 1 > d->cap) { /* the value goes where the line was */
            char *p = realloc(d->buf, vn + 1);
            if (!p) rc = fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", d->path);
            else {
                d->buf = p;
                d->cap = vn + 1;
            }
        }
        if (!rc) {
            memcpy(d->buf, json_string_value(v), vn);
            d->buf[vn] = 0;
            *doc = d->buf;
            *len = vn;
        }
    }
    json_decref(j);
    return rc;
}

int tok_docs_next(tok_docs *d, const char **doc, size_t *len, fsdp_err *err) {
    if (!d->jsonl) return next_text(d, doc, len, err);
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
        int rc = set_text(d, d->buf + s, k - s, err);
        if (rc) return rc;
        rc = field_of(d, d->text, d->text_n, doc, len, err);
        return rc ? rc : 1;
    }
}

void tok_docs_close(tok_docs *d) {
    if (d->f) fclose(d->f);
    free(d->buf);
    free(d->fix);
    memset(d, 0, sizeof *d);
}
