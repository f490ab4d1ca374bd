/* Pre-tokenizers: Split (a regex or a string, each SplitDelimiterBehavior, invert), ByteLevel (GPT-2's regex,
 * the prefix space, bytes as characters), Metaspace, Digits and Sequence, each as tokenizers' pre-tokenizer
 * of the same name splits and changes the pieces. */
#include <stdlib.h>
#include <string.h>
#include <unictype.h>

#include "tok_impl.h"
#include "tok_utf8.h"

/* Applies a SplitDelimiterBehavior to segments, in place: (a, b, keep) in seg->match after the call. */
static void behave(tok_segs *sg, int behavior) {
    size_t n = 0;
    int prev = 0;
    switch (behavior) {
    case TOK_SPLIT_ISOLATED:
        for (size_t k = 0; k < sg->n; k++) sg->v[k].match = 1;
        return;
    case TOK_SPLIT_REMOVED:
        for (size_t k = 0; k < sg->n; k++) sg->v[k].match = !sg->v[k].match;
        return;
    case TOK_SPLIT_CONTIGUOUS:
    case TOK_SPLIT_MERGED_PREV:
        for (size_t k = 0; k < sg->n; k++) {
            int m = sg->v[k].match;
            int join = behavior == TOK_SPLIT_CONTIGUOUS ? m == prev : m && !prev;
            if (join && n) sg->v[n - 1].b = sg->v[k].b;
            else sg->v[n++] = (tok_seg){sg->v[k].a, sg->v[k].b, 1};
            prev = m;
        }
        sg->n = n;
        return;
    case TOK_SPLIT_MERGED_NEXT: { /* folded from the end, written from the end */
        size_t w = sg->n;
        for (size_t k = sg->n; k-- > 0;) {
            int m = sg->v[k].match;
            if (m && !prev && w < sg->n) sg->v[w].a = sg->v[k].a;
            else sg->v[--w] = (tok_seg){sg->v[k].a, sg->v[k].b, 1};
            prev = m;
        }
        memmove(sg->v, sg->v + w, (sg->n - w) * sizeof *sg->v);
        sg->n -= w;
        return;
    }
    }
}

static int emit(const tok_piece *pc, const tok_segs *sg, tok_pieces *out) {
    for (size_t k = 0; k < sg->n; k++) {
        const tok_seg *g = &sg->v[k];
        if (!g->match || g->b == g->a) continue;
        if (tok_pieces_push(out, pc->off + g->a, g->b - g->a, -1, pc->origin && g->a == 0)) return -1;
    }
    return 0;
}

static int split_re(tok_state *st, int re, int behavior, int invert, const tok_piece *pc, tok_segs *sg,
                    tok_pieces *out) {
    int rc = tok_re_segments(st, st->t->re[re], st->arena.p + pc->off, pc->len, sg);
    if (rc) return rc;
    if (invert)
        for (size_t k = 0; k < sg->n; k++) sg->v[k].match = !sg->v[k].match;
    behave(sg, behavior);
    return emit(pc, sg, out);
}

/* Digits: each numeric character (char::is_numeric: Nd, Nl, No) a match. */
static int split_digits(tok_state *st, const tok_pretok *p, const tok_piece *pc, tok_segs *sg, tok_pieces *out) {
    const char *s = st->arena.p + pc->off;
    size_t last = 0, i = 0;
    sg->n = 0;
    while (i < pc->len) {
        size_t b = i;
        uint32_t c = tok_utf8_next(s, &i);
        if (!uc_is_general_category(c, UC_CATEGORY_N)) continue;
        if (last < b && tok_segs_push(sg, last, b, 0)) return -1;
        if (tok_segs_push(sg, b, i, 1)) return -1;
        last = i;
    }
    if (last < pc->len && tok_segs_push(sg, last, pc->len, 0)) return -1;
    behave(sg, p->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS);
    return emit(pc, sg, out);
}

/* ByteLevel's bytes as characters, a new string of the arena. */
static int map_bytes(tok_state *st, tok_piece *pc) {
    const tok_tokenizer *t = st->t;
    size_t at = st->arena.n;
    for (size_t i = 0; i < pc->len; i++) {
        unsigned char b = (unsigned char)st->arena.p[pc->off + i];
        if (tok_buf_add(&st->arena, t->bl_utf8[b], t->bl_len[b])) return -1;
    }
    pc->off = at;
    pc->len = st->arena.n - at;
    return 0;
}

