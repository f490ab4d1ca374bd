// Training data sources: determinism, world-size invariance, resumable positions, errors.
#include <gtest/gtest.h>

#include <vector>

extern "C" {
#include "pipeline/yaml_load.h"
#include "train/data.h"
}
#include "data_util.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {
data_config cfg_of(data_kind kind, const std::string &path, int64_t B, int64_t T, int token_bytes = 2) {
    data_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    snprintf(c.path, sizeof c.path, "%s", path.c_str());
    c.batch_size = B;
    c.seq_len = T;
    c.token_bytes = token_bytes;
    c.seed = 1234;
    return c;
}

int parse(const std::string &text, fsdp_value **v, fsdp_err *err) {
    return yaml_load_string(text.c_str(), text.size(), "data", 0, 0, v, err);
}

}  // namespace

TEST(Data, WorldSizeInvariantAndDeterministic) {
    std::string dir = make_tmpdir("fsdp-data");
    std::string text;
    for (int i = 0; i < 500; i++) text += "the quick brown fox " + std::to_string(i) + "\n";
    write_file(dir + "/t.txt", text);
    for (data_kind k : {DATA_TEXT, DATA_SYNTHETIC}) {
        data_config c = cfg_of(k, dir + "/t.txt", 12, 16);
        for (uint64_t pos : {0ull, 1ull, 77ull}) {
            std::vector<int32_t> whole = batch(c, 256, 1, 0, pos);
            EXPECT_EQ(whole, batch(c, 256, 1, 0, pos));  // deterministic
            for (int world : {2, 3, 4}) {
                std::vector<int32_t> cat;
                for (int r = 0; r < world; r++) {
                    auto part = batch(c, 256, world, r, pos);
                    cat.insert(cat.end(), part.begin(), part.end());
                }
                EXPECT_EQ(cat, whole) << "world " << world << " pos " << pos;
            }
        }
        EXPECT_NE(batch(c, 256, 1, 0, 0), batch(c, 256, 1, 0, 1));  // positions differ
    }
    // labels are the inputs shifted by one token, from the file
    data_config c = cfg_of(DATA_TEXT, dir + "/t.txt", 2, 16);
    auto in = batch(c, 256, 1, 0, 5), lab = batch(c, 256, 1, 0, 5, true);
    for (int t = 0; t + 1 < 16; t++) EXPECT_EQ(lab[t], in[t + 1]);
    size_t start = text.find(std::string(in.begin(), in.begin() + 16).c_str(), 0);
    EXPECT_NE(start, std::string::npos);
    rm_rf(dir);
}

