/* The sharded state (runtime/state.h): parameters, their arrays wherever they live, gradients and moments. */
#include "runtime/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ctx_impl.h"
#include "runtime/shard.h"

static void state_destroy(void *p) { state_free((fsdp_state *)p); }

fsdp_state *state_get(fsdp_ctx *ctx) { return (fsdp_state *)fsdp_ctx_attached(ctx, STATE_ATTACH_NAME); }

int state_create(fsdp_ctx *ctx, state_layout layout, fsdp_state **out, fsdp_err *err) {
    fsdp_state *s = calloc(1, sizeof *s);
    if (!s) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    s->layout = layout;
    /* rows are those of this rank's place in the shard group (the world without a mesh) */
    comm *sc = ctx->mesh ? ctx_shard_comm(ctx) : NULL;
    s->rank = sc ? comm_rank(sc) : fsdp_ctx_rank(ctx);
    s->world = sc ? comm_size(sc) : fsdp_ctx_world_size(ctx);
    s->beta1 = 0.9;
    s->beta2 = 0.95;
    s->eps = 1e-8;
    if (fsdp_ctx_attach(ctx, STATE_ATTACH_NAME, s, state_destroy)) {
        free(s);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    *out = s;
    return 0;
}

static void free_param(fsdp_state *s, state_param *p) {
    free(p->name);
    for (int a = 0; a < STATE_ARRAYS; a++) state_param_release(s, p, (state_array)a);
    memset(p, 0, sizeof *p);
}

void state_free(fsdp_state *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free_param(s, &s->p[i]);
    free(s->p);
    nidx_free(&s->names);
    if (s->model && s->model_free) s->model_free(s->model);
    free(s->trainer_cfg);
    for (size_t i = 0; i < s->n_blobs; i++) free(s->blobs[i].key), free(s->blobs[i].data);
    free(s->blobs);
    free(s);
}

const state_blob *state_blob_get(const fsdp_state *s, const char *key) {
    for (size_t i = 0; s && key && i < s->n_blobs; i++)
        if (!strcmp(s->blobs[i].key, key)) return &s->blobs[i];
    return NULL;
}

int state_blob_set(fsdp_state *s, const char *key, const void *data, size_t n, fsdp_err *err) {
    state_blob *b = (state_blob *)state_blob_get(s, key);
    if (!n) {
        if (!b) return 0;
        free(b->key), free(b->data);
        *b = s->blobs[--s->n_blobs];
        return 0;
    }
    unsigned char *copy = malloc(n);
    if (!copy) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu bytes of %s", n, key);
    memcpy(copy, data, n);
    if (b) {
        free(b->data);
        b->data = copy, b->n = n;
        return 0;
    }
    state_blob *nb = realloc(s->blobs, (s->n_blobs + 1) * sizeof *nb);
    char *k = strdup(key);
    if (!nb || !k) {
        if (nb) s->blobs = nb;
        free(k), free(copy);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    s->blobs = nb;
    s->blobs[s->n_blobs++] = (state_blob){k, copy, n};
    return 0;
}

int64_t state_param_numel(const state_param *p) { return fsdp_numel(p->ndim, p->shape); }
size_t state_param_local_numel(const state_param *p) { return (size_t)(p->rows * p->row_numel); }

static float *alloc_floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

int state_add_param(fsdp_state *s, const char *name, int ndim, const int64_t *shape, int layer, fsdp_err *err) {
    if (ndim < 0 || ndim > FSDP_MAX_DIMS)
        return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: %d dims (at most %d)", name, ndim, FSDP_MAX_DIMS);
    if (fsdp_numel(ndim, shape) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: invalid shape", name);
    if (state_find(s, name)) return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s declared twice", name);
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        state_param *np = cap < SIZE_MAX / sizeof *np ? realloc(s->p, cap * sizeof *np) : NULL;
        if (!np) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for %zu parameters", cap);
        s->p = np;
        s->cap = cap;
    }
    state_param *p = &s->p[s->n];
    memset(p, 0, sizeof *p);
    p->name = strdup(name);
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
    p->layer = layer;
    p->dtype = FSDP_DT_F32;
    p->row_numel = ndim == 0 ? 1 : fsdp_numel(ndim - 1, shape + 1);
    int64_t d0 = ndim == 0 ? 1 : shape[0];
    if (s->layout == STATE_FULL) {
        p->row0 = 0;
        p->rows = s->rank == 0 ? d0 : 0;
    } else if (ndim == 0) {
        p->row0 = 0;
        p->rows = 1; /* 0-d values are replicated */
    } else {
        shard_rows(d0, s->world, s->rank, &p->row0, &p->rows);
    }
    size_t want = state_param_local_numel(p); /* free_param clears p: the count is kept for the message */
    p->data = alloc_floats(want);
    if (!p->name || !p->data) {
        free_param(s, p);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory allocating %s (%zu floats)", name, want);
    }
    if (nidx_add(&s->names, p->name, s->n, NULL) != 0) {
        free_param(s, p);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory indexing parameter %s", name);
    }
    s->n++;
    return 0;
}

state_param *state_find(fsdp_state *s, const char *name) {
    long i = s ? nidx_get(&s->names, name) : -1;
    return i >= 0 && (size_t)i < s->n ? &s->p[i] : NULL;
}

/* Host memory of a state with a device is pinned (fast copies to and from the GPU). */
static state_place host_place(const fsdp_state *s) { return s->dev ? STATE_PINNED : STATE_HOST; }

static int alloc_missing(fsdp_state *s, state_param *p, state_array a, state_place where, const char *what,
                         fsdp_err *err) {
    if (state_place_of(p, a) != STATE_ABSENT) return 0;
    int rc = state_param_alloc(s, p, a, where, 1, err);
    return rc ? fsdp_err_prefix(err, "allocating the %s of %s", what, p->name) : 0;
}

int state_alloc_optimizer(fsdp_state *s, fsdp_err *err) {
    for (size_t i = 0; i < s->n; i++) {
        state_param *p = &s->p[i];
        if (!state_param_trained(p)) continue;
        state_place where = s->offloaded ? host_place(s)
                            : state_place_of(p, STATE_DATA) == STATE_DEVICE ? STATE_DEVICE
                                                                             : STATE_HOST;
        int rc;
        if ((rc = alloc_missing(s, p, STATE_EXP_AVG, where, "optimizer state", err)) ||
            (rc = alloc_missing(s, p, STATE_EXP_AVG_SQ, where, "optimizer state", err)))
            return rc;
    }
    s->has_optimizer = 1;
    return 0;
}

int state_alloc_grads(fsdp_state *s, fsdp_err *err) {
    for (size_t i = 0; i < s->n; i++) {
        state_param *p = &s->p[i];
        state_place where = state_place_of(p, STATE_DATA) == STATE_DEVICE ? STATE_DEVICE : host_place(s);
        int rc = alloc_missing(s, p, STATE_GRAD, where, "gradient", err);
        if (rc) return rc;
    }
    return 0;
}

/* Scatter one full buffer (valid on rank 0) into each rank's rows. */
static int scatter_rows(const state_param *p, const float *full, comm *c, int world, float **local, fsdp_err *err) {
    int rank = comm_rank(c);
    size_t *counts = malloc((size_t)world * sizeof *counts);
    if (!counts) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int64_t row0 = 0, rows = 1;
    for (int r = 0; r < world; r++) {
        int64_t r0 = 0, n = 1;
        if (p->ndim > 0) shard_rows(p->shape[0], world, r, &r0, &n);
        counts[r] = (size_t)(n * p->row_numel);
        if (r == rank) {
            row0 = r0;
            rows = n;
        }
    }
    (void)row0;
    size_t n = (size_t)(rows * p->row_numel);
    float *mine = alloc_floats(n);
    int rc;
    if (!mine) {
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory sharding %s", p->name);
    } else if (p->ndim == 0) {
        /* 0-d values are replicated: broadcast */
        if (rank == 0) mine[0] = full[0];
        rc = comm_bcast(c, mine, sizeof(float), 0, err);
    } else {
        rc = comm_scatterv_f32(c, full, mine, counts, 0, err);
    }
    free(counts);
    if (rc) {
        free(mine);
        return rc;
    }
    *local = mine;
    return 0;
}

int state_shard(fsdp_state *s, comm *c, fsdp_err *err) {
    if (s->layout != STATE_FULL) return fsdp_err_set(err, FSDP_E_INVALID, "shard: the parameters are already sharded");
    if (state_on_device(s))
        return fsdp_err_set(err, FSDP_E_INVALID, "shard: the full parameters must be in host memory (they are on the GPU)");
    int world = comm_size(c), rank = comm_rank(c);
    /* rank 0 tells everyone whether optimizer state exists */
    int64_t has_opt = s->has_optimizer;
    int rc = comm_bcast(c, &has_opt, sizeof has_opt, 0, err);
    if (rc) return rc;
    for (size_t i = 0; i < s->n; i++) {
        state_param *p = &s->p[i];
        float *bufs[3] = {p->data, p->exp_avg, p->exp_avg_sq};
        float *out[3] = {NULL, NULL, NULL};
        int nb = has_opt ? 3 : 1;
        for (int b = 0; b < nb; b++) {
            if ((rc = scatter_rows(p, bufs[b], c, world, &out[b], err))) {
                for (int q = 0; q < b; q++) free(out[q]);
                return rc;
            }
        }
        for (int a = 0; a < STATE_ARRAYS; a++) state_param_release(s, p, (state_array)a);
        p->data = out[0];
        p->exp_avg = out[1];
        p->exp_avg_sq = out[2];
        if (p->ndim == 0) {
            p->row0 = 0;
            p->rows = 1;
        } else {
            shard_rows(p->shape[0], world, rank, &p->row0, &p->rows);
        }
    }
    s->layout = STATE_SHARDED;
    s->has_optimizer = (int)has_opt;
    s->world = world;
    s->rank = rank;
    return 0;
}

int state_unshard(const state_param *p, const float *local, comm *c, float *full, fsdp_err *err) {
    int world = comm_size(c);
    if (p->ndim == 0 || world == 1) {
        memcpy(full, local, (size_t)state_param_numel(p) * sizeof(float));
        return 0;
    }
    size_t *bytes = malloc((size_t)world * sizeof *bytes);
    if (!bytes) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (int r = 0; r < world; r++) {
        int64_t r0, rows;
        shard_rows(p->shape[0], world, r, &r0, &rows);
        bytes[r] = (size_t)(rows * p->row_numel) * sizeof(float);
    }
    int rc = comm_allgatherv(c, local, full, bytes, err);
    free(bytes);
    return rc;
}

int state_reduce_scatter(const state_param *p, const float *full, comm *c, float *local, fsdp_err *err) {
    int world = comm_size(c);
    if (world == 1) {
        memcpy(local, full, state_param_local_numel(p) * sizeof(float));
        return 0;
    }
    if (p->ndim == 0) {
        memcpy(local, full, sizeof(float));
        return comm_allreduce(c, local, 1, COMM_F32, COMM_SUM, err);
    }
    size_t *counts = malloc((size_t)world * sizeof *counts);
    if (!counts) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (int r = 0; r < world; r++) {
        int64_t r0, rows;
        shard_rows(p->shape[0], world, r, &r0, &rows);
        counts[r] = (size_t)(rows * p->row_numel);
    }
    int rc = comm_reduce_scatterv_f32(c, full, local, counts, err);
    free(counts);
    return rc;
}

