#!/usr/bin/env python3
"""Tests tools/check_bagel_torch.py itself (by hand, like the checker; not part of CI): writes Bagel
step-0 checkpoints in the three layouts from the fixture's reference (expected/bagel_model.safetensors,
expected/pr240_step0_dcp copied), some good and some broken, runs the checker on each and checks its
exit status and the message that names the fault.

    check_bagel_torch_selftest.py [--worlds 1,2] [--keep DIR] [--only SUBSTRING]

Good: dcp (dcp.save of the reference), pr240 (a copy of pr240_step0_dcp), head (model.safetensors +
ema.safetensors = the reference), each on every --worlds; a dcp whose random: tensors are drawn anew by
their rule, with extra non-tensor entries (train_state.step, lr_scheduler.*); a pr240 copy without
metadata.pt / scheduler.pt; a pr240 DCP with model.* and ema_model.* (+ train_state.step) and no
optimizer entries; a tied-source build (lm_head drawn from normal(0, 0.02)).
Broken (exit 1): a DCP lacking one key; a pr240 DCP without ema_model.*; a head dir whose
model.safetensors lacks a pos_embed; a tensor with one changed value (dcp, and the EMA of a pr240
DCP); a random: tensor off its init rule; a tied build whose lm_head is a copy of embed_tokens.
The fixture is only read. Same env as the checker."""
import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_bagel_torch as cbt   # noqa: E402  (fixture_dir, Reference.rule)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--keep", help="write the cases here and keep them (default: a temp dir, removed)")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    a = ap.parse_args()
    import json
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file, save_file
    fix = cbt.fixture_dir()
    exp = os.path.join(fix, "expected")
    ref = load_file(os.path.join(exp, "bagel_model.safetensors"))
    man = json.load(open(os.path.join(exp, "manifest.json")))["keys"]
    man_tied = json.load(open(os.path.join(exp, "manifest_tied.json")))["keys"]
    root = a.keep or tempfile.mkdtemp(prefix="bagel-torchcheck-")
    os.makedirs(root, exist_ok=True)
    g = torch.Generator().manual_seed(4242)

    def redraw(sd, keys_man):
        """a producer's own draw of every random: tensor, by its manifest rule"""
        out = dict(sd)
        for k, v in keys_man.items():
            if not v["source"].startswith("random:"):
                continue
            kind, s = cbt.Reference.rule(v["source"])
            t = torch.empty(v["shape"])
            if kind == "uniform":
                t.uniform_(-s, s, generator=g)
            else:
                t.normal_(0, s, generator=g)
            out[k] = t
        return out

    def save_dcp(sd, d):
        dcp.save({k: (v.clone() if torch.is_tensor(v) else v) for k, v in sd.items()}, checkpoint_id=d,
                 no_dist=True)

    def head_dir(name, model_sd, ema_sd=None):
        d = os.path.join(root, name, "0000000")
        os.makedirs(d, exist_ok=True)
        save_file(model_sd, os.path.join(d, "model.safetensors"))
        if ema_sd is not None:
            save_file(ema_sd, os.path.join(d, "ema.safetensors"))
        return d

    P = lambda n: os.path.join(root, n)   # noqa: E731
    changed = {k: v.clone() for k, v in ref.items()}
    changed["language_model.model.layers.1.mlp.up_proj.weight"][3, 5] += 1e-3
    off_rule = dict(ref)
    off_rule["vae2llm.weight"] = ref["vae2llm.weight"] * 0.5          # inside the bound, std half
    tied = redraw(ref, man_tied)
    tied_copy = dict(tied)
    tied_copy["language_model.lm_head.weight"] = ref["language_model.model.embed_tokens.weight"].clone()
    extras = dict(redraw(ref, man))
    extras.update({"train_state.step": 0, "lr_scheduler.last_epoch": 0, "lr_scheduler._step_count": 1})

    def make_pr240_copy(name, drop=()):
        d = P(name)
        shutil.copytree(os.path.join(exp, "pr240_step0_dcp"), d)
        for f in drop:
            os.remove(os.path.join(d, f))
        for dirpath, dirs, files in os.walk(d):   # the copy is writable; the fixture is untouched
            os.chmod(dirpath, 0o755)
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o644)
        return d

    print(f"writing the cases under {root}", flush=True)
    writers = {
        "dcp_good": lambda: (save_dcp(ref, P("dcp_good")), P("dcp_good"))[1],
        "dcp_redrawn_with_extras": lambda: (save_dcp(extras, P("dcp_redrawn_with_extras")),
                                            P("dcp_redrawn_with_extras"))[1],
        "dcp_tied": lambda: (save_dcp(tied, P("dcp_tied")), P("dcp_tied"))[1],
        "pr240_good": lambda: make_pr240_copy("pr240_good"),
        "pr240_no_pt_files": lambda: make_pr240_copy("pr240_no_pt_files", ("metadata.pt", "scheduler.pt")),
        "pr240_model_and_ema_only": lambda: (save_dcp({**{"model." + k: v for k, v in ref.items()},
                                                       **{"ema_model." + k: v for k, v in ref.items()},
                                                       "train_state.step": 0},
                                                      P("pr240_model_and_ema_only")), P("pr240_model_and_ema_only"))[1],
        "head_good": lambda: head_dir("head_good", ref, ref),
        "dcp_missing_key": lambda: (save_dcp({k: v for k, v in ref.items() if k != "connector.fc2.bias"},
                                             P("dcp_missing_key")), P("dcp_missing_key"))[1],
        "pr240_no_ema": lambda: (save_dcp({"model." + k: v for k, v in ref.items()}, P("pr240_no_ema")),
                                 P("pr240_no_ema"))[1],
        "head_no_pos_embed": lambda: head_dir("head_no_pos_embed",
                                              {k: v for k, v in ref.items() if k != "vit_pos_embed.pos_embed"}, ref),
        "dcp_one_value_changed": lambda: (save_dcp(changed, P("dcp_one_value_changed")),
                                          P("dcp_one_value_changed"))[1],
        "pr240_ema_one_value_changed": lambda: (save_dcp({**{"model." + k: v for k, v in ref.items()},
                                                          **{"ema_model." + k: v for k, v in changed.items()}},
                                                         P("pr240_ema_one_value_changed")),
                                                P("pr240_ema_one_value_changed"))[1],
        "dcp_random_off_rule": lambda: (save_dcp(off_rule, P("dcp_random_off_rule")), P("dcp_random_off_rule"))[1],
        "dcp_tied_lm_head_copied": lambda: (save_dcp(tied_copy, P("dcp_tied_lm_head_copied")),
                                            P("dcp_tied_lm_head_copied"))[1],
    }
    worlds = [int(w) for w in a.worlds.split(",")]
    # (case, layout, extra args, worlds, want exit, substrings the output must hold)
    cases = [(f"{n}", lay, [], worlds, 0, ["checks pass"]) for n, lay in
             (("dcp_good", "dcp"), ("pr240_good", "pr240"), ("head_good", "head"))]
    cases += [
        ("dcp_redrawn_with_extras", "dcp", [], [2], 0, ["INFO the DCP also holds 3 entries"]),
        ("dcp_tied", "dcp", ["--tied"], [2], 0, ["PASS dcp FSDP2 x2: tied source: lm_head is not a copy"]),
        ("pr240_no_pt_files", "pr240", [], [2], 0, ["INFO load_checkpoint warned: metadata.pt not found",
                                                     "PASS pr240 resume: returned train_step == 0 (data_status None)"]),
        ("pr240_model_and_ema_only", "pr240", [], [2], 0, ["resume_model_only=False is not tried",
                                                            "INFO the DCP also holds 1 entries"]),
        ("dcp_missing_key", "dcp", [], [2], 1, ["FAIL dcp: strict dcp.load",
                                               "Missing key in checkpoint state_dict: connector.fc2.bias"]),
        ("pr240_no_ema", "pr240", [], [2], 1, ["FAIL pr240: load_checkpoint(model, ema_model, resume_model_only=True)",
                                              "Missing key in checkpoint state_dict: ema_model."]),
        ("head_no_pos_embed", "head", [], [2], 1, ["FAIL head: FSDPCheckpoint.try_load_ckpt",
                                                   "KeyError: 'vit_pos_embed.pos_embed'"]),
        ("dcp_one_value_changed", "dcp", [], [2], 1, [
            "FAIL dcp FSDP2 x2: the 129 non-random tensors bit-equal to the reference: 1 differ: "
            "['language_model.model.layers.1.mlp.up_proj.weight (1 of 4608 values differ"]),
        ("pr240_ema_one_value_changed", "pr240", [], [2], 1, [
            "FAIL pr240 resume_model_only=True FSDP2 x2: EMA bit-equal to the model (139 tensors): 1 tensors differ"]),
        ("dcp_random_off_rule", "dcp", [], [2], 1, ["FAIL dcp FSDP2 x2: the 10 random: tensors follow their init "
                                                   "rule (bound, std, mean): 1 off their init rule: ['vae2llm.weight: std"]),
        ("dcp_tied_lm_head_copied", "dcp", ["--tied"], [2], 1, [
            "FAIL dcp FSDP2 x2: tied source: lm_head is not a copy of embed_tokens"]),
    ]
    cases = [c for c in cases if a.only in c[0]]
    made = {}
    npass = nfail = 0
    for name, layout, extra, ws, want_rc, want in cases:
        if name not in made:
            made[name] = writers[name]()
        for w in ws:
            cmd = [sys.executable, os.path.join(HERE, "check_bagel_torch.py"), "--layout", layout,
                   "--out", made[name], "--world", str(w)] + extra
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            dt = time.time() - t0
            out = p.stdout
            miss = [s for s in want if s not in out]
            ok = p.returncode == want_rc and not miss
            last = out.strip().splitlines()[-1] if out.strip() else "(no output)"
            print(f"{'PASS' if ok else 'FAIL'} {name} --layout {layout} --world {w} {' '.join(extra)}: exit "
                  f"{p.returncode} (want {want_rc}), {last!r}, {dt:.0f} s", flush=True)
            if want_rc:
                for line in out.splitlines():
                    if line.startswith("FAIL"):
                        print("     | " + line[:300])
            if not ok:
                nfail += 1
                if miss:
                    print(f"     missing from the output: {miss}")
                print("     | " + "\n     | ".join((out + p.stderr).strip().splitlines()[-40:]))
            else:
                npass += 1
    if not a.keep:
        shutil.rmtree(root)
    print(f"{npass} passed, {nfail} failed")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
