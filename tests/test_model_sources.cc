// Model parts that know their source (issue 24, item 2): transforms of stored tensors (permute and
// reshape), prefix alternatives, key globs with brace ranges over dims, a {count, in} dim, entries declared
// only when no part declares them, the model's checks, and load-ckpt `parts:` without `path`, which loads
// each part from its own source with what the part declares. On tiny inputs written with the project's
// own safetensors writer, on 1 and 3 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mot_inputs.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d;
    Dir() : d(make_tmpdir("fsdp-src")) {}
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

// values 0, 1, 2, ... (exact in f32) so that a permutation is visible element by element
StTensor iota(const std::string &name, std::vector<int64_t> shape, float base = 0) {
    StTensor t{name, FSDP_DT_F32, shape, {}};
    t.vals.resize((size_t)numel_of(shape));
    for (size_t i = 0; i < t.vals.size(); i++) t.vals[i] = base + (float)i;
    return t;
}

int run_recipe(const std::string &recipe, int np, const std::string &sets, std::string *log) {
    std::string cmd = "timeout -k 10 120 " + (np > 0 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() + " " +
                      recipe + " " + sets;
    return run_cmd(cmd, log);
}

int validate(const std::string &recipe, const std::string &sets, std::string *log) {
    return run_cmd("timeout -k 10 60 " + fsdp_run_bin() + " validate " + recipe + " " + sets, log);
}

bool has(const std::string &log, const std::string &s) { return log.find(s) != std::string::npos; }

// A conv weight [C, I, K, K] and a matrix [4, 6], stored the way a source stores them.
const char *TRANSFORM_RECIPE = R"Y(version: 1
vars: {src: "", out: ""}
runtime: {device: cpu}
model:
  dims: {C: {shape: enc.conv.bias, dim: 0}}
  parts:
    - name: enc
      prefix: enc.
      from: "${src}"
      transform:
        conv.weight: {permute: [0, 2, 3, 1], reshape: [C, -1]}
        m: {permute: [1, 0]}
stages:
  - {id: init, uses: init-meta}
  - {id: load, uses: load-ckpt, with: {parts: [enc]}}
  - {id: save, uses: save-dcp, with: {path: "${out}", overwrite: true}}
)Y";

}  // namespace

TEST(SourcePart, TransformsPermuteAndReshapeAsTorchOnOneAndThreeRanks) {
    Dir t;
    const int64_t C = 5, I = 3, K = 2;
    StTensor conv = iota("conv.weight", {C, I, K, K}), m = iota("m", {4, 6}, 1000), bias = iota("conv.bias", {C}, 500);
    write_st(t / "src.safetensors", {conv, m, bias});
    write_file(t / "r.yaml", TRANSFORM_RECIPE);
    std::string log;
    for (int np : {1, 3}) {
        std::string out = t / ("o" + std::to_string(np));
        ASSERT_EQ(run_recipe(t / "r.yaml", np, "--set vars.src=" + (t / "src.safetensors") + " --set vars.out=" + out, &log),
                  0) << log;
        Reader r(out);
        ASSERT_NE(r.r, nullptr);
        // Bagel's convert_conv2d_to_linear: column (ky*K + kx)*I + ch of row c = w[c, ch, ky, kx]
        const ckpt_entry *e = nullptr;
        std::vector<float> lin = read_tensor(r.r, "enc.conv.weight", &e);
        ASSERT_NE(e, nullptr);
        ASSERT_EQ(e->ndim, 2);
        EXPECT_EQ(e->shape[0], C);
        EXPECT_EQ(e->shape[1], I * K * K);
        for (int64_t c = 0; c < C; c++)
            for (int64_t ch = 0; ch < I; ch++)
                for (int64_t ky = 0; ky < K; ky++)
                    for (int64_t kx = 0; kx < K; kx++)
                        ASSERT_EQ(lin[(size_t)(c * I * K * K + (ky * K + kx) * I + ch)],
                                  conv.vals[(size_t)(((c * I + ch) * K + ky) * K + kx)])
                            << np << " ranks: c " << c << " ch " << ch << " ky " << ky << " kx " << kx;
        // a transpose moves dim 0: every rank reads the whole tensor and keeps its rows of the result
        std::vector<float> mt = read_tensor(r.r, "enc.m", &e);
        ASSERT_EQ(e->shape[0], 6);
        ASSERT_EQ(e->shape[1], 4);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++) ASSERT_EQ(mt[(size_t)(i * 4 + j)], m.vals[(size_t)(j * 6 + i)]) << i << "," << j;
        EXPECT_EQ(read_tensor(r.r, "enc.conv.bias"), bias.vals);
    }
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + (t / "o1") + " " + (t / "o3"), &log), 0) << log;
    // a load from an explicit path does not transform: the stored shape is a shape mismatch there
    write_file(t / "explicit.yaml", std::string(TRANSFORM_RECIPE) +
                                        "  - {id: again, uses: load-ckpt, with: {path: \"${src}\", parts: [enc]}}\n");
    EXPECT_EQ(run_recipe(t / "explicit.yaml", 0, "--set vars.src=" + (t / "src.safetensors") + " --set vars.out=" + (t / "x"), &log), 1)
        << log;
    EXPECT_TRUE(has(log, "conv.weight has shape [5, 3, 2, 2] in the checkpoint, the model needs [5, 12]")) << log;
}

