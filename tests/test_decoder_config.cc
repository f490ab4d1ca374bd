// Llama-3 config: presets, derived sizes, parameter counts, FLOPs, the recipe's model: map.
#include <gtest/gtest.h>

#include <jansson.h>

#include <cmath>
#include <cstring>
#include <string>

#include "decoder_yaml_util.h"
#include "test_util.h"

extern "C" {
#include "decoder/decoder_config.h"
#include "decoder/decoder_spec.h"
#include "pipeline/yaml_load.h"
}

using fsdp_test::from_yaml;

namespace {

decoder_config preset(const char *name) {
    decoder_config c;
    fsdp_err err;
    EXPECT_EQ(decoder_config_preset(&c, name, &err), 0) << err.msg;
    return c;
}

}  // namespace

TEST(LlamaConfig, TinyMatchesFixture) {
    decoder_config c = preset("tiny");
    json_error_t je;
    json_t *ref = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
    ASSERT_TRUE(ref) << je.text;
    json_t *cfg = json_object_get(ref, "config");
    EXPECT_EQ(c.dim, json_integer_value(json_object_get(cfg, "dim")));
    EXPECT_EQ(c.n_layers, json_integer_value(json_object_get(cfg, "n_layers")));
    EXPECT_EQ(c.n_heads, json_integer_value(json_object_get(cfg, "n_heads")));
    EXPECT_EQ(c.n_kv_heads, json_integer_value(json_object_get(cfg, "n_kv_heads")));
    EXPECT_EQ(c.vocab_size, json_integer_value(json_object_get(cfg, "vocab_size")));
    EXPECT_EQ(c.multiple_of, json_integer_value(json_object_get(cfg, "multiple_of")));
    EXPECT_TRUE(json_is_null(json_object_get(cfg, "ffn_dim_multiplier")));
    EXPECT_EQ(c.ffn_dim_multiplier, 0.0);
    EXPECT_EQ(c.norm_eps, json_real_value(json_object_get(cfg, "norm_eps")));
    EXPECT_EQ(c.rope_theta, json_real_value(json_object_get(cfg, "rope_theta")));
    EXPECT_EQ(c.max_seq_len, json_integer_value(json_object_get(cfg, "max_seq_len")));
    EXPECT_EQ(c.depth_init, json_is_true(json_object_get(cfg, "depth_init")) ? 1 : 0);
    EXPECT_EQ(c.ffn_hidden, json_integer_value(json_object_get(cfg, "ffn_hidden_dim")));
    EXPECT_EQ(c.ffn_hidden, 192);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.rope_scaling, DECODER_ROPE_NONE);
    EXPECT_STREQ(c.preset, "tiny");
    // parameter count == sum of the fixture's parameter shapes
    json_t *shapes = json_object_get(ref, "param_shapes");
    ASSERT_TRUE(json_is_object(shapes));
    int64_t total = 0;
    const char *k;
    json_t *v;
    json_object_foreach(shapes, k, v) {
        int64_t n = 1;
        size_t i;
        json_t *d;
        json_array_foreach(v, i, d) n *= json_integer_value(d);
        total += n;
    }
    EXPECT_EQ(decoder_param_count(&c), total);
    EXPECT_EQ(total, 131392);
    json_decref(ref);
}

