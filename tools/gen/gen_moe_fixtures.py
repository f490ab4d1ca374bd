"""Golden fixtures for tiny mixture-of-experts architectures, written by real transformers + PyTorch.

In the manner of shared/fixtures/hf-5.24/gen/gen_hf_fixtures.py (same batch recipe, same optimizer
and schedule), but for Qwen3-MoE, OLMoE and Mixtral, with 4 AdamW steps and transformers' MoE
training objective (cross-entropy + router_aux_loss_coef * load-balancing loss).

    python gen_moe_fixtures.py OUT_DIR [name ...]

For each tiny config below: the HF checkpoint as `save_pretrained` writes it (config.json +
model.safetensors, float32, HF parameter names; experts are stored grouped as 3-D tensors), a token
batch, and a float64 training run of 4 AdamW steps from those weights (loss, ce/aux split, grad
norm, lr per step; step-0 gradients and router top-k choices; final weights and AdamW moments, all
in HF names, stored as float32).

Objective (what `model(input_ids, labels=..., output_router_logits=True).loss` computes, except that
our labels are already the next tokens, so there is no shift):
    out  = model(input_ids=input_ids, output_router_logits=True)
    ce   = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(0, 1))          # mean over B*T
    aux  = load_balancing_loss_func(out.router_logits, model.num_experts,
                                    model.num_experts_per_tok, None)               # attention_mask=None
    loss = ce + model.router_aux_loss_coef * aux
with load_balancing_loss_func imported from the model's own modeling module, called with the same
positional arguments as the model's forward. Note that transformers computes `aux` in float32 even
for a float64 model (its accumulators are float32), and the routers take their softmax in float32
(Qwen3-MoE/OLMoE: softmax(dtype=torch.float); Mixtral: softmax(logits.float())), so the "float64" run
has float32-rounded routing weights and aux loss: that is transformers' behaviour, kept as is.

Optimizer as in ../../torch-2.11 (README there): torch.optim.AdamW, lr 1e-3 with linear warmup over
2 steps then linear decay to 10%, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on every parameter,
clip_grad_norm_(1.0). No tied embeddings here.
"""
import importlib
import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers.core_model_loading import revert_weight_conversion

OPT = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_norm=1.0, warmup=2)
STEPS = 4

OBJECTIVE = ("out = model(input_ids=input_ids, output_router_logits=True); "
             "ce = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(0, 1)) (mean over all B*T tokens, labels "
             "already the next tokens, no shift); "
             "aux = load_balancing_loss_func(out.router_logits, model.num_experts, model.num_experts_per_tok, None) "
             "(transformers.models.<arch>.modeling_<arch>.load_balancing_loss_func, the call in "
             "<Arch>ForCausalLM.forward with attention_mask=None; out.router_logits is a tuple with one "
             "[B*T, num_experts] tensor per MoE layer; aux is accumulated in float32 by transformers); "
             "loss = ce + router_aux_loss_coef * aux. Equals model(input_ids, labels=labels, shift_labels=labels, "
             "output_router_logits=True).loss up to float32 rounding: transformers' ForCausalLMLoss takes the "
             "cross-entropy of logits.float() (float32), this reference takes ce in float64 (as the dense "
             "hf-5.24 fixtures); the aux term is transformers' own float32 value.")

CONFIGS = {
    # Qwen3-MoE: q_norm/k_norm, 3-D grouped experts (gate_up_proj [E, 2I, H], down_proj [E, H, I]),
    # router `mlp.gate.weight` [E, H], softmax -> top-k -> renormalise (norm_topk_prob). Layer 1 is a
    # dense MLP (mlp_only_layers=[1], intermediate_size 96), so only layer 0 has a router.
    "qwen3_moe_tiny": dict(cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", mod="qwen3_moe", kw=dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=64, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
        mlp_only_layers=[1], norm_topk_prob=True, router_aux_loss_coef=0.01, output_router_logits=True,
        tie_word_embeddings=False, rms_norm_eps=1e-6), B=2, T=32, seed=10),
    # OLMoE: q_norm/k_norm over the whole projection width (not per head), no clip_qkv, softmax -> top-k
    # WITHOUT renormalisation (norm_topk_prob False).
    "olmoe_tiny": dict(cls="OlmoeForCausalLM", cfg="OlmoeConfig", mod="olmoe", kw=dict(
        vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, router_aux_loss_coef=0.01,
        output_router_logits=True, clip_qkv=None, tie_word_embeddings=False,
        pad_token_id=1, eos_token_id=2), B=2, T=32, seed=12),
    # Mixtral: no q/k norms, softmax -> top-k -> always renormalised; no sliding window.
    "mixtral_tiny": dict(cls="MixtralForCausalLM", cfg="MixtralConfig", mod="mixtral", kw=dict(
        vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
        output_router_logits=True, tie_word_embeddings=False, sliding_window=None), B=2, T=32, seed=14),
}


