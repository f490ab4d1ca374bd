// Issue 16 item 5: llm.c .bin shards (kind: llmc: 256 x int32 header, magic 20240520, version 1,
// token count, uint16 tokens), several shards by glob, token ids checked against the vocabulary when
// the data is opened, data paths relative to the recipe's directory then the working directory, and
// no synthetic data unless asked for.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "train/data.h"
}
#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-databin");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

// An llm.c shard: the header (magic, version, count; the rest zero), then the uint16 tokens.
std::string llmc_shard(const std::vector<uint16_t> &toks, int32_t magic = 20240520, int32_t version = 1,
                       int32_t count = -1) {
    std::vector<int32_t> hdr(256, 0);
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count >= 0 ? count : (int32_t)toks.size();
    std::string s((const char *)hdr.data(), hdr.size() * 4);
    s.append((const char *)toks.data(), toks.size() * 2);
    return s;
}

data_config cfg_of(data_kind kind, const std::string &path, int64_t B, int64_t T) {
    data_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    snprintf(c.path, sizeof c.path, "%s", path.c_str());
    c.batch_size = B;
    c.seq_len = T;
    c.token_bytes = 2;
    c.seed = 7;
    return c;
}

// Inputs and labels of global batch pos (one rank).
void batch(const data_config &c, int vocab, uint64_t pos, std::vector<int32_t> *in, std::vector<int32_t> *lab) {
    data_source *d = nullptr;
    fsdp_err err;
    ASSERT_EQ(data_open(&c, vocab, 1, 0, &d, &err), 0) << err.msg;
    in->assign((size_t)(c.batch_size * c.seq_len), -1);
    lab->assign(in->size(), -1);
    EXPECT_EQ(data_batch(d, pos, in->data(), lab->data(), &err), 0) << err.msg;
    data_close(d);
}

std::string open_error(const data_config &c, int vocab) {
    data_source *d = nullptr;
    fsdp_err err;
    fsdp_err_clear(&err);
    int rc = data_open(&c, vocab, 1, 0, &d, &err);
    data_close(d);
    return rc ? std::string(err.msg) : std::string("(opened)");
}

int run(const std::string &args, std::string *out) {
    return run_cmd("timeout -k 10 300 " + fsdp_run_bin() + " " + args, out);
}

// The losses of the metrics file, one per step.
std::vector<std::string> losses(const std::string &metrics) {
    std::vector<std::string> v;
    std::string s = read_file(metrics);
    for (size_t p = s.find("\"loss\": "); p != std::string::npos; p = s.find("\"loss\": ", p + 1))
        v.push_back(s.substr(p + 8, s.find(',', p) - p - 8));
    return v;
}

}  // namespace

TEST(DataBin, ShardReadsItsPayloadNotItsHeader) {
    Dir d;
    const int64_t T = 6, B = 3;
    std::vector<uint16_t> toks(200);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = (uint16_t)(1000 + i);
    write_file(d / "s.bin", llmc_shard(toks));
    data_config c = cfg_of(DATA_LLMC, d / "s.bin", B, T);
    c.sequential = 1;
    for (uint64_t pos : {0ull, 1ull, 5ull, 11ull}) {
        std::vector<int32_t> in, lab;
        batch(c, 2000, pos, &in, &lab);
        const int64_t nblocks = 200 / (T + 1);
        for (int64_t b = 0; b < B; b++) {
            int64_t start = ((int64_t)pos * B + b) % nblocks * (T + 1);
            for (int64_t t = 0; t < T; t++) {
                EXPECT_EQ(in[(size_t)(b * T + t)], 1000 + start + t) << "pos " << pos << " sample " << b;
                EXPECT_EQ(lab[(size_t)(b * T + t)], 1000 + start + t + 1) << "pos " << pos << " sample " << b;
            }
        }
    }
    // random windows: every window is a run of consecutive payload tokens
    c.sequential = 0;
    std::vector<int32_t> in, lab;
    batch(c, 2000, 3, &in, &lab);
    for (int64_t b = 0; b < B; b++) {
        EXPECT_GE(in[(size_t)(b * T)], 1000);
        for (int64_t t = 1; t < T; t++) EXPECT_EQ(in[(size_t)(b * T + t)], in[(size_t)(b * T + t - 1)] + 1);
    }
}

