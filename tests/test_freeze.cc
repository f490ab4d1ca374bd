// train-steps' `freeze:` against PyTorch's requires_grad=False (issue 39 item 3): on every config of
// tests/data/freeze-5.24 (tools/gen/gen_freeze_grid.py: 12 grid configs of the six model types, tied and
// untied, 1-3 layers, each with 1-2 frozen sets drawn from embedding / layer 0 / norms / attention
// projections / untied head), through a recipe on 1 and 3 ranks: the per-step loss and gradient norm (the
// norm without the frozen tensors) to 1e-7 and 1e-5 of the float64 run's (the grid's tolerances), the
// trained weights after 3 steps within 3x PyTorch's float32 distance of the float64 run, every frozen tensor bitwise
// unchanged, and a DCP without optimizer state or param group for a frozen tensor (PyTorch's optimizer holds
// none) that loads back and trains. Also the model table's `trainable: false` and freeze's errors.
#include <gtest/gtest.h>
#include <jansson.h>
#include <fnmatch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "hf_grid_util.h"
#include "st_test_reader.h"
#include "test_util.h"
#include "train_run_util.h"

extern "C" {
#include "ckpt/reader.h"
}

using namespace fsdp_test;
using train_test::Dir;

namespace {

std::string fdir(const std::string &name = "", const std::string &file = "") {
    std::string d = "tests/data/freeze-5.24";
    if (!name.empty()) d += "/" + name;
    if (!file.empty()) d += "/" + file;
    return d;
}

struct FreezeRef {
    std::vector<std::string> fsdp_globs;
    std::vector<std::string> frozen;  // checkpoint names
    std::vector<hf_grid::Step> steps;
    double weight_diff = 0;
};

FreezeRef read_ref(const std::string &name) {
    FreezeRef r;
    json_error_t je;
    json_t *j = json_load_file(fdir(name, "reference.json").c_str(), 0, &je);
    EXPECT_TRUE(j) << je.text;
    if (!j) return r;
    json_t *fz = json_object_get(j, "freeze");
    for (size_t i = 0; i < json_array_size(fz); i++)
        r.fsdp_globs.push_back(json_string_value(json_object_get(json_array_get(fz, i), "fsdp")));
    json_t *fr = json_object_get(j, "frozen_checkpoint_names");
    for (size_t i = 0; i < json_array_size(fr); i++) r.frozen.push_back(json_string_value(json_array_get(fr, i)));
    r.steps = hf_grid::read_steps(json_object_get(j, "steps"));
    json_t *f = json_object_get(j, "f32_run");
    r.weight_diff = json_number_value(json_object_get(f, "max_abs_weight_diff"));
    json_decref(j);
    return r;
}

std::vector<std::string> configs() {
    std::vector<std::string> v;
    json_error_t je;
    json_t *g = json_load_file(fdir("", "grid.json").c_str(), 0, &je);
    EXPECT_TRUE(g) << je.text;
    json_t *cs = json_object_get(g, "configs");
    for (size_t i = 0; i < json_array_size(cs); i++)
        v.push_back(json_string_value(json_object_get(json_array_get(cs, i), "name")));
    json_decref(g);
    return v;
}

std::map<std::string, st_test::Tensor> load(const std::string &path) {
    std::map<std::string, st_test::Tensor> t;
    std::string why;
    EXPECT_TRUE(st_test::load(path, &t, &why)) << why;
    return t;
}

std::string yaml_list(const std::vector<std::string> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += (i ? ", \"" : "\"") + v[i] + "\"";
    return s + "]";
}

// The grid's schedule (warmup 2, then linear to 10%), its AdamW and clipping, the freeze globs.
std::string recipe(const std::string &name, int seq, const std::string &freeze, const std::string &out,
                   bool gpu = false) {
    std::string g = hf_grid::dir(name);
    return std::string(gpu ? "runtime: {device: cuda}\n" : "") + "model: {from_hf: " + g + "}\n"
           "data: {kind: safetensors, path: " + g + "/batch.safetensors, batch_size: 6, seq_len: " + std::to_string(seq) +
           "}\nstages:\n"
           "  - {id: l, uses: load-ckpt, with: {path: " + g + ", names: hf}}\n"
           "  - {id: t, uses: train-steps, with: {steps: 3, lr: 1e-3, warmup_steps: 2, decay: linear, min_lr_ratio: 0.1,"
           " betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0, freeze: " + freeze +
           ", metrics: " + out + "/m.jsonl}}\n"
           "  - {id: s, uses: save-dcp, with: {path: " + out + "/dcp}}\n"
           "  - {id: e, uses: save-safetensors, with: {path: " + out + "/hf, names: hf}}\n";
}

// The DCP holds AdamW state and a param group for exactly the trained tensors.
void expect_optimizer_of_trained_only(const std::string &dcp, const std::vector<std::string> &globs,
                                      hf_grid::Report &rep, const std::string &cfg) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    if (ckpt_open(dcp.c_str(), CKPT_AUTO, &r, &err)) {
        rep.fail(cfg, std::string("open the DCP: ") + err.msg);
        return;
    }
    size_t frozen = 0, trained = 0;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        std::string k = ckpt_entry_at(r, i)->name;
        if (!ckpt_entry_at(r, i)->is_tensor || k.rfind("optimizer.", 0) == 0 || k.find('.') == std::string::npos ||
            k.rfind("train_state", 0) == 0 || k.rfind("lr_scheduler", 0) == 0 || k.rfind("dataloader", 0) == 0)
            continue;
        bool fz = false;
        for (const auto &g : globs) fz = fz || fnmatch(g.c_str(), k.c_str(), 0) == 0;
        for (const char *suffix : {".exp_avg", ".exp_avg_sq", ".step"}) {
            bool has = ckpt_find(r, ("optimizer.state." + k + suffix).c_str()) >= 0;
            if (has == fz) rep.fail(cfg, k + (fz ? ": frozen, yet optimizer.state" : ": trained, no optimizer.state") + suffix);
        }
        bool group = ckpt_find(r, ("optimizer.param_groups." + k + ".lr").c_str()) >= 0;
        if (group == fz) rep.fail(cfg, k + (fz ? ": frozen, yet a param group" : ": trained, no param group"));
        (fz ? frozen : trained)++;
    }
    if (!frozen || !trained) rep.fail(cfg, "the DCP has no frozen or no trained tensor");
    ckpt_close(r);
}

