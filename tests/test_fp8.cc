// FP8 weights on read (issue 30 item 4): DeepSeek-V3's block-scaled e4m3 weights (`<w>_scale_inv`, one
// float32 scale per 128 x 128 block) read as float32 or bfloat16 equal PyTorch's reference
// dequantisation bit for bit (tests/data/fp8, written by tools/gen/gen_fp8_fixture.py), at any rows; plain
// e4m3 / e5m2 tensors read as their values; `ckpt convert --dtype` dequantises and leaves the scales out.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "st_test_reader.h"
#include "test_util.h"

extern "C" {
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

const char *FP8 = "tests/data/fp8/fp8.safetensors";
const char *WANT = "tests/data/fp8/expected.safetensors";

// rows [r0, r1) of `name` from r as dt (raw bytes)
std::vector<unsigned char> rows(ckpt_reader *r, const std::string &name, int64_t r0, int64_t r1, fsdp_dtype dt) {
    long i = ckpt_find(r, name.c_str());
    EXPECT_GE(i, 0) << name;
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    int64_t per = e->ndim > 1 ? e->shape[1] : 1;
    std::vector<unsigned char> v((size_t)((r1 - r0) * per) * fsdp_dtype_size(dt));
    fsdp_err err;
    EXPECT_EQ(ckpt_read_rows(r, (size_t)i, r0, r1, v.data(), dt, &err), 0) << err.msg;
    return v;
}

}  // namespace

TEST(Fp8, BlockScaledWeightsDequantiseAsPyTorchDoes) {
    ckpt_reader *r = nullptr, *w = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(FP8, CKPT_AUTO, &r, &err), 0) << err.msg;
    ASSERT_EQ(ckpt_open(WANT, CKPT_AUTO, &w, &err), 0) << err.msg;
    for (std::string name : {"model.layers.0.mlp.experts.0.down_proj.weight", "model.layers.0.self_attn.q_b_proj.weight"}) {
        SCOPED_TRACE(name);
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)ckpt_find(r, name.c_str()));
        EXPECT_EQ(e->dtype, FSDP_DT_F8_E4M3FN);
        EXPECT_EQ(ckpt_entry_at(r, (size_t)ckpt_find(r, (name + "_scale_inv").c_str()))->fp8_scale, 1);
        int64_t m = e->shape[0];
        // every row, then row ranges that start and end inside blocks
        for (auto span : std::vector<std::pair<int64_t, int64_t>>{{0, m}, {130, m - 10 > 131 ? m - 10 : m}, {127, 129}}) {
            SCOPED_TRACE(span.first);
            EXPECT_EQ(rows(r, name, span.first, span.second, FSDP_DT_F32),
                      rows(w, name + ".f32", span.first, span.second, FSDP_DT_F32));
            EXPECT_EQ(rows(r, name, span.first, span.second, FSDP_DT_BF16),
                      rows(w, name + ".bf16", span.first, span.second, FSDP_DT_BF16));
        }
    }
    for (std::string name : {"plain_e4m3", "plain_e5m2"}) {
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)ckpt_find(r, name.c_str()));
        EXPECT_EQ(rows(r, name, 0, e->shape[0], FSDP_DT_F32), rows(w, name + ".f32", 0, e->shape[0], FSDP_DT_F32)) << name;
    }
    ckpt_close(r);
    ckpt_close(w);
}

TEST(Fp8, ConvertDequantisesAndLeavesTheScalesOut) {
    std::string t = make_tmpdir("fsdp-fp8"), out, dst = t + "/bf16.safetensors";
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + FP8 + " " + dst + " --dtype bf16", &out), 0) << out;
    std::map<std::string, st_test::Tensor> got, want;
    std::string why;
    ASSERT_TRUE(st_test::load(dst, &got, &why)) << why;
    ASSERT_TRUE(st_test::load(WANT, &want, &why)) << why;
    EXPECT_EQ(got.size(), 4u);
    EXPECT_FALSE(got.count("model.layers.0.mlp.experts.0.down_proj.weight_scale_inv"));
    EXPECT_EQ(got.at("model.layers.0.mlp.experts.0.down_proj.weight").f32,
              want.at("model.layers.0.mlp.experts.0.down_proj.weight.bf16").f32);
    // to a DCP checkpoint in float32: the same values
    std::string dcp = t + "/dcp";
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + FP8 + " " + dcp + " --to dcp --dtype f32", &out), 0) << out;
    ckpt_reader *r = nullptr, *w = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(dcp.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    ASSERT_EQ(ckpt_open(WANT, CKPT_AUTO, &w, &err), 0) << err.msg;
    EXPECT_LT(ckpt_find(r, "model.layers.0.self_attn.q_b_proj.weight_scale_inv"), 0);
    EXPECT_EQ(rows(r, "model.layers.0.self_attn.q_b_proj.weight", 0, 256, FSDP_DT_F32),
              rows(w, "model.layers.0.self_attn.q_b_proj.weight.f32", 0, 256, FSDP_DT_F32));
    ckpt_close(r);
    ckpt_close(w);
    // without --dtype the fp8 bytes and their scales are copied as they are
    std::string raw = t + "/raw.safetensors";
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + FP8 + " " + raw, &out), 0) << out;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt inspect " + raw, &out), 0) << out;
    EXPECT_NE(out.find("down_proj.weight_scale_inv"), std::string::npos) << out;
    EXPECT_NE(out.find("f8_e4m3fn"), std::string::npos) << out;
    rm_rf(t);
}

// An FP8 checkpoint as a model (`model: {from: F, dtype: bf16}`): its weights become bf16 parameters read
// dequantised, its block scales no parameters of their own, and a strict load takes them without an
// unexpected key; the values saved equal the reference's bf16 dequantisation. Without dtype the fp8
// tensors are refused, naming the way out.
TEST(Fp8, CheckpointLoadsAsADequantisedModel) {
    std::string t = make_tmpdir("fsdp-fp8"), out, st = t + "/m.safetensors";
    write_file(t + "/r.yaml", std::string("model: {from: ") + FP8 + ", dtype: bf16}\nstages:\n"
                              "  - {id: l, uses: load-ckpt, with: {path: " + FP8 + ", strict: true}}\n"
                              "  - {id: s, uses: save-safetensors, with: {path: " + st + "}}\n");
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + t + "/r.yaml", &out), 0) << out;
    std::map<std::string, st_test::Tensor> got, want;
    std::string why;
    ASSERT_TRUE(st_test::load(st, &got, &why)) << why;
    ASSERT_TRUE(st_test::load(WANT, &want, &why)) << why;
    EXPECT_EQ(got.size(), 4u);
    EXPECT_FALSE(got.count("model.layers.0.self_attn.q_b_proj.weight_scale_inv"));
    EXPECT_EQ(got.at("model.layers.0.self_attn.q_b_proj.weight").dtype, "BF16");
    EXPECT_EQ(got.at("model.layers.0.self_attn.q_b_proj.weight").f32,
              want.at("model.layers.0.self_attn.q_b_proj.weight.bf16").f32);
    write_file(t + "/n.yaml", std::string("model: {from: ") + FP8 + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                  FP8 + "}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + t + "/n.yaml", &out), 2) << out;
    EXPECT_NE(out.find("is f8_e4m3fn; a parameter is f32, bf16 or f16 (exclude it, or set dtype to convert it)"),
              std::string::npos)
        << out;
    rm_rf(t);
}
