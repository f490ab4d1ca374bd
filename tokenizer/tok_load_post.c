/* tokenizer.json's post_processor as the ids it puts before and after a single sequence: TemplateProcessing
 * (its "single" template), BertProcessing / RobertaProcessing (cls, sep), ByteLevel (none) and Sequence (each
 * in turn wraps what the previous one gave). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "tok_impl.h"

/* A special token's ids from TemplateProcessing's special_tokens map. */
static int special_ids(tok_tokenizer *t, json_t *j, const char *name, const char *where, tok_ids *out, fsdp_err *err) {
    json_t *st = json_object_get(json_object_get(j, "special_tokens"), name);
    json_t *ids = json_object_get(st, "ids");
    char w[400];
    snprintf(w, sizeof w, "%s.special_tokens[\"%.200s\"]", where, name);
    if (!json_is_array(ids)) return tok_bad(t, err, w, "the template's special token is not in special_tokens (with \"ids\")");
    for (size_t k = 0; k < json_array_size(ids); k++) {
        json_t *v = json_array_get(ids, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
            return tok_bad(t, err, w, "ids must be integers >= 0");
        if (tok_ids_push(out, (int32_t)json_integer_value(v))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    return 0;
}

static int template(tok_tokenizer *t, json_t *j, const char *where, tok_ids *pre, tok_ids *post, fsdp_err *err) {
    json_t *single = json_object_get(j, "single");
    char w[300];
    snprintf(w, sizeof w, "%s.single", where);
    if (!json_is_array(single)) return tok_bad(t, err, w, "expected an array of pieces");
    int seen = 0;
    for (size_t k = 0; k < json_array_size(single); k++) {
        json_t *p = json_array_get(single, k), *sp = json_object_get(p, "SpecialToken"), *sq = json_object_get(p, "Sequence");
        if (sq) {
            const char *id = json_string_value(json_object_get(sq, "id"));
            if (seen || !id || strcmp(id, "A")) return tok_bad(t, err, w, "a single sequence's template has one Sequence, A");
            seen = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name) return tok_bad(t, err, w, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": \"A\"}}");
        int rc = special_ids(t, j, name, where, seen ? post : pre, err);
        if (rc) return rc;
    }
    if (!seen) return tok_bad(t, err, w, "the template has no Sequence A");
    return 0;
}

static int cls_sep(tok_tokenizer *t, json_t *j, const char *where, tok_ids *pre, tok_ids *post, fsdp_err *err) {
    json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
    json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
    if (!json_is_integer(ci) || !json_is_integer(si) || json_integer_value(ci) < 0 || json_integer_value(si) < 0)
        return tok_bad(t, err, where, "expected \"cls\" and \"sep\" as [token, id]");
    if (tok_ids_push(pre, (int32_t)json_integer_value(ci)) || tok_ids_push(post, (int32_t)json_integer_value(si)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return 0;
}

/* One processor's own prefix and suffix. */
static int one(tok_tokenizer *t, json_t *j, const char *where, fsdp_err *err);

static int wrap(tok_tokenizer *t, const tok_ids *pre, const tok_ids *post, fsdp_err *err) {
    tok_ids np = {0};
    int rc = tok_ids_append(&np, pre->v, pre->n) || tok_ids_append(&np, t->prefix.v, t->prefix.n) ||
             tok_ids_append(&t->suffix, post->v, post->n);
    if (rc) {
        tok_ids_free(&np);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    tok_ids_free(&t->prefix);
    t->prefix = np;
    return 0;
}

static int one(tok_tokenizer *t, json_t *j, const char *where, fsdp_err *err) {
    const char *ty = json_string_value(json_object_get(j, "type"));
    if (!ty) return tok_bad(t, err, where, "expected an object with a \"type\"");
    if (!strcmp(ty, "ByteLevel")) return 0;
    if (!strcmp(ty, "Sequence")) {
        json_t *ps = json_object_get(j, "processors");
        if (!json_is_array(ps)) return tok_bad(t, err, where, "Sequence needs \"processors\"");
        for (size_t k = 0; k < json_array_size(ps); k++) {
            char w[300];
            snprintf(w, sizeof w, "%s.processors[%zu]", where, k);
            int rc = one(t, json_array_get(ps, k), w, err);
            if (rc) return rc;
        }
        return 0;
    }
    tok_ids pre = {0}, post = {0};
    int rc;
    if (!strcmp(ty, "TemplateProcessing")) rc = template(t, j, where, &pre, &post, err);
    else if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) rc = cls_sep(t, j, where, &pre, &post, err);
    else {
        char what[300];
        snprintf(what, sizeof what, "post-processor \"%s\" is not supported (supported: TemplateProcessing, ByteLevel, "
                 "BertProcessing, RobertaProcessing, Sequence)", ty);
        rc = tok_bad(t, err, where, what);
    }
    if (!rc) rc = wrap(t, &pre, &post, err);
    tok_ids_free(&pre);
    tok_ids_free(&post);
    return rc;
}

int tok_load_post(tok_tokenizer *t, json_t *j, const char *where, fsdp_err *err) {
    if (!j || json_is_null(j)) return 0;
    return one(t, j, where, err);
}
