#!/usr/bin/env python3
"""Resumes a DCP that fsdp-run saved after train-steps in PyTorch, strictly, with the code of the
README's "Resuming an fsdp-run run in PyTorch" section, and checks what PyTorch ends up holding.

    python3 tools/check_resume_torch.py CKPT_DIR --lr PEAK --warmup W --steps N [--decay linear|cosine|none]
            [--min-lr-ratio R] [--betas B1 B2] [--eps E] [--weight-decay WD]

1. a module tree with a parameter at every model key of the checkpoint (names, shapes, dtypes from its
   .metadata), torch.optim.AdamW with the recipe's hyper-parameters, LambdaLR with fsdp-run's schedule
   (train/lr_schedule.c: linear warmup, then linear / cosine decay to R * PEAK);
2. the README snippet: get_state_dict (flattened), the lr_scheduler.* and train_state.step keys,
   dcp.load (strict: the default DefaultLoadPlanner fails on a key the checkpoint lacks), set_state_dict,
   sched.load_state_dict;
3. checks: every parameter and AdamW moment equals the checkpoint's tensor bit for bit (read back with a
   plain dcp.load into a state dict of empty tensors), the optimizer's step, every param-group option,
   the scheduler's last_epoch, and that sched.step() after one more optimizer step gives the lr
   fsdp-run's schedule gives for the step after that;
4. one AdamW step in PyTorch with a given gradient (--grad-seed: a reproducible random gradient per
   parameter) against the same update written out by hand in float64 from the checkpoint's own
   moments, lr, betas, eps, weight decay and step: shows that what PyTorch resumed is the state the
   update needs (AdamW's decoupled weight decay, bias corrections with the restored step).
Not part of the build or the tests (PyTorch is not a dependency of fsdp-run)."""
import argparse
import math
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_dcp_torch import build_module  # noqa: E402  (a module tree with a parameter at every name)

TRAINING = ("optimizer.", "train_state.", "lr_scheduler.", "dataloader.")


def model_specs(ckpt):
    md = dcp.FileSystemReader(ckpt).read_metadata()
    out = []
    for key, m in md.state_dict_metadata.items():
        if hasattr(m, "size") and not key.startswith(TRAINING):
            out.append((key, tuple(m.size), m.properties.dtype))
    return out, md


