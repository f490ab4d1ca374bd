/* The mixture-of-experts parts the CPU and GPU FSDP steps share (train/train_moe.h). */
#include "train/train_moe.h"

int train_moe_aux(train_moe_stats_fn stats, train_moe_apply_fn apply, void *ws, comm *wc, double *buf, int n_aux,
                  int n_micro, model_blocks_aux *acc, fsdp_err *err) {
    model_blocks_aux a;
    int rc = stats(ws, buf, err);
    if (!rc) rc = comm_allreduce(wc, buf, (size_t)n_aux, COMM_F64, COMM_SUM, err);
    if (!rc) rc = apply(ws, buf, 1.0 / n_micro, &a, err);
    if (rc) return fsdp_err_prefix(err, "training: auxiliary loss");
    acc->loss += a.loss / n_micro;
    acc->weighted += a.weighted / n_micro;
    return 0;
}

void train_moe_load_add(train_moe_load_fn fn, void *ws, int n_blocks, int E, int64_t *load, int first) {
    int64_t counts[E > 0 ? E : 1];
    for (int i = 0; i < n_blocks; i++) {
        int64_t *row = load + (size_t)i * (size_t)E;
        int moe = fn(ws, i, counts);
        for (int e = 0; e < E; e++) row[e] = !moe ? -1 : first ? counts[e] : row[e] + counts[e];
    }
}

int train_moe_load_reduce(comm *wc, int64_t *load, size_t n, fsdp_err *err) {
    const int64_t w = comm_size(wc);
    int rc = comm_allreduce(wc, load, n, COMM_I64, COMM_SUM, err);
    if (rc) return fsdp_err_prefix(err, "training: tokens per expert");
    for (size_t i = 0; i < n; i++)
        if (load[i] == -w) load[i] = -1;
    return 0;
}

int train_moe_ep_groups(comm *c, int ep, int n_experts, int has_hook, comm **ep_c, comm **edp_c, fsdp_err *err) {
    const int S = comm_size(c), r = comm_rank(c);
    if (!n_experts || !has_hook)
        return fsdp_err_set(err, FSDP_E_INVALID, "train-steps: expert_parallel %d, but the model has no experts", ep);
    if (S % ep || n_experts % S)
        return fsdp_err_set(err, FSDP_E_INVALID, "train-steps: expert_parallel %d needs a shard group whose size (%d "
                            "ranks) it divides and that divides the %d experts (each rank holds whole experts)", ep, S,
                            n_experts);
    const int per = S / ep;
    int rc = comm_split(c, r % per, r, ep_c, err);
    if (!rc) rc = comm_split(c, r / per, r, edp_c, err);
    return rc ? fsdp_err_prefix(err, "train-steps: expert parallelism groups") : 0;
}
