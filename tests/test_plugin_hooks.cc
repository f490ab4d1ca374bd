// Plugins that real teams write (issue 39's Done-when), on 1 and 3 ranks: the EMA of examples/plugins/ema
// (buffers in every periodic checkpoint, equal bit for bit to the float32 EMA numpy computes from the
// saved weights, no effect on training, strictly reloadable into the plain model with exclude, resumed
// from a checkpoint), and the spike guard of examples/plugins/spike_guard (the pre-update hook of stage
// ABI 1.2: a skipped update leaves every weight and moment of that step bitwise unchanged).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "st_test_reader.h"
#include "test_util.h"
#include "train_run_util.h"

extern "C" {
#include "ckpt/reader.h"
}

using namespace fsdp_test;
using train_test::Dir;

namespace {

std::string example(const std::string &name) { return plugin_dir() + "/lib" + name + ".so"; }

int run_np(int np, const std::string &args, std::string *out) {
    return train_test::run(args, out, np > 1 ? mpirun_prefix(np) : "");
}

// Every float tensor of a checkpoint (DCP or safetensors) whose name passes keep, as float32.
std::map<std::string, std::vector<float>> read_all(const std::string &path, bool (*keep)(const std::string &)) {
    std::map<std::string, std::vector<float>> out;
    ckpt_reader *r = nullptr;
    fsdp_err err;
    EXPECT_EQ(ckpt_open(path.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    if (!r) return out;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        if (!e->is_tensor || !keep(e->name)) continue;
        int64_t rows = e->ndim ? e->shape[0] : 1, n = 1;
        for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
        std::vector<float> v((size_t)n);
        EXPECT_EQ(ckpt_read_rows(r, i, 0, rows, v.data(), FSDP_DT_F32, &err), 0) << e->name << ": " << err.msg;
        out[e->name] = v;
    }
    ckpt_close(r);
    return out;
}

bool model_or_ema(const std::string &k) { return k.rfind("optimizer.", 0) != 0 && k.find('.') != std::string::npos; }
bool any_tensor(const std::string &k) { return k.find('.') != std::string::npos; }

std::string ema_recipe(const std::string &o, const std::string &extra_stage = "") {
    return "plugins: [" + example("ema") + "]\nmodel: {preset: tiny}\n"
           "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
           "  - {id: i, uses: init-meta}\n"
           "  - {id: w0, uses: save-safetensors, after: [i], with: {path: " + o + "/w0.safetensors}}\n" + extra_stage +
           "  - {id: t, uses: train-steps, after: [ema], with: {steps: 3, save_every: 1, save_path: " + o +
           "/ck, metrics: " + o + "/m.jsonl}}\n";
}

}  // namespace

// ema = a * ema + b * w in float32 (a = (float)0.9, b = (float)(1 - 0.9): numpy's
// np.float32(0.9) * ema + np.float32(1 - 0.9) * w), checked at every periodic checkpoint.
TEST(PluginHooks, EmaEqualsNumpysEmaOfTheSavedWeightsBitForBit) {
    Dir t;
    std::vector<double> plain_gn;
    {
        std::string o = t / "plain", out;
        write_file(t / "p.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, after: [i], with: "
                                 "{steps: 3, metrics: " + o + "/m.jsonl}}\n");
        ASSERT_EQ(run_np(1, t / "p.yaml", &out), 0) << out;
        plain_gn = train_test::column(o + "/m.jsonl", "grad_norm");
    }
    const float a = (float)0.9, b = (float)(1.0 - 0.9);
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string o = t / ("o" + std::to_string(np)), out;
        write_file(t / "e.yaml", ema_recipe(o, "  - {id: ema, uses: ema, after: [w0], with: {decay: 0.9}}\n"));
        ASSERT_EQ(run_np(np, t / "e.yaml", &out), 0) << out;
        EXPECT_NE(out.find("ema: 21 averages (decay 0.9, every 1 steps)"), std::string::npos) << out;
        // the averages change nothing of the training: the gradient norms of a run without them
        std::vector<double> gn = train_test::column(o + "/m.jsonl", "grad_norm");
        ASSERT_EQ(gn.size(), plain_gn.size());
        for (size_t k = 0; k < gn.size(); k++) EXPECT_NEAR(gn[k], plain_gn[k], 1e-7 * plain_gn[k]) << "step " << k + 1;
        auto ema = read_all(o + "/w0.safetensors", any_tensor);
        ASSERT_EQ(ema.size(), 21u);
        for (int k = 1; k <= 3; k++) {
            auto ck = read_all(o + "/ck/step-" + std::to_string(k), any_tensor);
            size_t checked = 0;
            for (auto &kv : ema) {
                const std::vector<float> &w = ck.at(kv.first), &saved = ck.at("ema." + kv.first);
                for (size_t e = 0; e < w.size(); e++) kv.second[e] = a * kv.second[e] + b * w[e];
                ASSERT_EQ(memcmp(saved.data(), kv.second.data(), w.size() * sizeof(float)), 0)
                    << "step " << k << " ema." << kv.first;
                checked++;
                EXPECT_EQ(ck.count("optimizer.state.ema." + kv.first + ".exp_avg"), 0u) << "an EMA has no moments";
                EXPECT_EQ(ck.count("optimizer.state." + kv.first + ".exp_avg"), 1u);
            }
            EXPECT_EQ(checked, 21u);
        }
        // the plain model loads the checkpoint strictly with exclude; without it the error names exclude
        std::string last = o + "/ck/step-3";
        write_file(t / "l.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + last +
                                 ", exclude: [\"ema.**\"]}}\n");
        EXPECT_EQ(run_np(np, t / "l.yaml", &out), 0) << out;
        write_file(t / "s.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + last + "}}\n");
        EXPECT_EQ(run_np(np, t / "s.yaml", &out), 1) << out;
        EXPECT_NE(out.find("the model does not declare these 21 tensors: leave them out with exclude: [\"ema.**\"]"),
                  std::string::npos) << out;
        EXPECT_NE(out.find("... and 13 more unexpected keys"), std::string::npos) << out;
    }
}

