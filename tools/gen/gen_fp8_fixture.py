#!/usr/bin/env python3
"""Writes the FP8 block-scaled fixture of fsdp-run's tests (tests/data/fp8/), run by hand with PyTorch:

    python tools/gen/gen_fp8_fixture.py tests/data/fp8

fp8.safetensors holds DeepSeek-V3-style weights: float8_e4m3fn [M, N] with `<name>_scale_inv` float32
[ceil(M/128), ceil(N/128)] (one scale per 128 x 128 block), at a size that is not a multiple of 128 and at
one that is; an e4m3 tensor without a scale and an e5m2 one (plain fp8 values). expected.safetensors is
PyTorch's reference dequantisation of each, in float32 and bfloat16: the fp8 value as float32, times its
block's scale in float32, rounded to the dtype (DeepSeek-V3's inference/fp8_cast_bf16.py weight_dequant)."""
import os
import sys

import torch
from safetensors.torch import save_file

B = 128


def dequant(w, s, dtype):
    m, n = w.shape
    full = s.repeat_interleave(B, 0).repeat_interleave(B, 1)[:m, :n]
    return (w.to(torch.float32) * full).to(dtype)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    tensors, expected = {}, {}
    for name, (m, n) in {"model.layers.0.mlp.experts.0.down_proj.weight": (300, 200),
                         "model.layers.0.self_attn.q_b_proj.weight": (256, 128)}.items():
        w = (torch.randn(m, n, generator=g) * 100).to(torch.float8_e4m3fn)
        s = torch.rand((m + B - 1) // B, (n + B - 1) // B, generator=g) * 1e-2 + 1e-4
        tensors[name], tensors[name + "_scale_inv"] = w, s
        expected[name + ".f32"], expected[name + ".bf16"] = dequant(w, s, torch.float32), dequant(w, s, torch.bfloat16)
    plain = (torch.randn(7, 5, generator=g) * 10).to(torch.float8_e4m3fn)
    e5 = (torch.randn(6, 3, generator=g) * 1000).to(torch.float8_e5m2)
    tensors["plain_e4m3"], tensors["plain_e5m2"] = plain, e5
    expected["plain_e4m3.f32"], expected["plain_e5m2.f32"] = plain.to(torch.float32), e5.to(torch.float32)
    save_file(tensors, os.path.join(out, "fp8.safetensors"))
    save_file(expected, os.path.join(out, "expected.safetensors"))
    for f in ("fp8.safetensors", "expected.safetensors"):
        os.chmod(os.path.join(out, f), 0o644)
    print(f"wrote {out}: {len(tensors)} tensors, {len(expected)} expected")


if __name__ == "__main__":
    main()
