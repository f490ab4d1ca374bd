// save-dcp `layout: NAME`: the state written straight in a trainer's layout (stages/save_layout.c), on 1 and 2 ranks:
// read back into fsdp-run's layout it is the plain save of the same run, tensor for tensor; nothing of the staging
// is left; what does not go with a layout is refused at validation, naming the value.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckpt_compare.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-save-layout");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

struct Case {
    const char *layout, *options; // options: the save-dcp `options:` map's body
};
const Case kCases[] = {
    {"torchtitan-0.3", ""},      {"olmo-core-3", ""},
    {"fms-1.13", ""},            {"megatron-fsdp-0.6", ""},
    {"accelerate-1.15", ""},     {"olmo-0.6", "max_grad_norm: 1.0"},
    {"deepspeed-zero2", "gradient_clipping: 1.0"}, {"deepspeed-zero3", ""},
};

int ckpt_cmd(const std::string &args, std::string *out) { return run_cmd(fsdp_run_bin() + " ckpt " + args, out); }

std::string dir_of(const std::string &t, const Case &c) { return t + "/" + c.layout; }

// The trainer fixtures' recipe: 2 AdamW steps, a plain save and one save per layout.
std::string recipe(const std::string &t) {
    std::string r = "model: {preset: tiny}\ndata: {kind: safetensors, path: tests/data/trainers/torchtitan-0.3/"
                    "batch.safetensors, batch_size: 4, seq_len: 32}\nstages:\n  - {id: i, uses: init-meta}\n"
                    "  - {id: t, uses: train-steps, with: {steps: 2, lr: 1e-3, decay: none, max_grad_norm: 1.0}}\n"
                    "  - {id: plain, uses: save-dcp, with: {path: " + t + "/plain}}\n";
    int k = 0;
    for (const Case &c : kCases)
        r += "  - {id: s" + std::to_string(k++) + ", uses: save-dcp, with: {path: " + dir_of(t, c) + ", layout: " +
             c.layout + (*c.options ? std::string(", options: {") + c.options + "}" : "") + "}}\n";
    return r;
}

TEST(SaveDcpLayout, EachLayoutReadsBackAsThePlainSave) {
    for (int np : {1, 2}) {
        Dir t;
        write_file(t / "r.yaml", recipe(t.d));
        int rc;
        std::string log = run_np(np, t / "r.yaml", &rc);
        ASSERT_EQ(rc, 0) << log;
        for (const Case &c : kCases) {
            std::string out, back = dir_of(t.d, c) + "_canon";
            EXPECT_FALSE(exists(dir_of(t.d, c) + ".fsdp-canon")) << "staging left: " << c.layout;
            if (strncmp(c.layout, "deepspeed", 9)) { // inspect names a trainer's layout (DeepSpeed: its files)
                ASSERT_EQ(ckpt_cmd("inspect " + dir_of(t.d, c), &out), 0) << out;
                EXPECT_NE(out.find(std::string("layout: ") + c.layout + " ("), std::string::npos) << out;
            }
            ASSERT_EQ(ckpt_cmd("convert " + dir_of(t.d, c) + " " + back + " --from auto --n-heads 4 --n-kv-heads 2", &out), 0)
                << c.layout << ": " << out;
            Ckpt a(t / "plain"), b(back);
            ASSERT_TRUE(a.r && b.r) << c.layout;
            expect_same_tensors(b.r, a.r); // every tensor of the plain save, bit for bit
            expect_same_tensors(a.r, b.r);
        }
        // DeepSpeed's files are those of the run's world, and convert --to writes the same bytes
        std::string out, conv = t / "conv";
        ASSERT_EQ(ckpt_cmd("convert " + (t / "plain") + " " + conv + " --to deepspeed-zero2 --world " + std::to_string(np) +
                           " --n-heads 4 --n-kv-heads 2 --option gradient_clipping=1.0", &out), 0) << out;
        for (int r = 0; r < np; r++) {
            std::string f = "/global_step2/zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
            Ckpt x(conv + f), y(t / "deepspeed-zero2" + f);
            ASSERT_TRUE(x.r && y.r) << f;
            expect_same_tensors(y.r, x.r);
        }
    }
}

