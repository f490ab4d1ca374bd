/* The product's built-in stages, registered through the same ABI as plugins. Each stage
 * lives in its own file in stages/ and exports its descriptor. */
#include "pipeline/registry.h"
#include "stages/stages.h"

static const fsdp_stage_desc *const BUILTINS[] = {
    &stage_init_meta,
    &stage_init_cpu,
    &stage_transform,
    &stage_load_ckpt,
    &stage_shard,
    &stage_train_steps,
    &stage_eval,
    &stage_offload,
    &stage_save_dcp,
    &stage_save_safetensors,
    &stage_reshard_dcp,
    &stage_verify,
    NULL
};

int registry_add_builtins(fsdp_registry *reg, fsdp_err *err) {
    for (const fsdp_stage_desc *const *d = BUILTINS; *d; d++) {
        int rc = fsdp_registry_add(reg, *d, err);
        if (rc) return rc;
    }
    return 0;
}
