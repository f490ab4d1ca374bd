/* Checked integer arithmetic for sizes, offsets, strides and byte counts that come from files
 * (or anything else not trusted): every helper returns 0 and stores the result, or returns 1
 * (and leaves *out unspecified) when the exact result does not fit the type. A caller turns 1
 * into a "corrupt" error naming the file and the record; nothing here allocates or reports. */
#ifndef FSDP_RUNTIME_CHECKED_H
#define FSDP_RUNTIME_CHECKED_H

#include <stddef.h>
#include <stdint.h>

static inline int chk_add_i64(int64_t a, int64_t b, int64_t *out) { return __builtin_add_overflow(a, b, out); }
static inline int chk_mul_i64(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline int chk_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_add_overflow(a, b, out); }
static inline int chk_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline int chk_mul_size(size_t a, size_t b, size_t *out) { return __builtin_mul_overflow(a, b, out); }

/* Elements of a shape (1 for ndim 0); 1 when a dim is negative or the product overflows int64. */
static inline int chk_numel(int ndim, const int64_t *shape, int64_t *out) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || chk_mul_i64(n, shape[d], &n)) return 1;
    }
    *out = n;
    return 0;
}

/* numel * elem_size as a byte count that fits int64 (so that it also fits off_t and size_t on
 * 64-bit hosts); 1 otherwise. */
static inline int chk_nbytes(int64_t numel, size_t elem_size, int64_t *out) {
    if (numel < 0 || elem_size > (size_t)INT64_MAX) return 1;
    return chk_mul_i64(numel, (int64_t)elem_size, out);
}

/* Bytes of a shape of elem_size-byte elements: chk_numel then chk_nbytes. */
static inline int chk_shape_bytes(int ndim, const int64_t *shape, size_t elem_size, int64_t *out) {
    int64_t n;
    return chk_numel(ndim, shape, &n) || chk_nbytes(n, elem_size, out);
}

#endif
