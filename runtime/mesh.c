/* The device mesh (runtime/mesh.h): reading runtime.mesh and splitting the world into its groups. */
#include "runtime/mesh.h"

#include <stdlib.h>
#include <string.h>

/* One of the mesh's sizes: a positive integer or `auto` (0); absent = auto. */
static int read_size(const fsdp_value *m, const char *key, int *out, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(m, key);
    *out = 0;
    if (!v || fsdp_value_type(v) == FSDP_V_NULL) return 0;
    const char *t = fsdp_value_text(v);
    if (t && !strcmp(t, "auto")) return 0;
    int64_t n;
    if (fsdp_value_type(v) != FSDP_V_SCALAR || fsdp_value_int(v, &n) || n < 1 || n > 1 << 20)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "runtime.mesh.%s: expected a positive number of ranks or auto, got %s",
                           key, t ? t : "a list or map");
    *out = (int)n;
    return 0;
}

int mesh_spec_read(const fsdp_value *runtime, mesh_spec *sp, fsdp_err *err) {
    memset(sp, 0, sizeof *sp);
    const fsdp_value *m = fsdp_value_get(runtime, "mesh");
    if (!m || fsdp_value_type(m) == FSDP_V_NULL) return 0;
    sp->present = 1;
    sp->node = m;
    if (fsdp_value_type(m) != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, m,
                           "runtime.mesh: expected a map {replicate: R, shard: S} (each a number of ranks or auto)");
    for (size_t i = 0; i < fsdp_value_size(m); i++) {
        const char *k = fsdp_value_key(m, i);
        if (strcmp(k, "replicate") && strcmp(k, "shard"))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(m, i),
                               "runtime.mesh: unknown key '%s' (the mesh has replicate and shard)", k);
    }
    int rc = read_size(m, "replicate", &sp->replicate, err);
    return rc ? rc : read_size(m, "shard", &sp->shard, err);
}

int mesh_spec_resolve(const mesh_spec *sp, int world, int ranks_per_node, int *R, int *S, fsdp_err *err) {
    *R = 1;
    *S = world;
    if (!sp->present) return 0;
    const fsdp_value *at = sp->node;
    int s = sp->shard, r = sp->replicate;
    if (!s && ranks_per_node == 1 && world > 1)
        return fsdp_err_at(err, FSDP_E_INVALID, at,
                           "runtime.mesh.shard: auto finds 1 rank per node on %d ranks: every parameter would be "
                           "replicated whole on every rank (start one rank per GPU, e.g. srun --ntasks-per-node=8, or "
                           "set shard to a number)",
                           world);
    if (!s && r) {
        if (world % r)
            return fsdp_err_at(err, FSDP_E_INVALID, at, "runtime.mesh.replicate %d does not divide the world of %d ranks",
                               r, world);
        s = world / r;
    }
    if (!s) s = ranks_per_node; /* 0 when not known yet */
    if (!s) {
        *R = 0, *S = 0;
        return 0;
    }
    if (world % s)
        return fsdp_err_at(err, FSDP_E_INVALID, at, "runtime.mesh.shard %d%s does not divide the world of %d ranks", s,
                           sp->shard ? "" : " (auto: the ranks of one node)", world);
    if (!r) r = world / s;
    if ((long)r * s != world)
        return fsdp_err_at(err, FSDP_E_INVALID, at,
                           "runtime.mesh: replicate %d x shard %d = %ld ranks, but the world has %d ranks", r, s,
                           (long)r * s, world);
    *R = r;
    *S = s;
    return 0;
}

int mesh_create(comm *world, int R, int S, mesh **out, fsdp_err *err) {
    *out = NULL;
    int n = comm_size(world), w = comm_rank(world);
    if (R < 1 || S < 1 || R * S != n)
        return fsdp_err_set(err, FSDP_E_INVALID, "mesh: replicate %d x shard %d is not the world of %d ranks", R, S, n);
    mesh *m = calloc(1, sizeof *m);
    if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    m->R = R;
    m->S = S;
    m->replica = w / S;
    m->shard_rank = w % S;
    m->world = world;
    int rc = 0;
    if (R == 1) {
        m->shard = world;
    } else {
        rc = comm_split(world, m->replica, m->shard_rank, &m->shard, err);
        m->owns_shard = !rc;
        if (!rc) rc = comm_split(world, m->shard_rank, m->replica, &m->replicate, err);
    }
    if (rc) {
        mesh_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void mesh_free(mesh *m) {
    if (!m) return;
    comm_destroy(m->replicate);
    if (m->owns_shard) comm_destroy(m->shard);
    free(m);
}
