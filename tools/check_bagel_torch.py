#!/usr/bin/env python3
"""Loads a Bagel step-0 checkpoint made by another tool (fsdp-run's Bagel bootstrap) with ByteDance's
own Bagel code and PyTorch, on the load path of the chosen layout, and checks what Bagel ends up
holding against the fixture ../shared/fixtures/bagel-056b5fd (expected/bagel_model.safetensors and
expected/manifest.json). By hand only: not part of the build, CI or the tests (PyTorch and Bagel are
not dependencies of fsdp-run). tools/check_bagel_torch.sh sets up the environment and runs this.

    check_bagel_torch.py --layout {dcp,pr240,head} --out DIR [--llm SRC_LLM_DIR] [--vit SRC_VIT_DIR]
                         [--world N] [--tied]

The model is Bagel as train/pretrain_unified_navit.py builds it (the fixture's gen/common.py
build_bagel, imported from the fixture by path), from the configs of --llm/--vit only
(pretrained=False: the skeleton, its own random values), then:

  dcp    DIR is a plain DCP with Bagel's state_dict() keys: strict dcp.load(model.state_dict()) +
         load_state_dict(strict=True) into an unsharded model (one process), and the same with the model
         FSDP2-sharded (gen/common.py fsdp_v2_shard_cpu: every decoder layer, time_embedder,
         latent_pos_embed, the root) on N CPU gloo ranks.
  pr240  DIR is a step directory of PR #240's save_checkpoint: strict plain dcp.load({"model", "ema_model"})
         into unsharded models; PR #240 load_checkpoint(model, ema_model, DIR, logger,
         resume_model_only=True) with both FSDP2-sharded on N ranks; and, when the DCP holds
         optimizer.param_groups.* entries, resume_model_only=False with Bagel's AdamW + constant-warmup
         scheduler: train_step 0, initial_lr 1e-4, lr 0.0, scheduler last_epoch 0.
  head   DIR holds model.safetensors (+ ema.safetensors): Bagel HEAD FSDPCheckpoint.try_load_ckpt(DIR,
         logger, model, ema_model, resume_from_ema=False) on an unwrapped model + EMA (as the training
         script does, on every rank), with the logged load results checked (missing exactly the two
         popped pos_embeds, nothing unexpected), then HEAD's fsdp_wrapper (FSDP1, CPU) on N ranks and the
         FULL_STATE_DICT compared; plus the files' own tensors (the popped pos_embeds included).

After each load every tensor (DTensors as full_tensor()) is compared with the reference: the key set,
float32, the shapes; every key whose manifest source is not random:... bit-equal; every random: key
within its init rule (U(-b, b): |x| <= b, std ~ b/sqrt(3), mean ~ 0; normal(0, s): std ~ s, mean ~ 0)
and equal to the value stored in the checkpoint (so it was loaded, not left at the skeleton's own
init); the EMA bit-equal to the model. --tied: sources/llm_tied and expected/manifest_tied.json; the
untied reference for every key except the random: ones (lm_head among them, normal(0, 0.02)), and
lm_head must not equal embed_tokens.

One PASS/FAIL line per check (INFO lines are facts, not checks), "N/M checks pass" last; exit 1 when
any fails, 2 on a usage or environment error.

env: BAGEL_SRC (Bagel at 056b5fd), PR240_CHECKPOINT_PY (PR #240's train/checkpoint.py, for pr240),
BAGEL_FIXTURE (default $FSDP_FIXTURES/bagel-056b5fd, FSDP_FIXTURES default ../shared/fixtures from the
repository root); Bagel's pinned transformers 4.49 etc. on PYTHONPATH.
"""
import argparse
import copy
import importlib.util
import json
import logging
import math
import os
import re
import socket
import sys
import tempfile
import warnings
from datetime import timedelta

