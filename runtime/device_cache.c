/* Size-class caching allocator (see device_cache.h). Live blocks are found by pointer in an
 * open-addressing hash table (linear probing, backward-shift deletion). */
#include "runtime/device_cache.h"

#include <stdlib.h>
#include <string.h>

#define DC_MIN_CLASS ((size_t)512)
#define DC_MIN_LOG 9
#define DC_SUBSTEPS 8 /* classes per power of two */
#define DC_NCLASSES (1 + DC_SUBSTEPS * (64 - DC_MIN_LOG))

typedef struct dc_block {
    void *ptr;
    size_t size;      /* class size */
    size_t requested; /* bytes asked for (live blocks) */
    void *fence;      /* pending blocks */
    struct dc_block *next;
} dc_block;

struct dev_cache {
    dev_cache_backend be;
    dc_block *free_lists[DC_NCLASSES];
    dc_block *pending;
    dc_block *spare; /* recycled nodes */
    dc_block **live; /* hash table of live blocks, NULL = empty slot */
    size_t live_cap, live_count;
    dev_mem_stats st;
};

static int floor_log2(size_t x) { return 63 - __builtin_clzll((unsigned long long)x); }

/* Class index and size of a request; 0 size on overflow. */
static size_t class_of(size_t bytes, int *index) {
    if (bytes <= DC_MIN_CLASS) {
        *index = 0;
        return DC_MIN_CLASS;
    }
    int k = floor_log2(bytes - 1); /* 2^k < bytes <= 2^(k+1), k >= 9 */
    size_t step = (size_t)1 << (k - 3);
    if (bytes > SIZE_MAX - (step - 1)) return 0;
    size_t c = (bytes + step - 1) & ~(step - 1);
    int i = (int)(c / step) - DC_SUBSTEPS; /* 1..8 */
    *index = 1 + DC_SUBSTEPS * (k - DC_MIN_LOG) + (i - 1);
    return c;
}

size_t dev_cache_class_size(size_t bytes) {
    int idx;
    return class_of(bytes, &idx);
}

static size_t hash_ptr(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static int live_grow(dev_cache *c) {
    size_t cap = c->live_cap ? c->live_cap * 2 : 256;
    if (cap > SIZE_MAX / sizeof(dc_block *)) return 0;
    dc_block **t = calloc(cap, sizeof *t);
    if (!t) return 0;
    for (size_t i = 0; i < c->live_cap; i++) {
        dc_block *b = c->live[i];
        if (!b) continue;
        size_t h = hash_ptr(b->ptr, cap);
        while (t[h]) h = (h + 1) & (cap - 1);
        t[h] = b;
    }
    free(c->live);
    c->live = t;
    c->live_cap = cap;
    return 1;
}

static int live_insert(dev_cache *c, dc_block *b) {
    if ((c->live_count + 1) * 2 > c->live_cap && !live_grow(c)) return 0;
    size_t h = hash_ptr(b->ptr, c->live_cap);
    while (c->live[h]) h = (h + 1) & (c->live_cap - 1);
    c->live[h] = b;
    c->live_count++;
    return 1;
}

static dc_block *live_remove(dev_cache *c, const void *ptr) {
    if (!c->live_cap) return NULL;
    size_t mask = c->live_cap - 1, h = hash_ptr(ptr, c->live_cap);
    while (c->live[h] && c->live[h]->ptr != ptr) h = (h + 1) & mask;
    dc_block *b = c->live[h];
    if (!b) return NULL;
    c->live[h] = NULL;
    c->live_count--;
    /* Backward shift: move later entries of the probe run into the hole when allowed. */
    size_t hole = h, j = (h + 1) & mask;
    while (c->live[j]) {
        size_t home = hash_ptr(c->live[j]->ptr, c->live_cap);
        /* entry j may move to hole when hole lies cyclically in [home, j) */
        int movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            c->live[hole] = c->live[j];
            c->live[j] = NULL;
            hole = j;
        }
        j = (j + 1) & mask;
    }
    return b;
}

static dc_block *node_get(dev_cache *c) {
    dc_block *b = c->spare;
    if (b) {
        c->spare = b->next;
        memset(b, 0, sizeof *b);
        return b;
    }
    return calloc(1, sizeof *b);
}

static void node_put(dev_cache *c, dc_block *b) {
    b->next = c->spare;
    c->spare = b;
}

dev_cache *dev_cache_create(const dev_cache_backend *be, fsdp_err *err) {
    if (!be || !be->alloc || !be->release || (!be->fence_ready != !be->fence_release)) {
        fsdp_err_set(err, FSDP_E_INVALID, "memory cache: the backend needs alloc and release (and both fence "
                                          "callbacks or neither)");
        return NULL;
    }
    dev_cache *c = calloc(1, sizeof *c);
    if (!c) {
        fsdp_err_set(err, FSDP_E_NOMEM, "memory cache: out of host memory");
        return NULL;
    }
    c->be = *be;
    if (!c->be.what) c->be.what = "memory";
    return c;
}

