/* accelerate 1.15.0 (Accelerator + FullyShardedDataParallelPlugin(fsdp_version=2,
 * state_dict_type=SHARDED_STATE_DICT), save_state / load_state) of a transformers model: a directory with two DCP
 * checkpoints,
 *   pytorch_model_fsdp_0/   model.<HF name>          the weights (q/k rows rotate-half)
 *   optimizer_0/            optimizer.state.<HF name>.step|exp_avg|exp_avg_sq, optimizer.param_groups.<i>.<option>
 *                           (torch's nested groups by index, their params lists of names)
 * and scheduler.bin, torch.save(scheduler.state_dict()) of its first scheduler: fsdp-run's lr_scheduler.* (torch's
 * LambdaLR state, as torchtitan's), read and written. random_states_<r>.pkl (Python, numpy and torch RNG states;
 * load_state goes on without them) are neither read nor written. */
#include "layouts/lay_rows.h"

static const char *const marks[] = {"model.model.layers.*.self_attn.q_proj.weight"};
static const char *const parts[] = {"pytorch_model_fsdp_0", "optimizer_0"};
static const char *const part_keys[] = {"model.", "optimizer."};

const lay_layout lay_accelerate_115 = {
    .name = "accelerate-1.15",
    .system = "accelerate 1.15.0 (save_state, FSDP2 SHARDED_STATE_DICT) of a transformers Llama",
    .covers = "weights, optimizer, lr scheduler (scheduler.bin; its RNG states are neither read nor written)",
    .model = "model.",
    .optim = "optimizer.",
    .rope = LAY_ROPE_HALF,
    .names = lay_hf_llama_names,
    .n_names = LAY_HF_LLAMA_N_NAMES,
    .marks = marks,
    .n_marks = LAY_N(marks),
    .groups = LAY_GROUPS_INDEXED,
    .parts = parts,
    .part_keys = part_keys,
    .n_parts = LAY_N(parts),
    .values_file = "scheduler.bin",
    .values_prefix = "lr_scheduler.",
};
