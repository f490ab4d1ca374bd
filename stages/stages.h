/* Shared declarations of the built-in stages (one file each in stages/). */
#ifndef FSDP_STAGES_STAGES_H
#define FSDP_STAGES_STAGES_H

#include "ckpt/ckpt_pipe.h"
#include "ckpt/reader.h"
#include "fsdp/stage.h"
#include "decoder/decoder_config.h"
#include "decoder/decoder_init.h"
#include "decoder/decoder_params.h"
#include "decoder/decoder_table.h"
#include "model/model_table.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/state.h"
#include "runtime/state_defer.h"

/* The context's communicator (a world of 1 when none). */
comm *stage_comm(fsdp_ctx *ctx);
/* HSDP (runtime.mesh, runtime/mesh.h): the group the state's parameters are sharded over (the world
 * without a mesh) and the one they are replicated over (NULL without replicas). Stages that move
 * rows of the state use the shard group; agreement, saving and the data use the world. */
comm *stage_shard_comm(fsdp_ctx *ctx);
comm *stage_replicate_comm(fsdp_ctx *ctx);
double stage_now(void);
/* Before a checkpoint save to path: rank 0 removes the stale temporaries of earlier interrupted
 * saves there (ckpt/ckpt_stale.h) and logs each removal as a warning. */
void stage_sweep_stale(fsdp_ctx *ctx, const char *path);
/* The recipe's `model:` section as a finalized config. */
int stage_model_config(fsdp_ctx *ctx, decoder_config *cfg, fsdp_err *err);
/* `with: seed` when given, else runtime.seed. */
uint64_t stage_seed(fsdp_ctx *ctx, const fsdp_value *with);
/* The recipe's `model:` section as a table (model/mt_spec.h): the built-in arch form through
 * stage_model_config (the decoder family's config) and decoder_table_build, the table forms through
 * mt_spec_build. */
int stage_model_table(fsdp_ctx *ctx, mt_table *out, fsdp_err *err);
/* A new state (allocated per layout) with every parameter of t, each with its declared dtype and no
 * value yet (state_param.no_value); t moves into the state (s->model) and is left empty, also on
 * failure. Its trainer config (decoder_state_set_config) is set when t's trainer is the decoder family's. */
int stage_state_from_table(fsdp_ctx *ctx, mt_table *t, state_layout layout, fsdp_state **out, fsdp_err *err);
/* Fills every local row with its parameter's init rule (s->model; counter-based: the same values for
 * every world size), in its dtype (rounded to bf16 / f16 precision), or in `over` for every parameter
 * when not FSDP_DT_INVALID. A parameter whose rule is none keeps NaN rows and no_value. defer (a sharded
 * host state): nothing is drawn now, each parameter's rows are deferred to its rule (model/init_defer.h). */
int stage_init_values(fsdp_state *s, uint64_t seed, fsdp_dtype over, int defer, fsdp_err *err);
/* init-meta / init-cpu: the model of the recipe, declared in `layout` and initialised per
 * `with: {seed, dtype}` (stage_init_params). A sharded layout is materialised on the GPU when the
 * recipe runs there (stage_on_gpu), a full one on the host. *out: the new state (also on failure
 * when it was created). */
extern const fsdp_param_spec stage_init_params[];
int stage_init_model(fsdp_ctx *ctx, const fsdp_value *with, state_layout layout, fsdp_state **out, fsdp_err *err);

/* ---- the device (stages/device.c) --------------------------------------------------------------
 * runtime.device of the current recipe: cpu, cuda, or auto = cuda when this build has CUDA and every
 * rank has a GPU of its own (ranks sharing one GPU, as with more ranks than GPUs on a node, run on
 * the CPU: NCCL needs a GPU per rank). The probe is collective: every rank calls these at the same
 * stage (stages run in the same order on every rank). */
/* *on_gpu = 1 when the current recipe's stages run on the GPU. FSDP_E_DEVICE naming
 * runtime.device when it is cuda and some rank has no usable GPU. Logs the choice of auto once. */
int stage_on_gpu(fsdp_ctx *ctx, int *on_gpu, fsdp_err *err);
/* The run's device context, created on first use (collective) on the GPU of the rank's local rank
 * (LOCAL_RANK & co. in a world of 1); with several ranks the NCCL communicator of stage_comm(ctx)
 * (comm_dev_init) is set up with it. Owned by the context and destroyed after every other
 * attachment (the state). */
int stage_device(fsdp_ctx *ctx, dev_ctx **out, fsdp_err *err);
/* The device context and the NCCL communicator of stage_comm(ctx) at any world size, 1 included
 * (for code that runs the comm_dev_* collectives: the GPU training step). Collective; a no-op once
 * set up. */
