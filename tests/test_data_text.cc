// Issue 41 item 2: the tokenized data kinds (train/data_text.h). Documents of a JSONL file (or whole text
// files) through a tokenizer.json, each wrapped in the tokenizer's template and followed by EOS, packed into
// one stream: the stream must be exactly the concatenation of Hugging Face's ids (tests/data/tokenizers/*/
// expected.jsonl, ids_special) with EOS between documents, the windows must be the stream's blocks, and any
// world size must see the same global batch at every position (what a resume from train_state.data_pos on
// another world size relies on).
#include <gtest/gtest.h>

#include <jansson.h>

#include <string>
#include <vector>

extern "C" {
#include "pipeline/yaml_load.h"
#include "tokenizer/tok.h"
#include "train/data.h"
}
#include "data_util.h"
#include "test_util.h"
#include "tokenizer_util.h"

using namespace fsdp_test;

namespace {

data_config config(const std::string &yaml, const std::string &model_hf = "") {
    fsdp_value *v = nullptr, *m = nullptr;
    fsdp_err err;
    data_config c;
    memset(&c, 0, sizeof c);
    EXPECT_EQ(yaml_load_string(yaml.c_str(), yaml.size(), "data", 0, 0, &v, &err), 0) << err.msg;
    EXPECT_EQ(data_config_from_value(v, 5, &c, &err), 0) << err.msg;
    std::string my = "{from_hf: " + model_hf + "}";
    if (!model_hf.empty()) {
        EXPECT_EQ(yaml_load_string(my.c_str(), my.size(), "model", 0, 0, &m, &err), 0);
    }
    EXPECT_EQ(data_config_model(&c, m, &err), 0) << err.msg;
    val_free(v);
    val_free(m);
    return c;
}


} // namespace

// The packed stream is HF's ids, document after document, with EOS between them; sequential windows are its
// blocks; the labels are the inputs shifted by one.
TEST(DataText, JsonlStreamIsHFIdsWithEosBetweenDocuments) {
    std::string dir = make_tmpdir("dtext");
    std::vector<std::string> docs = tok_corpus();
    std::string path = write_corpus_jsonl(dir + "/train.jsonl", "body");
    const char *styles[][2] = {{"llama3", "<|end_of_text|>"}, {"neox", "<|endoftext|>"}, {"spm_legacy", "</s>"}};
    for (auto &st : styles) {
        SCOPED_TRACE(st[0]);
        data_config c = config("{kind: jsonl, path: " + path + ", field: body, tokenizer: tests/data/tokenizers/" + st[0] +
                               ", eos: \"" + st[1] + "\", batch_size: 4, seq_len: 64, order: sequential}");
        data_source *d = nullptr;
        fsdp_err err;
        ASSERT_EQ(data_open(&c, 6100, 1, 0, &d, &err), 0) << err.msg;
        data_close(d);
        tok_tokenizer *t = nullptr;
        ASSERT_EQ(tok_load((std::string("tests/data/tokenizers/") + st[0]).c_str(), &t, &err), 0) << err.msg;
        int32_t eos = tok_token_id(t, st[1]);
        tok_free(t);
        ASSERT_GE(eos, 0);
        std::vector<int32_t> want = hf_stream(st[0], eos);
        size_t blocks = want.size() / 65;
        ASSERT_GT(blocks, 40u);
        for (uint64_t pos = 0; pos < 12; pos++) {
            std::vector<int32_t> in = batch(c, 6100, 1, 0, pos), lab = batch(c, 6100, 1, 0, pos, true);
            for (size_t b = 0; b < 4; b++) {
                size_t blk = (pos * 4 + b) % blocks;
                std::vector<int32_t> wi(want.begin() + (long)(blk * 65), want.begin() + (long)(blk * 65 + 64));
                std::vector<int32_t> wl(want.begin() + (long)(blk * 65 + 1), want.begin() + (long)(blk * 65 + 65));
                EXPECT_EQ(std::vector<int32_t>(in.begin() + (long)(b * 64), in.begin() + (long)(b * 64 + 64)), wi) << pos << " " << b;
                EXPECT_EQ(std::vector<int32_t>(lab.begin() + (long)(b * 64), lab.begin() + (long)(b * 64 + 64)), wl);
            }
        }
    }
    rm_rf(dir);
}