sys.dont_write_bytecode = True          # never leave __pycache__ in the (read-only) fixture's gen/
HERE = os.path.dirname(os.path.abspath(__file__))
POS_EMBEDS = ["latent_pos_embed.pos_embed", "vit_pos_embed.pos_embed"]


def fixture_dir():
    if os.environ.get("BAGEL_FIXTURE"):
        return os.path.abspath(os.environ["BAGEL_FIXTURE"])
    base = os.environ.get("FSDP_FIXTURES") or os.path.join(HERE, "..", "..", "shared", "fixtures")
    return os.path.abspath(os.path.join(base, "bagel-056b5fd"))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", required=True, choices=["dcp", "pr240", "head"])
    ap.add_argument("--out", required=True, help="the checkpoint: DCP dir (dcp), step dir (pr240), "
                    "dir with model.safetensors (head)")
    ap.add_argument("--llm", help="LLM source dir the producer used (default: the fixture's "
                    "sources/llm, or sources/llm_tied with --tied)")
    ap.add_argument("--vit", help="ViT source dir (default: the fixture's sources/vit)")
    ap.add_argument("--world", type=int, default=2, help="CPU gloo ranks for the sharded loads (default 2)")
    ap.add_argument("--tied", action="store_true", help="the build from sources/llm_tied")
    ap.add_argument("-v", "--verbose", action="store_true", help="show Bagel's log lines and warnings")
    a = ap.parse_args(argv)
    fix = fixture_dir()
    a.fixture = fix
    a.llm = os.path.abspath(a.llm or os.path.join(fix, "sources", "llm_tied" if a.tied else "llm"))
    a.vit = os.path.abspath(a.vit or os.path.join(fix, "sources", "vit"))
    a.out = os.path.abspath(a.out)
    a.ref = os.path.join(fix, "expected", "bagel_model.safetensors")
    a.manifest = os.path.join(fix, "expected", "manifest_tied.json" if a.tied else "manifest.json")
    errs = []
    if a.world < 1:
        errs.append("--world must be >= 1")
    for what, p in (("fixture", os.path.join(fix, "gen", "common.py")), ("reference", a.ref),
                    ("manifest", a.manifest), ("--llm", os.path.join(a.llm, "config.json")),
                    ("--vit", os.path.join(a.vit, "config.json")), ("--out", a.out)):
        if not os.path.exists(p):
            errs.append(f"{what}: {p} not found")
    if not os.environ.get("BAGEL_SRC") or not os.path.isdir(os.path.join(os.environ["BAGEL_SRC"], "modeling")):
        errs.append("BAGEL_SRC must name a checkout of ByteDance-Seed/Bagel at 056b5fd")
    if a.layout == "pr240" and not os.path.isfile(os.environ.get("PR240_CHECKPOINT_PY", "")):
        errs.append("PR240_CHECKPOINT_PY must name PR #240's train/checkpoint.py")
    if errs:
        for e in errs:
            print("error: " + e, file=sys.stderr)
        sys.exit(2)
    return a


# ------------------------------------------------------------------ environment (per process)
def quiet(verbose):
    if not verbose:
        warnings.filterwarnings("ignore")
        for n in ("torch", "torch.distributed", "transformers"):
            logging.getLogger(n).setLevel(logging.ERROR)
        try:
            import transformers
            transformers.logging.set_verbosity_error()
        except Exception:
            pass


_common = None


def common(a):
    """the fixture's gen/common.py, imported by path (it adds gen/stubs and BAGEL_SRC to sys.path)"""
    global _common
    if _common is None:
        os.environ["FIXTURE_DIR"] = a.fixture
        spec = importlib.util.spec_from_file_location("bagel_fixture_common",
                                                      os.path.join(a.fixture, "gen", "common.py"))
        _common = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_common)
    return _common


