"""A grid of small Hugging Face models of every architecture fsdp-run trains, each with transformers' own
float64 training run (the reference), PyTorch's float32 run of the same steps (the honest tolerance) and
transformers' bf16 autocast run: tests/data/hf-grid-5.24.

    python tools/gen/gen_hf_grid.py OUT_DIR [--only NAME ...]

Written with torch 2.11.0 (CPU) and transformers 5.24.0. Unlike the one-point fixtures
(../shared/fixtures/hf-5.24, tests/data/moe-5.24), the configs are drawn: per model type (llama, qwen2,
qwen3, qwen3_moe, olmoe, mixtral) 12 configs from a seeded generator (draw_config below), which cycles
the traits that have broken numerics before so that every one appears in every type:

  * heads / kv heads: MHA and GQA (down to one kv head), head_dim different from hidden / heads where the
    class reads config.head_dim (all but OLMoE, whose q/k norms are hidden_size wide);
  * odd sizes: hidden, intermediate and vocab not multiples of 8; 1-3 layers;
  * pad_token_id unset, set to a token the batch holds (right-padded rows, sometimes pad = eos; labels at
    the pads either the pad token or -100) or set to a token the batch lacks: transformers builds the
    embedding as nn.Embedding(vocab, hidden, padding_idx=pad_token_id), so that row gets no gradient;
  * tied and untied embeddings; RoPE default with several thetas, and Llama 3 scaling (factor, low/high
    frequency factors and an original context short enough that the scaling changes the frequencies);
  * several rms_norm_eps and initializer_range;
  * experts 2-8 with top-k from 1 to E, norm_topk_prob both ways (Qwen3-MoE, OLMoE; Mixtral always
    renormalises), mlp_only_layers and decoder_sparse_step (Qwen3-MoE), output_router_logits on (the
    aux loss in the objective, several coefficients) or off (cross-entropy only), experts that receive
    no token at step 0 (the generator redraws the weights' seed until such a config has one).

Routing must not hinge on float rounding: a MoE config is kept only when, at every step of the float64
run, the smallest gap between the k-th and (k+1)-th routing probability of any token is above
MARGIN_MIN and PyTorch's own float32 run routes every token of every step the same way (else the seed is
redrawn); the gap is recorded.

Each config directory holds:
  config.json, model.safetensors   save_pretrained's output (float32)
  batch.safetensors                input_ids, labels: int32 [B, T] (labels already the next tokens; -100 = ignored)
  grads_step0.safetensors          the float64 run's step-0 gradients (stored float32), checkpoint names
  model_step3.safetensors          the float64 run's weights after 3 AdamW steps (stored float32)
  reference.json                   the config's traits, the per-step lr / loss / ce_loss / aux_loss / grad_norm
                                   of the float64 run, loss_after, PyTorch's float32 run (its per-step loss and
                                   grad norm, its step-0 gradient error per parameter, its final weights' distance
                                   f32_run_max_abs_weight_diff) and the bf16 autocast run (its per-step loss and
                                   grad norm)
grid.json lists the configs with their traits.

Objective (per step, before the update): ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1),
ignore_index=-100) (mean over the kept tokens); for a MoE with output_router_logits the load-balancing
loss of the model module's load_balancing_loss_func(router_logits, num_experts, num_experts_per_tok, None)
(attention_mask None: every token counts) weighted by router_aux_loss_coef is added, as the model's
forward does. Optimizer: torch.optim.AdamW(lr per step, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1
on every parameter, foreach=False), clip_grad_norm_(1.0), lr 1e-3 with 2 warmup steps then linear decay
to 10% (the fixtures' schedule). transformers computes RoPE's cos/sin, the routers' softmax and the aux
loss in float32 even in a float64 model: the reference keeps that (it is transformers' behaviour).

bf16, two runs: the same float32 model and optimizer with forward and loss under torch.autocast("cpu",
torch.bfloat16) (transformers' autocast: bf16 matmuls, float32 master weights, AdamW, norms and residual
stream), and FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) (the whole forward
and backward in bf16, float32 master weights, gradients and AdamW: the policy fsdp-run's bf16 path
implements); both take the cross-entropy of float32 logits, as transformers' loss does.
"""
import argparse
import copy
import importlib
import json
import os
import random
import shutil
import sys
import zlib

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers.core_model_loading import revert_weight_conversion

