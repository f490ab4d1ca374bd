/* The pre-tokenizers' and normalizers' regexes: tokenizer.json's patterns are Oniguruma's (tokenizers runs
 * them with the onig crate, Ruby syntax); PCRE2 runs them here after the escapes whose meaning differs are
 * spelled out: Oniguruma's \s is Unicode's White_Space (PCRE2's adds U+180E), \w is letters, marks, decimal
 * digits and connector punctuation (PCRE2's: letters, all numbers, '_'), \h a hex digit (PCRE2's: horizontal
 * space); ^ and $ are line anchors. Matches are found as the onig crate's find_iter finds them. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"
#include "tok_utf8.h"

typedef struct rbuf {
    char *p;
    size_t n, cap;
} rbuf;

static int rb_add(rbuf *b, const char *s, size_t n) {
    if (tok_grow(&b->p, &b->cap, b->n + n + 1, 1, 256)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

#define RB(s) rb_add(&b, s, strlen(s))

/* The PCRE2 spelling of Oniguruma's escape \c (inside a character class or not); NULL: keep it. */
static const char *escape_of(char c, int in_class, int *bad) {
    *bad = 0;
    switch (c) {
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'd': return "\\p{Nd}";
    case 'D': return "\\P{Nd}";
    case 'w': return in_class ? "\\p{L}\\p{M}\\p{Nd}\\p{Pc}" : "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
    case 'W':
        *bad = in_class;
        return "[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
    case 'h': return in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
    case 'H':
        *bad = in_class;
        return "[^0-9a-fA-F]";
    default: return NULL;
    }
}

static int translate(const char *pat, size_t n, rbuf *out, fsdp_err *err) {
    rbuf b = {0};
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            int bad;
            const char *rep = escape_of(pat[i + 1], in_class, &bad);
            if (bad) {
                free(b.p);
                return fsdp_err_set(err, FSDP_E_INVALID, "\\%c inside a character class is not supported", pat[i + 1]);
            }
            if (rep ? RB(rep) : rb_add(&b, pat + i, 2)) goto oom;
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            if (rb_add(&b, pat + i, 1)) goto oom;
            /* a ']' first (after an optional '^') is a literal */
            if (i + 1 < n && pat[i + 1] == '^') {
                if (rb_add(&b, "^", 1)) goto oom;
                i++;
            }
            if (i + 1 < n && pat[i + 1] == ']') {
                if (rb_add(&b, "\\]", 2)) goto oom;
                i++;
            }
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        if (rb_add(&b, &c, 1)) goto oom;
    }
    if (!b.p && RB("")) goto oom;
    *out = b;
    return 0;
oom:
    free(b.p);
    return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
}

pcre2_code *tok_re_compile(const char *pat, size_t n, int literal, fsdp_err *err) {
    rbuf b = {0};
    uint32_t opts = PCRE2_UTF;
    if (literal) {
        opts |= PCRE2_LITERAL;
        if (rb_add(&b, pat, n)) {
            fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            return NULL;
        }
    } else {
        opts |= PCRE2_UCP | PCRE2_MULTILINE;
        if (translate(pat, n, &b, err)) return NULL;
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)b.p, b.n, opts, &ec, &eo, NULL);
    free(b.p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        fsdp_err_set(err, FSDP_E_INVALID, "regex /%.*s/ does not compile (at %zu): %s", (int)(n > 300 ? 300 : n), pat,
                     (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT (not built in) the interpreter matches the same */
    return re;
}

int tok_re_find(tok_state *st, const pcre2_code *re, const char *s, size_t n, size_t start, size_t *ms, size_t *me) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

int tok_segs_push(tok_segs *o, size_t a, size_t b, int match) {
    if (tok_grow(&o->v, &o->cap, o->n + 1, sizeof *o->v, 64)) return -1;
    o->v[o->n++] = (tok_seg){a, b, match};
    return 0;
}

int tok_re_segments(tok_state *st, const pcre2_code *re, const char *s, size_t n, tok_segs *out) {
    out->n = 0;
    if (!n) return tok_segs_push(out, 0, 0, 0);
    size_t prev = 0, last_end = 0, ms, me;
    long last_match_end = -1;
    while (last_end <= n) {
        int r = tok_re_find(st, re, s, n, last_end, &ms, &me);
        if (r < 0) return -2;
        if (!r) break;
        if (ms == me && last_match_end == (long)me) { /* no empty match right after the last one */
            last_end += last_end < n ? tok_utf8_len((unsigned char)s[last_end]) : 1;
            continue;
        }
        last_end = me;
        last_match_end = (long)me;
        if (prev != ms && tok_segs_push(out, prev, ms, 0)) return -1;
        if (tok_segs_push(out, ms, me, 1)) return -1;
        prev = me;
    }
    if (prev != n && tok_segs_push(out, prev, n, 0)) return -1;
    return 0;
}
