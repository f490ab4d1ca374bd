"""Training with frozen parameters (PyTorch's requires_grad=False) on configs of the grid of small Hugging Face
models (tests/data/hf-grid-5.24): tests/data/freeze-5.24, what train-steps' `freeze:` must reproduce.

    python tools/gen/gen_freeze_grid.py OUT_DIR [--only NAME ...]

Written with torch 2.11.0 (CPU) and transformers 5.24.0 by tools/gen/gen_hf_grid.py's own model builder, objective
and float32 envelope (imported, not copied), on 12 of its configs: two of each model type (llama, qwen2, qwen3,
qwen3_moe, olmoe, mixtral), tied and untied, 1 to 3 layers, the MoE ones with the load-balancing loss out of the
objective (so that the 3-rank run, whose ranks each route their own rows, has the whole batch's objective).

Per config one to two freeze sets are drawn (seeded by the config's name) from:
  embedding              fsdp-run tok_embeddings.weight            transformers model.embed_tokens.weight
  layer 0                layers.0.*                                model.layers.0.*
  norms                  *norm*                                    *norm*
  attention projections  layers.*.attention.w[qkvo].*              model.layers.*.self_attn.[qkvo]_proj.*
  untied head            output.weight                             lm_head.weight        (untied configs only)
Every parameter matching one is frozen with requires_grad_(False) before the optimizer is built; the optimizer is
the grid's (torch.optim.AdamW over model.parameters(), foreach=False, lr per step, weight decay 0.1) and
clip_grad_norm_(model.parameters(), 1.0): both skip a parameter without a gradient, so a frozen one has no update,
no weight decay, no optimizer state and no part in the norm. A tied model's head is its embedding.

Each config directory holds:
  model_step3.safetensors   the float64 run's weights after 3 steps (stored float32), checkpoint names
  reference.json            the grid config it trains (its model.safetensors, batch.safetensors and config.json are
                            the inputs), the freeze sets in both namings, the checkpoint names of the frozen
                            tensors, the float64 run's per-step lr / loss / grad_norm, and PyTorch's own float32
                            error over gen_hf_grid's F32_RUNS (per step loss_err / gn_err, max_abs_weight_diff)
"""
import argparse
import fnmatch
import json
import os
import random
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_hf_grid as G  # noqa: E402

GRID = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf-grid-5.24")
CONFIGS = ["llama_02", "llama_07", "qwen2_04", "qwen2_11", "qwen3_05", "qwen3_10", "qwen3_moe_04", "qwen3_moe_09",
           "olmoe_04", "olmoe_09", "mixtral_04", "mixtral_09"]
SETS = [("embedding", "tok_embeddings.weight", "model.embed_tokens.weight"),
        ("layer 0", "layers.0.*", "model.layers.0.*"),
        ("norms", "*norm*", "*norm*"),
        ("attention projections", "layers.*.attention.w[qkvo].*", "model.layers.*.self_attn.[qkvo]_proj.*"),
        ("untied head", "output.weight", "lm_head.weight")]


def draw_sets(name, tied):
    rng = random.Random(f"freeze-{name}")
    avail = [s for s in SETS if not (tied and s[0] == "untied head")]
    return rng.sample(avail, 1 + rng.randrange(2))


def frozen(m, globs):
    """m with requires_grad_(False) on every parameter an in-memory name of which matches a glob."""
    hit = 0
    for n, p in m.named_parameters():
        if any(fnmatch.fnmatchcase(n, g) for g in globs):
            p.requires_grad_(False)
            hit += 1
    assert hit, globs
    return m


