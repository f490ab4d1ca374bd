// The plugin API (include/fsdp/params.h, collectives.h, callbacks.h, ckpt.h; stage ABI 1.1): the
// three example plugins (examples/plugins/: resize-embeddings, average-checkpoints, early-stop) on 1
// and 3 ranks, every call used rightly (tests/plugins/api_misuse.c's api-probe, also on the emulated
// GPU) and wrongly (api-misuse: an error naming the stage and the call for each, and a clean exit),
// and the ABI's minor version: a 1.0 plugin loads, a newer minor is refused.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "st_test_reader.h"
#include "test_util.h"
#include "train_run_util.h"

using namespace fsdp_test;
using train_test::Dir;

namespace {

std::string example(const std::string &name) { return plugin_dir() + "/lib" + name + ".so"; }
std::string test_plugin(const std::string &name) {
    return std::string(FSDP_BUILD_DIR) + "/tests/plugins/lib" + name + ".so";
}

int run_np(int np, const std::string &args, std::string *out) {
    return train_test::run(args, out, np > 1 ? mpirun_prefix(np) : "");
}

std::map<std::string, st_test::Tensor> load(const std::string &path) {
    std::map<std::string, st_test::Tensor> t;
    std::string why;
    EXPECT_TRUE(st_test::load(path, &t, &why)) << why;
    return t;
}

// The tiny model (untied output head) initialised with `seed`, saved as DCP on np ranks.
void make_ckpt(const Dir &t, int np, int seed, const std::string &path) {
    std::string r = t / ("mk" + std::to_string(seed) + ".yaml"), out;
    write_file(r, "runtime: {seed: " + std::to_string(seed) + "}\nmodel: {preset: tiny}\nstages:\n"
                  "  - {id: i, uses: init-meta}\n  - {id: s, uses: save-dcp, with: {path: " + path + "}}\n");
    ASSERT_EQ(run_np(np, r, &out), 0) << out;
}

// A checkpoint's model tensors exported as one safetensors file (on one rank).
std::string export_st(const Dir &t, const std::string &ckpt, const std::string &name) {
    std::string r = t / (name + ".yaml"), st = t / (name + ".safetensors"), out;
    write_file(r, "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + ckpt + "}}\n"
                  "  - {id: s, uses: save-safetensors, with: {path: " + st + "}}\n");
    EXPECT_EQ(run_np(1, r, &out), 0) << out;
    return st;
}

}  // namespace

// average-checkpoints: two checkpoints written on 1 and on 3 ranks, averaged on 1 and on 3 ranks, equal
// the element-wise mean (taken in double, rounded once) exactly.
TEST(PluginApi, AverageOfTwoCheckpointsIsTheElementwiseMean) {
    Dir t;
    std::string a = t / "a", b = t / "b", out;
    make_ckpt(t, 1, 1, a);
    make_ckpt(t, 3, 2, b);
    auto ta = load(export_st(t, a, "ea")), tb = load(export_st(t, b, "eb"));
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string r = t / "avg.yaml", st = t / ("avg" + std::to_string(np) + ".safetensors");
        write_file(r, "plugins: [" + example("average_checkpoints") + "]\nmodel: {preset: tiny}\nstages:\n"
                      "  - {id: i, uses: init-meta}\n"
                      "  - {id: soup, uses: average-checkpoints, after: [i], with: {paths: [" + a + ", " + b + "]}}\n"
                      "  - {id: s, uses: save-safetensors, after: [soup], with: {path: " + st + "}}\n");
        ASSERT_EQ(run_np(np, r, &out), 0) << out;
        auto got = load(st);
        ASSERT_EQ(got.size(), ta.size());
        size_t checked = 0;
        for (auto &kv : got) {
            const auto &x = ta.at(kv.first).f32, &y = tb.at(kv.first).f32;
            ASSERT_EQ(kv.second.f32.size(), x.size()) << kv.first;
            for (size_t e = 0; e < x.size(); e++, checked++)
                ASSERT_EQ(kv.second.f32[e], (float)(((double)x[e] + (double)y[e]) / 2.0)) << kv.first << " [" << e << "]";
        }
        EXPECT_GT(checked, 100000u);
    }
    // a checkpoint without one of the model's tensors: an error naming the tensor and the checkpoint
    std::string r = t / "bad.yaml";
    write_file(r, "plugins: [" + example("average_checkpoints") + "]\nmodel: {preset: tiny}\nstages:\n"
                  "  - {id: i, uses: init-meta}\n"
                  "  - {id: soup, uses: average-checkpoints, after: [i], with: {paths: [" + a + "], prefix: \"model.\"}}\n");
    EXPECT_EQ(run_np(1, r, &out), 1) << out;
    EXPECT_NE(out.find("fsdp_ckpt_shape: " + a + " has no tensor model.tok_embeddings.weight"), std::string::npos) << out;
}

