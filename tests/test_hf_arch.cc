// Architectures as data (decoder/decoder_arch.h) and Hugging Face config.json (decoder/hf_config.h):
// both config forms transformers writes, the architecture from model_type / architectures, what
// fsdp-run refuses, the writer, the recipe's model: keys, the presets against the published
// configs, and the parameter table of each architecture.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <string>
#include <sys/stat.h>

#include "decoder_yaml_util.h"
#include "test_util.h"

extern "C" {
#include "ckpt/namemap.h"
#include "decoder/hf_config.h"
#include "decoder/decoder_spec.h"
#include "decoder/decoder_config.h"
#include "decoder/decoder_arch.h"
#include "decoder/decoder_params.h"
#include "pipeline/yaml_load.h"
}

using namespace fsdp_test;

namespace {

std::string hf(const std::string &model) { return fixtures_dir() + "/hf-5.24/" + model; }

struct Dir {
    std::string d = make_tmpdir("fsdp-hfarch");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

int parse(const std::string &text, decoder_config *c, std::string *msg) {
    fsdp_err err;
    fsdp_err_clear(&err);
    int rc = hf_config_parse(text.data(), text.size(), "cfg.json", c, &err);
    if (msg) *msg = err.msg;
    return rc;
}

// The fixture's config.json with `edit` applied to its JSON object, as text.
std::string edited(const std::string &model, void (*edit)(json_t *)) {
    json_error_t je;
    json_t *root = json_load_file((hf(model) + "/config.json").c_str(), 0, &je);
    EXPECT_TRUE(root) << je.text;
    if (!root) return "";
    edit(root);
    char *s = json_dumps(root, 0);
    std::string out = s;
    free(s);
    json_decref(root);
    return out;
}

// Every field of two configs that describes the model (not the preset's name).
void expect_same_model(const decoder_config &a, const decoder_config &b, const std::string &what) {
    EXPECT_EQ(a.arch, b.arch) << what;
    EXPECT_EQ(a.dim, b.dim) << what;
    EXPECT_EQ(a.n_layers, b.n_layers) << what;
    EXPECT_EQ(a.n_heads, b.n_heads) << what;
    EXPECT_EQ(a.n_kv_heads, b.n_kv_heads) << what;
    EXPECT_EQ(a.vocab_size, b.vocab_size) << what;
    EXPECT_EQ(a.head_dim, b.head_dim) << what;
    EXPECT_EQ(a.ffn_hidden, b.ffn_hidden) << what;
    EXPECT_EQ(a.norm_eps, b.norm_eps) << what;
    EXPECT_EQ(a.rope_theta, b.rope_theta) << what;
    EXPECT_EQ(a.max_seq_len, b.max_seq_len) << what;
    EXPECT_EQ(a.rope_scaling, b.rope_scaling) << what;
    if (a.rope_scaling == DECODER_ROPE_LLAMA3) {
        EXPECT_EQ(a.rope_factor, b.rope_factor) << what;
        EXPECT_EQ(a.rope_low_freq_factor, b.rope_low_freq_factor) << what;
        EXPECT_EQ(a.rope_high_freq_factor, b.rope_high_freq_factor) << what;
        EXPECT_EQ(a.rope_original_max_pos, b.rope_original_max_pos) << what;
    }
    EXPECT_EQ(a.qkv_bias, b.qkv_bias) << what;
    EXPECT_EQ(a.qk_norm, b.qk_norm) << what;
    EXPECT_EQ(a.tie_embeddings, b.tie_embeddings) << what;
}

}  // namespace

// Each fixture's config.json (transformers 5 form) against the config the generator passed to
// transformers (reference.json "config"), key by key.
TEST(HfArchConfig, Transformers5FixturesMatchTheGeneratorsConfig) {
    struct {
        const char *model;
        decoder_arch arch;
        int bias, qk_norm;
    } want[] = {{"qwen2_tiny", DECODER_ARCH_QWEN2, 1, 0},
                {"qwen3_tiny", DECODER_ARCH_QWEN3, 0, 1},
                {"llama32_tiny", DECODER_ARCH_LLAMA3, 0, 0}};
    for (const auto &w : want) {
        decoder_config c;
        fsdp_err err;
        ASSERT_EQ(hf_config_read(hf(w.model).c_str(), &c, &err), 0) << err.msg;
        json_error_t je;
        json_t *ref = json_load_file((hf(w.model) + "/reference.json").c_str(), 0, &je);
        ASSERT_TRUE(ref) << je.text;
        json_t *k = json_object_get(ref, "config");
        auto num = [&](const char *key) { return json_number_value(json_object_get(k, key)); };
        EXPECT_EQ(c.arch, w.arch) << w.model;
        EXPECT_EQ(c.qkv_bias, w.bias) << w.model;
        EXPECT_EQ(c.qk_norm, w.qk_norm) << w.model;
        EXPECT_EQ(c.dim, num("hidden_size")) << w.model;
        EXPECT_EQ(c.ffn_hidden, num("intermediate_size")) << w.model;
        EXPECT_EQ(c.n_layers, num("num_hidden_layers")) << w.model;
        EXPECT_EQ(c.n_heads, num("num_attention_heads")) << w.model;
        EXPECT_EQ(c.n_kv_heads, num("num_key_value_heads")) << w.model;
        EXPECT_EQ(c.vocab_size, num("vocab_size")) << w.model;
        EXPECT_EQ(c.max_seq_len, num("max_position_embeddings")) << w.model;
        EXPECT_EQ(c.norm_eps, num("rms_norm_eps")) << w.model;
        EXPECT_EQ(c.rope_theta, num("rope_theta")) << w.model;
        EXPECT_EQ(c.tie_embeddings, json_is_true(json_object_get(k, "tie_word_embeddings"))) << w.model;
        int hd = json_object_get(k, "head_dim") ? (int)num("head_dim") : c.dim / c.n_heads;
        EXPECT_EQ(c.head_dim, hd) << w.model;
        json_t *rs = json_object_get(k, "rope_scaling");
        if (rs) {
            EXPECT_EQ(c.rope_scaling, DECODER_ROPE_LLAMA3);
            EXPECT_EQ(c.rope_factor, json_number_value(json_object_get(rs, "factor")));
            EXPECT_EQ(c.rope_low_freq_factor, json_number_value(json_object_get(rs, "low_freq_factor")));
            EXPECT_EQ(c.rope_high_freq_factor, json_number_value(json_object_get(rs, "high_freq_factor")));
            EXPECT_EQ(c.rope_original_max_pos,
                      json_integer_value(json_object_get(rs, "original_max_position_embeddings")));
        } else {
            EXPECT_EQ(c.rope_scaling, DECODER_ROPE_NONE) << w.model;
        }
        json_decref(ref);
    }
    // Qwen3's q projection is wider than the model: 4 heads of 32 on a 64-wide model
    decoder_config q3;
    fsdp_err err;
    ASSERT_EQ(hf_config_read((hf("qwen3_tiny") + "/config.json").c_str(), &q3, &err), 0) << err.msg;
    EXPECT_EQ(q3.n_heads * q3.head_dim, 128);
}

// The transformers 4 form of the same configs (top-level rope_theta and rope_scaling, with the
// legacy "type" key too) gives the same model.
TEST(HfArchConfig, Transformers4FormEqualsTransformers5Form) {
    for (const char *m : {"qwen2_tiny", "qwen3_tiny", "llama32_tiny"}) {
        decoder_config v5, v4;
        fsdp_err err;
        ASSERT_EQ(hf_config_read(hf(m).c_str(), &v5, &err), 0) << err.msg;
        std::string t4 = edited(m, [](json_t *o) {
            json_t *rp = json_incref(json_object_get(o, "rope_parameters"));
            json_object_del(o, "rope_parameters");
            json_object_set(o, "rope_theta", json_object_get(rp, "rope_theta"));
            if (!strcmp(json_string_value(json_object_get(rp, "rope_type")), "default")) {
                json_object_set_new(o, "rope_scaling", json_null());
            } else {
                json_object_del(rp, "rope_theta");
                json_object_set_new(rp, "type", json_string("llama3"));  // the legacy key
                json_object_del(rp, "rope_type");
                json_object_set(o, "rope_scaling", rp);
            }
            json_decref(rp);
        });
        ASSERT_EQ(t4.find("rope_parameters"), std::string::npos);
        std::string msg;
        ASSERT_EQ(parse(t4, &v4, &msg), 0) << msg;
        expect_same_model(v5, v4, m);
    }
    // a rope dict nested under its one layer type (transformers 5 with layer_types)
    std::string nested = edited("llama32_tiny", [](json_t *o) {
        json_t *rp = json_incref(json_object_get(o, "rope_parameters"));
        json_t *n = json_object();
        json_object_set_new(n, "full_attention", rp);
        json_object_set_new(o, "rope_parameters", n);
    });
    decoder_config a, b;
    std::string msg;
    fsdp_err err;
    ASSERT_EQ(hf_config_read(hf("llama32_tiny").c_str(), &a, &err), 0) << err.msg;
    ASSERT_EQ(parse(nested, &b, &msg), 0) << msg;
    expect_same_model(a, b, "nested rope_parameters");
    EXPECT_EQ(b.rope_factor, 32.0);
}

// Keys a config.json leaves out take the transformers class defaults.
TEST(HfArchConfig, MissingKeysTakeTheTransformersDefaults) {
    const char *minimal = "{\"model_type\": \"%s\", \"hidden_size\": 256, \"intermediate_size\": 512, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 1000}";
    char buf[512];
    decoder_config c;
    std::string msg;
    snprintf(buf, sizeof buf, minimal, "qwen3");
    ASSERT_EQ(parse(buf, &c, &msg), 0) << msg;
    EXPECT_EQ(c.head_dim, 128);  // Qwen3Config's default head_dim
    EXPECT_EQ(c.n_kv_heads, 4);
    EXPECT_EQ(c.norm_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 10000.0);
    EXPECT_EQ(c.tie_embeddings, 0);
    EXPECT_EQ(c.rope_scaling, DECODER_ROPE_NONE);
    EXPECT_EQ(c.max_seq_len, 2048);
    snprintf(buf, sizeof buf, minimal, "llama");
    ASSERT_EQ(parse(buf, &c, &msg), 0) << msg;
    EXPECT_EQ(c.head_dim, 64);  // hidden_size / heads
    EXPECT_EQ(c.arch, DECODER_ARCH_LLAMA3);
    EXPECT_EQ(c.qkv_bias, 0);
    snprintf(buf, sizeof buf, minimal, "qwen2");
    ASSERT_EQ(parse(buf, &c, &msg), 0) << msg;
    EXPECT_EQ(c.qkv_bias, 1);  // Qwen2 always has q/k/v biases
    // no model_type: the class name decides
    ASSERT_EQ(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 8,"
                    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"head_dim\": 16, \"vocab_size\": 10}",
                    &c, &msg),
              0)
        << msg;
    EXPECT_EQ(c.arch, DECODER_ARCH_QWEN3);
}

