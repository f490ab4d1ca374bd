/* tokenizer.json's normalizer, pre_tokenizer and decoder: each component type this code implements, as a
 * table row of its kind, and an error naming the component for any other. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"
#include "tok_utf8.h"

static const char *type_of(json_t *j) { return json_string_value(json_object_get(j, "type")); }

static int flag(json_t *j, const char *key, int dflt) {
    json_t *v = json_object_get(j, key);
    return v && json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int dup_str(json_t *v, char **out, size_t *n) {
    const char *s = json_string_value(v);
    if (!s) return 1;
    *n = json_string_length(v);
    *out = malloc(*n + 1);
    if (!*out) return -1;
    memcpy(*out, s, *n + 1);
    return 0;
}

/* A {"String": s} or {"Regex": r} pattern into t's regex table: its index, -1 on error. */
static int pattern(tok_tokenizer *t, json_t *j, const char *where, fsdp_err *err) {
    json_t *p = json_object_get(j, "pattern"), *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    char w[600];
    snprintf(w, sizeof w, "%s.pattern", where);
    if (json_is_string(s)) return tok_add_regex(t, json_string_value(s), json_string_length(s), 1, w, err);
    if (json_is_string(r)) return tok_add_regex(t, json_string_value(r), json_string_length(r), 0, w, err);
    tok_bad(t, err, w, "expected {\"String\": ...} or {\"Regex\": ...}");
    return -1;
}

/* The first character of a string value as a code point; 0 when there is none. */
static uint32_t char_of(json_t *v) {
    const char *s = json_string_value(v);
    if (!s || !*s || tok_utf8_valid(s, strlen(s)) != strlen(s)) return 0;
    size_t i = 0;
    return tok_utf8_next(s, &i);
}

static int scheme(json_t *j, int *out) {
    const char *s = json_string_value(json_object_get(j, "prepend_scheme"));
    if (!s) { /* before tokenizers 0.14: add_prefix_space */
        *out = flag(j, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return 0;
    }
    if (!strcmp(s, "always")) *out = TOK_PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = TOK_PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = TOK_PREPEND_NEVER;
    else return 1;
    return 0;
}

/* A Sequence's members: each loaded by load() into an array of n elements of size sz. */
typedef int (*load_fn)(tok_tokenizer *, json_t *, const char *, void *, fsdp_err *);
static int members(tok_tokenizer *t, json_t *arr, const char *where, const char *key, size_t sz, load_fn load,
                   void **out, size_t *n, fsdp_err *err) {
    char w[600];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!json_is_array(arr)) return tok_bad(t, err, w, "expected an array");
    *n = json_array_size(arr);
    *out = calloc(*n ? *n : 1, sz);
    if (!*out) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < *n; k++) {
        snprintf(w, sizeof w, "%s.%s[%zu]", where, key, k);
        int rc = load(t, json_array_get(arr, k), w, (char *)*out + k * sz, err);
        if (rc) {
            *n = k; /* the loaded ones are freed by the caller's free of the whole */
            return rc;
        }
    }
    return 0;
}

static int norm_one(tok_tokenizer *t, json_t *j, const char *where, void *outp, fsdp_err *err) {
    tok_norm *o = outp;
    const char *ty = type_of(j);
    if (!ty) return tok_bad(t, err, where, "expected an object with a \"type\"");
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int k = 0; k < 4; k++)
        if (!strcmp(ty, forms[k])) {
            o->kind = TOK_NORM_NFC + k;
            return 0;
        }
    if (!strcmp(ty, "Prepend")) {
        o->kind = TOK_NORM_PREPEND;
        int rc = dup_str(json_object_get(j, "prepend"), &o->str, &o->str_n);
        return rc < 0 ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : rc ? tok_bad(t, err, where, "Prepend needs \"prepend\"") : 0;
    }
    if (!strcmp(ty, "Replace")) {
        o->kind = TOK_NORM_REPLACE;
        int rc = dup_str(json_object_get(j, "content"), &o->str, &o->str_n);
        if (rc) return rc < 0 ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : tok_bad(t, err, where, "Replace needs \"content\"");
        o->re = pattern(t, j, where, err);
        return o->re < 0 ? err->code : 0;
    }
    if (!strcmp(ty, "Strip")) {
        o->kind = TOK_NORM_STRIP;
        o->left = flag(j, "strip_left", 1);
        o->right = flag(j, "strip_right", 1);
        return 0;
    }
    if (!strcmp(ty, "Sequence")) {
        o->kind = TOK_NORM_SEQUENCE;
        return members(t, json_object_get(j, "normalizers"), where, "normalizers", sizeof *o, norm_one,
                       (void **)&o->sub, &o->n_sub, err);
    }
    char what[300];
    snprintf(what, sizeof what, "normalizer \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, "
             "Strip, Sequence)", ty);
    return tok_bad(t, err, where, what);
}

static const char *const behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};

