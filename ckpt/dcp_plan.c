/* Read planning for DCP tensors (see dcp_plan.h). */
#include "ckpt/dcp_plan.h"

#include <stdlib.h>
#include <string.h>

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The dimension other than skip along which the non-empty chunks (idx[0 .. n)) have the most distinct starts:
 * the one whose order prunes best (dim 0 for FSDP's Shard(0) rows, either for a grid); -1 when there is none. */
static int sweep_dim(const dcp_item *x, const uint32_t *idx, size_t n, int64_t *tmp, int skip) {
    int best = -1;
    size_t best_k = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d == skip) continue;
        for (size_t q = 0; q < n; q++) tmp[q] = x->chunks[idx[q]].offsets[d];
        qsort(tmp, n, sizeof *tmp, cmp_i64);
        size_t k = n ? 1 : 0;
        for (size_t q = 1; q < n; q++) k += tmp[q] != tmp[q - 1];
        if (best < 0 || k > best_k) best_k = k, best = d;
        if (k == n) break; /* every start distinct: none does better */
    }
    return best;
}

typedef struct sort_ctx {
    const dcp_item *x;
    int dim, dim2;
} sort_ctx;

static int cmp_i(int64_t u, int64_t v) { return (u > v) - (u < v); }

/* by extent along dim (start, end), then start along dim2, then index */
static int cmp_chunk(const void *a, const void *b, void *ctx) {
    const sort_ctx *s = ctx;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    const dcp_chunk *p = &s->x->chunks[i], *q = &s->x->chunks[j];
    int c = cmp_i(p->offsets[s->dim], q->offsets[s->dim]);
    if (!c) c = cmp_i(p->offsets[s->dim] + p->sizes[s->dim], q->offsets[s->dim] + q->sizes[s->dim]);
    if (!c && s->dim2 >= 0) c = cmp_i(p->offsets[s->dim2], q->offsets[s->dim2]);
    return c ? c : cmp_i(i, j);
}

static int same_slab(const dcp_item *x, int dim, uint32_t i, uint32_t j) {
    const dcp_chunk *p = &x->chunks[i], *q = &x->chunks[j];
    return p->offsets[dim] == q->offsets[dim] && p->sizes[dim] == q->sizes[dim];
}

/* the slabs of the sorted ord: runs of one extent along dim (every chunk of a 0-d tensor its own) */
static size_t count_slabs(const dcp_item *x, const dcp_plan_ix *ix) {
    size_t ns = 0;
    for (size_t q = 0; q < ix->n; q++) ns += !x->ndim || q == 0 || !same_slab(x, ix->dim, ix->ord[q - 1], ix->ord[q]);
    return ns;
}

/* dim2 chosen, and the chunks of each slab of several sorted along it (only a grid pays for it: a Shard(0)
 * layout's slabs are single chunks) */
static void sort_slabs(const dcp_item *x, dcp_plan_ix *ix, int64_t *tmp) {
    ix->dim2 = sweep_dim(x, ix->ord, ix->n, tmp, ix->dim);
    sort_ctx s = {x, ix->dim, ix->dim2};
    for (size_t q0 = 0, q1; q0 < ix->n; q0 = q1) {
        for (q1 = q0 + 1; q1 < ix->n && same_slab(x, ix->dim, ix->ord[q0], ix->ord[q1]); q1++) {
        }
        if (q1 - q0 > 1) qsort_r(ix->ord + q0, q1 - q0, sizeof *ix->ord, cmp_chunk, &s);
    }
}

/* The slabs of the sorted ord and, where a slab holds several chunks, the second level; nonzero when out of
 * memory. */
static int build_slabs(const dcp_item *x, dcp_plan_ix *ix) {
    int nd = x->ndim, d = ix->dim;
    size_t cs = ix->ns ? ix->ns : 1;
    ix->sstart = malloc(cs * sizeof *ix->sstart);
    ix->smaxend = malloc(cs * sizeof *ix->smaxend);
    if (!ix->sstart || !ix->smaxend) return -1;
    int two = ix->ns < ix->n;
    if (two && !(ix->first = malloc((ix->ns + 1) * sizeof *ix->first))) return -1;
    if (two && ix->dim2 >= 0 &&
        (!(ix->start2 = malloc(ix->n * sizeof *ix->start2)) || !(ix->maxend2 = malloc(ix->n * sizeof *ix->maxend2))))
        return -1;
    int64_t m = INT64_MIN, m2 = INT64_MIN;
    size_t s = 0;
    for (size_t q = 0; q < ix->n; q++) {
        const dcp_chunk *ch = &x->chunks[ix->ord[q]];
        int starts = !nd || q == 0 || !same_slab(x, d, ix->ord[q - 1], ix->ord[q]);
        if (starts) {
            int64_t e = nd ? ch->offsets[d] + ch->sizes[d] : 1;
            ix->sstart[s] = nd ? ch->offsets[d] : 0;
            ix->smaxend[s] = m = e > m ? e : m;
            if (ix->first) ix->first[s] = (uint32_t)q;
            s++;
            m2 = INT64_MIN;
        }
        if (ix->start2) {
            int64_t e2 = ch->offsets[ix->dim2] + ch->sizes[ix->dim2];
            ix->start2[q] = ch->offsets[ix->dim2];
            ix->maxend2[q] = m2 = e2 > m2 ? e2 : m2;
        }
    }
    if (ix->first) ix->first[ix->ns] = (uint32_t)ix->n;
    return 0;
}

