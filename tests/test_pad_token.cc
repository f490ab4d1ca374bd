// The embedding's padding row (Hugging Face's pad_token_id, which every class of the decoder family passes
// to nn.Embedding as padding_idx): config.json's key read as transformers does (absent: the class default,
// OLMoE's 1; null: none; negative: from the end of the vocabulary; outside it: an error naming the key),
// written back by the export, declared in a recipe, refused where it is not a token; and the training
// step gives that row no gradient from the lookup on every path while a tied head's own gradient into it
// stays.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "decoder_yaml_util.h"
#include "gpu_util.h"
#include "hf_grid_util.h"
#include "test_util.h"

extern "C" {
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_config.h"
#include "decoder/decoder_spec.h"
#include "decoder/hf_config.h"
#include "pipeline/yaml_load.h"
#include "runtime/comm.h"
#include "train/train_fsdp.h"
}

using namespace fsdp_test;

namespace {

// A grid config's config.json with key set to the JSON text `value` ("" removes it).
std::string with_key(const std::string &model, const char *key, const std::string &value) {
    json_error_t je;
    json_t *root = json_load_file(hf_grid::dir(model, "config.json").c_str(), 0, &je);
    EXPECT_TRUE(root) << je.text;
    if (!root) return "";
    if (value.empty()) {
        json_object_del(root, key);
    } else {
        json_t *v = json_loads(value.c_str(), JSON_DECODE_ANY, &je);
        EXPECT_TRUE(v) << value;
        json_object_set_new(root, key, v);
    }
    char *s = json_dumps(root, 0);
    std::string out = s;
    free(s);
    json_decref(root);
    return out;
}

int parse(const std::string &text, decoder_config *c, std::string *msg) {
    fsdp_err err;
    fsdp_err_clear(&err);
    int rc = hf_config_parse(text.data(), text.size(), "config.json", c, &err);
    *msg = err.msg;
    return rc;
}

}  // namespace