OPT = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_norm=1.0, warmup=2)
STEPS = 3
B = 6                 # divisible by 1, 2 and 3 ranks
PER_TYPE = 12
MARGIN_MIN = 2e-5     # smallest routing-probability gap kept (float32 routing noise is ~1e-7)
GRID_SEED = 20261201
ROUTER_BOOST = 6.0
BF16_PERTURBED = 4    # FSDP2-policy bf16 runs from perturbed weights in the bf16 envelope    # want_empty_expert configs: router weights scaled at init

TYPES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", False),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", False),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", False),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", True),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", True),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", True),
}

HEADS = [(4, 4), (4, 2), (4, 1), (6, 3), (6, 2), (5, 1), (2, 2), (3, 1), (8, 2), (2, 1), (6, 6), (8, 4)]
HEAD_DIMS = [4, 6, 8, 10]
VOCABS = [37, 53, 61, 77, 83, 97]
INTERS = [14, 23, 29, 37, 19, 41]      # a dense MLP's width
EXPERT_INTERS = [6, 9, 11, 14, 7]     # an expert's
EPS = [1e-6, 1e-5, 3e-6, 1e-4]
STDS = [0.02, 0.1, 0.2, 0.3]
THETAS = [10000.0, 1e6, 5e5, 2e4]
EXPERTS = [2, 3, 4, 5, 6, 8, 7, 4, 6, 8, 3, 5]
AUX = [0.01, 0.02, 0.001, 0.05, 0.03]


def lr_at(step, total):
    w = OPT["warmup"]
    if step < w:
        return OPT["lr"] * (step + 1) / w
    return OPT["lr"] * (1.0 - 0.9 * (step - w) / max(1, total - w))


