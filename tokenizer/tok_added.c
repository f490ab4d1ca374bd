/* Added tokens in the text, found as tokenizers' AddedVocabulary finds them: leftmost-longest matches of
 * the tokens' bytes (Aho-Corasick there, a trie here), a single_word token only between non-word characters,
 * lstrip / rstrip taking the white space before / after it. */
#include <stdlib.h>
#include <string.h>
#include <unictype.h>

#include "tok_impl.h"
#include "tok_utf8.h"

static int trie_node(tok_trie *t) {
    if (tok_grow(&t->tok, &t->cap, t->n_nodes + 1, sizeof *t->tok, 64)) return -1;
    t->tok[t->n_nodes] = -1;
    return (int)t->n_nodes++;
}

int tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t tok) {
    if (!t->n_nodes && trie_node(t) < 0) return -1;
    if (!n) return 0; /* an empty token never matches */
    uint64_t node = 0, child;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (unsigned char)s[i];
        if (!tok_umap_get(&t->edge, key, &child)) {
            int c = trie_node(t);
            if (c < 0 || tok_umap_put(&t->edge, key, (uint64_t)c) < 0) return -1;
            child = (uint64_t)c;
        }
        node = child;
    }
    t->first[(unsigned char)s[0]] = 1;
    t->tok[node] = tok;
    return 0;
}

void tok_trie_free(tok_trie *t) {
    tok_umap_free(&t->edge);
    free(t->tok);
    memset(t, 0, sizeof *t);
}

/* Rust regex's \w and \s (Unicode), as the added vocabulary tests them. */
static int word_char(uint32_t c) {
    return uc_is_property_alphabetic(c) || uc_is_general_category(c, UC_CATEGORY_M) ||
           uc_is_general_category(c, UC_CATEGORY_Nd) || uc_is_general_category(c, UC_CATEGORY_Pc) || c == 0x200C ||
           c == 0x200D;
}

static uint32_t last_char(const char *s, size_t end) {
    size_t i = end;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
    if (i > 0) i--;
    return tok_utf8_next(s, &i);
}

/* The start of the white space run ending at end. */
static size_t space_back(const char *s, size_t end) {
    while (end > 0) {
        size_t i = end;
        while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
        if (i > 0) i--;
        size_t j = i;
        if (!uc_is_property_white_space(tok_utf8_next(s, &j))) break;
        end = i;
    }
    return end;
}

static size_t space_fwd(const char *s, size_t n, size_t at) {
    while (at < n) {
        size_t j = at;
        if (!uc_is_property_white_space(tok_utf8_next(s, &j))) break;
        at = j;
    }
    return at;
}

/* The longest token starting at s[i], its end in *end; -1 when none. */
static int32_t longest_at(const tok_trie *t, const char *s, size_t n, size_t i, size_t *end) {
    uint64_t node = 0, child;
    int32_t best = -1;
    for (size_t j = i; j < n; j++) {
        if (!tok_umap_get(&t->edge, node << 8 | (unsigned char)s[j], &child)) break;
        node = child;
        if (t->tok[node] >= 0) {
            best = t->tok[node];
            *end = j + 1;
        }
    }
    return best;
}

/* The splits of one piece (what find_matches returns), appended to out. */
static int split_piece(tok_state *st, const tok_trie *trie, const tok_piece *pc, tok_pieces *out) {
    const tok_tokenizer *t = st->t;
    const char *s = st->arena.p + pc->off;
    size_t n = pc->len, start_offset = 0, i = 0;
    while (i < n) {
        size_t end = 0;
        int32_t k = trie->first[(unsigned char)s[i]] ? longest_at(trie, s, n, i, &end) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[k];
        size_t start = i, stop = end;
        i = end;
        if (a->single_word) {
            int start_space = start == 0 || !word_char(last_char(s, start));
            size_t j = stop;
            int stop_space = stop == n || !word_char(tok_utf8_next(s, &j));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = space_back(s, start);
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) stop = space_fwd(s, n, stop);
        if (start_offset < start &&
            tok_pieces_push(out, pc->off + start_offset, start - start_offset, -1, pc->origin && start_offset == 0))
            return -1;
        if (tok_pieces_push(out, pc->off + start, stop - start, a->id, 0)) return -1;
        start_offset = stop;
    }
    if (start_offset != n &&
        tok_pieces_push(out, pc->off + start_offset, n - start_offset, -1, pc->origin && start_offset == 0))
        return -1;
    return 0;
}

int tok_added_split(tok_state *st, const tok_trie *trie, tok_pieces *in, tok_pieces *out) {
    out->n = 0;
    for (size_t p = 0; p < in->n; p++) {
        const tok_piece *pc = &in->v[p];
        if (pc->id < 0 && !pc->len) continue; /* pieces left empty are dropped, as tokenizers drops them */
        if (pc->id >= 0 || !trie->n_nodes) {
            if (tok_pieces_push(out, pc->off, pc->len, pc->id, pc->origin)) return -1;
            continue;
        }
        if (split_piece(st, trie, pc, out)) return -1;
    }
    return 0;
}
