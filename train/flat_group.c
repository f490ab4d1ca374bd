/* Flat parameter groups (train/flat_group.h): the layout and the host collectives. */
#include "train/flat_group.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/shard.h"

void flat_group_free(flat_group *g) {
    if (!g) return;
    free(g->ps);
    free(g->counts);
    free(g->displs);
    free(g->bytes);
    free(g->segs);
    free(g);
}

/* Rank r's rows of p, checked against this rank's own shard. */
static int layout_param(flat_group *g, int k, fsdp_err *err) {
    const state_param *p = g->ps[k];
    if (p->ndim == 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "flat parameter group: %s is 0-d (replicated on every rank), not sharded by rows", p->name);
    for (int r = 0; r < g->world; r++) {
        int64_t row0, rows;
        shard_rows(p->shape[0], g->world, r, &row0, &rows);
        if (r == g->rank && (row0 != p->row0 || rows != p->rows))
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "flat parameter group: %s holds rows %lld+%lld, rank %d of %d should hold %lld+%lld",
                                p->name, (long long)p->row0, (long long)p->rows, r, g->world, (long long)row0,
                                (long long)rows);
        flat_group_seg *s = &g->segs[(size_t)r * (size_t)g->n_params + (size_t)k];
        s->n = (size_t)(rows * p->row_numel);
        s->full_off = (size_t)(row0 * p->row_numel);
        s->flat_off = g->counts[r]; /* within the block for now; the block's offset is added below */
        g->counts[r] += s->n;
    }
    return 0;
}

int flat_group_create(state_param *const *ps, int n, int world, int rank, flat_group **out, fsdp_err *err) {
    *out = NULL;
    if (n < 0 || world < 1 || rank < 0 || rank >= world)
        return fsdp_err_set(err, FSDP_E_INVALID, "flat parameter group: %d parameters, rank %d of %d", n, rank, world);
    flat_group *g = calloc(1, sizeof *g);
    if (!g) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    g->n_params = n;
    g->world = world;
    g->rank = rank;
    size_t nw = (size_t)world;
    g->ps = calloc(n ? (size_t)n : 1, sizeof *g->ps);
    g->counts = calloc(nw, sizeof *g->counts);
    g->displs = calloc(nw, sizeof *g->displs);
    g->bytes = calloc(nw, sizeof *g->bytes);
    g->segs = calloc(nw * (size_t)(n ? n : 1), sizeof *g->segs);
    if (!g->ps || !g->counts || !g->displs || !g->bytes || !g->segs) {
        flat_group_free(g);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (flat parameter group)");
    }
    if (n) memcpy(g->ps, ps, (size_t)n * sizeof *ps);
    for (int k = 0; k < n; k++) {
        int rc = layout_param(g, k, err);
        if (rc) {
            flat_group_free(g);
            return rc;
        }
    }
    for (int r = 0; r < world; r++) {
        g->displs[r] = g->total;
        g->bytes[r] = g->counts[r] * sizeof(float);
        for (int k = 0; k < n; k++) g->segs[(size_t)r * (size_t)n + (size_t)k].flat_off += g->total;
        g->total += g->counts[r];
    }
    *out = g;
    return 0;
}

size_t flat_group_scratch_numel(const flat_group *g) { return g->total + g->counts[g->rank]; }

int flat_group_gather(const flat_group *g, comm *c, float *scratch, float *const *full, fsdp_err *err) {
    const size_t n = (size_t)g->n_params;
    if (g->world == 1) {
        for (size_t k = 0; k < n; k++)
            if (g->segs[k].n) memcpy(full[k], g->ps[k]->data, g->segs[k].n * sizeof(float));
        return 0;
    }
    const flat_group_seg *own = g->segs + (size_t)g->rank * n;
    for (size_t k = 0; k < n; k++)
        if (own[k].n) memcpy(scratch + own[k].flat_off, g->ps[k]->data, own[k].n * sizeof(float));
    int rc = comm_allgatherv(c, scratch + g->displs[g->rank], scratch, g->bytes, err);
    if (rc) return rc;
    for (size_t r = 0; r < (size_t)g->world; r++) {
        for (size_t k = 0; k < n; k++) {
            const flat_group_seg *s = &g->segs[r * n + k];
            if (s->n) memcpy(full[k] + s->full_off, scratch + s->flat_off, s->n * sizeof(float));
        }
    }
    return 0;
}

int flat_group_reduce_scatter(const flat_group *g, comm *c, comm *rep, const float *const *full, float *scratch,
                              fsdp_err *err) {
    const size_t n = (size_t)g->n_params;
    if (g->world == 1 && !rep) {
        for (size_t k = 0; k < n; k++)
            if (g->segs[k].n) memcpy(g->ps[k]->grad, full[k], g->segs[k].n * sizeof(float));
        return 0;
    }
    for (size_t r = 0; r < (size_t)g->world; r++) {
        for (size_t k = 0; k < n; k++) {
            const flat_group_seg *s = &g->segs[r * n + k];
            if (s->n) memcpy(scratch + s->flat_off, full[k] + s->full_off, s->n * sizeof(float));
        }
    }
    /* MPI's reduce-scatter does not take overlapping buffers; one shard: the block is the whole */
    float *mine = g->world > 1 ? scratch + g->total : scratch;
    int rc = g->world > 1 ? comm_reduce_scatterv_f32(c, scratch, mine, g->counts, err) : 0;
    /* HSDP: the shard's sums over this replica's ranks, summed over the replicas */
    if (!rc && rep) rc = comm_allreduce(rep, mine, g->counts[g->rank], COMM_F32, COMM_SUM, err);
    if (rc) return rc;
    const flat_group_seg *own = g->segs + (size_t)g->rank * n;
    const size_t base = g->world > 1 ? g->displs[g->rank] : 0;
    for (size_t k = 0; k < n; k++)
        if (own[k].n) memcpy(g->ps[k]->grad, mine + (own[k].flat_off - base), own[k].n * sizeof(float));
    return 0;
}
