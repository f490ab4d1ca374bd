// Gradient accumulation (train-steps grad_accum / micro_batch): N micro-batches of B rows per
// optimizer step give the loss and the weights of one batch of N x B rows (PyTorch's mean over every
// token of the global batch), on 1 and 3 ranks of the CPU path and on the (emulated) GPU; and the
// validate-time errors of the keys.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include "runtime/device.h"
}
#include "gpu_util.h"
#include "test_util.h"
#include "train_run_util.h"

using namespace fsdp_test;
using train_test::Dir;

namespace {

// 3 steps of the tiny model on the quickstart text: global batch `batch` rows of 32 tokens, the
// train-steps keys `extra`, then the weights in OUT.safetensors and the metrics in OUT.jsonl.
std::string recipe(int batch, const std::string &extra, const std::string &out, const char *device = "cpu") {
    return "runtime: {device: " + std::string(device) + "}\nmodel: {preset: tiny}\n"
           "data: {kind: text, path: data/quickstart.txt, batch_size: " + std::to_string(batch) + ", seq_len: 32}\n"
           "stages:\n  - {id: i, uses: init-meta}\n"
           "  - {id: t, uses: train-steps, with: {steps: 3, lr: 1e-3, warmup_steps: 1, metrics: " + out + ".jsonl" +
           (extra.empty() ? "" : ", " + extra) + "}}\n"
           "  - {id: s, uses: save-safetensors, with: {path: " + out + ".safetensors}}\n";
}

// The two runs' losses per step (relative 1e-5) and weights (relative 1e-5: float32 summation order).
void expect_same_run(const std::string &a, const std::string &b) {
    std::vector<double> la = train_test::column(a + ".jsonl", "loss"), lb = train_test::column(b + ".jsonl", "loss");
    ASSERT_EQ(la.size(), 3u);
    ASSERT_EQ(lb.size(), 3u);
    for (size_t k = 0; k < 3; k++) EXPECT_NEAR(la[k], lb[k], 1e-5 * lb[k]) << "step " << k + 1;
    // the step's gradient too: its norm before clipping
    std::vector<double> ga = train_test::column(a + ".jsonl", "grad_norm"),
                        gb = train_test::column(b + ".jsonl", "grad_norm");
    for (size_t k = 0; k < 3 && k < ga.size() && k < gb.size(); k++)
        EXPECT_NEAR(ga[k], gb[k], 1e-5 * gb[k]) << "step " << k + 1;
    std::string worst;
    double d = train_test::max_rel_diff(a + ".safetensors", b + ".safetensors", &worst);
    EXPECT_LT(d, 1e-5) << "worst tensor " << worst;
}

}  // namespace

TEST(TrainAccum, FourMicroBatchesOfBEqualOneBatchOf4B) {
    Dir t;
    std::string o;
    write_file(t / "one.yaml", recipe(8, "", t / "one"));
    write_file(t / "acc.yaml", recipe(8, "grad_accum: 4", t / "acc"));
    write_file(t / "mb.yaml", recipe(8, "micro_batch: 2", t / "mb"));
    ASSERT_EQ(train_test::run("-q " + (t / "one.yaml"), &o), 0) << o;
    ASSERT_EQ(train_test::run((t / "acc.yaml"), &o), 0) << o;
    EXPECT_NE(o.find("gradient accumulation: 4 micro-batches of 2 rows per rank and step"), std::string::npos) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "mb.yaml"), &o), 0) << o;
    expect_same_run(t / "acc", t / "one");
    expect_same_run(t / "mb", t / "one");
    // tokens counted per optimizer step: the whole global batch
    std::vector<double> tok = train_test::column(t / "acc.jsonl", "tokens");
    ASSERT_EQ(tok.size(), 3u);
    EXPECT_EQ(tok[2], 3.0 * 8 * 32);
    // and not the same as training on one micro-batch: the accumulation is really over all four
    write_file(t / "small.yaml", recipe(2, "", t / "small"));
    ASSERT_EQ(train_test::run("-q " + (t / "small.yaml"), &o), 0) << o;
    std::vector<double> ls = train_test::column(t / "small.jsonl", "loss"), la = train_test::column(t / "acc.jsonl", "loss");
    ASSERT_EQ(ls.size(), 3u);
    EXPECT_GT(std::fabs(ls[0] - la[0]), 1e-4);
}

TEST(TrainAccum, ThreeRanksWithAccumulationEqualOneRankWithoutIt) {
    Dir t;
    std::string o;
    // 12 rows: 3 ranks x 4 micro-batches of 1 row against one rank's single batch of 12 rows
    write_file(t / "one.yaml", recipe(12, "", t / "one"));
    write_file(t / "acc.yaml", recipe(12, "grad_accum: 4", t / "acc"));
    write_file(t / "acc1.yaml", recipe(12, "grad_accum: 3", t / "acc1"));
    ASSERT_EQ(train_test::run("-q " + (t / "one.yaml"), &o), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "acc.yaml"), &o, mpirun_prefix(3)), 0) << o;
    expect_same_run(t / "acc", t / "one");
    // one rank with accumulation too
    ASSERT_EQ(train_test::run("-q " + (t / "acc1.yaml"), &o), 0) << o;
    expect_same_run(t / "acc1", t / "one");
}

