/* Decoding ids back to text, as tokenizers' Tokenizer::decode does it: each id's token (an added token's
 * content over the model's), special ones left out when asked, then the decoder's chain over the list of
 * tokens (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence) and the pieces joined. Without
 * a decoder the tokens are joined with spaces. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"
#include "tok_utf8.h"

typedef struct dlist {
    tok_buf buf;
    size_t *off, *len;
    size_t n, cap;
} dlist;

static int dl_add(dlist *d, const char *s, size_t n) {
    size_t c = d->cap; /* two arrays of one capacity */
    if (tok_grow(&d->off, &c, d->n + 1, sizeof *d->off, 64)) return -1;
    c = d->cap;
    if (tok_grow(&d->len, &c, d->n + 1, sizeof *d->len, 64)) return -1;
    d->cap = c;
    d->off[d->n] = d->buf.n;
    d->len[d->n] = n;
    d->n++;
    return tok_buf_add(&d->buf, s, n);
}

/* Appends to the last string of d. */
static int dl_more(dlist *d, const char *s, size_t n) {
    d->len[d->n - 1] += n;
    return tok_buf_add(&d->buf, s, n);
}

static void dl_free(dlist *d) {
    free(d->buf.p);
    free(d->off);
    free(d->len);
    memset(d, 0, sizeof *d);
}

#define STR(d, i) ((d)->buf.p ? (d)->buf.p + (d)->off[i] : "")

static int bytelevel(const dlist *in, dlist *out) {
    tok_buf raw = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        const char *s = STR(in, i);
        size_t n = in->len[i], at = raw.n, j = 0;
        int all = 1;
        while (j < n && all) {
            int b = tok_bytelevel_byte(tok_utf8_next(s, &j));
            if (b < 0) all = 0;
            else {
                char c = (char)b;
                rc = tok_buf_add(&raw, &c, 1);
            }
        }
        if (!all) {
            raw.n = at;
            rc = tok_buf_add(&raw, s, n);
        }
    }
    char *fixed = rc ? NULL : malloc(3 * raw.n + 1);
    if (!fixed) rc = -1;
    else {
        size_t replaced;
        size_t m = tok_utf8_repair(raw.p ? raw.p : "", raw.n, fixed, &replaced);
        rc = dl_add(out, fixed, m);
    }
    free(fixed);
    free(raw.p);
    return rc;
}

/* Replaces each occurrence of the character cp in token i; drop: leaves it out instead. */
static int metaspace(const tok_dec *d, const dlist *in, dlist *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = STR(in, i);
        size_t n = in->len[i], j = 0;
        if (dl_add(out, "", 0)) return -1;
        int drop = i == 0 && d->prepend_scheme != TOK_PREPEND_NEVER;
        while (j < n) {
            size_t a = j;
            uint32_t c = tok_utf8_next(s, &j);
            int rc = c == d->cp ? (drop ? 0 : dl_more(out, " ", 1)) : dl_more(out, STR(in, i) + a, j - a);
            if (rc) return -1;
            s = STR(in, i); /* the buffers are distinct: in's does not move */
        }
    }
    return 0;
}

static int replace(tok_state *st, const tok_dec *d, const dlist *in, dlist *out) {
    tok_segs sg = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        rc = tok_re_segments(st, st->t->re[d->re], STR(in, i), in->len[i], &sg);
        if (!rc) rc = dl_add(out, "", 0);
        for (size_t k = 0; k < sg.n && !rc; k++)
            rc = sg.v[k].match ? dl_more(out, d->content, d->content_n)
                               : dl_more(out, STR(in, i) + sg.v[k].a, sg.v[k].b - sg.v[k].a);
    }
    free(sg.v);
    return rc;
}