def pr240_module():
    spec = importlib.util.spec_from_file_location("bagel_pr240_checkpoint", os.environ["PR240_CHECKPOINT_PY"])
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def fresh(a):
    """the skeleton: Bagel from the configs only, random values (another seed than the fixture's build)"""
    return common(a).build_bagel(llm_dir=a.llm, vit_dir=a.vit, pretrained=False, seed=12345)


def fresh_pair(a):
    """model + EMA the way the training script makes them: deepcopy before loading, EMA frozen"""
    m = fresh(a)
    e = copy.deepcopy(m)
    for p in e.parameters():
        p.requires_grad = False
    return m, e


class Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, rec):
        self.records.append(rec)


def capture_logger(name, verbose):
    lg = logging.getLogger(name)
    lg.handlers.clear()
    cap = Capture()
    lg.addHandler(cap)
    if verbose:
        lg.addHandler(logging.StreamHandler(sys.stdout))
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    return lg, cap


# ------------------------------------------------------------------ reporting
class Report:
    def __init__(self, show=True):
        self.results = []      # (ok, line)
        self.show = show

    def check(self, name, ok, info=""):
        line = ("PASS " if ok else "FAIL ") + name + (f": {info}" if info else "")
        self.results.append((bool(ok), line))
        if self.show:
            print(line, flush=True)

    def info(self, text):
        if self.show:
            print("INFO " + text, flush=True)

    def run(self, name, fn):
        """fn() -> None/True (pass), str (fail), or raises (fail)."""
        try:
            r = fn()
        except BaseException as e:      # DCP's CheckpointException is a BaseException
            if isinstance(e, KeyboardInterrupt):
                raise
            r = describe(e)
        self.check(name, r is None or r is True, "" if r in (None, True) else str(r))
        return r is None or r is True


