// The bootstrap-then-always-resume workflow end to end: the fsdp-run binary on 1..4 ranks.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>

#include "ckpt_compare.h"
#include "gpu_util.h"
#include "jsonl_util.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-wf");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};



void expect_close(const std::vector<double> &a, const std::vector<double> &b, double rel) {
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(a[i], b[i], rel * std::fabs(b[i])) << "entry " << i;
}

// every tensor of two checkpoints equal bit for bit (both directions)
void expect_same_ckpt(const std::string &a, const std::string &b) {
    Ckpt x(a), y(b);
    ASSERT_TRUE(x.r && y.r);
    expect_same_tensors(x.r, y.r);
    expect_same_tensors(y.r, x.r);
}

const char *TINY =
    "model: {preset: tiny}\n"
    "data: {kind: text, path: data/quickstart.txt, batch_size: 4, seq_len: 32}\n";

}  // namespace

TEST(E2EWorkflow, BagelBootstrapOnTwoRanksThenTrainOnThreeEqualsOneRank) {
    Dir t;
    int rc;
    std::string common = " --set vars.steps=4";
    std::string o = run_np(2, "recipes/llama_bootstrap.yaml --set vars.out=" + (t / "b2"), &rc);
    ASSERT_EQ(rc, 0) << o;
    o = run_np(3, "recipes/llama_train.yaml --set vars.ckpt=" + (t / "b2") + " --set vars.out=" + (t / "t3") +
                      " --set vars.metrics=" + (t / "m3.jsonl") + common,
               &rc);
    ASSERT_EQ(rc, 0) << o;
    o = run_np(1, "recipes/llama_bootstrap.yaml --set vars.out=" + (t / "b1"), &rc);
    ASSERT_EQ(rc, 0) << o;
    o = run_np(1, "recipes/llama_train.yaml --set vars.ckpt=" + (t / "b1") + " --set vars.out=" + (t / "t1") +
                      " --set vars.metrics=" + (t / "m1.jsonl") + common,
               &rc);
    ASSERT_EQ(rc, 0) << o;
    expect_close(jsonl_field(t / "m3.jsonl", "loss"), jsonl_field(t / "m1.jsonl", "loss"), 1e-6);
    expect_same_ckpt(t / "b2", t / "b1");  // the step-0 checkpoint does not depend on the world size
}

TEST(E2EWorkflow, InitMetaOnFourRanksEqualsInitCpuAndShardOnOne) {
    Dir t;
    std::string meta = t / "meta.yaml", cpu = t / "cpu.yaml";
    write_file(meta, std::string("model: {preset: debugmodel}\nstages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: ") + (t / "m") + "}}\n");
    write_file(cpu, std::string("model: {preset: debugmodel}\nstages:\n  - {id: i, uses: init-cpu}\n"
                                "  - {id: sh, uses: shard}\n  - {id: s, uses: save-dcp, with: {path: ") +
                        (t / "c") + "}}\n");
    int rc;
    std::string o = run_np(4, meta, &rc);
    ASSERT_EQ(rc, 0) << o;
    o = run_np(1, cpu, &rc);
    ASSERT_EQ(rc, 0) << o;
    expect_same_ckpt(t / "m", t / "c");
    Ckpt m(t / "m");
    EXPECT_EQ(ckpt_entry_at(m.r, (size_t)ckpt_find(m.r, "tok_embeddings.weight"))->chunks, 4);
}

TEST(E2EWorkflow, BitExactResume) {
    Dir t;
    std::string r = t / "r.yaml";
    write_file(r, std::string(TINY) + "stages:\n  - {id: i, uses: init-meta}\n"
                                      "  - {id: t, uses: train-steps, with: {steps: 10, lr: 2e-3, warmup_steps: 2, "
                                      "save_every: 4, save_path: " + (t / "ck") + ", metrics: " + (t / "full.jsonl") +
                      "}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "end_full") + "}}\n");
    std::string res = t / "res.yaml";
    write_file(res, std::string(TINY) + "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + (t / "ck/step-4") +
                        "}}\n  - {id: t, uses: train-steps, with: {steps: 10, lr: 2e-3, warmup_steps: 2, metrics: " +
                        (t / "res.jsonl") + "}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "end_res") + "}}\n");
    int rc;
    std::string o = run_np(1, r, &rc);
    ASSERT_EQ(rc, 0) << o;
    ASSERT_TRUE(exists(t / "ck/step-4/.metadata") && exists(t / "ck/step-8/.metadata"));
    o = run_np(2, res, &rc);  // resumed on another world size
    ASSERT_EQ(rc, 0) << o;
    auto full = jsonl_field(t / "full.jsonl", "loss"), resumed = jsonl_field(t / "res.jsonl", "loss");
    ASSERT_EQ(full.size(), 10u);
    ASSERT_EQ(resumed.size(), 6u);
    std::vector<double> tail(full.begin() + 4, full.end());
    expect_close(resumed, tail, 1e-6);
    o = run_np(1, res + " --set stages.s.with.path=" + (t / "end_res1") + " --set stages.t.with.metrics=" + (t / "r1.jsonl"), &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(jsonl_field(t / "r1.jsonl", "loss"), tail);  // same world size: identical
    expect_same_ckpt(t / "end_res1", t / "end_full");
}