// Random windows: a pure function of the position, the same global batch on 1, 2 and 4 ranks.
TEST(DataText, AnyWorldSizeSeesTheSameTokens) {
    std::string dir = make_tmpdir("dtext");
    std::string path = write_corpus_jsonl(dir + "/train.jsonl");
    // the tokenizer by default: the model's from_hf directory (here the tokenizer's own directory)
    data_config c = config("{kind: jsonl, path: " + path + ", eos: \"<|endoftext|>\", batch_size: 8, seq_len: 32}",
                           "tests/data/tokenizers/neox");
    EXPECT_STREQ(c.tokenizer, "tests/data/tokenizers/neox");
    for (uint64_t pos : {0ull, 1ull, 7ull, 1000ull}) {
        std::vector<int32_t> one = batch(c, 6000, 1, 0, pos);
        for (int world : {2, 4}) {
            std::vector<int32_t> all;
            for (int r = 0; r < world; r++) {
                std::vector<int32_t> part = batch(c, 6000, world, r, pos);
                all.insert(all.end(), part.begin(), part.end());
            }
            EXPECT_EQ(all, one) << "pos " << pos << " world " << world;
        }
    }
    EXPECT_NE(batch(c, 6000, 1, 0, 0), batch(c, 6000, 1, 0, 1));
    rm_rf(dir);
}