def describe(e):
    """one line: the exception, or for DCP's CheckpointException (per-rank tracebacks) the last line
    naming the exception a rank raised"""
    text = str(e).strip()
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    named = [l for l in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", l)]
    if len(lines) > 1 and named:
        text = named[-1]
    elif lines:
        text = lines[0]
    return f"{type(e).__name__}: {text[:400]}"


# ------------------------------------------------------------------ the reference and the rules
class Reference:
    def __init__(self, a):
        from safetensors.torch import load_file
        self.tied = a.tied
        self.ref = load_file(a.ref)
        man = json.load(open(a.manifest))
        self.keys = man["keys"]
        self.order = list(self.keys)
        self.random = {k: v["source"] for k, v in self.keys.items() if v["source"].startswith("random:")}

    @staticmethod
    def rule(source):
        """('uniform', bound) or ('normal', std) from a manifest random: source text"""
        m = re.search(r"bound=([0-9.eE+-]+)", source)
        if "U(" in source and m:
            return "uniform", float(m.group(1))
        m = re.search(r"normal\(mean=0, std=(?:initializer_range=)?([0-9.eE+-]+)", source)
        if m:
            return "normal", float(m.group(1))
        return None, None

    def rule_violation(self, k, t):
        """None when t follows the random: init rule of key k, else why not"""
        import torch
        kind, s = self.rule(self.random[k])
        if kind is None:
            return f"{k}: no rule understood in {self.random[k]!r}"
        x = t.detach().double().flatten()
        n = x.numel()
        std, mean, mx = x.std().item(), x.mean().item(), x.abs().max().item()
        if not torch.isfinite(x).all():
            return f"{k}: non-finite values"
        if kind == "uniform":
            want = s / math.sqrt(3)
            rel = 5 * 0.4472 / math.sqrt(n)    # sd of a sample std of U(-b, b) is ~0.447 sigma/sqrt(n)
            if mx > s * (1 + 1e-6):
                return f"{k}: max |x| {mx:.6g} > bound {s:.6g}"
        else:
            want = s
            rel = 5 * 0.7071 / math.sqrt(n)    # normal: ~sigma/sqrt(2n)
        if abs(std / want - 1) > rel:
            return f"{k}: std {std:.6g}, want {want:.6g} +- {100 * rel:.1f}% ({kind}, n={n})"
        if abs(mean) > 5 * want / math.sqrt(n):
            return f"{k}: mean {mean:.6g}, want 0 +- {5 * want / math.sqrt(n):.3g} (n={n})"
        return None

    def verify(self, rep, what, sd, stored=None):
        """Checks of one loaded state (a dict of plain full tensors) against the reference."""
        import torch
        rep.run(f"{what}: keys == the reference's {len(self.order)}", lambda: (
            True if set(sd) == set(self.order) else
            f"missing {sorted(set(self.order) - set(sd))[:6]} extra {sorted(set(sd) - set(self.order))[:6]}"))
        common_keys = [k for k in self.order if k in sd]

        def dtypes():
            bad = [f"{k} {sd[k].dtype} {tuple(sd[k].shape)} (want float32 {tuple(self.keys[k]['shape'])})"
                   for k in common_keys if sd[k].dtype != torch.float32
                   or list(sd[k].shape) != self.keys[k]["shape"] or list(sd[k].shape) != list(self.ref[k].shape)]
            return f"{len(bad)} differ, e.g. {bad[:4]}" if bad else True
        rep.run(f"{what}: every tensor float32 with the reference's shape", dtypes)

        exact = [k for k in common_keys if k not in self.random]

        def bitwise():
            bad = []
            for k in exact:
                t, r = sd[k].detach().cpu(), self.ref[k]
                if t.dtype != r.dtype or t.shape != r.shape or not torch.equal(t, r):
                    if t.shape == r.shape:
                        d = (t.double() - r.double()).abs()
                        bad.append(f"{k} ({int((d != 0).sum())} of {r.numel()} values differ, max |diff| "
                                   f"{d.max().item():.3g})")
                    else:
                        bad.append(f"{k} (shape {tuple(t.shape)})")
            return f"{len(bad)} differ: {bad[:4]}" if bad else True
        rep.run(f"{what}: the {len(exact)} non-random tensors bit-equal to the reference", bitwise)

        rnd = [k for k in common_keys if k in self.random]

        def rules():
            bad = [v for v in (self.rule_violation(k, sd[k]) for k in rnd) if v]
            return f"{len(bad)} off their init rule: {bad[:3]}" if bad else True
        rep.run(f"{what}: the {len(rnd)} random: tensors follow their init rule (bound, std, mean)", rules)

        if stored is not None:
            def loaded():
                miss = [k for k in rnd if k not in stored]
                bad = [k for k in rnd if k in stored and not torch.equal(sd[k].detach().cpu(), stored[k])]
                if miss or bad:
                    return f"not in the checkpoint {miss[:4]}; differ from the stored value {bad[:4]}"
                return True
            rep.run(f"{what}: the random: tensors are the checkpoint's stored values (loaded)", loaded)

        if self.tied:
            def lm_head():
                lm, emb = sd.get("language_model.lm_head.weight"), sd.get("language_model.model.embed_tokens.weight")
                if lm is None or emb is None:
                    return "lm_head or embed_tokens absent"
                if torch.equal(lm, emb):
                    return "lm_head.weight equals embed_tokens.weight (Bagel draws it fresh: normal(0, 0.02))"
                return True
            rep.run(f"{what}: tied source: lm_head is not a copy of embed_tokens", lm_head)

    @staticmethod
    def ema_equal(rep, what, sd, esd):
        import torch

        def f():
            if set(sd) != set(esd):
                return f"key sets differ: {sorted(set(sd) ^ set(esd))[:6]}"
            bad = [k for k in sd if sd[k].dtype != esd[k].dtype or not torch.equal(sd[k], esd[k])]
            return f"{len(bad)} tensors differ: {bad[:4]}" if bad else True
        rep.run(f"{what}: EMA bit-equal to the model ({len(sd)} tensors)", f)


def full_state(module):
    """state_dict() with every DTensor gathered (collective: every rank must call it)"""
    from torch.distributed.tensor import DTensor
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in module.state_dict().items()}


