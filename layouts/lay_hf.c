/* Hugging Face's names of the Llama family (transformers' LlamaForCausalLM, Qwen2, Qwen3: biases and q/k norms
 * where the architecture has them), for the layouts of trainers that train a transformers model as it is
 * (accelerate, Megatron-FSDP, DeepSpeed): q/k rows rotate-half. An HF checkpoint itself is read by `names: hf`
 * (ckpt/namemap.h: tied embeddings, experts), not through this table. */
#include "layouts/lay_rows.h"

/* In transformers' module order (named_parameters(): Llama's, Qwen2's biases after their weights, Qwen3's q/k norms
 * after o_proj): the order of the integer ids an optimizer's state_dict() gives the parameters (Megatron-FSDP). */
const lay_name lay_hf_llama_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"layers.*.attention.wq.weight", "model.layers.*.self_attn.q_proj.weight"},
    {"layers.*.attention.wq.bias", "model.layers.*.self_attn.q_proj.bias"},
    {"layers.*.attention.wk.weight", "model.layers.*.self_attn.k_proj.weight"},
    {"layers.*.attention.wk.bias", "model.layers.*.self_attn.k_proj.bias"},
    {"layers.*.attention.wv.weight", "model.layers.*.self_attn.v_proj.weight"},
    {"layers.*.attention.wv.bias", "model.layers.*.self_attn.v_proj.bias"},
    {"layers.*.attention.wo.weight", "model.layers.*.self_attn.o_proj.weight"},
    {"layers.*.attention.q_norm.weight", "model.layers.*.self_attn.q_norm.weight"},
    {"layers.*.attention.k_norm.weight", "model.layers.*.self_attn.k_norm.weight"},
    {"layers.*.feed_forward.w1.weight", "model.layers.*.mlp.gate_proj.weight"},
    {"layers.*.feed_forward.w3.weight", "model.layers.*.mlp.up_proj.weight"},
    {"layers.*.feed_forward.w2.weight", "model.layers.*.mlp.down_proj.weight"},
    {"layers.*.attention_norm.weight", "model.layers.*.input_layernorm.weight"},
    {"layers.*.ffn_norm.weight", "model.layers.*.post_attention_layernorm.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
const size_t lay_hf_llama_n_names = LAY_N(lay_hf_llama_names);
_Static_assert(LAY_N(lay_hf_llama_names) == LAY_HF_LLAMA_N_NAMES, "LAY_HF_LLAMA_N_NAMES is the table's length");