// On the CPU, offload (params too) only records where the arrays live: training is the same, bit for bit.
TEST(E2EWorkflow, OffloadOnAndOffIdentical) {
    Dir t;
    std::string base = std::string(TINY) + "runtime: {device: cpu}\nstages:\n  - {id: i, uses: init-meta}\n";
    write_file(t / "off.yaml", base + "  - {id: t, uses: train-steps, with: {steps: 3, metrics: " + (t / "a.jsonl") +
                                   "}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "a") + "}}\n");
    write_file(t / "on.yaml", base + "  - {id: o, uses: offload, with: {params: true}}\n"
                                     "  - {id: t, uses: train-steps, with: {steps: 3, metrics: " + (t / "b.jsonl") +
                                  "}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "b") + "}}\n");
    int rc;
    std::string o = run_np(1, t / "off.yaml", &rc);
    ASSERT_EQ(rc, 0) << o;
    o = run_np(1, t / "on.yaml", &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(jsonl_field(t / "a.jsonl", "loss"), jsonl_field(t / "b.jsonl", "loss"));
    expect_same_ckpt(t / "a", t / "b");
    // and says so, once (not a silent no-op)
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + t / "on.yaml --set stages.s.with.path=" + t / "c", &o), 0) << o;
    std::string said = "offload on the CPU: the optimizer state and master weights (";
    size_t at = o.find(said);
    EXPECT_NE(at, std::string::npos) << o;
    EXPECT_EQ(o.find(said, at + 1), std::string::npos) << o;
    EXPECT_NE(o.find("already lives in host memory and stays there; nothing moves and training is unchanged"),
              std::string::npos)
        << o;
}

// offload {params: true} on the GPU keeps the master weights in host memory, which the GPU trainer does not
// compute from: a train-steps or eval after it is refused by validate (every such stage named), not silently
// run on the CPU. Without params, or on the CPU, the same recipe is valid.
TEST(E2EWorkflow, OffloadParamsBeforeTrainingOnTheGpuIsAValidateError) {
    Dir t;
    auto recipe = [&](const std::string &dev, const std::string &offload) {
        return std::string(TINY) + "runtime: {device: " + dev + "}\nstages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: o, uses: offload" + offload + "}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n"
               "  - {id: e, uses: eval}\n";
    };
    write_file(t / "bad.yaml", recipe("cuda", ", with: {params: true}"));
    std::string o;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + (t / "bad.yaml"), &o), 2) << o;
    EXPECT_NE(o.find("bad.yaml:6:"), std::string::npos) << o;  // points at params: true
    EXPECT_NE(o.find("stage 't' (train-steps) comes after stage 'o' (offload) with params: true on the GPU"),
              std::string::npos) << o;
    EXPECT_NE(o.find("stage 'e' (eval) comes after stage 'o' (offload) with params: true"), std::string::npos) << o;
    EXPECT_NE(o.find("Use offload without params"), std::string::npos) << o;
    write_file(t / "moments.yaml", recipe("cuda", ""));
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + (t / "moments.yaml"), &o), 0) << o;
    write_file(t / "cpu.yaml", recipe("cpu", ", with: {params: true}"));
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + (t / "cpu.yaml"), &o), 0) << o;
}