int stage_device_nccl(fsdp_ctx *ctx, fsdp_err *err);
/* Puts the state where the current recipe runs: on the GPU (state_to_device) when stage_on_gpu and
 * the layout is STATE_SHARDED (full rank-0 parameters stay in host memory until `shard`), otherwise
 * in host memory. on_gpu may be NULL. */
int stage_place_state(fsdp_ctx *ctx, fsdp_state *s, int *on_gpu, fsdp_err *err);
/* stage_init_values on the GPU: every parameter's data becomes a device array holding its rows,
 * generated there by kcu_init_fill (the host's RNG code, compiled for the device; the same bits), then
 * rounded to bf16 on the device (f16: on the host, through a download and an upload); host rows are
 * dropped without being copied. Parameters without an init rule get NaN rows. A fixed table
 * (sincos_2d) is computed on the host, rounded to its dtype there and uploaded: the host's bits, not
 * the device's sin / cos. */
int stage_init_values_dev(fsdp_state *s, dev_ctx *d, uint64_t seed, fsdp_dtype over, fsdp_err *err);

/* Pinned staging of checkpoint transfers on the GPU (stages/ckpt_sink.c): a ckpt_sink over
 * STAGE_CKPT_SINK_BUFS pinned buffers of STAGE_CKPT_SINK_BYTES, an event each, on the COPY stream. */
#define STAGE_CKPT_SINK_BUFS 3
#define STAGE_CKPT_SINK_BYTES ((size_t)16 << 20)
typedef struct stage_ckpt_sink {
    ckpt_sink sink;
    struct dev_ring *ring;
} stage_ckpt_sink;
int stage_ckpt_sink_create(dev_ctx *d, stage_ckpt_sink *out, fsdp_err *err);
void stage_ckpt_sink_free(stage_ckpt_sink *s);

extern const fsdp_stage_desc stage_shard;
extern const fsdp_stage_desc stage_offload;
extern const fsdp_stage_desc stage_init_meta;
extern const fsdp_stage_desc stage_init_cpu;
extern const fsdp_stage_desc stage_train_steps;
extern const fsdp_stage_desc stage_eval;
extern const fsdp_stage_desc stage_save_dcp;
extern const fsdp_stage_desc stage_load_ckpt;
extern const fsdp_stage_desc stage_transform;
extern const fsdp_stage_desc stage_save_safetensors;
extern const fsdp_stage_desc stage_verify;
extern const fsdp_stage_desc stage_reshard_dcp;
/* Synchronous DCP save of the state (used by save-dcp and train-steps' save_every). */
int stage_save_dcp_to(fsdp_ctx *ctx, fsdp_state *s, const char *path, int optimizer, int overwrite, fsdp_err *err);
/* A periodic save of train-steps: base/step-<train_step>, async or not (async: committed by
 * ctx_poll_finishers, one in flight); keep_last > 0 removes older step-<N> directories once it is
 * committed (ckpt/ckpt_steps.h). */
typedef struct stage_save_policy {
    int async, overwrite;
    int64_t keep_last;
} stage_save_policy;
int stage_save_dcp_step(fsdp_ctx *ctx, fsdp_state *s, const char *base, const stage_save_policy *p, fsdp_err *err);
/* Waits for the run's async save in flight, if any, and commits it. */
int stage_wait_saves(fsdp_ctx *ctx, fsdp_err *err);

/* save-dcp's `layout:` (stages/save_layout.c): its parameters checked (a known layout, its options, nothing it
 * does not go with); the staged save in fsdp-run's layout written at path in the layout, staged removed. */
int stage_save_layout_check(const fsdp_value *with, fsdp_err *err);
int stage_save_layout(fsdp_ctx *ctx, const fsdp_value *with, const char *staged, const char *path, fsdp_err *err);
/* load-ckpt's `layout:` (stages/load_layout.c): the value checked (auto, hf or a layout's name); the
 * checkpoint *r seen in fsdp-run's layout when it is another trainer's (auto: detected, the layout named in
 * the log; two candidates an error listing them): *r becomes a view over it (the source stays open: close
 * the view, then the source). hf and fsdp-run's own leave *r as it is. */
int stage_layout_check(const fsdp_value *v, fsdp_err *err);
int stage_layout_view(fsdp_ctx *ctx, const fsdp_state *s, const char *layout, ckpt_reader **r, fsdp_err *err);
/* A checkpoint of several files at path opened: a DeepSpeed ZeRO directory in fsdp-run's layout
 * (layouts/lay_deepspeed.h), a layout's container of DCP directories (accelerate's) as one; 0 and *r, an error, or 1
 * when path is neither. */
int stage_open_deepspeed(fsdp_ctx *ctx, const fsdp_state *s, const char *path, ckpt_reader **r, fsdp_err *err);

#endif