TEST(Data, TokenFilesAndErrors) {
    std::string dir = make_tmpdir("fsdp-data");
    std::vector<uint16_t> toks(1000);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = (uint16_t)(i % 50);
    write_file(dir + "/a.bin", std::string((const char *)toks.data(), toks.size() * 2));
    data_config c = cfg_of(DATA_TOKENS, dir + "/a.bin", 4, 8);
    auto in = batch(c, 64, 1, 0, 3);
    for (size_t t = 1; t < 8; t++) EXPECT_EQ(in[t], (in[t - 1] + 1) % 50);
    // uint32 files
    std::vector<uint32_t> t32(500, 70000);
    write_file(dir + "/b.bin", std::string((const char *)t32.data(), t32.size() * 4));
    data_config c32 = cfg_of(DATA_TOKENS, dir + "/b.bin", 2, 8, 4);
    EXPECT_EQ(batch(c32, 80000, 1, 0, 0)[0], 70000);
    // an id >= vocab names the file and the offset, at open time (the whole file is scanned)
    data_source *d;
    fsdp_err err;
    EXPECT_NE(data_open(&c32, 1000, 1, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find(dir + "/b.bin: token id 70000 at token 0 (byte offset 0)"), std::string::npos)
        << err.msg;
    // batch not divisible by the world size
    EXPECT_NE(data_open(&c, 64, 3, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("does not divide evenly over 3 ranks"), std::string::npos) << err.msg;
    // odd byte count for uint16, missing file, too short
    write_file(dir + "/odd.bin", "abc");
    data_config co = cfg_of(DATA_TOKENS, dir + "/odd.bin", 1, 1);
    EXPECT_NE(data_open(&co, 64, 1, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("not a whole number of uint16 tokens"), std::string::npos) << err.msg;
    data_config cm = cfg_of(DATA_TOKENS, dir + "/missing.bin", 1, 1);
    EXPECT_NE(data_open(&cm, 64, 1, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("data.path '" + dir + "/missing.bin': no file matches"), std::string::npos) << err.msg;
    data_config cs = cfg_of(DATA_TOKENS, dir + "/a.bin", 1, 5000);
    EXPECT_NE(data_open(&cs, 64, 1, 0, &d, &err), 0);
    rm_rf(dir);
}

TEST(Data, SafetensorsFixedBatch) {
    data_config c = cfg_of(DATA_SAFETENSORS, tiny("batch.safetensors"), 2, 32);
    auto in0 = batch(c, 256, 1, 0, 0), in7 = batch(c, 256, 1, 0, 7);
    EXPECT_EQ(in0, in7);  // the same batch every step
    auto r0 = batch(c, 256, 2, 0, 0), r1 = batch(c, 256, 2, 1, 0);
    r0.insert(r0.end(), r1.begin(), r1.end());
    EXPECT_EQ(r0, in0);
    data_source *d;
    fsdp_err err;
    data_config bad = cfg_of(DATA_SAFETENSORS, tiny("batch.safetensors"), 4, 32);
    EXPECT_NE(data_open(&bad, 256, 1, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("wants [batch_size 4, seq_len 32]"), std::string::npos) << err.msg;
    EXPECT_NE(data_open(&c, 100, 1, 0, &d, &err), 0);  // ids >= vocab 100
    EXPECT_NE(std::string(err.msg).find("outside the model's vocabulary [0, 100)"), std::string::npos) << err.msg;
    data_config none = cfg_of(DATA_SAFETENSORS, tiny("model_init.safetensors"), 2, 32);
    EXPECT_NE(data_open(&none, 256, 1, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("no tensor 'input_ids'"), std::string::npos) << err.msg;
}

TEST(Data, SequentialOrderReadsConsecutiveBlocks) {
    // order: sequential = torch_baseline.py --tokens / llm.c: sample b of batch pos is block
    // pos*B + b of T+1 tokens (inputs its first T, labels its last T), wrapping at the end
    std::string dir = make_tmpdir("fsdp-data");
    const int64_t T = 4, B = 2, nblocks = 10;
    std::vector<uint32_t> toks((size_t)(nblocks * (T + 1) + 3));  // 3 trailing tokens never used
    for (size_t i = 0; i < toks.size(); i++) toks[i] = (uint32_t)i;
    write_file(dir + "/s.bin", std::string((const char *)toks.data(), toks.size() * 4));
    data_config c = cfg_of(DATA_TOKENS, dir + "/s.bin", B, T, 4);
    c.sequential = 1;
    for (uint64_t pos : {0ull, 1ull, 4ull, 5ull, 7ull}) {
        auto in = batch(c, 1000, 1, 0, pos), lab = batch(c, 1000, 1, 0, pos, true);
        for (int64_t b = 0; b < B; b++) {
            int64_t start = ((int64_t)pos * B + b) % nblocks * (T + 1);
            for (int64_t t = 0; t < T; t++) {
                EXPECT_EQ(in[(size_t)(b * T + t)], start + t) << "pos " << pos << " sample " << b;
                EXPECT_EQ(lab[(size_t)(b * T + t)], start + t + 1) << "pos " << pos << " sample " << b;
            }
        }
        // the same global batch on two ranks
        auto r0 = batch(c, 1000, 2, 0, pos), r1 = batch(c, 1000, 2, 1, pos);
        r0.insert(r0.end(), r1.begin(), r1.end());
        EXPECT_EQ(r0, in);
    }
    // the recipe key, and its errors
    fsdp_value *v = nullptr;
    fsdp_err err;
    data_config pc;
    ASSERT_EQ(parse("{kind: tokens, path: x.bin, order: sequential}", &v, &err), 0) << err.msg;
    ASSERT_EQ(data_config_from_value(v, 0, &pc, &err), 0) << err.msg;
    EXPECT_EQ(pc.sequential, 1);
    val_free(v);
    ASSERT_EQ(parse("{kind: tokens, path: x.bin, order: shuffled}", &v, &err), 0) << err.msg;
    EXPECT_EQ(data_config_from_value(v, 0, &pc, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("data.order must be random or sequential"), std::string::npos) << err.msg;
    val_free(v);
    ASSERT_EQ(parse("{kind: synthetic, order: sequential}", &v, &err), 0) << err.msg;
    EXPECT_EQ(data_config_from_value(v, 0, &pc, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("applies to kind text, jsonl, tokens or llmc only"), std::string::npos) << err.msg;
    val_free(v);
    rm_rf(dir);
}