def fsdp_run_lr_factor(a):
    """fsdp-run's lrs_at(step) / PEAK (train/lr_schedule.c), as a LambdaLR lambda of the step."""
    def f(s):
        s = max(s, 0)
        if s < a.warmup:
            return (s + 1) / a.warmup
        if a.decay == "none":
            return 1.0
        span = a.steps - a.warmup if a.steps - a.warmup > 1 else 1
        p = min((s - a.warmup) / span, 1.0)
        r = a.min_lr_ratio
        if a.decay == "linear":
            return 1.0 - (1.0 - r) * p
        return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * p))
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--steps", type=int, required=True, help="the schedule's total steps (train-steps' steps)")
    ap.add_argument("--decay", default="none", choices=["none", "linear", "cosine"])
    ap.add_argument("--min-lr-ratio", type=float, default=0.0)
    ap.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.95))
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-seed", type=int, default=0)
    ap.add_argument("--after", help="fsdp-run's checkpoint one train step later (a load-ckpt + train-steps run)")
    ap.add_argument("--step-lr", type=float, help="the lr fsdp-run used for that step (its log's lr; default: the "
                    "resumed group's lr)")
    a = ap.parse_args()

    specs, md = model_specs(a.ckpt)
    model = build_module(specs)
    peak_lr = a.lr
    lr_lambda = fsdp_run_lr_factor(a)

    # ---- the README snippet, verbatim but for the checkpoint path ----
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=tuple(a.betas), eps=a.eps,
                            weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)   # the same warmup/decay as the recipe
    opts = StateDictOptions(flatten_optimizer_state_dict=True)
    msd, osd = get_state_dict(model, opt, options=opts)
    ssd = sched.state_dict()
    state = {**msd, "optimizer": osd, "lr_scheduler": ssd, "train_state": {"step": 0}}
    dcp.load(state, checkpoint_id=a.ckpt)   # strict: every key above is there
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd, options=opts)
    sched.load_state_dict({**sched.state_dict(), **ssd})
    step = state["train_state"]["step"]
    # ---- end of the snippet ----

    bad = 0

    def fail(msg):
        nonlocal bad
        bad += 1
        print("FAIL:", msg)

    # the checkpoint's own tensors, read plainly
    plain = {}
    for key, m in md.state_dict_metadata.items():
        if hasattr(m, "size"):
            plain[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
    dcp.load(plain, checkpoint_id=a.ckpt)
    named = dict(model.named_parameters())
    for name, p in named.items():
        if not torch.equal(p.detach(), plain[name]):
            fail(f"parameter {name} differs from the checkpoint")
        st = opt.state[p]
        for k in ("exp_avg", "exp_avg_sq"):
            if not torch.equal(st[k], plain[f"optimizer.state.{name}.{k}"]):
                fail(f"{k} of {name} differs from the checkpoint")
        if float(st["step"]) != float(plain[f"optimizer.state.{name}.step"]):
            fail(f"step of {name}: {float(st['step'])}")
    if step != int(plain.get("train_state.step", step)) and not isinstance(step, int):
        fail(f"train_state.step {step}")
    g = opt.param_groups[0]
    want_next = peak_lr * lr_lambda(step)
    print(f"resumed: {len(named)} parameters, train_state.step {step}, optimizer step "
          f"{float(next(iter(opt.state.values()))['step']):.0f}, group lr {g['lr']!r} (fsdp-run's next {want_next!r}), "
          f"initial_lr {g['initial_lr']!r}, betas {g['betas']}, eps {g['eps']}, weight_decay {g['weight_decay']}, "
          f"sched.last_epoch {sched.last_epoch}")
    if abs(g["lr"] - want_next) > 1e-15 * max(1.0, want_next):
        fail(f"lr {g['lr']} is not the schedule's next {want_next}")
    if sched.last_epoch != step:
        fail(f"sched.last_epoch {sched.last_epoch} != step {step}")
    for k, v in (("betas", tuple(a.betas)), ("eps", a.eps), ("weight_decay", a.weight_decay), ("initial_lr", peak_lr),
                 ("amsgrad", False), ("maximize", False), ("decoupled_weight_decay", True)):
        if g[k] != v:
            fail(f"param group {k} = {g[k]!r}, expected {v!r}")

    # one more step: PyTorch's AdamW against fsdp-run's next step (--after: its gradient recovered from
    # its moments, g = (m' - b1 m) / (1 - b1)), else against the update written out in float64
    b1, b2 = a.betas
    before = {n: p.detach().clone() for n, p in named.items()}
    m0 = {n: opt.state[p]["exp_avg"].clone() for n, p in named.items()}
    v0 = {n: opt.state[p]["exp_avg_sq"].clone() for n, p in named.items()}
    t = float(next(iter(opt.state.values()))["step"]) + 1
    after = None
    if a.after:
        after = {}
        for key, m in dcp.FileSystemReader(a.after).read_metadata().state_dict_metadata.items():
            if hasattr(m, "size"):
                after[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        dcp.load(after, checkpoint_id=a.after)
        grads = {n: (after[f"optimizer.state.{n}.exp_avg"].double() - b1 * m0[n].double()) / (1 - b1)
                 for n in named}
    else:
        gen = torch.Generator().manual_seed(a.grad_seed)
        grads = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) * 1e-2 for n, p in named.items()}
    for n, p in named.items():
        p.grad = grads[n].to(p.dtype)
    if a.step_lr is not None:
        for grp in opt.param_groups:
            grp["lr"] = a.step_lr
    lr = g["lr"]
    opt.step()
    worst_ulp, worst_rel, worst_m = 0.0, 0.0, 0.0
    for n, p in named.items():
        if after is not None:
            ref = after[n].double()
            worst_m = max(worst_m, (opt.state[p]["exp_avg_sq"].double() - after[f"optimizer.state.{n}.exp_avg_sq"].double())
                          .abs().max().item() / max(after[f"optimizer.state.{n}.exp_avg_sq"].double().abs().max().item(), 1e-30))
        else:
            gr = grads[n]
            m = b1 * m0[n].double() + (1 - b1) * gr
            v = b2 * v0[n].double() + (1 - b2) * gr * gr
            ref = before[n].double() * (1 - lr * a.weight_decay)
            ref = ref - lr / (1 - b1 ** t) * m / ((v / (1 - b2 ** t)).sqrt() + a.eps)
        d = (p.detach().double() - ref).abs()
        # a float32 ulp of the larger of the parameter and its update (the update itself is float32)
        ulp = torch.maximum(ref.abs(), (before[n].double() - ref).abs()).clamp_min(1e-30) * 2.0 ** -23
        if after is not None:
            # the gradient recovered from float32 moments carries their rounding: where 0.9 m and 0.1 g
            # cancel, exp_avg differs by ulps of 0.9 |m|, which the update scales by lr / bc1 / denom;
            # that much difference is explained by the recovery, not by the step
            st = opt.state[p]
            dm = (st["exp_avg"].double() - after[f"optimizer.state.{n}.exp_avg"].double()).abs()
            dm = torch.maximum(dm, b1 * m0[n].double().abs() * 2.0 ** -23)
            denom = (st["exp_avg_sq"].double() / (1 - b2 ** t)).sqrt() + a.eps
            ulp = ulp + lr / (1 - b1 ** t) * dm / denom
        worst_ulp = max(worst_ulp, (d / ulp).max().item())
        upd = (before[n].double() - ref).abs().max().item()
        worst_rel = max(worst_rel, d.max().item() / upd if upd > 0 else 0.0)
    what = f"fsdp-run's step {t:.0f} ({a.after})" if after is not None else "the float64 AdamW update"
    print(f"one more step in PyTorch (lr {lr!r}, step {t:.0f}) vs {what}: max diff {worst_ulp:.2f} float32 ulps (of "
          f"max(|parameter|, |update|)" + (", plus the moment recovery's rounding" if after is not None else "") + "), "
          f" {worst_rel:.3g} of the largest update" +
          (f"; exp_avg_sq max rel diff {worst_m:.3g}" if after is not None else ""))
    if worst_ulp > 4:
        fail("the AdamW step after the resume differs by more than float32 noise")
    sched.step()
    want_after = peak_lr * lr_lambda(step + 1)
    if abs(g["lr"] - want_after) > 1e-12 * max(1.0, want_after):
        fail(f"after sched.step() lr {g['lr']!r}, fsdp-run's schedule says {want_after!r}")
    else:
        print(f"after sched.step(): lr {g['lr']!r} = fsdp-run's lr for step {step + 1}")
    print("OK: PyTorch resumed the checkpoint strictly" if not bad else f"{bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