# ------------------------------------------------------------------ the checkpoint's own contents
def dcp_entries(path):
    """{key: metadata} of a DCP's .metadata"""
    import torch.distributed.checkpoint as dcp
    return dict(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)


def dcp_read(path, keys, md):
    """plain read of some tensor entries (no process group, no planner strictness beyond these keys)"""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    sd = {k: torch.empty(tuple(md[k].size), dtype=md[k].properties.dtype) for k in keys
          if isinstance(md.get(k), TensorStorageMetadata)}
    if sd:
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    return sd


def unflatten(flat, prefix):
    return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def describe_extras(rep, md, wanted):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    extra = sorted(k for k in md if k not in wanted)
    if extra:
        t = [k for k in extra if isinstance(md[k], TensorStorageMetadata)]
        o = [k for k in extra if not isinstance(md[k], TensorStorageMetadata)]
        rep.info(f"the DCP also holds {len(extra)} entries this load path does not read "
                 f"({len(t)} tensors {t[:4]}, {len(o)} non-tensor {o[:6]}); dcp.load ignores them")


# ------------------------------------------------------------------ unsharded loads (this process)
def unsharded(a, ref, rep):
    import torch
    import torch.distributed.checkpoint as dcp
    stored = {}
    if a.layout == "dcp":
        md = dcp_entries(a.out)
        describe_extras(rep, md, set(ref.order))
        stored = dcp_read(a.out, ref.random, md)

        def load():
            m = fresh(a)
            sd = m.state_dict()
            dcp.load(sd, checkpoint_id=a.out, no_dist=True)      # DefaultLoadPlanner: every key must exist
            m.load_state_dict(sd, strict=True)
            box["m"] = m
        box = {}
        if rep.run("dcp: strict dcp.load(model.state_dict()) + load_state_dict(strict=True), unsharded", load):
            ref.verify(rep, "dcp unsharded", full_state(box["m"]), stored)
    elif a.layout == "pr240":
        md = dcp_entries(a.out)
        wanted = {p + k for p in ("model.", "ema_model.") for k in ref.order}
        wanted |= {k for k in md if k.startswith("optimizer.param_groups.0.")}
        describe_extras(rep, md, wanted)
        stored = unflatten(dcp_read(a.out, ["model." + k for k in ref.random], md), "model.")
        opt = sorted(k for k in md if k.startswith("optimizer."))
        rep.info(f"the DCP holds {len(opt)} optimizer.* entries"
                 + (f" ({', '.join(k.split('.')[-1] for k in opt[:14])})" if opt else
                    ": resume_model_only=False is not tried"))
        for f in ("metadata.pt", "scheduler.pt", "data_status.pt"):
            p = os.path.join(a.out, f)
            if os.path.exists(p):
                try:
                    v = torch.load(p, map_location="cpu", weights_only=False)
                    rep.info(f"{f}: {v if f != 'data_status.pt' else type(v).__name__}")
                except Exception as e:
                    rep.info(f"{f}: unreadable ({describe(e)})")
            else:
                rep.info(f"{f}: absent" + (" (load_checkpoint(resume_model_only=False) then warns and "
                                           "uses train_step 0 / a fresh scheduler)" if f != "data_status.pt" else ""))

        def load():
            m, e = fresh_pair(a)
            sd = {"model": m.state_dict(), "ema_model": e.state_dict()}
            dcp.load(sd, checkpoint_id=a.out, no_dist=True)
            m.load_state_dict(sd["model"], strict=True)
            e.load_state_dict(sd["ema_model"], strict=True)
            box.update(m=m, e=e)
        box = {}
        if rep.run("pr240: strict plain dcp.load({'model', 'ema_model'}) + load_state_dict(strict=True), unsharded",
                   load):
            sd, esd = full_state(box["m"]), full_state(box["e"])
            ref.verify(rep, "pr240 plain model", sd, stored)
            ref.ema_equal(rep, "pr240 plain", sd, esd)
    else:
        from safetensors.torch import load_file
        mp = os.path.join(a.out, "model.safetensors")
        ep = os.path.join(a.out, "ema.safetensors")
        if not os.path.exists(ep):
            rep.info("ema.safetensors absent: try_load_ckpt loads the EMA from model.safetensors "
                     "(HEAD's fsdp_save_ckpt writes both)")
        if not os.path.basename(a.out.rstrip("/")).isdigit():
            rep.info(f"the directory name {os.path.basename(a.out)!r} is not an int: HEAD resumes the train state "
                     "(resume_model_only=False) from int(basename) + 1; use resume_model_only=True")
        files = {}
        for name, p in (("model.safetensors", mp), ("ema.safetensors", ep)):
            if not os.path.exists(p):
                continue

            def readf(p=p, name=name):
                files[name] = load_file(p)
                return True
            if rep.run(f"head: {name} reads (safetensors)", readf):
                ref.verify(rep, f"head {name} as stored", files[name], None)
        if "model.safetensors" in files and "ema.safetensors" in files:
            ref.ema_equal(rep, "head files", files["model.safetensors"], files["ema.safetensors"])
        stored = {k: v for k, v in files.get("model.safetensors", {}).items() if k in ref.random}
        box = {}
        if rep.run("head: FSDPCheckpoint.try_load_ckpt(resume_from_ema=False) on the unwrapped model + EMA",
                   lambda: head_load(a, box)):
            rep.run("head unsharded: " + HEAD_RESULTS, lambda: head_verdict(box["inc"]))
            sd, esd = full_state(box["m"]), full_state(box["e"])
            ref.verify(rep, "head unsharded model", sd, stored)
            ref.ema_equal(rep, "head unsharded", sd, esd)
    return stored


