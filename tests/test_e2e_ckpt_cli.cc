// fsdp-run ckpt inspect / convert / diff on the PyTorch fixtures.
#include <gtest/gtest.h>

#include "test_util.h"

using namespace fsdp_test;

TEST(E2ECkptCli, InspectConvertDiffRoundTrips) {
    std::string t = make_tmpdir("fsdp-ckcli"), out, bin = fsdp_run_bin() + " ckpt ";
    ASSERT_EQ(run_cmd(bin + "inspect " + tiny("dcp_full_ws3"), &out), 0) << out;
    EXPECT_NE(out.find("dcp checkpoint, 169 keys"), std::string::npos) << out;
    EXPECT_NE(out.find("train_state.step"), std::string::npos);
    ASSERT_EQ(run_cmd(bin + "inspect --json " + tiny("model_step5.pt"), &out), 0) << out;
    EXPECT_NE(out.find("\"format\": \"pt\""), std::string::npos) << out;
    // every fixture converted to DCP and to safetensors reads back identical
    for (const char *src : {"dcp_seed_ws1", "dcp_model_ws2", "model_step5.pt", "model.safetensors.index.json"}) {
        const char *want = std::string(src) == "dcp_seed_ws1" ? "model_init.safetensors" : "model_step5.safetensors";
        ASSERT_EQ(run_cmd(bin + "convert " + tiny(src) + " " + t + "/x.safetensors --overwrite", &out), 0) << out;
        ASSERT_EQ(run_cmd(bin + "diff " + t + "/x.safetensors " + tiny(want), &out), 0) << src << ": " << out;
        rm_rf(t + "/d");
        ASSERT_EQ(run_cmd(bin + "convert " + tiny(src) + " " + t + "/d --to dcp", &out), 0) << out;
        ASSERT_EQ(run_cmd(bin + "diff " + t + "/d " + tiny(want), &out), 0) << src << ": " << out;
    }
    // the dtypes checkpoint (bool, ints, f16, bf16, 0-d, empty, views) through safetensors
    ASSERT_EQ(run_cmd(bin + "convert " + tiny("dcp_dtypes") + " " + t + "/dt.safetensors", &out), 0) << out;
    // (the expectation file leaves out `empty` and `list_of_tensors`, and stores bool as u8)
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/dt.safetensors " + tiny("dcp_dtypes_expected.safetensors"), &out), 1);
    EXPECT_EQ(out.find("max abs diff"), std::string::npos) << out;
    EXPECT_EQ(out.find("shape"), std::string::npos) << out;
    EXPECT_NE(out.find("only in " + t + "/dt.safetensors: list_of_tensors.1"), std::string::npos) << out;
    // HF names both ways (q/k rows permuted and back), bf16 with a tolerance
    ASSERT_EQ(run_cmd(bin + "convert " + tiny("model_step5.pt") + " " + t + "/hf.safetensors --names hf --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    ASSERT_EQ(run_cmd(bin + "inspect " + t + "/hf.safetensors", &out), 0);
    EXPECT_NE(out.find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/hf.safetensors " + tiny("model_step5.safetensors"), &out), 1);
    ASSERT_EQ(run_cmd(bin + "convert " + t + "/hf.safetensors " + t + "/tt.safetensors --names torchtitan --n-heads 4 --n-kv-heads 2 --dtype bf16", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/tt.safetensors " + tiny("model_step5.safetensors"), &out), 1);
    EXPECT_EQ(run_cmd(bin + "diff --rtol 1e-2 --atol 1e-6 " + t + "/tt.safetensors " + tiny("model_step5.safetensors"), &out), 0) << out;
    // differences are reported
    EXPECT_EQ(run_cmd(bin + "diff " + tiny("model_init.safetensors") + " " + tiny("model_step5.safetensors"), &out), 1);
    EXPECT_NE(out.find("tok_embeddings.weight: max abs diff"), std::string::npos) << out;
    // errors: missing path, incomplete DCP, usage
    EXPECT_EQ(run_cmd(bin + "inspect /no/such/ckpt", &out), 1);
    EXPECT_NE(out.find("/no/such/ckpt"), std::string::npos);
    system(("mkdir -p " + t + "/inc && cp " + tiny("dcp_seed_ws1/__0_0.distcp") + " " + t + "/inc/").c_str());
    EXPECT_EQ(run_cmd(bin + "inspect " + t + "/inc", &out), 1);
    EXPECT_NE(out.find("incomplete"), std::string::npos) << out;
    EXPECT_EQ(run_cmd(bin + "frobnicate", &out), 2);
    rm_rf(t);
}
