/* Test plugin: built against stage ABI 1.0 (before the plugin API's calls): abi_version is the plain
 * major, as include/fsdp/stage.h of 1.0 wrote it. It must still load and run. */
#include <stdio.h>

#include "fsdp/stage.h"

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)with, (void)err;
    fsdp_log(ctx, FSDP_LOG_INFO, "abi-1.0 stage ran");
    return 0;
}

static const fsdp_stage_desc DESC = {1u, sizeof(fsdp_stage_desc), "abi-one-zero", "a stage of stage ABI 1.0", NULL, NULL,
                                     NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
