// The tiny mixture-of-experts fixtures (tests/data/moe-5.24, written by transformers 5.24) seen in
// fsdp-run's layout: every Hugging Face tensor of a fixture file turned into the torchtitan-named
// tensor of the model's parameter table (experts stacked into [E, out, in], q/k rows permuted to the
// interleaved RoPE layout), and one-rank states filled from them. Independent of the checkpoint
// loader: the tests of the MoE model check the math against the fixture, not the loader.
#ifndef FSDP_TESTS_MOE_STATE_UTIL_H
#define FSDP_TESTS_MOE_STATE_UTIL_H

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/namemap.h"
#include "decoder/decoder_params.h"
#include "decoder/decoder_table.h"
#include "decoder/hf_config.h"
#include "runtime/state.h"
}
#include "decoder_state_util.h"
#include "st_test_reader.h"
#include "test_util.h"

namespace fsdp_test {

inline std::string moe_fixture(const std::string &model, const std::string &file = "") {
    return std::string("tests/data/moe-5.24/") + model + (file.empty() ? "" : "/" + file);
}

typedef std::map<std::string, st_test::Tensor> MoeTensors;

inline MoeTensors moe_load_st(const std::string &path) {
    MoeTensors t;
    std::string why;
    EXPECT_TRUE(st_test::load(path, &t, &why)) << path << ": " << why;
    return t;
}

inline decoder_config moe_cfg(const std::string &model) {
    decoder_config c;
    fsdp_err err;
    EXPECT_EQ(hf_config_read(moe_fixture(model).c_str(), &c, &err), 0) << err.msg;
    return c;
}

// The HF name of one expert's projection: kind 0 gate (w1), 1 down (w2), 2 up (w3).
inline std::string moe_hf_expert(const decoder_config &c, int layer, int e, int kind, const std::string &suffix) {
    const bool mixtral = c.arch == DECODER_ARCH_MIXTRAL;
    static const char *const mlp[3] = {"gate_proj", "down_proj", "up_proj"}, *const mx[3] = {"w1", "w2", "w3"};
    return "model.layers." + std::to_string(layer) + (mixtral ? ".block_sparse_moe.experts." : ".mlp.experts.") +
           std::to_string(e) + "." + (mixtral ? mx[kind] : mlp[kind]) + ".weight" + suffix;
}

// Parameter p of the table (torchtitan name and layout) from the HF tensors `hf` (names + suffix);
// empty with a test failure when one is missing.
inline std::vector<float> moe_tt_tensor(const decoder_config &c, const decoder_param &p, const MoeTensors &hf,
                                        const std::string &suffix = "") {
    std::vector<float> out;
    auto get = [&](const std::string &n) -> const std::vector<float> * {
        auto it = hf.find(n + suffix);
        if (it == hf.end()) {
            ADD_FAILURE() << "no " << n + suffix << " in the fixture";
            return nullptr;
        }
        return &it->second.f32;
    };
    if (p.kind >= DECODER_P_EXPERTS_W1 && p.kind <= DECODER_P_EXPERTS_W3) {
        for (int e = 0; e < c.n_experts; e++) {
            const std::vector<float> *v = get(moe_hf_expert(c, p.layer, e, p.kind - DECODER_P_EXPERTS_W1, ""));
            if (!v) return {};
            out.insert(out.end(), v->begin(), v->end());
        }
        return out;
    }
    if (p.kind == DECODER_P_ROUTER) {
        const std::vector<float> *v = get("model.layers." + std::to_string(p.layer) +
                                          (c.arch == DECODER_ARCH_MIXTRAL ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight"));
        return v ? *v : out;
    }
    char name[NMAP_NAME_MAX];
    nmap_info info;
    fsdp_err err;
    EXPECT_EQ(nmap_map(NMAP_TT_TO_HF, p.name, c.n_heads, c.n_kv_heads, name, sizeof name, &info, &err), 0) << err.msg;
    const std::vector<float> *v = get(name);
    if (!v) return out;
    out = *v;
    int heads = info.heads;
    if (c.qk_norm_full && p.kind == DECODER_P_Q_NORM) heads = c.n_heads;
    if (c.qk_norm_full && p.kind == DECODER_P_K_NORM) heads = c.n_kv_heads;
    if (info.qk != NMAP_QK_NONE) {
        EXPECT_EQ(nmap_permute_rows(NMAP_HF_TO_TT, out.data(), v->data(), p.shape[0], p.row_numel, sizeof(float), heads,
                                    &err),
                  0)
            << err.msg;
    }
    return out;
}

// A one-rank state of cfg's table with the weights of dir/file (a checkpoint in Hugging Face names and
// layout), converted by moe_tt_tensor.
inline fsdp_state *moe_state_dir(const std::string &dir, const decoder_config &cfg, const std::string &file) {
    fsdp_err err;
    decoder_params t;
    EXPECT_EQ(decoder_params_build(&cfg, &t, &err), 0) << err.msg;
    fsdp_state *s = decoder_test_state(cfg);
    MoeTensors hf = moe_load_st(dir + "/" + file);
    for (int i = 0; i < t.n; i++) {
        EXPECT_EQ(state_add_param(s, t.p[i].name, t.p[i].ndim, t.p[i].shape, t.p[i].layer, &err), 0) << err.msg;
        std::vector<float> v = moe_tt_tensor(cfg, t.p[i], hf);
        state_param *p = state_find(s, t.p[i].name);
        EXPECT_EQ((int64_t)v.size(), t.p[i].numel) << t.p[i].name;
        if (p && (int64_t)v.size() == t.p[i].numel) memcpy(p->data, v.data(), v.size() * sizeof(float));
    }
    decoder_params_free(&t);
    return s;
}

// A one-rank state of the fixture's table with the weights of `file` (model.safetensors by default).
inline fsdp_state *moe_state(const std::string &model, const decoder_config &cfg,
                             const std::string &file = "model.safetensors") {
    return moe_state_dir(moe_fixture(model), cfg, file);
}

}  // namespace fsdp_test

#endif