def head_load(a, box):
    from train.fsdp_utils import FSDPCheckpoint
    m, e = fresh_pair(a)
    lg, cap = capture_logger("bagel_head_load", a.verbose)
    m, e = FSDPCheckpoint.try_load_ckpt(a.out, lg, m, e, resume_from_ema=False)
    box.update(m=m, e=e, inc=[r.msg for r in cap.records if hasattr(r.msg, "missing_keys")],
               log=[str(r.msg) for r in cap.records])
    return True


HEAD_RESULTS = ("logged load results: missing exactly the two popped pos_embeds, no unexpected keys "
                "(model and EMA)")


def head_verdict(inc):
    if len(inc) != 2:
        return f"{len(inc)} load results logged (want 2: model, EMA)"
    bad = [f"{w}: missing={sorted(i.missing_keys)} unexpected={sorted(i.unexpected_keys)}"
           for w, i in zip(("model", "ema"), inc) if sorted(i.missing_keys) != POS_EMBEDS or i.unexpected_keys]
    return "; ".join(bad) if bad else True


# ------------------------------------------------------------------ sharded loads (N gloo ranks)
def worker(rank, a, port, stored, has_opt, results):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(a.world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    quiet(a.verbose)
    dist.init_process_group("gloo", rank=rank, world_size=a.world, timeout=timedelta(seconds=180))
    rep = Report(show=False)
    ref = Reference(a)
    C = common(a)
    mesh = init_device_mesh("cpu", (a.world,))
    N = a.world

    def step(name, fn):
        """fn on every rank; all ranks' outcomes gathered, so a failure on any rank is reported"""
        try:
            r = fn()
            r = True if r is None else r
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            r = describe(e)
        outs = [None] * N
        dist.all_gather_object(outs, r)
        bad = [(i, o) for i, o in enumerate(outs) if o is not True]
        ok = not bad
        info = "" if ok else "; ".join(f"rank {i}: {o}" for i, o in bad[:2])
        rep.check(name, ok, info)
        return ok

    def verify_sharded(what, m, e=None):
        sd = full_state(m)                  # collectives on every rank
        esd = full_state(e) if e is not None else None
        if rank == 0:
            ref.verify(rep, what, sd, stored)
            if esd is not None:
                ref.ema_equal(rep, what, sd, esd)
        dist.barrier()

    box = {}
    if a.layout == "dcp":
        def load():
            m = fresh(a)
            C.fsdp_v2_shard_cpu(m, mesh)
            sd = m.state_dict()
            dcp.load(sd, checkpoint_id=a.out)
            m.load_state_dict(sd, strict=True)
            box["m"] = m
        if step(f"dcp: strict dcp.load(model.state_dict()) + load_state_dict(strict=True), FSDP2 on {N} CPU "
                "rank(s)", load):
            verify_sharded(f"dcp FSDP2 x{N}", box["m"])
    elif a.layout == "pr240":
        pr240 = pr240_module()
        lg, cap = capture_logger("bagel_pr240_load", a.verbose and rank == 0)

        def load(model_only):
            def f():
                m, e = fresh_pair(a)
                C.fsdp_v2_shard_cpu(m, mesh)
                C.fsdp_v2_shard_cpu(e, mesh)
                kw = {}
                if not model_only:
                    kw["optimizer"], kw["scheduler"] = C.bagel_optimizer_and_scheduler(m.parameters())
                cap.records.clear()
                step_, data_status = pr240.load_checkpoint(m, e, a.out, lg, resume_model_only=model_only, **kw)
                box.update(m=m, e=e, step=step_, data_status=data_status, log=list(cap.records), **kw)
            return f
        if step(f"pr240: load_checkpoint(model, ema_model, resume_model_only=True), both FSDP2 on {N} CPU "
                "rank(s)", load(True)):
            verify_sharded(f"pr240 resume_model_only=True FSDP2 x{N}", box["m"], box["e"])
        if has_opt:
            box.clear()
            if step(f"pr240: load_checkpoint(..., resume_model_only=False, AdamW, constant-warmup scheduler), "
                    f"FSDP2 on {N} CPU rank(s)", load(False)):
                verify_sharded(f"pr240 resume_model_only=False FSDP2 x{N}", box["m"], box["e"])
                if rank == 0:
                    opt, sch = box["optimizer"], box["scheduler"]
                    g = opt.param_groups[0]
                    rep.check("pr240 resume: returned train_step == 0 (data_status None)",
                              box["step"] == 0 and box["data_status"] is None,
                              f"train_step={box['step']!r}, data_status={type(box['data_status']).__name__}")
                    rep.check("pr240 resume: optimizer param group initial_lr == 1e-4",
                              len(opt.param_groups) == 1 and g.get("initial_lr") == 1e-4,
                              f"{len(opt.param_groups)} group(s), initial_lr={g.get('initial_lr')!r}")
                    rep.check("pr240 resume: lr == 0.0 and scheduler last_epoch == 0 (warmup step 0), "
                              "betas (0.9, 0.95), eps 1e-15, weight_decay 0",
                              g["lr"] == 0.0 and sch.last_epoch == 0 and tuple(g["betas"]) == (0.9, 0.95)
                              and g["eps"] == 1e-15 and g["weight_decay"] == 0,
                              f"lr={g['lr']!r} last_epoch={sch.last_epoch} betas={g['betas']} eps={g['eps']} "
                              f"wd={g['weight_decay']}")
                    warn = [r.getMessage() for r in box["log"] if r.levelno >= logging.WARNING]
                    for w in warn:
                        rep.results.append((None, "INFO load_checkpoint warned: " + w))
                    op, mp_ = opt.param_groups[0]["params"], list(box["m"].parameters())
                    same = sum(p is q for p, q in zip(op, mp_))
                    shared = sum(p.to_local().data_ptr() == q.to_local().data_ptr() for p, q in zip(op, mp_))
                    rep.results.append((None, f"INFO after load_checkpoint (load_state_dict(assign=True)) {same} of "
                                        f"{len(mp_)} model parameters are still the objects the optimizer holds "
                                        f"({shared} share storage with them)"))
                dist.barrier()
    else:
        def load():
            head_load(a, box)
            box["m"] = C.fsdp1_wrap_cpu(box["m"])
            box["e"] = C.fsdp1_wrap_cpu(box["e"])
        if step(f"head: try_load_ckpt on every rank, then HEAD's fsdp_wrapper (FSDP1 FULL_SHARD) on {N} CPU "
                "rank(s)", load):
            step(f"head x{N}, every rank: " + HEAD_RESULTS, lambda: head_verdict(box["inc"]))
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig
            # (offload_to_cpu=True, HEAD's setting for its CUDA save, fails on a CPU FSDP1 with 2+ ranks)
            cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
            with FSDP.state_dict_type(box["m"], StateDictType.FULL_STATE_DICT, cfg):
                sd = {k: v.detach().clone() for k, v in box["m"].state_dict().items()}
            with FSDP.state_dict_type(box["e"], StateDictType.FULL_STATE_DICT, cfg):
                esd = {k: v.detach().clone() for k, v in box["e"].state_dict().items()}
            if rank == 0:
                ref.verify(rep, f"head FSDP1 x{N} FULL_STATE_DICT", sd, stored)
                ref.ema_equal(rep, f"head FSDP1 x{N}", sd, esd)
            dist.barrier()
    if rank == 0:
        results[:] = rep.results
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main(argv=None):
    a = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    quiet(a.verbose)
    import torch
    import torch.multiprocessing as mp
    print(f"check_bagel_torch: layout {a.layout}, {a.out}, world {a.world}{', tied' if a.tied else ''}; "
          f"torch {torch.__version__}, Bagel {os.environ['BAGEL_SRC']}, fixture {a.fixture}", flush=True)
    rep = Report()
    ref = Reference(a)
    rep.run("fixture: manifest keys/shapes == reference, all float32", lambda: (
        True if set(ref.keys) == set(ref.ref) and all(ref.keys[k]["shape"] == list(ref.ref[k].shape)
                                                      and ref.ref[k].dtype == torch.float32 for k in ref.ref)
        else "the fixture's manifest and reference disagree"))
    skel = fresh(a).state_dict()
    rep.run("skeleton: Bagel built from --llm/--vit has the reference's keys and shapes", lambda: (
        True if {k: list(v.shape) for k, v in skel.items()} == {k: v["shape"] for k, v in ref.keys.items()}
        else f"differs: {sorted(set(skel) ^ set(ref.keys))[:6]}"))
    try:
        stored = unsharded(a, ref, rep)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        rep.check(f"{a.layout}: reading the checkpoint", False, describe(e))
        stored = {}
    has_opt = False
    if a.layout == "pr240":
        try:
            has_opt = any(k.startswith("optimizer.param_groups.") for k in dcp_entries(a.out))
        except BaseException:
            pass
    results = mp.Manager().list()
    try:
        mp.start_processes(worker, args=(a, free_port(), stored, has_opt, results), nprocs=a.world,
                           join=True, start_method="spawn")
    except Exception as e:
        if a.verbose:
            print(str(e), file=sys.stderr)
        rep.check(f"{a.layout}: the {a.world} sharded rank(s) ran to the end", False, describe(e))
    for ok, line in list(results):
        if ok is not None:
            rep.results.append((ok, line))
        print(line, flush=True)
    n = sum(1 for ok, _ in rep.results if ok)
    print(f"{n}/{len(rep.results)} checks pass")
    return 0 if n == len(rep.results) else 1


if __name__ == "__main__":
    sys.exit(main())