def draw_config(mt, i, rng):
    """The i-th config of model type mt (traits cycled by i so each appears in each type, sizes drawn)."""
    cls, cfgname, moe = TYPES[mt]
    h, kv = HEADS[(i * 5 + len(mt)) % len(HEADS)]
    explicit_hd = mt != "olmoe" and i % 3 == 1
    if explicit_hd:
        hd = HEAD_DIMS[rng.randrange(len(HEAD_DIMS))]
        # not heads x head_dim; LlamaConfig insists on hidden % heads == 0, the others do not
        hidden = h * rng.choice([3, 5]) if mt == "llama" else rng.choice([14, 18, 22, 26, 30])
    else:
        hd = rng.choice([d for d in (4, 6, 8) if h * d <= 32] or [2])
        hidden = h * hd
    layers = 1 + i % 3
    vocab = rng.choice(VOCABS)
    pad_mode = ["present", "absent", "none"][i % 3] if i % 6 < 3 else ["none", "present", "absent"][i % 3]
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=rng.choice(EXPERT_INTERS if moe and mt != "qwen3_moe" else INTERS), num_hidden_layers=layers,
              num_attention_heads=h, num_key_value_heads=kv, max_position_embeddings=64,
              rms_norm_eps=EPS[(i + len(mt)) % len(EPS)], initializer_range=STDS[(i // 2 + len(mt)) % len(STDS)],
              # tied: MoE i % 4 == 0, dense i % 4 in {0, 1}: 0 and 4 hold the pad in the batch with its labels
              # kept (so the lookup's gradient would reach the row beside the head's), 6 and 10 untied with them
              # ignored
              tie_word_embeddings=(i % 4 == 0) if moe else (i % 4 in (0, 1)),
              bos_token_id=1, eos_token_id=2)
    if explicit_hd:
        kw["head_dim"] = hd
    if mt == "qwen3" and not explicit_hd:
        kw["head_dim"] = hd                                   # Qwen3Config's default head_dim is 128
    if mt == "qwen3_moe" and not explicit_hd:
        kw["head_dim"] = hd
    theta = THETAS[(i + 2 * len(mt)) % len(THETAS)]
    rope = {"rope_type": "default", "rope_theta": theta}
    if i % 4 == 3:
        rope = {"rope_type": "llama3", "rope_theta": theta, "factor": [8.0, 32.0][i % 2],
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    kw["rope_parameters"] = rope
    pad = None
    if pad_mode != "none":
        pad = 2 if i % 4 == 0 else rng.randrange(3, vocab)     # pad = eos sometimes, else some token
        kw["pad_token_id"] = pad
    elif mt == "olmoe":
        kw["pad_token_id"] = None                               # OlmoeConfig's default would be 1
    traits = dict(pad_mode=pad_mode, ignore_pad_labels=pad_mode == "present" and (i // 2) % 2 == 1,
                  explicit_head_dim=explicit_hd, rope=rope["rope_type"])
    if moe:
        E = EXPERTS[(i + len(mt)) % len(EXPERTS)]
        K = [1, 2, E, max(1, E - 1), 2, 1][i % 6]
        K = min(K, E)
        aux_on = i % 5 != 4
        kw.update(num_experts_per_tok=K, router_aux_loss_coef=AUX[i % len(AUX)], output_router_logits=aux_on)
        if mt == "mixtral":
            kw.update(num_local_experts=E, sliding_window=None)
        else:
            kw.update(num_experts=E)
        if mt == "qwen3_moe":
            kw.update(moe_intermediate_size=rng.choice(EXPERT_INTERS), norm_topk_prob=i % 2 == 0,
                      decoder_sparse_step=2 if (layers >= 2 and i % 4 == 1) else 1,
                      mlp_only_layers=[layers - 1] if (layers >= 2 and i % 4 == 2) else [])
        if mt == "olmoe":
            kw.update(norm_topk_prob=i % 2 == 1, clip_qkv=None)
        traits.update(experts=E, top_k=K, aux_in_loss=aux_on, want_empty_expert=i % 6 == 0 and 2 * K <= E)
    T = [8, 10, 12][i % 3]
    return dict(cls=cls, cfg=cfgname, mod=mt, moe=moe, kw=kw, T=T, pad=pad, traits=traits)


def make_batch(spec, seed):
    """input_ids and labels [B, T]: periodic token rows with noise (the fixtures' recipe); pad_mode
    'present' right-pads rows (labels at the pads: the pad, or -100), 'absent' removes the pad token."""
    vocab, T, pad, mode = spec["kw"]["vocab_size"], spec["T"], spec["pad"], spec["traits"]["pad_mode"]
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, vocab, (B, 5), generator=g)
    toks = base[:, torch.arange(T + 1) % 5]
    noise = torch.rand(B, T + 1, generator=g) < 0.2
    toks = torch.where(noise, torch.randint(0, vocab, (B, T + 1), generator=g), toks)
    if mode == "absent":
        toks = torch.where(toks == pad, (toks + 1) % vocab, toks)
    if mode == "present":
        for r in range(B):
            if r % 2 == 0 or r == 1:
                L = max(2, T - 1 - (r * 3) % (T - 2))
                toks[r, L:] = pad
    inp, lab = toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
    if spec["traits"]["ignore_pad_labels"]:
        lab = torch.where(lab == pad, torch.full_like(lab, -100), lab)
    if mode == "present":
        assert (inp == pad).any(), "pad token in the batch"
    if mode == "absent":
        assert not (inp == pad).any()
    return inp, lab


def build(spec, seed, dtype=torch.float32):
    cfg = getattr(transformers, spec["cfg"])(**spec["kw"], attn_implementation="eager",
                                             **({"experts_implementation": "eager"} if spec["moe"] else {}))
    torch.manual_seed(seed)
    m = getattr(transformers, spec["cls"])(cfg)
    if spec["traits"].get("want_empty_expert"):
        # peakier routers (their init times ROUTER_BOOST) make some expert receive no token at step 0
        with torch.no_grad():
            for layer in m.model.layers:
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.weight.mul_(ROUTER_BOOST)
    return m.to(dtype)


def f32(named):
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in named}


def ckpt(m, named):
    """float32 copies in save_pretrained's layout (per-expert tensors under the legacy names)."""
    return {k: v.contiguous() for k, v in revert_weight_conversion(m, f32(named)).items()}


class Objective:
    """transformers' training objective of a model, over micro-batches (groups of batch rows, one forward
    each): ce = the summed cross-entropy of every group over the kept tokens of all of them (one
    denominator: the whole batch's mean, as gradient accumulation with a global token count computes it);
    for a MoE, aux = the mean over the groups of load_balancing_loss_func of each group's router logits
    (each micro-batch's forward computes its own, as in transformers), added with router_aux_loss_coef
    when output_router_logits. One group of every row: the whole batch in one forward."""

    def __init__(self, spec):
        self.spec = spec
        self.lbl = None
        if spec["moe"]:
            mod = importlib.import_module(f"transformers.models.{spec['mod']}.modeling_{spec['mod']}")
            self.lbl = mod.load_balancing_loss_func

    def __call__(self, m, inp, lab, groups, autocast=False):
        """(loss, ce, aux, router logits [MoE layer][B, T, E] in inp's row order)."""
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
        ce_sum, kept, auxes, rl = 0.0, 0, [], None
        for g in groups:
            with ctx:
                out = m(input_ids=inp[g], output_router_logits=True) if self.spec["moe"] else m(input_ids=inp[g])
            # the cross-entropy of float32 logits below float64, as transformers' ForCausalLMLoss takes it
            logits = out.logits if out.logits.dtype == torch.float64 else out.logits.float()
            ce_sum = ce_sum + F.cross_entropy(logits.flatten(0, 1), lab[g].flatten(0, 1).long(), ignore_index=-100,
                                              reduction="sum")
            kept += int((lab[g] != -100).sum())
            if self.spec["moe"]:
                assert isinstance(out.router_logits, tuple)
                auxes.append(self.lbl(out.router_logits, m.num_experts, m.num_experts_per_tok, None))
                if rl is None:
                    rl = [torch.zeros(inp.shape[0], inp.shape[1], x.shape[-1], dtype=x.dtype) for x in out.router_logits]
                for l, x in enumerate(out.router_logits):
                    rl[l][g] = x.detach().view(len(g), inp.shape[1], -1)
        ce = ce_sum / kept
        if not self.spec["moe"]:
            return ce, ce, None, []
        aux = sum(auxes) / len(auxes)
        loss = ce + m.router_aux_loss_coef * aux.to(ce.dtype) if self.spec["kw"]["output_router_logits"] else ce
        return loss, ce, aux, rl


def routing(rl, K):
    """Per MoE layer ([B, T, E] logits): the sorted top-K sets per token, the smallest gap between the k-th
    and (k+1)-th routing probability of any token, the tokens per expert."""
    sets, margin, counts = [], float("inf"), []
    for lg in rl:
        p = torch.softmax(lg.reshape(-1, lg.shape[-1]).float(), dim=-1)
        E = p.shape[-1]
        idx = torch.topk(p, K, dim=-1).indices
        sets.append(idx.sort(dim=-1).values)
        if K < E:
            srt = p.sort(dim=-1, descending=True).values
            margin = min(margin, float((srt[:, K - 1] - srt[:, K]).min()))
        counts.append(torch.bincount(idx.flatten(), minlength=E).tolist())
    return sets, margin, counts


def train(spec, m, obj, inp, lab, groups, autocast=False):
    """STEPS AdamW steps of m; per step (loss, ce, aux, grad_norm), the routing of each step's forward and
    of the one after, the step-0 gradients (in-memory names) and the final (loss, ce, aux)."""
    opt = torch.optim.AdamW(m.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"], foreach=False)
    steps, routes, grads0 = [], [], None
    K = spec["kw"].get("num_experts_per_tok", 0)
    for s in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, STEPS)
        opt.zero_grad()
        loss, ce, aux, rl = obj(m, inp, lab, groups, autocast)
        if spec["moe"]:
            routes.append(routing(rl, K))
        loss.backward()
        if s == 0:
            grads0 = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), OPT["max_norm"], foreach=False)
        opt.step()
        steps.append(dict(step=s + 1, lr=lr_at(s, STEPS), loss=loss.item(), ce_loss=ce.item(),
                          aux_loss=aux.item() if aux is not None else 0.0, grad_norm=float(gn)))
    with torch.no_grad():
        loss, ce, aux, rl = obj(m, inp, lab, groups, autocast)
        if spec["moe"]:
            routes.append(routing(rl, K))
    return dict(steps=steps, routes=routes, grads0=grads0, model=m,
                after=(loss.item(), ce.item(), aux.item() if aux is not None else 0.0))