static void release_block(dev_cache *c, dc_block *b) {
    c->be.release(c->be.user, b->ptr);
    c->st.reserved -= b->size;
    c->st.backend_frees++;
    node_put(c, b);
}

void dev_cache_trim(dev_cache *c) {
    if (!c) return;
    for (int i = 0; i < DC_NCLASSES; i++) {
        while (c->free_lists[i]) {
            dc_block *b = c->free_lists[i];
            c->free_lists[i] = b->next;
            c->st.cached -= b->size;
            release_block(c, b);
        }
    }
}

void dev_cache_poll(dev_cache *c, int wait_all) {
    if (!c) return;
    dc_block **pp = &c->pending;
    while (*pp) {
        dc_block *b = *pp;
        int ready = 1;
        if (b->fence && !wait_all) ready = c->be.fence_ready(c->be.user, b->fence) != 0; /* < 0: error, reuse */
        if (!ready) {
            pp = &b->next;
            continue;
        }
        *pp = b->next;
        if (b->fence) c->be.fence_release(c->be.user, b->fence);
        b->fence = NULL;
        int idx;
        class_of(b->size, &idx);
        b->next = c->free_lists[idx];
        c->free_lists[idx] = b;
        c->st.cached += b->size;
    }
}

void dev_cache_free(dev_cache *c) {
    if (!c) return;
    dev_cache_poll(c, 1);
    dev_cache_trim(c);
    for (size_t i = 0; i < c->live_cap; i++)
        if (c->live[i]) release_block(c, c->live[i]);
    free(c->live);
    while (c->spare) {
        dc_block *b = c->spare;
        c->spare = b->next;
        free(b);
    }
    free(c);
}

static dc_block *pop_free(dev_cache *c, int idx) {
    dc_block *b = c->free_lists[idx];
    if (b) {
        c->free_lists[idx] = b->next;
        c->st.cached -= b->size;
    }
    return b;
}

int dev_cache_alloc(dev_cache *c, size_t bytes, void **ptr, fsdp_err *err) {
    *ptr = NULL;
    if (!c) return fsdp_err_set(err, FSDP_E_INVALID, "memory cache: no cache");
    int idx;
    size_t size = class_of(bytes, &idx);
    if (!size) return fsdp_err_set(err, FSDP_E_NOMEM, "%s memory: a request of %zu bytes is too large", c->be.what, bytes);
    dc_block *b = pop_free(c, idx);
    if (!b && c->pending) {
        dev_cache_poll(c, 0);
        b = pop_free(c, idx);
    }
    if (b) {
        c->st.cache_hits++;
    } else {
        b = node_get(c);
        if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "%s memory: out of host memory for the block table", c->be.what);
        fsdp_err local;
        int rc = c->be.alloc(c->be.user, size, &b->ptr, &local);
        if (rc == FSDP_E_NOMEM) { /* give the cached blocks back and try once more */
            dev_cache_trim(c);
            rc = c->be.alloc(c->be.user, size, &b->ptr, &local);
        }
        if (rc) {
            node_put(c, b);
            fsdp_err_set(err, rc, "%s memory: cannot allocate %zu bytes (%zu in use, %zu reserved): %s", c->be.what,
                         size, c->st.in_use, c->st.reserved, local.msg);
            return rc;
        }
        b->size = size;
        c->st.reserved += size;
        c->st.backend_allocs++;
    }
    b->requested = bytes;
    b->fence = NULL;
    if (!live_insert(c, b)) {
        /* keep the block cached so that nothing leaks */
        b->next = c->free_lists[idx];
        c->free_lists[idx] = b;
        c->st.cached += b->size;
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s memory: out of host memory for the block table", c->be.what);
    }
    c->st.in_use += size;
    c->st.requested_in_use += bytes;
    if (c->st.in_use > c->st.peak_in_use) c->st.peak_in_use = c->st.in_use;
    c->st.allocs++;
    *ptr = b->ptr;
    return FSDP_OK;
}

int dev_cache_release(dev_cache *c, void *ptr, void *fence, fsdp_err *err) {
    if (!c) return fsdp_err_set(err, FSDP_E_INVALID, "memory cache: no cache");
    if (!ptr) return FSDP_OK;
    if (fence && !c->be.fence_ready)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s memory: this cache does not support fenced frees", c->be.what);
    dc_block *b = live_remove(c, ptr);
    if (!b)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s memory: %p was not allocated by this cache or is already freed",
                            c->be.what, ptr);
    c->st.in_use -= b->size;
    c->st.requested_in_use -= b->requested;
    b->requested = 0;
    if (fence) {
        b->fence = fence;
        b->next = c->pending;
        c->pending = b;
        return FSDP_OK;
    }
    int idx;
    class_of(b->size, &idx);
    b->next = c->free_lists[idx];
    c->free_lists[idx] = b;
    c->st.cached += b->size;
    return FSDP_OK;
}

void dev_cache_stats(const dev_cache *c, dev_mem_stats *st) {
    if (!c) {
        memset(st, 0, sizeof *st);
        return;
    }
    *st = c->st;
}

void dev_cache_reset_peak(dev_cache *c) {
    if (c) c->st.peak_in_use = c->st.in_use;
}