TEST(SourcePart, TransformsAreCheckedBeforeAnythingIsRead) {
    Dir t;
    write_st(t / "src.safetensors", {iota("conv.weight", {5, 3, 2, 2}), iota("m", {4, 6}), iota("conv.bias", {5})});
    std::string base = std::string(TRANSFORM_RECIPE), log;
    auto with_transform = [&](const std::string &conv, const std::string &m) {
        std::string r = base;
        r.replace(r.find("{permute: [0, 2, 3, 1], reshape: [C, -1]}"), 41, conv);
        r.replace(r.find("{permute: [1, 0]}"), 17, m);
        write_file(t / "bad.yaml", r);
        return validate(t / "bad.yaml", "--set vars.src=" + (t / "src.safetensors") + " --set vars.out=" + (t / "o"), &log);
    };
    EXPECT_EQ(with_transform("{permute: [0, 2, 3, 1], reshape: [7, -1]}", "{permute: [1, 0]}"), 2) << log;
    EXPECT_TRUE(has(log, "transform conv.weight: enc.conv.weight is stored as [5, 3, 2, 2] (60 elements), which does "
                         "not reshape to [7, 8]")) << log;
    EXPECT_EQ(with_transform("{permute: [0, 2, 1]}", "{permute: [1, 0]}"), 2) << log;
    EXPECT_TRUE(has(log, "enc.conv.weight is stored as [5, 3, 2, 2] (4 dims); permute lists 3")) << log;
    EXPECT_EQ(with_transform("{permute: [0, 0, 2, 1]}", "{permute: [1, 0]}"), 2) << log;
    EXPECT_TRUE(has(log, "permute must list each dim 0..3 once")) << log;
    EXPECT_EQ(with_transform("{reshape: [C, -1, -1]}", "{permute: [1, 0]}"), 2) << log;
    EXPECT_TRUE(has(log, "(one -1 at most)")) << log;
    EXPECT_EQ(with_transform("{permute: [0, 2, 3, 1]}", "{turn: [1, 0]}"), 2) << log;
    EXPECT_TRUE(has(log, "transform m: unknown key 'turn' (permute, reshape)")) << log;
    write_file(t / "nomatch.yaml", base + "");
    std::string r = base;
    r.replace(r.find("        m: {permute: [1, 0]}"), 28, "        nothing.*: {permute: [1, 0]}");
    write_file(t / "nomatch.yaml", r);
    EXPECT_EQ(validate(t / "nomatch.yaml", "--set vars.src=" + (t / "src.safetensors") + " --set vars.out=" + (t / "o"), &log), 2)
        << log;
    EXPECT_TRUE(has(log, "transform nothing.* matches no tensor of part 'enc'")) << log;
}