# PyTorch's own float32 error is measured over several float32 runs, the largest deviation of any of them
# from the float64 run: one plain run, and runs whose initial weights are perturbed by at most one unit in
# the last place (each element times 1 + k * 2^-24, k in {-1, 0, 1} drawn per element: what float32
# rounding of the inputs is) and whose batch rows are permuted (every weight gradient's sum over tokens
# in another order) on 1 or 2 threads. One run is one sample of the rounding: an element whose update
# hangs on rounding (a gradient at float32's noise level, as that of a bias the softmax nearly ignores)
# would otherwise set a tolerance by luck; over these runs such an element's deviation was seen to vary
# sevenfold.
F32_RUNS = [("plain", 0, lambda B: list(range(B)), 2),
            ("weights +-1 ulp (seed 1), rows reversed, 1 thread", 1, lambda B: list(range(B))[::-1], 1),
            ("weights +-1 ulp (seed 2), rows rotated by 1", 2, lambda B: list(range(1, B)) + [0], 2),
            ("weights +-1 ulp (seed 3), rows rotated by 3, 1 thread", 3, lambda B: list(range(3, B)) + list(range(3)), 1),
            ("weights +-1 ulp (seed 4)", 4, lambda B: list(range(B)), 2),
            ("weights +-1 ulp (seed 5), rows reversed", 5, lambda B: list(range(B))[::-1], 2)]


