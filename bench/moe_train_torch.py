"""PyTorch's side of bench/moe_train (not part of the tests): transformers' eager model of a config.json
trained with AdamW on random tokens, the objective transformers computes with output_router_logits
(cross-entropy + router_aux_loss_coef x load-balancing loss). Prints tokens/s of --steps steps after two
warm-up steps.

  python moe_train_torch.py --config DIR/config.json --steps N --batch B --seq T --threads K"""
import argparse
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.from_pretrained(a.config.rsplit("/", 1)[0])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))

    def step():
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    print(a.steps * a.batch * a.seq / dt)


if __name__ == "__main__":
    main()
