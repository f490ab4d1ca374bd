// The plugin API's collectives cannot be mismatched (api/api_agree.h, issue 39 item 1): every rank
// agrees on the call and its arguments on a channel of the plugin API's own before any payload moves.
// Each mistake of tests/plugins/coll_misuse.c, in a stage body and in a train-steps callback, ends a
// 3-rank job within seconds (under `timeout`: never a hang) with exit 1 and one message: what each rank
// passed, or the call, the ranks that made it and those that never did. On 1 rank none of them is a
// mistake: the same calls succeed and the run ends 0.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "test_util.h"
#include "train_run_util.h"

using namespace fsdp_test;
using train_test::Dir;

namespace {

struct Case {
    const char *name;
    const char *message;  // in the 3-rank job's output
    bool in_callback = true;  // structural calls are refused in a callback (tests/test_plugin_api.cc)
};

const std::vector<Case> kCases = {
    {"rank0-only", "fsdp_allreduce: call 0 of the plugin API's collectives: rank 0 waited 2 s "
                   "(runtime.collective_timeout) and rank(s) 1, 2 never made this call (ranks that did: 0)"},
    {"not-rank0", "and rank(s) 0 never made this call (ranks that did: 1, 2)"},
    {"count", "the ranks made different collective calls: rank 0 called fsdp_allreduce(1 element, f32, sum) "
              "(call 0); rank 1 called fsdp_allreduce(2 elements, f32, sum) (call 0); rank 2 called "
              "fsdp_allreduce(3 elements, f32, sum) (call 0)"},
    {"dtype", "rank 0 called fsdp_allreduce(2 elements, f32, sum) (call 0); ranks 1, 2 called "
              "fsdp_allreduce(2 elements, i32, sum) (call 0)"},
    {"root", "rank 0 called fsdp_broadcast(32 bytes, root 0) (call 0); rank 1 called fsdp_broadcast(32 bytes, "
             "root 1) (call 0); rank 2 called fsdp_broadcast(32 bytes, root 2) (call 0)"},
    {"kind", "rank 0 called fsdp_barrier() (call 0); ranks 1, 2 called fsdp_allreduce(1 element, f32, sum) (call 0)"},
    {"null-buffer", "ranks 0, 2 called fsdp_allreduce(4 elements, f32, sum) (call 0); rank 1 called fsdp_allreduce(4 "
             "elements, f32, sum, a NULL buffer) (call 0)"},
    {"add-shape", "rank 0 called fsdp_param_add(extra.bias, shape [4], f32, init 'zeros') (call 0); rank 1 called "
                  "fsdp_param_add(extra.bias, shape [5], f32, init 'zeros') (call 0)", false},
    {"add-rank0", "fsdp_param_add: call 0 of the plugin API's collectives: rank 0 waited 2 s "
                  "(runtime.collective_timeout) and rank(s) 1, 2 never made this call", false},
    {"gather-root", "rank 0 called fsdp_param_gather(parameter 0 tok_embeddings.weight, root 0) (call 0); rank 1 "
                    "called fsdp_param_gather(parameter 0 tok_embeddings.weight, root 1) (call 0)"},
};

std::string recipe(const Dir &t, const std::string &c, bool callback, bool train) {
    std::string r = t / ("r-" + c + (callback ? "-cb" : "") + ".yaml");
    write_file(r, "plugins: [" + std::string(FSDP_BUILD_DIR) + "/tests/plugins/libcoll_misuse.so]\n"
                  "runtime: {collective_timeout: 2}\nmodel: {preset: tiny}\n"
                  "data: {kind: synthetic, batch_size: 6, seq_len: 16}\nstages:\n"
                  "  - {id: i, uses: init-meta}\n"
                  "  - {id: m, uses: coll-misuse, after: [i], with: {case: " + c + ", callback: " +
                  (callback ? "true" : "false") + "}}\n" +
                  (train ? "  - {id: t, uses: train-steps, after: [m], with: {steps: 2}}\n" : ""));
    return r;
}

// Runs r on np ranks under `timeout 60`; the exit status, the output and the seconds it took.
int run_timed(int np, const std::string &r, std::string *out, double *secs) {
    auto t0 = std::chrono::steady_clock::now();
    int rc = run_cmd("timeout -k 10 60 " + (np > 1 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() + " -q " + r, out);
    *secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rc;
}

void expect_every_mistake_ends_the_job(bool callback) {
    Dir t;
    for (const Case &c : kCases) {
        if (callback && !c.in_callback) continue;
        SCOPED_TRACE(c.name);
        std::string r = recipe(t, c.name, callback, true), out;
        double secs = 0;
        int rc = run_timed(3, r, &out, &secs);
        EXPECT_NE(rc, 124) << "the job hung: " << out;
        EXPECT_EQ(rc, 1) << out;
        EXPECT_LT(secs, 30.0) << out;
        EXPECT_NE(out.find(c.message), std::string::npos) << out;
        EXPECT_EQ(out.find("Segmentation"), std::string::npos) << out;
        if (callback) {
            EXPECT_NE(out.find("callback 'misuse' at step 1"), std::string::npos) << out;
        }
        // on 1 rank the same calls are right
        rc = run_timed(1, r, &out, &secs);
        EXPECT_EQ(rc, 0) << out;
    }
}

}  // namespace

TEST(PluginCollectives, EveryMistakeInAStageEndsEveryRankWithOneMessage) { expect_every_mistake_ends_the_job(false); }

TEST(PluginCollectives, EveryMistakeInACallbackEndsEveryRankWithOneMessage) { expect_every_mistake_ends_the_job(true); }

// A rank that never calls, in a callback: the ranks that wait in the trainer's own agreement on the
// callbacks' results learn rank 0's message (not "a callback failed on rank -1").
TEST(PluginCollectives, EveryRankSaysWhichRankWaitedForWhat) {
    Dir t;
    std::string r = recipe(t, "rank0-only", true, true), out;
    double secs = 0;
    EXPECT_EQ(run_timed(3, r, &out, &secs), 1) << out;
    for (int rank : {1, 2})
        EXPECT_NE(out.find("[r" + std::to_string(rank)), std::string::npos) << out;
    EXPECT_NE(out.find("train-steps: rank 0: callback 'misuse' at step 1"), std::string::npos) << out;
    EXPECT_EQ(out.find("rank -1"), std::string::npos) << out;
}

// Rows given on rank 0 only (the others pass NULL) are not a mistake: rank 0's are read, on 1 and 3 ranks.
TEST(PluginCollectives, ResizeReadsTheGivenRowsOfRankZeroOnly) {
    Dir t;
    std::string r = recipe(t, "resize-given", false, false), out;
    for (int np : {1, 3}) {
        double secs = 0;
        EXPECT_EQ(run_timed(np, r, &out, &secs), 0) << np << " ranks: " << out;
    }
}

// runtime.collective_timeout is checked before the run.
TEST(PluginCollectives, CollectiveTimeoutMustBePositive) {
    Dir t;
    std::string r = t / "bad.yaml", out;
    write_file(r, "runtime: {collective_timeout: 0}\nstages:\n  - {id: i, uses: init-meta}\n");
    int rc = run_cmd(fsdp_run_bin() + " validate " + r, &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("runtime.collective_timeout: expected seconds in (0, 86400], got 0"), std::string::npos) << out;
}

// After a timeout the channel is broken: a later call on that rank fails at once with the reason.
TEST(PluginCollectives, ACallAfterATimeoutFailsAtOnce) {
    Dir t;
    std::string r = recipe(t, "rank0-again", false, false), out;
    double secs = 0;
    EXPECT_EQ(run_timed(3, r, &out, &secs), 1) << out;
    EXPECT_LT(secs, 30.0) << out;
    EXPECT_NE(out.find("fsdp_barrier: an earlier collective of the plugin API failed (exchange 0 timed out after "),
              std::string::npos) << out;
    EXPECT_EQ(run_timed(1, r, &out, &secs), 0) << out;
}