def perturbed(m, ulp_seed):
    """m with every initial weight times 1 + k * 2^-24 (k in {-1, 0, 1} per element); ulp_seed 0: as it is."""
    if ulp_seed:
        g = torch.Generator().manual_seed(ulp_seed)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + torch.randint(-1, 2, p.shape, generator=g).to(p.dtype) * 2.0 ** -24)
    return m


def f32_envelope(spec, seed, obj, inp, lab, groups, ref):
    """The float32 runs against the float64 run ref: per step the largest |loss|, |ce|, |aux|, |grad_norm|
    deviation, per parameter (in-memory names) the largest step-0 gradient and final weight deviation,
    and whether every run routed every token of every step as the float64 run. Also the first run."""
    env = dict(loss=[0.0] * STEPS, ce=[0.0] * STEPS, aux=[0.0] * STEPS, gn=[0.0] * STEPS, grad={}, weight={}, routes_same=True,
               weight_runs=[], loss_runs=[])
    first = None
    fin = dict(ref["model"].named_parameters())
    for desc, ulp_seed, order, threads in F32_RUNS:
        perm = order(inp.shape[0])
        pos = {r: j for j, r in enumerate(perm)}
        torch.set_num_threads(threads)
        run = train(spec, perturbed(build(spec, seed), ulp_seed), obj, inp[perm], lab[perm],
                    [[pos[r] for r in g] for g in groups])
        torch.set_num_threads(2)
        first = first or run
        for k in range(STEPS):
            for key, name in (("loss", "loss"), ("ce", "ce_loss"), ("aux", "aux_loss"), ("gn", "grad_norm")):
                env[key][k] = max(env[key][k], abs(run["steps"][k][name] - ref["steps"][k][name]))
        for n, g in run["grads0"].items():
            env["grad"][n] = torch.maximum(env["grad"].get(n, torch.zeros_like(g, dtype=torch.float64)),
                                           (g.double() - ref["grads0"][n]).abs())
        env["loss_runs"].append(max(abs(run["steps"][k]["loss"] - ref["steps"][k]["loss"]) / abs(ref["steps"][k]["loss"])
                                    for k in range(STEPS)))
        with torch.no_grad():
            w = {n: float((p.double() - fin[n]).abs().max()) for n, p in run["model"].named_parameters()}
            for n, x in w.items():
                env["weight"][n] = max(env["weight"].get(n, 0.0), x)
            env["weight_runs"].append(max(w.values()))
        inv = [perm.index(r) for r in range(inp.shape[0])]
        for a, b in zip(ref["routes"], run["routes"]):
            for x, y in zip(a[0], b[0]):
                y = y.view(inp.shape[0], inp.shape[1], -1)[inv].reshape(x.shape)
                env["routes_same"] = env["routes_same"] and torch.equal(x, y)
    return env, first


def leave_one_out(w):
    """The largest ratio of one run's value to the largest of the other runs'."""
    return max(w[k] / max(w[:k] + w[k + 1:]) for k in range(len(w)))


def spread_summary(recs):
    """PyTorch's own float32 spread over the grid: the largest ratio of one run's final-weight distance to
    the largest of the other runs' (the factor by which PyTorch itself exceeds its own envelope: the tests'
    weight tolerance factor is no larger), for the whole batch and for the MoE configs' 2 micro-batches,
    and how many runs and configs miss a loss to 1e-7."""
    loo, loo_accum, miss, cfg_miss = 0.0, 0.0, 0, 0
    for rec in recs:
        f = rec["f32_run"]
        loo = max(loo, leave_one_out(f["max_abs_weight_diff_per_run"]))
        if "accum" in rec:
            loo_accum = max(loo_accum, leave_one_out(rec["accum"]["f32_run"]["max_abs_weight_diff_per_run"]))
        bad = sum(x > 1e-7 for x in f["max_rel_loss_err_per_run"])
        miss, cfg_miss = miss + bad, cfg_miss + (bad > 0)
    return dict(weight_leave_one_out_max=loo, weight_leave_one_out_max_accum=loo_accum, runs_missing_loss_1e7=miss,
                configs_missing_loss_1e7=cfg_miss, runs=len(F32_RUNS) * len(recs), configs=len(recs))


