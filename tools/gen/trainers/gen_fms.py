#!/usr/bin/env python
"""Fixtures written by fms-fsdp (Checkpointer) + ibm-fms 1.13.1 (LLaMA), FSDP1, for fsdp-run issue 38.

Regenerate everything (about 30 s on 2 CPU cores; deletes and rewrites the output folder except its hand-written
README.md, which is kept):

  mkdir -p /work/fms-fsdp-src && git --git-dir=<fetch github:foundation-model-stack/fms-fsdp> archive HEAD \
      | tar -x -C /work/fms-fsdp-src            # fms-fsdp @ 5a296afe42f9932f590783cb053fa0f9384e01fc
  cd /work/main && OMP_NUM_THREADS=1 PYTHONPATH=/work/seedpkgs/fms:/work/fms-fsdp-src \
      /work/torchenv/bin/python tools/gen/trainers/gen_fms.py [--out tests/data/trainers/fms-1.13]

It runs itself under torchrun (gloo) as phases:
  --phase train  --ckdir D : fresh init (seed 2023, LLaMA.reset_parameters), 3 steps, Checkpointer.save(3, ...)
  --phase resume --ckdir D : fresh process, Checkpointer.load(...) (resuming), 2 steps, records losses / grad norms
                             and the full weights after the first resumed step
  --phase verify           : numeric checks of the fused-tensor row order and the RoPE order against a
                             hand-written reference forward (world 1, no FSDP)
What follows main_training_llama.py / train_utils.train() line by line is marked "as main_training_llama".

Grid shapes (tests/data/trainers/grid/README.md; tools/gen/trainers/gen_grid.sh runs them all): `gen_fms.py
--grid NAME` (NAME one of mha, mqa, gqa3 of tools/gen/trainers/grid.py) runs the same phases on 2 ranks with
that shape and the grid's batch, into tests/data/trainers/grid/fms-1.13/NAME/: ws2/checkpoints/step_3_ckp,
config.json, expected.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "trainers", "fms-1.13")
PY = sys.executable
TORCHRUN = os.path.join(os.path.dirname(PY), "torchrun")

B, T, V = 4, 32, 256
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
SEED = 2023  # fms-fsdp train_config.seed default
STEPS_BEFORE, STEPS_AFTER = 3, 2
# the common model's sizes (emb_dim, nheads, kvheads, nlayers, hidden)
SIZES = dict(emb_dim=64, nheads=4, kvheads=2, nlayers=2, hidden=192)

import grid as _grid  # noqa: E402  (tools/gen/trainers/grid.py: --grid NAME, seen by the children as FSDP_GRID)


def apply_grid():
    """A grid shape in place of the common model, and the grid's batch."""
    global B, T, V
    g = _grid.config()
    SIZES.update(emb_dim=g["dim"], nheads=g["n_heads"], kvheads=g["n_kv_heads"], nlayers=g["n_layers"],
                 hidden=g["ffn_hidden"])
    B, T, V = _grid.B, _grid.T, g["vocab"]


if _grid.active():
    apply_grid()


def llama_config():
    from fms.models.llama import LLaMAConfig

    grow = SIZES["hidden"] / SIZES["emb_dim"]
    assert int(grow * SIZES["emb_dim"]) == SIZES["hidden"], grow  # GatedLinearUnit: int(grow * emb_dim)
    return LLaMAConfig(
        src_vocab_size=V,
        emb_dim=SIZES["emb_dim"],
        norm_eps=1e-5,
        nheads=SIZES["nheads"],
        kvheads=SIZES["kvheads"],
        nlayers=SIZES["nlayers"],
        hidden_grow_factor=grow,  # int(3.0 * 64) = 192
        multiple_of=1,  # no rounding
        rope_theta=10000.0,
        tie_heads=False,
        # everything else LLaMAConfig default: pad_id=-1 (nn.Embedding padding_idx=-1 -> row 255),
        # activation_fn="swish", p_dropout=0.0, max_expected_seq_len=4096, attn_bias=False,
        # mlp_bias=False, rope_scaling={}, fused_weights=True
    )


