/* One-pass JSON tokens of a safetensors header (see safetensors_json.h). */
#include "ckpt/safetensors_json.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int stj_init(stj *j, const unsigned char *s, size_t n, const char *path, fsdp_err *err) {
    memset(j, 0, sizeof *j);
    j->s = s;
    j->n = n;
    j->path = path;
    j->arena = (char *)malloc(n + 1);
    if (!j->arena) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for a %zu-byte header", path, n);
    return FSDP_OK;
}

int stj_fail(const stj *j, size_t at, fsdp_err *err, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: invalid JSON header: %s (header byte %zu)", j->path, what, at);
}

int stj_peek(stj *j) {
    while (j->pos < j->n) {
        unsigned char c = j->s[j->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return c;
        j->pos++;
    }
    return -1;
}

int stj_need(stj *j, fsdp_err *err) {
    return stj_peek(j) < 0 ? stj_fail(j, j->pos, err, "a value expected, the header ends (truncated?)") : FSDP_OK;
}

int stj_expect(stj *j, char c, const char *what, fsdp_err *err) {
    if (stj_peek(j) != (unsigned char)c) {
        if (j->pos >= j->n) return stj_fail(j, j->pos, err, "%s expected, the header ends (truncated?)", what);
        return stj_fail(j, j->pos, err, "%s expected", what);
    }
    j->pos++;
    return FSDP_OK;
}

int stj_sep(stj *j, char close, int *closed, const char *what, const char *name, fsdp_err *err) {
    int c = stj_peek(j);
    if (c != ',' && c != (unsigned char)close)
        return stj_fail(j, j->pos, err, "',' or '%c' expected %s%s%s%s%s", close, what, name ? " '" : "",
                        name ? name : "", name ? "'" : "", c < 0 ? ", the header ends (truncated?)" : "");
    j->pos++;
    *closed = c != ',';
    return FSDP_OK;
}

/* Length of the well-formed UTF-8 sequence at p (avail bytes there), 0 when it is not one:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_len(const unsigned char *p, size_t avail) {
    unsigned char c = p[0];
    size_t len;
    uint32_t v;
    if (c >= 0xc2 && c <= 0xdf) len = 2, v = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, v = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, v = c & 0x07;
    else return 0;
    if (len > avail) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (p[i] & 0x3f);
    }
    if ((len == 3 && v < 0x800) || (len == 4 && v < 0x10000) || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    return len;
}

static size_t put_utf8(char *d, uint32_t v) {
    if (v < 0x80) {
        d[0] = (char)v;
        return 1;
    }
    if (v < 0x800) {
        d[0] = (char)(0xc0 | (v >> 6));
        d[1] = (char)(0x80 | (v & 0x3f));
        return 2;
    }
    if (v < 0x10000) {
        d[0] = (char)(0xe0 | (v >> 12));
        d[1] = (char)(0x80 | ((v >> 6) & 0x3f));
        d[2] = (char)(0x80 | (v & 0x3f));
        return 3;
    }
    d[0] = (char)(0xf0 | (v >> 18));
    d[1] = (char)(0x80 | ((v >> 12) & 0x3f));
    d[2] = (char)(0x80 | ((v >> 6) & 0x3f));
    d[3] = (char)(0x80 | (v & 0x3f));
    return 4;
}

/* The 4 hex digits at p (avail bytes there) of a \u escape; -1 when they are not 4 hex digits. */
static long hex4(const unsigned char *p, size_t avail) {
    if (avail < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The \u escape at j->pos (on the 'u'): its code point (a surrogate pair joined) into *v. */
static int unicode_escape(stj *j, uint32_t *v, fsdp_err *err) {
    size_t at = j->pos - 1;
    long hi = hex4(j->s + j->pos + 1, j->n - j->pos - 1);
    if (hi < 0) return stj_fail(j, at, err, "\\u must be followed by 4 hex digits");
    j->pos += 5;
    if (hi == 0) return stj_fail(j, at, err, "\\u0000 is not allowed in a string");
    if (hi >= 0xdc00 && hi <= 0xdfff) return stj_fail(j, at, err, "lone low surrogate \\u%04lX", hi);
    if (hi < 0xd800 || hi > 0xdbff) {
        *v = (uint32_t)hi;
        return FSDP_OK;
    }
    long lo = j->n - j->pos >= 2 && j->s[j->pos] == '\\' && j->s[j->pos + 1] == 'u'
                  ? hex4(j->s + j->pos + 2, j->n - j->pos - 2)
                  : -1;
    if (lo < 0xdc00 || lo > 0xdfff)
        return stj_fail(j, at, err, "high surrogate \\u%04lX is not followed by a low surrogate", hi);
    j->pos += 6;
    *v = 0x10000 + (((uint32_t)hi - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
    return FSDP_OK;
}

/* One escape sequence at j->pos (on the backslash), decoded to d; its length in *len. */
static int escape(stj *j, char *d, size_t *len, fsdp_err *err) {
    if (j->pos + 1 >= j->n) return stj_fail(j, j->pos, err, "the header ends inside a string (truncated?)");
    unsigned char c = j->s[++j->pos];
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *k = c ? strchr(from, c) : NULL;
    if (k) {
        d[0] = to[k - from];
        *len = 1;
        j->pos++;
        return FSDP_OK;
    }
    if (c != 'u') return stj_fail(j, j->pos - 1, err, "invalid escape '\\%c'", c >= 0x20 && c < 0x7f ? c : '?');
    uint32_t v = 0;
    int rc = unicode_escape(j, &v, err);
    if (rc) return rc;
    *len = put_utf8(d, v);
    return FSDP_OK;
}

int stj_string(stj *j, const char **out, fsdp_err *err) {
    size_t start = j->pos++, o = j->used;
    char *d = j->arena;
    for (;;) {
        if (j->pos >= j->n) return stj_fail(j, start, err, "the header ends inside a string (truncated?)");
        unsigned char c = j->s[j->pos];
        if (c == '"') break;
        if (c < 0x20) return stj_fail(j, j->pos, err, "control character 0x%02x in a string (must be escaped)", c);
        if (c == '\\') {
            size_t len = 0;
            int rc = escape(j, d + o, &len, err);
            if (rc) return rc;
            o += len;
        } else if (c < 0x80) {
            d[o++] = (char)c;
            j->pos++;
        } else {
            size_t len = utf8_len(j->s + j->pos, j->n - j->pos);
            if (!len) return stj_fail(j, j->pos, err, "invalid UTF-8 byte 0x%02x in a string", c);
            memcpy(d + o, j->s + j->pos, len);
            o += len;
            j->pos += len;
        }
    }
    j->pos++;
    d[o++] = '\0';
    *out = d + j->used;
    j->used = o;
    return FSDP_OK;
}

static int is_digit(const stj *j, size_t i) { return i < j->n && j->s[i] >= '0' && j->s[i] <= '9'; }

int stj_number(stj *j, uint64_t *v, stj_numkind *kind, fsdp_err *err) {
    size_t start = j->pos, i = j->pos;
    int neg = i < j->n && j->s[i] == '-';
    if (neg) i++;
    if (!is_digit(j, i)) return stj_fail(j, start, err, "invalid number");
    uint64_t x = 0;
    int big = 0;
    if (j->s[i] == '0') {
        if (is_digit(j, ++i)) return stj_fail(j, start, err, "invalid number (a leading zero)");
    } else {
        for (; is_digit(j, i); i++) {
            unsigned dg = (unsigned)(j->s[i] - '0');
            if (x > (UINT64_MAX - dg) / 10) big = 1;
            else x = x * 10 + dg;
        }
    }
    int real = 0;
    if (i < j->n && j->s[i] == '.') {
        if (!is_digit(j, ++i)) return stj_fail(j, start, err, "invalid number (no digit after '.')");
        while (is_digit(j, i)) i++;
        real = 1;
    }
    if (i < j->n && (j->s[i] == 'e' || j->s[i] == 'E')) {
        i++;
        if (i < j->n && (j->s[i] == '+' || j->s[i] == '-')) i++;
        if (!is_digit(j, i)) return stj_fail(j, start, err, "invalid number (no digit in the exponent)");
        while (is_digit(j, i)) i++;
        real = 1;
    }
    j->pos = i;
    *v = 0;
    if (real) {
        *kind = STJ_REAL;
        return FSDP_OK;
    }
    if (big || x > (uint64_t)INT64_MAX + (uint64_t)neg)
        return stj_fail(j, start, err, "integer %.*s does not fit in 64 bits", (int)(i - start > 40 ? 40 : i - start),
                        (const char *)j->s + start);
    *kind = neg && x ? STJ_NEG : STJ_UINT;
    if (*kind == STJ_UINT) *v = x;
    return FSDP_OK;
}

int stj_skip_value(stj *j, fsdp_err *err) {
    stj_peek(j);
    json_error_t je;
    json_t *v = json_loadb((const char *)j->s + j->pos, j->n - j->pos,
                           JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &je);
    if (!v) return stj_fail(j, j->pos + (size_t)(je.position > 0 ? je.position : 0), err, "%s", je.text);
    json_decref(v);
    j->pos += (size_t)je.position;
    return FSDP_OK;
}