def envelope_record(m, env, first):
    """The JSON record of an envelope; per-parameter errors in checkpoint names (an expert's tensor: its
    slice of the grouped tensor)."""
    grad = {n: float(v.max()) for n, v in
            revert_weight_conversion(m, {k: v.clone() for k, v in env["grad"].items()}).items()}
    return dict(runs=[r[0] for r in F32_RUNS], steps=first["steps"], loss_err=env["loss"], ce_err=env["ce"],
                aux_err=env["aux"], gn_err=env["gn"], step0_grad_max_abs_err=grad,
                max_abs_weight_diff=max(env["weight"].values()), max_abs_weight_diff_per_run=env["weight_runs"],
                max_rel_loss_err_per_run=env["loss_runs"], routes_same_as_float64=env["routes_same"])


def train_fsdp2_bf16(spec, seed, obj, inp, lab, pert=0):
    """FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) on one rank, the policy of
    fsdp-run's bf16 training: each step the float32 master weights are cast to a bf16 model whose forward
    and backward run in bf16 (transformers' RMSNorm upcasting inside, the cross-entropy of float32
    logits), its gradients cast to float32 for the float32 master weights, clipping and AdamW. pert > 0:
    the initial weights times 1 + k * 2^-9 (k in {-1, 0, 1} per element, seed pert), which moves about
    half of them to the neighbouring bf16 value: what bf16 rounding of the inputs is."""
    master = build(spec, seed)
    if pert:
        g = torch.Generator().manual_seed(pert)
        with torch.no_grad():
            for p in master.parameters():
                p.mul_(1 + torch.randint(-1, 2, p.shape, generator=g).to(p.dtype) * 2.0 ** -9)
    opt = torch.optim.AdamW(master.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"], foreach=False)
    steps = []
    for s in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, STEPS)
        work = copy.deepcopy(master).to(torch.bfloat16)
        loss, ce, aux, _ = obj(work, inp, lab, [list(range(inp.shape[0]))])
        loss.backward()
        for p, q in zip(master.parameters(), work.parameters()):
            p.grad = q.grad.float()
        gn = torch.nn.utils.clip_grad_norm_(master.parameters(), OPT["max_norm"], foreach=False)
        opt.step()
        opt.zero_grad()
        steps.append(dict(step=s + 1, lr=lr_at(s, STEPS), loss=loss.item(), ce_loss=ce.item(),
                          aux_loss=aux.item() if aux is not None else 0.0, grad_norm=float(gn)))
    return steps


def accum_groups(spec):
    """The micro-batches of fsdp-run's gradient accumulation that the grid's tests run: 3 ranks of 2 rows,
    2 micro-batches of 1 row each: micro-batch m is row m of every rank (global rows {m, 2 + m, 4 + m})."""
    return [[0, 2, 4], [1, 3, 5]] if spec["moe"] else None


def attempt(spec, seed):
    """Every run from one weight seed: None (and why) when the routing is not robust or no expert is left
    without tokens where one was asked for."""
    obj = Objective(spec)
    inp, lab = make_batch(spec, seed + 1)
    whole = [list(range(B))]
    res = dict(inp=inp, lab=lab, variants={})
    for v, groups in (("whole", whole), ("accum", accum_groups(spec))):
        if groups is None:
            continue
        ref = train(spec, build(spec, seed).double(), obj, inp, lab, groups)
        env, first = f32_envelope(spec, seed, obj, inp, lab, groups, ref)
        margin = min((r[1] for r in ref["routes"]), default=None)
        if spec["moe"]:
            if margin < MARGIN_MIN:
                return None, f"{v}: routing margin {margin:.2g}"
            if not env["routes_same"]:
                return None, f"{v}: PyTorch's float32 runs route differently"
            if v == "whole" and spec["traits"]["want_empty_expert"] and not any(0 in c for c in ref["routes"][0][2]):
                return None, "no empty expert"
        res["variants"][v] = dict(ref=ref, env=env, first=first, margin=margin, groups=groups)
    res["bf16"] = train(spec, build(spec, seed), obj, inp, lab, whole, autocast=True)
    res["bf16_fsdp2"] = [train_fsdp2_bf16(spec, seed, obj, inp, lab, pert) for pert in range(BF16_PERTURBED + 1)]
    return res, None


def bf16_envelope(ref_steps, runs):
    """Per step the largest |loss|, |ce|, |aux|, |grad_norm| deviation of the bf16 runs from the float64 run."""
    env = {}
    for key in ("loss", "ce_loss", "aux_loss", "grad_norm"):
        env[key] = [max(abs(r[k][key] - ref_steps[k][key]) for r in runs) for k in range(STEPS)]
    return dict(loss_err=env["loss"], ce_err=env["ce_loss"], aux_err=env["aux_loss"], gn_err=env["grad_norm"])