// A SigLIP-like source: layers 0..2, a head, with or without the `vision_model.` prefix.
std::vector<StTensor> layered(const std::string &pre) {
    std::vector<StTensor> v;
    for (int l = 0; l < 3; l++) {
        v.push_back(iota(pre + "encoder.layers." + std::to_string(l) + ".layer_norm1.weight", {4}, 10.0f * (float)l));
        v.push_back(iota(pre + "encoder.layers." + std::to_string(l) + ".fc.weight", {4, 4}, 100.0f * (float)l));
    }
    v.push_back(iota(pre + "head.probe", {1, 4}, 7));
    v.push_back(iota(pre + "post_layernorm.weight", {4}, 3));
    return v;
}

const char *KEEP_RECIPE = R"Y(version: 1
vars: {src: "", out: "", select: -2}
runtime: {device: cpu}
model:
  dims:
    src_layers: {count: "**layers.*.layer_norm1.weight", in: "${src}"}
    keep: src_layers + 1 + (${select})
  parts:
    - name: vit
      prefix: vit.
      from: "${src}"
      strip_prefix: ["vision_model.", ""]
      keys: ["encoder.layers.{0..keep-1}.**", "post_layernorm.*"]
stages:
  - {id: init, uses: init-meta}
  - {id: load, uses: load-ckpt, with: {parts: [vit]}}
  - {id: save, uses: save-dcp, with: {path: "${out}", overwrite: true}}
)Y";

TEST(SourcePart, PrefixAlternativesAndKeyRangesTakeWhatThePartDeclares) {
    Dir t;
    write_st(t / "with.safetensors", layered("vision_model."));
    write_st(t / "without.safetensors", layered(""));
    write_file(t / "r.yaml", KEEP_RECIPE);
    std::string log;
    for (const char *src : {"with", "without"}) {
        std::string out = t / (std::string("o_") + src);
        ASSERT_EQ(run_recipe(t / "r.yaml", 3, "--set vars.src=" + (t / (std::string(src) + ".safetensors")) +
                                                  " --set vars.out=" + out, &log), 0) << log;
        Reader r(out);
        size_t tensors = 0;
        for (size_t i = 0; i < ckpt_count(r.r); i++) tensors += ckpt_entry_at(r.r, i)->is_tensor;
        EXPECT_EQ(tensors, 5u) << src << ": layers 0 and 1 (2 tensors each) and post_layernorm; layer 2 and the head dropped";
        EXPECT_EQ(read_tensor(r.r, "vit.encoder.layers.1.fc.weight"), iota("x", {4, 4}, 100).vals);
        EXPECT_LT(ckpt_find(r.r, "vit.encoder.layers.2.fc.weight"), 0);
        EXPECT_LT(ckpt_find(r.r, "vit.head.probe"), 0);
    }
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + (t / "o_with") + " " + (t / "o_without"), &log), 0) << log;
    // select -1 keeps every layer; a range that expands to nothing is no glob at all
    ASSERT_EQ(run_recipe(t / "r.yaml", 0, "--set vars.src=" + (t / "with.safetensors") + " --set vars.out=" + (t / "all") +
                                              " --set vars.select=-1", &log), 0) << log;
    EXPECT_GE(ckpt_find(Reader(t / "all").r, "vit.encoder.layers.2.fc.weight"), 0);
    ASSERT_EQ(run_recipe(t / "r.yaml", 0, "--set vars.src=" + (t / "with.safetensors") + " --set vars.out=" + (t / "none") +
                                              " --set vars.select=-4", &log), 0) << log;
    EXPECT_LT(ckpt_find(Reader(t / "none").r, "vit.encoder.layers.0.fc.weight"), 0);
    // a kept glob that matches nothing is an error naming it
    ASSERT_EQ(validate(t / "r.yaml", "--set vars.src=" + (t / "with.safetensors") + " --set vars.out=" + (t / "o") +
                                         " --set vars.select=0", &log), 2) << log;
    EXPECT_TRUE(has(log, "keys glob 'encoder.layers.3.**' matches no tensor of the checkpoint")) << log;
    // a load from an explicit path: keys the part left out are unexpected, unless dropped on purpose
    std::string r = std::string(KEEP_RECIPE) + "  - {id: again, uses: load-ckpt, with: {path: \"${src}\", strip_prefix: "
                                               "vision_model., add_prefix: vit., parts: [vit]}}\n";
    write_file(t / "explicit.yaml", r);
    EXPECT_EQ(run_recipe(t / "explicit.yaml", 0, "--set vars.src=" + (t / "with.safetensors") + " --set vars.out=" + (t / "x"), &log), 1)
        << log;
    EXPECT_TRUE(has(log, "unexpected key vision_model.encoder.layers.2.fc.weight in the checkpoint")) << log;
    r.replace(r.rfind("parts: [vit]}}"), 14, "parts: [vit], drop: [\"encoder.layers.2.**\", head.probe]}}");
    write_file(t / "explicit.yaml", r);
    EXPECT_EQ(run_recipe(t / "explicit.yaml", 0, "--set vars.src=" + (t / "with.safetensors") + " --set vars.out=" + (t / "x"), &log), 0)
        << log;
}

