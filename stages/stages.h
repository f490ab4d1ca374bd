/* Shared declarations of the built-in stages (one file each in stages/). */
#ifndef FSDP_STAGES_STAGES_H
#define FSDP_STAGES_STAGES_H

#include "fsdp/stage.h"
#include "model/llama.h"
#include "model/llama_init.h"
#include "model/llama_params.h"
#include "runtime/comm.h"
#include "runtime/state.h"

/* The context's communicator (a world of 1 when none). */
comm *stage_comm(fsdp_ctx *ctx);
double stage_now(void);
/* The recipe's `model:` section as a finalized config. */
int stage_model_config(fsdp_ctx *ctx, llama_config *cfg, fsdp_err *err);
/* `with: seed` when given, else runtime.seed. */
uint64_t stage_seed(fsdp_ctx *ctx, const fsdp_value *with);
/* A new state holding every parameter of cfg (allocated per layout); fills the table. */
int stage_state_from_config(fsdp_ctx *ctx, const llama_config *cfg, state_layout layout, llama_params *table,
                            fsdp_state **out, fsdp_err *err);
/* Fills every local row with the model's init rule (counter-based: the same values for every
 * world size); dtype bf16 rounds the values to bf16 and records it for checkpoints. */
int stage_init_values(fsdp_state *s, const llama_params *table, uint64_t seed, fsdp_dtype dtype, fsdp_err *err);
/* init-meta / init-cpu: the model of the recipe, declared in `layout` and initialised per
 * `with: {seed, dtype}` (stage_init_params); *total is the parameter count. */
extern const fsdp_param_spec stage_init_params[];
int stage_init_model(fsdp_ctx *ctx, const fsdp_value *with, state_layout layout, llama_config *cfg, int64_t *total,
                     fsdp_err *err);

extern const fsdp_stage_desc stage_shard;
extern const fsdp_stage_desc stage_offload;
extern const fsdp_stage_desc stage_init_meta;
extern const fsdp_stage_desc stage_init_cpu;
extern const fsdp_stage_desc stage_train_steps;
extern const fsdp_stage_desc stage_save_dcp;
extern const fsdp_stage_desc stage_load_ckpt;
extern const fsdp_stage_desc stage_transform;
extern const fsdp_stage_desc stage_save_safetensors;
extern const fsdp_stage_desc stage_verify;
/* Synchronous DCP save of the state (used by save-dcp and train-steps' save_every). */
int stage_save_dcp_to(fsdp_ctx *ctx, fsdp_state *s, const char *path, int optimizer, int overwrite, fsdp_err *err);

#endif
