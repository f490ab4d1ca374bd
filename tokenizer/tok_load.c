/* Reading a tokenizer.json (Jansson): the BPE model, the added tokens, the post-processor's template, the
 * id -> token table; the normalizer, pre-tokenizer and decoder in tok_load_parts.c. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_docs.h"
#include "tok_impl.h"
#include "tok_utf8.h"

int tok_bad(const tok_tokenizer *t, fsdp_err *err, const char *where, const char *what) {
    return fsdp_err_set(err, FSDP_E_INVALID, "%s: %s: %s", t->name, where, what);
}

int tok_add_regex(tok_tokenizer *t, const char *pat, size_t n, int literal, const char *where, fsdp_err *err) {
    pcre2_code **re = realloc(t->re, (t->n_re + 1) * sizeof *re);
    if (!re) {
        fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        return -1;
    }
    t->re = re;
    re[t->n_re] = tok_re_compile(pat, n, literal, err);
    if (!re[t->n_re]) {
        fsdp_err_prefix(err, "%s: %s", t->name, where);
        return -1;
    }
    return (int)t->n_re++;
}

/* Merges: ["a b", ...] (before tokenizers 0.20) or [["a", "b"], ...]. */
static int merge_pair(json_t *m, const char **a, size_t *an, const char **b, size_t *bn) {
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *an = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bn = json_string_length(json_array_get(m, 1));
        return 0;
    }
    const char *s = json_string_value(m);
    if (!s) return 1;
    const char *sp = strchr(s, ' ');
    if (!sp || strchr(sp + 1, ' ')) return 1;
    *a = s;
    *an = (size_t)(sp - s);
    *b = sp + 1;
    *bn = json_string_length(m) - *an - 1;
    return 0;
}

static int load_merges(tok_tokenizer *t, json_t *merges, fsdp_err *err) {
    tok_bpe *b = &t->bpe;
    char *buf = NULL;
    size_t cap = 0;
    for (size_t r = 0; r < json_array_size(merges); r++) {
        const char *x, *y;
        size_t xn, yn;
        char where[64];
        snprintf(where, sizeof where, "model.merges[%zu]", r);
        if (merge_pair(json_array_get(merges, r), &x, &xn, &y, &yn)) {
            free(buf);
            return tok_bad(t, err, where, "expected \"a b\" or [\"a\", \"b\"]");
        }
        int32_t xi = tok_smap_get(&b->vocab, x, xn), yi = tok_smap_get(&b->vocab, y, yn);
        if (xn + yn > cap) {
            cap = 2 * (xn + yn) + 64;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            }
            buf = nb;
        }
        memcpy(buf, x, xn);
        memcpy(buf + xn, y, yn);
        int32_t id = tok_smap_get(&b->vocab, buf, xn + yn);
        if (xi < 0 || yi < 0 || id < 0) {
            char what[400];
            snprintf(what, sizeof what, "the merge \"%.*s\" + \"%.*s\" names a token that is not in model.vocab",
                     (int)(xn > 100 ? 100 : xn), x, (int)(yn > 100 ? 100 : yn), y);
            free(buf);
            return tok_bad(t, err, where, what);
        }
        /* a pair given twice keeps its last rank, as tokenizers' map does */
        if (tok_umap_put(&b->merges, (uint64_t)(uint32_t)xi << 32 | (uint32_t)yi, (uint64_t)r << 32 | (uint32_t)id) < 0) {
            free(buf);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
    }
    free(buf);
    return 0;
}

static int null_or(json_t *v, int empty_ok) {
    return !v || json_is_null(v) || (empty_ok && json_is_string(v) && !json_string_length(v)) ||
           (json_is_number(v) && json_number_value(v) == 0.0);
}

