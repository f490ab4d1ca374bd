/* Read planning for DCP tensors (see dcp_plan.h). */
#include "ckpt/dcp_plan.h"

#include <stdlib.h>
#include <string.h>

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The dimension along which the non-empty chunks (idx[0 .. n)) have the most distinct starts: the one
 * whose order prunes best (dim 0 for FSDP's Shard(0) rows, either for a grid). */
static int sweep_dim(const dcp_item *x, const uint32_t *idx, size_t n, int64_t *tmp) {
    int best = 0;
    size_t best_k = 0;
    for (int d = 0; d < x->ndim; d++) {
        for (size_t q = 0; q < n; q++) tmp[q] = x->chunks[idx[q]].offsets[d];
        qsort(tmp, n, sizeof *tmp, cmp_i64);
        size_t k = n ? 1 : 0;
        for (size_t q = 1; q < n; q++) k += tmp[q] != tmp[q - 1];
        if (k > best_k) best_k = k, best = d;
        if (k == n) break; /* every start distinct: none does better */
    }
    return best;
}

typedef struct sort_ctx {
    const dcp_item *x;
    int dim;
} sort_ctx;

static int cmp_start(const void *a, const void *b, void *ctx) {
    const sort_ctx *s = ctx;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    int64_t u = s->x->chunks[i].offsets[s->dim], v = s->x->chunks[j].offsets[s->dim];
    if (u != v) return u < v ? -1 : 1;
    return (i > j) - (i < j);
}

int dcp_plan_ix_build(const dcp_item *x, dcp_plan_ix *ix, fsdp_err *err) {
    memset(ix, 0, sizeof *ix);
    if (!x->is_tensor) return 0;
    if (x->n_chunks > UINT32_MAX)
        return fsdp_err_set(err, FSDP_E_FORMAT, "tensor %s: %zu chunks (at most %u are planned)", x->fqn,
                            x->n_chunks, (unsigned)UINT32_MAX);
    size_t cap = x->n_chunks ? x->n_chunks : 1;
    ix->ord = malloc(cap * sizeof *ix->ord);
    ix->maxend = malloc(cap * sizeof *ix->maxend);
    if (!ix->ord || !ix->maxend) {
        dcp_plan_ix_free(ix);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory indexing the chunks of %s", x->fqn);
    }
    for (size_t k = 0; k < x->n_chunks; k++)
        if (fsdp_numel(x->ndim, x->chunks[k].sizes) != 0) ix->ord[ix->n++] = (uint32_t)k;
    if (x->ndim > 0) {
        ix->dim = x->ndim > 1 ? sweep_dim(x, ix->ord, ix->n, ix->maxend) : 0;
        sort_ctx s = {x, ix->dim};
        qsort_r(ix->ord, ix->n, sizeof *ix->ord, cmp_start, &s);
    }
    int64_t m = INT64_MIN;
    for (size_t q = 0; q < ix->n; q++) {
        const dcp_chunk *ch = &x->chunks[ix->ord[q]];
        int64_t e = x->ndim ? ch->offsets[ix->dim] + ch->sizes[ix->dim] : 1;
        ix->maxend[q] = m = e > m ? e : m;
    }
    return 0;
}

void dcp_plan_ix_free(dcp_plan_ix *ix) {
    free(ix->ord);
    free(ix->maxend);
    memset(ix, 0, sizeof *ix);
}

/* the first q in [0, n) with maxend[q] > a (maxend does not decrease), or n */
static size_t first_ending_after(const dcp_plan_ix *ix, int64_t a) {
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->maxend[mid] > a) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* the first q in [lo, n) whose chunk starts at or after b along the index's dim, or n */
static size_t first_starting_at(const dcp_item *x, const dcp_plan_ix *ix, size_t lo, int64_t b) {
    size_t hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->chunks[ix->ord[mid]].offsets[ix->dim] >= b) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

int dcp_plan_box(const dcp_item *x, const dcp_plan_ix *ix, const int64_t *off, const int64_t *len, dcp_plan_fn fn,
                 void *user) {
    int nd = x->ndim;
    for (int d = 0; d < nd; d++)
        if (len[d] <= 0) return 0;
    size_t lo = 0, hi = ix->n;
    if (nd > 0) {
        int64_t a = off[ix->dim], b = off[ix->dim] + len[ix->dim];
        lo = first_ending_after(ix, a);
        hi = first_starting_at(x, ix, lo, b);
    }
    for (size_t q = lo; q < hi; q++) {
        const dcp_chunk *ch = &x->chunks[ix->ord[q]];
        int64_t at[FSDP_MAX_DIMS], il[FSDP_MAX_DIMS];
        int meets = 1;
        for (int d = 0; d < nd && meets; d++) {
            int64_t s = off[d] > ch->offsets[d] ? off[d] : ch->offsets[d];
            int64_t e0 = off[d] + len[d], e1 = ch->offsets[d] + ch->sizes[d];
            int64_t e = e0 < e1 ? e0 : e1;
            at[d] = s, il[d] = e - s;
            meets = e > s;
        }
        if (!meets) continue;
        int rc = fn(user, ix->ord[q], at, il);
        if (rc) return rc;
    }
    return 0;
}