TEST(TrainAccum, KeysAreCheckedBeforeAnythingRuns) {
    Dir t;
    std::string o;
    struct {
        std::string extra, needle;
        int batch;
    } cases[] = {
        {"grad_accum: 0", "grad_accum is 0, expected an integer >= 1", 8},
        {"grad_accum: two", "grad_accum", 8},
        {"micro_batch: -1", "micro_batch is -1, expected an integer >= 1", 8},
        {"grad_accum: 2, micro_batch: 4", "give grad_accum or micro_batch, not both", 8},
    };
    for (auto &c : cases) {
        SCOPED_TRACE(c.extra);
        write_file(t / "r.yaml", recipe(c.batch, c.extra, t / "x"));
        EXPECT_EQ(train_test::run("validate " + (t / "r.yaml"), &o), 2) << o;
        EXPECT_NE(o.find(c.needle), std::string::npos) << o;
        EXPECT_NE(o.find(t / "r.yaml:6:"), std::string::npos) << o; // file:line:col of the key's value
    }
    // a grad_accum that does not divide the rank's batch: before any stage runs, naming the key
    write_file(t / "r.yaml", recipe(6, "grad_accum: 4", t / "x"));
    EXPECT_EQ(train_test::run("validate " + (t / "r.yaml"), &o), 2) << o;
    EXPECT_NE(o.find("grad_accum 4 does not divide"), std::string::npos) << o;
    EXPECT_NE(o.find(t / "r.yaml:6:"), std::string::npos) << o;
    int rc = train_test::run((t / "r.yaml"), &o);
    EXPECT_EQ(rc, 2) << o;
    EXPECT_EQ(o.find("stage i (init-meta) done"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "x.safetensors"));
    // over 3 ranks the 12 rows are 4 per rank: 3 micro-batches do not divide them
    write_file(t / "r3.yaml", recipe(12, "grad_accum: 3", t / "y"));
    rc = train_test::run("-q " + (t / "r3.yaml"), &o, mpirun_prefix(3));
    EXPECT_NE(rc, 0) << o;
    EXPECT_NE(o.find("grad_accum 3 does not divide this rank's batch of 4 rows"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "y.safetensors"));
}

// The GPU path (the emulated device in build-emu): grad_accum 4 equals one batch of 4B on the GPU
// and the CPU path's one batch, on 1, 2 and 3 ranks.
TEST(TrainAccumGpu, FourMicroBatchesEqualOneBatchOnTheGpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    Dir t;
    std::string o;
    write_file(t / "cpu.yaml", recipe(8, "", t / "cpu"));
    write_file(t / "one.yaml", recipe(8, "", t / "one", "cuda"));
    write_file(t / "acc.yaml", recipe(8, "grad_accum: 4", t / "acc", "cuda"));
    write_file(t / "acc2.yaml", recipe(8, "grad_accum: 2", t / "acc2", "cuda"));
    ASSERT_EQ(train_test::run("-q " + (t / "cpu.yaml"), &o), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "one.yaml"), &o), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "acc.yaml"), &o), 0) << o;
    expect_same_run(t / "acc", t / "one");
    expect_same_run(t / "acc", t / "cpu");
    // 2 ranks x 2 micro-batches of 2 rows
    ASSERT_EQ(train_test::run("-q " + (t / "acc2.yaml"), &o, mpirun_prefix(2)), 0) << o;
    expect_same_run(t / "acc2", t / "cpu");
    // 3 ranks x 2 micro-batches of 2 rows against one CPU batch of 12 (the emulator is given 3 devices;
    // real hardware needs 3 GPUs)
    std::string prefix = getenv("FSDP_EMU_DEVICES") ? "env FSDP_EMU_DEVICES=3 " + mpirun_prefix(3)
                         : gpu_count() >= 3         ? mpirun_prefix(3)
                                                    : "";
    if (prefix.empty()) {
        printf("[ TrainAccumGpu ] 3 ranks not run: %d GPU(s)\n", gpu_count());
        return;
    }
    write_file(t / "cpu12.yaml", recipe(12, "", t / "cpu12"));
    write_file(t / "acc3.yaml", recipe(12, "grad_accum: 2", t / "acc3", "cuda"));
    ASSERT_EQ(train_test::run("-q " + (t / "cpu12.yaml"), &o), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "acc3.yaml"), &o, prefix), 0) << o;
    expect_same_run(t / "acc3", t / "cpu12");
}

// The offloaded optimizer (moments in host memory) downloads each gradient once per step, after the
// last micro-batch's reduce-scatter.
TEST(TrainAccumGpu, OffloadedOptimizerWithAccumulationMatchesTheCpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    Dir t;
    std::string o;
    std::string r = recipe(8, "grad_accum: 4", t / "off", "cuda");
    r.replace(r.find("  - {id: t,"), 0, "  - {id: o, uses: offload}\n");
    write_file(t / "off.yaml", r);
    write_file(t / "cpu.yaml", recipe(8, "", t / "cpu"));
    ASSERT_EQ(train_test::run("-q " + (t / "cpu.yaml"), &o), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / "off.yaml"), &o), 0) << o;
    expect_same_run(t / "off", t / "cpu");
}
