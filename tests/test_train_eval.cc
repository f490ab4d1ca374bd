// Evaluation: train-steps' eval_every / eval_batches / eval_data and the `eval` stage. The eval
// loss equals the loss of the same batches through the model (the training step's loss before its
// update), it lands in the metrics file, the log and the report, a checkpoint evaluates to the
// same value, and the keys' errors come at validation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "test_util.h"
#include "train_run_util.h"

using namespace fsdp_test;
using train_test::Dir;

namespace {

const char *DATA = "data: {kind: text, path: data/quickstart.txt, batch_size: 4, seq_len: 32}\n";

}  // namespace

// Training with lr 0 leaves the model as it is: step k's loss is then the loss of batch k-1 through
// the initial model. An eval of the same (sequential) batches gives their token-weighted mean.
TEST(TrainEval, EvalLossEqualsTheLossOfTheSameBatchesThroughTheModel) {
    Dir t;
    std::string o;
    std::string seq = "data: {kind: text, path: data/quickstart.txt, batch_size: 4, seq_len: 32, order: sequential}\n";
    write_file(t / "train.yaml", "model: {preset: tiny}\n" + seq +
                                     "stages:\n  - {id: i, uses: init-meta}\n"
                                     "  - {id: t, uses: train-steps, with: {steps: 3, lr: 0, weight_decay: 0, "
                                     "metrics: " + (t / "m.jsonl") + "}}\n");
    ASSERT_EQ(train_test::run("-q " + (t / "train.yaml"), &o), 0) << o;
    std::vector<double> loss = train_test::column(t / "m.jsonl", "loss");
    ASSERT_EQ(loss.size(), 3u);
    EXPECT_NE(loss[0], loss[1]); // different batches
    // the eval stage over the same 3 batches (its default eval_data: the data section itself)
    write_file(t / "eval.yaml", "model: {preset: tiny}\n" + seq +
                                    "stages:\n  - {id: i, uses: init-meta}\n"
                                    "  - {id: e, uses: eval, with: {eval_batches: 3}}\n");
    ASSERT_EQ(train_test::run((t / "eval.yaml") + " --report " + (t / "r.json"), &o), 0) << o;
    double want = (loss[0] + loss[1] + loss[2]) / 3; // every batch has 4 x 32 tokens
    double got = train_test::report_metric(t / "r.json", "eval", "eval_loss");
    EXPECT_NEAR(got, want, 1e-6 * want);
    EXPECT_EQ(train_test::report_metric(t / "r.json", "eval", "eval_tokens"), 3.0 * 4 * 32);
    EXPECT_NE(o.find("eval at step 0: eval_loss"), std::string::npos) << o;
    // one batch: exactly the first step's loss; micro-batches of 1 row: the same mean
    write_file(t / "eval1.yaml", "model: {preset: tiny}\n" + seq +
                                     "stages:\n  - {id: i, uses: init-meta}\n"
                                     "  - {id: e, uses: eval, with: {eval_batches: 1, micro_batch: 1}}\n");
    ASSERT_EQ(train_test::run("-q " + (t / "eval1.yaml") + " --report " + (t / "r1.json"), &o), 0) << o;
    EXPECT_NEAR(train_test::report_metric(t / "r1.json", "eval", "eval_loss"), loss[0], 1e-6 * loss[0]);
}

