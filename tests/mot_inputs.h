// Tiny inputs of the mixture-of-transformers bootstrap, written with the project's own safetensors
// writer: a Qwen2-style LLM in Hugging Face names (an HF directory: config.json + model.safetensors)
// and a SigLIP vision tower's state_dict() (one safetensors file), plus readers for the checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
}

namespace fsdp_test {

struct StTensor {
    std::string name;
    fsdp_dtype dt;
    std::vector<int64_t> shape;
    std::vector<float> vals;  // already representable in dt
};

inline int64_t numel_of(const std::vector<int64_t> &s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

// Deterministic values of a tensor, rounded to its dtype.
inline StTensor st_tensor(const std::string &name, fsdp_dtype dt, std::vector<int64_t> shape, int seed) {
    StTensor t{name, dt, shape, {}};
    t.vals.resize((size_t)numel_of(shape));
    for (size_t i = 0; i < t.vals.size(); i++) {
        float v = (float)(0.1 * std::sin(1.7 * seed + 0.37 * (double)i) + 0.01 * seed);
        if (dt == FSDP_DT_BF16) v = fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
        if (dt == FSDP_DT_F16) v = fsdp_f16_to_f32(fsdp_f32_to_f16(v));
        t.vals[i] = v;
    }
    return t;
}

inline void write_st(const std::string &path, const std::vector<StTensor> &ts) {
    std::vector<std::vector<unsigned char>> bytes(ts.size());
    std::vector<st_entry> e(ts.size());
    fsdp_err err;
    for (size_t i = 0; i < ts.size(); i++) {
        bytes[i].resize(ts[i].vals.size() * fsdp_dtype_size(ts[i].dt) + 1);
        ASSERT_EQ(fsdp_convert(bytes[i].data(), ts[i].dt, ts[i].vals.data(), FSDP_DT_F32, ts[i].vals.size(), &err), 0);
        e[i] = {ts[i].name.c_str(), ts[i].dt, (int)ts[i].shape.size(), ts[i].shape.data(), bytes[i].data()};
    }
    const char *meta[2] = {"format", "pt"};
    ASSERT_EQ(st_save(path.c_str(), e.data(), e.size(), meta, 1, nullptr, nullptr, &err), 0) << err.msg;
}

struct QwenDims {
    int layers = 2, hidden = 32, heads = 4, kv_heads = 2, inter = 48, vocab = 64;
};

// A Qwen2 checkpoint's tensors in HF names (bf16), without q_norm/k_norm (Qwen2 has none).
inline std::vector<StTensor> tiny_qwen2(const QwenDims &d = QwenDims()) {
    std::vector<StTensor> t;
    int seed = 1;
    const int64_t H = d.hidden, hd = d.hidden / d.heads, q = d.heads * hd, kv = d.kv_heads * hd;
    auto add = [&](const std::string &n, std::vector<int64_t> s) { t.push_back(st_tensor(n, FSDP_DT_BF16, s, seed++)); };
    add("model.embed_tokens.weight", {d.vocab, H});
    for (int i = 0; i < d.layers; i++) {
        std::string p = "model.layers." + std::to_string(i) + ".";
        add(p + "self_attn.q_proj.weight", {q, H});
        add(p + "self_attn.q_proj.bias", {q});
        add(p + "self_attn.k_proj.weight", {kv, H});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.weight", {kv, H});
        add(p + "self_attn.v_proj.bias", {kv});
        add(p + "self_attn.o_proj.weight", {H, q});
        add(p + "mlp.gate_proj.weight", {d.inter, H});
        add(p + "mlp.up_proj.weight", {d.inter, H});
        add(p + "mlp.down_proj.weight", {H, d.inter});
        add(p + "input_layernorm.weight", {H});
        add(p + "post_attention_layernorm.weight", {H});
    }
    add("model.norm.weight", {H});
    add("lm_head.weight", {d.vocab, H});
    return t;
}

inline std::string qwen2_config(const QwenDims &d = QwenDims()) {
    return "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": " +
           std::to_string(d.hidden) + ", \"num_attention_heads\": " + std::to_string(d.heads) +
           ", \"num_key_value_heads\": " + std::to_string(d.kv_heads) + ", \"num_hidden_layers\": " +
           std::to_string(d.layers) + ", \"intermediate_size\": " + std::to_string(d.inter) +
           ", \"vocab_size\": " + std::to_string(d.vocab) + ", \"tie_word_embeddings\": false}\n";
}

// An HF directory: config.json + model.safetensors.
inline void write_llm_dir(const std::string &dir, const std::vector<StTensor> &t, const QwenDims &d = QwenDims()) {
    ASSERT_EQ(run_cmd("mkdir -p '" + dir + "'", nullptr), 0);
    write_file(dir + "/config.json", qwen2_config(d));
    write_st(dir + "/model.safetensors", t);
}

// A SigLIP vision tower's state_dict() (f32): conv patch embedding (4-D), one encoder layer, the
// post layernorm and the pooling head's probe [1, 1, W] (one row: empty shards on 2+ ranks).
inline std::vector<StTensor> tiny_siglip(int64_t W = 24, int64_t mlp = 40) {
    std::vector<StTensor> t;
    int seed = 100;
    auto add = [&](const std::string &n, std::vector<int64_t> s) { t.push_back(st_tensor(n, FSDP_DT_F32, s, seed++)); };
    add("vision_model.embeddings.patch_embedding.weight", {W, 3, 4, 4});
    add("vision_model.embeddings.patch_embedding.bias", {W});
    add("vision_model.embeddings.position_embedding.weight", {4, W});
    std::string p = "vision_model.encoder.layers.0.";
    for (const char *q : {"q", "k", "v", "out"}) {
        add(p + "self_attn." + q + "_proj.weight", {W, W});
        add(p + "self_attn." + q + "_proj.bias", {W});
    }
    for (const char *q : {"layer_norm1", "layer_norm2"}) {
        add(p + q + ".weight", {W});
        add(p + q + ".bias", {W});
    }
    add(p + "mlp.fc1.weight", {mlp, W});
    add(p + "mlp.fc1.bias", {mlp});
    add(p + "mlp.fc2.weight", {W, mlp});
    add(p + "mlp.fc2.bias", {W});
    add("vision_model.post_layernorm.weight", {W});
    add("vision_model.post_layernorm.bias", {W});
    add("vision_model.head.probe", {1, 1, W});
    return t;
}

// A whole tensor of a checkpoint as f32 (empty + a failure when absent).
inline std::vector<float> read_tensor(ckpt_reader *r, const std::string &name, const ckpt_entry **entry = nullptr) {
    long i = ckpt_find(r, name.c_str());
    EXPECT_GE(i, 0) << name;
    if (i < 0) return {};
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    if (entry) *entry = e;
    std::vector<float> v((size_t)fsdp_numel(e->ndim, e->shape) + 1);
    fsdp_err err;
    int64_t rows = e->ndim ? e->shape[0] : 1;
    EXPECT_EQ(ckpt_read_rows(r, (size_t)i, 0, rows, v.data(), FSDP_DT_F32, &err), 0) << err.msg;
    v.pop_back();
    return v;
}

struct Reader {
    ckpt_reader *r = nullptr;
    explicit Reader(const std::string &path) {
        fsdp_err err;
        EXPECT_EQ(ckpt_open(path.c_str(), CKPT_AUTO, &r, &err), 0) << path << ": " << err.msg;
    }
    ~Reader() { ckpt_close(r); }
};

// Moments and bounds of a U(-b, b) sample.
inline void expect_uniform(const std::vector<float> &v, double b, const std::string &what) {
    ASSERT_GT(v.size(), 100u) << what;
    double s = 0, s2 = 0, mx = 0;
    for (float x : v) {
        s += x;
        s2 += (double)x * x;
        mx = std::max(mx, (double)std::fabs(x));
    }
    double n = (double)v.size(), mean = s / n, var = s2 / n - mean * mean;
    EXPECT_LE(mx, b) << what;
    EXPECT_GT(mx, 0.9 * b) << what;
    EXPECT_LT(std::fabs(mean), 6 * b / std::sqrt(3 * n)) << what;
    EXPECT_NEAR(var, b * b / 3, 0.2 * b * b / 3) << what;
}

}  // namespace fsdp_test
