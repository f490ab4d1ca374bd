/* OLMo 0.6 (ai2-olmo 0.6.0, the repository of seed PR #388): FullCheckpointer's unsharded step directory
 * step<N>-unsharded/ of torch.save files,
 *   model.pt   transformer.wte, transformer.blocks.{i}.att_proj (q rows, then k, then v), .attn_out, .attn_norm,
 *              .ff_proj (up's rows, then the gate's: OLMo's x, gate = chunk(2)), .ff_out, .ff_norm,
 *              transformer.ln_f, transformer.ff_out (the head)
 *   optim.pt   FSDP1's full optimizer state dict: state.<fqn>.step|exp_avg|exp_avg_sq by name, fused as the
 *              parameter; param_groups.<i>.<option>, ....params (names) and param_names
 *   train.pt   global_step, the RNG states (numpy objects: not read; fsdp-run resumes its steps at 0); written
 *              with global_step, global_train_tokens_seen and the empty lists of earlier checkpoints
 *              Trainer.load_trainer_state_dict wants (no RNG states: OLMo then keeps its own, as it does on a
 *              change of world size)
 * q/k rows rotate-half (olmo/model.py RotaryEmbedding.rotate_half). Its groups carry OLMo's own options:
 * param_names (= params), sharded, and max_grad_norm / max_grad_norm_ratio, which OLMo's clipping reads from
 * the loaded groups and fsdp-run's checkpoint does not hold: writing this layout from fsdp-run's needs
 * `--option max_grad_norm=X` (its TrainConfig.max_grad_norm; None: no clipping).
 * olmo-0.6-st: the same step directory with the safetensors twins model.safetensors / optim.safetensors
 * (olmo/safetensors_util.py, what scripts/unshard.py --safe-tensors writes; OLMo's loader prefers them to the .pt
 * files), read and written with their key encoding (layouts/lay_stkey.h). */
#include "layouts/lay_rows.h"

static const lay_name names[] = {
    {"tok_embeddings.weight", "transformer.wte.weight"},
    {"layers.*.attention.wo.weight", "transformer.blocks.*.attn_out.weight"},
    {"layers.*.attention_norm.weight", "transformer.blocks.*.attn_norm.weight"},
    {"layers.*.feed_forward.w2.weight", "transformer.blocks.*.ff_out.weight"},
    {"layers.*.ffn_norm.weight", "transformer.blocks.*.ff_norm.weight"},
    {"norm.weight", "transformer.ln_f.weight"},
    {"output.weight", "transformer.ff_out.weight"},
};

static const lay_fuse fuse[] = {
    {"transformer.blocks.*.att_proj.weight",
     {"layers.*.attention.wq.weight", "layers.*.attention.wk.weight", "layers.*.attention.wv.weight"},
     3, LAY_FUSE_QKV, LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS},
    {"transformer.blocks.*.ff_proj.weight", {"layers.*.feed_forward.w3.weight", "layers.*.feed_forward.w1.weight"},
     2, LAY_FUSE_EQUAL, LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS},
};

static const lay_side side = {"train.pt", {"global_step", "global_train_tokens_seen"},
                              {"train_state.step", "train_state.ntokens_seen"}, 2,
                              {"checkpoints", "unsharded_checkpoints", "ephemeral_checkpoints"}, 3, 1};

static const lay_add_option add_options[] = {{"sharded", "True"}, {"max_grad_norm", NULL},
                                             {"max_grad_norm_ratio", "None"}, {NULL, NULL}};

static const char *const marks[] = {"model.transformer.blocks.*.att_proj.weight"};
static const char *const parts[] = {"model.pt", "optim.pt"};
static const char *const part_keys[] = {"model.", "optim."};

static const char *const st_parts[] = {"model.safetensors", "optim.safetensors"};

/* The two rows differ in their parts' files only. */
#define LAY_OLMO_06_ROW                                                                                                \
    .model = "model.", .optim = "optim.", .rope = LAY_ROPE_HALF, .names = names, .n_names = LAY_N(names),            \
    .fuse = fuse, .n_fuse = LAY_N(fuse), .groups = LAY_GROUPS_INDEXED, .part_keys = part_keys, .n_parts = 2,        \
    .part_prefix = part_keys, .side = &side, .add_options = add_options, .params_also = "param_names"

const lay_layout lay_olmo_06 = {
    .name = "olmo-0.6",
    .system = "OLMo 0.6.0 (FullCheckpointer, unsharded model.pt / optim.pt)",
    .covers = "weights, optimizer; train.pt written (global_step, tokens), its RNG states and step not read",
    .marks = marks,
    .n_marks = LAY_N(marks),
    .parts = parts,
    LAY_OLMO_06_ROW,
};

/* no marks of its own: its keys are olmo-0.6's, and its files (lay_container_open) tell it apart */
const lay_layout lay_olmo_06_st = {
    .name = "olmo-0.6-st",
    .system = "OLMo 0.6.0 (FullCheckpointer's step directory with its safetensors twins, olmo/safetensors_util.py)",
    .covers = "weights, optimizer; train.pt written (global_step, tokens), its RNG states and step not read",
    .parts = st_parts,
    .parts_stkey = 1,
    LAY_OLMO_06_ROW,
};
