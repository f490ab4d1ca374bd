/* OLMo 0.6 (ai2-olmo 0.6.0, the repository of seed PR #388): FullCheckpointer's unsharded step directory
 * step<N>-unsharded/ of torch.save files,
 *   model.pt   transformer.wte, transformer.blocks.{i}.att_proj (q rows, then k, then v), .attn_out, .attn_norm,
 *              .ff_proj (up's rows, then the gate's: OLMo's x, gate = chunk(2)), .ff_out, .ff_norm,
 *              transformer.ln_f, transformer.ff_out (the head)
 *   optim.pt   FSDP1's full optimizer state dict: state.<fqn>.step|exp_avg|exp_avg_sq by name, fused as the
 *              parameter; param_groups.<i>.<option>, ....params (names) and param_names
 *   train.pt   global_step, the RNG states (numpy objects: not read; fsdp-run resumes its steps at 0)
 * q/k rows rotate-half (olmo/model.py RotaryEmbedding.rotate_half). Read only: fsdp-run writes DCP and
 * safetensors, not OLMo's torch.save files (its safetensors twins, olmo/safetensors_util.py, neither). */
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

static const char *const marks[] = {"model.transformer.blocks.*.att_proj.weight"};
static const char *const parts[] = {"model.pt", "optim.pt"};
static const char *const part_keys[] = {"model.", "optim."};

const lay_layout lay_olmo_06 = {
    .name = "olmo-0.6",
    .system = "OLMo 0.6.0 (FullCheckpointer, unsharded model.pt / optim.pt)",
    .covers = "weights, optimizer (train.pt's step and RNG states are not read)",
    .model = "model.",
    .optim = "optim.",
    .rope = LAY_ROPE_HALF,
    .names = names,
    .n_names = LAY_N(names),
    .fuse = fuse,
    .n_fuse = LAY_N(fuse),
    .marks = marks,
    .n_marks = LAY_N(marks),
    .groups = LAY_GROUPS_INDEXED,
    .parts = parts,
    .part_keys = part_keys,
    .n_parts = LAY_N(parts),
    .part_prefix = part_keys,
    .no_write = "its checkpoints are torch.save files (model.pt, optim.pt), and fsdp-run writes DCP and safetensors",
};
