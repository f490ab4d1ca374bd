// Learning-rate schedules of train-steps: wsd (warmup-stable-decay, torchtitan's formula and keys),
// schedule_steps (the curve's length apart from where the stage stops), no_decay globs; and the
// validate-time errors of those keys.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

extern "C" {
#include "train/lr_schedule.h"
}
#include "gpu_util.h"
#include "test_util.h"
#include "train_run_util.h"

using namespace fsdp_test;
using train_test::Dir;

namespace {

lrs_config wsd(double ratio, lrs_wsd_type type, double min_factor) {
    lrs_config c{};
    c.lr = 1.0;
    c.warmup_steps = 2;
    c.steps = 10;
    c.decay = LRS_DECAY_WSD;
    c.min_lr_ratio = 0.1;
    c.decay_ratio = ratio;
    c.decay_type = type;
    c.min_lr_factor = min_factor;
    return c;
}

std::string recipe(const std::string &with, const std::string &out) {
    return "model: {preset: tiny}\n"
           "data: {kind: text, path: data/quickstart.txt, batch_size: 2, seq_len: 32}\n"
           "stages:\n  - {id: i, uses: init-meta}\n"
           "  - {id: t, uses: train-steps, with: {" + with + ", metrics: " + out + ".jsonl}}\n"
           "  - {id: s, uses: save-safetensors, with: {path: " + out + ".safetensors}}\n";
}

}  // namespace

