/* Expert parallelism of the CPU FSDP step (train/train_fsdp.h): which ranks own which experts, the
 * gather of an ep rank's experts from the shards of its edp group and the reduction of their gradient.
 *
 * Over a shard group of S ranks with expert parallelism P (P divides S, S divides the experts E):
 * shard rank r holds experts r*E/S .. (r+1)*E/S - 1 (its Shard(0) rows, as without EP). Its ep rank is
 * j = r / (S/P): it computes experts j*E/P .. (j+1)*E/P - 1, the rows of the S/P consecutive ranks of its
 * edp group (r / (S/P) equal), gathered by one all-gather in rank order. Tokens go to the owner of their
 * expert among the P ranks with the same r % (S/P) (the ep group, in rank order = ep rank order). The
 * owner's gradient sums its ep group's tokens; the reduce-scatter over the edp group adds the other ep
 * groups' and leaves each rank its own experts' rows; the replicas (HSDP) then add theirs. */
#include "train/train_fsdp_internal.h"
#include "train/train_moe.h"

#include <stdlib.h>
#include <string.h>

int train_fsdp_set_expert_parallel(train_fsdp *f, int ep, fsdp_err *err) {
    if (ep <= 1) return 0;
    int rc = train_moe_ep_groups(f->c, ep, f->lay.n_experts, f->m.set_expert_parallel != NULL, &f->ep_c, &f->edp_c, err);
    if (rc) return rc;
    f->ep = ep;
    if ((rc = train_fsdp_make_groups(f, comm_size(f->c), comm_rank(f->c), err))) return rc;
    if (f->rep && !f->flat_scratch && !(f->flat_scratch = malloc(f->scratch_numel * sizeof(float))))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (training: flat collective buffer)");
    return f->m.set_expert_parallel(f->ws, f->ep_c, err);
}

int train_fsdp_ep_gather(train_fsdp *f, int k, float *full, fsdp_err *err) {
    const state_param *p = f->layer[k];
    const int n = comm_size(f->edp_c);
    const size_t local = state_param_local_numel(p);
    size_t bytes[n];
    for (int q = 0; q < n; q++) bytes[q] = local * sizeof(float);
    int rc = comm_allgatherv(f->edp_c, p->data, full, bytes, err);
    return rc ? fsdp_err_prefix(err, "training: all-gather of %s's experts", p->name) : 0;
}

int train_fsdp_ep_reduce(train_fsdp *f, int k, const float *full, fsdp_err *err) {
    state_param *p = f->layer[k];
    const int n = comm_size(f->edp_c);
    const size_t local = state_param_local_numel(p);
    size_t counts[n];
    for (int q = 0; q < n; q++) counts[q] = local;
    int rc = comm_reduce_scatterv_f32(f->edp_c, full, p->grad, counts, err);
    if (!rc && f->rep) rc = comm_allreduce(f->rep, p->grad, local, COMM_F32, COMM_SUM, err);
    return rc ? fsdp_err_prefix(err, "training: reduce-scatter of %s's experts", p->name) : 0;
}