def train(spec, m, obj, inp, lab, groups, autocast=False):
    """gen_hf_grid.train with frozen parameters: the same steps; a frozen parameter's step-0 gradient is
    recorded as zeros (it has none) so that the envelope's per-parameter records stay whole."""
    opt = torch.optim.AdamW(m.parameters(), lr=G.OPT["lr"], betas=G.OPT["betas"], eps=G.OPT["eps"],
                            weight_decay=G.OPT["weight_decay"], foreach=False)
    steps, routes, grads0 = [], [], None
    K = spec["kw"].get("num_experts_per_tok", 0)
    for s in range(G.STEPS):
        for g in opt.param_groups:
            g["lr"] = G.lr_at(s, G.STEPS)
        opt.zero_grad()
        loss, ce, aux, rl = obj(m, inp, lab, groups, autocast)
        if spec["moe"]:
            routes.append(G.routing(rl, K))
        loss.backward()
        if s == 0:
            grads0 = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                      for n, p in m.named_parameters()}
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), G.OPT["max_norm"], foreach=False)
        opt.step()
        assert all(p not in opt.state for p in m.parameters() if not p.requires_grad), "a frozen parameter got state"
        steps.append(dict(step=s + 1, lr=G.lr_at(s, G.STEPS), loss=loss.item(), ce_loss=ce.item(),
                          aux_loss=aux.item() if aux is not None else 0.0, grad_norm=float(gn)))
    with torch.no_grad():
        loss, ce, aux, rl = obj(m, inp, lab, groups, autocast)
        if spec["moe"]:
            routes.append(G.routing(rl, K))
    return dict(steps=steps, routes=routes, grads0=grads0, model=m,
                after=(loss.item(), ce.item(), aux.item() if aux is not None else 0.0))


def run(name, spec, out):
    grid = json.load(open(os.path.join(GRID, name, "reference.json")))
    assert not grid["traits"].get("aux_in_loss"), f"{name}: the aux loss is in the objective"
    sets = draw_sets(name, bool(spec["kw"]["tie_word_embeddings"]))
    hf_globs = [s[2] for s in sets]
    build0 = G.build
    G.build = lambda spec, seed, dtype=torch.float32: frozen(build0(spec, seed, dtype), hf_globs)
    G.train = train
    try:
        seed = grid["seed"]
        m = G.build(spec, seed)
        init = G.ckpt(m, m.named_parameters())
        saved = load_file(os.path.join(GRID, name, "model.safetensors"))
        assert init.keys() == saved.keys() and all(torch.equal(init[k], saved[k]) for k in saved), "not the grid's model"
        batch = load_file(os.path.join(GRID, name, "batch.safetensors"))
        inp, lab = batch["input_ids"].long(), batch["labels"].long()
        obj, whole = G.Objective(spec), [list(range(G.B))]
        ref = train(spec, G.build(spec, seed).double(), obj, inp, lab, whole)
        env, first = G.f32_envelope(spec, seed, obj, inp, lab, whole, ref)
    finally:
        G.build = build0
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    fin = G.ckpt(ref["model"], ref["model"].named_parameters())
    save_file(fin, os.path.join(d, f"model_step{G.STEPS}.safetensors"))
    frozen_names = sorted(k for k in init if torch.equal(init[k], fin[k]))
    rec = dict(name=name, grid_config=name, model_type=spec["mod"], tied=bool(spec["kw"]["tie_word_embeddings"]),
               layers=spec["kw"]["num_hidden_layers"], freeze=[dict(what=s[0], fsdp=s[1], hf=s[2]) for s in sets],
               frozen_checkpoint_names=frozen_names, trained_checkpoint_names=len(init) - len(frozen_names),
               transformers=transformers.__version__, torch=torch.__version__, steps=ref["steps"],
               f32_run=G.envelope_record(ref["model"], env, first))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(rec, f, indent=1)
    print(f"{name}: freeze {[s[0] for s in sets]}: {len(frozen_names)} of {len(init)} tensors frozen, loss "
          f"{[round(s['loss'], 6) for s in ref['steps']]}, f32 envelope {rec['f32_run']['max_abs_weight_diff']:.3g}",
          flush=True)
    return rec


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(a.out, exist_ok=True)
    specs = G.all_specs()
    index = [run(n, specs[n], a.out) for n in CONFIGS if not a.only or n in a.only]
    if not a.only:
        with open(os.path.join(a.out, "grid.json"), "w") as f:
            json.dump(dict(generator="tools/gen/gen_freeze_grid.py", from_grid="tests/data/hf-grid-5.24",
                           transformers=transformers.__version__, torch=torch.__version__,
                           configs=[dict(name=r["name"], freeze=[s["what"] for s in r["freeze"]]) for r in index]),
                      f, indent=1)
