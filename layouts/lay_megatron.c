/* Megatron-FSDP 0.6.1 (megatron_fsdp.fully_shard_model / fully_shard_optimizer with torch AdamW, saved by
 * torch DCP as its README shows: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}) of a
 * transformers model: one DCP directory of
 *   model.module.<HF name>                        the weights (q/k rows rotate-half)
 *   optimizer.state.<id>.step|exp_avg|exp_avg_sq  torch's plain optimizer state, by parameter id in the model's
 *                                                 named_parameters() order
 *   optimizer.param_groups.<i>.<option>, ...params  the groups by index, their params lists of ids
 * (Megatron-LM's own --ckpt-format fsdp_dtensor, with param_to_group_meta, needs megatron-core: not this row.) */
#include "layouts/lay_rows.h"

static const char *const no_options[] = {"initial_lr", NULL}; /* torch AdamW, no scheduler */
static const char *const marks[] = {"model.module.model.layers.*.self_attn.q_proj.weight"};

const lay_layout lay_megatron_fsdp_06 = {
    .name = "megatron-fsdp-0.6",
    .system = "Megatron-FSDP 0.6.1 (fully_shard_model + torch AdamW, torch DCP) of a transformers Llama",
    .covers = "weights, optimizer",
    .model = "model.module.",
    .optim = "optimizer.",
    .rope = LAY_ROPE_HALF,
    .names = lay_hf_llama_names,
    .n_names = LAY_HF_LLAMA_N_NAMES,
    .marks = marks,
    .n_marks = LAY_N(marks),
    .groups = LAY_GROUPS_INDEXED,
    .ids = LAY_IDS_MODULE_ORDER,
    .no_options = no_options,
};
