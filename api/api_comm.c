/* The plugin API's collectives over host buffers (include/fsdp/collectives.h): every rank first
 * agrees on the call and its arguments (api/api_agree.h), then the payload moves on the plugin API's
 * own communicator (ctx_api_comm: the world's ranks, a channel the trainer's collectives never use). */
#include "fsdp/collectives.h"

#include <stdlib.h>
#include <string.h>

#include "api/api_agree.h"
#include "api/api_util.h"
#include "runtime/err_local.h"

/* The plugin API's communicator for `call`, or an error (no context, out of memory). */
static comm *world_for(fsdp_ctx *ctx, const char *call, fsdp_err *err) {
    comm *w = ctx ? ctx_api_comm(ctx) : NULL;
    if (!w) fsdp_err_set(err, FSDP_E_INVALID, "%s: no context or communicator", call);
    return w;
}

int fsdp_barrier(fsdp_ctx *ctx, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    comm *w = world_for(ctx, "fsdp_barrier", err);
    if (!w) return err->code;
    api_call a;
    api_call_init(&a, "fsdp_barrier");
    /* the agreement is the barrier: every rank's record came */
    return api_agree(ctx, &a, -1, NULL, err);
}

int fsdp_broadcast(fsdp_ctx *ctx, void *buf, size_t bytes, int root, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_broadcast";
    comm *w = world_for(ctx, call, err);
    if (!w) return err->code;
    api_call a;
    api_call_init(&a, call);
    a.has = API_HAS_BYTES | API_HAS_ROOT, a.count = (int64_t)bytes, a.root = root;
    if (!buf && bytes) api_call_bad(&a, "a NULL buffer");
    if (api_agree(ctx, &a, -1, NULL, err)) return err->code;
    if (root < 0 || root >= comm_size(w))
        return api_fail(ctx, err, FSDP_E_INVALID, call, "root %d outside [0, %d)", root, comm_size(w));
    if (a.bad[0]) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL buffer of %zu bytes", bytes);
    int rc = comm_bcast(w, buf, bytes, root, err);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

/* dt's elements as the communicator's, or -1 (i32 is summed as i64). */
static int comm_type_of(fsdp_dtype dt) {
    return dt == FSDP_DT_F32 ? COMM_F32 : dt == FSDP_DT_F64 ? COMM_F64 : dt == FSDP_DT_I64 ? COMM_I64 : -1;
}

/* An all-reduce of int32 elements through int64 (no overflow below 2^63); a sum that does not fit
 * int32 is an error (the same on every rank). */
static int allreduce_i32(fsdp_ctx *ctx, comm *w, int32_t *buf, size_t count, comm_op o, fsdp_err *err) {
    const char *call = "fsdp_allreduce";
    int64_t *wide = malloc((count ? count : 1) * sizeof *wide);
    if (!wide) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    for (size_t i = 0; i < count; i++) wide[i] = buf[i];
    int rc = comm_allreduce(w, wide, count, COMM_I64, o, err);
    if (rc) rc = api_fail(ctx, err, rc, call, "%s", err->msg);
    for (size_t i = 0; !rc && i < count; i++) {
        if (wide[i] > INT32_MAX || wide[i] < INT32_MIN) {
            rc = api_fail(ctx, err, FSDP_E_INVALID, call, "element %zu: the sum %lld does not fit int32", i,
                          (long long)wide[i]);
            break;
        }
        buf[i] = (int32_t)wide[i];
    }
    free(wide);
    return rc;
}

int fsdp_allreduce(fsdp_ctx *ctx, void *buf, size_t count, fsdp_dtype dt, fsdp_reduce_op op, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_allreduce";
    comm *w = world_for(ctx, call, err);
    if (!w) return err->code;
    api_call a;
    api_call_init(&a, call);
    a.has = API_HAS_ELEMS | API_HAS_DTYPE | API_HAS_OP, a.count = (int64_t)count, a.dtype = (int32_t)dt, a.op = (int32_t)op;
    if (!buf && count) api_call_bad(&a, "a NULL buffer");
    if (api_agree(ctx, &a, -1, NULL, err)) return err->code;
    if (a.bad[0]) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL buffer of %zu elements", count);
    if ((unsigned)op > FSDP_MIN) return api_fail(ctx, err, FSDP_E_INVALID, call, "unknown operation %d", (int)op);
    comm_op o = op == FSDP_SUM ? COMM_SUM : op == FSDP_MAX ? COMM_MAX : COMM_MIN;
    if (dt == FSDP_DT_I32) return allreduce_i32(ctx, w, buf, count, o, err);
    int t = comm_type_of(dt);
    if (t < 0)
        return api_fail(ctx, err, FSDP_E_INVALID, call, "dtype %s (use f32, f64, i32 or i64)",
                        fsdp_dtype_name(dt) ? fsdp_dtype_name(dt) : "(invalid)");
    int rc = comm_allreduce(w, buf, count, (comm_dtype)t, o, err);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

int fsdp_allgather(fsdp_ctx *ctx, const void *send, size_t bytes, void *recv, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_allgather";
    comm *w = world_for(ctx, call, err);
    if (!w) return err->code;
    api_call a;
    api_call_init(&a, call);
    a.has = API_HAS_BYTES, a.count = (int64_t)bytes;
    if (bytes && (!send || !recv)) api_call_bad(&a, "a NULL send or receive buffer");
    if (api_agree(ctx, &a, -1, NULL, err)) return err->code;
    if (a.bad[0]) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL send or receive buffer");
    int n = comm_size(w);
    size_t *sizes = malloc((size_t)n * sizeof *sizes);
    if (!sizes) return api_fail(ctx, err, FSDP_E_NOMEM, call, "out of memory");
    for (int r = 0; r < n; r++) sizes[r] = bytes;
    int rc = comm_allgatherv(w, send, recv, sizes, err);
    free(sizes);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}
