// recipes/mot_bootstrap.yaml (Bagel's bootstrap of a mixture-of-transformers, issue 14) on tiny inputs
// written with the project's own writers, on 1, 2 and 3 ranks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "mot_inputs.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Inputs {
    std::string dir, llm, vit;
    std::vector<StTensor> llm_t, vit_t;
    Inputs() {
        dir = make_tmpdir("fsdp-mot");
        llm = dir + "/llm";
        vit = dir + "/vit.safetensors";
        llm_t = tiny_qwen2();
        vit_t = tiny_siglip();
        write_llm_dir(llm, llm_t);
        write_st(vit, vit_t);
    }
    ~Inputs() { rm_rf(dir); }
    // the recipe on np ranks (0: in this process's binary without mpirun)
    int run(int np, const std::string &out, std::string *log, const std::string &recipe = "recipes/mot_bootstrap.yaml",
            const std::string &llm_path = "") const {
        std::string cmd = (np > 0 ? "timeout -k 10 120 " + mpirun_prefix(np) + " " : std::string("timeout -k 10 120 ")) +
                          fsdp_run_bin() + " " + recipe + " --set vars.llm=" + (llm_path.empty() ? llm : llm_path) +
                          " --set vars.vit=" + vit + " --set vars.out=" + out;
        return run_cmd(cmd, log);
    }
};

// The shipped recipe by its absolute path (an include is resolved next to the including file first).
std::string recipe_abs() {
    char buf[4096];
    return realpath("recipes/mot_bootstrap.yaml", buf) ? std::string(buf) : std::string("recipes/mot_bootstrap.yaml");
}

std::string strip_moe(std::string n) {
    for (size_t p; (p = n.find("_moe_gen")) != std::string::npos;) n.erase(p, 8);
    return n;
}

}  // namespace