def lr_at(step, total):
    w = OPT["warmup"]
    if step < w:
        return OPT["lr"] * (step + 1) / w
    return OPT["lr"] * (1.0 - 0.9 * (step - w) / max(1, total - w))


def make_batch(vocab, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, vocab, (B, 7), generator=g)
    toks = base[:, torch.arange(T + 1) % 7]
    noise = torch.rand(B, T + 1, generator=g) < 0.15
    toks = torch.where(noise, torch.randint(0, vocab, (B, T + 1), generator=g), toks)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


def f32(named):
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in named}


def build(spec):
    cfg = getattr(transformers, spec["cfg"])(**spec["kw"], attn_implementation="eager",
                                             experts_implementation="eager")
    torch.manual_seed(spec["seed"])
    return getattr(transformers, spec["cls"])(cfg).float()


def ckpt(m, named):
    """float32 copies in the checkpoint layout that save_pretrained writes (transformers 5 keeps experts as
    3-D mlp.experts.gate_up_proj / down_proj in memory but saves them per expert under the legacy names;
    revert_weight_conversion is the very function save_pretrained applies)."""
    return {k: v.contiguous() for k, v in revert_weight_conversion(m, f32(named)).items()}


def objective(m, lbl_fn, inp, lab):
    """(loss, ce, aux, out) exactly as <Arch>ForCausalLM.forward combines them (no label shift)."""
    out = m(input_ids=inp, output_router_logits=True)
    assert isinstance(out.router_logits, tuple), type(out.router_logits)   # else lbl_fn returns 0
    ce = F.cross_entropy(out.logits.flatten(0, 1), lab.flatten(0, 1))
    aux = lbl_fn(out.router_logits, m.num_experts, m.num_experts_per_tok, None)
    loss = ce + m.router_aux_loss_coef * aux.to(ce.device)
    return loss, ce, aux, out


def routers(m):
    return [(i, l.mlp.gate) for i, l in enumerate(m.model.layers) if hasattr(l.mlp, "gate")]