TEST(DataBin, SeveralShardsByGlobInSortedOrder) {
    Dir d;
    const int64_t T = 4;  // blocks of 5 tokens
    // shard 1 (sorted second) holds 100.., shard 0 holds 0..; 12 tokens each: two blocks each, two
    // tokens left over in each, so that a block spanning the shards would show
    std::vector<uint16_t> a(12), b(12);
    for (int i = 0; i < 12; i++) {
        a[(size_t)i] = (uint16_t)i;
        b[(size_t)i] = (uint16_t)(100 + i);
    }
    write_file(d / "train_001.bin", llmc_shard(b));
    write_file(d / "train_000.bin", llmc_shard(a));
    write_file(d / "val_000.bin", llmc_shard(std::vector<uint16_t>(12, 7)));  // not matched
    data_config c = cfg_of(DATA_LLMC, d / "train_*.bin", 1, T);
    c.sequential = 1;
    const int expect[] = {0, 5, 100, 105, 0};  // block k's first token, wrapping after 4 blocks
    for (uint64_t pos = 0; pos < 5; pos++) {
        std::vector<int32_t> in, lab;
        batch(c, 256, pos, &in, &lab);
        for (int64_t t = 0; t < T; t++) {
            EXPECT_EQ(in[(size_t)t], expect[pos] + t) << "batch " << pos;
            EXPECT_EQ(lab[(size_t)t], expect[pos] + t + 1) << "batch " << pos;
        }
    }
    // random windows never span two shards: a window's tokens are consecutive within one shard
    c.sequential = 0;
    c.batch_size = 8;
    for (uint64_t pos = 0; pos < 20; pos++) {
        std::vector<int32_t> in, lab;
        batch(c, 256, pos, &in, &lab);
        for (int64_t s = 0; s < 8; s++) {
            for (int64_t t = 1; t < T; t++) EXPECT_EQ(in[(size_t)(s * T + t)], in[(size_t)(s * T + t - 1)] + 1);
            EXPECT_EQ(lab[(size_t)(s * T + T - 1)], in[(size_t)(s * T + T - 1)] + 1);
        }
    }
    // a glob that matches nothing
    data_config none = cfg_of(DATA_LLMC, d / "nothing_*.bin", 1, T);
    EXPECT_NE(open_error(none, 256).find("data.path '" + d / "nothing_*.bin" + "': no file matches"), std::string::npos)
        << open_error(none, 256);
}

TEST(DataBin, BadHeadersNameTheFileAndTheField) {
    Dir d;
    std::vector<uint16_t> toks(64, 3);
    struct {
        const char *name;
        std::string bytes;
        const char *expect;
    } cases[] = {
        {"magic.bin", llmc_shard(toks, 20240999), "header magic is 20240999, expected 20240520"},
        {"version.bin", llmc_shard(toks, 20240520, 2), "header version is 2, expected 1 with magic 20240520"},
        {"version7.bin", llmc_shard(toks, 20240801, 1), "header version is 1, expected 7 with magic 20240801"},
        {"count.bin", llmc_shard(toks, 20240520, 1, 65), "the header says 65 tokens (1154 bytes with the header), the file has 1152 bytes"},
        {"negative.bin", "", "header token count is -5"},
        {"short.bin", std::string(100, '\0'), "100 bytes is shorter than the 1024-byte llm.c header"},
    };
    // a negative count, written by hand (llmc_shard's -1 means "the real count")
    cases[4].bytes = llmc_shard(toks);
    int32_t neg = -5;
    memcpy(&cases[4].bytes[8], &neg, 4);
    for (auto &k : cases) {
        write_file(d / k.name, k.bytes);
        data_config c = cfg_of(DATA_LLMC, d / k.name, 1, 8);
        std::string e = open_error(c, 256);
        EXPECT_NE(e.find("data " + d / k.name + ": " + k.expect), std::string::npos) << e;
    }
    // the flat token kind reading a file that starts with the llm.c magic but is no shard (its count
    // does not match): its header is out of the vocabulary, with a hint
    write_file(d / "flat.bin", llmc_shard(toks, 20240520, 1, 3));
    data_config flat = cfg_of(DATA_TOKENS, d / "flat.bin", 1, 8);
    std::string e = open_error(flat, 256);
    EXPECT_NE(e.find("token id 55432 at token 0 (byte offset 0) is >= the model's vocab_size 256 (the file starts "
                     "with the llm.c header magic 20240520: use kind: llmc)"),
              std::string::npos)
        << e;
}