// resize-embeddings: tok_embeddings and the untied output head grow from 256 to 300 rows on 1 and 3
// ranks (the same result); kept rows keep their values, new rows are the old rows' mean, the moments of
// a trained model follow (new rows zero); the DCP reloads strictly into a 300-row model that trains,
// and the Hugging Face export's config.json says 300.
TEST(PluginApi, ResizedEmbeddingsSaveReloadAndTrain) {
    Dir t;
    std::string base = t / "base", out;
    write_file(t / "b.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                             "  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 2}}\n"
                             "  - {id: s, uses: save-dcp, with: {path: " + base + "}}\n");
    ASSERT_EQ(run_np(1, t / "b.yaml", &out), 0) << out;
    auto before = load(export_st(t, base, "before"));
    std::vector<std::map<std::string, st_test::Tensor>> got;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string o = t / ("r" + std::to_string(np));
        write_file(t / "r.yaml", "plugins: [" + example("resize_embeddings") + "]\nvars: {o: x}\nmodel: {preset: tiny}\n"
                                 "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + base + "}}\n"
                                 "  - {id: grow, uses: resize-embeddings, after: [l], with: {vocab_size: 300}}\n"
                                 "  - {id: s, uses: save-dcp, after: [grow], with: {path: \"${o}/dcp\"}}\n"
                                 "  - {id: hf, uses: save-safetensors, after: [grow], with: {path: \"${o}/hf\", names: hf}}\n"
                                 "  - {id: st, uses: save-safetensors, after: [grow], with: {path: \"${o}/m.safetensors\"}}\n");
        ASSERT_EQ(run_np(np, t / "r.yaml --set vars.o=" + o, &out), 0) << out;
        EXPECT_NE(out.find("resize-embeddings: tok_embeddings.weight: 256 -> 300 rows"), std::string::npos) << out;
        got.push_back(load(o + "/m.safetensors"));
        EXPECT_NE(read_file(o + "/hf/config.json").find("\"vocab_size\": 300"), std::string::npos);
        // the moments: kept rows as saved, new rows zero
        std::string mom = t / ("mom" + std::to_string(np) + ".safetensors");
        ASSERT_EQ(train_test::run("ckpt convert " + o + "/dcp " + mom + " --to safetensors", &out), 0) << out;
        auto m = load(mom);
        const auto &ea = m.at("optimizer.state.output.weight.exp_avg");
        ASSERT_EQ(ea.shape[0], 300);
        size_t cols = (size_t)ea.shape[1];
        for (size_t e = 256 * cols; e < ea.f32.size(); e++) ASSERT_EQ(ea.f32[e], 0.0f) << e;
        // reloads strictly into a 300-row model, which trains
        write_file(t / "c.yaml", "model: {preset: tiny, vocab_size: 300}\ndata: {kind: synthetic, batch_size: 6, "
                                 "seq_len: 16}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + o +
                                     "/dcp, strict: true}}\n  - {id: t, uses: train-steps, with: {steps: 3}}\n");
        ASSERT_EQ(run_np(np, t / "c.yaml", &out), 0) << out;
    }
    for (const char *name : {"tok_embeddings.weight", "output.weight"}) {
        const auto &old = before.at(name), &g = got[0].at(name);
        ASSERT_EQ(g.shape[0], 300);
        size_t cols = (size_t)old.shape[1];
        for (size_t e = 0; e < old.f32.size(); e++) ASSERT_EQ(g.f32[e], old.f32[e]) << name;
        for (size_t c = 0; c < cols; c++) {
            double sum = 0;
            for (size_t r = 0; r < 256; r++) sum += old.f32[r * cols + c];
            for (size_t r = 256; r < 300; r++) ASSERT_EQ(g.f32[r * cols + c], (float)(sum / 256)) << name << " " << r;
        }
        EXPECT_EQ(g.f32, got[1].at(name).f32) << name << ": 3 ranks differ from 1";
    }
}

