#!/usr/bin/env python3
"""Writes the tiny DeepSeek-V3 fixture of fsdp-run's MoE checkpoint tests (tests/data/deepseek_v3_tiny/), run by
hand with transformers 5.24 / PyTorch 2.11 (CPU):

    /work/torchenv/bin/python tools/gen/gen_deepseek_v3_fixture.py tests/data/deepseek_v3_tiny

bf16/: `save_pretrained` of a randomly initialised DeepseekV3ForCausalLM (bfloat16): MLA attention with
q_lora_rank (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj),
layer 0 dense (first_k_dense_replace 1), layers 1-2 MoE with 4 routed experts, 1 shared expert and the
router's e_score_correction_bias; experts saved per expert (mlp.experts.E.{gate,up,down}_proj.weight).
fp8/: the same checkpoint as DeepSeek-V3 ships it: every 2-D weight of the attention and of the experts
(routed and shared) as float8_e4m3fn with `<name>_scale_inv` float32 [ceil(M/128), ceil(N/128)] (amax
per 128 x 128 block / 448), the rest bfloat16; expected.safetensors holds PyTorch's dequantisation of each
fp8 weight to bfloat16 (the fp8 value as float32 times its block's scale, rounded; DeepSeek-V3's
inference/fp8_cast_bf16.py weight_dequant), under the weight's name."""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

B = 128


def quant(w):
    m, n = w.shape
    w = w.to(torch.float32)
    sm, sn = (m + B - 1) // B, (n + B - 1) // B
    s = torch.empty(sm, sn)
    q = torch.empty(m, n, dtype=torch.float8_e4m3fn)
    for i in range(sm):
        for j in range(sn):
            blk = w[i * B:(i + 1) * B, j * B:(j + 1) * B]
            sc = blk.abs().max().clamp(min=1e-12) / 448.0
            s[i, j] = sc
            q[i * B:(i + 1) * B, j * B:(j + 1) * B] = (blk / sc).to(torch.float8_e4m3fn)
    return q, s


def dequant(q, s):
    m, n = q.shape
    full = s.repeat_interleave(B, 0).repeat_interleave(B, 1)[:m, :n]
    return (q.to(torch.float32) * full).to(torch.bfloat16)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    cfg = DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                           n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                           q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                           max_position_embeddings=64, tie_word_embeddings=False)
    model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # a random router bias (zeros at init) so that a mix-up shows
        for n, p in model.named_parameters():
            if n.endswith("e_score_correction_bias"):
                p.copy_(torch.randn(p.shape) * 0.1)
    bf16 = os.path.join(out, "bf16")
    model.save_pretrained(bf16, safe_serialization=True)
    sd = load_file(os.path.join(bf16, "model.safetensors"))
    fp8, expected = {}, {}
    for k, v in sd.items():
        quantise = v.ndim == 2 and (".self_attn." in k or ".mlp.experts." in k or ".shared_experts." in k) \
            and "layernorm" not in k
        if quantise:
            q, s = quant(v)
            fp8[k], fp8[k + "_scale_inv"] = q, s
            expected[k] = dequant(q, s)
        else:
            fp8[k] = v
    os.makedirs(os.path.join(out, "fp8"), exist_ok=True)
    save_file(fp8, os.path.join(out, "fp8", "model.safetensors"), metadata={"format": "pt"})
    save_file(expected, os.path.join(out, "fp8", "expected.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(bf16, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [B, B]}
    with open(os.path.join(out, "fp8", "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    for d in ("bf16", "fp8"):
        for f in os.listdir(os.path.join(out, d)):
            os.chmod(os.path.join(out, d, f), 0o644)
    print(f"wrote {out}: {len(sd)} tensors, {len(expected)} fp8")


if __name__ == "__main__":
    main()
