/* The BPE model on one pre-tokenized word, as tokenizers' BPE merges it: the word's characters (their
 * <0xXX> bytes with byte_fallback, <unk> fused or not when neither is in the vocabulary), then the merge of
 * lowest rank, leftmost first, over a heap of candidate pairs until none is left; ignore_merges: a word in
 * the vocabulary is its own token. Words are cached per thread. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"
#include "tok_utf8.h"

struct tok_sym {
    int32_t c, prev, next;
    uint32_t len;
};

struct tok_merge {
    uint32_t rank, pos;
    int32_t id;
};

#define TOK_CACHE_MAX_WORD 256
#define TOK_CACHE_MAX_ENTRIES (1u << 16)

static int before(const struct tok_merge *a, const struct tok_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(tok_state *st, size_t *n, struct tok_merge m) {
    if (tok_grow(&st->heap, &st->heap_cap, *n + 1, sizeof *st->heap, 64)) return -1;
    struct tok_merge *h = st->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
    return 0;
}

static struct tok_merge heap_pop(tok_state *st, size_t *n) {
    struct tok_merge *h = st->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(&h[c + 1], &h[c])) c++;
        if (!before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static int sym_add(tok_state *st, size_t *n, int32_t c, uint32_t len) {
    if (tok_grow(&st->sym, &st->sym_cap, *n + 1, sizeof *st->sym, 64)) return -1;
    if (*n) st->sym[*n - 1].next = (int32_t)*n;
    st->sym[*n] = (struct tok_sym){c, (int32_t)*n - 1, -1, len};
    (*n)++;
    return 0;
}

static int pair_merge(const tok_bpe *b, int32_t x, int32_t y, uint32_t *rank, int32_t *id) {
    uint64_t v;
    if (!tok_umap_get(&b->merges, (uint64_t)(uint32_t)x << 32 | (uint32_t)y, &v)) return 0;
    *rank = (uint32_t)(v >> 32);
    *id = (int32_t)(uint32_t)v;
    return 1;
}

/* The word's symbols: its characters' ids (merge_word before merge_all). */
static int symbols(tok_state *st, const tok_bpe *b, const char *w, size_t n, size_t *ns) {
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len((unsigned char)w[i]);
        if (cl > n - i) cl = n - i;
        int32_t id = tok_smap_get(&b->vocab, w + i, cl);
        if (id >= 0) {
            if (unk >= 0 && sym_add(st, ns, unk, unk_len)) return -1;
            unk = -1;
            if (sym_add(st, ns, id, (uint32_t)cl)) return -1;
            i += cl;
            continue;
        }
        if (b->byte_fallback) {
            size_t k = 0;
            while (k < cl && b->byte_tok[(unsigned char)w[i + k]] >= 0) k++;
            if (k == cl) {
                for (k = 0; k < cl; k++)
                    if (sym_add(st, ns, b->byte_tok[(unsigned char)w[i + k]], 1)) return -1;
                i += cl;
                continue;
            }
        }
        if (b->unk < 0) st->dropped++; /* tokenizers drops a character it has no token for */
        else {
            if (unk >= 0 && b->fuse_unk) {
                unk_len += (uint32_t)cl;
            } else {
                if (unk >= 0 && sym_add(st, ns, unk, unk_len)) return -1;
                unk = b->unk;
                unk_len = (uint32_t)cl;
            }
        }
        i += cl;
    }
    if (unk >= 0 && sym_add(st, ns, unk, unk_len)) return -1;
    return 0;
}

static int merge_all(tok_state *st, const tok_bpe *b, size_t ns) {
    size_t nh = 0;
    uint32_t rank;
    int32_t id;
    struct tok_sym *s = st->sym;
    for (size_t i = 0; i + 1 < ns; i++)
        if (pair_merge(b, s[i].c, s[i + 1].c, &rank, &id) && heap_push(st, &nh, (struct tok_merge){rank, (uint32_t)i, id}))
            return -1;
    while (nh) {
        struct tok_merge top = heap_pop(st, &nh);
        s = st->sym;
        struct tok_sym *cur = &s[top.pos];
        if (!cur->len || cur->next < 0) continue;
        struct tok_sym right = s[cur->next];
        if (!pair_merge(b, cur->c, right.c, &rank, &id) || id != top.id) continue; /* an expired entry */
        int32_t gone = cur->next;
        cur->c = top.id;
        cur->len += right.len;
        cur->next = right.next;
        s[gone].len = 0;
        if (right.next >= 0) s[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && pair_merge(b, s[cur->prev].c, cur->c, &rank, &id) &&
            heap_push(st, &nh, (struct tok_merge){rank, (uint32_t)cur->prev, id}))
            return -1;
        cur = &st->sym[top.pos];
        if (cur->next >= 0 && pair_merge(b, cur->c, st->sym[cur->next].c, &rank, &id) &&
            heap_push(st, &nh, (struct tok_merge){rank, top.pos, id}))
            return -1;
    }
    return 0;
}

static int cache_put(tok_state *st, const char *w, size_t n, const int32_t *ids, size_t k) {
    if (st->cache.n >= TOK_CACHE_MAX_ENTRIES) {
        tok_smap_clear(&st->cache);
        st->cache_ids.n = 0;
    }
    size_t c = st->cache_cap; /* two arrays of one capacity */
    if (tok_grow(&st->cache_at, &c, st->cache.n + 1, sizeof *st->cache_at, 1024)) return -1;
    c = st->cache_cap;
    if (tok_grow(&st->cache_len, &c, st->cache.n + 1, sizeof *st->cache_len, 1024)) return -1;
    st->cache_cap = c;
    size_t e = st->cache.n;
    if (tok_smap_put(&st->cache, w, n, (int32_t)e, NULL) < 0) return -1;
    st->cache_at[e] = st->cache_ids.n;
    st->cache_len[e] = (uint32_t)k;
    return tok_ids_append(&st->cache_ids, ids, k);
}

int tok_bpe_word(tok_state *st, const char *w, size_t n, tok_ids *out) {
    const tok_bpe *b = &st->t->bpe;
    uint64_t h = tok_hash(w, n);
    if (b->ignore_merges) {
        int32_t id = tok_smap_get_h(&b->vocab, w, n, h);
        if (id >= 0) return tok_ids_push(out, id);
    }
    int cached = n < TOK_CACHE_MAX_WORD;
    if (cached) {
        int32_t e = tok_smap_get_h(&st->cache, w, n, h);
        if (e >= 0) return st->cache_len[e] ? tok_ids_append(out, st->cache_ids.v + st->cache_at[e], st->cache_len[e]) : 0;
    }
    size_t ns = 0;
    if (symbols(st, b, w, n, &ns) || merge_all(st, b, ns)) return -1;
    size_t first = out->n;
    for (size_t i = 0; i < ns; i++)
        if (st->sym[i].len && tok_ids_push(out, st->sym[i].c)) return -1;
    if (cached && cache_put(st, w, n, out->n > first ? out->v + first : NULL, out->n - first)) return -1;
    return 0;
}