// The same on a run whose device is auto (resolved to the GPU when the run starts), and when the offload was in
// an earlier recipe of the chain: the run stops with the reason before any step, and trains nothing on the CPU.
TEST(E2EWorkflow, OffloadParamsThenTrainingOnTheGpuStopsBeforeAnyStep) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
    Dir t;
    write_file(t / "one.yaml", std::string(TINY) + "stages:\n  - {id: i, uses: init-meta}\n"
                               "  - {id: o, uses: offload, with: {params: true}}\n"
                               "  - {id: t, uses: train-steps, with: {steps: 2, metrics: " + (t / "m1.jsonl") + "}}\n");
    int rc;
    std::string o = run_np(1, t / "one.yaml", &rc);
    EXPECT_EQ(rc, 2) << o;
    EXPECT_NE(o.find("stage 't' (train-steps) comes after stage 'o' (offload) with params: true on the GPU"),
              std::string::npos) << o;
    EXPECT_FALSE(exists(t / "m1.jsonl"));
    write_file(t / "a.yaml", std::string(TINY) + "stages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: o, uses: offload, with: {params: true}}\n");
    write_file(t / "b.yaml", std::string(TINY) + "stages:\n  - {id: t, uses: train-steps, with: {steps: 2, metrics: " + (t / "m2.jsonl") +
                                 "}}\n");
    o = run_np(1, (t / "a.yaml") + " " + (t / "b.yaml"), &rc);
    EXPECT_EQ(rc, 1) << o;
    EXPECT_NE(o.find("the master weights are in host memory (offload with params: true) while the run uses the GPU"),
              std::string::npos) << o;
    EXPECT_FALSE(exists(t / "m2.jsonl") && !read_file(t / "m2.jsonl").empty());
}

TEST(E2EWorkflow, FixtureDcpReproducesReferenceOnOneAndTwoRanks) {
    Dir t;
    std::string r = t / "fx.yaml";
    write_file(r, "model: {preset: tiny}\ndata: {kind: safetensors, path: " + tiny("batch.safetensors") +
                      ", batch_size: 2, seq_len: 32}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                      tiny("dcp_seed_ws1") +
                      "}}\n  - {id: t, uses: train-steps, with: {steps: 5, lr: 1e-3, warmup_steps: 2, decay: linear, "
                      "min_lr_ratio: 0.1, betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0, "
                      "metrics: \"${m}\"}}\n  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\nvars: {m: x, out: y}\n");
    json_error_t je;
    json_t *ref = json_load_file(tiny("reference.json").c_str(), 0, &je);
    ASSERT_TRUE(ref);
    std::vector<double> want, lrs;
    for (size_t i = 0; i < 5; i++) {
        want.push_back(json_number_value(json_object_get(json_array_get(json_object_get(ref, "steps"), i), "loss")));
        lrs.push_back(json_number_value(json_object_get(json_array_get(json_object_get(ref, "steps"), i), "lr")));
    }
    json_decref(ref);
    for (int np : {1, 2}) {
        std::string m = t / ("m" + std::to_string(np) + ".jsonl"), out = t / ("o" + std::to_string(np));
        int rc;
        std::string o = run_np(np, r + " --set vars.m=" + m + " --set vars.out=" + out, &rc);
        ASSERT_EQ(rc, 0) << o;
        expect_close(jsonl_field(m, "loss"), want, 1e-5);
        expect_close(jsonl_field(m, "lr"), lrs, 1e-12);
        // the saved step-5 state is PyTorch's step-5 state (float32 vs float64 run: 1e-4)
        Ckpt got(out), st(tiny("model_step5.safetensors"));
        for (size_t i = 0; i < ckpt_count(st.r); i++) {
            const ckpt_entry *e = ckpt_entry_at(st.r, i);
            auto a = tensor_bytes(got.r, e->name, FSDP_DT_F32), b = tensor_bytes(st.r, e->name, FSDP_DT_F32);
            ASSERT_EQ(a.size(), b.size());
            const float *fa = (const float *)a.data(), *fb = (const float *)b.data();
            float mx = 0, d = 0;
            for (size_t k = 0; k < a.size() / 4; k++) {
                mx = std::max(mx, std::fabs(fb[k]));
                d = std::max(d, std::fabs(fa[k] - fb[k]));
            }
            EXPECT_LE(d, 1e-4 * mx) << e->name;
        }
        int64_t step = 0;
        ASSERT_EQ(ckpt_value_int(got.r, (size_t)ckpt_find(got.r, "train_state.step"), &step), 0);
        EXPECT_EQ(step, 5);
    }
}