def variant_record(v, var, d, suffix):
    """Writes a variant's step-0 gradients and final weights; its JSON record."""
    ref = var["ref"]
    m = ref["model"]
    save_file(ckpt(m, list(ref["grads0"].items())), os.path.join(d, f"grads_step0{suffix}.safetensors"))
    save_file(ckpt(m, m.named_parameters()), os.path.join(d, f"model_step{STEPS}{suffix}.safetensors"))
    rec = dict(micro_batches=var["groups"], steps=ref["steps"], loss_after=ref["after"][0], ce_loss_after=ref["after"][1],
               aux_loss_after=ref["after"][2], f32_run=envelope_record(m, var["env"], var["first"]))
    if var["margin"] is not None:
        rec["routing"] = dict(min_prob_margin=var["margin"] if var["margin"] != float("inf") else None,
                              step0_expert_counts=ref["routes"][0][2],
                              empty_experts_step0=sum(c.count(0) for c in ref["routes"][0][2]))
    return rec


def run(name, spec, out):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    seed, why = 1000 + zlib.crc32(name.encode()) % 100000, []
    for tries in range(200):
        res, bad = attempt(spec, seed + 7919 * tries)
        if res:
            seed = seed + 7919 * tries
            break
        why.append(bad)
    else:
        raise RuntimeError(f"{name}: no robust seed: {why[-5:]}")
    m = build(spec, seed)
    m.save_pretrained(d, safe_serialization=True)
    saved = load_file(os.path.join(d, "model.safetensors"))
    mine = ckpt(m, m.named_parameters())
    assert mine.keys() == saved.keys() and all(torch.equal(mine[k], saved[k]) for k in saved), "layout check"
    assert m.model.embed_tokens.padding_idx == spec["pad"], (m.model.embed_tokens.padding_idx, spec["pad"])
    inp, lab, pad = res["inp"], res["lab"], spec["pad"]
    save_file({"input_ids": inp.to(torch.int32), "labels": lab.to(torch.int32)}, os.path.join(d, "batch.safetensors"))
    whole = variant_record("whole", res["variants"]["whole"], d, "")
    fin = dict(res["variants"]["whole"]["ref"]["model"].named_parameters())
    with torch.no_grad():
        wbf = max(float((p.double() - fin[n]).abs().max()) for n, p in res["bf16"]["model"].named_parameters())
    rec = dict(name=name, model_type=spec["mod"], arch=spec["cls"], config=spec["kw"], batch=[B, spec["T"]],
               traits=dict(spec["traits"], tied=bool(spec["kw"]["tie_word_embeddings"]),
                           layers=spec["kw"]["num_hidden_layers"], pad_token_id=pad,
                           pad_in_batch=int((inp == pad).sum()) if pad is not None else 0,
                           ignored_labels=int((lab == -100).sum())),
               seed=seed, transformers=transformers.__version__, torch=torch.__version__,
               optimizer=dict(OPT, betas=list(OPT["betas"])), param_names=list(mine.keys()), **whole,
               bf16_autocast_run=dict(steps=res["bf16"]["steps"], max_abs_weight_diff=wbf),
               bf16_fsdp2_run=dict(policy="MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)",
                                   steps=res["bf16_fsdp2"][0]),
               bf16_envelope=dict(runs=["autocast", "fsdp2 policy"] +
                                  [f"fsdp2 policy, weights +-2^-9 (seed {k})" for k in range(1, BF16_PERTURBED + 1)],
                                  **bf16_envelope(whole["steps"], [res["bf16"]["steps"]] + res["bf16_fsdp2"])))
    rec["f32_run_max_abs_weight_diff"] = whole["f32_run"]["max_abs_weight_diff"]
    if "accum" in res["variants"]:
        rec["accum"] = variant_record("accum", res["variants"]["accum"], d, "_accum")
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(rec, f, indent=1)
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)
    print(f"{name}: seed {seed} ({len(why)} redrawn) loss {[round(s['loss'], 6) for s in whole['steps']]} "
          f"f32 envelope {rec['f32_run_max_abs_weight_diff']:.3g} margin {whole.get('routing', {}).get('min_prob_margin')}",
          flush=True)
    return rec


