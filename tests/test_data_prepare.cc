// Issue 41 item 3: `fsdp-run data prepare` writes the stream `kind: jsonl` packs (HF's ids of every document
// in the tokenizer's template, EOS between documents) as llm.c shards (uint16 magic 20240520 v1, uint32 magic
// 20240801 v7) or a flat token file; the shards train as `kind: llmc`, the flat file as `kind: tokens`; a
// failure leaves no file behind.
#include <gtest/gtest.h>

#include <jansson.h>

#include <string>
#include <vector>

extern "C" {
#include "train/data.h"
}
#include "test_util.h"
#include "tokenizer_util.h"

using namespace fsdp_test;

namespace {

std::string corpus_jsonl(const std::string &dir) { return write_corpus_jsonl(dir + "/docs.jsonl"); }

std::vector<uint32_t> hf_stream_u(const std::string &style, int32_t eos) {
    std::vector<int32_t> s = hf_stream(style, eos);
    return std::vector<uint32_t>(s.begin(), s.end());
}

uint32_t le32(const std::string &b, size_t at) {
    return (uint32_t)(unsigned char)b[at] | (uint32_t)(unsigned char)b[at + 1] << 8 |
           (uint32_t)(unsigned char)b[at + 2] << 16 | (uint32_t)(unsigned char)b[at + 3] << 24;
}

std::vector<uint32_t> tokens_of(const std::string &bytes, size_t hdr, int esz) {
    std::vector<uint32_t> v;
    for (size_t at = hdr; at + (size_t)esz <= bytes.size(); at += (size_t)esz)
        v.push_back(esz == 2 ? (uint32_t)(unsigned char)bytes[at] | (uint32_t)(unsigned char)bytes[at + 1] << 8 : le32(bytes, at));
    return v;
}

std::string prepare(const std::string &args, int *rc) {
    std::string out;
    *rc = run_cmd(fsdp_run_bin() + " data prepare " + args, &out);
    return out;
}

} // namespace

TEST(DataPrepare, LlmcShardsHoldTheJsonlStream) {
    std::string dir = make_tmpdir("dprep");
    std::string docs = corpus_jsonl(dir);
    std::vector<uint32_t> want = hf_stream_u("neox", 5000); // <|endoftext|>, also the template's suffix
    int rc;
    std::string o = prepare("--tokenizer tests/data/tokenizers/neox --eos \"<|endoftext|>\" --shard-tokens 3000 "
                            "--threads 2 -o " + dir + "/neox " + docs, &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_NE(o.find("of " + std::to_string(want.size()) + " tokens from 267 documents"), std::string::npos) << o;
    std::vector<uint32_t> got;
    size_t shards = (want.size() + 2999) / 3000;
    for (size_t k = 0; k < shards; k++) {
        char name[64];
        snprintf(name, sizeof name, "/neox_%06zu.bin", k);
        std::string b = read_file(dir + name);
        ASSERT_GE(b.size(), 1024u) << name;
        EXPECT_EQ(le32(b, 0), 20240520u);
        EXPECT_EQ(le32(b, 4), 1u);
        std::vector<uint32_t> t = tokens_of(b, 1024, 2);
        EXPECT_EQ(le32(b, 8), t.size());
        EXPECT_EQ(t.size(), k + 1 < shards ? 3000u : want.size() - 3000 * k);
        got.insert(got.end(), t.begin(), t.end());
    }
    EXPECT_FALSE(exists(dir + "/neox_" + std::string(6 - std::to_string(shards).size(), '0') + std::to_string(shards) + ".bin"));
    EXPECT_EQ(got, want);
    // 1 thread writes the same bytes
    o = prepare("-q --tokenizer tests/data/tokenizers/neox --eos \"<|endoftext|>\" --shard-tokens 3000 -o " + dir + "/one " + docs,
                &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(read_file(dir + "/one_000001.bin"), read_file(dir + "/neox_000001.bin"));
    // the shards train as kind llmc: sequential windows are the stream's blocks within a shard
    data_config c;
    memset(&c, 0, sizeof c);
    c.kind = DATA_LLMC;
    snprintf(c.path, sizeof c.path, "%s/neox_*.bin", dir.c_str());
    c.batch_size = 2;
    c.seq_len = 99;
    c.sequential = 1;
    data_source *d = nullptr;
    fsdp_err err;
    ASSERT_EQ(data_open(&c, 5012, 1, 0, &d, &err), 0) << err.msg;
    std::vector<int32_t> in(2 * 99), lab(2 * 99);
    ASSERT_EQ(data_batch(d, 0, in.data(), lab.data(), &err), 0) << err.msg;
    for (size_t k = 0; k < 99; k++) EXPECT_EQ((uint32_t)in[99 + k], want[100 + k]);
    data_close(d);
    rm_rf(dir);
}

TEST(DataPrepare, Uint32ShardsAndFlatTokenFiles) {
    std::string dir = make_tmpdir("dprep");
    std::string docs = corpus_jsonl(dir);
    std::vector<uint32_t> want = hf_stream_u("llama3", 6001); // <|end_of_text|>
    int rc;
    std::string o = prepare("-q --tokenizer tests/data/tokenizers/llama3 --eos \"<|end_of_text|>\" --dtype uint32 -o " + dir +
                            "/l32 " + docs, &rc);
    ASSERT_EQ(rc, 0) << o;
    std::string b = read_file(dir + "/l32_000000.bin");
    EXPECT_EQ(le32(b, 0), 20240801u);
    EXPECT_EQ(le32(b, 4), 7u);
    EXPECT_EQ(tokens_of(b, 1024, 4), want);
    // kind llmc reads the uint32 shard
    data_config c;
    memset(&c, 0, sizeof c);
    c.kind = DATA_LLMC;
    snprintf(c.path, sizeof c.path, "%s/l32_000000.bin", dir.c_str());
    c.batch_size = 1;
    c.seq_len = 16;
    c.sequential = 1;
    data_source *d = nullptr;
    fsdp_err err;
    ASSERT_EQ(data_open(&c, 6016, 1, 0, &d, &err), 0) << err.msg;
    std::vector<int32_t> in(16), lab(16);
    ASSERT_EQ(data_batch(d, 3, in.data(), lab.data(), &err), 0) << err.msg;
    for (size_t k = 0; k < 16; k++) EXPECT_EQ((uint32_t)in[k], want[3 * 17 + k]);
    data_close(d);
    // a flat token file (uint16: the vocabulary fits) for kind tokens
    o = prepare("-q --tokenizer tests/data/tokenizers/llama3 --eos \"<|end_of_text|>\" --format tokens -o " + dir + "/flat.bin " +
                docs, &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(tokens_of(read_file(dir + "/flat.bin"), 0, 2), want);
    // without the template: no BOS, EOS still between documents
    o = prepare("-q --tokenizer tests/data/tokenizers/llama3 --eos \"<|end_of_text|>\" --no-template --format tokens -o " + dir +
                "/plain.bin " + docs, &rc);
    ASSERT_EQ(rc, 0) << o;
    std::vector<uint32_t> plain = tokens_of(read_file(dir + "/plain.bin"), 0, 2);
    EXPECT_EQ(plain.size(), want.size() - 267);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 6000u), std::count(want.begin(), want.end(), 6000u) - 267); // BOS in the text stays
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 6001u), std::count(want.begin(), want.end(), 6001u));
    rm_rf(dir);
}