def run(name, spec, out):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    lbl_fn = importlib.import_module(f"transformers.models.{spec['mod']}.modeling_{spec['mod']}").load_balancing_loss_func
    m = build(spec)
    m.save_pretrained(d, safe_serialization=True)          # config.json + model.safetensors
    init = f32(m.named_parameters())
    saved = load_file(os.path.join(d, "model.safetensors"))
    mine = ckpt(m, m.named_parameters())
    assert mine.keys() == saved.keys() and all(torch.equal(mine[k], saved[k]) for k in saved), "layout check"
    module_shapes = {n: list(p.shape) for n, p in m.named_parameters()}
    steps, B, T = STEPS, spec["B"], spec["T"]
    inp, lab = make_batch(spec["kw"]["vocab_size"], B, T, spec["seed"] + 1)
    save_file({"input_ids": inp.to(torch.int32), "labels": lab.to(torch.int32)}, os.path.join(d, "batch.safetensors"))
    m = m.double()
    opt = torch.optim.AdamW(m.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"], foreach=False)
    rlayers = [i for i, _ in routers(m)]
    rec = {"config": spec["kw"], "arch": spec["cls"], "batch": [B, T], "transformers": transformers.__version__,
           "torch": torch.__version__, "optimizer": {**OPT, "betas": list(OPT["betas"])}, "objective": OBJECTIVE,
           "router_aux_loss_coef": m.router_aux_loss_coef, "num_experts": m.num_experts,
           "num_experts_per_tok": m.num_experts_per_tok, "router_layers": rlayers, "steps": [],
           "param_names": list(mine.keys()),
           "module_param_names": module_shapes}
    # the routers' own top-k choices at step 0 (captured from the gate modules' forward)
    captured = {}
    hooks = [g.register_forward_hook(lambda mod, a, o, i=i: captured.__setitem__(i, o)) for i, g in routers(m)]
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, steps)
        opt.zero_grad()
        loss, ce, aux, o = objective(m, lbl_fn, inp, lab)
        if s == 0:
            for h in hooks:
                h.remove()
            # cross-check against transformers' own loss (shift_labels = our already-shifted labels)
            with torch.no_grad():
                hf = m(input_ids=inp, labels=lab, shift_labels=lab, output_router_logits=True)
            # (transformers' ForCausalLMLoss takes the cross-entropy of logits.float(), i.e. in float32 even
            # for a float64 model; ours is the float64 cross-entropy, as the dense fixtures use)
            rec["hf_outputs_loss_step0"] = hf.loss.item()
            assert abs(hf.loss.item() - loss.item()) < 1e-5 * loss.item(), (hf.loss.item(), loss.item())
            assert hf.aux_loss.item() == aux.item(), (hf.aux_loss.item(), aux.item())
            topk, margin = [], float("inf")
            for i in rlayers:
                logits, _, idx = captured[i]
                assert torch.equal(logits, o.router_logits[rlayers.index(i)].detach())
                topk.append(idx.sort(dim=-1).values.tolist())            # [token][k], token = b * T + t
                p = torch.softmax(logits.detach(), dim=-1).sort(dim=-1, descending=True).values
                k = m.num_experts_per_tok
                margin = min(margin, float((p[:, k - 1] - p[:, k]).min()))
            rec["router_topk_step0"] = topk          # [moe layer (router_layers order)][token][k] sorted ids
            rec["router_topk_min_prob_margin_step0"] = margin   # min over tokens of p_(k) - p_(k+1)
        loss.backward()
        if s == 0:
            save_file(ckpt(m, [(n, p.grad) for n, p in m.named_parameters()]), os.path.join(d, "grads_step0.safetensors"))
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), OPT["max_norm"], foreach=False)
        opt.step()
        rec["steps"].append({"step": s + 1, "lr": lr_at(s, steps), "loss": loss.item(), "ce_loss": ce.item(),
                             "aux_loss": aux.item(), "grad_norm": float(gn)})
    with torch.no_grad():
        loss, ce, aux, _ = objective(m, lbl_fn, inp, lab)
        rec["loss_after"], rec["ce_loss_after"], rec["aux_loss_after"] = loss.item(), ce.item(), aux.item()
    save_file(ckpt(m, m.named_parameters()), os.path.join(d, f"model_step{steps}.safetensors"))
    adam = {}
    for key in ("exp_avg", "exp_avg_sq"):
        for n, v in ckpt(m, [(n, opt.state[p][key]) for n, p in m.named_parameters()]).items():
            adam[f"{n}.{key}"] = v
    save_file(adam, os.path.join(d, f"adam_step{steps}.safetensors"))
    # float32 run of the same steps (what PyTorch itself reaches in float32, for tolerances)
    m32 = build(spec)
    m32.load_state_dict(init, strict=False)
    opt32 = torch.optim.AdamW(m32.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"], weight_decay=OPT["weight_decay"])
    for s in range(steps):
        for g in opt32.param_groups:
            g["lr"] = lr_at(s, steps)
        opt32.zero_grad()
        objective(m32, lbl_fn, inp, lab)[0].backward()
        torch.nn.utils.clip_grad_norm_(m32.parameters(), OPT["max_norm"])
        opt32.step()
    fin = dict(m.named_parameters())
    with torch.no_grad():
        rec["f32_run_max_abs_weight_diff"] = max(float((p.double() - fin[n]).abs().max()) for n, p in m32.named_parameters())
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(rec, f, indent=1)
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)                # safetensors writes 0600
    print(name, "loss", [round(x["loss"], 6) for x in rec["steps"]], "f32 drift", rec["f32_run_max_abs_weight_diff"])