def train_cfg(ckdir):
    from fms_fsdp import config

    cfg = config.train_config()
    cfg.ckpt_save_path = ckdir
    cfg.ckpt_load_path = ckdir
    cfg.sharding_strategy = "fsdp"  # default "hsdp": see README (CPU device_count)
    cfg.mixed_precision = False  # default True would pick fp16 on CPU; float32 everywhere here
    cfg.use_torch_compile = False  # default True: see README (_orig_mod. prefix)
    cfg.learning_rate = LR
    cfg.grad_clip_thresh = CLIP
    cfg.seed = SEED
    cfg.batch_size = None  # set per world size below
    cfg.seq_length = T
    cfg.vocab_size = V
    cfg.report_interval = 1
    cfg.checkpoint_interval = STEPS_BEFORE
    return cfg


def make_batch():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    return seq[:, :T].to(torch.int32).contiguous(), seq[:, 1:].to(torch.int32).contiguous()


def fms_fsdp_import_shim():
    """fms-fsdp HEAD's fms_fsdp/policies/param_init.py does `from fms.modules.embedding import WordEmbedding`,
    which ibm-fms 1.13.1 no longer has (LLaMA uses nn.Embedding). It is only used by param_init_function
    (low_cpu_fsdp=True, unused here): a placeholder class that matches no module makes the import work."""
    import fms.modules.embedding as emb

    if not hasattr(emb, "WordEmbedding"):
        emb.WordEmbedding = type("WordEmbedding", (torch.nn.Module,), {})


def setup_everything(ckdir):
    """main_training_llama.main() up to the training loop, on CPU. Returns a dict of the pieces."""
    fms_fsdp_import_shim()
    import torch.distributed as dist
    from fms.models.llama import LLaMA, LLaMABlock
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.optim.lr_scheduler import LambdaLR

    from fms_fsdp.utils.checkpointing_utils import Checkpointer
    from fms_fsdp.utils.train_utils import get_policies

    cfg = train_cfg(ckdir)
    # as main_training_llama: seeds
    torch.manual_seed(cfg.seed)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    cfg.batch_size = B // world_size
    # setup(): nccl -> gloo here
    dist.init_process_group("gloo")

    block = LLaMABlock
    (
        mixed_precision_policy,
        wrapping_policy,
        sharding_strategy_policy,
        apply_selective_ac,
        param_init_fn,
    ) = get_policies(cfg, rank, block)

    # as main_training_llama (low_cpu_fsdp False): build + reset_parameters
    model = LLaMA(llama_config())
    model.reset_parameters()

    # as main_training_llama: FSDP (device_id CPU instead of torch.cuda.current_device())
    model = FSDP(
        model,
        auto_wrap_policy=wrapping_policy,
        mixed_precision=mixed_precision_policy,
        sharding_strategy=sharding_strategy_policy,
        use_orig_params=cfg.use_torch_compile,
        device_id=torch.device("cpu"),
        limit_all_gathers=True,
        param_init_fn=param_init_fn,
    )
    # as main_training_llama (in fms 1.13.1 rot_emb lives under base_model)
    model.base_model.rot_emb.compute_freqs_cis(
        torch.device("cpu"), model.config.max_expected_seq_len
    )

    # as main_training_llama: optimizer (eps is torch's default 1e-8)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.1
    )

    # as main_training_llama: Checkpointer(..., local_rank) with local_rank "cpu" (it calls model.to(local_rank))
    checkpointer = Checkpointer(cfg.ckpt_save_path, 1000, cfg.sharding_strategy, rank, "cpu")
    model, optimizer, _, start_step, tokens_seen, is_resuming = checkpointer.load(
        model,
        optimizer,
        None,
        path=os.path.join(cfg.ckpt_load_path, "checkpoints/")
        if not os.path.isfile(cfg.ckpt_load_path)
        else cfg.ckpt_load_path,
        strict=False,
    )
    if not is_resuming:
        start_step = 0
        for g in optimizer.param_groups:
            g["initial_lr"] = cfg.learning_rate

    # LR schedule: fms-fsdp's is warmup + cosine as a function of the step (never saved); constant here
    scheduler = LambdaLR(optimizer, lambda x: 1.0)
    return dict(
        cfg=cfg,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        checkpointer=checkpointer,
        start_step=start_step,
        tokens_seen=tokens_seen,
        is_resuming=is_resuming,
        rank=rank,
        world_size=world_size,
    )


def local_batch(batch_path, rank, world_size):
    from safetensors.torch import load_file

    b = load_file(batch_path)
    n = B // world_size
    return b["input_ids"][rank * n:(rank + 1) * n], b["labels"][rank * n:(rank + 1) * n]


