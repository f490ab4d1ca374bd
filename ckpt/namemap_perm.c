/* The q/k row permutation between interleaved RoPE (torchtitan/Meta) and rotate_half (HF). */
#include <string.h>

#include "ckpt/namemap.h"

int nmap_perm_check(int64_t rows, int heads, fsdp_err *err) {
    if (heads <= 0 || rows < 0 || rows % heads != 0 || (rows / heads) % 2 != 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "q/k permutation: %lld rows do not split into %d heads of an even head dim",
                            (long long)rows, heads);
    return FSDP_OK;
}

int64_t nmap_perm_src_row(nmap_dir dir, int64_t rows, int heads, int64_t dst_row) {
    int64_t hd = rows / heads, half = hd / 2;
    int64_t h = dst_row / hd, i = dst_row % hd;
    if (dir == NMAP_TT_TO_HF) /* HF i = t*half + j  <-  TT 2j + t */
        return h * hd + 2 * (i % half) + i / half;
    return h * hd + (i % 2) * half + i / 2; /* TT i = 2j + t  <-  HF t*half + j */
}

static int row_bytes(int64_t rows, int64_t cols, size_t elem, size_t *rb, fsdp_err *err) {
    int bad = cols < 0 || elem == 0 || (uint64_t)cols > SIZE_MAX / elem;
    if (!bad) {
        *rb = (size_t)cols * elem;
        bad = *rb && rows > 0 && (uint64_t)rows > SIZE_MAX / *rb;
    }
    if (bad)
        return fsdp_err_set(err, FSDP_E_INVALID, "q/k permutation: bad matrix [%lld, %lld] of %zu-byte elements",
                            (long long)rows, (long long)cols, elem);
    return FSDP_OK;
}

int nmap_permute_rows(nmap_dir dir, void *dst, const void *src, int64_t rows, int64_t cols, size_t elem, int heads,
                      fsdp_err *err) {
    size_t rb;
    int rc = nmap_perm_check(rows, heads, err);
    if (!rc) rc = row_bytes(rows, cols, elem, &rb, err);
    if (rc) return rc;
    if (rows && rb && (!dst || !src)) return fsdp_err_set(err, FSDP_E_INVALID, "q/k permutation: NULL buffer");
    for (int64_t r = 0; r < rows && rb; r++)
        memcpy((char *)dst + (size_t)r * rb, (const char *)src + (size_t)nmap_perm_src_row(dir, rows, heads, r) * rb,
               rb);
    return FSDP_OK;
}

int nmap_perm_src_range(nmap_dir dir, int64_t rows, int heads, int64_t r0, int64_t r1, int64_t *lo, int64_t *hi,
                        fsdp_err *err) {
    int rc = nmap_perm_check(rows, heads, err);
    if (rc) return rc;
    if (r0 < 0 || r1 < r0 || r1 > rows)
        return fsdp_err_set(err, FSDP_E_INVALID, "q/k permutation: rows [%lld, %lld) outside [0, %lld)",
                            (long long)r0, (long long)r1, (long long)rows);
    *lo = r0;
    *hi = r0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t s = nmap_perm_src_row(dir, rows, heads, r);
        if (r == r0 || s < *lo) *lo = s;
        if (r == r0 || s + 1 > *hi) *hi = s + 1;
    }
    return FSDP_OK;
}

int nmap_permute_rows_part(nmap_dir dir, void *dst, int64_t r0, int64_t r1, const void *src, int64_t src_lo,
                           int64_t src_hi, int64_t rows, int64_t cols, size_t elem, int heads, fsdp_err *err) {
    size_t rb;
    int rc = nmap_perm_check(rows, heads, err);
    if (!rc) rc = row_bytes(rows, cols, elem, &rb, err);
    if (rc) return rc;
    if (r0 < 0 || r1 < r0 || r1 > rows || src_lo < 0 || src_hi < src_lo || src_hi > rows)
        return fsdp_err_set(err, FSDP_E_INVALID, "q/k permutation: rows [%lld, %lld) or source [%lld, %lld) outside [0, %lld)",
                            (long long)r0, (long long)r1, (long long)src_lo, (long long)src_hi, (long long)rows);
    if (r1 > r0 && rb && (!dst || !src)) return fsdp_err_set(err, FSDP_E_INVALID, "q/k permutation: NULL buffer");
    for (int64_t r = r0; r < r1; r++) {
        int64_t s = nmap_perm_src_row(dir, rows, heads, r);
        if (s < src_lo || s >= src_hi)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "q/k permutation: destination row %lld needs source row %lld, outside the given [%lld, %lld)",
                                (long long)r, (long long)s, (long long)src_lo, (long long)src_hi);
        if (rb) memcpy((char *)dst + (size_t)(r - r0) * rb, (const char *)src + (size_t)(s - src_lo) * rb, rb);
    }
    return FSDP_OK;
}
