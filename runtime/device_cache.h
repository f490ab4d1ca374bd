/* Caching allocator with size-class free lists, independent of the memory it manages.
 *
 * The device runtime (runtime/device.h) uses one cache for device memory (backend: cudaMalloc /
 * cudaFree) and one for pinned host memory (cudaHostAlloc / cudaFreeHost); tests use a malloc
 * backend. After a warm-up step has allocated every size a step needs, later steps are served
 * from the free lists and never call the backend.
 *
 * Size classes: a request is rounded up to the next of 512 bytes or 2^k * (1 + i/8), i = 1..8,
 * k >= 9 (at most 12.5% over the request). Each class has one free list of blocks of exactly that
 * size; blocks are never split or merged. A failed backend allocation (FSDP_E_NOMEM) releases every
 * cached free block to the backend and retries once.
 *
 * Freeing is immediate (the block may be handed out by the next allocation) or fenced: the block
 * waits on a pending list until the backend says its fence is done (for device memory, an event
 * recorded on the stream that last used the block).
 *
 * Not thread-safe: one cache belongs to one thread (one rank's runtime). */
#ifndef FSDP_RUNTIME_DEVICE_CACHE_H
#define FSDP_RUNTIME_DEVICE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Memory statistics of one cache (bytes are class sizes unless named "requested"). */
typedef struct dev_mem_stats {
    size_t in_use;           /* live blocks */
    size_t requested_in_use; /* what callers asked for, of the live blocks */
    size_t peak_in_use;      /* maximum of in_use since creation or the last reset */
    size_t reserved;         /* every block obtained from the backend and not given back */
    size_t cached;           /* free blocks ready for reuse (reserved - in_use - pending) */
    uint64_t backend_allocs; /* calls to the backend's alloc (cudaMalloc) that succeeded */
    uint64_t backend_frees;  /* blocks given back to the backend */
    uint64_t cache_hits;     /* allocations served from a free list */
    uint64_t allocs;         /* allocations served (hits + backend) */
} dev_mem_stats;

typedef struct dev_cache_backend {
    void *user;
    const char *what; /* "device", "pinned host": used in messages */
    /* Obtains bytes; returns FSDP_OK, FSDP_E_NOMEM when out of memory, or another code. */
    int (*alloc)(void *user, size_t bytes, void **ptr, fsdp_err *err);
    /* Gives a block back. */
    void (*release)(void *user, void *ptr);
    /* Optional (both or neither): 1 when fence has completed, 0 when not yet, < 0 on an error
     * (the block is then treated as reusable); fence_release frees the fence. */
    int (*fence_ready)(void *user, void *fence);
    void (*fence_release)(void *user, void *fence);
} dev_cache_backend;

typedef struct dev_cache dev_cache;

dev_cache *dev_cache_create(const dev_cache_backend *be, fsdp_err *err);
/* Gives every block back to the backend (live ones too) and frees the cache. */
void dev_cache_free(dev_cache *c);

/* A block of at least `bytes` (0 is served as the smallest class). */
int dev_cache_alloc(dev_cache *c, size_t bytes, void **ptr, fsdp_err *err);
/* Returns a block from dev_cache_alloc. fence NULL: reusable at once; otherwise the block is
 * reusable once the backend reports the fence done (the cache then releases the fence).
 * FSDP_E_INVALID for a pointer the cache did not hand out (or already freed). */
int dev_cache_release(dev_cache *c, void *ptr, void *fence, fsdp_err *err);
/* Moves pending blocks whose fence is done to the free lists; with wait_all, treats every pending
 * block as done (the caller has synchronised). */
void dev_cache_poll(dev_cache *c, int wait_all);
/* Gives every free (cached) block back to the backend. */
void dev_cache_trim(dev_cache *c);

void dev_cache_stats(const dev_cache *c, dev_mem_stats *st);
void dev_cache_reset_peak(dev_cache *c);
/* Class size a request of `bytes` is served with; 0 when it would overflow. */
size_t dev_cache_class_size(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