TEST(E2EWorkflow, PyTorchCheckpointsLoadOnOneToFourRanks) {
    Dir t;
    for (const char *src : {"dcp_full_ws3", "dcp_model_ws2"}) {
        for (int np = 1; np <= 4; np++) {
            std::string out = t / (std::string(src) + std::to_string(np));
            std::string r = t / "l.yaml";
            write_file(r, "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + tiny(src) +
                              "}}\n  - {id: s, uses: save-dcp, with: {path: " + out + "}}\n");
            int rc;
            std::string o = run_np(np, r, &rc);
            ASSERT_EQ(rc, 0) << src << " on " << np << ": " << o;
            Ckpt got(out), st(tiny("model_step5.safetensors"));
            expect_same_tensors(got.r, st.r);
            if (!strcmp(src, "dcp_full_ws3")) {
                Ckpt adam(tiny("adam_step5.safetensors"));
                expect_same_tensors(got.r, adam.r, "optimizer.state.", ".exp_avg", ".exp_avg");
                expect_same_tensors(got.r, adam.r, "optimizer.state.", ".exp_avg_sq", ".exp_avg_sq");
            }
            EXPECT_EQ(ckpt_entry_at(got.r, (size_t)ckpt_find(got.r, "output.weight"))->chunks, np);
        }
    }
}

TEST(E2EWorkflow, StrictLoadAndNaNFailClearly) {
    Dir t;
    // a checkpoint missing one parameter: load the fixture, save, delete a key by loading
    // through a rename that drops it
    std::string r = t / "s.yaml";
    write_file(r, "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + tiny("dcp_seed_ws1") +
                      ", rename: {norm.weight: null}}}\n");
    int rc;
    std::string o = run_np(1, r, &rc);
    EXPECT_EQ(rc, 1) << o;
    EXPECT_NE(o.find("norm.weight not restored"), std::string::npos) << o;
    EXPECT_EQ(o.find("layers.0.attention_norm.weight not restored"), std::string::npos) << o;
    // wrong shapes: a config that does not fit the checkpoint
    write_file(r, "model: {preset: tiny, dim: 32, n_heads: 2, n_kv_heads: 1}\nstages:\n  - {id: l, uses: load-ckpt, "
                  "with: {path: " + tiny("dcp_seed_ws1") + "}}\n");
    o = run_np(1, r, &rc);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(o.find("tok_embeddings.weight has shape [256, 64] in the checkpoint, the model needs [256, 32]"),
              std::string::npos) << o;
    // NaN in training: stops with a clear error and writes no checkpoint
    write_file(r, std::string(TINY) + "stages:\n  - {id: i, uses: init-meta}\n"
                                      "  - {id: x, uses: transform, with: {ops: [{fill: {keys: norm.weight, value: .nan}}]}}\n"
                                      "  - {id: t, uses: train-steps, with: {steps: 3, save_every: 1, save_path: " +
                      (t / "ck") + "}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "never") + "}}\n");
    o = run_np(2, r, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(o.find("non-finite loss"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "never"));
    EXPECT_FALSE(exists(t / "ck/step-1/.metadata"));
}

TEST(E2EWorkflow, AsyncSaveWritesTheSameCheckpoint) {
    Dir t;
    std::string r = t / "a.yaml";
    write_file(r, std::string(TINY) + "stages:\n  - {id: i, uses: init-meta}\n"
                                      "  - {id: t, uses: train-steps, with: {steps: 2}}\n"
                                      "  - {id: a, uses: save-dcp, with: {path: " + (t / "async") + ", async: true}}\n"
                                      "  - {id: s, uses: save-dcp, with: {path: " + (t / "sync") + "}}\n"
                                      "  - {id: t2, uses: train-steps, with: {steps: 4}}\n");
    int rc;
    std::string o = run_np(2, r, &rc);
    ASSERT_EQ(rc, 0) << o;
    expect_same_ckpt(t / "async", t / "sync");
    for (const char *f : {"__0_0.distcp", "__1_0.distcp"})
        EXPECT_EQ(dcp_data_blanked(t / "async" + "/" + f), dcp_data_blanked(t / "sync" + "/" + f)) << f;
    // refusing to overwrite: found before anything runs (exit 2, as every validation error)
    write_file(r, std::string(TINY) + "stages:\n  - {id: i, uses: init-meta}\n  - {id: s, uses: save-dcp, with: {path: " +
                      (t / "sync") + "}}\n");
    o = run_np(1, r, &rc);
    EXPECT_EQ(rc, 2);
    EXPECT_NE(o.find("already holds a checkpoint"), std::string::npos) << o;
}