void check_config(const std::string &n, int np, hf_grid::Report &rep, bool gpu = false) {
    hf_grid::Ref grid(n);
    FreezeRef ref = read_ref(n);
    Dir t;
    std::string out = t / "o", r = t / "r.yaml", log;
    write_file(r, recipe(n, grid.seq, yaml_list(ref.fsdp_globs), out, gpu));
    int rc = train_test::run(r, &log, np > 1 ? mpirun_prefix(np) : "");
    if (rc) {
        rep.fail(n, "the run failed: " + log);
        return;
    }
    rep.checked++;
    std::vector<double> loss = train_test::column(out + "/m.jsonl", "loss"),
                        gn = train_test::column(out + "/m.jsonl", "grad_norm"),
                        lr = train_test::column(out + "/m.jsonl", "lr");
    if (loss.size() != ref.steps.size()) rep.fail(n, "steps in the metrics: " + std::to_string(loss.size()));
    for (size_t k = 0; k < loss.size() && k < ref.steps.size(); k++) {
        const hf_grid::Step &s = ref.steps[k];
        std::string at = "step " + std::to_string(k + 1) + " ";
        if (std::fabs(lr[k] - s.lr) > 1e-12) rep.fail(n, at + "lr " + std::to_string(lr[k]) + " vs " + std::to_string(s.lr));
        const double tl = hf_grid::loss_tol(s.loss), tg = 1e-5 * s.gn;
        if (!(std::fabs(loss[k] - s.loss) <= tl))
            rep.fail(n, at + "loss " + std::to_string(loss[k]) + " vs " + std::to_string(s.loss));
        if (!(std::fabs(gn[k] - s.gn) <= tg))
            rep.fail(n, at + "grad norm " + std::to_string(gn[k]) + " vs " + std::to_string(s.gn) + " (the norm without "
                     "the frozen tensors)");
    }
    auto got = load(out + "/hf/model.safetensors"), want = load(fdir(n, "model_step3.safetensors")),
         init = load(hf_grid::dir(n, "model.safetensors"));
    std::map<std::string, bool> is_frozen;
    for (const auto &f : ref.frozen) is_frozen[f] = true;
    for (const auto &kv : want) {
        auto it = got.find(kv.first);
        if (it == got.end()) {
            rep.fail(n, "the export lacks " + kv.first);
            continue;
        }
        const auto &g = it->second.f32, &w = kv.second.f32, &i0 = init.at(kv.first).f32;
        double d = 0;
        bool same = g.size() == i0.size() && !memcmp(g.data(), i0.data(), g.size() * sizeof(float));
        for (size_t e = 0; e < w.size() && e < g.size(); e++) d = std::max(d, (double)std::fabs(g[e] - w[e]));
        if (is_frozen.count(kv.first) && !same) rep.fail(n, kv.first + ": frozen, yet changed");
        if (!(d <= hf_grid::kWeightFactor * ref.weight_diff)) rep.fail(n, kv.first + ": weights " + std::to_string(d) + " from the float64 run");
    }
    expect_optimizer_of_trained_only(out + "/dcp", ref.fsdp_globs, rep, n);
}

}  // namespace

