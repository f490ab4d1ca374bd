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