TEST(LlamaConfig, PresetSizesAndCounts) {
    struct {
        const char *name;
        int ffn;
        int64_t params;
    } want[] = {
        {"debugmodel", 768, 6163712LL},
        {"llama3_8b", 14336, 8030261248LL},
        {"llama3_70b", 28672, 70553706496LL},
        {"llama3_405b", 53248, 405853388800LL},
        {"llama3_1b", 8192, -1},
    };
    for (const auto &w : want) {
        decoder_config c = preset(w.name);
        EXPECT_EQ(c.ffn_hidden, w.ffn) << w.name;
        if (w.params > 0) {
            EXPECT_EQ(decoder_param_count(&c), w.params) << w.name;
        }
        EXPECT_EQ(c.rope_scaling, DECODER_ROPE_LLAMA3) << w.name;
        // Meta's Llama-3.2-1B config.json: factor 32; the Llama 3.1 models: 8
        EXPECT_EQ(c.rope_factor, strcmp(w.name, "llama3_1b") ? 8.0 : 32.0) << w.name;
        EXPECT_EQ(c.rope_low_freq_factor, 1.0);
        EXPECT_EQ(c.rope_high_freq_factor, 4.0);
        EXPECT_EQ(c.rope_original_max_pos, 8192);
        EXPECT_EQ(c.rope_theta, 500000.0);
        EXPECT_EQ(c.norm_eps, 1e-5);
        EXPECT_EQ(c.depth_init, 1);
        EXPECT_STREQ(c.preset, w.name);
    }
    decoder_config d = preset("debugmodel");
    EXPECT_EQ(d.n_kv_heads, 16);
    EXPECT_EQ(d.head_dim, 16);
    decoder_config b = preset("llama3_1b");
    EXPECT_EQ(b.head_dim, 64);
    EXPECT_EQ(b.n_kv_heads, 8);
    // 1B, tied as Meta's Llama-3.2-1B (one 128256 x 2048 embedding):
    // 128256 * 2048 + 16 * (2*2048*2048 + 2*512*2048 + 3*8192*2048 + 2*2048) + 2048
    EXPECT_EQ(b.tie_embeddings, 1);
    EXPECT_EQ(decoder_param_count(&b), 1235814400LL);
    decoder_config e = preset("llama3_70b");
    EXPECT_EQ(e.head_dim, 128);
    EXPECT_EQ(e.n_layers, 80);
    EXPECT_EQ(e.multiple_of, 4096);
    EXPECT_EQ(e.ffn_dim_multiplier, 1.3);
    // every listed preset loads
    int n = 0;
    for (const char *name; (name = decoder_config_preset_name(n)); n++) preset(name);
    EXPECT_EQ(n, 9);
}

