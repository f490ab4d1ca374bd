/* Collectives of train-steps' steps (stages/train_calls.h). */
#include "stages/train_calls.h"

#include "stages/stages.h"

void train_calls_init(fsdp_ctx *ctx, train_calls *t) {
    comm *all[TRAIN_CALLS_COMMS] = {stage_comm(ctx), stage_shard_comm(ctx), stage_replicate_comm(ctx)};
    int n = 0;
    for (int i = 0; i < TRAIN_CALLS_COMMS; i++) {
        int seen = !all[i];
        for (int j = 0; j < n && !seen; j++) seen = t->c[j] == all[i];
        if (!seen) t->c[n++] = all[i];
    }
}

void train_calls_begin(train_calls *t) {
    for (int i = 0; i < TRAIN_CALLS_COMMS && t->c[i]; i++)
        for (int k = 0; k < COMM_KINDS; k++) {
            t->before[i][k] = comm_calls(t->c[i], (comm_kind)k);
            t->bbefore[i][k] = comm_bytes(t->c[i], (comm_kind)k);
        }
}

void train_calls_end(train_calls *t) {
    for (int i = 0; i < TRAIN_CALLS_COMMS && t->c[i]; i++)
        for (int k = 0; k < COMM_KINDS; k++) {
            t->sum[i][k] += comm_calls(t->c[i], (comm_kind)k) - t->before[i][k];
            t->bsum[i][k] += comm_bytes(t->c[i], (comm_kind)k) - t->bbefore[i][k];
        }
    t->steps++;
}

/* What one rank of an n-rank ring sends for `payload` bytes of collective kind k. */
static double ring_sent(comm_kind k, double payload, int n) {
    if (n <= 1) return 0;
    double share = payload * (double)(n - 1) / (double)n;
    switch (k) {
    case COMM_K_ALLGATHER:
    case COMM_K_REDUCE_SCATTER: return share;
    case COMM_K_ALLREDUCE: return 2 * share;
    case COMM_K_BCAST: return payload;
    default: return payload / n;
    }
}

void train_calls_report(fsdp_ctx *ctx, const train_calls *t, int per_param) {
    if (t->steps <= 0) return;
    double n = (double)t->steps, total = 0, kinds[COMM_KINDS] = {0}, intra = 0, inter = 0;
    for (int i = 0; i < TRAIN_CALLS_COMMS && t->c[i]; i++) {
        for (int k = 0; k < COMM_KINDS; k++) {
            kinds[k] += (double)t->sum[i][k];
            total += (double)t->sum[i][k];
            double sent = ring_sent((comm_kind)k, (double)t->bsum[i][k], comm_size(t->c[i]));
            if (comm_spans_nodes(t->c[i])) inter += sent;
            else intra += sent;
        }
    }
    fsdp_ctx_metric(ctx, "collectives_per_step", total / n);
    fsdp_ctx_metric(ctx, "all_gathers_per_step", kinds[COMM_K_ALLGATHER] / n);
    fsdp_ctx_metric(ctx, "reduce_scatters_per_step", kinds[COMM_K_REDUCE_SCATTER] / n);
    fsdp_ctx_metric(ctx, "all_reduces_per_step", kinds[COMM_K_ALLREDUCE] / n);
    fsdp_ctx_metric(ctx, "bytes_sent_intra_node_per_step", intra / n);
    fsdp_ctx_metric(ctx, "bytes_sent_inter_node_per_step", inter / n);
    fsdp_ctx_metric_str(ctx, "collectives", per_param ? "per parameter" : "per block");
    fsdp_log(ctx, FSDP_LOG_INFO,
             "collectives per step (%s): %.4g (%.4g all-gathers, %.4g reduce-scatters, %.4g all-reduces); bytes sent "
             "per rank and step: %.4g inside a node, %.4g across nodes",
             per_param ? "per parameter" : "per block", total / n, kinds[COMM_K_ALLGATHER] / n,
             kinds[COMM_K_REDUCE_SCATTER] / n, kinds[COMM_K_ALLREDUCE] / n, intra / n, inter / n);
}
