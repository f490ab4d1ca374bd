/* Hash maps of the tokenizer: byte strings -> int32 (the vocabulary, the word cache) with their own key
 * pool, and uint64 -> uint64 (the merges by pair of ids, the added tokens' trie edges). Open addressing,
 * linear probing, power-of-two capacity, at most half full. */
#ifndef FSDP_TOKENIZER_TOK_MAP_H
#define FSDP_TOKENIZER_TOK_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_smap {
    uint32_t *slot; /* entry index + 1; 0: empty */
    size_t cap;     /* slots, a power of two (0 before the first put) */
    uint64_t *hash;
    size_t *off;    /* key offsets in pool */
    uint32_t *len;
    int32_t *val;
    size_t n, ecap; /* entries */
    char *pool;
    size_t pool_n, pool_cap;
} tok_smap;

uint64_t tok_hash(const void *s, size_t n);

/* Grows the array *(T **)vp of elem-byte elements to room for need of them (the capacity doubles from
 * first); 0, or -1 when out of memory (the array is left as it was). */
int tok_grow(void *vp, size_t *cap, size_t need, size_t elem, size_t first);
/* Adds key -> v. 0: added; 1: the key was there (its value is left, *old receives it when not NULL); -1: out
 * of memory. */
int tok_smap_put(tok_smap *m, const char *key, size_t n, int32_t v, int32_t *old);
/* The value of key, -1 when absent. */
int32_t tok_smap_get(const tok_smap *m, const char *key, size_t n);
/* The same with the key's hash already computed. */
int32_t tok_smap_get_h(const tok_smap *m, const char *key, size_t n, uint64_t h);
/* Entry i's key (i < m->n, in the order of insertion). */
const char *tok_smap_key(const tok_smap *m, size_t i, size_t *n);
/* Room for n entries (and their keys' pool_bytes) without growing: 0, -1 when out of memory. */
int tok_smap_reserve(tok_smap *m, size_t n, size_t pool_bytes);
/* Empties the map, keeping its memory. */
void tok_smap_clear(tok_smap *m);
void tok_smap_free(tok_smap *m);

typedef struct tok_umap {
    uint64_t *key; /* key + 1; 0: empty */
    uint64_t *val;
    size_t cap, n;
} tok_umap;

int tok_umap_put(tok_umap *m, uint64_t key, uint64_t v); /* 0 added, 1 replaced, -1 out of memory */
int tok_umap_reserve(tok_umap *m, size_t n); /* room for n keys without growing */
int tok_umap_get(const tok_umap *m, uint64_t key, uint64_t *v); /* 1 found, 0 absent */
void tok_umap_free(tok_umap *m);

#endif
