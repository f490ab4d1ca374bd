/* `when:` conditions: a boolean, or a text of comparisons of words (`A == B`, `A != B`,
 * `A in [x, y]`) joined by `not`, `and`, `or` and parentheses (not > and > or). A word is a run of
 * characters other than blanks and ()[],'" (stopping before == and !=), or a '...' / "..." quoted
 * text (spaces, the empty word, a keyword as a word). The text is read in two passes: the tokens,
 * then a recursive descent over them whose nesting is bounded, so any text is safe to read. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/recipe.h"

/* Parentheses and `not`s nest at most this deep in one condition. */
#define COND_MAX_DEPTH 64

int recipe_values_equal(const char *a, const char *b) {
    int x, y;
    double f, g;
    if (!val_text_bool(a, &x) && !val_text_bool(b, &y)) return x == y;
    if (!val_text_float(a, &f) && !val_text_float(b, &g)) return f == g;
    return !strcmp(a, b);
}

typedef enum {
    TK_END, TK_WORD, TK_LP, TK_RP, TK_LB, TK_RB, TK_COMMA, TK_EQ, TK_NE, TK_AND, TK_OR, TK_NOT, TK_IN
} tk_kind;

typedef struct {
    tk_kind kind;
    size_t at, len;  /* where the token is in the text (quotes included) */
    const char *word; /* TK_WORD: the word without its quotes, NUL-terminated (in cond.words) */
} cond_tok;

typedef struct {
    const char *text;
    cond_tok *toks;
    size_t n, i;
    char *words;       /* the words, each NUL-terminated */
    int depth;
    char why[256];     /* what went wrong, when reading failed */
} cond;

static int cond_fail(cond *c, size_t at, const char *fmt, ...) FSDP_PRINTF(3, 4);
static int cond_fail(cond *c, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < sizeof c->why)
        snprintf(c->why + k, sizeof c->why - (size_t)k, " (column %zu)", at + 1);
    return -1;
}

static int is_word_char(const char *p) {
    if (!*p || isspace((unsigned char)*p) || strchr("()[],'\"", *p)) return 0;
    return !((p[0] == '=' || p[0] == '!') && p[1] == '=');
}

static tk_kind keyword(const char *w, int quoted) {
    if (quoted) return TK_WORD;
    if (!strcmp(w, "and")) return TK_AND;
    if (!strcmp(w, "or")) return TK_OR;
    if (!strcmp(w, "not")) return TK_NOT;
    if (!strcmp(w, "in")) return TK_IN;
    return TK_WORD;
}

/* The next token at *pos into t (a word's text appended to c->words at *w). */
static int lex_one(cond *c, size_t *pos, size_t *w, cond_tok *t) {
    const char *s = c->text, *p = s + *pos;
    static const char punct[] = "()[],";
    static const tk_kind punct_kind[] = {TK_LP, TK_RP, TK_LB, TK_RB, TK_COMMA};
    t->at = *pos;
    t->word = NULL;
    const char *q = *p ? strchr(punct, *p) : NULL;
    if (q) {
        t->kind = punct_kind[q - punct];
        t->len = 1;
    } else if ((p[0] == '=' || p[0] == '!') && p[1] == '=') {
        t->kind = p[0] == '=' ? TK_EQ : TK_NE;
        t->len = 2;
    } else {
        int quoted = *p == '\'' || *p == '"';
        const char *b = p + quoted, *e = b;
        if (quoted) {
            e = strchr(b, *p);
            if (!e) return cond_fail(c, *pos, "unterminated quote %c", *p);
        } else {
            while (is_word_char(e)) e++;
        }
        t->word = c->words + *w;
        memcpy(c->words + *w, b, (size_t)(e - b));
        *w += (size_t)(e - b);
        c->words[(*w)++] = '\0';
        t->kind = keyword(t->word, quoted);
        t->len = (size_t)(e - p) + (size_t)quoted;
    }
    *pos += t->len;
    return 0;
}

static int cond_lex(cond *c) {
    size_t len = strlen(c->text), pos = 0, w = 0;
    c->toks = malloc((len + 1) * sizeof *c->toks);
    c->words = malloc(2 * len + 2);
    if (!c->toks || !c->words) return -2;
    for (;;) {
        while (isspace((unsigned char)c->text[pos])) pos++;
        cond_tok *t = &c->toks[c->n];
        if (!c->text[pos]) {
            t->kind = TK_END;
            t->at = pos;
            t->len = 0;
            t->word = NULL;
            c->n++;
            return 0;
        }
        if (lex_one(c, &pos, &w, t)) return -1;
        c->n++;
    }
}

static const cond_tok *peek(const cond *c) { return &c->toks[c->i]; }

/* "'tok'" or "the end" for messages. */
static void tok_name(const cond *c, const cond_tok *t, char *buf, size_t cap) {
    if (t->kind == TK_END) snprintf(buf, cap, "the end");
    else snprintf(buf, cap, "'%.*s'", t->len > 40 ? 40 : (int)t->len, c->text + t->at);
}

static int unexpected(cond *c, const char *expected) {
    char name[64];
    tok_name(c, peek(c), name, sizeof name);
    return cond_fail(c, peek(c)->at, "expected %s, got %s", expected, name);
}

