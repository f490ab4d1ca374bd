/* DCP chunk geometry: sizes and bounds with checked arithmetic, the exact tiling check, chunk
 * lookup by offsets and de-duplication (see dcp_chunks.h). */
#include "ckpt/dcp_chunks.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/checked.h"

/* "<what>: <fqn>: corrupt .metadata: <msg>" */
static int corrupt(fsdp_err *err, const char *what, const char *fqn, const char *fmt, ...) FSDP_PRINTF(4, 5);
static int corrupt(fsdp_err *err, const char *what, const char *fqn, const char *fmt, ...) {
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s: corrupt .metadata: %s", what, fqn, m);
}

static int bad(fsdp_err *err, const char *what, const char *fqn, const char *msg) {
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s: %s", what, fqn, msg);
}

int dcp_item_chunks_alloc(dcp_item *x, size_t n, size_t own, fsdp_err *err) {
    free(x->chunks);
    free(x->coords);
    x->n_chunks = 0;
    size_t per = 2 * (size_t)(x->ndim > 0 ? x->ndim : 0);
    x->chunks = calloc(n ? n : 1, sizeof *x->chunks);
    x->coords = calloc(own * per > 0 ? own * per : 1, sizeof *x->coords);
    if (!x->chunks || !x->coords) {
        free(x->chunks);
        free(x->coords);
        x->chunks = NULL;
        x->coords = NULL;
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for %zu chunks", x->fqn ? x->fqn : "?", n);
    }
    for (size_t k = 0; k < n; k++) x->chunks[k].where.relative_path = "";
    for (size_t k = n - own, q = 0; k < n; k++, q++) {
        x->chunks[k].offsets = x->coords + q * per;
        x->chunks[k].sizes = x->coords + q * per + per / 2;
    }
    x->n_chunks = n;
    return 0;
}

int dcp_check_tensor_size(const char *what, const dcp_item *it, fsdp_err *err) {
    char sb[256];
    int64_t numel, nbytes;
    for (int d = 0; d < it->ndim; d++)
        if (it->shape[d] < 0)
            return corrupt(err, what, it->fqn, "size %s has a negative dimension",
                           fsdp_shape_str(it->ndim, it->shape, sb, sizeof sb));
    if (chk_numel(it->ndim, it->shape, &numel))
        return corrupt(err, what, it->fqn, "size %s has more elements than int64 can count",
                       fsdp_shape_str(it->ndim, it->shape, sb, sizeof sb));
    if (chk_nbytes(numel, fsdp_dtype_size(it->dtype), &nbytes))
        return corrupt(err, what, it->fqn, "size %s of %s is more than 2^63 bytes",
                       fsdp_shape_str(it->ndim, it->shape, sb, sizeof sb), fsdp_dtype_torch_name(it->dtype));
    return 0;
}

/* Checks of one non-empty chunk a of volume v against the tensor's size and its storage. */
static int check_one(const char *what, const dcp_item *it, size_t a, int64_t v, fsdp_err *err) {
    const dcp_chunk *c = &it->chunks[a];
    for (int d = 0; d < it->ndim; d++) {
        if (c->sizes[d] <= it->shape[d] && c->offsets[d] <= it->shape[d] - c->sizes[d]) continue;
        int64_t end;
        if (chk_add_i64(c->offsets[d], c->sizes[d], &end))
            return corrupt(err, what, it->fqn, "chunk %zu: offset %lld + size %lld of dim %d overflows int64 (the dim "
                           "has size %lld)", a, (long long)c->offsets[d], (long long)c->sizes[d], d,
                           (long long)it->shape[d]);
        char m[200];
        snprintf(m, sizeof m, "chunk %zu reaches index %lld of dim %d (size %lld)", a, (long long)end, d,
                 (long long)it->shape[d]);
        return bad(err, what, it->fqn, m);
    }
    if (!c->where.relative_path[0]) return 0;
    int64_t nb = INT64_MAX;
    char sb[256];
    /* v <= numel (the chunk is inside the tensor), whose byte count was checked: cannot fail */
    if (chk_nbytes(v, fsdp_dtype_size(it->dtype), &nb) || (uint64_t)nb > c->where.length)
        return corrupt(err, what, it->fqn, "chunk %zu (sizes %s of %s) needs %lld bytes, but its storage in %s holds "
                       "only %llu", a, fsdp_shape_str(it->ndim, c->sizes, sb, sizeof sb),
                       fsdp_dtype_torch_name(it->dtype), (long long)nb, c->where.relative_path,
                       (unsigned long long)c->where.length);
    return 0;
}