// lr 1, 2 warmup steps, 10 schedule steps, decay_ratio 0.3: round(3.0) = 3 decay steps, 5 stable.
TEST(Schedules, WsdGivesTheDocumentedLrPerStep) {
    fsdp_err err;
    lrs_config c = wsd(0.3, LRS_WSD_LINEAR, 0.1);
    ASSERT_EQ(lrs_validate(&c, &err), 0) << err.msg;
    EXPECT_EQ(lrs_wsd_decay_steps(&c), 3);
    // warmup (s + 1) / (W + 1); stable 1; decay p = (s + 1 - 7) / 4, 0.1 + 0.9 (1 - p)
    const double want[] = {1.0 / 3, 2.0 / 3, 1, 1, 1, 1, 1, 0.775, 0.55, 0.325, 0.1, 0.1};
    for (int s = 0; s < 12; s++) EXPECT_NEAR(lrs_at(&c, s), want[s], 1e-15) << "step " << s;
    // sqrt: 1 - sqrt(p); cosine: (1 + cos(pi p)) / 2; min_lr_factor 0
    c = wsd(0.3, LRS_WSD_SQRT, 0.0);
    EXPECT_NEAR(lrs_at(&c, 7), 1 - std::sqrt(0.25), 1e-15);
    EXPECT_NEAR(lrs_at(&c, 9), 1 - std::sqrt(0.75), 1e-15);
    c = wsd(0.3, LRS_WSD_COSINE, 0.0);
    EXPECT_NEAR(lrs_at(&c, 8), 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-15);
    EXPECT_NEAR(lrs_at(&c, 100), 0.0, 1e-15); // after the end: the value at steps
    // no decay_ratio: the decay starts right after warmup (D = S - W = 8)
    c = wsd(-1, LRS_WSD_LINEAR, 0.0);
    EXPECT_EQ(lrs_wsd_decay_steps(&c), 8);
    EXPECT_NEAR(lrs_at(&c, 2), 1 - 1.0 / 9, 1e-15);
    // Python's round(): 10 x 0.25 = 2.5 rounds to 2, 10 x 0.35 = 3.5 to 4
    c = wsd(0.25, LRS_WSD_LINEAR, 0.0);
    EXPECT_EQ(lrs_wsd_decay_steps(&c), 2);
    c = wsd(0.35, LRS_WSD_LINEAR, 0.0);
    EXPECT_EQ(lrs_wsd_decay_steps(&c), 4);
    // warmup + decay past the schedule's end, decay_ratio or min_lr_factor out of [0, 1]
    c = wsd(0.9, LRS_WSD_LINEAR, 0.0);
    EXPECT_EQ(lrs_validate(&c, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("warmup_steps 2 + 9 decay steps"), std::string::npos) << err.msg;
    c = wsd(1.5, LRS_WSD_LINEAR, 0.0);
    EXPECT_EQ(lrs_validate(&c, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("decay_ratio must be in [0, 1]"), std::string::npos) << err.msg;
    c = wsd(0.3, LRS_WSD_LINEAR, -0.5);
    EXPECT_EQ(lrs_validate(&c, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("min_lr_factor"), std::string::npos) << err.msg;
}

// The recipe's lr per step: wsd through train-steps, and "the first 4 steps of a 10-step run" whose
// second stage continues the same curve.
TEST(Schedules, ScheduleStepsAndWsdThroughTrainSteps) {
    Dir t;
    std::string o;
    write_file(t / "w.yaml", recipe("steps: 10, lr: 1e-3, warmup_steps: 2, decay: wsd, decay_ratio: 0.3, "
                                    "min_lr_factor: 0.1",
                                    t / "w"));
    ASSERT_EQ(train_test::run("-q " + (t / "w.yaml"), &o), 0) << o;
    std::vector<double> lr = train_test::column(t / "w.jsonl", "lr");
    const double want[] = {1.0 / 3, 2.0 / 3, 1, 1, 1, 1, 1, 0.775, 0.55, 0.325};
    ASSERT_EQ(lr.size(), 10u);
    for (int s = 0; s < 10; s++) EXPECT_NEAR(lr[s], 1e-3 * want[s], 1e-12) << "step " << s + 1;
    // linear decay over 10 steps, stopping after 4, then a second stage up to 10: the lr of each step
    // is the 10-step curve's (without schedule_steps the first stage would decay to the end by step 4)
    std::string r = "model: {preset: tiny}\n"
                    "data: {kind: text, path: data/quickstart.txt, batch_size: 2, seq_len: 32}\n"
                    "stages:\n  - {id: i, uses: init-meta}\n"
                    "  - {id: a, uses: train-steps, with: {steps: 4, schedule_steps: 10, lr: 1e-3, warmup_steps: 2, "
                    "decay: linear, min_lr_ratio: 0.1, metrics: " + (t / "s.jsonl") + "}}\n"
                    "  - {id: b, uses: train-steps, with: {steps: 10, lr: 1e-3, warmup_steps: 2, decay: linear, "
                    "min_lr_ratio: 0.1, metrics: " + (t / "s.jsonl") + "}}\n";
    write_file(t / "s.yaml", r);
    ASSERT_EQ(train_test::run("-q " + (t / "s.yaml"), &o), 0) << o;
    lr = train_test::column(t / "s.jsonl", "lr");
    ASSERT_EQ(lr.size(), 10u);
    lrs_config c{};
    c.lr = 1e-3, c.warmup_steps = 2, c.steps = 10, c.decay = LRS_DECAY_LINEAR, c.min_lr_ratio = 0.1;
    for (int s = 0; s < 10; s++) EXPECT_NEAR(lr[s], lrs_at(&c, s), 1e-15) << "step " << s + 1;
    EXPECT_NEAR(lr[3], 1e-3 * (1 - 0.9 * 1.0 / 8), 1e-15); // step 4 of 10, not the end of a 4-step curve
}

// no_decay: the matched parameters take AdamW's step without weight decay (bit-identical to a run
// with weight_decay 0 for them after one step), the others with it.
TEST(Schedules, NoDecayTurnsWeightDecayOffForTheMatchedParameters) {
    Dir t;
    std::string o;
    write_file(t / "nd.yaml",
               recipe("steps: 1, lr: 1e-2, weight_decay: 0.5, no_decay: [\"*norm*\"]", t / "nd"));
    write_file(t / "wd0.yaml", recipe("steps: 1, lr: 1e-2, weight_decay: 0.0", t / "wd0"));
    write_file(t / "wd.yaml", recipe("steps: 1, lr: 1e-2, weight_decay: 0.5", t / "wd"));
    for (const char *n : {"nd", "wd0", "wd"}) ASSERT_EQ(train_test::run("-q " + (t / (std::string(n) + ".yaml")), &o), 0) << o;
    std::map<std::string, st_test::Tensor> nd, wd0, wd;
    std::string why;
    ASSERT_TRUE(st_test::load(t / "nd.safetensors", &nd, &why)) << why;
    ASSERT_TRUE(st_test::load(t / "wd0.safetensors", &wd0, &why)) << why;
    ASSERT_TRUE(st_test::load(t / "wd.safetensors", &wd, &why)) << why;
    int norms = 0, others = 0;
    for (auto &kv : nd) {
        bool is_norm = kv.first.find("norm") != std::string::npos;
        const auto &ref = is_norm ? wd0.at(kv.first) : wd.at(kv.first);
        EXPECT_EQ(kv.second.f32, ref.f32) << kv.first;
        if (is_norm) {
            norms++;
            EXPECT_NE(kv.second.f32, wd.at(kv.first).f32) << kv.first << ": weight decay changes a norm";
        } else {
            others++;
        }
    }
    EXPECT_EQ(norms, 5); // attention_norm and ffn_norm of 2 layers, the final norm
    EXPECT_GT(others, 0);
}

TEST(Schedules, KeysAreCheckedBeforeAnythingRuns) {
    Dir t;
    std::string o;
    struct {
        std::string with, needle;
    } cases[] = {
        {"steps: 4, decay_ratio: 0.5", "decay_ratio is a key of the wsd schedule (decay: wsd); decay is linear"},
        {"steps: 4, decay: cosine, min_lr_factor: 0.1", "min_lr_factor is a key of the wsd schedule"},
        {"steps: 4, decay: wsd, decay_type: exp", "decay_type"},
        {"steps: 4, decay: wsd, decay_ratio: 1.5", "decay_ratio must be in [0, 1] (got 1.5)"},
        {"steps: 10, warmup_steps: 5, decay: wsd, decay_ratio: 0.6",
         "warmup_steps 5 + 6 decay steps (round(10 x 0.6)) is more than the schedule's 10 steps"},
        {"steps: 10, schedule_steps: 4", "schedule_steps 4 is less than steps 10"},
        {"steps: 4, schedule_steps: 0", "schedule_steps is 0, expected an integer >= 1"},
        {"steps: 4, schedule_steps: 100, warmup_steps: 200",
         "stage 't' (train-steps): warmup_steps 200 is more than schedule_steps 100"},
        {"steps: 4, no_decay: [[1]]", "no_decay[0]: expected a glob of parameter names"},
        {"steps: 4, no_decay: \"*norm*\"", "no_decay"},
    };
    for (auto &c : cases) {
        SCOPED_TRACE(c.with);
        write_file(t / "r.yaml", recipe(c.with, t / "x"));
        EXPECT_EQ(train_test::run("validate " + (t / "r.yaml"), &o), 2) << o;
        EXPECT_NE(o.find(c.needle), std::string::npos) << o;
        EXPECT_NE(o.find(t / "r.yaml:5:"), std::string::npos) << o; // file:line:col of the key
    }
    // a glob that matches no parameter: an error naming it, before any step, no weights written
    write_file(t / "r.yaml", recipe("steps: 2, no_decay: [\"*norm*\", \"*.bias\"]", t / "x"));
    EXPECT_NE(train_test::run("-q " + (t / "r.yaml"), &o), 0) << o;
    EXPECT_NE(o.find(t / "r.yaml:5:"), std::string::npos) << o;
    EXPECT_NE(o.find("no_decay glob '*.bias' matches no parameter of the model"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "x.safetensors"));
    EXPECT_FALSE(exists(t / "x.jsonl"));
}

// no_decay on the GPU (two AdamW launches, with and without weight decay), and wsd: the CPU's weights.
TEST(SchedulesGpu, NoDecayAndWsdOnTheGpuMatchTheCpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    Dir t;
    std::string o;
    std::string w = "steps: 3, lr: 1e-2, weight_decay: 0.5, no_decay: [\"*norm*\"], decay: wsd, decay_ratio: 0.5";
    write_file(t / "cpu.yaml", recipe(w, t / "cpu"));
    write_file(t / "gpu.yaml", "runtime: {device: cuda}\n" + recipe(w, t / "gpu"));
    write_file(t / "gwd.yaml", "runtime: {device: cuda}\n" +
                                   recipe("steps: 3, lr: 1e-2, weight_decay: 0.5, decay: wsd, decay_ratio: 0.5", t / "gwd"));
    for (const char *n : {"cpu", "gpu", "gwd"})
        ASSERT_EQ(train_test::run("-q " + (t / (std::string(n) + ".yaml")), &o), 0) << n << ": " << o;
    std::string worst;
    EXPECT_LT(train_test::max_rel_diff(t / "gpu.safetensors", t / "cpu.safetensors", &worst), 1e-5) << worst;
    std::map<std::string, st_test::Tensor> g, gwd;
    ASSERT_TRUE(st_test::load(t / "gpu.safetensors", &g, &why)) << why;
    ASSERT_TRUE(st_test::load(t / "gwd.safetensors", &gwd, &why)) << why;
    EXPECT_NE(g.at("norm.weight").f32, gwd.at("norm.weight").f32);
}
