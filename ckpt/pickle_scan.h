/* A pass over a pickle's opcodes without building anything (internal to ckpt/pickle_read.c): which
 * memo entries the pickle ever fetches again (BINGET / LONG_BINGET). An object stored at an entry never
 * fetched is referenced by its parent alone, so a reader that folds it into a compact value may reuse
 * its memory at once. */
#ifndef FSDP_CKPT_PICKLE_SCAN_H
#define FSDP_CKPT_PICKLE_SCAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct pkl_gets {
    uint64_t *bits;  /* bit i: memo entry i is fetched */
    uint64_t *before; /* per 64-entry word: the fetched entries in the words before it */
    size_t n;        /* entries covered, a multiple of 64 (every index above is never fetched) */
    size_t fetched;  /* entries fetched in all */
} pkl_gets;

/* 0 with *g filled (pkl_gets_free it); -1 when the opcodes are not all known up to STOP (a truncated or
 * malformed pickle, which the reader then reports) or out of memory: the caller reclaims nothing. */
int pkl_scan_gets(const unsigned char *buf, size_t len, pkl_gets *g);
static inline int pkl_gets_has(const pkl_gets *g, size_t i) { return i < g->n && (g->bits[i >> 6] >> (i & 63)) & 1; }
/* The slot of fetched entry i among the fetched ones (0 .. fetched - 1): a memo that keeps those alone. */
static inline size_t pkl_gets_slot(const pkl_gets *g, size_t i) {
    uint64_t below = g->bits[i >> 6] & ((1ull << (i & 63)) - 1);
    return (size_t)(g->before[i >> 6] + (uint64_t)__builtin_popcountll(below));
}
void pkl_gets_free(pkl_gets *g);

#endif
