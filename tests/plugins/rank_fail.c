/* Test plugin: stage `rank-fail` fails on one rank while every other rank waits in a
 * collective, the situation that must end the job (not hang it). Built in-tree, so it may
 * use the runtime's internal headers. */
#include "fsdp/stage.h"
#include "runtime/comm.h"
#include "runtime/ctx_impl.h"

static const fsdp_param_spec PARAMS[] = {{"rank", FSDP_T_INT, 1, NULL, NULL, "the rank that fails"},
                                         {NULL, 0, 0, NULL, NULL, NULL}};

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    if (fsdp_ctx_rank(ctx) == (int)fsdp_arg_int(with, "rank", -1))
        return fsdp_err_set(err, FSDP_E_IO, "rank-fail: rank %d cannot open /no/such/file", fsdp_ctx_rank(ctx));
    if (ctx->comm) return comm_barrier(ctx->comm, err); /* blocks: the failing rank never arrives */
    return 0;
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_DESC_INIT, "rank-fail", "fail on one rank", PARAMS, NULL, NULL, run,
                                     NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