README = """# A grid of small Hugging Face models with transformers' own training runs

Written by transformers {tv} on PyTorch {pv} (CPU) with `tools/gen/gen_hf_grid.py` (read it for the
exact draws, objective and optimizer; `python tools/gen/gen_hf_grid.py tests/data/hf-grid-5.24` writes
it all again: the float64 runs bit for bit but for an element at a float32 rounding boundary, PyTorch's
float32 and bf16 runs as this CPU's kernels compute them, whose errors differ from another CPU's). Never
edit it: where a test disagrees, fsdp-run is wrong. `grid.json` lists
the configs and their traits, and `f32_spread` PyTorch's own float32 spread over them (the largest ratio
of one float32 run's final-weight distance to the farthest of the other runs of its config, for the whole
batch and for a MoE's 2 micro-batches; how many runs and configs miss a loss to 1e-7); each config
directory holds:

| file | what it is |
| --- | --- |
| `config.json`, `model.safetensors`, `generation_config.json` | `save_pretrained`'s output (float32) |
| `batch.safetensors` | `input_ids`, `labels`: int32 [6, T]; labels already the next tokens, -100 ignored |
| `grads_step0.safetensors` | the float64 run's step-0 gradients (stored float32), checkpoint names |
| `model_step3.safetensors` | the float64 run's weights after 3 AdamW steps (stored float32) |
| `grads_step0_accum.safetensors`, `model_step3_accum.safetensors` | (MoE configs) the same for 2 accumulated micro-batches of rows {{0, 2, 4}} and {{1, 3, 5}} (3 ranks of 2 rows, one row each per micro-batch): the load-balancing loss is each micro-batch's, averaged |
| `reference.json` | traits; per step `lr`, `loss`, `ce_loss`, `aux_loss`, `grad_norm` of the float64 run and `loss_after`; `f32_run`: PyTorch's own float32 error, the largest deviation of {nruns} float32 runs (plain, and initial weights perturbed by one ulp with the batch rows permuted) per step (`loss_err`, `ce_err`, `aux_err`, `gn_err`), per checkpoint tensor of the step-0 gradient (`step0_grad_max_abs_err`) and over the final weights (`max_abs_weight_diff`), and of each run alone the final weights' largest distance (`max_abs_weight_diff_per_run`) and the largest relative loss error over the steps (`max_rel_loss_err_per_run`); `bf16_autocast_run`: the same model and optimizer under `torch.autocast("cpu", torch.bfloat16)`; `bf16_fsdp2_run`: FSDP2's `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` on one rank (a bf16 copy of the float32 master weights runs forward and backward, its gradients go back to float32 for clipping and AdamW); `bf16_envelope`: PyTorch's own bf16 error, the largest deviation per step of the autocast run, the FSDP2-policy run and {npert} FSDP2-policy runs from initial weights perturbed by half a bf16 ulp; `accum`: the micro-batch variant's run (MoE); `routing`: the smallest top-k probability gap over every step, tokens per expert at step 0 |

Objective: ce = cross-entropy of the logits over the kept labels (mean over the batch's kept tokens);
a MoE with `output_router_logits` adds `router_aux_loss_coef` times the model module's
`load_balancing_loss_func(router_logits, num_experts, num_experts_per_tok, None)`. transformers
computes RoPE's cos/sin, the routers' softmax and the aux loss in float32 even in a float64 model: the
reference keeps that. AdamW lr 1e-3 (warmup 2, then linear decay to 10%: 5e-4, 1e-3, 1e-3), betas
(0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter, clipping to norm 1.0.
"""


def all_specs():
    specs = {}
    for mt in TYPES:
        rng = random.Random(f"{GRID_SEED}-{mt}")
        for i in range(PER_TYPE):
            specs[f"{mt}_{i:02d}"] = draw_config(mt, i, rng)
    return specs


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write(README.format(tv=transformers.__version__, pv=torch.__version__.split("+")[0], nruns=len(F32_RUNS), npert=BF16_PERTURBED))
    specs = all_specs()
    index, recs = [], []
    for name, spec in specs.items():
        if a.only and name not in a.only:
            continue
        rec = run(name, spec, a.out)
        recs.append(rec)
        index.append(dict(name=name, model_type=spec["mod"], traits=rec["traits"]))
    spread = spread_summary(recs)
    print("PyTorch's own float32 spread:", spread, flush=True)
    if not a.only:
        with open(os.path.join(a.out, "grid.json"), "w") as f:
            json.dump(dict(generator="tools/gen/gen_hf_grid.py", transformers=transformers.__version__,
                           torch=torch.__version__, steps=STEPS, batch_rows=B, f32_spread=spread, configs=index), f,
                      indent=1)
        import safetensors
        with open(os.path.join(a.out, "VERSIONS.txt"), "w") as f:
            f.write(f"transformers {transformers.__version__}\ntorch {torch.__version__}\nsafetensors {safetensors.__version__}\n")