// early-stop: with min_delta larger than any improvement, the second evaluation is the patience's end:
// train-steps stops at step 4 (eval_every 2) on every rank, ends successfully, and the next save-dcp
// commits the checkpoint of step 4.
TEST(PluginApi, EarlyStopEndsEveryRankAtTheSameStep) {
    Dir t;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string ck = t / ("final" + std::to_string(np)), rep = t / ("rep" + std::to_string(np) + ".json"), out;
        write_file(t / "e.yaml", "plugins: [" + example("early_stop") + "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: text, path: data/quickstart.txt, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: stop, uses: early-stop, with: {patience: 1, min_delta: 100}}\n"
                                 "  - {id: t, uses: train-steps, after: [i, stop], with: {steps: 50, eval_every: 2, "
                                 "eval_data: {order: sequential}}}\n"
                                 "  - {id: s, uses: save-dcp, after: [t], with: {path: " + ck + "}}\n");
        ASSERT_EQ(run_np(np, t / "e.yaml --report " + rep, &out), 0) << out;
        EXPECT_NE(out.find("step 4: a callback asked to stop"), std::string::npos) << out;
        EXPECT_EQ(train_test::report_metric(rep, "train-steps", "stopped_at_step"), 4);
        if (np > 1) {  // every rank stopped there (the report's per-rank min and max)
            json_error_t je;
            json_t *j = json_load_file(rep.c_str(), 0, &je);
            ASSERT_TRUE(j) << je.text;
            json_t *stages = json_object_get(j, "stages");
            json_t *ranks = json_object_get(json_object_get(json_array_get(stages, 2), "ranks"), "stopped_at_step");
            EXPECT_EQ(json_number_value(json_object_get(ranks, "min")), 4);
            EXPECT_EQ(json_number_value(json_object_get(ranks, "max")), 4);
            json_decref(j);
        }
        ASSERT_EQ(train_test::run("ckpt inspect " + ck, &out), 0) << out;
        EXPECT_NE(out.find("train_state.step"), std::string::npos) << out;
        EXPECT_NE(out.find("= 4"), std::string::npos) << out;
    }
}

