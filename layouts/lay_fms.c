/* fms-fsdp (its Checkpointer, fms_fsdp/utils/checkpointing_utils.py) with ibm-fms 1.13.1's LLaMA, FSDP1: a DCP
 * directory <save>/checkpoints/step_<N>_ckp/ (and metadata.pth beside .metadata: {"tokens_seen", "step"}) of
 *   model_state.<fqn>                          base_model.embedding, base_model.layers.{i}.ln (attention norm),
 *                                              .attn.in_proj.qkv_fused (q rows, then k, then v), .attn.dense,
 *                                              .ff_ln, .ff_sub_layer.wg1_fused (the gate's rows, then up's),
 *                                              .ff_sub_layer.w2, base_model.dec_norm, head
 *   optimizer_state.state.<fqn>.step|exp_avg|exp_avg_sq   by parameter name, fused as the parameter
 *   optimizer_state.param_groups.<i>.<option>, ....params   torch's nested groups, by index
 * and its train state in metadata.pth (read as train_state.step / ntokens_seen, written from them).
 * q/k rows interleaved (fms/modules/positions.py rotates pairs x[2j], x[2j+1]), as fsdp-run's. A
 * torch.compile'd job (fms-fsdp's default use_torch_compile) puts _orig_mod. before every name: not this row.
 * fms builds its embedding with padding_idx=-1 (the last row gets no gradient), which fsdp-run's tiny Llama
 * does not. */
#include "layouts/lay_rows.h"

static const lay_name names[] = {
    {"tok_embeddings.weight", "base_model.embedding.weight"},
    {"layers.*.attention_norm.weight", "base_model.layers.*.ln.weight"},
    {"layers.*.attention.wo.weight", "base_model.layers.*.attn.dense.weight"},
    {"layers.*.ffn_norm.weight", "base_model.layers.*.ff_ln.weight"},
    {"layers.*.feed_forward.w2.weight", "base_model.layers.*.ff_sub_layer.w2.weight"},
    {"norm.weight", "base_model.dec_norm.weight"},
    {"output.weight", "head.weight"},
};

static const lay_fuse fuse[] = {
    {"base_model.layers.*.attn.in_proj.qkv_fused.weight",
     {"layers.*.attention.wq.weight", "layers.*.attention.wk.weight", "layers.*.attention.wv.weight"},
     3, LAY_FUSE_QKV, LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS},
    {"base_model.layers.*.ff_sub_layer.wg1_fused.weight",
     {"layers.*.feed_forward.w1.weight", "layers.*.feed_forward.w3.weight"},
     2, LAY_FUSE_EQUAL, LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS},
};

static const char *const marks[] = {"model_state.base_model.layers.*.attn.in_proj.qkv_fused.weight",
                                    "optimizer_state.state.base_model.layers.*.attn.in_proj.qkv_fused.weight.*"};

static const lay_side side = {"metadata.pth", {"tokens_seen", "step"}, {"train_state.ntokens_seen", "train_state.step"}, 2,
                              {NULL}, 0, 0};

const lay_layout lay_fms_113 = {
    .name = "fms-1.13",
    .system = "fms-fsdp Checkpointer + ibm-fms 1.13.1 LLaMA (FSDP1)",
    .covers = "weights, optimizer (step and tokens_seen are in its metadata.pth)",
    .model = "model_state.",
    .optim = "optimizer_state.",
    .rope = LAY_ROPE_INTERLEAVED,
    .names = names,
    .n_names = LAY_N(names),
    .fuse = fuse,
    .n_fuse = LAY_N(fuse),
    .marks = marks,
    .n_marks = LAY_N(marks),
    .groups = LAY_GROUPS_INDEXED,
    .side = &side,
};