TEST(Freeze, EqualsPyTorchsRequiresGradFalseOnOneRank) {
    auto cs = configs();
    ASSERT_EQ(cs.size(), 12u);
    hf_grid::Report rep("Freeze.OneRank");
    for (const auto &n : cs) check_config(n, 1, rep);
    rep.finish();
}

TEST(Freeze, EqualsPyTorchsRequiresGradFalseOnThreeRanks) {
    hf_grid::Report rep("Freeze.ThreeRanks");
    for (const auto &n : configs()) check_config(n, 3, rep);
    rep.finish();
}

// The GPU path (its optimizer list without the frozen tensors; the emulated device in build-emu): four
// configs (dense and MoE, tied and untied) on one GPU, the same rules.
TEST(FreezeGpu, EqualsPyTorchsRequiresGradFalseOnTheGpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    hf_grid::Report rep("FreezeGpu.OneGpu");
    for (const char *n : {"llama_02", "qwen2_11", "qwen3_moe_09", "olmoe_09"}) check_config(n, 1, rep, true);
    rep.finish();
}

namespace {

std::string probe() { return std::string(FSDP_BUILD_DIR) + "/tests/plugins/libtrainable_probe.so"; }

// "NAME TRAINABLE HAS_MOMENTS" lines of trainable-probe, by name.
std::map<std::string, std::string> probe_lines(const std::string &file) {
    std::map<std::string, std::string> m;
    std::string all = read_file(file), line;
    size_t p = 0;
    while (p < all.size()) {
        size_t e = all.find('\n', p);
        line = all.substr(p, e == std::string::npos ? std::string::npos : e - p);
        p = e == std::string::npos ? all.size() : e + 1;
        size_t sp = line.find(' ');
        if (sp != std::string::npos) m[line.substr(0, sp)] = line.substr(sp + 1);
    }
    return m;
}

}  // namespace