// Adding and removing parameters: extra.weight (drawn by normal(std=0.02) from the run's seed, the same
// on 1 and 3 ranks) and extra.ones (bf16 ones) are saved with the model and reload; a removed parameter
// is gone from the checkpoint. A learning rate set through the API scales the schedule from the next
// step; a callback's save request writes train-steps' checkpoint at that step.
TEST(PluginApi, AddRemoveLearningRateAndSaveRequests) {
    Dir t;
    std::vector<std::map<std::string, st_test::Tensor>> got;
    const std::string head = "plugins: [" + test_plugin("api_misuse") + "]\nmodel: {preset: tiny}\n"
                             "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                             "  - {id: i, uses: init-meta}\n";
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string ck = t / ("edit" + std::to_string(np)), st = ck + ".safetensors", out;
        write_file(t / "e.yaml", head + "  - {id: e, uses: api-edit, after: [i], with: {remove: layers.1.ffn_norm.weight}}\n"
                                        "  - {id: s, uses: save-dcp, after: [e], with: {path: " + ck + "}}\n");
        ASSERT_EQ(run_np(np, t / "e.yaml", &out), 0) << out;
        ASSERT_EQ(train_test::run("ckpt convert " + ck + " " + st + " --to safetensors", &out), 0) << out;
        got.push_back(load(st));
        const auto &m = got.back();
        ASSERT_TRUE(m.count("extra.weight"));
        EXPECT_EQ(m.at("extra.weight").shape, (std::vector<int64_t>{5, 3}));
        EXPECT_EQ(m.at("extra.ones").dtype, "BF16");
        for (float v : m.at("extra.ones").f32) EXPECT_EQ(v, 1.0f);
        double sq = 0;
        for (float v : m.at("extra.weight").f32) sq += (double)v * v;
        EXPECT_GT(sq, 0);
        EXPECT_LT(std::sqrt(sq / 15), 0.06);  // std 0.02
        EXPECT_FALSE(m.count("layers.1.ffn_norm.weight"));
        EXPECT_TRUE(m.count("layers.0.ffn_norm.weight"));
    }
    EXPECT_EQ(got[0].at("extra.weight").f32, got[1].at("extra.weight").f32) << "1 and 3 ranks drew different values";
    // the learning rate: half the schedule's from the next step on
    std::string out;
    for (const char *scale : {"1", "0.5"}) {
        write_file(t / "lr.yaml", head + "  - {id: t, uses: train-steps, after: [i], with: {steps: 2, lr: 1e-3}}\n"
                                         "  - {id: e, uses: api-edit, after: [t], with: {lr_scale: " + scale + "}}\n"
                                         "  - {id: t2, uses: train-steps, after: [e], with: {steps: 4, lr: 1e-3, metrics: " +
                                      (t / ("lr" + std::string(scale) + ".jsonl")) + "}}\n");
        ASSERT_EQ(run_np(1, t / "lr.yaml", &out), 0) << out;
    }
    std::vector<double> full = train_test::column(t / "lr1.jsonl", "lr"), half = train_test::column(t / "lr0.5.jsonl", "lr");
    ASSERT_EQ(full.size(), 2u);
    ASSERT_EQ(half.size(), 2u);
    for (size_t k = 0; k < 2; k++) EXPECT_NEAR(half[k], 0.5 * full[k], 1e-15) << "step " << k + 3;
    // a callback asks for a save after step 3 (train-steps saves every 100 steps otherwise)
    std::string sp = t / "periodic";
    write_file(t / "sv.yaml", head + "  - {id: cb, uses: api-save-at, with: {step: 3}}\n"
                                     "  - {id: t, uses: train-steps, after: [i, cb], with: {steps: 5, save_every: 100, "
                                     "save_path: " + sp + "}}\n");
    ASSERT_EQ(run_np(3, t / "sv.yaml", &out), 0) << out;
    EXPECT_NE(out.find("step 3: a callback asked for a save"), std::string::npos) << out;
    ASSERT_EQ(train_test::run("ckpt inspect " + sp + "/step-3", &out), 0) << out;
    // without a save_path the request is a warning naming the callback; a stop in the same request is honoured and
    // the later stages run (on every rank)
    std::string fin = t / "final";
    write_file(t / "sv2.yaml", head + "  - {id: cb, uses: api-save-at, with: {step: 2, stop: true}}\n"
                                      "  - {id: t, uses: train-steps, after: [i, cb], with: {steps: 5}}\n"
                                      "  - {id: s, uses: save-dcp, after: [t], with: {path: " + fin + "}}\n");
    for (int np : {1, 3}) {
        rm_rf(fin);
        ASSERT_EQ(run_np(np, t / "sv2.yaml", &out), 0) << out;
        EXPECT_NE(out.find("step 2: callback 'save-at' asked for a save, and this train-steps has no save_path: nothing "
                           "saved"), std::string::npos) << out;
        EXPECT_NE(out.find("a callback asked to stop"), std::string::npos) << out;
        ASSERT_EQ(train_test::run("ckpt inspect " + fin + " --json", &out), 0) << out;
        EXPECT_NE(out.find("\"train_state.step\""), std::string::npos);
    }
}