// eval_every: a metrics line {"step", "eval_loss", "eval_tokens"} at every multiple and after the
// last step, a log line, eval_loss in the report; the model evaluated is the one after that step.
TEST(TrainEval, EveryNStepsInTheMetricsTheLogAndTheReport) {
    Dir t;
    std::string o;
    write_file(t / "r.yaml", std::string("model: {preset: tiny}\n") + DATA +
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 5, lr: 1e-3, eval_every: 2, "
                                 "eval_batches: 2, eval_data: {order: sequential}, metrics: " + (t / "m.jsonl") + "}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + (t / "ck") + "}}\n");
    ASSERT_EQ(train_test::run((t / "r.yaml") + " --report " + (t / "rep.json"), &o), 0) << o;
    std::vector<json_t *> ev = train_test::lines_with(t / "m.jsonl", "eval_loss");
    ASSERT_EQ(ev.size(), 3u);
    const int steps[] = {2, 4, 5};
    for (size_t k = 0; k < ev.size(); k++) {
        EXPECT_EQ(json_integer_value(json_object_get(ev[k], "step")), steps[k]);
        EXPECT_EQ(json_integer_value(json_object_get(ev[k], "eval_tokens")), 2 * 4 * 32);
        EXPECT_GT(json_number_value(json_object_get(ev[k], "eval_loss")), 0);
    }
    double last = json_number_value(json_object_get(ev[2], "eval_loss"));
    for (json_t *j : ev) json_decref(j);
    // the step lines are still there, and evaluating between steps changes none of them
    std::vector<double> with_eval = train_test::column(t / "m.jsonl", "loss");
    EXPECT_EQ(with_eval.size(), 5u);
    write_file(t / "n.yaml", std::string("model: {preset: tiny}\n") + DATA +
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 5, lr: 1e-3, metrics: " + (t / "n.jsonl") +
                                 "}}\n");
    std::string o2;
    ASSERT_EQ(train_test::run("-q " + (t / "n.yaml"), &o2), 0) << o2;
    EXPECT_EQ(train_test::column(t / "n.jsonl", "loss"), with_eval);
    EXPECT_NE(o.find("step 4  eval_loss"), std::string::npos) << o;
    EXPECT_NEAR(train_test::report_metric(t / "rep.json", "train-steps", "eval_loss"), last, 1e-8 * last);
    // load-ckpt then eval on the same held-out batches: the same value from the checkpoint
    write_file(t / "e.yaml", std::string("model: {preset: tiny}\n") + DATA +
                                 "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + (t / "ck") + "}}\n"
                                 "  - {id: e, uses: eval, with: {eval_batches: 2, eval_data: {order: sequential}}}\n");
    ASSERT_EQ(train_test::run("-q " + (t / "e.yaml") + " --report " + (t / "e.json"), &o), 0) << o;
    EXPECT_NEAR(train_test::report_metric(t / "e.json", "eval", "eval_loss"), last, 1e-6 * last);
}

// On 3 ranks: each rank evaluates its slice, the loss is the global mean (the 1-rank value).
TEST(TrainEval, ThreeRanksGiveTheOneRankEvalLoss) {
    Dir t;
    std::string o;
    std::string r = "model: {preset: tiny}\n"
                    "data: {kind: text, path: data/quickstart.txt, batch_size: 6, seq_len: 32}\n"
                    "stages:\n  - {id: i, uses: init-meta}\n"
                    "  - {id: e, uses: eval, with: {eval_batches: 2}}\n";
    write_file(t / "r.yaml", r);
    ASSERT_EQ(train_test::run("-q " + (t / "r.yaml") + " --report " + (t / "one.json"), &o), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "r.yaml") + " --report " + (t / "three.json"), &o, mpirun_prefix(3)), 0) << o;
    double a = train_test::report_metric(t / "one.json", "eval", "eval_loss");
    double b = train_test::report_metric(t / "three.json", "eval", "eval_loss");
    EXPECT_NEAR(a, b, 1e-6 * a);
}

