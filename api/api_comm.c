/* The plugin API's collectives over host buffers (include/fsdp/collectives.h): the run's world
 * communicator (runtime/comm.h), which MPI drives. */
#include "fsdp/collectives.h"

#include <stdlib.h>
#include <string.h>

#include "api/api_util.h"
#include "runtime/err_local.h"

/* The world for `call`, or an error (outside a stage, out of memory). */
static comm *world_for(fsdp_ctx *ctx, const char *call, fsdp_err *err) {
    comm *w = ctx ? ctx_world_comm(ctx) : NULL;
    if (!w) fsdp_err_set(err, FSDP_E_INVALID, "%s: no context or communicator", call);
    return w;
}

int fsdp_barrier(fsdp_ctx *ctx, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    comm *w = world_for(ctx, "fsdp_barrier", err);
    return w ? comm_barrier(w, err) : err->code;
}

int fsdp_broadcast(fsdp_ctx *ctx, void *buf, size_t bytes, int root, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_broadcast";
    comm *w = world_for(ctx, call, err);
    if (!w) return err->code;
    if (root < 0 || root >= comm_size(w))
        return api_fail(ctx, err, FSDP_E_INVALID, call, "root %d outside [0, %d)", root, comm_size(w));
    if (!buf && bytes) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL buffer of %zu bytes", bytes);
    int rc = comm_bcast(w, buf, bytes, root, err);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

int fsdp_allreduce(fsdp_ctx *ctx, void *buf, size_t count, fsdp_dtype dt, fsdp_reduce_op op, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_allreduce";
    comm *w = world_for(ctx, call, err);
    if (!w) return err->code;
    if (!buf && count) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL buffer of %zu elements", count);
    if ((unsigned)op > FSDP_MIN) return api_fail(ctx, err, FSDP_E_INVALID, call, "unknown operation %d", (int)op);
    comm_op o = op == FSDP_SUM ? COMM_SUM : op == FSDP_MAX ? COMM_MAX : COMM_MIN;
    int rc;
    if (dt == FSDP_DT_F32) rc = comm_allreduce(w, buf, count, COMM_F32, o, err);
    else if (dt == FSDP_DT_F64) rc = comm_allreduce(w, buf, count, COMM_F64, o, err);
    else if (dt == FSDP_DT_I64) rc = comm_allreduce(w, buf, count, COMM_I64, o, err);
    else if (dt == FSDP_DT_I32) {
        int64_t *wide = malloc((count ? count : 1) * sizeof *wide);
        if (!wide) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
        for (size_t i = 0; i < count; i++) wide[i] = ((const int32_t *)buf)[i];
        rc = comm_allreduce(w, wide, count, COMM_I64, o, err);
        for (size_t i = 0; !rc && i < count; i++) {
            if (wide[i] > INT32_MAX || wide[i] < INT32_MIN) {
                rc = api_fail(ctx, err, FSDP_E_INVALID, call, "element %zu: the sum %lld does not fit int32", i,
                              (long long)wide[i]);
                break;
            }
            ((int32_t *)buf)[i] = (int32_t)wide[i];
        }
        free(wide);
        return rc;
    } else {
        return api_fail(ctx, err, FSDP_E_INVALID, call, "dtype %s (use f32, f64, i32 or i64)",
                        fsdp_dtype_name(dt) ? fsdp_dtype_name(dt) : "(invalid)");
    }
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

int fsdp_allgather(fsdp_ctx *ctx, const void *send, size_t bytes, void *recv, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_allgather";
    comm *w = world_for(ctx, call, err);
    if (!w) return err->code;
    if (bytes && (!send || !recv)) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL send or receive buffer");
    int n = comm_size(w);
    size_t *sizes = malloc((size_t)n * sizeof *sizes);
    if (!sizes) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    for (int r = 0; r < n; r++) sizes[r] = bytes;
    int rc = comm_allgatherv(w, send, recv, sizes, err);
    free(sizes);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}