// A checkpoint holding tensors the plain model does not declare (a plugin's extra.weight and extra.ones, trained, so
// with moments) is refused by a strict load naming them as undeclared and `exclude`; excluded (or dropped), they and
// their moments are left out and the rest loads, on 1 and 3 ranks.
TEST(PluginApi, UndeclaredTensorsAndTheirMomentsAreNamedAndExcludable) {
    Dir t;
    std::string ck = t / "extra", out;
    write_file(t / "w.yaml", "plugins: [" + test_plugin("api_misuse") + "]\nmodel: {preset: tiny}\n"
                             "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: e, uses: api-edit, after: [i]}\n  - {id: t, uses: train-steps, after: [e], with: "
                             "{steps: 1}}\n  - {id: s, uses: save-dcp, after: [t], with: {path: " + ck + "}}\n");
    ASSERT_EQ(run_np(1, t / "w.yaml", &out), 0) << out;
    auto load_with = [&](const std::string &extra) {
        write_file(t / "l.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + ck +
                                     extra + "}}\n");
        return t / "l.yaml";
    };
    for (int np : {1, 3}) {
        int rc;
        std::string log = run_np(np, load_with(""), &rc);
        EXPECT_EQ(rc, 1) << log; // found while load-ckpt runs
        EXPECT_NE(log.find("optimizer moment(s) of tensors the model does not declare"), std::string::npos) << log;
        EXPECT_NE(log.find("optimizer.state.extra.weight.exp_avg"), std::string::npos) << log;
        EXPECT_NE(log.find("exclude:"), std::string::npos) << log;
        EXPECT_EQ(log.find("key layout that does not map"), std::string::npos) << log;
        log = run_np(np, load_with(", exclude: ['extra.**', 'optimizer.state.extra.**']"), &rc);
        EXPECT_EQ(rc, 0) << log;
        log = run_np(np, load_with(", drop: ['extra.**']"), &rc);
        EXPECT_EQ(rc, 0) << log;
    }
}

// Every call used rightly: the probe checks reads against gathers, scatters, moments, globs and the
// collectives, on 1 and 3 ranks (on a model before and after training).
TEST(PluginApi, EveryCallWorksOnOneAndThreeRanks) {
    Dir t;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string rep = t / "p.json", out;
        write_file(t / "p.yaml", "plugins: [" + test_plugin("api_misuse") + "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n  - {id: p, uses: api-probe, after: [i]}\n"
                                 "  - {id: t, uses: train-steps, after: [p], with: {steps: 1}}\n"
                                 "  - {id: q, uses: api-probe, after: [t]}\n");
        ASSERT_EQ(run_np(np, t / "p.yaml --report " + rep, &out), 0) << out;
        EXPECT_GT(train_test::report_metric(rep, "api-probe", "checks"), 1000);
    }
}

