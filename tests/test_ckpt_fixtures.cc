// Every checkpoint PyTorch wrote under ../shared/fixtures/torch-2.11/tiny/ reads back with the
// exact values of its safetensors twin.
#include <gtest/gtest.h>

#include "ckpt_compare.h"
#include "test_util.h"

using namespace fsdp_test;

TEST(CkptFixtures, DcpSeedWs1EqualsModelInit) {
    Ckpt dcp(tiny("dcp_seed_ws1")), st(tiny("model_init.safetensors"));
    ASSERT_TRUE(dcp.r && st.r);
    EXPECT_EQ(ckpt_reader_format(dcp.r), CKPT_DCP);
    expect_same_tensors(dcp.r, st.r);
}

TEST(CkptFixtures, ShardedDcpEqualsModelStep5) {
    Ckpt ws2(tiny("dcp_model_ws2")), ws3(tiny("dcp_full_ws3")), st(tiny("model_step5.safetensors"));
    ASSERT_TRUE(ws2.r && ws3.r && st.r);
    expect_same_tensors(ws2.r, st.r);
    expect_same_tensors(ws3.r, st.r);
    const ckpt_entry *e = ckpt_entry_at(ws3.r, (size_t)ckpt_find(ws3.r, "tok_embeddings.weight"));
    EXPECT_EQ(e->chunks, 3);
}

TEST(CkptFixtures, OptimizerStateAndTrainState) {
    Ckpt ws3(tiny("dcp_full_ws3")), adam(tiny("adam_step5.safetensors"));
    ASSERT_TRUE(ws3.r && adam.r);
    expect_same_tensors(ws3.r, adam.r, "optimizer.state.", ".exp_avg", ".exp_avg");
    expect_same_tensors(ws3.r, adam.r, "optimizer.state.", ".exp_avg_sq", ".exp_avg_sq");
    auto step = tensor_bytes(ws3.r, "optimizer.state.output.weight.step", FSDP_DT_F64);
    double s;
    memcpy(&s, step.data(), 8);
    EXPECT_EQ(s, 5.0);
    int64_t ts = -1;
    long i = ckpt_find(ws3.r, "train_state.step");
    ASSERT_GE(i, 0);
    ASSERT_EQ(ckpt_value_int(ws3.r, (size_t)i, &ts), 0);
    EXPECT_EQ(ts, 5);
    long lr = ckpt_find(ws3.r, "optimizer.param_groups.norm.weight.lr");
    ASSERT_GE(lr, 0);
    EXPECT_STREQ(ckpt_value_text(ws3.r, (size_t)lr), "0.001");
    long betas = ckpt_find(ws3.r, "optimizer.param_groups.norm.weight.betas");
    ASSERT_GE(betas, 0);
    EXPECT_STREQ(ckpt_value_text(ws3.r, (size_t)betas), "(0.90000000000000002, 0.94999999999999996)");
}

TEST(CkptFixtures, DtypesCheckpoint) {
    Ckpt dcp(tiny("dcp_dtypes")), st(tiny("dcp_dtypes_expected.safetensors"));
    ASSERT_TRUE(dcp.r && st.r);
    expect_same_tensors(dcp.r, st.r);
    // bool is u8 in the expectation; 0-d scalar; empty tensor; list of tensors; byte items
    EXPECT_GE(ckpt_find(dcp.r, "list_of_tensors.0"), 0);
    EXPECT_GE(ckpt_find(dcp.r, "list_of_tensors.1"), 0);
    const ckpt_entry *empty = ckpt_entry_at(dcp.r, (size_t)ckpt_find(dcp.r, "empty"));
    EXPECT_EQ(empty->shape[0], 0);
    int64_t step = 0;
    ASSERT_EQ(ckpt_value_int(dcp.r, (size_t)ckpt_find(dcp.r, "train_state.step"), &step), 0);
    EXPECT_EQ(step, 123);
    EXPECT_STREQ(ckpt_value_text(dcp.r, (size_t)ckpt_find(dcp.r, "train_state.name")), "'tiny'");
}

TEST(CkptFixtures, TorchSaveAndHfShardsEqualModelStep5) {
    Ckpt pt(tiny("model_step5.pt")), hf(tiny("model.safetensors.index.json")), st(tiny("model_step5.safetensors"));
    ASSERT_TRUE(pt.r && hf.r && st.r);
    EXPECT_EQ(ckpt_reader_format(pt.r), CKPT_PT);
    expect_same_tensors(pt.r, st.r);
    expect_same_tensors(hf.r, st.r);
}

TEST(CkptFixtures, BoxesStraddlingChunks) {
    Ckpt ws3(tiny("dcp_full_ws3")), st(tiny("model_step5.safetensors"));
    long i = ckpt_find(ws3.r, "output.weight"), j = ckpt_find(st.r, "output.weight");
    ASSERT_GE(i, 0);
    std::vector<float> a(100 * 64), b(100 * 64);
    fsdp_err err;
    // rows 80..180 cross the 86- and 172-row chunk boundaries
    ASSERT_EQ(ckpt_read_rows(ws3.r, (size_t)i, 80, 180, a.data(), FSDP_DT_F32, &err), 0) << err.msg;
    ASSERT_EQ(ckpt_read_rows(st.r, (size_t)j, 80, 180, b.data(), FSDP_DT_F32, &err), 0) << err.msg;
    EXPECT_EQ(a, b);
    EXPECT_NE(ckpt_read_rows(ws3.r, (size_t)i, 200, 300, a.data(), FSDP_DT_F32, &err), 0);
}
