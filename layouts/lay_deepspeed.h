/* DeepSpeed ZeRO checkpoints (module prefix lay_ds_): a directory of torch.save files, read in fsdp-run's layout.
 *
 *   DIR/latest                                       the tag ("global_step3")
 *   DIR/<tag>/mp_rank_00_model_states.pt             ZeRO-1/2: the module's weights, param_shapes, global_steps
 *   DIR/<tag>/zero_pp_rank_0_mp_rank_00_model_states.pt   ZeRO-3: the same with [0] placeholders for the weights
 *   DIR/<tag>/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt   one per data-parallel rank R: the fp32 master
 *                                                    weights and AdamW's moments of the rank's flat partition
 *
 * The parameters are param_shapes' (Hugging Face names, q/k rows rotate-half), in its order. Their fp32 values and
 * moments are elements of the ranks' flat partitions, as zero_to_fp32.py merges them:
 *   ZeRO-1/2  one flat vector per param group g: the parameters one after another (param_alignment_paddings[g]
 *             after each), cut into N partitions of P elements; rank R's single_partition_of_fp32_groups[g] holds
 *             flat[R*P, R*P + P - group_paddings[g]), its base_optimizer_state.state[g].exp_avg[_sq] all P.
 *   ZeRO-3    each parameter of n elements cut into N partitions of ceil(n/N) (the last padded); rank R's flat
 *             partition holds its partition of every parameter one after another, split into sub groups
 *             fp32_flat_groups[k] (optimizer_state_dict.state[k].exp_avg[_sq] the same).
 * Each fsdp-run tensor is a view of those elements (ckpt/reader_view.h pieces): nothing is gathered in memory, a
 * rank reads only the elements of its rows. step: the AdamW step of the param's group; options: its param group's;
 * train_state.step: global_steps. Frozen and shared (tied) parameters are refused, as are MoE experts. */
#ifndef FSDP_LAYOUTS_LAY_DEEPSPEED_H
#define FSDP_LAYOUTS_LAY_DEEPSPEED_H

#include <stdint.h>

#include "ckpt/reader.h"
#include "fsdp/error.h"
#include "layouts/layout.h"

/* 1 when path is a DeepSpeed checkpoint: a directory with `latest` naming a tag directory, or a tag directory,
 * holding a *model_states.pt and *_optim_states.pt files. */
int lay_ds_is(const char *path);
/* Its files as one reader, as they are ("ms." the model states, "r<R>." rank R's optimizer state): what inspect
 * shows. */
int lay_ds_open_files(const char *path, ckpt_reader **out, int *ranks, fsdp_err *err);
/* The checkpoint at path in fsdp-run's layout (f: the head counts for the q/k rows). */
int lay_ds_open(const char *path, const lay_facts *f, ckpt_reader **out, fsdp_err *err);

/* What lay_ds_write writes: ZeRO stage 1, 2 or 3, for `world` data-parallel ranks (DeepSpeed loads a ZeRO checkpoint
 * on the world size it was written for only), its clip_grad (which replaces the engine's gradient_clipping on load:
 * the job's own; 0 none), the tag (NULL: global_step<N>). *written, *bytes (may be NULL): tensors and bytes written. */
typedef struct lay_ds_wopts {
    int stage, world;
    double clip_grad;       /* < 0: not given (ZeRO-3 keeps none) */
    int64_t sub_group_size; /* ZeRO-3's zero_optimization.sub_group_size (DeepSpeed's default 1e9) */
    const char *tag;
    int overwrite;
    size_t *written;
    uint64_t *bytes;
} lay_ds_wopts;

/* The settings "NAME=VALUE" (ckpt convert --option, save-dcp options:) into o (o->stage set): gradient_clipping
 * (required for ZeRO-1/2) and ZeRO-3's sub_group_size (default 1e9); any other name is FSDP_E_INVALID. */
int lay_ds_wopts_options(const char *const *opt, size_t n_opt, lay_ds_wopts *o, fsdp_err *err);
/* 1, 2 or 3 for the layout names deepspeed-zero1|2|3, else 0. */
int lay_ds_stage_of(const char *name);
/* fsdp-run's checkpoint canon (its layout; f: the head counts for the q/k rows) as a DeepSpeed ZeRO checkpoint of a
 * transformers Llama trained in fp32 in directory dir: dir/<tag>/mp_rank_00_model_states.pt (the module's weights,
 * param_shapes, global_steps; ZeRO-3: one zero_pp_rank_<R>_mp_rank_00_model_states.pt per rank, [0] placeholders
 * for the weights), one dir/<tag>/zero_pp_rank_<R>_mp_rank_00_optim_states.pt per rank (its flat fp32 partition and
 * AdamW moments, as DeepSpeed partitions them), dir/latest. The tag directory is
 * staged and renamed; an existing one is an error unless o->overwrite. Frozen parameters (no moments) are refused. */
int lay_ds_write(ckpt_reader *canon, const lay_facts *f, const char *dir, const lay_ds_wopts *o, fsdp_err *err);

#endif
