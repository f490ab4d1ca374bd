/* Normalizers: Unicode normalization forms (libunistring), Prepend, Replace, Strip and Sequence, each as
 * tokenizers' normalizer of the same name changes a piece of text. */
#include <stdlib.h>
#include <string.h>
#include <uninorm.h>
#include <unictype.h>

#include "tok_impl.h"
#include "tok_utf8.h"

static int unicode_form(tok_state *st, int kind, size_t off, size_t len, size_t *noff, size_t *nlen) {
    uninorm_t nf = kind == TOK_NORM_NFC ? UNINORM_NFC : kind == TOK_NORM_NFD ? UNINORM_NFD
                   : kind == TOK_NORM_NFKC ? UNINORM_NFKC : UNINORM_NFKD;
    /* ASCII is the same in every form */
    const unsigned char *s = (const unsigned char *)st->arena.p + off;
    size_t i = 0;
    while (i < len && s[i] < 0x80) i++;
    if (i == len) {
        *noff = off;
        *nlen = len;
        return 0;
    }
    size_t rn = 0;
    uint8_t *r = u8_normalize(nf, s, len, NULL, &rn);
    if (!r) return -1;
    *noff = st->arena.n;
    *nlen = rn;
    int rc = tok_buf_add(&st->arena, (const char *)r, rn);
    free(r);
    return rc;
}

static int replace(tok_state *st, const tok_norm *nm, size_t off, size_t len, size_t *noff, size_t *nlen) {
    tok_segs segs = {0};
    int rc = tok_re_segments(st, st->t->re[nm->re], st->arena.p + off, len, &segs);
    if (rc) {
        free(segs.v);
        return rc;
    }
    int any = 0;
    for (size_t k = 0; k < segs.n; k++) any |= segs.v[k].match;
    if (!any) {
        free(segs.v);
        *noff = off;
        *nlen = len;
        return 0;
    }
    size_t at = st->arena.n;
    for (size_t k = 0; k < segs.n && !rc; k++) {
        const tok_seg *g = &segs.v[k];
        rc = g->match ? tok_buf_add(&st->arena, nm->str, nm->str_n)
                      : tok_buf_add(&st->arena, st->arena.p + off + g->a, g->b - g->a);
    }
    free(segs.v);
    *noff = at;
    *nlen = st->arena.n - at;
    return rc;
}

static void strip(tok_state *st, const tok_norm *nm, size_t *off, size_t *len) {
    const char *s = st->arena.p;
    size_t a = *off, b = *off + *len;
    if (nm->left)
        while (a < b) {
            size_t j = a;
            if (!uc_is_property_white_space(tok_utf8_next(s, &j))) break;
            a = j;
        }
    if (nm->right)
        while (b > a) {
            size_t i = b - 1;
            while (i > a && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
            size_t j = i;
            if (!uc_is_property_white_space(tok_utf8_next(s, &j))) break;
            b = i;
        }
    *off = a;
    *len = b - a;
}

int tok_normalize_piece(tok_state *st, const tok_norm *nm, size_t off, size_t len, size_t *noff, size_t *nlen) {
    switch (nm->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: return unicode_form(st, nm->kind, off, len, noff, nlen);
    case TOK_NORM_PREPEND:
        if (!len) break;
        *noff = st->arena.n;
        *nlen = nm->str_n + len;
        if (tok_buf_add(&st->arena, nm->str, nm->str_n)) return -1;
        return tok_buf_add(&st->arena, st->arena.p + off, len);
    case TOK_NORM_REPLACE: return replace(st, nm, off, len, noff, nlen);
    case TOK_NORM_STRIP: strip(st, nm, &off, &len); break;
    case TOK_NORM_SEQUENCE:
        for (size_t k = 0; k < nm->n_sub; k++) {
            int rc = tok_normalize_piece(st, &nm->sub[k], off, len, &off, &len);
            if (rc) return rc;
        }
        break;
    }
    *noff = off;
    *nlen = len;
    return 0;
}

int tok_normalize_string(tok_state *st, const tok_norm *nm, const char *s, size_t n, char **out, size_t *on) {
    size_t off = 0, len = n;
    st->arena.n = 0;
    int rc = tok_buf_add(&st->arena, s, n);
    if (!rc) rc = tok_normalize_piece(st, nm, 0, n, &off, &len);
    if (!rc) {
        *out = malloc(len + 1);
        if (!*out) rc = -1;
        else {
            memcpy(*out, st->arena.p + off, len);
            (*out)[len] = 0;
            *on = len;
        }
    }
    return rc;
}

static void norm_clear(tok_norm *n) {
    for (size_t k = 0; k < n->n_sub; k++) norm_clear(&n->sub[k]);
    free(n->sub);
    free(n->str);
}

void tok_norm_free(tok_norm *n) {
    if (!n) return;
    norm_clear(n);
    free(n);
}