static int parse_or(cond *c, int *out);

/* `[x, y, ...]` after `in`: whether word is one of them. */
static int parse_in(cond *c, const char *word, int *out) {
    if (peek(c)->kind != TK_LB) return unexpected(c, "'[' after 'in'");
    c->i++;
    *out = 0;
    if (peek(c)->kind == TK_RB) {
        c->i++;
        return 0;
    }
    for (;;) {
        if (peek(c)->kind != TK_WORD) return unexpected(c, "a word in the list after 'in'");
        if (recipe_values_equal(word, peek(c)->word)) *out = 1;
        c->i++;
        if (peek(c)->kind == TK_RB) {
            c->i++;
            return 0;
        }
        if (peek(c)->kind != TK_COMMA) return unexpected(c, "',' or ']' in the list after 'in'");
        c->i++;
    }
}

/* A word: compared (==, !=, in), or a boolean on its own. */
static int parse_word(cond *c, int *out) {
    const cond_tok *a = peek(c);
    c->i++;
    tk_kind op = peek(c)->kind;
    if (op == TK_EQ || op == TK_NE) {
        c->i++;
        if (peek(c)->kind != TK_WORD) return unexpected(c, op == TK_EQ ? "a word after '=='" : "a word after '!='");
        int eq = recipe_values_equal(a->word, peek(c)->word);
        c->i++;
        *out = op == TK_EQ ? eq : !eq;
        return 0;
    }
    if (op == TK_IN) {
        c->i++;
        return parse_in(c, a->word, out);
    }
    if (val_text_bool(a->word, out) == 0) return 0;
    if (op == TK_WORD)
        return cond_fail(c, peek(c)->at, "unknown operator '%.40s' after '%.60s' (expected ==, != or in)",
                         peek(c)->word, a->word);
    return cond_fail(c, a->at,
                     "'%.60s' is neither a boolean nor a comparison (A == B, A != B, A in [x, y]; quote a word "
                     "that holds spaces)",
                     a->word);
}

static int parse_unary(cond *c, int *out) {
    tk_kind k = peek(c)->kind;
    if (k == TK_WORD) return parse_word(c, out);
    if (k != TK_NOT && k != TK_LP) return unexpected(c, "a word, 'not' or '('");
    if (++c->depth > COND_MAX_DEPTH)
        return cond_fail(c, peek(c)->at, "parentheses and 'not' nested deeper than %d", COND_MAX_DEPTH);
    size_t open = peek(c)->at;
    c->i++;
    int rc = k == TK_NOT ? parse_unary(c, out) : parse_or(c, out);
    if (!rc && k == TK_NOT) *out = !*out;
    if (!rc && k == TK_LP) {
        if (peek(c)->kind != TK_RP) {
            char name[64];
            tok_name(c, peek(c), name, sizeof name);
            return cond_fail(c, peek(c)->at, "unbalanced '(' (opened at column %zu): expected ')', got %s", open + 1,
                             name);
        }
        c->i++;
    }
    c->depth--;
    return rc;
}

static int parse_and(cond *c, int *out) {
    if (parse_unary(c, out)) return -1;
    while (peek(c)->kind == TK_AND) {
        c->i++;
        int r;
        if (parse_unary(c, &r)) return -1;
        *out = *out && r;
    }
    return 0;
}

static int parse_or(cond *c, int *out) {
    if (parse_and(c, out)) return -1;
    while (peek(c)->kind == TK_OR) {
        c->i++;
        int r;
        if (parse_and(c, &r)) return -1;
        *out = *out || r;
    }
    return 0;
}

/* -1 with c->why on a text that is not a condition, -2 out of memory. */
static int cond_eval(cond *c, int *out) {
    int rc = cond_lex(c);
    if (!rc) rc = parse_or(c, out);
    if (!rc && peek(c)->kind != TK_END) {
        if (peek(c)->kind == TK_RP) return cond_fail(c, peek(c)->at, "unbalanced ')'");
        rc = unexpected(c, "'and', 'or' or the end of the condition");
    }
    return rc;
}

int recipe_when_eval(const fsdp_value *v, const char *orig, int *out, fsdp_err *err) {
    static const char *const kinds[] = {"nothing (null)", "a scalar", "a list", "a map"};
    fsdp_value_kind k = fsdp_value_type(v);
    if (k != FSDP_V_SCALAR)
        return fsdp_err_at(err, FSDP_E_INVALID, v,
                           "when: expected true, false or a condition (A == B, A != B, A in [x, y], with not, and, or "
                           "and parentheses), got %s",
                           kinds[k]);
    if (val_text_bool(v->text, out) == 0) return 0;
    cond c = {v->text, NULL, 0, 0, NULL, 0, ""};
    int rc = cond_eval(&c, out);
    free(c.toks);
    free(c.words);
    if (rc == -2) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) return 0;
    int from = orig && strcmp(orig, v->text);
    return fsdp_err_at(err, FSDP_E_INVALID, v, "when: cannot read the condition '%.300s'%s%.300s%s: %s", v->text,
                       from ? " (from '" : "", from ? orig : "", from ? "')" : "", c.why);
}