TEST(E2EWorkflow, ExportReshardConvertRecipesAndVerify) {
    Dir t;
    int rc;
    std::string o = run_np(2, "recipes/llama_bootstrap.yaml --set vars.out=" + (t / "b"), &rc);
    ASSERT_EQ(rc, 0) << o;
    o = run_np(3, "recipes/export_safetensors.yaml --set vars.ckpt=" + (t / "b") + " --set vars.out=" + (t / "hf") +
                      " --set vars.shard_mb=8",
               &rc);
    ASSERT_EQ(rc, 0) << o;
    ASSERT_TRUE(exists(t / "hf/model.safetensors.index.json")) << o;
    o = run_np(2, "recipes/convert_hf_to_dcp.yaml --set vars.hf=" + (t / "hf") + " --set vars.out=" + (t / "back"), &rc);
    ASSERT_EQ(rc, 0) << o;
    expect_same_ckpt(t / "back", t / "b");
    o = run_np(4, "recipes/reshard.yaml --set vars.src=" + (t / "b") + " --set vars.dst=" + (t / "r4"), &rc);
    ASSERT_EQ(rc, 0) << o;
    expect_same_ckpt(t / "r4", t / "b");
    Ckpt r4(t / "r4");
    EXPECT_EQ(ckpt_entry_at(r4.r, (size_t)ckpt_find(r4.r, "output.weight"))->chunks, 4);
    // verify fails on a mismatch and on NaN
    write_file(t / "v.yaml", "include: [" + std::string(getenv("PWD") ? getenv("PWD") : ".") +
                                 "/recipes/common/llama3_debug.yaml]\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 (t / "b") + "}}\n  - {id: x, uses: transform, with: {ops: [{scale: {keys: norm.weight, by: 2}}]}}\n"
                                 "  - {id: v, uses: verify, with: {against: " + (t / "b") + "}}\n");
    o = run_np(2, t / "v.yaml", &rc);
    EXPECT_EQ(rc != 0, true);
    EXPECT_NE(o.find("norm.weight differs"), std::string::npos) << o;
    EXPECT_NE(o.find("1 parameters differ"), std::string::npos) << o;
}

TEST(E2EWorkflow, SavedOnAnyWorldSizeLoadsOnEveryOther) {
    Dir t;
    int rc;
    // the step-5 state (weights, AdamW moments, step) saved from 1..4 ranks
    for (int np = 1; np <= 4; np++) {
        write_file(t / "s.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                     tiny("dcp_full_ws3") + "}}\n  - {id: s, uses: save-dcp, with: {path: " +
                                     (t / ("w" + std::to_string(np))) + "}}\n");
        std::string o = run_np(np, t / "s.yaml", &rc);
        ASSERT_EQ(rc, 0) << o;
    }
    // every one loads on every world size and re-saves the same content, bit for bit
    for (int src = 1; src <= 4; src++) {
        for (int np = 1; np <= 4; np++) {
            if (np == src) continue;
            std::string out = t / ("r" + std::to_string(src) + "_" + std::to_string(np));
            write_file(t / "l.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                         (t / ("w" + std::to_string(src))) + "}}\n  - {id: s, uses: save-dcp, with: {path: " +
                                         out + "}}\n");
            std::string o = run_np(np, t / "l.yaml", &rc);
            ASSERT_EQ(rc, 0) << o;
            expect_same_ckpt(out, t / "w1");
            Ckpt c(out);
            int64_t step = 0;
            ASSERT_EQ(ckpt_value_int(c.r, (size_t)ckpt_find(c.r, "train_state.step"), &step), 0);
            EXPECT_EQ(step, 5);
        }
    }
}

TEST(E2EWorkflow, QuickstartRunsShowsProgressAndLearns) {
    Dir t;
    std::string out;
    int rc = run_cmd("timeout -k 10 600 " + fsdp_run_bin() + " recipes/quickstart.yaml --set vars.dir=" + (t / "q"), &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("train: "), std::string::npos) << "progress lines: " << out;
    EXPECT_NE(out.find("ETA"), std::string::npos) << out;
    auto loss = jsonl_field(t / "q/metrics.jsonl", "loss");
    ASSERT_EQ(loss.size(), 15u);  // 10 logged steps to 200, 5 more to 250
    EXPECT_GT(loss.front(), 2.5);
    EXPECT_LT(loss[9], 1.6);      // step 200
    EXPECT_LT(loss.back(), loss[9] + 0.1);
    for (const char *c : {"q/step-0", "q/step-200", "q/step-250"}) EXPECT_TRUE(exists(t / c + "/.metadata")) << c;
}
