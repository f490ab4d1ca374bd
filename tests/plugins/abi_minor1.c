/* Test plugin: built against stage ABI 1.1 (the plugin API's calls, before 1.2's hooks and trainable
 * flags): abi_version says 1.1. It must still load and its 1.1 calls work. */
#include <stdio.h>

#include "fsdp/collectives.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)with;
    double n = (double)fsdp_param_count(ctx);
    int rc = fsdp_allreduce(ctx, &n, 1, FSDP_DT_F64, FSDP_SUM, err);
    if (!rc) fsdp_log(ctx, FSDP_LOG_INFO, "abi-1.1 stage ran: %.0f parameters over the ranks", n);
    return rc;
}

static const fsdp_stage_desc DESC = {1u | (1u << 16), sizeof(fsdp_stage_desc), "abi-one-one", "a stage of stage ABI 1.1",
                                     NULL, NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