def train_step(model, optimizer, scheduler, inp, label, cfg, world_size):
    """The body of fms_fsdp.utils.train_utils.train()'s loop (as main_training_llama)."""
    import torch.distributed as dist

    optimizer.zero_grad()
    output = model(inp)
    output = output.logits if hasattr(output, "logits") else output
    ce_loss = torch.nn.CrossEntropyLoss()
    loss = ce_loss(output.view(-1, output.size(-1)), label.view(-1).long())
    del output
    loss.backward()
    gnorm = model.clip_grad_norm_(cfg.grad_clip_thresh)
    optimizer.step()
    scheduler.step()
    # global mean loss (train() averages the per-rank means in ddp_stats the same way)
    l = loss.detach().clone()
    dist.all_reduce(l, op=dist.ReduceOp.SUM)
    l = l / world_size
    return l.item(), gnorm.item()


def full_weights(model):
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.state_dict_type(
        model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
    ):
        sd = model.state_dict()
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def phase_train(args):
    import torch.distributed as dist

    s = setup_everything(args.ckdir)
    assert not s["is_resuming"], "train phase found an existing checkpoint"
    cfg, model = s["cfg"], s["model"]
    inp, label = local_batch(args.batch, s["rank"], s["world_size"])
    model.train()
    losses, gnorms = [], []
    start_step, tokens_seen = s["start_step"], s["tokens_seen"]
    for batch_idx in range(start_step + 1, start_step + 1 + STEPS_BEFORE):
        l, g = train_step(model, s["optimizer"], s["scheduler"], inp, label, cfg, s["world_size"])
        losses.append(l)
        gnorms.append(g)
        # as train(): new_tokens_seen at report time (report_interval=1)
        new_tokens_seen = (batch_idx - start_step) * s["world_size"] * cfg.batch_size * cfg.seq_length
        if batch_idx % cfg.checkpoint_interval == 0:
            s["checkpointer"].save(
                batch_idx, model, s["optimizer"], None, tokens_seen=tokens_seen + new_tokens_seen
            )
    if s["rank"] == 0:
        with open(args.result, "w") as f:
            json.dump({"losses_before_save": losses, "grad_norms_before_save": gnorms}, f)
    dist.barrier()
    dist.destroy_process_group()


def phase_resume(args):
    """Also used by check_fms.py. Returns the result dict on rank 0."""
    import torch.distributed as dist

    s = setup_everything(args.ckdir)
    if not s["is_resuming"]:
        raise SystemExit("FAIL: Checkpointer.load did not find a checkpoint under %s/checkpoints/" % args.ckdir)
    cfg, model = s["cfg"], s["model"]
    inp, label = local_batch(args.batch, s["rank"], s["world_size"])
    model.train()
    losses, gnorms = [], []
    weights = None
    for i in range(STEPS_AFTER):
        l, g = train_step(model, s["optimizer"], s["scheduler"], inp, label, cfg, s["world_size"])
        losses.append(l)
        gnorms.append(g)
        if i == 0 and args.weights:
            weights = full_weights(model)
    res = {
        "start_step": s["start_step"],
        "tokens_seen": s["tokens_seen"],
        "resumed_losses": losses,
        "resumed_grad_norms": gnorms,
    }
    if s["rank"] == 0:
        if args.weights:
            from safetensors.torch import save_file

            save_file(weights, args.weights)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
    return res if s["rank"] == 0 else None


