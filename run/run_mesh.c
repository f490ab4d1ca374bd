/* runtime.mesh in a run (run/run_mesh.h). */
#include "run/run_mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ctx_impl.h"
#include "runtime/launch.h"
#include "runtime/mesh.h"
#include "runtime/state.h"

int run_ranks_per_node(comm *c, int world) {
    if (c && comm_size(c) > 1) return comm_local_size(c);
    int fake = (int)launch_env_count("FSDP_FAKE_NODES");
    if (fake && world % fake == 0) return world / fake;
    int per = (int)launch_env_count("SLURM_NTASKS_PER_NODE");
    if (per) return per;
    return world == 1 ? 1 : 0;
}

int run_mesh_check(const fsdp_value *runtime, sizes_host *h, fsdp_err *err) {
    mesh_spec sp;
    int R = 1, S = h->world;
    int rc = mesh_spec_read(runtime, &sp, err);
    if (!rc) rc = mesh_spec_resolve(&sp, h->world, h->ranks_per_node, &R, &S, err);
    if (rc || !sp.present) return rc;
    h->mesh_r = R;
    h->mesh_s = S;
    if (S) h->shard_world = S;
    return 0;
}

/* The same number of ranks on every node (shard: auto makes a shard group of one node). */
static int check_nodes_equal(fsdp_ctx *ctx, int *per, fsdp_err *err) {
    int64_t v[2] = {comm_local_size(ctx->comm), -(int64_t)comm_local_size(ctx->comm)};
    int rc = comm_allreduce(ctx->comm, v, 2, COMM_I64, COMM_MIN, err);
    if (rc) return rc;
    if (v[0] != -v[1])
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "runtime.mesh.shard: auto needs the same number of ranks on every node, but the nodes have "
                            "between %lld and %lld (give shard as a number)",
                            (long long)v[0], (long long)-v[1]);
    *per = (int)v[0];
    return 0;
}

int run_mesh_setup(fsdp_ctx *ctx, const fsdp_value *runtime, fsdp_err *err) {
    mesh_spec sp;
    int rc = mesh_spec_read(runtime, &sp, err);
    if (rc) return rc;
    int world = ctx->world, per = 1, R = 1, S = world;
    if (ctx->comm && sp.present && !sp.shard && (rc = check_nodes_equal(ctx, &per, err))) return rc;
    if (sp.present && (rc = mesh_spec_resolve(&sp, world, per, &R, &S, err))) return rc;
    /* a given mesh is kept in the context even when it is 1-D (the report names it) */
    if (ctx->mesh ? sp.present && ctx->mesh->R == R && ctx->mesh->S == S : !sp.present) return 0;
    fsdp_state *s = state_get(ctx);
    if (s && s->n && s->layout == STATE_SHARDED && s->world != S)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "runtime.mesh: the model in the context is sharded over %d ranks, and this recipe's mesh "
                            "(replicate %d x shard %d) shards over %d: save it (save-dcp) and load it in a run with "
                            "this mesh",
                            s->world, R, S, S);
    mesh *m = NULL;
    if (ctx->comm && sp.present && (rc = mesh_create(ctx->comm, R, S, &m, err))) return rc;
    mesh_free(ctx->mesh);
    ctx->mesh = m;
    if (m && R > 1)
        fsdp_log(ctx, FSDP_LOG_INFO, "mesh: replicate %d x shard %d (this rank: replica %d, shard %d; shard groups %s)",
                 R, S, m->replica, m->shard_rank,
                 comm_spans_nodes(m->shard) ? "span nodes" : "inside a node");
    return 0;
}

/* "host (ranks 0-3), host2 (ranks 4-7)": each run of consecutive ranks on one host. */
static void log_nodes(fsdp_ctx *ctx, char **hosts, int n) {
    char line[2048] = "";
    size_t off = 0;
    int r = 0;
    while (r < n && off < sizeof line) {
        int q = r;
        while (q + 1 < n && !strcmp(hosts[q + 1], hosts[r])) q++;
        const char *sep = r ? ", " : "";
        if (q > r) off += (size_t)snprintf(line + off, sizeof line - off, "%s%s (ranks %d-%d)", sep, hosts[r], r, q);
        else off += (size_t)snprintf(line + off, sizeof line - off, "%s%s (rank %d)", sep, hosts[r], r);
        r = q + 1;
    }
    int nodes = comm_nodes(ctx->comm);
    fsdp_log(ctx, FSDP_LOG_INFO, "%d ranks on %d node%s: %s", n, nodes, nodes > 1 ? "s" : "", line);
}

void run_mesh_hosts(fsdp_ctx *ctx, run_result *res) {
    char host[300];
    comm_host_name(ctx->comm, host, sizeof host);
    res->nodes = ctx->comm ? comm_nodes(ctx->comm) : 1;
    if (!ctx->comm || ctx->world == 1) {
        if ((res->hosts = calloc(1, sizeof *res->hosts)) && (res->hosts[0] = strdup(host))) res->n_hosts = 1;
        return;
    }
    void *all = NULL;
    size_t *sizes = NULL;
    fsdp_err e;
    if (comm_gather_bytes(ctx->comm, host, strlen(host) + 1, 0, &all, &sizes, &e)) {
        fsdp_log(ctx, FSDP_LOG_WARN, "the ranks' host names are not in the report: %s", e.msg);
        return;
    }
    if (ctx->rank == 0 && (res->hosts = calloc((size_t)ctx->world, sizeof *res->hosts))) {
        const char *p = all;
        for (int r = 0; r < ctx->world; r++) {
            res->hosts[r] = strdup(p);
            p += sizes[r];
        }
        res->n_hosts = ctx->world;
        log_nodes(ctx, res->hosts, ctx->world);
    }
    free(all);
    free(sizes);
}