static int pre_one(tok_tokenizer *t, json_t *j, const char *where, void *outp, fsdp_err *err) {
    tok_pretok *o = outp;
    const char *ty = type_of(j);
    if (!ty) return tok_bad(t, err, where, "expected an object with a \"type\"");
    if (!strcmp(ty, "ByteLevel")) {
        static const char gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
        o->kind = TOK_PRE_BYTELEVEL;
        o->add_prefix_space = flag(j, "add_prefix_space", 1);
        o->use_regex = flag(j, "use_regex", 1);
        o->re = o->use_regex ? tok_add_regex(t, gpt2, strlen(gpt2), 0, where, err) : 0;
        return o->re < 0 ? err->code : 0;
    }
    if (!strcmp(ty, "Split")) {
        o->kind = TOK_PRE_SPLIT;
        const char *b = json_string_value(json_object_get(j, "behavior"));
        o->behavior = -1;
        for (int k = 0; b && k < 5; k++)
            if (!strcmp(b, behaviors[k])) o->behavior = k;
        if (o->behavior < 0)
            return tok_bad(t, err, where, "Split's \"behavior\" must be Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
        o->invert = flag(j, "invert", 0);
        o->re = pattern(t, j, where, err);
        return o->re < 0 ? err->code : 0;
    }
    if (!strcmp(ty, "Metaspace")) {
        o->kind = TOK_PRE_METASPACE;
        uint32_t cp = char_of(json_object_get(j, "replacement"));
        if (!cp) return tok_bad(t, err, where, "Metaspace needs a \"replacement\" character");
        o->repl_n = tok_utf8_put(cp, o->repl);
        if (scheme(j, &o->prepend_scheme)) return tok_bad(t, err, where, "prepend_scheme must be always, first or never");
        o->split = flag(j, "split", 1);
        o->re = o->split ? tok_add_regex(t, o->repl, o->repl_n, 1, where, err) : 0;
        return o->re < 0 ? err->code : 0;
    }
    if (!strcmp(ty, "Digits")) {
        o->kind = TOK_PRE_DIGITS;
        o->individual = flag(j, "individual_digits", 0);
        return 0;
    }
    if (!strcmp(ty, "Sequence")) {
        o->kind = TOK_PRE_SEQUENCE;
        return members(t, json_object_get(j, "pretokenizers"), where, "pretokenizers", sizeof *o, pre_one,
                       (void **)&o->sub, &o->n_sub, err);
    }
    char what[300];
    snprintf(what, sizeof what, "pre-tokenizer \"%s\" is not supported (supported: ByteLevel, Split, Metaspace, Digits, "
             "Sequence)", ty);
    return tok_bad(t, err, where, what);
}

static int dec_one(tok_tokenizer *t, json_t *j, const char *where, void *outp, fsdp_err *err) {
    tok_dec *o = outp;
    const char *ty = type_of(j);
    if (!ty) return tok_bad(t, err, where, "expected an object with a \"type\"");
    if (!strcmp(ty, "ByteLevel")) o->kind = TOK_DEC_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) o->kind = TOK_DEC_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) o->kind = TOK_DEC_FUSE;
    else if (!strcmp(ty, "Metaspace")) {
        o->kind = TOK_DEC_METASPACE;
        o->cp = char_of(json_object_get(j, "replacement"));
        if (!o->cp) return tok_bad(t, err, where, "Metaspace needs a \"replacement\" character");
        if (scheme(j, &o->prepend_scheme)) return tok_bad(t, err, where, "prepend_scheme must be always, first or never");
    } else if (!strcmp(ty, "Replace")) {
        o->kind = TOK_DEC_REPLACE;
        int rc = dup_str(json_object_get(j, "content"), &o->content, &o->content_n);
        if (rc) return rc < 0 ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : tok_bad(t, err, where, "Replace needs \"content\"");
        o->re = pattern(t, j, where, err);
        return o->re < 0 ? err->code : 0;
    } else if (!strcmp(ty, "Strip")) {
        o->kind = TOK_DEC_STRIP;
        o->cp = char_of(json_object_get(j, "content"));
        json_int_t a = json_integer_value(json_object_get(j, "start")), b = json_integer_value(json_object_get(j, "stop"));
        if (!o->cp || a < 0 || b < 0 || a > 1 << 20 || b > 1 << 20)
            return tok_bad(t, err, where, "Strip needs a \"content\" character and \"start\", \"stop\" counts");
        o->start = (int)a;
        o->stop = (int)b;
    } else if (!strcmp(ty, "Sequence")) {
        o->kind = TOK_DEC_SEQUENCE;
        return members(t, json_object_get(j, "decoders"), where, "decoders", sizeof *o, dec_one, (void **)&o->sub,
                       &o->n_sub, err);
    } else {
        char what[300];
        snprintf(what, sizeof what, "decoder \"%s\" is not supported (supported: ByteLevel, Metaspace, Replace, "
                 "ByteFallback, Fuse, Strip, Sequence)", ty);
        return tok_bad(t, err, where, what);
    }
    return 0;
}

int tok_load_normalizer(tok_tokenizer *t, json_t *j, const char *where, tok_norm **out, fsdp_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return norm_one(t, j, where, *out, err);
}

int tok_load_pretokenizer(tok_tokenizer *t, json_t *j, const char *where, tok_pretok **out, fsdp_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return pre_one(t, j, where, *out, err);
}

int tok_load_decoder(tok_tokenizer *t, json_t *j, const char *where, tok_dec **out, fsdp_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return dec_one(t, j, where, *out, err);
}