int validate(const std::string &t, const std::string &save_with, std::string *out) {
    write_file(t + "/v.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                              "  - {id: s, uses: save-dcp, with: {path: " + t + "/out, " + save_with + "}}\n");
    return run_cmd(fsdp_run_bin() + " validate " + t + "/v.yaml", out);
}

TEST(SaveDcpLayout, WhatDoesNotGoWithALayoutIsRefusedAtValidation) {
    Dir t;
    std::string out;
    EXPECT_EQ(validate(t.d, "layout: nonsense", &out), 2) << out;
    EXPECT_NE(out.find("layout: 'nonsense' is none of torchtitan-0.2"), std::string::npos) << out;
    EXPECT_EQ(validate(t.d, "layout: olmo-core-3, async: true", &out), 2) << out;
    EXPECT_NE(out.find("async does not go with layout:"), std::string::npos) << out;
    EXPECT_EQ(validate(t.d, "layout: fms-1.13, prefix: 'model.'", &out), 2) << out;
    EXPECT_NE(out.find("prefix does not go with layout:"), std::string::npos) << out;
    EXPECT_EQ(validate(t.d, "options: {max_grad_norm: 1.0}", &out), 2) << out;
    EXPECT_NE(out.find("options: are settings of a layout"), std::string::npos) << out;
    EXPECT_EQ(validate(t.d, "layout: olmo-core-3, options: {max_grad_norm: 1.0}", &out), 2) << out;
    EXPECT_NE(out.find("layout olmo-core-3 keeps no such setting"), std::string::npos) << out;
    EXPECT_EQ(validate(t.d, "layout: deepspeed-zero2, options: {sub_group_size: 5}", &out), 2) << out;
    EXPECT_EQ(validate(t.d, "layout: deepspeed-zero3, options: {sub_group_size: 5}", &out), 0) << out;
    EXPECT_EQ(validate(t.d, "layout: olmo-0.6, options: {max_grad_norm: 1.0}", &out), 0) << out;
}

// A layout that needs a setting the state lacks fails the run naming it, with nothing at the path and no staging left.
TEST(SaveDcpLayout, AMissingSettingFailsTheSaveLeavingNothing) {
    Dir t;
    for (const char *layout : {"olmo-0.6", "deepspeed-zero2"}) {
        write_file(t / "r.yaml", "model: {preset: tiny}\ndata: {kind: safetensors, path: tests/data/trainers/torchtitan-0.3/"
                                 "batch.safetensors, batch_size: 4, seq_len: 32}\nstages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 1}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + (t / "out") + ", layout: " + layout + "}}\n");
        int rc;
        std::string log = run_np(2, t / "r.yaml", &rc);
        EXPECT_EQ(rc, 1) << log;
        EXPECT_NE(log.find(!strcmp(layout, "olmo-0.6") ? "needs param-group option max_grad_norm"
                                                       : "pass --option gradient_clipping=VALUE (save-dcp: options:"),
                  std::string::npos) << log;
        EXPECT_FALSE(exists(t / "out")) << layout;
        EXPECT_FALSE(exists(t / "out.fsdp-canon")) << layout;
        EXPECT_FALSE(exists(t / "out.partial")) << layout;
    }
    // OLMo's optim.pt needs an optimizer state: a model without one is refused, nothing left
    write_file(t / "r.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: s, uses: save-dcp, with: {path: " + (t / "out") + ", layout: olmo-0.6}}\n");
    int rc;
    std::string log = run_np(2, t / "r.yaml", &rc);
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find("nothing to write into"), std::string::npos) << log;
    EXPECT_FALSE(exists(t / "out"));
    EXPECT_FALSE(exists(t / "out.partial"));
}

} // namespace