README = """# Golden fixtures for tiny mixture-of-experts architectures

Written by transformers {tv} on PyTorch {pv} (CPU) with `tools/gen/gen_moe_fixtures.py` (read it for
the exact configs, objective and optimizer). Never edit them; if a test disagrees with a fixture,
the project is wrong. Same batch recipe and optimizer as the dense `hf-5.24` fixtures, but 4 steps.

| dir | architecture | what is special |
| --- | --- | --- |
| `qwen3_moe_tiny/` | `Qwen3MoeForCausalLM` | q_norm/k_norm per head (head_dim 16); layer 0 is MoE (4 experts, top-2, moe_intermediate 32, top-k weights renormalised), layer 1 is a dense MLP (`mlp_only_layers=[1]`, intermediate 96): only layer 0 has a router |
| `olmoe_tiny/` | `OlmoeForCausalLM` | q_norm/k_norm over the whole projection width (64), no clip_qkv; top-2 of 4, top-k weights NOT renormalised (`norm_topk_prob` False) |
| `mixtral_tiny/` | `MixtralForCausalLM` | no q/k norms, GQA 4/2; top-2 of 4 always renormalised; checkpoint names `block_sparse_moe.*` and `w1`/`w3`/`w2` |

All untied (`lm_head.weight` stored), vocab 256, hidden 64, 2 layers, 4 heads, batch [2, 32].

Each holds:

| file | what it is |
| --- | --- |
| `config.json`, `model.safetensors` | the float32 initial weights exactly as `save_pretrained` writes them. transformers 5 holds experts in memory as 3-D `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first, then up) and `mlp.experts.down_proj` [E, H, I], but saves them per expert under the legacy names: `mlp.experts.<e>.{{gate,up,down}}_proj.weight` (Qwen3-MoE, OLMoE) or `block_sparse_moe.experts.<e>.{{w1,w3,w2}}.weight` (Mixtral; router `block_sparse_moe.gate.weight`); router `mlp.gate.weight` [E, H] |
| `batch.safetensors` | `input_ids`, `labels` (int32 [2, 32]); labels are already the next tokens |
| `reference.json` | the float64 run of 4 AdamW steps: per step `lr`, `loss` (before the update), `ce_loss`, `aux_loss`, `grad_norm` (before clipping); `loss_after` (+ `ce_loss_after`, `aux_loss_after`); `objective` (the formula); `router_layers` (indices of the MoE layers) and `router_topk_step0` ([MoE layer][token b*T+t][k], sorted expert ids the routers chose at step 0) with `router_topk_min_prob_margin_step0` (smallest gap between the k-th and (k+1)-th routing probability, how robust those choices are); `param_names` (the checkpoint names, as in every safetensors file here); `module_param_names` (in-memory names and shapes); `hf_outputs_loss_step0` (transformers' own `outputs.loss`, whose cross-entropy is float32); `f32_run_max_abs_weight_diff`: how far PyTorch's own float32 run of the same steps ends from the float64 one (max abs over all weights) |
| `grads_step0.safetensors` | float64 gradients at step 0 (stored float32), checkpoint names and layout (as `model.safetensors`) |
| `model_step4.safetensors`, `adam_step4.safetensors` | weights and AdamW `<name>.exp_avg`/`<name>.exp_avg_sq` after 4 steps (float64 run, stored float32), checkpoint names and layout |

Objective: transformers' MoE training loss with labels already shifted:
`ce` = mean cross-entropy of `model(input_ids, output_router_logits=True).logits` against `labels` over
all B*T tokens (float64); `aux` = the model module's `load_balancing_loss_func(router_logits,
num_experts, num_experts_per_tok, None)` (Switch load balancing: num_experts * sum_e
frac_tokens_routed_e * mean_prob_e, counting each token's top-k choices, over all MoE layers' rows
together, i.e. divided by layers * B*T); `loss = ce + 0.01 * aux`. transformers computes `aux` and
the routing softmax in float32 even in a float64 model; the reference keeps that.
Optimizer: AdamW lr 1e-3, warmup 2 then linear decay to 10% (lr 5e-4, 1e-3, 1e-3, 5.5e-4), betas
(0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter, clipping to norm 1.0.
"""


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    import safetensors
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(README.format(tv=transformers.__version__, pv=torch.__version__.split("+")[0]))
    with open(os.path.join(out, "VERSIONS.txt"), "w") as f:
        f.write(f"transformers {transformers.__version__}\ntorch {torch.__version__}\nsafetensors {safetensors.__version__}\n")
    for n in (sys.argv[2:] or CONFIGS):
        run(n, CONFIGS[n], out)