int tok_load_bpe(tok_tokenizer *t, json_t *m, fsdp_err *err) {
    tok_bpe *b = &t->bpe;
    const char *ty = json_string_value(json_object_get(m, "type"));
    if (!json_is_object(m)) return tok_bad(t, err, "model", "missing");
    if (ty && strcmp(ty, "BPE")) {
        char what[200];
        snprintf(what, sizeof what, "model type \"%s\" is not supported (only BPE: the decoder family's tokenizers)", ty);
        return tok_bad(t, err, "model.type", what);
    }
    if (!null_or(json_object_get(m, "dropout"), 0)) return tok_bad(t, err, "model.dropout", "BPE dropout is not supported");
    if (!null_or(json_object_get(m, "continuing_subword_prefix"), 1))
        return tok_bad(t, err, "model.continuing_subword_prefix", "not supported");
    if (!null_or(json_object_get(m, "end_of_word_suffix"), 1)) return tok_bad(t, err, "model.end_of_word_suffix", "not supported");
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab)) return tok_bad(t, err, "model.vocab", "expected an object of token -> id");
    if (!json_is_array(merges)) return tok_bad(t, err, "model.merges", "expected an array");
    size_t keys = 0;
    for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) keys += json_object_iter_key_len(it) + 1;
    if (tok_smap_reserve(&b->vocab, json_object_size(vocab), keys) || tok_umap_reserve(&b->merges, json_array_size(merges)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
        const char *key = json_object_iter_key(it);
        size_t kl = json_object_iter_key_len(it);
        json_t *v = json_object_iter_value(it);
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX) {
            char w[300];
            snprintf(w, sizeof w, "model.vocab[\"%.200s\"]", key);
            return tok_bad(t, err, w, "expected an id >= 0");
        }
        if (tok_smap_put(&b->vocab, key, kl, (int32_t)id, NULL) < 0)
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    b->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    b->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    b->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    b->unk = -1;
    json_t *unk = json_object_get(m, "unk_token");
    if (json_is_string(unk)) {
        b->unk = tok_smap_get(&b->vocab, json_string_value(unk), json_string_length(unk));
        if (b->unk < 0) return tok_bad(t, err, "model.unk_token", "the unknown token is not in model.vocab");
    }
    for (int k = 0; k < 256; k++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", k);
        b->byte_tok[k] = tok_smap_get(&b->vocab, name, 6);
    }
    return load_merges(t, merges, err);
}

int tok_load_added(tok_tokenizer *t, json_t *arr, fsdp_err *err) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return tok_bad(t, err, "added_tokens", "expected an array");
    t->n_added = json_array_size(arr);
    t->added = calloc(t->n_added ? t->n_added : 1, sizeof *t->added);
    if (!t->added) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < t->n_added; k++) {
        json_t *j = json_array_get(arr, k), *c = json_object_get(j, "content"), *id = json_object_get(j, "id");
        tok_added *a = &t->added[k];
        char w[64];
        snprintf(w, sizeof w, "added_tokens[%zu]", k);
        if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX)
            return tok_bad(t, err, w, "expected {\"id\": N, \"content\": \"...\", ...}");
        a->n = json_string_length(c);
        a->content = malloc(a->n + 1);
        if (!a->content) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        memcpy(a->content, json_string_value(c), a->n + 1);
        a->id = (int32_t)json_integer_value(id);
        a->single_word = json_is_true(json_object_get(j, "single_word"));
        a->lstrip = json_is_true(json_object_get(j, "lstrip"));
        a->rstrip = json_is_true(json_object_get(j, "rstrip"));
        a->special = json_is_true(json_object_get(j, "special"));
        json_t *nz = json_object_get(j, "normalized");
        a->normalized = nz ? json_is_true(nz) : !a->special;
    }
    return 0;
}

/* The tries: normalized tokens by their normalized content, the others as written. */
static int build_tries(tok_tokenizer *t, fsdp_err *err) {
    tok_state *st = t->norm ? tok_state_new(t) : NULL; /* one workspace for every normalized token */
    int rc = t->norm && !st ? -1 : 0;
    for (size_t k = 0; k < t->n_added && !rc; k++) {
        tok_added *a = &t->added[k];
        const char *s = a->content;
        size_t n = a->n;
        if (a->normalized && t->norm) {
            rc = tok_normalize_string(st, t->norm, a->content, a->n, &a->norm, &a->norm_n);
            s = a->norm;
            n = a->norm_n;
        }
        if (!rc) rc = tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, s, n, (int32_t)k);
    }
    tok_state_free(st);
    return rc ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : 0;
}

/* id -> token: the model's, then the added tokens' over them. */
static int build_ids(tok_tokenizer *t, fsdp_err *err) {
    int32_t max = -1;
    const tok_smap *v = &t->bpe.vocab;
    for (size_t e = 0; e < v->n; e++)
        if (v->val[e] > max) max = v->val[e];
    for (size_t k = 0; k < t->n_added; k++)
        if (t->added[k].id > max) max = t->added[k].id;
    t->vocab_size = max + 1;
    size_t n = (size_t)t->vocab_size ? (size_t)t->vocab_size : 1, pool = 0;
    t->id_off = calloc(n, sizeof *t->id_off);
    t->id_len = malloc(n * sizeof *t->id_len);
    t->id_special = calloc(n, 1);
    for (size_t e = 0; e < v->n; e++) pool += v->len[e] + 1;
    for (size_t k = 0; k < t->n_added; k++) pool += t->added[k].n + 1;
    t->id_pool = malloc(pool ? pool : 1);
    if (!t->id_off || !t->id_len || !t->id_special || !t->id_pool) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memset(t->id_len, 0xFF, n * sizeof *t->id_len);
    size_t at = 0;
    for (size_t e = 0; e < v->n; e++) {
        int32_t id = v->val[e];
        if (t->id_len[id] != UINT32_MAX) {
            size_t kn;
            const char *key = tok_smap_key(v, e, &kn);
            char w[300];
            snprintf(w, sizeof w, "model.vocab[\"%.200s\"]", key);
            char what[100];
            snprintf(what, sizeof what, "id %d is given to two tokens", (int)id);
            return tok_bad(t, err, w, what);
        }
        size_t kn;
        const char *key = tok_smap_key(v, e, &kn);
        memcpy(t->id_pool + at, key, kn + 1);
        t->id_off[id] = at;
        t->id_len[id] = (uint32_t)kn;
        at += kn + 1;
    }
    for (size_t k = 0; k < t->n_added; k++) {
        const tok_added *a = &t->added[k];
        memcpy(t->id_pool + at, a->content, a->n + 1);
        t->id_off[a->id] = at;
        t->id_len[a->id] = (uint32_t)a->n;
        t->id_special[a->id] = (uint8_t)a->special;
        at += a->n + 1;
    }
    return 0;
}