TEST(TrainEval, KeysAreCheckedBeforeAnythingRuns) {
    Dir t;
    std::string o;
    struct {
        std::string stage, needle;
    } cases[] = {
        {"{id: t, uses: train-steps, with: {steps: 2, eval_every: 1}}", "eval_every needs eval_data"},
        {"{id: t, uses: train-steps, with: {steps: 2, eval_every: -1, eval_data: {}}}",
         "eval_every is -1, expected an integer >= 0"},
        {"{id: t, uses: train-steps, with: {steps: 2, eval_every: 1, eval_batches: 0, eval_data: {}}}",
         "eval_batches is 0, expected an integer >= 1"},
        {"{id: t, uses: train-steps, with: {steps: 2, eval_every: 1, eval_data: {kind: tokens, path: /no/val.bin}}}",
         "eval_data.path: cannot read /no/val.bin"},
        {"{id: t, uses: train-steps, with: {steps: 2, eval_every: 1, eval_data: {kind: text, colour: red}}}",
         "unknown key 'colour'"},
        {"{id: t, uses: train-steps, with: {steps: 2, eval_every: 1, eval_data: [1]}}", "eval_data"},
        {"{id: e, uses: eval, with: {eval_batches: 0}}", "eval_batches is 0"},
        {"{id: e, uses: eval, with: {eval_data: {kind: text, path: /no/val.txt}}}", "cannot read /no/val.txt"},
        {"{id: e, uses: eval, with: {micro_batch: 3}}", "micro_batch 3 does not divide this rank's batch of 4 rows"},
    };
    for (auto &c : cases) {
        SCOPED_TRACE(c.stage);
        write_file(t / "r.yaml", std::string("model: {preset: tiny}\n") + DATA +
                                     "stages:\n  - {id: i, uses: init-meta}\n  - " + c.stage + "\n");
        EXPECT_EQ(train_test::run("validate " + (t / "r.yaml"), &o), 2) << o;
        EXPECT_NE(o.find(c.needle), std::string::npos) << o;
        EXPECT_NE(o.find(t / "r.yaml:5:"), std::string::npos) << o;
    }
    // a held-out batch shape other than training's: when the stage opens it, naming the key
    write_file(t / "r.yaml", std::string("model: {preset: tiny}\n") + DATA +
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 2, eval_every: 1, "
                                 "eval_data: {seq_len: 16}, metrics: " + (t / "m.jsonl") + "}}\n");
    EXPECT_NE(train_test::run("-q " + (t / "r.yaml"), &o), 0) << o;
    EXPECT_NE(o.find("eval_data.seq_len is 16, the training data's is 32"), std::string::npos) << o;
    EXPECT_NE(o.find(t / "r.yaml:5:"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "m.jsonl")); // before any step
}

// The GPU path (the emulated device in build-emu): the eval stage and eval_every give the CPU path's
// values; eval runs between steps without disturbing them.
TEST(TrainEvalGpu, EvalOnTheGpuEqualsTheCpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    Dir t;
    std::string o;
    std::string r = std::string("model: {preset: tiny}\n") + DATA +
                    "stages:\n  - {id: i, uses: init-meta}\n"
                    "  - {id: t, uses: train-steps, with: {steps: 3, lr: 1e-3, eval_every: 2, "
                    "eval_data: {order: sequential}, metrics: \"${m}\"}}\n"
                    "  - {id: e, uses: eval, with: {eval_batches: 2, micro_batch: 2}}\n"
                    "vars: {m: x}\n";
    write_file(t / "r.yaml", r);
    for (const char *dev : {"cpu", "cuda"})
        ASSERT_EQ(train_test::run("-q " + (t / "r.yaml") + " --set runtime.device=" + dev + " --set vars.m=" +
                                      (t / (std::string(dev) + ".jsonl")) + " --report " +
                                      (t / (std::string(dev) + ".json")),
                                  &o),
                  0)
            << dev << ": " << o;
    std::vector<double> c = train_test::column(t / "cpu.jsonl", "eval_loss"),
                        g = train_test::column(t / "cuda.jsonl", "eval_loss");
    ASSERT_EQ(c.size(), 2u);
    ASSERT_EQ(g.size(), 2u);
    for (size_t k = 0; k < 2; k++) EXPECT_NEAR(g[k], c[k], 1e-5 * c[k]);
    std::vector<double> lc = train_test::column(t / "cpu.jsonl", "loss"), lg = train_test::column(t / "cuda.jsonl", "loss");
    ASSERT_EQ(lg.size(), 3u);
    EXPECT_NEAR(lg[2], lc[2], 1e-5 * lc[2]); // the step after an evaluation
    double ec = train_test::report_metric(t / "cpu.json", "eval", "eval_loss"),
           eg = train_test::report_metric(t / "cuda.json", "eval", "eval_loss");
    EXPECT_NEAR(eg, ec, 1e-5 * ec);
}