// What fsdp-run cannot train is a clear error naming the file, the key and the value.
TEST(HfArchConfig, UnsupportedArchitecturesAndFeaturesAreNamed) {
    struct {
        void (*edit)(json_t *);
        const char *needle;
    } cases[] = {
        {[](json_t *o) {
             json_object_set_new(o, "model_type", json_string("deepseek_v3"));
             json_object_set_new(o, "architectures", json_pack("[s]", "DeepseekV3ForCausalLM"));
         },
         "cfg.json: model_type 'deepseek_v3' (DeepseekV3ForCausalLM) is not an architecture fsdp-run trains (supported "
         "model types: llama, qwen2, qwen3, qwen3_moe, olmoe, mixtral)"},
        {[](json_t *o) { json_object_set_new(o, "architectures", json_pack("[s]", "LlamaForSequenceClassification")); },
         "architectures[0] is 'LlamaForSequenceClassification', but fsdp-run trains model_type 'llama' as the causal "
         "LM 'LlamaForCausalLM'"},
        {[](json_t *o) {
             json_object_del(o, "model_type");
             json_object_del(o, "architectures");
         },
         "neither \"model_type\" nor \"architectures\""},
        {[](json_t *o) { json_object_set_new(o, "hidden_act", json_string("gelu")); }, "hidden_act 'gelu' is not supported"},
        {[](json_t *o) { json_object_set_new(o, "attention_bias", json_true()); },
         "\"attention_bias\": true is not supported for model_type 'llama'"},
        {[](json_t *o) { json_object_set_new(o, "mlp_bias", json_true()); }, "\"mlp_bias\": true is not supported"},
        {[](json_t *o) {
             json_object_set_new(json_object_get(o, "rope_parameters"), "rope_type", json_string("yarn"));
         },
         "RoPE type 'yarn' is not supported (supported: default, llama3)"},
        {[](json_t *o) { json_object_del(json_object_get(o, "rope_parameters"), "low_freq_factor"); },
         "llama3 RoPE scaling needs \"low_freq_factor\""},
        {[](json_t *o) { json_object_set_new(o, "partial_rotary_factor", json_real(0.5)); },
         "partial_rotary_factor 0.5 is not supported"},
        {[](json_t *o) { json_object_del(o, "hidden_size"); }, "\"hidden_size\" is missing"},
        {[](json_t *o) { json_object_set_new(o, "num_hidden_layers", json_string("2")); },
         "\"num_hidden_layers\" is \"2\", expected an integer"},
        {[](json_t *o) { json_object_set_new(o, "num_key_value_heads", json_integer(3)); },
         "model.n_heads (4) must be divisible by model.n_kv_heads (3)"},
        {[](json_t *o) { json_object_set_new(o, "rms_norm_eps", json_real(-1)); },
         "\"rms_norm_eps\" is -1.0, expected a finite number > 0"},
        {[](json_t *o) { json_object_set_new(o, "tie_word_embeddings", json_integer(1)); },
         "\"tie_word_embeddings\" must be true or false"},
    };
    for (const auto &k : cases) {
        decoder_config c;
        std::string msg;
        EXPECT_EQ(parse(edited("llama32_tiny", k.edit), &c, &msg), FSDP_E_INVALID) << k.needle;
        EXPECT_NE(msg.find(k.needle), std::string::npos) << "want: " << k.needle << "\ngot:  " << msg;
    }
    // sliding windows and layer types of Qwen
    decoder_config c;
    std::string msg;
    EXPECT_EQ(parse(edited("qwen2_tiny", [](json_t *o) { json_object_set_new(o, "use_sliding_window", json_true()); }),
                    &c, &msg),
              FSDP_E_INVALID);
    EXPECT_NE(msg.find("\"use_sliding_window\": true is not supported for model_type 'qwen2'"), std::string::npos) << msg;
    EXPECT_EQ(parse(edited("qwen3_tiny",
                           [](json_t *o) {
                               json_array_set_new(json_object_get(o, "layer_types"), 1,
                                                  json_string("sliding_attention"));
                           }),
                    &c, &msg),
              FSDP_E_INVALID);
    EXPECT_NE(msg.find("layer_types[1] is 'sliding_attention'"), std::string::npos) << msg;
    // not JSON, not an object
    EXPECT_EQ(parse("{\"model_type\": ", &c, &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("cfg.json: not valid JSON (line 1"), std::string::npos) << msg;
    EXPECT_EQ(parse("[1]", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("cfg.json: not a JSON object"), std::string::npos) << msg;
}

// A directory without config.json, and a FIFO in its place (read without ever blocking).
TEST(HfArchConfig, MissingFileAndFifoFailClearly) {
    Dir t;
    decoder_config c;
    fsdp_err err;
    EXPECT_NE(hf_config_read(t.d.c_str(), &c, &err), 0);
    EXPECT_NE(std::string(err.msg).find(t / "config.json"), std::string::npos) << err.msg;
    ASSERT_EQ(mkfifo((t / "config.json").c_str(), 0600), 0);
    EXPECT_NE(hf_config_read(t.d.c_str(), &c, &err), 0);
    EXPECT_NE(std::string(err.msg).find("is a FIFO, not a regular file"), std::string::npos) << err.msg;
}

// The writer's config.json parses back to the same model for every architecture and RoPE form,
// is the transformers 4 form, and is replaced atomically.
TEST(HfArchConfig, WrittenConfigReadsBackAsTheSameModel) {
    Dir t;
    for (const char *m : {"qwen2_tiny", "qwen3_tiny", "llama32_tiny"}) {
        decoder_config a, b;
        fsdp_err err;
        ASSERT_EQ(hf_config_read(hf(m).c_str(), &a, &err), 0) << err.msg;
        ASSERT_EQ(hf_config_write(&a, FSDP_DT_BF16, t.d.c_str(), &err), 0) << err.msg;
        ASSERT_EQ(hf_config_read(t.d.c_str(), &b, &err), 0) << err.msg;
        expect_same_model(a, b, m);
        EXPECT_FALSE(exists(t / "config.json.tmp"));
        std::string text = read_file(t / "config.json");
        EXPECT_NE(text.find("\"torch_dtype\": \"bfloat16\""), std::string::npos) << text;
        EXPECT_NE(text.find("\"rope_theta\":"), std::string::npos) << text;
        EXPECT_EQ(text.find("rope_parameters"), std::string::npos) << text;
        // the shortest exact numbers (1e-6, not 9.9999999999999995e-07)
        if (a.norm_eps == 1e-6) {
            EXPECT_NE(text.find("\"rms_norm_eps\": 1e-6,"), std::string::npos) << text;
        }
    }
    // a config transformers could not describe: qwen2 without its biases
    decoder_config q;
    fsdp_err err;
    ASSERT_EQ(hf_config_read(hf("qwen2_tiny").c_str(), &q, &err), 0) << err.msg;
    q.qkv_bias = 0;
    char *text = nullptr;
    EXPECT_EQ(hf_config_to_json(&q, FSDP_DT_F32, &text, &err), FSDP_E_INVALID);
    EXPECT_EQ(text, nullptr);
    EXPECT_NE(std::string(err.msg).find("model_type 'qwen2' has q/k/v biases and no q/k norms, this model has no q/k/v biases and no q/k norms"), std::string::npos) << err.msg;
    EXPECT_EQ(hf_config_to_json(&q, FSDP_DT_I32, &text, &err), FSDP_E_INVALID);
}

// model: {from_hf: DIR} in a recipe, with overrides after it; arch must agree; unknown arch named.
TEST(HfArchRecipe, FromHfArchAndOverrides) {
    decoder_config c, f;
    std::string msg;
    fsdp_err err;
    ASSERT_EQ(hf_config_read(hf("qwen3_tiny").c_str(), &f, &err), 0) << err.msg;
    ASSERT_EQ(from_yaml("model: {max_seq_len: 64, from_hf: " + hf("qwen3_tiny") + "}\n", &c, &msg), 0) << msg;
    EXPECT_EQ(c.max_seq_len, 64);
    c.max_seq_len = f.max_seq_len;
    expect_same_model(f, c, "from_hf");
    ASSERT_EQ(from_yaml("model: {arch: qwen3, from_hf: " + hf("qwen3_tiny") + "}\n", &c, &msg), 0) << msg;
    EXPECT_EQ(from_yaml("model: {arch: qwen2, from_hf: " + hf("qwen3_tiny") + "}\n", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("m.yaml:1:15: model.arch is qwen2 but the config.json of from_hf is qwen3"), std::string::npos)
        << msg;
    EXPECT_EQ(from_yaml("model: {preset: tiny, from_hf: " + hf("qwen3_tiny") + "}\n", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("from_hf and preset both give the whole model"), std::string::npos) << msg;
    EXPECT_EQ(from_yaml("model: {from_hf: /nonexistent/model}\n", &c, &msg), FSDP_E_IO);
    EXPECT_NE(msg.find("m.yaml:1:18: model.from_hf: /nonexistent/model/config.json"), std::string::npos) << msg;
    EXPECT_EQ(from_yaml("model: {arch: deepseek_v3, dim: 64}\n", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("model.arch: unsupported architecture 'deepseek_v3' (supported: llama3, qwen2, qwen3, qwen3_moe, olmoe, mixtral)"),
              std::string::npos)
        << msg;
    // a recipe-declared Qwen3 with its switches and sizes
    ASSERT_EQ(from_yaml("model: {arch: qwen3, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 32,"
                        " ffn_hidden: 160, vocab_size: 256, tie_embeddings: true}\n",
                        &c, &msg),
              0)
        << msg;
    EXPECT_EQ(c.qk_norm, 1);
    EXPECT_EQ(c.qkv_bias, 0);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.ffn_hidden, 160);
    EXPECT_EQ(c.norm_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.rope_scaling, DECODER_ROPE_NONE);
    EXPECT_EQ(c.init_std, 0.02);
    EXPECT_EQ(from_yaml("model: {arch: qwen3, dim: 64, n_layers: 2, n_heads: 4, head_dim: 31, vocab_size: 8}\n", &c,
                        &msg),
              FSDP_E_INVALID);
    EXPECT_NE(msg.find("model.head_dim 31 must be even"), std::string::npos) << msg;
    EXPECT_EQ(from_yaml("model: {preset: tiny, qk_norm: maybe}\n", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("model.qk_norm must be true or false, got 'maybe'"), std::string::npos) << msg;
}

// The presets against the published config.json files (Meta's Llama-3.1/3.2, Qwen2.5, Qwen3).
TEST(HfArchPresets, MatchThePublishedConfigs) {
    struct {
        const char *name;
        decoder_arch arch;
        int dim, layers, heads, kv, head_dim, ffn, vocab, tied;
        double theta, factor; /* factor 0: no scaling */
        int64_t params;
    } want[] = {
        // meta-llama/Llama-3.2-1B: 1.24B with the tied embedding
        {"llama3_1b", DECODER_ARCH_LLAMA3, 2048, 16, 32, 8, 64, 8192, 128256, 1, 500000.0, 32.0, 1235814400LL},
        // meta-llama/Llama-3.2-3B
        {"llama3_3b", DECODER_ARCH_LLAMA3, 3072, 28, 24, 8, 128, 8192, 128256, 1, 500000.0, 32.0, 3212749824LL},
        // meta-llama/Llama-3.1-8B, -70B, -405B
        {"llama3_8b", DECODER_ARCH_LLAMA3, 4096, 32, 32, 8, 128, 14336, 128256, 0, 500000.0, 8.0, 8030261248LL},
        {"llama3_70b", DECODER_ARCH_LLAMA3, 8192, 80, 64, 8, 128, 28672, 128256, 0, 500000.0, 8.0, 70553706496LL},
        {"llama3_405b", DECODER_ARCH_LLAMA3, 16384, 126, 128, 8, 128, 53248, 128256, 0, 500000.0, 8.0, 405853388800LL},
        // Qwen/Qwen2.5-0.5B (494,032,768 parameters), Qwen/Qwen3-0.6B (596,049,920)
        {"qwen2.5_0.5b", DECODER_ARCH_QWEN2, 896, 24, 14, 2, 64, 4864, 151936, 1, 1e6, 0, 494032768LL},
        {"qwen3_0.6b", DECODER_ARCH_QWEN3, 1024, 28, 16, 8, 128, 3072, 151936, 1, 1e6, 0, 596049920LL},
    };
    for (const auto &w : want) {
        decoder_config c;
        fsdp_err err;
        ASSERT_EQ(decoder_config_preset(&c, w.name, &err), 0) << err.msg;
        EXPECT_EQ(c.arch, w.arch) << w.name;
        EXPECT_EQ(c.dim, w.dim) << w.name;
        EXPECT_EQ(c.n_layers, w.layers) << w.name;
        EXPECT_EQ(c.n_heads, w.heads) << w.name;
        EXPECT_EQ(c.n_kv_heads, w.kv) << w.name;
        EXPECT_EQ(c.head_dim, w.head_dim) << w.name;
        EXPECT_EQ(c.ffn_hidden, w.ffn) << w.name;
        EXPECT_EQ(c.vocab_size, w.vocab) << w.name;
        EXPECT_EQ(c.tie_embeddings, w.tied) << w.name;
        EXPECT_EQ(c.rope_theta, w.theta) << w.name;
        EXPECT_EQ(c.rope_scaling, w.factor > 0 ? DECODER_ROPE_LLAMA3 : DECODER_ROPE_NONE) << w.name;
        if (w.factor > 0) {
            EXPECT_EQ(c.rope_factor, w.factor) << w.name;
            EXPECT_EQ(c.rope_low_freq_factor, 1.0) << w.name;
            EXPECT_EQ(c.rope_high_freq_factor, 4.0) << w.name;
            EXPECT_EQ(c.rope_original_max_pos, 8192) << w.name;
        }
        EXPECT_EQ(c.norm_eps, w.arch == DECODER_ARCH_LLAMA3 ? 1e-5 : 1e-6) << w.name;
        EXPECT_EQ(c.qkv_bias, w.arch == DECODER_ARCH_QWEN2) << w.name;
        EXPECT_EQ(c.qk_norm, w.arch == DECODER_ARCH_QWEN3) << w.name;
        EXPECT_EQ(decoder_param_count(&c), w.params) << w.name;
        // the preset's config.json reads back as the preset
        char *text = nullptr;
        ASSERT_EQ(hf_config_to_json(&c, FSDP_DT_BF16, &text, &err), 0) << err.msg;
        decoder_config back;
        std::string msg;
        EXPECT_EQ(parse(text, &back, &msg), 0) << msg;
        free(text);
        expect_same_model(c, back, w.name);
    }
}

// The parameter table of each architecture: biases, q/k norms and a tied embedding appear (or not)
// where the table puts them, with their shapes and init rules.
TEST(HfArchParams, TableOfEachArchitecture) {
    struct {
        const char *model;
        int per_layer;
        const char *extra[2];  // per-layer parameters beyond Llama's nine
    } want[] = {{"qwen2_tiny", 12, {"layers.1.attention.wq.bias", "layers.1.attention.wv.bias"}},
                {"qwen3_tiny", 11, {"layers.1.attention.q_norm.weight", "layers.1.attention.k_norm.weight"}},
                {"llama32_tiny", 9, {nullptr, nullptr}}};
    for (const auto &w : want) {
        decoder_config c;
        fsdp_err err;
        ASSERT_EQ(hf_config_read(hf(w.model).c_str(), &c, &err), 0) << err.msg;
        decoder_params t;
        ASSERT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
        EXPECT_EQ(t.layer_start[1] - t.layer_start[0], w.per_layer) << w.model;
        EXPECT_EQ(t.n, 1 + w.per_layer * 2 + 1) << w.model;  // tied: tok_embeddings, layers, norm
        EXPECT_EQ(decoder_params_find(&t, "output.weight"), -1) << w.model;
        EXPECT_EQ(decoder_params_index(&t, DECODER_P_OUTPUT, -1), -1) << w.model;
        EXPECT_STREQ(t.p[t.n - 1].name, "norm.weight");
        EXPECT_EQ(t.total, decoder_param_count(&c));
        int64_t sum = 0;
        for (int i = 0; i < t.n; i++) {
            EXPECT_EQ(t.p[i].offset, sum);
            sum += t.p[i].numel;
            EXPECT_EQ(decoder_params_find(&t, t.p[i].name), i) << t.p[i].name;
            EXPECT_EQ(decoder_params_index(&t, t.p[i].kind, t.p[i].layer), i) << t.p[i].name;
        }
        for (const char *e : w.extra) {
            if (!e) continue;
            int i = decoder_params_find(&t, e);
            ASSERT_GE(i, 0) << e;
            const decoder_param &p = t.p[i];
            EXPECT_EQ(p.ndim, 1) << e;
            bool bias = strstr(e, ".bias") != nullptr;
            EXPECT_EQ(p.shape[0], bias ? (strstr(e, "wq") ? 4 : 2) * c.head_dim : c.head_dim) << e;
            EXPECT_EQ(p.init.kind, bias ? INIT_ZEROS : INIT_ONES) << e;
        }
        // a wq bias only where the architecture has one
        EXPECT_EQ(decoder_params_index(&t, DECODER_P_WQ_BIAS, 0) >= 0, c.qkv_bias == 1) << w.model;
        EXPECT_EQ(decoder_params_index(&t, DECODER_P_Q_NORM, 0) >= 0, c.qk_norm == 1) << w.model;
        // Hugging Face init for a from_hf model: normal(0, initializer_range) matrices
        int wq = decoder_params_index(&t, DECODER_P_WQ, 1);
        EXPECT_EQ(t.p[wq].init.kind, INIT_NORMAL);
        EXPECT_EQ(t.p[wq].init.std, 0.02);
        EXPECT_EQ(t.p[wq].shape[0], (int64_t)c.n_heads * c.head_dim);
        decoder_params_free(&t);
    }
    // untied Llama 3 keeps output.weight last, torchtitan's init, nine per layer
    decoder_config c;
    fsdp_err err;
    ASSERT_EQ(decoder_config_preset(&c, "tiny", &err), 0) << err.msg;
    decoder_params t;
    ASSERT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
    EXPECT_EQ(t.n, 3 + 9 * 2);
    EXPECT_STREQ(t.p[t.n - 1].name, "output.weight");
    EXPECT_EQ(t.p[decoder_params_index(&t, DECODER_P_WQ, 0)].init.kind, INIT_TRUNC_NORMAL);
    EXPECT_EQ(t.p[0].init.kind, INIT_NORMAL);
    EXPECT_EQ(t.p[0].init.std, 1.0);
    decoder_params_free(&t);
    // tied torchtitan Llama (llama3_1b): the one embedding gets the output head's init, as torchtitan
    // skips the embedding's own when the two are tied
    ASSERT_EQ(decoder_config_preset(&c, "llama3_1b", &err), 0) << err.msg;
    ASSERT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
    EXPECT_STREQ(t.p[0].name, "tok_embeddings.weight");
    EXPECT_EQ(t.p[0].init.kind, INIT_TRUNC_NORMAL);
    EXPECT_EQ(t.p[0].init.std, std::pow(2048.0, -0.5));
    EXPECT_EQ(t.p[0].init.b, 3 * std::pow(2048.0, -0.5));
    EXPECT_STREQ(t.p[t.n - 1].name, "norm.weight");
    decoder_params_free(&t);
}

// HF names of the new parameters and their RoPE-layout permutation: q/k biases move with their
// weights' rows (n_heads / n_kv_heads heads), q/k norms as one head of head_dim.
TEST(HfArchParams, HfNamesAndPermutationOfBiasesAndNorms) {
    struct {
        const char *tt, *hf;
        nmap_qk qk;
        int heads;
    } want[] = {{"layers.3.attention.wq.bias", "model.layers.3.self_attn.q_proj.bias", NMAP_QK_Q, 16},
                {"layers.3.attention.wk.bias", "model.layers.3.self_attn.k_proj.bias", NMAP_QK_K, 8},
                {"layers.3.attention.wv.bias", "model.layers.3.self_attn.v_proj.bias", NMAP_QK_NONE, 0},
                {"layers.3.attention.q_norm.weight", "model.layers.3.self_attn.q_norm.weight", NMAP_QK_HEAD, 1},
                {"layers.3.attention.k_norm.weight", "model.layers.3.self_attn.k_norm.weight", NMAP_QK_HEAD, 1}};
    for (const auto &w : want) {
        char out[NMAP_NAME_MAX];
        nmap_info info;
        fsdp_err err;
        ASSERT_EQ(nmap_map(NMAP_TT_TO_HF, w.tt, 16, 8, out, sizeof out, &info, &err), 0) << err.msg;
        EXPECT_STREQ(out, w.hf);
        EXPECT_EQ(info.qk, w.qk) << w.tt;
        EXPECT_EQ(info.heads, w.heads) << w.tt;
        ASSERT_EQ(nmap_map(NMAP_HF_TO_TT, w.hf, 16, 8, out, sizeof out, &info, &err), 0) << err.msg;
        EXPECT_STREQ(out, w.tt);
        EXPECT_EQ(info.qk, w.qk) << w.hf;
        EXPECT_EQ(info.layer, 3);
    }
    // a q_norm weight of head_dim 8 in HF's layout (rotate_half pairs (j, j+4)) -> interleaved (2j, 2j+1)
    const float hfw[8] = {0, 1, 2, 3, 10, 11, 12, 13};
    float tt[8], back[8];
    fsdp_err err;
    ASSERT_EQ(nmap_permute_rows(NMAP_HF_TO_TT, tt, hfw, 8, 1, sizeof(float), 1, &err), 0) << err.msg;
    const float want_tt[8] = {0, 10, 1, 11, 2, 12, 3, 13};
    for (int i = 0; i < 8; i++) EXPECT_EQ(tt[i], want_tt[i]) << i;
    ASSERT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, back, tt, 8, 1, sizeof(float), 1, &err), 0) << err.msg;
    EXPECT_EQ(memcmp(back, hfw, sizeof back), 0);
}

// An unsupported architecture stops the recipe at validation, before any stage: exit 2, naming it.
TEST(HfArchRecipe, UnsupportedModelTypeFailsValidation) {
    Dir t;
    std::string cfg = read_file(hf("llama32_tiny") + "/config.json");
    size_t at = cfg.find("\"model_type\": \"llama\"");
    ASSERT_NE(at, std::string::npos);
    cfg.replace(at, strlen("\"model_type\": \"llama\""), "\"model_type\": \"deepseek_v3\"");
    at = cfg.find("LlamaForCausalLM");
    ASSERT_NE(at, std::string::npos);
    cfg.replace(at, strlen("LlamaForCausalLM"), "DeepseekV3ForCausalLM");
    write_file(t / "config.json", cfg);
    write_file(t / "r.yaml", "model: {from_hf: " + t.d + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 t.d + ", names: hf}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "out") +
                                 "}}\n");
    std::string o;
    int rc = run_cmd(fsdp_run_bin() + " " + (t / "r.yaml"), &o);
    EXPECT_EQ(rc, 2) << o;
    EXPECT_NE(o.find("r.yaml:1:18: model.from_hf: " + (t / "config.json") +
                     ": model_type 'deepseek_v3' (DeepseekV3ForCausalLM) is not an architecture fsdp-run trains"),
              std::string::npos)
        << o;
    EXPECT_EQ(o.find("stage l"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "out"));
}

// Issue 26 item 5: every unsupported key of a config.json is named at once (hidden_act: gelu does not
// hide use_sliding_window: true), in one error.
TEST(HfArchConfig, EveryUnsupportedKeyIsNamedAtOnce) {
    decoder_config c;
    std::string msg;
    EXPECT_EQ(parse(edited("qwen2_tiny",
                           [](json_t *o) {
                               json_object_set_new(o, "hidden_act", json_string("gelu"));
                               json_object_set_new(o, "use_sliding_window", json_true());
                               json_object_set_new(o, "mlp_bias", json_true());
                               json_object_set_new(o, "partial_rotary_factor", json_real(0.5));
                           }),
                    &c, &msg),
              FSDP_E_INVALID);
    for (const char *want : {"hidden_act 'gelu' is not supported", "\"mlp_bias\": true is not supported",
                             "\"use_sliding_window\": true is not supported for model_type 'qwen2'",
                             "partial_rotary_factor 0.5 is not supported"})
        EXPECT_NE(msg.find(want), std::string::npos) << want << "\n" << msg;
}

// Issue 26 item 4: an HF directory loaded without `names: hf` says once to add it, rather than a line for
// every parameter and every key.
TEST(HfArchRecipe, HfNamesWithoutNamesHfSayToAddIt) {
    Dir t;
    std::string dir = hf("llama32_tiny");
    write_file(t / "r.yaml", "model: {from_hf: " + dir + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 dir + "}}\n");
    std::string o;
    int rc = run_cmd(fsdp_run_bin() + " -q " + (t / "r.yaml"), &o);
    EXPECT_EQ(rc, 1) << o;
    EXPECT_NE(o.find("parameters not restored are in the checkpoint under their Hugging Face names ("), std::string::npos)
        << o;
    EXPECT_NE(o.find("add `names: hf` to the load-ckpt stage"), std::string::npos) << o;
    EXPECT_EQ(o.find("unexpected key"), std::string::npos) << o;
    EXPECT_EQ(o.find("not restored (no such key"), std::string::npos) << o;
}

// Issue 26 item 3: an HF export (names: hf) to a path without .safetensors is a directory that
// from_pretrained opens: path/model.safetensors and path/config.json, created with its parents, whatever
// shard_mb; fsdp-run's own from_hf + names: hf reads it back.
TEST(HfArchRecipe, HfExportWithoutExtensionIsADirectory) {
    Dir t;
    std::string dir = hf("llama32_tiny"), out = t / "out/hf";
    write_file(t / "r.yaml", "model: {from_hf: " + dir + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 dir + ", names: hf}}\n  - {id: s, uses: save-safetensors, with: {path: " + out +
                                 ", names: hf}}\n");
    std::string o;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " -q " + (t / "r.yaml"), &o), 0) << o;
    EXPECT_TRUE(exists(out + "/model.safetensors")) << o;
    EXPECT_TRUE(exists(out + "/config.json")) << o;
    EXPECT_FALSE(exists(t / "out/config.json")) << o;
    write_file(t / "b.yaml", "model: {from_hf: " + out + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 out + ", names: hf}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q " + (t / "b.yaml"), &o), 0) << o;
    // overwrite: false refuses it at validation, naming the file in the directory
    write_file(t / "c.yaml", "model: {from_hf: " + dir + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 dir + ", names: hf}}\n  - {id: s, uses: save-safetensors, with: {path: " + out +
                                 ", names: hf, overwrite: false}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + (t / "c.yaml"), &o), 2) << o;
    EXPECT_NE(o.find("path (its model.safetensors) " + out + " already exists"), std::string::npos) << o;
}