static void bytelevel_table(tok_tokenizer *t) {
    for (int b = 0; b < 256; b++) t->bl_len[b] = (uint8_t)tok_utf8_put(tok_bytelevel_char((unsigned char)b), t->bl_utf8[b]);
}

static int load_root(tok_tokenizer *t, json_t *root, fsdp_err *err) {
    if (!json_is_object(root)) return tok_bad(t, err, "(top level)", "expected a JSON object");
    static const char *const refused[] = {"truncation", "padding"};
    for (int k = 0; k < 2; k++)
        if (!null_or(json_object_get(root, refused[k]), 0))
            return tok_bad(t, err, refused[k], "must be null: fsdp-run neither truncates nor pads documents (set it to null)");
    int rc = tok_load_bpe(t, json_object_get(root, "model"), err);
    if (!rc) rc = tok_load_added(t, json_object_get(root, "added_tokens"), err);
    json_t *n = json_object_get(root, "normalizer"), *p = json_object_get(root, "pre_tokenizer"),
           *d = json_object_get(root, "decoder");
    if (!rc && n && !json_is_null(n)) rc = tok_load_normalizer(t, n, "normalizer", &t->norm, err);
    if (!rc && p && !json_is_null(p)) rc = tok_load_pretokenizer(t, p, "pre_tokenizer", &t->pre, err);
    if (!rc && d && !json_is_null(d)) rc = tok_load_decoder(t, d, "decoder", &t->dec, err);
    if (!rc) rc = tok_load_post(t, json_object_get(root, "post_processor"), "post_processor", err);
    if (!rc) rc = build_ids(t, err);
    if (!rc) rc = build_tries(t, err);
    bytelevel_table(t);
    return rc;
}

int tok_load_json(const char *json, size_t len, const char *name, tok_tokenizer **out, fsdp_err *err) {
    *out = NULL;
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    snprintf(t->name, sizeof t->name, "%s", name);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    int rc;
    if (!root)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: not valid JSON (line %d, column %d): %s", name, je.line, je.column,
                          je.text);
    else
        rc = load_root(t, root, err);
    json_decref(root);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tok_load(const char *path, tok_tokenizer **out, fsdp_err *err) {
    char file[4096];
    struct stat sb;
    *out = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else snprintf(file, sizeof file, "%s", path);
    char *buf = NULL;
    size_t n = 0;
    int rc = tok_read_file(file, &buf, &n, err);
    if (rc) {
        if (stat(file, &sb))
            return fsdp_err_set(err, FSDP_E_IO, "%s: no tokenizer.json there (the tokenizer of the model: a Hugging "
                                "Face model directory holds one)", file);
        return rc;
    }
    rc = tok_load_json(buf, n, file, out, err);
    free(buf);
    return rc;
}

int32_t tok_vocab_size(const tok_tokenizer *t) { return t->vocab_size; }

int32_t tok_token_id(const tok_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t k = 0; k < t->n_added; k++)
        if (t->added[k].n == n && !memcmp(t->added[k].content, token, n)) return t->added[k].id;
    return tok_smap_get(&t->bpe.vocab, token, n);
}

const tok_ids *tok_template_prefix(const tok_tokenizer *t) { return &t->prefix; }
const tok_ids *tok_template_suffix(const tok_tokenizer *t) { return &t->suffix; }
int tok_is_special(const tok_tokenizer *t, int32_t id) { return id >= 0 && id < t->vocab_size && t->id_special[id]; }

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    for (size_t k = 0; k < t->n_re; k++) pcre2_code_free(t->re[k]);
    free(t->re);
    tok_norm_free(t->norm);
    tok_pretok_free(t->pre);
    tok_dec_free(t->dec);
    tok_smap_free(&t->bpe.vocab);
    tok_umap_free(&t->bpe.merges);
    for (size_t k = 0; k < t->n_added; k++) {
        free(t->added[k].content);
        free(t->added[k].norm);
    }
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    tok_ids_free(&t->prefix);
    tok_ids_free(&t->suffix);
    free(t->id_off);
    free(t->id_len);
    free(t->id_pool);
    free(t->id_special);
    free(t);
}