TEST(SourcePart, UnlessDeclaredGivesATiedSourceItsOwnHead) {
    Dir t;
    std::vector<StTensor> untied = {iota("embed.weight", {64, 8}), iota("head.weight", {64, 8}, 5000)};
    write_st(t / "untied.safetensors", untied);
    write_st(t / "tied.safetensors", {untied[0]});
    write_file(t / "r.yaml", R"Y(version: 1
vars: {src: "", out: ""}
runtime: {device: cpu, seed: 3}
model:
  parts:
    - {name: lm, from: "${src}"}
    - name: lm_new
      params:
        - {name: head.weight, shape: [64, 8], init: "normal(0, 0.02)", unless_declared: true}
stages:
  - {id: init, uses: init-meta}
  - {id: load, uses: load-ckpt, with: {parts: [lm]}}
  - {id: save, uses: save-dcp, with: {path: "${out}", overwrite: true}}
)Y");
    std::string log;
    ASSERT_EQ(run_recipe(t / "r.yaml", 0, "--set vars.src=" + (t / "untied.safetensors") + " --set vars.out=" + (t / "u"), &log), 0)
        << log;
    EXPECT_EQ(read_tensor(Reader(t / "u").r, "head.weight"), untied[1].vals) << "a stored head is the source's";
    ASSERT_EQ(run_recipe(t / "r.yaml", 2, "--set vars.src=" + (t / "tied.safetensors") + " --set vars.out=" + (t / "t"), &log), 0)
        << log;
    Reader r(t / "t");
    std::vector<float> h = read_tensor(r.r, "head.weight"), emb = read_tensor(r.r, "embed.weight");
    ASSERT_EQ(h.size(), 512u);
    EXPECT_NE(h, emb) << "a tied source's head is drawn, never a copy of the embedding";
    double s = 0, s2 = 0;
    for (float x : h) s += x, s2 += (double)x * x;
    EXPECT_NEAR(std::sqrt(s2 / 512 - (s / 512) * (s / 512)), 0.02, 0.003);
    // without unless_declared, two parts declaring one name stay an error
    std::string rr = read_file(t / "r.yaml");
    rr.replace(rr.find(", unless_declared: true"), 23, "");
    write_file(t / "twice.yaml", rr);
    EXPECT_EQ(validate(t / "twice.yaml", "--set vars.src=" + (t / "untied.safetensors") + " --set vars.out=" + (t / "o"), &log), 2);
    EXPECT_TRUE(has(log, "parameter head.weight is declared twice")) << log;
}