// Every call used wrongly: an error for each, naming the stage (and the plugin's stage kind) and the
// call; nothing crashes, the run goes on (the stage recorded them) or, when the plugin returns the
// error, ends cleanly with exit 1 and the message.
TEST(PluginApi, MisuseOfEveryCallIsAnErrorNamingTheCall) {
    Dir t;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string f = t / ("errors" + std::to_string(np) + ".txt"), out;
        write_file(t / "m.yaml", "plugins: [" + test_plugin("api_misuse") + "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: bad, uses: api-misuse, after: [i], with: {file: " + f + "}}\n"
                                 "  - {id: t, uses: train-steps, after: [bad], with: {steps: 1}}\n");
        ASSERT_EQ(run_np(np, t / "m.yaml", &out), 0) << out;
        std::string lines = read_file(f);
        EXPECT_EQ(lines.find("UNEXPECTED SUCCESS"), std::string::npos) << lines;
        size_t n = 0;
        for (char c : lines) n += c == '\n';
        EXPECT_EQ(n, 33u) << lines;
        for (const char *want :
             {"fsdp_param_read (rows): stage 'bad' (api-misuse): fsdp_param_read: tok_embeddings.weight: rows [",
              "fsdp_param_gather (root): stage 'bad' (api-misuse): fsdp_param_gather: root 99 outside [0, ",
              "fsdp_param_add (rule): stage 'bad' (api-misuse): fsdp_param_add: new.weight: init rule: ",
              "fsdp_param_remove: stage 'bad' (api-misuse): fsdp_param_remove: parameter index 22, but the model has 21",
              "fsdp_optim_read (no moments): stage 'bad' (api-misuse): fsdp_optim_read: tok_embeddings.weight has no "
              "optimizer moments",
              "fsdp_allreduce (dtype): stage 'bad' (api-misuse): fsdp_allreduce: dtype bf16",
              "fsdp_ckpt_open (missing): stage 'bad' (api-misuse): fsdp_ckpt_open: ",
              "fsdp_param_resize (in a callback): stage 't' (train-steps): fsdp_param_resize: not allowed in a "
              "train-steps callback"})
            EXPECT_NE(lines.find(want), std::string::npos) << want << "\n" << lines;
        // the plugin returns the error: the run ends cleanly with it
        int rc = run_np(np, t / "m.yaml --set stages.bad.with.fail=true", &out);
        EXPECT_GE(rc, 1) << out;
        EXPECT_LT(rc, 128) << "crashed: " << out;
        EXPECT_NE(out.find("stage bad (api-misuse) failed: stage 'bad' (api-misuse): fsdp_ckpt_open: "), std::string::npos)
            << out;
    }
}

// The ABI's minor version: plugins built against stage ABI 1.0 and 1.1 load and run; one built for a newer
// minor is refused, naming both versions; --version prints the ABI.
TEST(PluginApi, OlderMinorLoadsNewerMinorIsRefused) {
    Dir t;
    std::string out;
    write_file(t / "old.yaml", "plugins: [" + test_plugin("abi_minor0") + "]\nstages:\n  - {id: a, uses: abi-one-zero}\n");
    ASSERT_EQ(run_np(1, t / "old.yaml", &out), 0) << out;
    EXPECT_NE(out.find("abi-1.0 stage ran"), std::string::npos) << out;
    // a 1.1 plugin (before 1.2's hooks and trainable flags) on 1 and 3 ranks
    write_file(t / "one.yaml", "plugins: [" + test_plugin("abi_minor1") + "]\nmodel: {preset: tiny}\nstages:\n"
                               "  - {id: i, uses: init-meta}\n  - {id: a, uses: abi-one-one, after: [i]}\n");
    for (int np : {1, 3}) {
        ASSERT_EQ(run_np(np, t / "one.yaml", &out), 0) << out;
        EXPECT_NE(out.find("abi-1.1 stage ran: " + std::to_string(21 * np) + " parameters over the ranks"),
                  std::string::npos) << out;
    }
    write_file(t / "new.yaml", "plugins: [" + test_plugin("abi_future") + "]\nstages:\n  - {id: a, uses: abi-future}\n");
    EXPECT_EQ(run_np(1, "validate " + t / "new.yaml", &out), 2) << out;
    EXPECT_NE(out.find("stage 'abi-future' was built for stage ABI 1.3, newer than this fsdp-run's 1.2"),
              std::string::npos)
        << out;
    EXPECT_EQ(run_np(1, "--version", &out), 0);
    EXPECT_NE(out.find("(stage ABI 1.2,"), std::string::npos) << out;
}