// config.json's pad_token_id as transformers builds the embedding from it.
TEST(PadToken, ConfigJsonAsTransformersReadsIt) {
    decoder_config c;
    std::string msg;
    // olmoe_00 sets pad_token_id 2 (its eos); llama_01 16
    ASSERT_EQ(hf_config_read(hf_grid::dir("olmoe_00").c_str(), &c, nullptr), 0);
    EXPECT_EQ(decoder_padding_idx(&c), 2);
    ASSERT_EQ(hf_config_read(hf_grid::dir("llama_01").c_str(), &c, nullptr), 0);
    EXPECT_EQ(decoder_padding_idx(&c), 16);
    // null: none, whatever the class's default
    ASSERT_EQ(parse(with_key("olmoe_00", "pad_token_id", "null"), &c, &msg), 0) << msg;
    EXPECT_EQ(decoder_padding_idx(&c), -1);
    // absent: the class's default, OlmoeConfig's pad_token_id = 1, the others None
    ASSERT_EQ(parse(with_key("olmoe_00", "pad_token_id", ""), &c, &msg), 0) << msg;
    EXPECT_EQ(decoder_padding_idx(&c), 1);
    for (const char *m : {"llama_00", "qwen2_00", "qwen3_00", "qwen3_moe_00", "mixtral_00"}) {
        ASSERT_EQ(parse(with_key(m, "pad_token_id", ""), &c, &msg), 0) << m << ": " << msg;
        EXPECT_EQ(decoder_padding_idx(&c), -1) << m;
    }
    // nn.Embedding counts a negative padding_idx from the end
    ASSERT_EQ(parse(with_key("llama_00", "pad_token_id", "-1"), &c, &msg), 0) << msg;
    EXPECT_EQ(decoder_padding_idx(&c), c.vocab_size - 1);
    // outside [-vocab, vocab), or not an integer: an error naming the key and the vocabulary
    for (const char *bad : {"77", "-78", "1.5", "\"0\"", "[0]"}) {
        EXPECT_EQ(parse(with_key("llama_00", "pad_token_id", bad), &c, &msg), FSDP_E_INVALID) << bad;
        EXPECT_NE(msg.find("config.json: \"pad_token_id\" is "), std::string::npos) << msg;
        EXPECT_NE(msg.find("vocab_size 77"), std::string::npos) << msg;
    }
    // OLMoE's default outside a small vocabulary: say so rather than build a model transformers cannot
    std::string tiny = with_key("olmoe_00", "pad_token_id", "");
    size_t at = tiny.find("\"vocab_size\": 77");
    ASSERT_NE(at, std::string::npos) << tiny;
    tiny.replace(at, strlen("\"vocab_size\": 77"), "\"vocab_size\": 1");
    EXPECT_EQ(parse(tiny, &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("default, 1, is outside the vocabulary"), std::string::npos) << msg;
}

// The export writes the key back (null when there is none, so that OLMoE's class default does not come
// back) and reads as the same padding row.
TEST(PadToken, ExportedConfigReadsBack) {
    for (const char *m : {"olmoe_00", "olmoe_02", "llama_01", "qwen3_moe_04", "mixtral_02"}) {
        SCOPED_TRACE(m);
        decoder_config c, back;
        fsdp_err err;
        ASSERT_EQ(hf_config_read(hf_grid::dir(m).c_str(), &c, &err), 0) << err.msg;
        char *text;
        ASSERT_EQ(hf_config_to_json(&c, FSDP_DT_F32, &text, &err), 0) << err.msg;
        std::string t = text;
        free(text);
        EXPECT_NE(t.find("\"pad_token_id\": "), std::string::npos) << t;
        ASSERT_EQ(hf_config_parse(t.data(), t.size(), "export", &back, &err), 0) << err.msg;
        EXPECT_EQ(decoder_padding_idx(&back), decoder_padding_idx(&c));
    }
}

// model.pad_token_id in a recipe: a token id or null, checked against the vocabulary.
TEST(PadToken, RecipeKey) {
    decoder_config c;
    std::string msg;
    ASSERT_EQ(from_yaml("model: {arch: qwen2, dim: 32, n_layers: 1, n_heads: 4, vocab_size: 50, pad_token_id: 0}\n", &c,
                        &msg),
              0)
        << msg;
    EXPECT_EQ(decoder_padding_idx(&c), 0);
    ASSERT_EQ(from_yaml("model: {from_hf: " + hf_grid::dir("olmoe_00") + ", pad_token_id: null}\n", &c, &msg), 0) << msg;
    EXPECT_EQ(decoder_padding_idx(&c), -1) << "null overrides the config's";
    EXPECT_EQ(from_yaml("model: {arch: qwen2, dim: 32, n_layers: 1, n_heads: 4, vocab_size: 50, pad_token_id: 50}\n", &c,
                        &msg),
              FSDP_E_INVALID);
    EXPECT_NE(msg.find("model.pad_token_id 50 is not a token of the vocabulary"), std::string::npos) << msg;
    EXPECT_EQ(from_yaml("model: {arch: qwen2, dim: 32, n_layers: 1, n_heads: 4, vocab_size: 50, pad_token_id: -1}\n", &c,
                        &msg),
              FSDP_E_INVALID);
    EXPECT_NE(msg.find("m.yaml:1:86: model.pad_token_id must be a token id >= 0 or null, got '-1'"), std::string::npos)
        << msg;
}

// The row's gradient on the CPU path: zero where the batch holds the pad token, whatever the checkpointing
// and accumulation; a tied head still puts its own gradient there (transformers' padding_idx stops only the
// lookup's); and without the pad id the same row gets the lookup's gradient (what the fix took away).
TEST(PadToken, NoGradientIntoThePaddingRowOnEveryCpuPath) {
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    for (const char *m : {"qwen3_04", "llama_04", "olmoe_00", "mixtral_04"}) {
        SCOPED_TRACE(m);
        decoder_config cfg;
        ASSERT_EQ(hf_config_read(hf_grid::dir(m).c_str(), &cfg, &err), 0) << err.msg;
        hf_grid::Ref ref(m);
        ASSERT_TRUE(ref.pad_in_batch) << "the config's batch holds its pad token";
        MoeTensors batch = moe_load_st(hf_grid::dir(m, "batch.safetensors"));
        MoeTensors want = moe_load_st(hf_grid::dir(m, "grads_step0.safetensors"));
        const std::vector<float> &g = want.at("model.embed_tokens.weight").f32;
        const int pad = decoder_padding_idx(&cfg), d = cfg.dim;
        double head_part = 0;
        for (int j = 0; j < d; j++) head_part = std::max(head_part, (double)std::fabs(g[(size_t)pad * d + j]));
        if (cfg.tie_embeddings)
            EXPECT_GT(head_part, 0) << "a tied head's gradient into the pad row is the reference's";
        else
            EXPECT_EQ(head_part, 0) << "transformers: no gradient into the padding row";
        for (int with_pad : {1, 0})
            for (int ac : {MODEL_BLOCKS_AC_NONE, MODEL_BLOCKS_AC_FULL, MODEL_BLOCKS_AC_SELECTIVE})
                for (int n_micro : {1, 2}) {
                    decoder_config use = cfg;
                    if (!with_pad) use.has_padding_idx = 0;
                    fsdp_state *s = moe_state_dir(hf_grid::dir(m), use, "model.safetensors");
                    train_fsdp *f;
                    ASSERT_EQ(train_fsdp_create_ac(s, decoder_blocks_cpu(&use), c, ref.rows / n_micro, ref.seq, ac, &f,
                                                   &err),
                              0)
                        << err.msg;
                    train_fsdp_result r;
                    ASSERT_EQ(train_fsdp_grads_accum(f, batch.at("input_ids").i32.data(), batch.at("labels").i32.data(),
                                                     n_micro, &r, &err),
                              0)
                        << err.msg;
                    const float *row = state_find(s, "tok_embeddings.weight")->grad + (size_t)pad * d;
                    double diff = 0;
                    for (int j = 0; j < d; j++) diff = std::max(diff, (double)std::fabs(row[j] - g[(size_t)pad * d + j]));
                    if (with_pad)
                        EXPECT_LE(diff, 1e-5 * (1 + head_part)) << "ac " << ac << ", " << n_micro << " micro-batches";
                    else
                        EXPECT_GT(diff, 1e-3) << "without padding_idx the lookup's gradient reaches the row";
                    train_fsdp_free(f);
                    state_free(s);
                }
    }
    comm_destroy(c);
}

namespace {

// init-meta of a recipe-declared model (HF init when init_std > 0) on `device`, saved as HF safetensors;
// the tensors by name.
MoeTensors init_and_export(const std::string &model, const std::string &device, const std::string &dir) {
    std::string recipe = dir + "/r.yaml", out = dir + "/out.safetensors";
    write_file(recipe, "model: {" + model + "}\n"
                       "stages:\n"
                       "  - {id: i, uses: init-meta, with: {seed: 5}}\n"
                       "  - {id: s, uses: save-safetensors, after: [i], with: {path: " + out + "}}\n");
    int rc;
    std::string o = run_np(1, recipe + " --set runtime.device=" + device, &rc);
    EXPECT_EQ(rc, 0) << o;
    MoeTensors t = moe_load_st(out);
    rm_rf(out);
    return t;
}

// transformers' _init_weights zeroes the padding row of an HF-initialised embedding: with pad_token_id the
// row is zeros and every other value is the one drawn without it; torchtitan's init (no padding_idx in its
// nn.Embedding) draws the row as always.
void expect_padding_row_init(const std::string &device) {
    std::string dir = make_tmpdir("fsdp-padinit");
    const std::string base = "arch: qwen2, dim: 32, n_layers: 1, n_heads: 4, vocab_size: 50, ffn_hidden: 40";
    for (bool tied : {false, true}) {
        std::string m = base + (tied ? ", tie_embeddings: true" : "");
        MoeTensors a = init_and_export(m, device, dir), b = init_and_export(m + ", pad_token_id: 7", device, dir);
        ASSERT_EQ(a.size(), b.size());
        for (const auto &kv : a) {
            const std::vector<float> &x = kv.second.f32, &y = b.at(kv.first).f32;
            ASSERT_EQ(x.size(), y.size()) << kv.first;
            for (size_t i = 0; i < x.size(); i++) {
                if (kv.first == "tok_embeddings.weight" && i / 32 == 7) {
                    ASSERT_EQ(y[i], 0.0f) << device << ": element " << i << " of the padding row";
                    ASSERT_NE(x[i], 0.0f) << "drawn without padding_idx";
                } else {
                    ASSERT_EQ(y[i], x[i]) << device << ": " << kv.first << "[" << i << "]";
                }
            }
        }
    }
    MoeTensors tt = init_and_export("arch: llama3, dim: 32, n_layers: 1, n_heads: 4, vocab_size: 50, pad_token_id: 7",
                                    device, dir);
    const std::vector<float> &e = tt.at("tok_embeddings.weight").f32;
    EXPECT_NE(e[7 * 32], 0.0f) << "torchtitan's init has no padding row";
    rm_rf(dir);
}

}  // namespace

TEST(PadToken, HfInitZeroesThePaddingRow) { expect_padding_row_init("cpu"); }

TEST(PadTokenGpu, HfInitZeroesThePaddingRowOnTheGpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    expect_padding_row_init("cuda");
}