int dcp_check_chunk_bounds(const char *what, const dcp_item *it, fsdp_err *err) {
    for (size_t a = 0; a < it->n_chunks; a++) {
        const dcp_chunk *c = &it->chunks[a];
        for (int d = 0; d < it->ndim; d++)
            if (c->sizes[d] < 0 || c->offsets[d] < 0) return bad(err, what, it->fqn, "negative chunk offset or size");
        int64_t v;
        char sb[256];
        if (chk_numel(it->ndim, c->sizes, &v))
            return corrupt(err, what, it->fqn, "chunk %zu: sizes %s have more elements than int64 can count", a,
                           fsdp_shape_str(it->ndim, c->sizes, sb, sizeof sb));
        if (v == 0) continue; /* empty shards may carry any offset */
        int rc = check_one(what, it, a, v, err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- exact tiling ------------------------------------------------------------------------------
 * For a box B = [a, b) (a product of intervals) let D(B) be the signed set of its 2^m corners:
 * corner v gets (-1)^(number of coordinates taken from b). D is the m-fold mixed difference of B's
 * indicator function, so it is linear, and it is one-to-one on functions with bounded support (a
 * prefix sum in every dim inverts it). Hence the chunks tile the tensor box T exactly (each
 * element covered once) if and only if sum_B D(B) - D(T) is zero at every point, i.e. when the
 * corners of all chunks and of T (with T's signs flipped) are sorted, every group of equal
 * corners has weights summing to 0. Dims that every non-empty chunk spans whole are left out
 * (m <= ndim of them remain).
 *
 * Worst case, for n non-empty chunks differing in m dims: (n + 1) 2^m corners of 8 bytes, sorted
 * in O(n 2^m m log(n 2^m)) time: exact for any N-d layout, and for the usual layouts (Shard(0):
 * m = 1; 2-D grids: m = 2) a 40k-chunk tensor takes a few milliseconds. */

typedef struct tiling {
    const dcp_item *it;
    const size_t *ne; /* indices of the non-empty chunks */
    size_t nne;       /* corner key (k << 8 | mask): chunk ne[k], or the tensor box when k == nne */
    int dims[FSDP_MAX_DIMS], m;
} tiling;

static int64_t corner_coord(const tiling *t, uint64_t key, int j) {
    size_t k = (size_t)(key >> 8);
    int hi = (int)(key >> j) & 1, d = t->dims[j];
    if (k == t->nne) return hi ? t->it->shape[d] : 0;
    const dcp_chunk *c = &t->it->chunks[t->ne[k]];
    return c->offsets[d] + (hi ? c->sizes[d] : 0); /* in bounds: checked, cannot overflow */
}

static int cmp_corner(const void *a, const void *b, void *ctx) {
    const tiling *t = ctx;
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    for (int j = 0; j < t->m; j++) {
        int64_t p = corner_coord(t, x, j), q = corner_coord(t, y, j);
        if (p != q) return p < q ? -1 : 1;
    }
    return 0;
}

static int corner_weight(const tiling *t, uint64_t key) {
    int w = __builtin_popcount((unsigned)(key & 0xff)) & 1 ? -1 : 1;
    return (size_t)(key >> 8) == t->nne ? -w : w;
}

/* 1 when the corners cancel (exact tiling), 0 when not, -1 when out of memory. */
static int corners_cancel(tiling *t) {
    const dcp_item *it = t->it;
    t->m = 0;
    for (int d = 0; d < it->ndim; d++) {
        int varies = 0;
        for (size_t k = 0; k < t->nne && !varies; k++) {
            const dcp_chunk *c = &it->chunks[t->ne[k]];
            varies = c->offsets[d] != 0 || c->sizes[d] != it->shape[d];
        }
        if (varies) t->dims[t->m++] = d;
    }
    size_t per = (size_t)1 << t->m, n;
    if (t->nne >= ((size_t)1 << 55) || chk_mul_size(t->nne + 1, per, &n) || n > SIZE_MAX / sizeof(uint64_t))
        return -1;
    uint64_t *keys = malloc(n * sizeof *keys);
    if (!keys) return -1;
    for (size_t k = 0, i = 0; k <= t->nne; k++)
        for (size_t mask = 0; mask < per; mask++) keys[i++] = (uint64_t)k << 8 | mask;
    qsort_r(keys, n, sizeof *keys, cmp_corner, t);
    int ok = 1;
    for (size_t i = 0; i < n && ok;) {
        int64_t sum = 0;
        size_t j = i;
        for (; j < n && cmp_corner(&keys[i], &keys[j], t) == 0; j++) sum += corner_weight(t, keys[j]);
        ok = sum == 0;
        i = j;
    }
    free(keys);
    return ok;
}

static int boxes_overlap(const dcp_item *it, size_t a, size_t b) {
    const dcp_chunk *x = &it->chunks[a], *y = &it->chunks[b];
    for (int d = 0; d < it->ndim; d++)
        if (x->offsets[d] >= y->offsets[d] + y->sizes[d] || y->offsets[d] >= x->offsets[d] + x->sizes[d]) return 0;
    return 1;
}

typedef struct sweep_ctx {
    const dcp_item *it;
    int d;
} sweep_ctx;

static int cmp_off_d(const void *a, const void *b, void *ctx) {
    const sweep_ctx *s = ctx;
    int64_t p = s->it->chunks[*(const size_t *)a].offsets[s->d], q = s->it->chunks[*(const size_t *)b].offsets[s->d];
    return p < q ? -1 : p > q;
}

/* The dim whose chunk offsets take the most distinct values (the sweep compares fewest pairs). */
static int sweep_dim(const dcp_item *it, size_t *ord, size_t nne) {
    int best = 0;
    size_t best_n = 0;
    for (int d = 0; d < it->ndim; d++) {
        sweep_ctx s = {it, d};
        qsort_r(ord, nne, sizeof *ord, cmp_off_d, &s);
        size_t distinct = nne ? 1 : 0;
        for (size_t i = 1; i < nne; i++)
            distinct += it->chunks[ord[i]].offsets[d] != it->chunks[ord[i - 1]].offsets[d];
        if (distinct > best_n) best_n = distinct, best = d;
    }
    return best;
}

/* Only for the message of a failed tiling: an overlapping pair (1), none (0), or -1 when the
 * budget of pair tests ran out first. A sweep along one dim tests each pair whose ranges meet in
 * that dim once; that is O(n^2) for some layouts, hence the budget. */
static int find_overlap(const dcp_item *it, size_t *ord, size_t nne, size_t *pa, size_t *pb) {
    if (it->ndim == 0) {
        if (nne < 2) return 0;
        *pa = ord[0], *pb = ord[1];
        return 1;
    }
    sweep_ctx s = {it, sweep_dim(it, ord, nne)};
    qsort_r(ord, nne, sizeof *ord, cmp_off_d, &s);
    uint64_t budget = 20000000ull + 64ull * nne;
    for (size_t i = 0; i < nne; i++) {
        const dcp_chunk *c = &it->chunks[ord[i]];
        int64_t end = c->offsets[s.d] + c->sizes[s.d];
        for (size_t j = i + 1; j < nne && it->chunks[ord[j]].offsets[s.d] < end; j++) {
            if (budget-- == 0) return -1;
            if (boxes_overlap(it, ord[i], ord[j])) {
                *pa = ord[i] < ord[j] ? ord[i] : ord[j];
                *pb = ord[i] < ord[j] ? ord[j] : ord[i];
                return 1;
            }
        }
    }
    return 0;
}

static int tiling_error(const char *what, const dcp_item *it, size_t *ne, size_t nne, int64_t covered,
                        int covered_ovf, int64_t total, fsdp_err *err) {
    size_t a = 0, b = 0;
    int found = find_overlap(it, ne, nne, &a, &b);
    char m[1024];
    if (found == 1) {
        char o1[200], s1[200], o2[200], s2[200];
        const dcp_chunk *x = &it->chunks[a], *y = &it->chunks[b];
        snprintf(m, sizeof m,
                 "two chunks overlap: chunk %zu (offsets %s, sizes %s) and chunk %zu (offsets %s, sizes %s)", a,
                 fsdp_shape_str(it->ndim, x->offsets, o1, sizeof o1), fsdp_shape_str(it->ndim, x->sizes, s1, sizeof s1),
                 b, fsdp_shape_str(it->ndim, y->offsets, o2, sizeof o2),
                 fsdp_shape_str(it->ndim, y->sizes, s2, sizeof s2));
    } else if (covered_ovf) {
        snprintf(m, sizeof m, "two chunks overlap (the chunks hold more than 2^63 elements for %lld)", (long long)total);
    } else if (covered >= total) {
        /* as many elements stored as the tensor has, or more, and no tiling: some of them overlap */
        snprintf(m, sizeof m, "two chunks overlap (the chunks hold %lld elements for %lld)", (long long)covered,
                 (long long)total);
    } else if (found == 0) {
        snprintf(m, sizeof m, "the chunks cover %lld of %lld elements (the checkpoint is missing pieces)",
                 (long long)covered, (long long)total);
    } else {
        snprintf(m, sizeof m, "the chunks do not tile the tensor: they hold %lld elements for %lld (pieces are missing "
                 "or overlap)", (long long)covered, (long long)total);
    }
    return bad(err, what, it->fqn, m);
}

int dcp_check_tiling(const char *what, const dcp_item *it, fsdp_err *err) {
    int64_t total = fsdp_numel(it->ndim, it->shape), covered = 0;
    int covered_ovf = 0;
    size_t *ne = malloc((it->n_chunks ? it->n_chunks : 1) * sizeof *ne), nne = 0;
    if (!ne) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: %s: out of memory checking %zu chunks", what, it->fqn,
                                 it->n_chunks);
    for (size_t a = 0; a < it->n_chunks; a++) {
        int64_t v = fsdp_numel(it->ndim, it->chunks[a].sizes); /* fits: dcp_check_chunk_bounds */
        if (v == 0) continue;
        ne[nne++] = a;
        if (!covered_ovf && chk_add_i64(covered, v, &covered)) covered_ovf = 1;
    }
    int exact;
    if (nne == 0) {
        exact = total == 0;
    } else {
        tiling t = {it, ne, nne, {0}, 0};
        exact = corners_cancel(&t);
        if (exact < 0) {
            free(ne);
            return fsdp_err_set(err, FSDP_E_NOMEM, "%s: %s: out of memory checking %zu chunks", what, it->fqn, nne);
        }
    }
    int rc = 0;
    if (!exact || covered_ovf || covered != total)
        rc = tiling_error(what, it, ne, nne, covered, covered_ovf, total, err);
    free(ne);
    return rc;
}

/* ---- lookup by offsets, de-duplication ---------------------------------------------------------- */

static int cmp_offsets(const void *a, const void *b, void *ctx) {
    const dcp_item *it = ctx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    for (int d = 0; d < it->ndim; d++) {
        int64_t p = it->chunks[i].offsets[d], q = it->chunks[j].offsets[d];
        if (p != q) return p < q ? -1 : 1;
    }
    return i < j ? -1 : i > j;
}

void dcp_chunks_sort(const dcp_item *it, size_t *ord) {
    for (size_t i = 0; i < it->n_chunks; i++) ord[i] = i;
    qsort_r(ord, it->n_chunks, sizeof *ord, cmp_offsets, (void *)it);
}

static int cmp_to(const dcp_item *it, size_t i, const int64_t *offsets) {
    for (int d = 0; d < it->ndim; d++) {
        int64_t p = it->chunks[i].offsets[d];
        if (p != offsets[d]) return p < offsets[d] ? -1 : 1;
    }
    return 0;
}

void dcp_chunks_find(const dcp_item *it, const size_t *ord, const int64_t *offsets, size_t *lo, size_t *hi) {
    size_t a = 0, b = it->n_chunks;
    while (a < b) { /* first chunk not below offsets */
        size_t mid = a + (b - a) / 2;
        if (cmp_to(it, ord[mid], offsets) < 0) a = mid + 1;
        else b = mid;
    }
    *lo = a;
    b = it->n_chunks;
    while (a < b) { /* first chunk above offsets */
        size_t mid = a + (b - a) / 2;
        if (cmp_to(it, ord[mid], offsets) <= 0) a = mid + 1;
        else b = mid;
    }
    *hi = a;
}

static int cmp_chunk_whole(const void *a, const void *b, void *ctx) {
    const dcp_item *it = ctx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int c = memcmp(it->chunks[i].offsets, it->chunks[j].offsets, (size_t)it->ndim * sizeof(int64_t));
    if (!c) c = memcmp(it->chunks[i].sizes, it->chunks[j].sizes, (size_t)it->ndim * sizeof(int64_t));
    if (c) return c;
    return i < j ? -1 : i > j;
}

static int same_geometry(const dcp_item *it, size_t i, size_t j) {
    size_t n = (size_t)it->ndim * sizeof(int64_t);
    return !memcmp(it->chunks[i].offsets, it->chunks[j].offsets, n) &&
           !memcmp(it->chunks[i].sizes, it->chunks[j].sizes, n);
}

int dcp_chunks_dedup(dcp_item *it, fsdp_err *err) {
    size_t n = it->n_chunks;
    if (n < 2) return 0;
    size_t *ord = malloc(n * sizeof *ord);
    unsigned char *drop = calloc(n, 1);
    if (!ord || !drop) {
        free(ord);
        free(drop);
        return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory merging %zu chunks", it->fqn, n);
    }
    for (size_t i = 0; i < n; i++) ord[i] = i;
    /* any total order groups equal geometries; ties by index keep the first of each group first */
    qsort_r(ord, n, sizeof *ord, cmp_chunk_whole, it);
    for (size_t i = 1; i < n; i++)
        if (same_geometry(it, ord[i - 1], ord[i])) drop[ord[i]] = 1;
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!drop[i]) it->chunks[w++] = it->chunks[i];
    it->n_chunks = w;
    free(ord);
    free(drop);
    return 0;
}
