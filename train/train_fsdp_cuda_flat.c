/* The GPU trainer's per-block collectives (train/train_fsdp_cuda_internal.h): each layer's
 * parameters are one flat group (train/flat_group.h). All-gather: this rank's shards copied (or
 * cast to bf16) into its block of a device flat buffer, one comm_dev_allgatherv in place, then each
 * (rank, parameter) segment copied to its rows of the gathered layer. Reduce-scatter: the layer's
 * full f32 gradient packed rank-major into the flat buffer, one comm_dev_reduce_scatterv_f32 into
 * the buffer's tail, then each parameter's segment copied to its d_grad. Everything runs on the COMM
 * stream, so one flat buffer serves every layer in turn. */
#include "train/train_fsdp_cuda_internal.h"

#include <stdlib.h>

#define TRY(call)                   \
    do {                            \
        int try_rc_ = (call);       \
        if (try_rc_) return try_rc_; \
    } while (0)

int train_fsdp_cuda_flat_setup(train_fsdp_cuda *f, fsdp_err *err) {
    const int L = f->lay.n_blocks;
    if (!(f->groups = calloc((size_t)L, sizeof *f->groups)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory (parameter groups)");
    size_t need = 1;
    for (int i = 0; i < L; i++) {
        state_param *ps[TRAIN_FSDP_CUDA_LAYER_PARAMS];
        int n = 0;
        for (int k = f->first[i]; k < f->first[i + 1]; k++)
            if (!train_fsdp_cuda_is_ep(f, k)) {
                f->fmap[f->first[i] + n] = k;
                ps[n++] = f->layer[k];
            }
        int rc = flat_group_create(ps, n, f->world, f->rank, &f->groups[i], err);
        if (rc) return fsdp_err_prefix(err, "training (cuda): layer %d", i);
        /* the f32 reduce-scatter needs total + own elements; the gather total of dtype dt (<= f32) */
        size_t sn = flat_group_scratch_numel(f->groups[i]);
        if (sn > need) need = sn;
    }
    size_t bytes;
    if (__builtin_mul_overflow(need, sizeof(float), &bytes))
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): size of the flat collective buffer overflows");
    int rc = dev_alloc(f->d, bytes, &f->flat, err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): %zu bytes for the flat collective buffer", bytes);
    f->dev_bytes += bytes;
    f->flat_bytes = bytes;
    return 0;
}

void train_fsdp_cuda_flat_free(train_fsdp_cuda *f) {
    for (int i = 0; f->groups && i < f->lay.n_blocks; i++) flat_group_free(f->groups[i]);
    free(f->groups);
    f->groups = NULL;
    if (f->flat && f->d) {
        fsdp_err e;
        dev_free(f->d, f->flat, &e);
        f->dev_bytes -= f->flat_bytes;
    }
    f->flat = NULL;
    f->flat_bytes = 0;
}

int train_fsdp_cuda_flat_gather(train_fsdp_cuda *f, int layer, void *dst, fsdp_err *err) {
    const flat_group *g = f->groups[layer];
    const size_t n = (size_t)g->n_params, es = f->es;
    char *flat = f->flat, *out = dst;
    const flat_group_seg *own = g->segs + (size_t)f->rank * n;
    kcu_stream st = dev_ctx_stream(f->d, DEV_STREAM_COMM);
    for (size_t k = 0; k < n; k++) {
        if (!own[k].n) continue;
        void *to = flat + own[k].flat_off * es;
        if (f->dt != FSDP_DT_F32)
            TRY(kcu_cast(to, f->dt, g->ps[k]->d_data, FSDP_DT_F32, (int64_t)own[k].n, st, err));
        else
            TRY(dev_copy_d2d(f->d, to, g->ps[k]->d_data, own[k].n * es, DEV_STREAM_COMM, err));
    }
    for (int r = 0; r < f->world; r++) f->bytes[r] = g->counts[r] * es;
    int rc = comm_dev_allgatherv(f->c, flat + g->displs[f->rank] * es, flat, f->bytes, st, err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): all-gather of layer %d", layer);
    for (size_t r = 0; r < (size_t)f->world; r++) {
        for (size_t k = 0; k < n; k++) {
            const flat_group_seg *s = &g->segs[r * n + k];
            if (s->n)
                TRY(dev_copy_d2d(f->d, out + ((size_t)f->off[f->fmap[f->first[layer] + k]] + s->full_off) * es, flat + s->flat_off * es,
                                 s->n * es, DEV_STREAM_COMM, err));
        }
    }
    return 0;
}

int train_fsdp_cuda_flat_reduce(train_fsdp_cuda *f, int layer, const float *grad, fsdp_err *err) {
    const flat_group *g = f->groups[layer];
    const size_t n = (size_t)g->n_params;
    float *flat = f->flat, *mine = flat + g->total;
    for (size_t r = 0; r < (size_t)f->world; r++) {
        for (size_t k = 0; k < n; k++) {
            const flat_group_seg *s = &g->segs[r * n + k];
            if (s->n)
                TRY(dev_copy_d2d(f->d, flat + s->flat_off, grad + (size_t)f->off[f->fmap[f->first[layer] + k]] + s->full_off,
                                 s->n * sizeof(float), DEV_STREAM_COMM, err));
        }
    }
    int rc = comm_dev_reduce_scatterv_f32(f->c, flat, mine, g->counts, dev_ctx_stream(f->d, DEV_STREAM_COMM), err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): reduce-scatter of the gradients of layer %d", layer);
    if (f->rep && (rc = comm_dev_allreduce(f->rep, mine, g->counts[f->rank], COMM_F32, COMM_SUM,
                                           dev_ctx_stream(f->d, DEV_STREAM_COMM), err)))
        return fsdp_err_prefix(err, "training (cuda): all-reduce over the replicas of the gradients of layer %d", layer);
    const flat_group_seg *own = g->segs + (size_t)f->rank * n;
    const size_t base = g->displs[f->rank];
    for (size_t k = 0; k < n; k++)
        if (own[k].n)
            TRY(dev_copy_d2d(f->d, g->ps[k]->d_grad, mine + (own[k].flat_off - base), own[k].n * sizeof(float),
                             DEV_STREAM_COMM, err));
    return 0;
}