int dcp_plan_ix_build(const dcp_item *x, dcp_plan_ix *ix, fsdp_err *err) {
    memset(ix, 0, sizeof *ix);
    ix->dim2 = -1;
    if (!x->is_tensor) return 0;
    if (x->n_chunks >= UINT32_MAX)
        return fsdp_err_set(err, FSDP_E_FORMAT, "tensor %s: %zu chunks (fewer than %u are planned)", x->fqn,
                            x->n_chunks, (unsigned)UINT32_MAX);
    size_t cap = x->n_chunks ? x->n_chunks : 1;
    ix->ord = malloc(cap * sizeof *ix->ord);
    int64_t *tmp = malloc(cap * sizeof *tmp);
    int rc = !ix->ord || !tmp;
    if (!rc) {
        for (size_t k = 0; k < x->n_chunks; k++)
            if (fsdp_numel(x->ndim, x->chunks[k].sizes) != 0) ix->ord[ix->n++] = (uint32_t)k;
        if (x->ndim > 0) {
            ix->dim = x->ndim > 1 ? sweep_dim(x, ix->ord, ix->n, tmp, -1) : 0;
            sort_ctx s = {x, ix->dim, -1};
            qsort_r(ix->ord, ix->n, sizeof *ix->ord, cmp_chunk, &s);
        }
        ix->ns = count_slabs(x, ix);
        if (ix->ns < ix->n && x->ndim > 1) /* a grid: each slab's chunks in order along a second dim */
            sort_slabs(x, ix, tmp);
        rc = build_slabs(x, ix);
    }
    free(tmp);
    if (rc) {
        dcp_plan_ix_free(ix);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory indexing the chunks of %s", x->fqn);
    }
    return 0;
}

void dcp_plan_ix_free(dcp_plan_ix *ix) {
    free(ix->ord);
    free(ix->sstart);
    free(ix->smaxend);
    free(ix->first);
    free(ix->start2);
    free(ix->maxend2);
    memset(ix, 0, sizeof *ix);
    ix->dim2 = -1;
}

/* the first q in [lo, hi) with v[q] > a (v does not decrease there), or hi; without branches on the data (a
 * conditional move per step: the branches of a reshard's millions of searches were mispredicted half the time) */
static size_t first_above(const int64_t *v, size_t lo, size_t hi, int64_t a) {
    if (lo >= hi) return lo;
    const int64_t *base = v + lo;
    size_t len = hi - lo;
    while (len > 1) {
        size_t half = len / 2;
        base = base[half] <= a ? base + half : base;
        len -= half;
    }
    return (size_t)(base - v) + (*base <= a);
}

/* the chunks ord[q0 .. q1) of one slab checked against the box, fn called for each that meets it */
static int slab_reads(const dcp_item *x, const dcp_plan_ix *ix, size_t q0, size_t q1, const int64_t *off,
                      const int64_t *len, dcp_plan_fn fn, void *user) {
    int nd = x->ndim;
    if (ix->start2 && q1 - q0 > 1) {
        int64_t a2 = off[ix->dim2], b2 = off[ix->dim2] + len[ix->dim2];
        q0 = first_above(ix->maxend2, q0, q1, a2);
        q1 = first_above(ix->start2, q0, q1, b2 - 1);
    }
    for (size_t q = q0; q < q1; q++) {
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

int dcp_plan_box(const dcp_item *x, const dcp_plan_ix *ix, const int64_t *off, const int64_t *len, dcp_plan_fn fn,
                 void *user) {
    int nd = x->ndim;
    for (int d = 0; d < nd; d++)
        if (len[d] <= 0) return 0;
    int64_t a = nd ? off[ix->dim] : 0, b = nd ? off[ix->dim] + len[ix->dim] : 1;
    for (size_t s = first_above(ix->smaxend, 0, ix->ns, a); s < ix->ns && ix->sstart[s] < b; s++) {
        size_t q0 = ix->first ? ix->first[s] : s, q1 = ix->first ? ix->first[s + 1] : s + 1;
        int rc = slab_reads(x, ix, q0, q1, off, len, fn, user);
        if (rc) return rc;
    }
    return 0;
}