TEST(MotBootstrap, OneTwoThreeRanksGiveTheSameCheckpointWithExpertsLoadsAndRandomParts) {
    Inputs in;
    std::string log;
    std::vector<std::string> outs;
    for (int np : {1, 2, 3}) {
        std::string out = in.dir + "/step0-ws" + std::to_string(np);
        ASSERT_EQ(in.run(np, out, &log), 0) << log;
        EXPECT_TRUE(exists(out + "/.metadata"));
        EXPECT_TRUE(exists(out + "/__" + std::to_string(np - 1) + "_0.distcp")) << "every rank wrote its shards";
        outs.push_back(out);
    }
    for (int k : {1, 2}) {
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + outs[0] + " " + outs[k], &log), 0) << log;
        EXPECT_NE(log.find("equal"), std::string::npos) << log;
    }
    Reader out(outs[2]);
    ASSERT_NE(out.r, nullptr);
    // the table: 2 layers x (12 LLM + 2 q/k-norm + 14 experts) + 3 global (embed, norm, lm_head) + 1 norm expert, 22 ViT, 4 connector
    size_t tensors = 0, experts = 0;
    for (size_t i = 0; i < ckpt_count(out.r); i++) {
        const ckpt_entry *e = ckpt_entry_at(out.r, i);
        if (!e->is_tensor) continue;
        tensors++;
        std::string n = e->name;
        if (n.find("_moe_gen") == std::string::npos) continue;
        // every generation expert equals the parameter it was copied from, and keeps its dtype
        experts++;
        const ckpt_entry *src = nullptr;
        std::vector<float> a = read_tensor(out.r, n), b = read_tensor(out.r, strip_moe(n), &src);
        ASSERT_NE(src, nullptr) << n;
        EXPECT_EQ(e->dtype, src->dtype) << n;
        EXPECT_EQ(a, b) << n;
    }
    EXPECT_EQ(experts, 2u * 14 + 1);
    EXPECT_EQ(tensors, 2u * (12 + 2 + 14) + 3 + 1 + 22 + 4);
    // Bagel's expert names
    for (const char *n : {"language_model.model.layers.1.self_attn.q_proj_moe_gen.bias",
                          "language_model.model.layers.0.self_attn.q_norm_moe_gen.weight",
                          "language_model.model.layers.0.input_layernorm_moe_gen.weight",
                          "language_model.model.layers.0.mlp_moe_gen.gate_proj.weight",
                          "language_model.model.norm_moe_gen.weight", "language_model.lm_head.weight"})
        EXPECT_GE(ckpt_find(out.r, n), 0) << n;
    // loaded parts equal their source files, in their dtypes
    for (const auto &src : {std::make_pair(std::string("language_model."), &in.llm_t),
                            std::make_pair(std::string("vit_model."), &in.vit_t)})
        for (const StTensor &t : *src.second) {
            const ckpt_entry *e = nullptr;
            EXPECT_EQ(read_tensor(out.r, src.first + t.name, &e), t.vals) << t.name;
            if (e) {
                EXPECT_EQ(e->dtype, t.dt) << t.name;
            }
        }
    // q/k-norm (not in a Qwen2 checkpoint) start as ones, in the dtype of their projection (bf16)
    for (const char *n : {"language_model.model.layers.1.self_attn.q_norm.weight",
                          "language_model.model.layers.0.self_attn.k_norm.weight"}) {
        const ckpt_entry *e = nullptr;
        std::vector<float> v = read_tensor(out.r, n, &e);
        EXPECT_EQ(v, std::vector<float>(8, 1.0f)) << n;  // head_dim = 32 / 4
        if (e) {
            EXPECT_EQ(e->dtype, FSDP_DT_BF16);
        }
    }
    // the connector: nn.Linear's init; fc1 [hidden, vit_hidden], fc2 [hidden, hidden]
    const ckpt_entry *e = nullptr;
    std::vector<float> w1 = read_tensor(out.r, "connector.fc1.weight", &e);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->ndim, 2);
    EXPECT_EQ(e->shape[0], 32);
    EXPECT_EQ(e->shape[1], 24);
    expect_uniform(w1, 1 / std::sqrt(24.0), "fc1.weight");
    expect_uniform(read_tensor(out.r, "connector.fc2.weight"), 1 / std::sqrt(32.0), "fc2.weight");
    std::vector<float> b1 = read_tensor(out.r, "connector.fc1.bias"), b2 = read_tensor(out.r, "connector.fc2.bias");
    for (float x : b1) EXPECT_LE(std::fabs(x), 1 / std::sqrt(24.0));
    for (float x : b2) EXPECT_LE(std::fabs(x), 1 / std::sqrt(32.0));
    EXPECT_NE(b1, std::vector<float>(32, 0.0f));
}

TEST(MotBootstrap, TheSizesComeFromTheSources) {
    // another LLM width and another ViT width: the connector follows them, the recipe is unchanged
    Inputs in;
    QwenDims d;
    d.hidden = 48;
    d.heads = 6;
    d.layers = 1;
    std::string llm = in.dir + "/llm48", vit = in.dir + "/vit16.safetensors";
    write_llm_dir(llm, tiny_qwen2(d), d);
    write_st(vit, tiny_siglip(16, 20));
    std::string out = in.dir + "/o", log;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + fsdp_run_bin() + " recipes/mot_bootstrap.yaml --set vars.llm=" + llm +
                          " --set vars.vit=" + vit + " --set vars.out=" + out, &log), 0) << log;
    Reader r(out);
    const ckpt_entry *e = nullptr;
    read_tensor(r.r, "connector.fc1.weight", &e);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->shape[0], 48);
    EXPECT_EQ(e->shape[1], 16);
    read_tensor(r.r, "language_model.model.layers.0.self_attn.k_norm_moe_gen.weight", &e);
    EXPECT_EQ(e->shape[0], 8);  // head_dim = 48 / 6
    EXPECT_LT(ckpt_find(r.r, "language_model.model.layers.1.self_attn.q_proj.weight"), 0);
}

