/* torchtitan's layouts. 0.2 (<= 0.2.2) is fsdp-run's own (layouts/layout.h): every rule the identity.
 * 0.3.0 keeps the same checkpoint keys except the attention's and the head's: its Llama3Model fuses q, k
 * and v into one parameter `layers.{i}.attention.qkv_linear.wqkv.weight` of rows
 * [n_kv_heads, heads_per_kv + 2, head_dim] (per kv head j: its q heads, then k head j, then v head j),
 * which its state_dict hooks show split as qkv_linear.w{q,k,v}.weight while the optimizer's state (keyed by
 * parameter) keeps the fused moments; the output layer is `lm_head`. Both write a DCP directory through
 * CheckpointManager with `optimizer.*`, `lr_scheduler.*`, `dataloader.*` and `train_state.*` beside the
 * weights (ckpt/key_layout.h). */
#include "layouts/lay_rows.h"

/* the train state each version's CheckpointManager keeps (fsdp-run's train_state.data_pos and its scheduler's
 * lr_lambdas are its own) */
static const char *const tt02_extra[] = {"train_state.step", "train_state.ntokens_seen", "lr_scheduler.base_lrs",
                                         "lr_scheduler.last_epoch", "lr_scheduler._step_count", "lr_scheduler._is_initial",
                                         "lr_scheduler._get_lr_called_within_step", "lr_scheduler._last_lr",
                                         "dataloader.**"};
static const char *const tt03_extra[] = {"train_state.step", "train_state.ntokens_seen", "lr_scheduler.last_epoch",
                                         "dataloader.**"};

static const char *const tt02_marks[] = {"layers.*.attention.wq.weight", "optimizer.state.layers.*.attention.wq.weight.*"};

const lay_layout lay_torchtitan_02 = {
    .name = "torchtitan-0.2",
    .system = "torchtitan 0.2.2 (CheckpointManager, FSDP2)",
    .covers = "weights, optimizer, train_state, lr_scheduler, dataloader",
    .model = "",
    .optim = "optimizer.",
    .rope = LAY_ROPE_INTERLEAVED,
    .marks = tt02_marks,
    .n_marks = LAY_N(tt02_marks),
    .extra = tt02_extra,
    .n_extra = LAY_N(tt02_extra),
};

static const lay_name tt03_names[] = {
    {"layers.*.attention.wq.weight", "layers.*.attention.qkv_linear.wq.weight"},
    {"layers.*.attention.wk.weight", "layers.*.attention.qkv_linear.wk.weight"},
    {"layers.*.attention.wv.weight", "layers.*.attention.qkv_linear.wv.weight"},
    {"output.weight", "lm_head.weight"},
};

static const lay_fuse tt03_fuse[] = {
    {"layers.*.attention.qkv_linear.wqkv.weight",
     {"layers.*.attention.wq.weight", "layers.*.attention.wk.weight", "layers.*.attention.wv.weight"},
     3, LAY_FUSE_GQA, LAY_FUSE_MOMENTS},
};

static const char *const tt03_marks[] = {"layers.*.attention.qkv_linear.wq.weight",
                                         "optimizer.state.layers.*.attention.qkv_linear.wqkv.weight.*"};

const lay_layout lay_torchtitan_03 = {
    .name = "torchtitan-0.3",
    .system = "torchtitan 0.3.0 (CheckpointManager, FSDP2, fused-QKV Llama3Model)",
    .covers = "weights, optimizer, train_state, lr_scheduler, dataloader",
    .model = "",
    .optim = "optimizer.",
    .rope = LAY_ROPE_INTERLEAVED,
    .names = tt03_names,
    .n_names = LAY_N(tt03_names),
    .fuse = tt03_fuse,
    .n_fuse = LAY_N(tt03_fuse),
    .marks = tt03_marks,
    .n_marks = LAY_N(tt03_marks),
    .extra = tt03_extra,
    .n_extra = LAY_N(tt03_extra),
};