// An llm.c shard read as kind: tokens is refused whatever the vocabulary (with 65536 every uint16 id
// fits: it trained on the 1024-byte header without a word), at open and by validate's file check.
TEST(DataBin, LlmcShardAsTokensIsRefused) {
    Dir d;
    std::vector<uint16_t> toks(64, 9);
    write_file(d / "s.bin", llmc_shard(toks));
    data_config c = cfg_of(DATA_TOKENS, d / "s.bin", 1, 8);
    std::string want = "data " + d / "s.bin" + ": an llm.c .bin shard (header magic 20240520, version 1, 64 tokens): "
                       "use kind: llmc (kind: tokens would train on its 1024-byte header as tokens)";
    for (int vocab : {256, 65536}) {
        std::string e = open_error(c, vocab);
        EXPECT_NE(e.find(want), std::string::npos) << vocab << ": " << e;
    }
    fsdp_err err;
    EXPECT_NE(data_check_files(&c, &err), 0);
    EXPECT_NE(std::string(err.msg).find(want), std::string::npos) << err.msg;
    // and as a user meets it: validate names it
    write_file(d / "r.yaml", "model: {preset: tiny}\nruntime: {device: cpu}\n"
                             "data: {kind: tokens, path: " + d / "s.bin" + ", batch_size: 1, seq_len: 8}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    std::string out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + d / "r.yaml", &out), 2) << out;
    EXPECT_NE(out.find("use kind: llmc"), std::string::npos) << out;
}

TEST(DataBin, TokenBeyondTheVocabularyIsAnErrorAtOpen) {
    // one id >= vocab, in the shard's last token: random windows of 3 steps would rarely reach it
    // (before: the run trained on and never said so); the whole payload is scanned when it opens
    Dir d;
    std::vector<uint16_t> toks(4000, 5);
    toks.back() = 300;  // tiny's vocab is 256
    write_file(d / "s.bin", llmc_shard(toks));
    write_file(d / "r.yaml", "model: {preset: tiny}\nruntime: {device: cpu}\n"
                             "data: {kind: llmc, path: " + d / "s.bin" + ", batch_size: 2, seq_len: 16}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: t, uses: train-steps, with: {steps: 3, metrics: " + d / "m.jsonl" + "}}\n");
    std::string out;
    EXPECT_EQ(run(d / "r.yaml", &out), 1) << out;
    EXPECT_NE(out.find("data " + d / "s.bin" + ": token id 300 at token 3999 (byte offset 9022) is >= the model's "
                       "vocab_size 256"),
              std::string::npos)
        << out;
    EXPECT_EQ(read_file(d / "m.jsonl"), "");  // not one step trained
}

TEST(DataBin, TrainsWithTheSameTokensAsItsPayload) {
    // the same payload as an llm.c shard and as a flat uint16 token file: the same losses, step by step
    Dir d;
    std::vector<uint16_t> toks(3000);
    uint32_t x = 12345;
    for (auto &t : toks) {
        x = x * 1103515245u + 12345u;
        t = (uint16_t)((x >> 16) % 256);
    }
    write_file(d / "s.bin", llmc_shard(toks));
    write_file(d / "flat.u16", std::string((const char *)toks.data(), toks.size() * 2));
    auto recipe = [&](const std::string &data, const std::string &m) {
        return "model: {preset: tiny}\nruntime: {device: cpu, seed: 3}\ndata: {" + data +
               ", batch_size: 2, seq_len: 16}\nstages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: t, uses: train-steps, with: {steps: 4, metrics: " + d / m + "}}\n";
    };
    write_file(d / "bin.yaml", recipe("kind: llmc, path: " + d / "s.bin", "bin.jsonl"));
    write_file(d / "flat.yaml", recipe("kind: tokens, path: " + d / "flat.u16", "flat.jsonl"));
    std::string out;
    ASSERT_EQ(run("-q " + d / "bin.yaml", &out), 0) << out;
    ASSERT_EQ(run("-q " + d / "flat.yaml", &out), 0) << out;
    std::vector<std::string> a = losses(d / "bin.jsonl"), b = losses(d / "flat.jsonl");
    ASSERT_EQ(a.size(), 4u) << read_file(d / "bin.jsonl");
    EXPECT_EQ(a, b);
    // and not the losses of other tokens (the data reaches the model)
    write_file(d / "synth.yaml", recipe("kind: synthetic", "synth.jsonl"));
    ASSERT_EQ(run("-q " + d / "synth.yaml", &out), 0) << out;
    EXPECT_NE(losses(d / "synth.jsonl"), a);
}

TEST(DataBin, NoDataSectionIsAnErrorNotSyntheticData) {
    Dir d;
    const std::string stages = "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 2}}\n";
    write_file(d / "none.yaml", "model: {preset: tiny}\n" + stages);
    std::string out;
    EXPECT_EQ(run("validate " + d / "none.yaml", &out), 2) << out;
    EXPECT_NE(out.find(d / "none.yaml" + ":4:19: stage 't' (train-steps): the recipe has no `data:` section"),
              std::string::npos)
        << out;
    write_file(d / "nokind.yaml", "model: {preset: tiny}\ndata: {batch_size: 2, seq_len: 8}\n" + stages);
    EXPECT_EQ(run("validate " + d / "nokind.yaml", &out), 2) << out;
    EXPECT_NE(out.find(d / "nokind.yaml" + ":2:7: data: no `kind`"), std::string::npos) << out;
    // synthetic when asked
    write_file(d / "synth.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n" + stages);
    EXPECT_EQ(run("validate " + d / "synth.yaml", &out), 0) << out;
    // a recipe without train-steps needs no data
    write_file(d / "init.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n");
    EXPECT_EQ(run("validate " + d / "init.yaml", &out), 0) << out;
}

TEST(DataBin, RelativePathsResolveFromTheRecipeThenTheWorkingDirectory) {
    Dir d;
    std::vector<uint16_t> toks(500, 9);
    write_file(d / "shard_0.bin", llmc_shard(toks));
    // run from the project root: shard_0.bin is not there, it is beside the recipe
    write_file(d / "r.yaml", "model: {preset: tiny}\nruntime: {device: cpu}\n"
                             "data: {kind: llmc, path: 'shard_*.bin', batch_size: 2, seq_len: 8}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    std::string out;
    EXPECT_EQ(run("validate " + d / "r.yaml", &out), 0) << out;
    EXPECT_EQ(run("-q " + d / "r.yaml", &out), 0) << out;
    // the same for kind safetensors (before: "cannot open", relative to the working directory only)
    write_file(d / "batch.safetensors", read_file(tiny("batch.safetensors")));
    write_file(d / "st.yaml", "model: {preset: tiny}\nruntime: {device: cpu}\n"
                              "data: {kind: safetensors, path: batch.safetensors, batch_size: 2, seq_len: 32}\n"
                              "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    EXPECT_EQ(run("-q " + d / "st.yaml", &out), 0) << out;
    // a file that exists nowhere: a validation error at the key, naming both places looked in
    write_file(d / "m.yaml", "model: {preset: tiny}\n"
                             "data: {kind: llmc, path: missing.bin, batch_size: 2, seq_len: 8}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    EXPECT_EQ(run("validate " + d / "m.yaml", &out), 2) << out;
    EXPECT_NE(out.find(d / "m.yaml" + ":2:26: data.path 'missing.bin': no file matches (kind llmc; a relative path is "
                       "looked up in the directory of the recipe file that names it, then in the working directory)"),
              std::string::npos)
        << out;
}
