/* String -> index hash table: open addressing with linear probing, grown at 1/2 load. */
#include "pipeline/strmap.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a over the bytes, then a 64-bit finaliser so that the low bits (the slot) depend on every byte. */
static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

void strmap_init(strmap *m) { memset(m, 0, sizeof *m); }

void strmap_free(strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* The slot of key (its own or the empty one where it would go); cap must be > n. */
static size_t probe(const strmap_slot *slots, size_t cap, const char *key, uint64_t h) {
    size_t mask = cap - 1, i = (size_t)h & mask;
    while (slots[i].key && (slots[i].hash != h || strcmp(slots[i].key, key))) i = (i + 1) & mask;
    return i;
}

static int grow(strmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    if (cap < m->cap || cap > SIZE_MAX / sizeof(strmap_slot)) return -1;
    strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        slots[probe(slots, cap, m->slots[i].key, m->slots[i].hash)] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int strmap_put(strmap *m, const char *key, size_t val) {
    if ((m->n + 1) * 2 > m->cap && grow(m)) return -1;
    uint64_t h = hash_str(key);
    size_t i = probe(m->slots, m->cap, key, h);
    if (!m->slots[i].key) {
        m->slots[i].key = key;
        m->slots[i].hash = h;
        m->n++;
    }
    m->slots[i].val = val;
    return 0;
}

int strmap_get(const strmap *m, const char *key, size_t *val) {
    if (!m->cap) return 0;
    uint64_t h = hash_str(key);
    size_t i = probe(m->slots, m->cap, key, h);
    if (!m->slots[i].key) return 0;
    *val = m->slots[i].val;
    return 1;
}