static int bytelevel(tok_state *st, const tok_pretok *p, const tok_piece *in, tok_segs *sg, tok_pieces *out) {
    tok_piece pc = *in;
    if (p->add_prefix_space && st->arena.p[pc.off] != ' ') {
        size_t at = st->arena.n;
        if (tok_buf_add(&st->arena, " ", 1) || tok_buf_add(&st->arena, st->arena.p + pc.off, pc.len)) return -1;
        pc.off = at;
        pc.len++;
    }
    size_t first = out->n;
    if (p->use_regex) {
        int rc = split_re(st, p->re, TOK_SPLIT_ISOLATED, 0, &pc, sg, out);
        if (rc) return rc;
    } else if (tok_pieces_push(out, pc.off, pc.len, -1, pc.origin)) {
        return -1;
    }
    for (size_t k = first; k < out->n; k++)
        if (map_bytes(st, &out->v[k])) return -1;
    return 0;
}

static int metaspace(tok_state *st, const tok_pretok *p, const tok_piece *in, tok_segs *sg, tok_pieces *out) {
    tok_piece pc = *in;
    size_t at = st->arena.n;
    int prepend = p->prepend_scheme == TOK_PREPEND_ALWAYS || (p->prepend_scheme == TOK_PREPEND_FIRST && pc.origin);
    /* starts with the replacement after ' ' became it */
    const char *s0 = st->arena.p + pc.off;
    int starts = s0[0] == ' ' || (pc.len >= p->repl_n && !memcmp(s0, p->repl, p->repl_n));
    if (prepend && !starts && tok_buf_add(&st->arena, p->repl, p->repl_n)) return -1;
    for (size_t i = 0; i < pc.len; i++) {
        char c = st->arena.p[pc.off + i];
        if (c == ' ' ? tok_buf_add(&st->arena, p->repl, p->repl_n) : tok_buf_add(&st->arena, &c, 1)) return -1;
    }
    pc.off = at;
    pc.len = st->arena.n - at;
    if (p->split) return split_re(st, p->re, TOK_SPLIT_MERGED_NEXT, 0, &pc, sg, out);
    return tok_pieces_push(out, pc.off, pc.len, -1, pc.origin);
}

static int one(tok_state *st, const tok_pretok *p, tok_pieces *in, tok_pieces *out, tok_segs *sg) {
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        tok_piece pc = in->v[k];
        int rc = 0;
        if (pc.id >= 0) {
            rc = tok_pieces_push(out, pc.off, pc.len, pc.id, pc.origin);
        } else if (pc.len) {
            switch (p->kind) {
            case TOK_PRE_SPLIT: rc = split_re(st, p->re, p->behavior, p->invert, &pc, sg, out); break;
            case TOK_PRE_BYTELEVEL: rc = bytelevel(st, p, &pc, sg, out); break;
            case TOK_PRE_METASPACE: rc = metaspace(st, p, &pc, sg, out); break;
            case TOK_PRE_DIGITS: rc = split_digits(st, p, &pc, sg, out); break;
            default: rc = -1;
            }
        }
        if (rc) return rc;
    }
    return 0;
}

int tok_pretokenize(tok_state *st, const tok_pretok *p, tok_pieces **in, tok_pieces **out) {
    if (p->kind == TOK_PRE_SEQUENCE) {
        for (size_t k = 0; k < p->n_sub; k++) {
            int rc = tok_pretokenize(st, &p->sub[k], in, out);
            if (rc) return rc;
        }
        return 0;
    }
    int rc = one(st, p, *in, *out, &st->segs);
    tok_pieces *t = *in;
    *in = *out;
    *out = t;
    return rc;
}

static void pretok_clear(tok_pretok *p) {
    for (size_t k = 0; k < p->n_sub; k++) pretok_clear(&p->sub[k]);
    free(p->sub);
}

void tok_pretok_free(tok_pretok *p) {
    if (!p) return;
    pretok_clear(p);
    free(p);
}