def reference_forward(sd, cfg, x, rope="interleaved"):
    """Plain-torch LLaMA forward from the fms state dict, using the row orders claimed in README:
    qkv_fused = [q (nheads*hd) ; k (kvheads*hd) ; v (kvheads*hd)] rows, head-major;
    wg1_fused = [wg (gate, through SiLU) ; w1 (up)] rows; RoPE interleaved pairs (2j, 2j+1)."""
    D, H, KV = cfg.emb_dim, cfg.nheads, cfg.kvheads
    hd = D // H
    hid = sd["base_model.layers.0.ff_sub_layer.w2.weight"].shape[1]
    bsz, t = x.shape

    def rms(h, w):
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + cfg.norm_eps))

    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(t).float(), inv)  # t, hd/2
    cos, sin = ang.cos(), ang.sin()

    def rope_interleaved(q):  # b t h hd
        q2 = q.view(*q.shape[:-1], hd // 2, 2)
        a, b_ = q2[..., 0], q2[..., 1]
        c, s_ = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack([a * c - b_ * s_, a * s_ + b_ * c], -1).flatten(-2)

    def rope_rotate_half(q):  # negative control: Hugging Face order (x[j], x[j + hd/2])
        a, b_ = q[..., : hd // 2], q[..., hd // 2:]
        c, s_ = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat([a * c - b_ * s_, a * s_ + b_ * c], -1)

    if rope != "interleaved":
        rope_interleaved = rope_rotate_half  # noqa: F811
    h = sd["base_model.embedding.weight"][x]
    for i in range(cfg.nlayers):
        p = "base_model.layers.%d." % i
        a = rms(h, sd[p + "ln.weight"])
        qkv = sd[p + "attn.in_proj.qkv_fused.weight"]
        wq, wk, wv = qkv[: H * hd], qkv[H * hd: H * hd + KV * hd], qkv[H * hd + KV * hd:]
        q = (a @ wq.T).view(bsz, t, H, hd)
        k = (a @ wk.T).view(bsz, t, KV, hd)
        v = (a @ wv.T).view(bsz, t, KV, hd)
        q, k = rope_interleaved(q), rope_interleaved(k)
        rep = H // KV
        k = k.repeat_interleave(rep, dim=2)  # q head j uses kv head j // rep
        v = v.repeat_interleave(rep, dim=2)
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2).reshape(bsz, t, H * hd)
        h = h + att @ sd[p + "attn.dense.weight"].T
        f = rms(h, sd[p + "ff_ln.weight"])
        wg1 = sd[p + "ff_sub_layer.wg1_fused.weight"]
        wg, w1 = wg1[:hid], wg1[hid:]
        g = torch.nn.functional.silu(f @ wg.T) * (f @ w1.T)
        h = h + g @ sd[p + "ff_sub_layer.w2.weight"].T
    h = rms(h, sd["base_model.dec_norm.weight"])
    return h @ sd["head.weight"].T


def phase_verify(args):
    """No FSDP: check fused row orders and RoPE order numerically; prints JSON."""
    from fms.models.llama import LLaMA
    from fms.modules.attention import FusedQKV
    from fms.modules.feedforward import GatedLinearUnit

    torch.manual_seed(SEED)
    cfg = llama_config()
    m = LLaMA(cfg)
    m.reset_parameters()
    m.eval()
    inp, _ = make_batch()
    sd = {k: v.detach() for k, v in m.state_dict().items()}
    with torch.no_grad():
        ref = reference_forward(sd, cfg, inp.long())
        out = m(inp.long())
        # the alternative orders must NOT match (guards against a vacuous check)
        sd_swapped = dict(sd)
        hid = 192
        for i in range(cfg.nlayers):
            k = "base_model.layers.%d.ff_sub_layer.wg1_fused.weight" % i
            sd_swapped[k] = torch.cat([sd[k][hid:], sd[k][:hid]])
        bad_glu = reference_forward(sd_swapped, cfg, inp.long())
        # fms' own unfuse_weights() splits: compare to our slicing
        attn = m.base_model.layers[0].attn.in_proj
        assert isinstance(attn, FusedQKV)
        un = attn.unfuse_weights()
        W = sd["base_model.layers.0.attn.in_proj.qkv_fused.weight"]
        qkv_ok = (
            torch.equal(un.query.weight, W[:64])
            and torch.equal(un.key.weight, W[64:96])
            and torch.equal(un.value.weight, W[96:128])
        )
        glu = m.base_model.layers[0].ff_sub_layer
        assert isinstance(glu, GatedLinearUnit)
        ung = glu.unfuse_weights()
        W2 = sd["base_model.layers.0.ff_sub_layer.wg1_fused.weight"]
        glu_ok = torch.equal(ung.wg.weight, W2[:hid]) and torch.equal(ung.w1.weight, W2[hid:])
        # unfused fms model (fused_weights=False) with the split weights gives the same logits
        cfg_u = cfg.updated(fused_weights=False)
        mu = LLaMA(cfg_u)
        sdu = {}
        for k, v in sd.items():
            if k.endswith("attn.in_proj.qkv_fused.weight"):
                p = k[: -len("qkv_fused.weight")]
                sdu[p + "query.weight"], sdu[p + "key.weight"], sdu[p + "value.weight"] = v[:64], v[64:96], v[96:]
            elif k.endswith("ff_sub_layer.wg1_fused.weight"):
                p = k[: -len("wg1_fused.weight")]
                sdu[p + "wg.weight"], sdu[p + "w1.weight"] = v[:hid], v[hid:]
            else:
                sdu[k] = v
        mu.load_state_dict(sdu, strict=True)
        mu.eval()
        out_u = mu(inp.long())
        # rotate-half RoPE applied to the same weights must NOT match
        bad_rope = reference_forward(sd, cfg, inp.long(), rope="rotate_half")
        res = {
            "max_abs_fms_vs_reference_rotate_half": (out - bad_rope).abs().max().item(),
            "max_abs_fms_vs_reference_interleaved": (out - ref).abs().max().item(),
            "max_abs_fms_vs_reference_glu_halves_swapped": (out - bad_glu).abs().max().item(),
            "max_abs_fms_fused_vs_unfused_model": (out - out_u).abs().max().item(),
            "unfuse_weights_qkv_split_q64_k32_v32": qkv_ok,
            "unfuse_weights_glu_split_wg_then_w1": glu_ok,
            "unfused_keys": sorted(k for k in sdu if k.startswith("base_model.layers.0.")),
        }
    print(json.dumps(res, indent=1))
    return res


def run_torchrun(nproc, phase, ckdir, batch, result, weights=None, port=29531):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        TORCHRUN, "--nproc_per_node", str(nproc), "--master_port", str(port),
        os.path.abspath(__file__), "--phase", phase, "--ckdir", ckdir, "--batch", batch, "--result", result,
    ]
    if weights:
        cmd += ["--weights", weights]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def orchestrate(out):
    from safetensors.torch import save_file

    readme = os.path.join(out, "README.md")  # hand-written: kept across regeneration
    keep = open(readme).read() if os.path.exists(readme) else None
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    if keep is not None:
        with open(readme, "w") as f:
            f.write(keep)
    inp, lab = make_batch()
    batch = os.path.join(out, "batch.safetensors")
    save_file({"input_ids": inp, "labels": lab}, batch)
    tmp = os.path.join(out, "_tmp")
    os.makedirs(tmp)
    expected = {}
    for ws in (1, 2):
        ck = os.path.join(out, "ws%d" % ws)
        r1, r2 = os.path.join(tmp, "t%d.json" % ws), os.path.join(tmp, "r%d.json" % ws)
        # ws2's weights are not kept (size): only their max |difference| from ws1's is recorded
        w = os.path.join(out if ws == 1 else tmp, "ws%d_after_resume_step.safetensors" % ws)
        run_torchrun(ws, "train", ck, batch, r1)
        run_torchrun(ws, "resume", ck, batch, r2, weights=w)
        a, b = json.load(open(r1)), json.load(open(r2))
        expected["ws%d" % ws] = {
            "losses_before_save": a["losses_before_save"],
            "grad_norms_before_save": a["grad_norms_before_save"],
            "resumed_losses": b["resumed_losses"],
            "resumed_grad_norms": b["resumed_grad_norms"],
            "resumed_start_step": b["start_step"],
            "resumed_tokens_seen": b["tokens_seen"],
        }
        if ws == 2:
            from safetensors.torch import load_file

            w1 = load_file(os.path.join(out, "ws1_after_resume_step.safetensors"))
            w2 = load_file(w)
            assert set(w1) == set(w2)
            expected["ws2"]["after_resume_step_max_abs_diff_vs_ws1_file"] = max(
                (w1[k] - w2[k]).abs().max().item() for k in w1
            )
    shutil.rmtree(tmp)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    c = llama_config()
    conf = {
        "trainer": "fms-fsdp @5a296afe42f9932f590783cb053fa0f9384e01fc (Checkpointer) + ibm-fms 1.13.1 LLaMA, FSDP1",
        "fms_LLaMAConfig": {
            k: getattr(c, k)
            for k in [
                "src_vocab_size", "emb_dim", "norm_eps", "nheads", "kvheads", "nlayers", "pad_id",
                "hidden_grow_factor", "multiple_of", "activation_fn", "p_dropout", "max_expected_seq_len",
                "attn_bias", "mlp_bias", "tie_heads", "rope_theta", "rope_scaling", "linear_config",
                "fused_weights",
            ]
        },
        "fms_fsdp_train_config": {
            "sharding_strategy": "fsdp", "mixed_precision": False, "use_torch_compile": False,
            "low_cpu_fsdp": False, "fsdp_activation_checkpointing": False, "learning_rate": LR,
            "grad_clip_thresh": CLIP, "seed": SEED, "seq_length": T, "batch_size_per_rank": "4 / world",
            "checkpoint_interval": STEPS_BEFORE, "report_interval": 1,
        },
        "plain": {
            "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab": V,
            "ffn_hidden": 192, "norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "tied": False,
            "bias": False, "dtype": "float32", "embedding_padding_idx": 255,
        },
        "rope_order": "interleaved",
        "optimizer": {
            "type": "torch.optim.AdamW", "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD,
            "weight_decay_on": "every parameter", "grad_clip_total_norm": CLIP,
            "lr_schedule": "constant (LambdaLR(lambda x: 1.0))",
        },
        "batch": {"B": B, "T": T, "seed": 0, "ranks": "contiguous halves of the batch rows"},
        "steps_before_save": STEPS_BEFORE, "steps_after_resume": STEPS_AFTER,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
        f.write("\n")
    print(json.dumps(expected, indent=1))


def orchestrate_grid(out):
    """--grid NAME: the same train and resume phases on 2 ranks with the grid's shape and batch, into
    tests/data/trainers/grid/fms-1.13/NAME/ (ws2/checkpoints/step_3_ckp, config.json, expected.json)."""
    os.makedirs(out, exist_ok=True)
    batch = _grid.write_batch()
    tmp = os.path.join(out, "_tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    expected = {}
    for ws in (2,):
        ck = os.path.join(out, "ws%d" % ws)
        shutil.rmtree(ck, ignore_errors=True)
        r1, r2 = os.path.join(tmp, "t%d.json" % ws), os.path.join(tmp, "r%d.json" % ws)
        run_torchrun(ws, "train", ck, batch, r1)
        run_torchrun(ws, "resume", ck, batch, r2)
        a, b = json.load(open(r1)), json.load(open(r2))
        expected["ws%d" % ws] = {
            "losses_before_save": a["losses_before_save"], "grad_norms_before_save": a["grad_norms_before_save"],
            "resumed_losses": b["resumed_losses"], "resumed_grad_norms": b["resumed_grad_norms"],
            "resumed_start_step": b["start_step"], "resumed_tokens_seen": b["tokens_seen"],
        }
    shutil.rmtree(tmp)
    _grid.write_expected(out, expected)
    c = llama_config()
    _grid.write_config(out, "fms-fsdp @5a296afe (Checkpointer) + ibm-fms 1.13.1 LLaMA, FSDP1", {
        "fms_LLaMAConfig": {k: getattr(c, k) for k in [
            "src_vocab_size", "emb_dim", "norm_eps", "nheads", "kvheads", "nlayers", "pad_id", "hidden_grow_factor",
            "multiple_of", "rope_theta", "tie_heads", "fused_weights"]},
        "qkv_fused_rows": "[q (nheads*head_dim); k (kvheads*head_dim); v (kvheads*head_dim)]",
        "wg1_fused_rows": "[wg (gate); w1 (up)]", "rope_order": "interleaved",
        "embedding_padding_idx": V - 1})
    print(json.dumps(expected, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--grid", choices=sorted(_grid.CONFIGS), help="a grid shape (tools/gen/trainers/grid.py)")
    ap.add_argument("--phase", choices=["train", "resume", "verify"])
    ap.add_argument("--ckdir")
    ap.add_argument("--batch")
    ap.add_argument("--result")
    ap.add_argument("--weights")
    args = ap.parse_args()
    if args.grid:
        _grid.select(args.grid)
        apply_grid()
        if args.out == DEFAULT_OUT:
            args.out = _grid.out_dir("fms-1.13")
    if args.phase in ("train", "resume"):
        (phase_train if args.phase == "train" else phase_resume)(args)
        # gloo teardown on this machine sometimes aborts a rank at interpreter exit
        # ("terminate called without an active exception") after all work is done: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    elif args.phase == "verify":
        phase_verify(args)
    elif _grid.active():
        orchestrate_grid(os.path.abspath(args.out))
    else:
        orchestrate(os.path.abspath(args.out))


if __name__ == "__main__":
    main()
