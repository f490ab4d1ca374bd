// Issue 17, item 4: a DCP that fsdp-run saves after training carries every entry a strict
// torch.distributed.checkpoint load + set_state_dict (flattened) into torch.optim.AdamW and a
// LambdaLR, and torchtitan's checkpointer, need: per parameter the whole AdamW param group (lr,
// betas, eps, weight_decay, amsgrad, maximize, foreach, capturable, differentiable, fused,
// decoupled_weight_decay, initial_lr), lr_scheduler.* as torch 2.11's LambdaLR.state_dict() holds
// it (lr_lambdas as a plain lambda's [None]), and dataloader.dp_rank_<r> / world_size.
// Before: param groups held lr, betas, eps and weight_decay only; no lr_scheduler.* or dataloader.*.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-resume");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

const char *RECIPE_HEAD =
    "model: {preset: tiny}\n"
    "data: {kind: text, path: data/quickstart.txt, batch_size: 4, seq_len: 32}\n"
    "stages:\n";

// lr 2e-3, warmup 2, linear decay to 0.1 * lr at step 3: after 3 steps the next lr is 0.1 * lr
const double PEAK = 2e-3, NEXT = 2e-3 * (1 - (1 - 0.1) * 1.0);

struct Ckpt {
    ckpt_reader *r = nullptr;
    explicit Ckpt(const std::string &p) {
        fsdp_err err;
        EXPECT_EQ(ckpt_open(p.c_str(), CKPT_DCP, &r, &err), 0) << err.msg;
    }
    ~Ckpt() {
        if (r) ckpt_close(r);
    }
    std::string value(const std::string &k) const {
        long i = ckpt_find(r, k.c_str());
        if (i < 0) return "(absent)";
        const char *t;
        fsdp_err err;
        return ckpt_value(r, (size_t)i, &t, &err) ? std::string("(error) ") + err.msg : std::string(t);
    }
    double num(const std::string &k) const {
        std::string v = value(k);
        size_t p = v.find_first_of("-0123456789.");
        return p == std::string::npos ? NAN : strtod(v.c_str() + p, nullptr);
    }
};

std::vector<std::string> params(const Ckpt &c) {
    std::vector<std::string> v;
    for (size_t i = 0; i < ckpt_count(c.r); i++) {
        const ckpt_entry *e = ckpt_entry_at(c.r, i);
        if (e->is_tensor && strncmp(e->name, "optimizer.", 10) && strncmp(e->name, "train_state.", 12))
            v.push_back(e->name);
    }
    return v;
}

void expect_resume_entries(const Ckpt &c, int64_t steps, int world, const std::string &what) {
    ASSERT_TRUE(c.r) << what;
    std::vector<std::string> ps = params(c);
    ASSERT_GT(ps.size(), 5u) << what;
    for (const std::string &p : ps) {
        std::string g = "optimizer.param_groups." + p + ".";
        EXPECT_NEAR(c.num(g + "lr"), NEXT, 1e-15) << what << g;
        EXPECT_NEAR(c.num(g + "initial_lr"), PEAK, 1e-15) << what << g;
        EXPECT_EQ(c.value(g + "betas"), "(0.90000000000000002, 0.94999999999999996)") << what << g;
        EXPECT_EQ(c.num(g + "eps"), 1e-8) << what << g;
        EXPECT_EQ(c.num(g + "weight_decay"), 0.1) << what << g;
        for (const char *k : {"amsgrad", "maximize", "capturable", "differentiable"})
            EXPECT_EQ(c.value(g + k), "False") << what << g << k;
        EXPECT_EQ(c.value(g + "decoupled_weight_decay"), "True") << what << g;
        EXPECT_EQ(c.value(g + "foreach"), "None") << what << g;
        EXPECT_EQ(c.value(g + "fused"), "None") << what << g;
        for (const char *k : {"exp_avg", "exp_avg_sq", "step"})
            EXPECT_GE(ckpt_find(c.r, ("optimizer.state." + p + "." + k).c_str()), 0) << what << p << k;
    }
    // exactly those twelve keys per parameter: nothing a strict load would find unexpected
    size_t groups = 0;
    for (size_t i = 0; i < ckpt_count(c.r); i++) groups += !strncmp(ckpt_entry_at(c.r, i)->name, "optimizer.param_groups.", 23);
    EXPECT_EQ(groups, 12 * ps.size()) << what;
    EXPECT_EQ(c.value("lr_scheduler.base_lrs"), "[0.002]") << what;
    EXPECT_EQ(c.num("lr_scheduler.last_epoch"), (double)steps) << what;
    EXPECT_EQ(c.num("lr_scheduler._step_count"), (double)steps + 1) << what;
    EXPECT_EQ(c.value("lr_scheduler._is_initial"), "False") << what;
    EXPECT_EQ(c.value("lr_scheduler._get_lr_called_within_step"), "False") << what;
    EXPECT_NEAR(c.num("lr_scheduler._last_lr"), NEXT, 1e-15) << what;
    // issue 26 item 19: a LambdaLR over a plain lambda has lr_lambdas [None] (a strict load needs it)
    EXPECT_EQ(c.value("lr_scheduler.lr_lambdas"), "[None]") << what;
    EXPECT_EQ(c.num("dataloader.world_size"), (double)world) << what;
    for (int r = 0; r < world; r++)
        EXPECT_NE(c.value("dataloader.dp_rank_" + std::to_string(r)), "(absent)") << what << " rank " << r;
    EXPECT_EQ(c.num("train_state.step"), (double)steps) << what;
}

}  // namespace

TEST(ResumeEntries, TrainedCheckpointCarriesWhatPyTorchResumesStrictly) {
    Dir t;
    write_file(t / "r.yaml", std::string(RECIPE_HEAD) +
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 3, lr: 2e-3, warmup_steps: 2, decay: "
                                 "linear, min_lr_ratio: 0.1}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + (t / "ck") + "}}\n");
    std::string out;
    ASSERT_EQ(run_cmd("timeout -k 10 300 " + fsdp_run_bin() + " -q " + (t / "r.yaml"), &out), 0) << out;
    Ckpt c(t / "ck");
    expect_resume_entries(c, 3, 1, "after training: ");
}

TEST(ResumeEntries, LoadCkptKeepsTheScheduleForTheNextSave) {
    // load-ckpt reads initial_lr / lr back: a checkpoint loaded and saved again without training
    // carries the same schedule (before: the re-save had no schedule to write)
    Dir t;
    write_file(t / "r.yaml", std::string(RECIPE_HEAD) +
                                 "  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 3, lr: 2e-3, warmup_steps: 2, decay: "
                                 "linear, min_lr_ratio: 0.1}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + (t / "ck") + "}}\n");
    write_file(t / "l.yaml", std::string(RECIPE_HEAD) + "  - {id: l, uses: load-ckpt, with: {path: " + (t / "ck") +
                                 "}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "again") + "}}\n");
    std::string out;
    ASSERT_EQ(run_cmd("timeout -k 10 300 " + fsdp_run_bin() + " -q " + (t / "r.yaml"), &out), 0) << out;
    ASSERT_EQ(run_cmd("timeout -k 10 300 " + fsdp_run_bin() + " -q " + (t / "l.yaml"), &out), 0) << out;
    Ckpt c(t / "again");
    expect_resume_entries(c, 3, 1, "loaded and saved again: ");
}
