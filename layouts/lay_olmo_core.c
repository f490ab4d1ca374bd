/* OLMo-core 3 (ai2-olmo-core 3.0.0): save_model_and_optim_state / load_model_and_optim_state of a
 * TransformerConfig.llama_like model, a DCP directory of
 *   model.<fqn>                             its parameters: embeddings, blocks.{i}.attention.w_q|w_k|w_v|w_out,
 *                                           blocks.{i}.attention_norm, blocks.{i}.feed_forward.w1|w2|w3,
 *                                           blocks.{i}.feed_forward_norm, lm_head.norm (the final norm lives in
 *                                           the head), lm_head.w_out
 *   optim.state.<fqn>.step|exp_avg|exp_avg_sq   torch AdamW's state, by parameter name
 *   optim.param_groups.<i>.<option>, optim.param_groups.<i>.params   torch's nested groups, by index
 * q/k rows in rotate-half order (olmo_core/nn/rope.py RotaryEmbedding: cat(freqs, freqs), _rotate_half), as
 * Hugging Face's. Its .metadata pickles olmo_core.distributed.checkpoint.filesystem._StorageInfo, a dataclass
 * of torch's three fields, read as torch's (ckpt/pickle_allow.c); OLMo-core loads torch's class. No train,
 * scheduler or data state: its Trainer keeps those in train/rank<r>.pt beside the checkpoint. */
#include "layouts/lay_rows.h"

static const lay_name names[] = {
    {"tok_embeddings.weight", "embeddings.weight"},
    {"layers.*.attention.wq.weight", "blocks.*.attention.w_q.weight"},
    {"layers.*.attention.wk.weight", "blocks.*.attention.w_k.weight"},
    {"layers.*.attention.wv.weight", "blocks.*.attention.w_v.weight"},
    {"layers.*.attention.wo.weight", "blocks.*.attention.w_out.weight"},
    {"layers.*.attention_norm.weight", "blocks.*.attention_norm.weight"},
    {"layers.*.feed_forward.w1.weight", "blocks.*.feed_forward.w1.weight"},
    {"layers.*.feed_forward.w2.weight", "blocks.*.feed_forward.w2.weight"},
    {"layers.*.feed_forward.w3.weight", "blocks.*.feed_forward.w3.weight"},
    {"layers.*.ffn_norm.weight", "blocks.*.feed_forward_norm.weight"},
    {"norm.weight", "lm_head.norm.weight"},
    {"output.weight", "lm_head.w_out.weight"},
};

static const char *const marks[] = {"model.blocks.*.attention.w_q.weight", "optim.state.blocks.*.attention.w_q.weight.*"};

const lay_layout lay_olmo_core_3 = {
    .name = "olmo-core-3",
    .system = "OLMo-core 3.0.0 (save_model_and_optim_state, FSDP2)",
    .covers = "weights, optimizer (its checkpoint holds no train state)",
    .model = "model.",
    .optim = "optim.",
    .rope = LAY_ROPE_HALF,
    .names = names,
    .n_names = LAY_N(names),
    .marks = marks,
    .n_marks = LAY_N(marks),
    .groups = LAY_GROUPS_INDEXED,
};