const char *CHECKS_RECIPE = R"Y(version: 1
vars: {llm: "", out: "", side: 2}
runtime: {device: cpu}
model:
  dims:
    hidden: {config: "${llm}/config.json", key: hidden_size}
    layers: {count: "**layers.*.input_layernorm.weight", in: "${llm}"}
    vocab: {shape: model.embed_tokens.weight, dim: 0}
  checks:
    - {path: "${llm}", is: dir, message: "vars.llm must be a directory"}
    - {config: "${llm}/config.json", key: model_type, in: [qwen2], message: "vars.llm must be a Qwen2"}
    - {that: "layers >= 2", message: "the LLM needs 2 layers"}
    - {that: "vocab >= ${side} * ${side}", message: "the vocabulary is too small"}
    - {has: model.norm.weight, message: "the LLM has no final norm"}
  parts:
    - {name: llm, from: "${llm}"}
stages:
  - {id: init, uses: init-meta}
  - {id: load, uses: load-ckpt, with: {parts: [llm]}}
  - {id: save, uses: save-dcp, with: {path: "${out}", overwrite: true}}
)Y";

TEST(ModelChecks, EveryFailedCheckIsReportedWithItsMessageBeforeAnyTensorIsRead) {
    Dir t;
    write_llm_dir(t / "llm", tiny_qwen2());
    write_file(t / "r.yaml", CHECKS_RECIPE);
    std::string log, sets = "--set vars.out=" + (t / "o") + " --set vars.llm=";
    ASSERT_EQ(validate(t / "r.yaml", sets + (t / "llm"), &log), 0) << log;
    ASSERT_EQ(run_recipe(t / "r.yaml", 0, sets + (t / "llm"), &log), 0) << log;
    // a model that is not a Qwen2 and has too few layers: both checks fail before the parts, each with its
    // message; one that needs a declared parameter (vocab) is made once the parts are declared
    write_llm_dir(t / "one", tiny_qwen2(QwenDims{1, 32, 4, 2, 48, 64}), QwenDims{1, 32, 4, 2, 48, 64});
    write_file(t / "one/config.json", "{\"model_type\": \"llama\", \"hidden_size\": 32}");
    EXPECT_EQ(validate(t / "r.yaml", sets + (t / "one") + " --set vars.side=9", &log), 2) << log;
    EXPECT_TRUE(has(log, "model: 2 checks failed:")) << log;
    EXPECT_TRUE(has(log, "vars.llm must be a Qwen2 (" + (t / "one/config.json") + " has model_type = \"llama\")")) << log;
    EXPECT_TRUE(has(log, "the LLM needs 2 layers (layers >= 2: 1 >= 2 is false)")) << log;
    EXPECT_EQ(validate(t / "r.yaml", sets + (t / "llm") + " --set vars.side=9", &log), 2) << log;
    EXPECT_TRUE(has(log, "model: 1 check failed:")) << log;
    EXPECT_TRUE(has(log, "the vocabulary is too small (vocab >= 9 * 9: 64 >= 81 is false)")) << log;
    // a file where a directory is expected; a directory without config.json (even under validate)
    EXPECT_EQ(validate(t / "r.yaml", sets + (t / "llm/model.safetensors"), &log), 2) << log;
    EXPECT_TRUE(has(log, "vars.llm must be a directory (" + (t / "llm/model.safetensors") + " is a file, expected a directory)"))
        << log;
    ASSERT_EQ(run_cmd("rm " + (t / "llm/config.json"), nullptr), 0);
    EXPECT_EQ(validate(t / "r.yaml", sets + (t / "llm"), &log), 2) << log;
    EXPECT_TRUE(has(log, "vars.llm must be a Qwen2 (" + (t / "llm/config.json") + ": No such file or directory)")) << log;
    // a run stops at planning, before any stage
    EXPECT_EQ(run_recipe(t / "r.yaml", 0, sets + (t / "one"), &log), 2) << log;
    EXPECT_TRUE(has(log, "the LLM needs 2 layers (layers >= 2: 1 >= 2 is false)")) << log;
    EXPECT_FALSE(has(log, "stage init")) << log;
    // a source that does not exist yet (a recipe checked for another machine): validate skips it
    EXPECT_EQ(validate(t / "r.yaml", sets + (t / "later/llm"), &log), 0) << log;
    // but a run reads its first model's sources when it plans: a missing one stops it before any stage
    EXPECT_EQ(run_recipe(t / "r.yaml", 0, sets + (t / "later/llm"), &log), 2) << log;
    EXPECT_TRUE(has(log, "later/llm")) << log;
    EXPECT_FALSE(has(log, "stage init")) << log;
}

