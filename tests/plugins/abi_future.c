/* Test plugin: built against a newer minor of the stage ABI than this fsdp-run's (it could call what
 * this fsdp-run lacks): refused with a clear error. */
#include "fsdp/stage.h"

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)ctx, (void)with, (void)err;
    return 0;
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_ABI_MAJOR | ((FSDP_STAGE_ABI_MINOR + 1) << 16), sizeof(fsdp_stage_desc),
                                     "abi-future", "x", NULL, NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