// resume_from: a resumed run's averages start from the checkpoint's, not from the weights.
TEST(PluginHooks, EmaResumesFromACheckpointsAverages) {
    Dir t;
    std::string o = t / "a", out;
    write_file(t / "e.yaml", ema_recipe(o, "  - {id: ema, uses: ema, after: [w0], with: {decay: 0.9}}\n"));
    ASSERT_EQ(run_np(1, t / "e.yaml", &out), 0) << out;
    std::string ck = o + "/ck/step-3";
    for (int np : {1, 3}) {
        std::string r = t / ("r" + std::to_string(np)), st = r + "/x.safetensors";
        write_file(t / "r.yaml", "plugins: [" + example("ema") + "]\nmodel: {preset: tiny}\nstages:\n"
                                 "  - {id: l, uses: load-ckpt, with: {path: " + ck + ", exclude: [\"ema.**\"]}}\n"
                                 "  - {id: ema, uses: ema, after: [l], with: {decay: 0.9, resume_from: " + ck + "}}\n"
                                 "  - {id: s, uses: save-safetensors, after: [ema], with: {path: " + st + "}}\n");
        ASSERT_EQ(run_np(np, t / "r.yaml", &out), 0) << out;
        auto want = read_all(ck, model_or_ema), got = read_all(st, any_tensor);
        size_t n = 0;
        for (const auto &kv : got)
            if (kv.first.rfind("ema.", 0) == 0) {
                EXPECT_EQ(kv.second, want.at(kv.first)) << kv.first;
                n++;
            }
        EXPECT_EQ(n, 21u);
    }
}

namespace {

std::string test_plugin(const std::string &name) {
    return std::string(FSDP_BUILD_DIR) + "/tests/plugins/lib" + name + ".so";
}

// The metrics lines of steps (those with "loss"), in order.
std::vector<json_t *> step_lines(const std::string &path) { return train_test::lines_with(path, "loss"); }

bool same_floats(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(float));
}

}  // namespace