// kind text with a tokenizer: each file one document, in the sorted order of the glob.
TEST(DataText, TextFilesAreDocuments) {
    std::string dir = make_tmpdir("dtext");
    std::vector<std::string> docs = tok_corpus();
    write_file(dir + "/b.txt", docs[1]);
    write_file(dir + "/a.txt", docs[0]);
    write_file(dir + "/c.txt", docs[9]);
    data_config c = config("{kind: text, path: \"" + dir + "/*.txt\", tokenizer: tests/data/tokenizers/qwen/tokenizer.json.gz, "
                           "eos: \"<|endoftext|>\", batch_size: 1, seq_len: 4, order: sequential}");
    // a .gz is not a tokenizer.json: the error names it
    data_source *d = nullptr;
    fsdp_err err;
    EXPECT_NE(data_open(&c, 200000, 1, 0, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("tokenizer.json.gz: not valid JSON"), std::string::npos) << err.msg;
    // a.txt (doc 0) is BOS, its ids, EOS; the window after it starts with b.txt's BOS
    std::vector<int32_t> want;
    std::string all = read_file("tests/data/tokenizers/llama3/expected.jsonl");
    json_error_t je;
    json_t *j = json_loadb(all.data(), all.find('\n'), 0, &je), *ids = json_object_get(j, "ids_special");
    for (size_t k = 0; k < json_array_size(ids); k++) want.push_back((int32_t)json_integer_value(json_array_get(ids, k)));
    json_decref(j);
    ASSERT_GT(want.size(), 2u);
    EXPECT_EQ(want[0], 6000); // <|begin_of_text|>: the template's
    want.push_back(6001);     // <|end_of_text|>
    c = config("{kind: text, path: \"" + dir + "/*.txt\", tokenizer: tests/data/tokenizers/llama3, "
               "eos: \"<|end_of_text|>\", batch_size: 1, seq_len: " + std::to_string(want.size()) + ", order: sequential}");
    ASSERT_EQ(data_open(&c, 6100, 1, 0, &d, &err), 0) << err.msg;
    data_close(d);
    std::vector<int32_t> b0 = batch(c, 6100, 1, 0, 0), l0 = batch(c, 6100, 1, 0, 0, true);
    EXPECT_EQ(b0, want);
    EXPECT_EQ(l0.back(), 6000);

    rm_rf(dir);
}

TEST(DataText, ErrorsNameWhatIsWrong) {
    std::string dir = make_tmpdir("dtext");
    write_file(dir + "/ok.jsonl", "{\"text\": \"hello there, a few words of text to make tokens\"}\n");
    write_file(dir + "/bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n");
    write_file(dir + "/empty.jsonl", "\n\n");
    const std::string tok = "tokenizer: tests/data/tokenizers/neox, ";
    struct Case {
        std::string yaml;
        int vocab;
        std::string want;
    } cases[] = {
        {"{kind: jsonl, path: " + dir + "/ok.jsonl, " + tok + "eos: \"<|endoftext|>\", batch_size: 1, seq_len: 4}", 300,
         "has 5012 ids, more than the model's vocab_size 300"},
        {"{kind: jsonl, path: " + dir + "/ok.jsonl, " + tok + "eos: \"<nope>\", batch_size: 1, seq_len: 4}", 6000,
         "the EOS token \"<nope>\" is not in tests/data/tokenizers/neox's vocabulary"},
        {"{kind: jsonl, path: " + dir + "/ok.jsonl, " + tok + "batch_size: 1, seq_len: 4}", 6000,
         "has no tokenizer_config.json with an eos_token"},
        {"{kind: jsonl, path: " + dir + "/bad.jsonl, " + tok + "eos: \"<|endoftext|>\", batch_size: 1, seq_len: 4}", 6000,
         dir + "/bad.jsonl:2: no field \"text\""},
        {"{kind: jsonl, path: " + dir + "/empty.jsonl, " + tok + "eos: \"<|endoftext|>\", batch_size: 1, seq_len: 4}", 6000,
         "no documents (the file is empty)"},
        {"{kind: jsonl, path: " + dir + "/ok.jsonl, " + tok + "eos: \"<|endoftext|>\", batch_size: 1, seq_len: 4000}", 6000,
         "fewer than seq_len + 1"},
        {"{kind: jsonl, path: " + dir + "/ok.jsonl, tokenizer: " + dir + ", eos: x, batch_size: 1, seq_len: 4}", 6000,
         "no tokenizer.json there"},
        {"{kind: jsonl, path: " + dir + "/none*.jsonl, " + tok + "eos: x, batch_size: 1, seq_len: 4}", 6000, "no file matches"},
    };
    for (const Case &k : cases) {
        data_config c = config(k.yaml);
        data_source *d = nullptr;
        fsdp_err err;
        int rc = data_open(&c, k.vocab, 1, 0, &d, &err);
        EXPECT_NE(rc, 0) << k.yaml;
        EXPECT_NE(std::string(err.msg).find(k.want), std::string::npos) << k.yaml << "\n" << err.msg;
        data_close(d);
    }
    // the recipe keys' own errors
    fsdp_value *v = nullptr, *m = nullptr;
    fsdp_err err;
    data_config c;
    std::string y = "{kind: jsonl, path: x.jsonl}";
    ASSERT_EQ(yaml_load_string(y.c_str(), y.size(), "data", 0, 0, &v, &err), 0);
    ASSERT_EQ(data_config_from_value(v, 0, &c, &err), 0) << err.msg;
    EXPECT_EQ(data_config_model(&c, m, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("kind jsonl needs a tokenizer"), std::string::npos) << err.msg;
    val_free(v);
    for (const char *bad : {"{kind: tokens, path: x.bin, field: body}", "{kind: jsonl, path: x.jsonl, pack: false}",
                            "{kind: jsonl, path: x.jsonl, template: maybe}"}) {
        ASSERT_EQ(yaml_load_string(bad, strlen(bad), "data", 0, 0, &v, &err), 0);
        EXPECT_EQ(data_config_from_value(v, 0, &c, &err), FSDP_E_INVALID) << bad;
        val_free(v);
    }
    rm_rf(dir);
}
