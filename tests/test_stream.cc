// The streamed bootstrap (issue 40 item 1, runtime/state_defer.h): values that no stage before a save
// needs are not held; init-meta's draws, load-ckpt's rows and transform's copies are produced into the
// save's write buffers. Every case below is run twice, streamed (the default) and with
// runtime.stream=false (every value materialised where it is made, the path before the change), and the
// two outputs must be the same bytes (the save's random identity aside); the report must show that the
// streamed run streamed and the other did not. Failures of a deferred read fail the save, naming the
// tensor, and leave no checkpoint.
#include <gtest/gtest.h>

#include <jansson.h>

#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using namespace fsdp_test;

namespace {

std::vector<std::string> files_in(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) out.push_back(e->d_name);
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

// Two outputs of one recipe (directories whose names have one length): the same files, each the same
// bytes once the save identity is blanked (DCP .metadata and data files), byte for byte otherwise.
void expect_same_output(const std::string &a, const std::string &b, const std::string &what) {
    std::vector<std::string> fa = files_in(a), fb = files_in(b);
    ASSERT_FALSE(fa.empty()) << what << ": nothing in " << a;
    ASSERT_EQ(fa, fb) << what;
    for (const std::string &f : fa) {
        std::string pa = a + "/" + f, pb = b + "/" + f;
        if (f == ".metadata") {
            EXPECT_TRUE(dcp_metadata_blanked(a) == dcp_metadata_blanked(b)) << what << ": " << f;
        } else if (f.size() > 7 && f.compare(f.size() - 7, 7, ".distcp") == 0) {
            EXPECT_TRUE(dcp_data_blanked(pa) == dcp_data_blanked(pb)) << what << ": " << f;
        } else {
            EXPECT_TRUE(read_file(pa) == read_file(pb)) << what << ": " << f;
        }
    }
}

// The largest value of metric `name` over the report's stages (rank 0's); -1 when no stage has it.
double report_metric(const std::string &report, const std::string &name) {
    json_error_t je;
    json_t *root = json_load_file(report.c_str(), 0, &je);
    EXPECT_NE(root, nullptr) << report << ": " << je.text;
    double v = -1;
    size_t i;
    json_t *st;
    json_array_foreach(json_object_get(root, "stages"), i, st) {
        json_t *m = json_object_get(json_object_get(st, "metrics"), name.c_str());
        if (json_is_number(m)) v = std::max(v, json_number_value(m));
    }
    json_decref(root);
    return v;
}

struct Streamed {
    std::string dir = make_tmpdir("fsdp-stream");
    ~Streamed() { rm_rf(dir); }
    // runs `args` (with {OUT} replaced by the output path) streamed ("on") and not ("of"); both must pass
    void run_both(int np, const std::string &args, std::string *on, std::string *of, double *streamed_on,
                  double *streamed_of) {
        for (int k = 0; k < 2; k++) {
            std::string out = dir + (k ? "/of" : "/on"), a = args;
            for (size_t p; (p = a.find("{OUT}")) != std::string::npos;) a.replace(p, 5, out);
            std::string rep = out + ".json";
            int rc;
            std::string log = run_np(np, a + " --report " + rep + (k ? " --set runtime.stream=false" : ""), &rc);
            ASSERT_EQ(rc, 0) << log;
            (k ? *of : *on) = out;
            (k ? *streamed_of : *streamed_on) = report_metric(rep, "params_streamed");
        }
    }
    void expect_same(int np, const std::string &args, const std::string &what, bool expect_streamed = true) {
        std::string on, of;
        double son = -1, sof = -1;
        run_both(np, args, &on, &of, &son, &sof);
        if (::testing::Test::HasFatalFailure()) return;
        if (expect_streamed) {
            EXPECT_GT(son, 0) << what << ": the streamed run held every value";
        }
        EXPECT_LE(sof, 0) << what << ": runtime.stream=false streamed";
        expect_same_output(on, of, what);
        rm_rf(on);
        rm_rf(of);
    }
};

std::string bagel_args(const std::string &layout, const std::string &extra = "") {
    std::string f = fixtures_dir() + "/bagel-056b5fd/sources";
    return "recipes/bagel_bootstrap.yaml --set vars.llm=" + f + "/llm --set vars.vit=" + f +
           "/vit --set vars.out={OUT} --set vars.max_latent_size=4 --set vars.vit_max_num_patch_per_side=5 "
           "--set vars.layout=" + layout + " " + extra;
}

TEST(StreamedBootstrap, BagelEqualsTheMaterialisedPathInEveryLayoutOnOneAndThreeRanks) {
    Streamed t;
    for (int np : {1, 3}) {
        t.expect_same(np, bagel_args("pr240"), "pr240 on " + std::to_string(np));
        t.expect_same(np, bagel_args("dcp"), "dcp on " + std::to_string(np));
        t.expect_same(np, bagel_args("pr240", "--set vars.with_optimizer=true"),
                      "pr240 with optimizer on " + std::to_string(np));
    }
    // head: save-safetensors pulls each parameter's rows (it writes no params_streamed)
    t.expect_same(1, bagel_args("head"), "head on 1", false);
    t.expect_same(3, bagel_args("head", "--set vars.visual_und=false"), "head without the ViT on 3", false);
}

// A recipe of its own in t.dir: `model` and the stages after init-meta.
std::string write_recipe(const Streamed &t, const std::string &name, const std::string &body) {
    std::string p = t.dir + "/" + name + ".yaml";
    write_file(p, "version: 1\nname: " + name + "\nvars: {out: \"\"}\nruntime: {device: cpu, seed: 7}\n" + body);
    return p + " --set vars.out={OUT}";
}

TEST(StreamedBootstrap, HfRowsWithPermutedQkAndDrawsInEveryDtypeEqualTheMaterialisedPath) {
    Streamed t;
    for (const char *m : {"llama32_tiny", "qwen2_tiny", "qwen3_tiny"}) {
        std::string hf = hf_fixture(m);
        // the HF q/k rows are un-permuted on the way (names: hf), on 1 and 2 ranks (rows cut mid-head)
        std::string r = write_recipe(t, std::string("hf_") + m,
                                     "model: {from_hf: " + hf + "}\nstages:\n"
                                     "  - {id: l, uses: load-ckpt, with: {path: " + hf + ", names: hf}}\n"
                                     "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
        for (int np : {1, 2}) t.expect_same(np, r, std::string(m) + " hf load on " + std::to_string(np));
    }
    // init rules drawn in bf16 and f16 (rounded as they are produced), copies that narrow, a cast, a
    // fill, an async save's snapshot
    std::string r = write_recipe(t, "draws",
                                 "model: {arch: llama3, dim: 48, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 97, "
                                 "ffn_hidden: 80}\nstages:\n"
                                 "  - {id: i, uses: init-meta, with: {dtype: bf16}}\n"
                                 "  - {id: c, uses: transform, with: {ops: [{copy: {from: layers.0.**, to: layers.1.**}},"
                                 " {cast: {keys: output.weight, dtype: f16}}, {fill: {keys: norm.weight, value: 0.5}}]}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\", async: true}}\n");
    for (int np : {1, 2, 3}) t.expect_same(np, r, "bf16 draws, copies, cast, fill, async on " + std::to_string(np));
    r = write_recipe(t, "f16", "model: {arch: qwen3, dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 1, vocab_size: 61, "
                               "ffn_hidden: 40}\nstages:\n"
                               "  - {id: i, uses: init-meta, with: {dtype: f16}}\n"
                               "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    t.expect_same(2, r, "f16 draws on 2");
}

TEST(StreamedBootstrap, ADcpSourceIsReadWholeAtTheLoadAndTheSaveIsTheSame) {
    // a DCP tensor is read at the load, whole, so that its records' CRC-32 is checked: nothing of it is
    // deferred; the init-meta draws beside it still are
    Streamed t;
    std::string r = write_recipe(t, "dcp_src",
                                 "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: l, uses: load-ckpt, with: {path: " + tiny("dcp_model_ws2") +
                                 ", keys: [\"layers.0.**\"], strict: false}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    for (int np : {1, 2}) {
        std::string on, of;
        double son = -1, sof = -1;
        t.run_both(np, r, &on, &of, &son, &sof);
        ASSERT_FALSE(::testing::Test::HasFatalFailure());
        EXPECT_GT(son, 0);
        EXPECT_LE(sof, 0);
        EXPECT_EQ(report_metric(on + ".json", "params_loaded") > 0, true);
        json_error_t je;
        json_t *rep = json_load_file((on + ".json").c_str(), 0, &je);
        ASSERT_NE(rep, nullptr);
        json_t *l = json_array_get(json_object_get(rep, "stages"), 1);
        EXPECT_EQ(json_number_value(json_object_get(json_object_get(l, "metrics"), "params_deferred")), 0) << on;
        json_decref(rep);
        expect_same_output(on, of, "dcp source on " + std::to_string(np));
        rm_rf(on);
        rm_rf(of);
    }
}

TEST(StreamedBootstrap, AStageThatReadsValuesGetsThemMaterialised) {
    // train-steps reads the values as they are held: everything is materialised before it, and the
    // trained checkpoint is the same either way
    Streamed t;
    std::string hf = hf_fixture("llama32_tiny");
    std::string r = write_recipe(t, "train",
                                 "model: {from_hf: " + hf + "}\ndata: {kind: synthetic, seq_len: 8, batch_size: 2}\n"
                                 "stages:\n"
                                 "  - {id: l, uses: load-ckpt, with: {path: " + hf + ", names: hf}}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 2, lr: 1.0e-3}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    t.expect_same(2, r, "load, train, save", false);
}

// A safetensors file of one float32 tensor "w" [rows, cols] holding `values`.
void write_st(const std::string &path, int rows, int cols, const std::vector<float> &values) {
    std::string h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(rows) + "," + std::to_string(cols) +
                    "],\"data_offsets\":[0," + std::to_string(values.size() * 4) + "]}}";
    while (h.size() % 8) h += ' ';
    std::string f(8, '\0');
    uint64_t n = h.size();
    memcpy(&f[0], &n, 8);
    f += h;
    f.append((const char *)values.data(), values.size() * 4);
    write_file(path, f);
}

TEST(StreamedBootstrap, NaNInADeferredSourceFailsTheSaveNamingItAndLeavesNoCheckpoint) {
    Streamed t;
    std::vector<float> v(64 * 40, 0.25f);
    v[64 * 40 - 3] = NAN;
    write_st(t.dir + "/src.safetensors", 64, 40, v);
    std::string r = write_recipe(t, "nan",
                                 "model:\n  parts:\n    - {name: p, from: " + t.dir + "/src.safetensors, dtype: f32}\n"
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: l, uses: load-ckpt, with: {parts: [p]}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + t.dir + "/out}}\n");
    for (int np : {1, 2}) {
        for (const char *stream : {"true", "false"}) {
            int rc;
            std::string log = run_np(np, r + " --set runtime.stream=" + stream, &rc);
            EXPECT_EQ(rc, 1) << log;
            EXPECT_NE(log.find("holds NaN"), std::string::npos) << log;
            EXPECT_NE(log.find("w"), std::string::npos) << log;
            EXPECT_FALSE(exists(t.dir + "/out/.metadata")) << "stream " << stream << " on " << np << ": " << log;
            rm_rf(t.dir + "/out");
        }
    }
}

TEST(StreamedBootstrap, RuntimeStreamIsCheckedByValidate) {
    Streamed t;
    std::string r = write_recipe(t, "bad", "model: {arch: llama3, dim: 32, n_layers: 1, n_heads: 2, vocab_size: 61}\n"
                                           "stages:\n  - {id: i, uses: init-meta}\n");
    int rc;
    std::string log = run_np(1, "validate " + r + " --set runtime.stream=sometimes", &rc);
    EXPECT_EQ(rc, 2) << log;
    EXPECT_NE(log.find("stream"), std::string::npos) << log;
}

}  // namespace