TEST(MotBootstrap, AMissingSourceTensorFailsNamingIt) {
    // the model is declared from the full LLM, but the directory the LLM is loaded from lacks a tensor
    Inputs in;
    std::vector<StTensor> t = in.llm_t;
    for (size_t i = 0; i < t.size(); i++)
        if (t[i].name == "model.layers.1.mlp.up_proj.weight") t.erase(t.begin() + (long)i);
    std::string partial = in.dir + "/partial";
    write_llm_dir(partial, t);
    std::string recipe = in.dir + "/missing.yaml", log;
    write_file(recipe, "include: [" + recipe_abs() + "]\nstages:\n  - {id: load_llm, with: {path: " + partial + "}}\n");
    int rc = in.run(2, in.dir + "/o", &log, recipe);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(rc, 124) << "hung: " << log;
    EXPECT_NE(log.find("language_model.model.layers.1.mlp.up_proj.weight not restored"), std::string::npos) << log;
    EXPECT_FALSE(exists(in.dir + "/o/.metadata"));
}

TEST(MotBootstrap, AShapeConflictFailsNamingTheTensor) {
    // the LLM loaded is not the one the model was declared from: one tensor has another shape
    Inputs in;
    std::vector<StTensor> t = in.llm_t;
    for (StTensor &x : t)
        if (x.name == "model.layers.0.mlp.down_proj.weight") x = st_tensor(x.name, FSDP_DT_BF16, {32, 40}, 7);
    std::string other = in.dir + "/other";
    write_llm_dir(other, t);
    std::string recipe = in.dir + "/conflict.yaml", log;
    write_file(recipe, "include: [" + recipe_abs() + "]\nstages:\n  - {id: load_llm, with: {path: " + other + "}}\n");
    EXPECT_EQ(in.run(0, in.dir + "/o", &log, recipe), 1) << log;
    EXPECT_NE(log.find("model.layers.0.mlp.down_proj.weight has shape [32, 40] in the checkpoint, the model needs "
                       "[32, 48]"),
              std::string::npos)
        << log;
    // and two parts declaring one name with different shapes: a validation error naming both parts
    std::string twice = in.dir + "/twice.yaml";
    write_file(twice, "include: [" + recipe_abs() + "]\nmodel:\n  parts:\n"
                          "    - {name: llm, prefix: language_model., from: \"${llm}\"}\n"
                          "    - {name: extra, prefix: language_model., params: [{name: model.norm.weight, shape: [31]}]}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + twice + " --set vars.llm=" + in.llm + " --set vars.vit=" + in.vit,
                      &log), 2) << log;
    EXPECT_NE(log.find("shape conflict: parameter language_model.model.norm.weight is [32] in part 'llm' (checkpoint "),
              std::string::npos) << log;
    EXPECT_NE(log.find("and [31] in part 'extra'"), std::string::npos) << log;
}

TEST(MotBootstrap, AnUninitialisedParameterFailsNamingIt) {
    // only the q_proj experts are copied: the other experts were neither loaded nor initialised
    Inputs in;
    std::string recipe = in.dir + "/partial_copy.yaml", log;
    write_file(recipe, "include: [" + recipe_abs() + "]\nstages:\n"
                           "  - {id: experts, with: {ops: [{copy: {to: \"**q_proj_moe_gen**\", replace: {_moe_gen: \"\"}}}]}}\n");
    int rc = in.run(3, in.dir + "/o", &log, recipe);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(rc, 124) << "hung: " << log;
    EXPECT_NE(log.find("save-dcp: 25 parameters hold no value: language_model.model.layers.0.self_attn.k_proj_moe_gen."),
              std::string::npos) << log;
    EXPECT_NE(log.find("is in part 'llm_new'"), std::string::npos) << log;
    EXPECT_FALSE(exists(in.dir + "/o/.metadata"));
}