TEST(DataPrepare, FailuresLeaveNoFiles) {
    std::string dir = make_tmpdir("dprep");
    std::string docs = corpus_jsonl(dir);
    // a bad line at the end: the shards written before it are removed again
    write_file(dir + "/bad.jsonl", read_file(docs) + "{\"text\": 5}\n");
    int rc;
    std::string o = prepare("--tokenizer tests/data/tokenizers/neox --eos \"<|endoftext|>\" --shard-tokens 1000 -o " + dir +
                            "/x " + dir + "/bad.jsonl", &rc);
    EXPECT_EQ(rc, 1) << o;
    EXPECT_NE(o.find(dir + "/bad.jsonl:268: field \"text\" is a number"), std::string::npos) << o;
    std::string ls;
    run_cmd("ls " + dir, &ls);
    EXPECT_EQ(ls.find("x_"), std::string::npos) << ls;
    struct Case {
        std::string args, want;
        int code;
    } cases[] = {
        {"--tokenizer tests/data/tokenizers/neox --eos \"<|endoftext|>\" -o " + dir + "/none/x " + docs, "does not exist", 1},
        {"--tokenizer " + dir + " -o " + dir + "/x " + docs, "no tokenizer.json there", 1},
        {"--tokenizer tests/data/tokenizers/neox -o " + dir + "/x " + docs, "has no tokenizer_config.json with an eos_token", 2},
        {"--tokenizer tests/data/tokenizers/neox --eos \"<zz>\" -o " + dir + "/x " + docs, "the EOS token \"<zz>\" is not", 2},
        {"--tokenizer tests/data/tokenizers/neox --format parquet -o x y", "--format must be llmc or tokens", 2},
        {"--tokenizer tests/data/tokenizers/neox --shard-tokens 0 -o x y", "--shard-tokens expects 1..2147483647", 2},
        {"--tokenizer tests/data/tokenizers/neox " + docs, "-o OUT is required", 2},
        {"-o x " + docs, "--tokenizer DIR is required", 2},
    };
    for (const Case &k : cases) {
        o = prepare(k.args, &rc);
        EXPECT_EQ(rc, k.code) << k.args << "\n" << o;
        EXPECT_NE(o.find(k.want), std::string::npos) << k.args << "\n" << o;
    }
    run_cmd("ls " + dir, &ls);
    EXPECT_EQ(ls.find("x"), std::string::npos) << ls;
    rm_rf(dir);
}