namespace {

// A skipped update leaves the weights, the AdamW moments and AdamW's step of that step bitwise as they
// were; an updated step changes them; the metrics lines say which (the guard's own metrics in them).
void expect_skips_leave_steps_unchanged(const std::vector<int> &worlds, bool gpu) {
    Dir t;
    for (int np : worlds) {
        SCOPED_TRACE(np);
        std::string o = t / ("o" + std::to_string(np)), out;
        write_file(t / "g.yaml", std::string(gpu ? "runtime: {device: cuda}\n" : "") + "plugins: [" + example("spike_guard") +
                                 "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: g, uses: spike-guard, after: [i], with: {factor: 1.0, window: 1, min_steps: 1}}\n"
                                 "  - {id: t, uses: train-steps, after: [g], with: {steps: 10, save_every: 1, save_path: " +
                                 o + "/ck, metrics: " + o + "/m.jsonl}}\n");
        ASSERT_EQ(run_np(np, t / "g.yaml", &out), 0) << out;
        EXPECT_NE(out.find("spike-guard: watching train-steps to step 10 (save_path " + o + "/ck)"), std::string::npos)
            << out;
        EXPECT_NE(out.find("spike-guard: " + o + "/ck/step-4 saved at step 4"), std::string::npos) << out;
        std::vector<json_t *> lines = step_lines(o + "/m.jsonl");
        ASSERT_EQ(lines.size(), 10u);
        int skipped = 0, updated = 0;
        auto prev = read_all(o + "/ck/step-1", any_tensor);
        for (int k = 2; k <= 10; k++) {
            json_t *j = lines[(size_t)k - 1];
            bool skip = json_is_true(json_object_get(j, "skipped"));
            EXPECT_EQ(skip, json_number_value(json_object_get(j, "spike_guard.skipped")) == 1.0) << "step " << k;
            EXPECT_TRUE(json_object_get(j, "spike_guard.ratio")) << "step " << k;
            auto cur = read_all(o + "/ck/step-" + std::to_string(k), any_tensor);
            size_t same = 0, compared = 0;
            for (const auto &kv : cur) {
                if (kv.first.rfind("optimizer.state.", 0) != 0 && kv.first.find("train_state") == 0) continue;
                if (!prev.count(kv.first)) continue;
                compared++;
                same += same_floats(kv.second, prev.at(kv.first));
            }
            // skipped: every tensor (weights, exp_avg, exp_avg_sq, step) as it was; updated: every one changed
            // but for the rows no token reached (none in the tiny model's batch of random tokens: checked)
            if (skip) EXPECT_EQ(same, compared) << "step " << k << ": a skipped update changed something";
            else EXPECT_LT(same, compared / 10) << "step " << k << ": an update changed nothing";
            (skip ? skipped : updated)++;
            prev = cur;
        }
        for (json_t *j : lines) json_decref(j);
        EXPECT_GT(skipped, 0) << "no update was skipped: the test shows nothing";
        EXPECT_GT(updated, 0);
    }
}

}  // namespace

TEST(PluginHooks, SpikeGuardsSkippedUpdateLeavesTheStepBitwiseUnchanged) { expect_skips_leave_steps_unchanged({1, 3}, false); }

// The GPU path (the update skipped before it is queued; the emulated device in build-emu), one GPU.
TEST(PluginHooksGpu, SpikeGuardsSkippedUpdateOnTheGpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    expect_skips_leave_steps_unchanged({1}, true);
}