static int byte_of(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static int flush_bytes(tok_buf *bytes, dlist *out) {
    if (!bytes->n) return 0;
    int rc = 0;
    if (tok_utf8_valid(bytes->p, bytes->n) == bytes->n) rc = dl_add(out, bytes->p, bytes->n);
    else
        for (size_t k = 0; k < bytes->n && !rc; k++) rc = dl_add(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
    return rc;
}

static int bytefallback(const dlist *in, dlist *out) {
    tok_buf bytes = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        int b = byte_of(STR(in, i), in->len[i]);
        if (b >= 0) {
            char c = (char)b;
            rc = tok_buf_add(&bytes, &c, 1);
            continue;
        }
        rc = flush_bytes(&bytes, out);
        if (!rc) rc = dl_add(out, STR(in, i), in->len[i]);
    }
    if (!rc) rc = flush_bytes(&bytes, out);
    free(bytes.p);
    return rc;
}

static int strip(const tok_dec *d, const dlist *in, dlist *out) {
    char cb[4];
    size_t cl = tok_utf8_put(d->cp, cb);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = STR(in, i);
        size_t a = 0, b = in->len[i];
        for (int k = 0; k < d->start && a + cl <= b && !memcmp(s + a, cb, cl); k++) a += cl;
        for (int k = 0; k < d->stop && b >= a + cl && !memcmp(s + b - cl, cb, cl); k++) b -= cl;
        if (dl_add(out, s + a, b - a)) return -1;
    }
    return 0;
}

static int chain(tok_state *st, const tok_dec *d, dlist *io) {
    if (d->kind == TOK_DEC_SEQUENCE) {
        for (size_t k = 0; k < d->n_sub; k++)
            if (chain(st, &d->sub[k], io)) return -1;
        return 0;
    }
    dlist out = {0};
    int rc;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL: rc = bytelevel(io, &out); break;
    case TOK_DEC_METASPACE: rc = metaspace(d, io, &out); break;
    case TOK_DEC_REPLACE: rc = replace(st, d, io, &out); break;
    case TOK_DEC_BYTEFALLBACK: rc = bytefallback(io, &out); break;
    case TOK_DEC_FUSE:
        rc = dl_add(&out, "", 0);
        for (size_t i = 0; i < io->n && !rc; i++) rc = dl_more(&out, STR(io, i), io->len[i]);
        break;
    case TOK_DEC_STRIP: rc = strip(d, io, &out); break;
    default: rc = -1;
    }
    dl_free(io);
    *io = out;
    return rc;
}

static int dec_regex(const tok_dec *d) {
    if (!d) return 0;
    if (d->kind == TOK_DEC_REPLACE) return 1;
    for (size_t k = 0; k < d->n_sub; k++)
        if (dec_regex(&d->sub[k])) return 1;
    return 0;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text, size_t *len,
               fsdp_err *err) {
    dlist d = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || t->id_len[id] == UINT32_MAX) {
            dl_free(&d);
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: id %d at position %zu is not in the vocabulary (ids 0..%d)",
                                t->name, (int)id, i, (int)t->vocab_size - 1);
        }
        if (skip_special && t->id_special[id]) continue;
        rc = dl_add(&d, t->id_pool + t->id_off[id], t->id_len[id]);
    }
    /* a workspace (match data, a JIT stack) only where a decoder runs a regex */
    tok_state *st = rc || !dec_regex(t->dec) ? NULL : tok_state_new(t);
    if (!rc && dec_regex(t->dec) && !st) rc = -1;
    if (!rc && t->dec) rc = chain(st, t->dec, &d);
    tok_state_free(st);
    tok_buf joined = {0};
    for (size_t i = 0; i < d.n && !rc; i++) {
        if (!t->dec && i && tok_buf_add(&joined, " ", 1)) rc = -1;
        if (!rc) rc = tok_buf_add(&joined, STR(&d, i), d.len[i]);
    }
    if (!rc) rc = tok_buf_add(&joined, "", 1);
    dl_free(&d);
    if (rc) {
        free(joined.p);
        return fsdp_err_set(err, FSDP_E_NOMEM, "tokenizer: out of memory while decoding");
    }
    *text = joined.p;
    *len = joined.n - 1;
    return 0;
}

static void dec_clear(tok_dec *d) {
    for (size_t k = 0; k < d->n_sub; k++) dec_clear(&d->sub[k]);
    free(d->sub);
    free(d->content);
}

void tok_dec_free(tok_dec *d) {
    if (!d) return;
    dec_clear(d);
    free(d);
}