TEST(ModelChecks, BadChecksAreErrorsAtTheirPosition) {
    Dir t;
    write_llm_dir(t / "llm", tiny_qwen2());
    std::string log, sets = "--set vars.out=" + (t / "o") + " --set vars.llm=" + (t / "llm");
    struct Case {
        const char *check, *want;
    } cases[] = {{"{that: \"layers\", message: m}", "that 'layers' compares nothing"},
                 {"{path: x, message: m}", "a path check needs is: dir, file or any"},
                 {"{that: \"layers > 1\"}", "a check needs a message"},
                 {"{that: \"layers > 1\", has: x, message: m}", "a check has one of path, config, that, has"},
                 {"{config: c.json, key: k, message: m}", "a config check needs key: KEY and in: [VALUES]"},
                 {"{has: x, message: m, extra: 1}", "unknown key 'extra' in a has check"}};
    for (const Case &c : cases) {
        std::string r = CHECKS_RECIPE;
        size_t a = r.find("  checks:\n"), b = r.find("  parts:\n");
        r.replace(a, b - a, std::string("  checks:\n    - ") + c.check + "\n");
        write_file(t / "r.yaml", r);
        EXPECT_EQ(validate(t / "r.yaml", sets, &log), 2) << c.check << ": " << log;
        EXPECT_TRUE(has(log, c.want)) << c.check << ": " << log;
        EXPECT_TRUE(has(log, "r.yaml:")) << "the position of the check: " << log;
    }
}

TEST(LoadCkptParts, WithoutPathEachPartNeedsASourceAndNoPathOption) {
    Dir t;
    write_llm_dir(t / "llm", tiny_qwen2());
    write_file(t / "r.yaml", R"Y(version: 1
vars: {llm: ""}
runtime: {device: cpu}
model:
  parts:
    - {name: llm, from: "${llm}"}
    - {name: extra, params: [{name: x, shape: [4], init: zeros}]}
stages:
  - {id: init, uses: init-meta}
  - {id: load, uses: load-ckpt, with: {parts: [llm, extra]}}
)Y");
    std::string log;
    EXPECT_EQ(run_recipe(t / "r.yaml", 0, "--set vars.llm=" + (t / "llm"), &log), 1) << log;
    EXPECT_TRUE(has(log, "part 'extra' (inline table) has no source of its own (it is not declared with from:): give path"))
        << log;
    for (const char *opt : {"strip_prefix: x.", "rename: {a: b}", "drop: [a]", "if_missing: init"}) {
        std::string r = read_file(t / "r.yaml");
        r.replace(r.find("parts: [llm, extra]"), 19, std::string("parts: [llm], ") + opt);
        write_file(t / "o.yaml", r);
        EXPECT_EQ(validate(t / "o.yaml", "--set vars.llm=" + (t / "llm"), &log), 2) << opt << ": " << log;
        EXPECT_TRUE(has(log, "applies to a load from path; parts without path load from each part's own source")) << log;
    }
    std::string r = read_file(t / "r.yaml");
    r.replace(r.find("with: {parts: [llm, extra]}"), 27, "with: {strict: true}");
    write_file(t / "none.yaml", r);
    EXPECT_EQ(validate(t / "none.yaml", "--set vars.llm=" + (t / "llm"), &log), 2) << log;
    EXPECT_TRUE(has(log, "load-ckpt: give path (a checkpoint), or parts without path")) << log;
}