// max_skips: the hook's error ends every rank with its message, naming the hook and the step.
TEST(PluginHooks, APreUpdateHooksErrorEndsEveryRank) {
    Dir t;
    for (int np : {1, 3}) {
        std::string out;
        write_file(t / "g.yaml", "plugins: [" + example("spike_guard") + "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: g, uses: spike-guard, after: [i], with: {factor: 1e-9, window: 1, min_steps: 1, "
                                 "max_skips: 2}}\n"
                                 "  - {id: t, uses: train-steps, after: [g], with: {steps: 6}}\n");
        EXPECT_EQ(run_cmd("timeout -k 10 60 " + (np > 1 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() + " -q " +
                          t / "g.yaml", &out), 1) << out;
        EXPECT_NE(out.find("pre-update hook 'spike-guard' at step 3: spike-guard: 2 updates skipped in a row (max_skips) "
                           "at step 3"), std::string::npos) << out;
    }
}

// Every hook kind at its point with its step and path; the pre-update hook reads the gradients (their norm
// is the step's grad_norm), train-steps' settings and sets metrics of its step's line, as a callback does;
// lr_scale 0.5 gives the weights of a run at half the learning rate, bitwise (scaling by 2^-1 is exact).
TEST(PluginHooks, EveryHookAtItsPointGradientsSettingsMetricsAndLrScale) {
    Dir t;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string o = t / ("o" + std::to_string(np)), ev = o + "/events.txt", out;
        write_file(t / "h.yaml", "plugins: [" + test_plugin("hook_probe") + "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: p, uses: hook-probe, after: [i], with: {file: " + ev + ", lr_scale: 0.5}}\n"
                                 "  - {id: t, uses: train-steps, after: [p], with: {steps: 4, lr: 2e-3, save_every: 2, "
                                 "save_path: " + o + "/ck, metrics: " + o + "/m.jsonl}}\n"
                                 "  - {id: s, uses: save-dcp, after: [t], with: {path: " + o + "/final}}\n"
                                 "  - {id: l, uses: load-ckpt, after: [s], with: {path: " + o + "/final}}\n"
                                 "  - {id: e, uses: save-safetensors, after: [l], with: {path: " + o + "/w.safetensors}}\n");
        ASSERT_EQ(run_np(np, t / "h.yaml", &out), 0) << out;
        EXPECT_EQ(read_file(ev), "train_start 0 -\nafter_save 2 " + o + "/ck/step-2\nafter_save 4 " + o +
                                     "/ck/step-4\ntrain_end 4 -\nafter_save 4 " + o + "/final\nafter_load 4 " + o +
                                     "/final\n");
        std::vector<json_t *> lines = step_lines(o + "/m.jsonl");
        ASSERT_EQ(lines.size(), 4u);
        for (size_t k = 0; k < lines.size(); k++) {
            json_t *j = lines[k];
            double gn = json_number_value(json_object_get(j, "grad_norm"));
            EXPECT_NEAR(json_number_value(json_object_get(j, "probe.grad_norm")), gn, 1e-6 * gn) << "step " << k + 1;
            EXPECT_EQ(json_number_value(json_object_get(j, "probe.step")), (double)(k + 1));
            EXPECT_EQ(json_number_value(json_object_get(j, "probe.after")), (double)(k + 1));
            EXPECT_EQ(json_number_value(json_object_get(j, "probe.steps")), 4.0);
            EXPECT_EQ(json_number_value(json_object_get(j, "probe.save_every")), 2.0);
            json_decref(j);
        }
        // the same run at lr 1e-3 without the hook
        std::string h = t / ("half" + std::to_string(np));
        write_file(t / "half.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                    "  - {id: i, uses: init-meta}\n"
                                    "  - {id: t, uses: train-steps, after: [i], with: {steps: 4, lr: 1e-3}}\n"
                                    "  - {id: e, uses: save-safetensors, after: [t], with: {path: " + h + ".safetensors}}\n");
        ASSERT_EQ(run_np(np, t / "half.yaml", &out), 0) << out;
        auto a = read_all(o + "/w.safetensors", any_tensor), b = read_all(h + ".safetensors", any_tensor);
        ASSERT_EQ(a.size(), b.size());
        for (const auto &kv : a) EXPECT_TRUE(same_floats(kv.second, b.at(kv.first))) << kv.first;
    }
}

// The calls of 1.2 say when they are used in the wrong place.
TEST(PluginHooks, StepMetricAndGradientsOutsideTheirPlaceAreErrors) {
    Dir t;
    std::string f = t / "m.txt", out;
    write_file(t / "m.yaml", "plugins: [" + test_plugin("api_misuse") + "]\nmodel: {preset: tiny}\nstages:\n"
                             "  - {id: i, uses: init-meta}\n  - {id: bad, uses: api-misuse, after: [i], with: {file: " + f +
                             "}}\n");
    ASSERT_EQ(run_np(1, t / "m.yaml", &out), 0) << out;
    std::string lines = read_file(f);
    EXPECT_NE(lines.find("fsdp_step_metric: stage 'bad' (api-misuse): fsdp_step_metric: only inside a train-steps "
                         "callback or hook"), std::string::npos) << lines;
    EXPECT_NE(lines.find("fsdp_param_read_grad: stage 'bad' (api-misuse): fsdp_param_read_grad: the gradients are "
                         "readable only inside a pre-update hook"), std::string::npos) << lines;
    EXPECT_NE(lines.find("fsdp_hook_add (kind): stage 'bad' (api-misuse): fsdp_hook_add: unknown hook kind 9"),
              std::string::npos) << lines;
}

