/* Encoding a text, as tokenizers' Tokenizer::encode does it: repair of invalid UTF-8, the added tokens that
 * are not normalized found in the raw text, the normalizer on the pieces between them, the normalized added
 * tokens found there, the pre-tokenizer, the model on each piece, the post-processor's template. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"
#include "tok_utf8.h"

int tok_ids_push(tok_ids *a, int32_t id) {
    if (tok_grow(&a->v, &a->cap, a->n + 1, sizeof *a->v, 256)) return -1;
    a->v[a->n++] = id;
    return 0;
}

int tok_ids_append(tok_ids *a, const int32_t *ids, size_t n) {
    if (tok_grow(&a->v, &a->cap, a->n + n, sizeof *a->v, 256)) return -1;
    if (n) memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
    return 0;
}

void tok_ids_free(tok_ids *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

int tok_buf_add(tok_buf *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        /* s may point into the buffer itself */
        int inside = b->p && s >= b->p && s < b->p + b->cap;
        size_t so = inside ? (size_t)(s - b->p) : 0;
        if (tok_grow(&b->p, &b->cap, b->n + n, 1, 4096)) return -1;
        if (inside) s = b->p + so;
    }
    if (n) memmove(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

int tok_pieces_push(tok_pieces *p, size_t off, size_t len, int32_t id, int origin) {
    if (tok_grow(&p->v, &p->cap, p->n + 1, sizeof *p->v, 64)) return -1;
    p->v[p->n++] = (tok_piece){off, len, id, origin};
    return 0;
}

tok_state *tok_state_new(const tok_tokenizer *t) {
    tok_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->md = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx) {
        tok_state_free(s);
        return NULL;
    }
    if (s->jit) pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    return s;
}

void tok_state_free(tok_state *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit);
    free(s->arena.p);
    free(s->a.v);
    free(s->b.v);
    free(s->segs.v);
    tok_smap_free(&s->cache);
    free(s->cache_at);
    free(s->cache_len);
    tok_ids_free(&s->cache_ids);
    free(s->sym);
    free(s->heap);
    free(s);
}

size_t tok_state_invalid_utf8(const tok_state *s) { return s->invalid; }
size_t tok_state_dropped(const tok_state *s) { return s->dropped; }

/* The text into the arena (repaired when it is not valid UTF-8) as the first piece. */
static int start(tok_state *st, const char *text, size_t len) {
    st->arena.n = 0;
    st->a.n = st->b.n = 0;
    size_t ok = tok_utf8_valid(text, len);
    if (ok == len) {
        if (tok_buf_add(&st->arena, text, len)) return -1;
    } else {
        if (tok_buf_add(&st->arena, text, ok)) return -1;
        size_t rest = len - ok, replaced = 0;
        if (tok_grow(&st->arena.p, &st->arena.cap, st->arena.n + 3 * rest, 1, 4096)) return -1;
        st->arena.n += tok_utf8_repair(text + ok, rest, st->arena.p + st->arena.n, &replaced);
        st->invalid += replaced;
    }
    return tok_pieces_push(&st->a, 0, st->arena.n, -1, 1);
}

static int normalize_all(tok_state *st, tok_pieces *p) {
    if (!st->t->norm) return 0;
    for (size_t k = 0; k < p->n; k++) {
        tok_piece *pc = &p->v[k];
        if (pc->id >= 0) continue;
        size_t off, len;
        int rc = tok_normalize_piece(st, st->t->norm, pc->off, pc->len, &off, &len);
        if (rc) return rc;
        pc->off = off;
        pc->len = len;
    }
    return 0;
}

static int failed(int rc, fsdp_err *err) {
    if (rc == -1) return fsdp_err_set(err, FSDP_E_NOMEM, "tokenizer: out of memory");
    return fsdp_err_set(err, FSDP_E_RUNTIME, "tokenizer: a regex failed to match (PCRE2 error; the JIT stack or the "
                        "match limit)");
}

int tok_encode(tok_state *st, const char *text, size_t len, int add_special, tok_ids *out, fsdp_err *err) {
    const tok_tokenizer *t = st->t;
    tok_pieces *in = &st->a, *o = &st->b;
    int rc = start(st, text, len);
    if (!rc) rc = tok_added_split(st, &t->trie_raw, in, o);
    if (!rc) rc = normalize_all(st, o);
    if (!rc) rc = tok_added_split(st, &t->trie_norm, o, in);
    if (!rc && t->pre) rc = tok_pretokenize(st, t->pre, &in, &o);
    if (rc) return failed(rc, err);
    if (add_special && tok_ids_append(out, t->prefix.v, t->prefix.n)) return failed(-1, err);
    for (size_t k = 0; k < in->n; k++) {
        const tok_piece *pc = &in->v[k];
        if (!pc->len && pc->id < 0) continue;
        rc = pc->id >= 0 ? tok_ids_push(out, pc->id) : tok_bpe_word(st, st->arena.p + pc->off, pc->len, out);
        if (rc) return failed(rc, err);
    }
    if (add_special && tok_ids_append(out, t->suffix.v, t->suffix.n)) return failed(-1, err);
    return 0;
}