TEST(LlamaConfig, UnknownPreset) {
    decoder_config c;
    fsdp_err err;
    EXPECT_EQ(decoder_config_preset(&c, "llama3_7b", &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("unknown preset 'llama3_7b'"), std::string::npos) << err.msg;
    EXPECT_NE(std::string(err.msg).find("llama3_8b"), std::string::npos) << err.msg;
}

TEST(LlamaConfig, FfnHiddenFormula) {
    // h = int(2*4*dim/3); h = int(mult*h); round up to multiple_of
    decoder_config c;
    decoder_config_defaults(&c);
    c.dim = 100, c.n_layers = 1, c.n_heads = 10, c.vocab_size = 10, c.multiple_of = 1;
    fsdp_err err;
    ASSERT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    EXPECT_EQ(c.ffn_hidden, 266);  // 800/3 = 266.67
    c.ffn_dim_multiplier = 1.3;    // 1.3 * 266 = 345.8
    ASSERT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    EXPECT_EQ(c.ffn_hidden, 345);
    c.multiple_of = 7;  // 345 -> 350
    ASSERT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    EXPECT_EQ(c.ffn_hidden, 350);
    c.ffn_dim_multiplier = 1e-9;  // int(2.66e-7) = 0
    EXPECT_EQ(decoder_config_finalize(&c, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("FFN hidden size"), std::string::npos) << err.msg;
}

TEST(LlamaConfig, FinalizeValidation) {
    struct {
        void (*edit)(decoder_config *);
        const char *needle;
    } cases[] = {
        {[](decoder_config *c) { c->dim = 0; }, "model.dim must be > 0"},
        {[](decoder_config *c) { c->n_layers = -1; }, "model.n_layers must be > 0"},
        {[](decoder_config *c) { c->vocab_size = 0; }, "model.vocab_size"},
        {[](decoder_config *c) { c->multiple_of = 0; }, "model.multiple_of"},
        {[](decoder_config *c) { c->max_seq_len = 0; }, "model.max_seq_len"},
        {[](decoder_config *c) { c->n_kv_heads = -2; }, "model.n_kv_heads"},
        {[](decoder_config *c) { c->dim = 66; }, "divisible by model.n_heads"},
        {[](decoder_config *c) { c->n_kv_heads = 3; }, "divisible by model.n_kv_heads"},
        {[](decoder_config *c) { c->dim = 36; }, "must be even"},
        {[](decoder_config *c) { c->norm_eps = 0; }, "model.norm_eps"},
        {[](decoder_config *c) { c->rope_theta = INFINITY; }, "model.rope_theta"},
        {[](decoder_config *c) { c->ffn_dim_multiplier = NAN; }, "ffn_dim_multiplier"},
        {[](decoder_config *c) { c->depth_init = 2; }, "depth_init"},
        {[](decoder_config *c) {
             c->rope_scaling = DECODER_ROPE_LLAMA3;
             c->rope_factor = 0;
         },
         "model.rope_factor"},
        {[](decoder_config *c) {
             c->rope_scaling = DECODER_ROPE_LLAMA3;
             c->rope_high_freq_factor = 1.0;
         },
         "rope_high_freq_factor"},
        {[](decoder_config *c) {
             c->rope_scaling = DECODER_ROPE_LLAMA3;
             c->rope_original_max_pos = 0;
         },
         "rope_original_max_pos"},
        {[](decoder_config *c) { c->rope_scaling = (decoder_rope_scaling)7; }, "rope_scaling"},
        {[](decoder_config *c) {
             c->dim = 2000000000, c->n_heads = 1000000000, c->n_kv_heads = 1000000000;
         },
         "FFN hidden size"},
        {[](decoder_config *c) {
             c->dim = 400000000, c->n_heads = 2, c->n_kv_heads = 2, c->vocab_size = 2000000000;
             c->n_layers = 2000000000, c->multiple_of = 1;
         },
         "overflows"},
    };
    for (const auto &k : cases) {
        decoder_config c = preset("tiny");
        k.edit(&c);
        fsdp_err err;
        EXPECT_EQ(decoder_config_finalize(&c, &err), FSDP_E_INVALID) << k.needle;
        EXPECT_NE(std::string(err.msg).find(k.needle), std::string::npos) << err.msg;
    }
    decoder_config c = preset("tiny");
    c.n_kv_heads = 0;  // 0 = same as n_heads
    fsdp_err err;
    ASSERT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    EXPECT_EQ(c.n_kv_heads, 4);
    decoder_config bad;
    memset(&bad, 0, sizeof bad);
    EXPECT_EQ(decoder_param_count(&bad), -1);
    EXPECT_EQ(decoder_flops_per_token(&bad, 10), -1.0);
}

TEST(LlamaConfig, FlopsPerToken) {
    // torchtitan: 6 * (N - embedding) + 12 * L * H * head_dim * seq
    decoder_config c = preset("llama3_8b");
    EXPECT_EQ(decoder_flops_per_token(&c, 8192), 57914449920.0);  // anchors A3: 5.79e10
    c = preset("debugmodel");
    EXPECT_EQ(decoder_flops_per_token(&c, 2048), 71585280.0);  // anchors A3: 7.16e7
    c = preset("tiny");
    EXPECT_EQ(decoder_flops_per_token(&c, 32), 6.0 * (131392 - 256 * 64) + 12.0 * 2 * 4 * 16 * 32);
    EXPECT_EQ(decoder_flops_per_token(&c, 0), 6.0 * (131392 - 256 * 64));
    EXPECT_EQ(decoder_flops_per_token(&c, -1), -1.0);
}

TEST(LlamaConfig, FromValuePresetAndOverrides) {
    decoder_config c;
    std::string msg;
    ASSERT_EQ(from_yaml("model:\n  n_layers: 3\n  arch: llama3\n  preset: llama3_8b\n"
                        "  rope_scaling: none\n  max_seq_len: 8192\n  depth_init: false\n",
                        &c, &msg),
              0)
        << msg;
    EXPECT_STREQ(c.preset, "llama3_8b");
    EXPECT_EQ(c.n_layers, 3);  // applied after the preset although listed before it
    EXPECT_EQ(c.dim, 4096);
    EXPECT_EQ(c.ffn_hidden, 14336);
    EXPECT_EQ(c.rope_scaling, DECODER_ROPE_NONE);
    EXPECT_EQ(c.max_seq_len, 8192);
    EXPECT_EQ(c.depth_init, 0);

    ASSERT_EQ(from_yaml("model: {preset: debugmodel, ffn_dim_multiplier: 1.3, n_kv_heads: 4,"
                        " norm_eps: 1e-6, rope_theta: 10000, rope_factor: 16,"
                        " rope_low_freq_factor: 2, rope_high_freq_factor: 8,"
                        " rope_original_max_pos: 4096, vocab_size: 1000, multiple_of: 64}\n",
                        &c, &msg),
              0)
        << msg;
    EXPECT_EQ(c.ffn_dim_multiplier, 1.3);
    EXPECT_EQ(c.ffn_hidden, 896);  // int(1.3 * 682) = 886 -> 896
    EXPECT_EQ(c.n_kv_heads, 4);
    EXPECT_EQ(c.norm_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 10000.0);
    EXPECT_EQ(c.rope_factor, 16.0);
    EXPECT_EQ(c.rope_low_freq_factor, 2.0);
    EXPECT_EQ(c.rope_high_freq_factor, 8.0);
    EXPECT_EQ(c.rope_original_max_pos, 4096);
    EXPECT_EQ(c.vocab_size, 1000);

    // nulls: ffn_dim_multiplier None, n_kv_heads = n_heads
    ASSERT_EQ(from_yaml("model: {preset: llama3_8b, ffn_dim_multiplier: null, n_kv_heads: ~}\n",
                        &c, &msg),
              0)
        << msg;
    EXPECT_EQ(c.ffn_dim_multiplier, 0.0);
    EXPECT_EQ(c.ffn_hidden, 11264);  // 10922 -> 11264 (multiple_of 1024)
    EXPECT_EQ(c.n_kv_heads, 32);
}

TEST(LlamaConfig, FromValueWithoutPreset) {
    decoder_config c;
    std::string msg;
    ASSERT_EQ(from_yaml("model:\n  dim: 128\n  n_layers: 2\n  n_heads: 4\n  vocab_size: 100\n", &c,
                        &msg),
              0)
        << msg;
    EXPECT_STREQ(c.preset, "");
    EXPECT_EQ(c.n_kv_heads, 4);
    EXPECT_EQ(c.multiple_of, 256);
    EXPECT_EQ(c.ffn_hidden, 512);  // 341 -> 512
    EXPECT_EQ(c.norm_eps, 1e-5);
    EXPECT_EQ(c.rope_theta, 10000.0);
    EXPECT_EQ(c.rope_scaling, DECODER_ROPE_LLAMA3);
    EXPECT_EQ(c.max_seq_len, 131072);

    // sizes are required without a preset; the error points at the model map
    EXPECT_EQ(from_yaml("model:\n  dim: 128\n  n_heads: 4\n", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("m.yaml:2:3: model.n_layers must be > 0"), std::string::npos) << msg;
    // no model map at all
    EXPECT_EQ(from_yaml("other: 1\n", &c, &msg), FSDP_E_INVALID);
    EXPECT_NE(msg.find("model.dim must be > 0"), std::string::npos) << msg;
}

TEST(LlamaConfig, FromValueErrorsPointAtTheKey) {
    struct {
        const char *yaml;
        const char *needle;
    } cases[] = {
        {"model:\n  preset: tiny\n  foo: 1\n", "m.yaml:3:8: model: unknown key 'foo'"},
        {"model:\n  dim: abc\n", "m.yaml:2:8: model.dim must be an integer"},
        {"model:\n  dim: 1.5\n", "m.yaml:2:8: model.dim must be an integer"},
        {"model:\n  dim: 0\n", "m.yaml:2:8: model.dim must be an integer in [1, "},
        {"model:\n  dim: 99999999999\n", "m.yaml:2:8: model.dim"},
        {"model:\n  dim: null\n", "m.yaml:2:8: model.dim must not be null"},
        {"model:\n  dim: [1, 2]\n", "m.yaml:2:8: model.dim must be a scalar, not a list"},
        {"model:\n  n_kv_heads: {a: 1}\n", "m.yaml:2:15: model.n_kv_heads must be a scalar, not a map"},
        {"model:\n  norm_eps: -1e-5\n", "m.yaml:2:13: model.norm_eps must be a finite number > 0"},
        {"model:\n  rope_theta: .inf\n", "m.yaml:2:15: model.rope_theta must be a finite"},
        {"model:\n  ffn_dim_multiplier: x\n", "m.yaml:2:23: model.ffn_dim_multiplier must be a finite number > 0 or null"},
        {"model:\n  depth_init: maybe\n", "m.yaml:2:15: model.depth_init must be true or false, got 'maybe'"},
        {"model:\n  rope_scaling: yarn\n", "m.yaml:2:17: model.rope_scaling must be none or llama3, got 'yarn'"},
        {"model:\n  arch: gpt2\n", "m.yaml:2:9: model.arch: unsupported architecture 'gpt2'"},
        {"model:\n  preset: llama3_7b\n", "m.yaml:2:11: model.preset: unknown preset 'llama3_7b'"},
        {"model: [1, 2]\n", "m.yaml:1:8: model must be a map"},
        {"model:\n  preset: tiny\n  dim: 66\n", "m.yaml:2:3: model.dim (66) must be divisible by model.n_heads (4)"},
    };
    for (const auto &k : cases) {
        decoder_config c;
        std::string msg;
        EXPECT_EQ(from_yaml(k.yaml, &c, &msg), FSDP_E_INVALID) << k.yaml;
        EXPECT_NE(msg.find(k.needle), std::string::npos) << "yaml: " << k.yaml << "\nmsg: " << msg;
    }
}