// The parameter and collective calls on the GPU (the emulated device in build-emu): the state's rows
// live on the device and the API moves them through its host copy; 2 ranks.
TEST(PluginApiGpu, EveryCallWorksOnTheGpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    const bool emu = getenv("FSDP_EMU_DEVICES") != nullptr;
    if (!emu && gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
    Dir t;
    std::string rep = t / "g.json", out;
    write_file(t / "g.yaml", "plugins: [" + test_plugin("api_misuse") + ", " + example("resize_embeddings") +
                             "]\nruntime: {device: cuda}\n"
                             "model: {preset: tiny, n_layers: 1}\ndata: {kind: synthetic, batch_size: 4, seq_len: 8}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: t, uses: train-steps, after: [i], with: {steps: 1}}\n"
                             "  - {id: q, uses: api-probe, after: [t]}\n"
                             "  - {id: t2, uses: train-steps, after: [q], with: {steps: 2}}\n"
                             "  - {id: grow, uses: resize-embeddings, after: [t2], with: {vocab_size: 300}}\n"
                             "  - {id: t3, uses: train-steps, after: [grow], with: {steps: 3}}\n");
    ASSERT_EQ(train_test::run(t / "g.yaml --report " + rep, &out, mpirun_prefix(2)), 0) << out;
    EXPECT_NE(out.find("resize-embeddings: output.weight: 256 -> 300 rows"), std::string::npos) << out;
    EXPECT_GT(train_test::report_metric(rep, "api-probe", "checks"), 1000);
    EXPECT_NE(out.find("GPU"), std::string::npos) << out;
}

// The README's minimal plugin (the first C block of "Writing a plugin stage") compiles against
// include/fsdp/ alone and does what it says: on 1 and 3 ranks, the output projections of every layer
// are the init's divided by sqrt(2 x layers), everything else unchanged.
TEST(PluginApi, ReadmeMinimalPluginBuildsAndScalesTheResiduals) {
    Dir t;
    std::string readme = read_file("README.md");
    size_t sec = readme.find("## Writing a plugin stage");
    ASSERT_NE(sec, std::string::npos);
    size_t a = readme.find("```c\n", sec), b = readme.find("```\n", a + 5);
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    write_file(t / "p.c", readme.substr(a + 5, b - a - 5));
    std::string out, so = t / "libscale.so";
    ASSERT_EQ(run_cmd("cc -std=c11 -Wall -Wextra -Werror -shared -fPIC -Iinclude " + t / "p.c" + " -o " + so + " -lm", &out),
              0)
        << out;
    std::string plain = t / "plain.safetensors";
    write_file(t / "a.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: s, uses: save-safetensors, with: {path: " + plain + "}}\n");
    ASSERT_EQ(run_np(1, t / "a.yaml", &out), 0) << out;
    auto want = load(plain);
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string st = t / ("scaled" + std::to_string(np) + ".safetensors");
        write_file(t / "b.yaml", "plugins: [" + so + "]\nmodel: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: x, uses: scale-residuals, after: [i]}\n"
                                 "  - {id: s, uses: save-safetensors, after: [x], with: {path: " + st + "}}\n");
        ASSERT_EQ(run_np(np, t / "b.yaml", &out), 0) << out;
        auto got = load(st);
        int scaled = 0;
        for (auto &kv : want) {
            bool wo = kv.first.find(".attention.wo.weight") != std::string::npos;
            scaled += wo;
            const auto &g = got.at(kv.first).f32;
            for (size_t e = 0; e < g.size(); e++) {
                float w = wo ? kv.second.f32[e] / sqrtf(2.0f * 2.0f) : kv.second.f32[e];  // tiny: 2 layers
                ASSERT_EQ(g[e], w) << kv.first << " [" << e << "]";
            }
        }
        EXPECT_EQ(scaled, 2);
    }
}