// The guard's window and counts travel in the checkpoints (fsdp_plugin_state_set: plugin_state.spike_guard.state)
// and come back after a load-ckpt: the run resumed at step 5 skips the same updates as the uninterrupted
// one and ends with its weights bitwise, on 1 and 3 ranks.
TEST(PluginHooks, PluginStateInTheCheckpointsMakesAResumeJudgeAsTheUninterruptedRun) {
    Dir t;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string a = t / ("a" + std::to_string(np)), b = t / ("b" + std::to_string(np)), out;
        std::string head = "plugins: [" + example("spike_guard") + "]\nmodel: {preset: tiny}\n"
                           "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                           "  - {id: g, uses: spike-guard, with: {factor: 1.0, window: 3, min_steps: 1}}\n";
        write_file(t / "a.yaml", head + "  - {id: i, uses: init-meta, after: [g]}\n"
                                 "  - {id: t, uses: train-steps, after: [i], with: {steps: 10, save_every: 5, save_path: " +
                                 a + "/ck, metrics: " + a + "/m.jsonl}}\n"
                                 "  - {id: e, uses: save-safetensors, after: [t], with: {path: " + a + "/w.safetensors}}\n");
        ASSERT_EQ(run_np(np, t / "a.yaml", &out), 0) << out;
        {
            ckpt_reader *r = nullptr;
            fsdp_err err;
            ASSERT_EQ(ckpt_open((a + "/ck/step-5").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
            EXPECT_GE(ckpt_find(r, "plugin_state.spike_guard.state"), 0);
            ckpt_close(r);
        }
        write_file(t / "b.yaml", head + "  - {id: l, uses: load-ckpt, after: [g], with: {path: " + a + "/ck/step-5}}\n"
                                 "  - {id: t, uses: train-steps, after: [l], with: {steps: 10, metrics: " + b + "/m.jsonl}}\n"
                                 "  - {id: e, uses: save-safetensors, after: [t], with: {path: " + b + "/w.safetensors}}\n");
        ASSERT_EQ(run_np(np, t / "b.yaml", &out), 0) << out;
        EXPECT_NE(out.find("spike-guard: resumed from the checkpoint ("), std::string::npos) << out;
        std::vector<json_t *> la = step_lines(a + "/m.jsonl"), lb = step_lines(b + "/m.jsonl");
        ASSERT_EQ(la.size(), 10u);
        ASSERT_EQ(lb.size(), 5u);
        int skips = 0;
        for (size_t k = 0; k < 5; k++) {
            bool sa = json_is_true(json_object_get(la[k + 5], "skipped")), sb = json_is_true(json_object_get(lb[k], "skipped"));
            EXPECT_EQ(sa, sb) << "step " << k + 6;
            EXPECT_EQ(json_number_value(json_object_get(la[k + 5], "spike_guard.ratio")),
                      json_number_value(json_object_get(lb[k], "spike_guard.ratio"))) << "step " << k + 6;
        }
        for (json_t *j : la) skips += json_is_true(json_object_get(j, "skipped")), json_decref(j);
        for (json_t *j : lb) json_decref(j);
        EXPECT_GT(skips, 0);
        auto wa = read_all(a + "/w.safetensors", any_tensor), wb = read_all(b + "/w.safetensors", any_tensor);
        ASSERT_EQ(wa.size(), wb.size());
        for (const auto &kv : wa) EXPECT_TRUE(same_floats(kv.second, wb.at(kv.first))) << kv.first;
    }
}

namespace {

std::string probe_recipe(const std::string &o, const std::string &probe_with, const std::string &train_with) {
    return "plugins: [" + test_plugin("hook_probe") + ", " + test_plugin("trainable_probe") + ", " +
           example("spike_guard") + "]\nmodel: {preset: tiny}\n"
           "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
           "  - {id: i, uses: init-meta}\n"
           "  - {id: b, uses: save-safetensors, after: [i], with: {path: " + o + "/before.safetensors}}\n" +
           probe_with + "  - {id: t, uses: train-steps, with: {" + train_with + "metrics: " + o + "/m.jsonl}}\n"
           "  - {id: a, uses: save-safetensors, after: [t], with: {path: " + o + "/after.safetensors}}\n";
}

}  // namespace

// A skip on one rank skips the update on every rank; scales that differ across ranks are an error naming
// both; on 3 ranks.
TEST(PluginHooks, OneRanksSkipSkipsEverywhereAndScalesMustAgree) {
    Dir t;
    std::string o = t / "s", out;
    write_file(t / "s.yaml", probe_recipe(o, "  - {id: p, uses: hook-probe, with: {file: " + o + "/ev.txt, skip_on_rank: 1}}\n",
                                          "steps: 3, "));
    ASSERT_EQ(run_np(3, t / "s.yaml", &out), 0) << out;
    std::vector<json_t *> lines = step_lines(o + "/m.jsonl");
    ASSERT_EQ(lines.size(), 3u);
    for (json_t *j : lines) EXPECT_TRUE(json_is_true(json_object_get(j, "skipped"))), json_decref(j);
    auto b = read_all(o + "/before.safetensors", any_tensor), a = read_all(o + "/after.safetensors", any_tensor);
    for (const auto &kv : b) EXPECT_TRUE(same_floats(kv.second, a.at(kv.first))) << kv.first;
    std::string o2 = t / "d";
    write_file(t / "d.yaml", probe_recipe(o2, "  - {id: p, uses: hook-probe, with: {file: " + o2 + "/ev.txt, "
                                              "scale_per_rank: 0.25}}\n", "steps: 3, "));
    EXPECT_EQ(run_np(3, t / "d.yaml", &out), 1) << out;
    EXPECT_NE(out.find("the pre-update hooks gave lr_scale 1 on some ranks and 1.5 on others"), std::string::npos) << out;
}

// A step whose loss is NaN (a weight made NaN before training) is skipped without an error: every step
// skipped, the metrics lines valid JSON with loss null, the run ends 0 (1 and 3 ranks).
TEST(PluginHooks, ASkippedNotFiniteStepIsNoError) {
    Dir t;
    for (int np : {1, 3}) {
        std::string o = t / ("n" + std::to_string(np)), out;
        write_file(t / "n.yaml", probe_recipe(o, "  - {id: nan, uses: trainable-probe, with: {file: " + o +
                                                 "/p.txt, nan_into: norm.weight}}\n"
                                                 "  - {id: g, uses: spike-guard, with: {min_steps: 1}}\n",
                                              "steps: 3, "));
        ASSERT_EQ(run_np(np, t / "n.yaml", &out), 0) << out;
        std::vector<json_t *> lines = step_lines(o + "/m.jsonl");
        ASSERT_EQ(lines.size(), 3u) << "every line parses as JSON";
        for (json_t *j : lines) {
            EXPECT_TRUE(json_is_true(json_object_get(j, "skipped")));
            EXPECT_TRUE(json_is_null(json_object_get(j, "loss")));
            json_decref(j);
        }
    }
}

// The after-save hook of an async periodic save comes when the save commits, with its path.
TEST(PluginHooks, AfterSaveOfAnAsyncSaveComesWhenItCommits) {
    Dir t;
    std::string o = t / "as", ev = o + "/ev.txt", out;
    write_file(t / "as.yaml", probe_recipe(o, "  - {id: p, uses: hook-probe, with: {file: " + ev + "}}\n",
                                           "steps: 4, save_every: 2, save_async: true, save_path: " + o + "/ck, "));
    ASSERT_EQ(run_np(1, t / "as.yaml", &out), 0) << out;
    std::string e = read_file(ev);
    EXPECT_NE(e.find("after_save 2 " + o + "/ck/step-2\n"), std::string::npos) << e;
    EXPECT_NE(e.find("after_save 4 " + o + "/ck/step-4\n"), std::string::npos) << e;
    EXPECT_NE(out.find("async save-dcp " + o + "/ck/step-2 committed"), std::string::npos) << out;
}
