/* Test plugin: `api-null-calls` calls every function of the plugin headers with NULL pointers, a NULL err and zero
 * or out-of-range numbers (tests/api_null_calls.inc, generated from the headers of include/fsdp by
 * tools/gen/gen_api_null_calls.py), inside a stage's run with a real context, on every rank alike: none may crash,
 * hang or write through a NULL (issue 39: "never a crash on a NULL"). The stage then succeeds. */
#include <stddef.h>
#include <stdint.h>

#include "fsdp/callbacks.h"
#include "fsdp/ckpt.h"
#include "fsdp/collectives.h"
#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"
#include "fsdp/tensor.h"
#include "fsdp/value.h"

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    (void)with, (void)err;
#define CALL(name, expr) expr;
#define SKIPPED(name, why)
#include "../api_null_calls.inc"
#undef CALL
#undef SKIPPED
    fsdp_log(ctx, FSDP_LOG_INFO, "api-null-calls: every call returned");
    return 0;
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_DESC_INIT, "api-null-calls",
                                     "every plugin-API call with NULLs and out-of-range numbers", NULL, NULL, NULL, run,
                                     NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