// The model table's trainable: false, on a part and on an entry (an entry's true inside a false part
// stays a buffer: the part's false wins), seen by fsdp_param_trainable; no moments are made for them.
TEST(Freeze, ModelTableTrainableFalseDeclaresBuffers) {
    Dir t;
    std::string f = t / "p.txt", out;
    write_file(t / "t.yaml", "plugins: [" + probe() + "]\nmodel:\n  parts:\n"
                             "    - {name: a, params: [{name: s.mean, shape: [4, 4], init: ones}, {name: s.var, shape: [4], "
                             "init: ones, trainable: true}], trainable: false}\n"
                             "    - {name: b, params: [{name: x.w, shape: [3], init: ones, trainable: false}, {name: x.b, "
                             "shape: [3], init: ones}]}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: p, uses: trainable-probe, after: [i], with: {file: " + f + "}}\n");
    for (int np : {1, 3}) {
        rm_rf(f);
        ASSERT_EQ(train_test::run(t / "t.yaml", &out, np > 1 ? mpirun_prefix(np) : ""), 0) << out;
        auto m = probe_lines(f);
        EXPECT_EQ(m["s.mean"], "0 0");
        EXPECT_EQ(m["s.var"], "0 0");
        EXPECT_EQ(m["x.w"], "0 0");
        EXPECT_EQ(m["x.b"], "1 0");
    }
    write_file(t / "bad.yaml", "model:\n  params: [{name: w, shape: [2], trainable: maybe}]\nstages:\n  - {id: i, uses: init-meta}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + t / "bad.yaml", &out), 2) << out;
    EXPECT_NE(out.find("model: trainable must be true or false"), std::string::npos) << out;
}

// fsdp_param_set_trainable: buffers made by a plugin are not trained (bitwise unchanged, no moments in the
// DCP) and a callback sees them and the freeze: ones as not trainable while train-steps runs; freeze ends
// with the stage; a freeze glob that matches nothing is an error naming it; the DCP of a frozen run loads
// back and trains the formerly frozen tensors (fresh moments), on 1 and 3 ranks.
TEST(Freeze, PluginBuffersCallbacksResumeAndErrors) {
    Dir t;
    for (int np : {1, 3}) {
        SCOPED_TRACE(np);
        std::string f = t / ("cb" + std::to_string(np) + ".txt"), g = t / ("after" + std::to_string(np) + ".txt"),
                    o = t / ("o" + std::to_string(np)), out;
        write_file(t / "r.yaml", "plugins: [" + probe() + "]\nmodel: {preset: tiny}\n"
                                 "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: b0, uses: save-safetensors, after: [i], with: {path: " + o + "/b.safetensors}}\n"
                                 "  - {id: p, uses: trainable-probe, after: [b0], with: {file: " + f + ", buffers: "
                                 "\"layers.1.*\", in_callback: true}}\n"
                                 "  - {id: t, uses: train-steps, after: [p], with: {steps: 2, freeze: [norm.weight]}}\n"
                                 "  - {id: q, uses: trainable-probe, after: [t], with: {file: " + g + "}}\n"
                                 "  - {id: s, uses: save-dcp, after: [q], with: {path: " + o + "/dcp}}\n"
                                 "  - {id: a, uses: save-safetensors, after: [q], with: {path: " + o + "/a.safetensors}}\n");
        ASSERT_EQ(train_test::run(t / "r.yaml", &out, np > 1 ? mpirun_prefix(np) : ""), 0) << out;
        auto cb = probe_lines(f), after = probe_lines(g);
        EXPECT_EQ(cb["layers.1.attention.wq.weight"], "0 0");
        EXPECT_EQ(cb["norm.weight"], "0 0");
        EXPECT_EQ(cb["layers.0.attention.wq.weight"], "1 1");
        EXPECT_EQ(after["norm.weight"], "1 0") << "freeze ends with its stage (no moments were made)";
        EXPECT_EQ(after["layers.1.ffn_norm.weight"], "0 0") << "a buffer stays one";
        auto b = load(o + "/b.safetensors"), a = load(o + "/a.safetensors");
        for (const auto &kv : b) {
            bool kept = !memcmp(kv.second.f32.data(), a.at(kv.first).f32.data(), kv.second.f32.size() * sizeof(float));
            bool untrained = kv.first.rfind("layers.1.", 0) == 0 || kv.first == "norm.weight";
            EXPECT_EQ(kept, untrained) << kv.first;
        }
        // resume: the formerly frozen norm and the buffers (trainable again) train, with fresh moments
        write_file(t / "resume.yaml", "plugins: [" + probe() + "]\nmodel: {preset: tiny}\n"
                                      "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                                      "  - {id: l, uses: load-ckpt, with: {path: " + o + "/dcp}}\n"
                                      "  - {id: t, uses: train-steps, after: [l], with: {steps: 3}}\n"
                                      "  - {id: q, uses: trainable-probe, after: [t], with: {file: " + o + "/r.txt}}\n");
        ASSERT_EQ(train_test::run(t / "resume.yaml", &out, np > 1 ? mpirun_prefix(np) : ""), 0) << out;
        auto r = probe_lines(o + "/r.txt");
        EXPECT_EQ(r["norm.weight"], "1 1");
        EXPECT_EQ(r["layers.1.attention.wq.weight"], "1 1");
    }
    std::string out;
    write_file(t / "bad.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                               "  - {id: i, uses: init-meta}\n"
                               "  - {id: t, uses: train-steps, after: [i], with: {steps: 1, freeze: [\"lm_head.*\"]}}\n");
    EXPECT_EQ(train_test::run(t / "bad.yaml", &out), 1) << out;
    EXPECT_NE(out.find("train-steps: freeze glob 'lm_head.*' matches no parameter of the model"), std::string::npos) << out;
}
