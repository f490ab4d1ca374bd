#include "tok_map.h"

#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t tok_hash(const void *s, size_t n) {
    const unsigned char *p = s;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0x100000001b3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ mix(w)) * 0x100000001b3ULL;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix(h ^ w ^ ((uint64_t)n << 56));
}

int tok_grow(void *vp, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : first;
    while (c < need) c *= 2;
    void *old;
    memcpy(&old, vp, sizeof old);
    void *p = realloc(old, c * elem);
    if (!p) return -1;
    memcpy(vp, &p, sizeof p);
    *cap = c;
    return 0;
}

static int smap_grow_slots(tok_smap *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = (size_t)m->hash[e] & (cap - 1);
        while (slot[i]) i = (i + 1) & (cap - 1);
        slot[i] = (uint32_t)(e + 1);
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return 0;
}

static int smap_grow_entries(tok_smap *m) {
    size_t need = m->ecap ? m->ecap * 2 : 32, c;
    /* four arrays of one capacity: each grown from the old one, the capacity set once all are */
    c = m->ecap;
    if (tok_grow(&m->hash, &c, need, sizeof *m->hash, 32)) return -1;
    c = m->ecap;
    if (tok_grow(&m->off, &c, need, sizeof *m->off, 32)) return -1;
    c = m->ecap;
    if (tok_grow(&m->len, &c, need, sizeof *m->len, 32)) return -1;
    c = m->ecap;
    if (tok_grow(&m->val, &c, need, sizeof *m->val, 32)) return -1;
    m->ecap = c;
    return 0;
}

static long smap_find(const tok_smap *m, const char *key, size_t n, uint64_t h, size_t *at) {
    if (!m->cap) return -1;
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        uint32_t s = m->slot[i];
        if (!s) {
            if (at) *at = i;
            return -1;
        }
        size_t e = s - 1;
        if (m->hash[e] == h && m->len[e] == n && !memcmp(m->pool + m->off[e], key, n)) return (long)e;
        i = (i + 1) & (m->cap - 1);
    }
}

int tok_smap_put(tok_smap *m, const char *key, size_t n, int32_t v, int32_t *old) {
    uint64_t h = tok_hash(key, n);
    long e = smap_find(m, key, n, h, NULL);
    if (e >= 0) {
        if (old) *old = m->val[e];
        return 1;
    }
    if ((m->n + 1) * 2 > m->cap && smap_grow_slots(m)) return -1;
    if (m->n == m->ecap && smap_grow_entries(m)) return -1;
    if (tok_grow(&m->pool, &m->pool_cap, m->pool_n + n + 1, 1, 4096)) return -1;
    memcpy(m->pool + m->pool_n, key, n);
    m->pool[m->pool_n + n] = 0;
    size_t at = 0;
    smap_find(m, key, n, h, &at);
    m->hash[m->n] = h;
    m->off[m->n] = m->pool_n;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = v;
    m->slot[at] = (uint32_t)(m->n + 1);
    m->n++;
    m->pool_n += n + 1;
    return 0;
}

int tok_smap_reserve(tok_smap *m, size_t n, size_t pool_bytes) {
    while ((n + 1) * 2 > m->cap)
        if (smap_grow_slots(m)) return -1;
    while (n > m->ecap)
        if (smap_grow_entries(m)) return -1;
    return tok_grow(&m->pool, &m->pool_cap, pool_bytes, 1, 4096);
}

int32_t tok_smap_get_h(const tok_smap *m, const char *key, size_t n, uint64_t h) {
    long e = smap_find(m, key, n, h, NULL);
    return e >= 0 ? m->val[e] : -1;
}

int32_t tok_smap_get(const tok_smap *m, const char *key, size_t n) {
    return tok_smap_get_h(m, key, n, tok_hash(key, n));
}

const char *tok_smap_key(const tok_smap *m, size_t i, size_t *n) {
    *n = m->len[i];
    return m->pool + m->off[i];
}

void tok_smap_clear(tok_smap *m) {
    if (m->cap) memset(m->slot, 0, m->cap * sizeof *m->slot);
    m->n = 0;
    m->pool_n = 0;
}

void tok_smap_free(tok_smap *m) {
    free(m->slot);
    free(m->hash);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

static int umap_grow(tok_umap *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint64_t *key = calloc(cap, sizeof *key), *val = malloc(cap * sizeof *val);
    if (!key || !val) {
        free(key);
        free(val);
        return -1;
    }
    for (size_t j = 0; j < m->cap; j++) {
        if (!m->key[j]) continue;
        size_t i = (size_t)mix(m->key[j]) & (cap - 1);
        while (key[i]) i = (i + 1) & (cap - 1);
        key[i] = m->key[j];
        val[i] = m->val[j];
    }
    free(m->key);
    free(m->val);
    m->key = key;
    m->val = val;
    m->cap = cap;
    return 0;
}

int tok_umap_put(tok_umap *m, uint64_t key, uint64_t v) {
    if ((m->n + 1) * 2 > m->cap && umap_grow(m)) return -1;
    uint64_t k = key + 1;
    size_t i = (size_t)mix(k) & (m->cap - 1);
    while (m->key[i] && m->key[i] != k) i = (i + 1) & (m->cap - 1);
    int had = m->key[i] != 0;
    m->key[i] = k;
    m->val[i] = v;
    if (!had) m->n++;
    return had;
}

int tok_umap_reserve(tok_umap *m, size_t n) {
    while ((n + 1) * 2 > m->cap)
        if (umap_grow(m)) return -1;
    return 0;
}

int tok_umap_get(const tok_umap *m, uint64_t key, uint64_t *v) {
    if (!m->cap) return 0;
    uint64_t k = key + 1;
    size_t i = (size_t)mix(k) & (m->cap - 1);
    while (m->key[i]) {
        if (m->key[i] == k) {
            *v = m->val[i];
            return 1;
        }
        i = (i + 1) & (m->cap - 1);
    }
    return 0;
}

void tok_umap_free(tok_umap *m) {
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}
