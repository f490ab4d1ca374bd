/* Test plugin: registers a stage whose name is already taken by the example plugin. */
#include "fsdp/stage.h"

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)ctx, (void)with, (void)err;
    return 0;
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_DESC_INIT, "echo", "duplicate", NULL, NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
