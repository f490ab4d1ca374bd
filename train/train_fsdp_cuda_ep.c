/* Expert parallelism of the GPU FSDP step (train/train_fsdp_cuda.h): the layout of train/train_fsdp_ep.c
 * with device collectives on the COMM stream: an ep rank's experts are all-gathered over its edp group
 * (the S/P ranks that hold their rows), their gradient reduce-scattered over it, and the model's MoE
 * layers exchange tokens over the ep group (NCCL all-to-all). */
#include "train/train_fsdp_cuda_internal.h"
#include "train/train_moe.h"

#include <stdlib.h>

int train_fsdp_cuda_set_expert_parallel(train_fsdp_cuda *f, int ep, fsdp_err *err) {
    if (ep <= 1) return 0;
    int rc = train_moe_ep_groups(f->c, ep, f->lay.n_experts, f->m.set_expert_parallel != NULL, &f->ep_c, &f->edp_c,
                                 err);
    if (!rc) rc = comm_dev_init(f->ep_c, err);
    if (!rc) rc = comm_dev_init(f->edp_c, err);
    if (rc) return fsdp_err_prefix(err, "train-steps: expert parallelism groups");
    f->ep = ep;
    train_fsdp_cuda_flat_free(f);
    if (!f->opt.per_param && (rc = train_fsdp_cuda_flat_setup(f, err))) return rc;
    return f->m.set_expert_parallel(f->ws, f->ep_c, err);
}

int train_fsdp_cuda_ep_gather(train_fsdp_cuda *f, int k, void *dst, fsdp_err *err) {
    const state_param *p = f->layer[k];
    const int n = comm_size(f->edp_c), me = comm_rank(f->edp_c);
    const size_t local = state_param_local_numel(p);
    dev_stream st = dev_ctx_stream(f->d, DEV_STREAM_COMM);
    size_t bytes[n];
    for (int q = 0; q < n; q++) bytes[q] = local * f->es;
    const void *send = p->d_data;
    int rc = 0;
    if (f->dt != FSDP_DT_F32) { /* this rank's rows cast into its block of dst, gathered in place */
        void *own = (char *)dst + (size_t)me * local * f->es;
        if (local) rc = kcu_cast(own, f->dt, p->d_data, FSDP_DT_F32, (int64_t)local, st, err);
        send = own;
    }
    if (!rc) rc = comm_dev_allgatherv(f->edp_c, send, dst, bytes, st, err);
    return rc ? fsdp_err_prefix(err, "training (cuda): all-gather of %s's experts", p->name) : 0;
}

int train_fsdp_cuda_ep_reduce(train_fsdp_cuda *f, int k, const float *full, fsdp_err *err) {
    state_param *p = f->layer[k];
    const int n = comm_size(f->edp_c);
    const size_t local = state_param_local_numel(p);
    dev_stream st = dev_ctx_stream(f->d, DEV_STREAM_COMM);
    size_t counts[n];
    for (int q = 0; q < n; q++) counts[q] = local;
    int rc = comm_dev_reduce_scatterv_f32(f->edp_c, full, p->d_grad, counts, st, err);
    if (!rc && f->rep) rc = comm_dev_allreduce(f->rep, p->d_grad, local, COMM_F32, COMM_SUM, st, err);
    return rc ? fsdp_err_prefix(err, "training (cuda): reduce-scatter of %s's experts", p->name) : 0;
}
