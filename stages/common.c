/* Helpers shared by the built-in stages. */
#include "runtime/ctx_impl.h"
#include "stages/stages.h"

comm *stage_comm(fsdp_ctx *ctx) {
    if (!ctx->comm) {
        /* in-process runs (tests) without a communicator get a world of 1 that lives with the context */
        comm *c = fsdp_ctx_attached(ctx, "fsdp.comm.single");
        if (!c) {
            fsdp_err err;
            if (comm_create_single(&c, &err)) return NULL;
            if (fsdp_ctx_attach(ctx, "fsdp.comm.single", c, (void (*)(void *))comm_destroy)) {
                comm_destroy(c);
                return NULL;
            }
        }
        return c;
    }
    return ctx->comm;
}

double stage_now(void) { return ctx_now(); }
