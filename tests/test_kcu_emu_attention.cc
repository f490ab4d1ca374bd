// kernels/cuda/kcu_attention.cu (SIMT) and kcu_attention_tc.cu (tensor cores, reference WMMA) under
// the host emulation (tests/kcu_emu.h), through kcu_attention_forward/backward(_impl), against
// kc_attention_*: several query tiles with a partial last one, GQA, head dims that leave lanes idle.
#include "tests/kcu_emu_test.h"

namespace {

using namespace kcu_emu_test;
namespace dev = kcu_emu_dev;

struct AttnCase {
    int B, T, H, KV, hd;
};

std::string names(const std::vector<kcu_emu::LaunchRecord> &ls) {
    std::string s;
    for (auto &l : ls) s += l.kernel + " ";
    return s;
}

// Runs forward and backward with implementation `impl` in dtype dt; compares with the CPU kernels on
// the same (rounded) inputs, the backward's reference on the output the kernels stored.
// single_key: T 1, where dq and dk are zero up to rounding (checked absolutely instead).
void run_case(const AttnCase &a, fsdp_dtype dt, dev::kcu_attn_impl impl, double tol, const char *want_kernel,
              bool single_key = false) {
    SCOPED_TRACE("B " + std::to_string(a.B) + " T " + std::to_string(a.T) + " H " + std::to_string(a.H) + " KV " +
                 std::to_string(a.KV) + " hd " + std::to_string(a.hd) + " " + fsdp_dtype_name(dt));
    const size_t nq = (size_t)a.B * a.T * a.H * a.hd, nk = (size_t)a.B * a.T * a.KV * a.hd, nl = (size_t)a.B * a.H * a.T;
    auto q = round_to(randn(nq, 1 + a.T, 1.5f), dt), k = round_to(randn(nk, 2 + a.T), dt),
         v = round_to(randn(nk, 3 + a.T), dt), dout = round_to(randn(nq, 4 + a.T), dt);
    Buf Q(q, dt), K(k, dt), V(v, dt), DO(dout, dt), O(nq, dt), L(nl, FSDP_DT_F32), DQ(nq, dt), DK(nk, dt), DV(nk, dt),
        S(dev::kcu_attention_scratch_floats(a.B, a.T, a.H), FSDP_DT_F32);
    fsdp_err err;
    kcu_emu::take_launches();
    ASSERT_EQ(dev::kcu_attention_forward_impl(impl, dt, Q.ptr(), K.ptr(), V.ptr(), O.ptr(), L.f(), a.B, a.T, a.H, a.KV,
                                              a.hd, nullptr, &err),
              0)
        << err.msg;
    ASSERT_EQ(dev::kcu_attention_backward_impl(impl, dt, Q.ptr(), K.ptr(), V.ptr(), O.ptr(), L.f(), DO.ptr(), DQ.ptr(),
                                               DK.ptr(), DV.ptr(), a.B, a.T, a.H, a.KV, a.hd, S.f(), nullptr, &err),
              0)
        << err.msg;
    const std::string ran = names(kcu_emu::take_launches());
    EXPECT_NE(ran.find(want_kernel), std::string::npos) << ran;
    std::vector<float> out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    ASSERT_EQ(kc_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), a.B, a.T, a.H, a.KV, a.hd,
                                   nullptr, &err),
              0);
    const std::vector<float> got_out = O.get();
    ASSERT_EQ(kc_attention_backward(q.data(), k.data(), v.data(), got_out.data(), lse.data(), dout.data(), dq.data(),
                                    dk.data(), dv.data(), a.B, a.T, a.H, a.KV, a.hd, nullptr, &err),
              0);
    for (auto *b : {&O, &L, &DQ, &DK, &DV}) {
        EXPECT_EQ(nonfinite(b->get()), 0u);
        EXPECT_TRUE(b->guard_ok());
    }
    EXPECT_LT(rel_err(got_out, out), tol);
    EXPECT_LT(rel_err(L.get(), lse), 1e-5);
    if (single_key) {
        for (float x : DQ.get()) EXPECT_LT(std::fabs(x), 1e-2);
        for (float x : DK.get()) EXPECT_LT(std::fabs(x), 1e-2);
    } else {
        EXPECT_LT(rel_err(DQ.get(), dq), tol);
        EXPECT_LT(rel_err(DK.get(), dk), tol);
    }
    EXPECT_LT(rel_err(DV.get(), dv), tol);
}

// T 17: two 16-row tiles (the second with one row), one 32-key tile; hd 16: half the lanes of each
// 32-dim group idle.
TEST(KcuEmuAttention, SimtF32Gqa) { run_case({1, 17, 2, 1, 16}, FSDP_DT_F32, dev::KCU_ATTN_SIMT, 1e-5, "attn_fwd"); }
// T 36: two key tiles on the last query tile (online softmax rescaling); hd 40 (DPL 2, a partial
// second group of lanes).
TEST(KcuEmuAttention, SimtBf16TwoKeyTiles) {
    run_case({1, 36, 1, 1, 40}, FSDP_DT_BF16, dev::KCU_ATTN_AUTO, 1e-2, "attn_fwd");
}
// hd 96: DPL 4 (lanes 0..31 own dims d, d+32, d+64; the fourth group idle); hd 200: DPL 8.
TEST(KcuEmuAttention, SimtLargeHeadDims) {
    run_case({1, 3, 1, 1, 96}, FSDP_DT_F32, dev::KCU_ATTN_SIMT, 1e-5, "attn_fwd");
    run_case({1, 5, 1, 1, 200}, FSDP_DT_F32, dev::KCU_ATTN_SIMT, 1e-5, "attn_fwd");
}

// Tensor cores, chosen by AUTO for bf16 hd 64. T 70: two 64-row tiles, the second partial;
// diagonal tiles with skipped blocks; GQA 2 query heads per kv head.
TEST(KcuEmuAttention, TensorCoreHd64PartialTilesGqa) {
    run_case({1, 70, 4, 2, 64}, FSDP_DT_BF16, dev::KCU_ATTN_AUTO, 1e-2, "attn_tc_fwd");
}
// hd 128, B 2, T 17 (one partial tile: warps 2 and 3 hold only padding rows).
TEST(KcuEmuAttention, TensorCoreHd128OnePartialTile) {
    run_case({2, 17, 2, 1, 128}, FSDP_DT_BF16, dev::KCU_ATTN_TC, 1e-2, "attn_tc_fwd");
}
// T 1: a single key.
TEST(KcuEmuAttention, TensorCoreSingleToken) {
    run_case({1, 1, 2, 2, 64}, FSDP_DT_BF16, dev::KCU_ATTN_TC, 1e-2, "attn_tc_bwd_dkdv", true);
}

TEST(KcuEmuAttention, ImplChecks) {
    fsdp_err err;
    std::vector<float> buf(4096);
    void *p = buf.data();
    EXPECT_EQ(dev::kcu_attention_forward_impl(dev::KCU_ATTN_TC, FSDP_DT_F32, p, p, p, p, buf.data(), 1, 4, 1, 1, 64,
                                              nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_attention_forward_impl(dev::KCU_ATTN_TC, FSDP_DT_BF16, (char *)p + 2, p, p, p, buf.data(), 1, 4,
                                              1, 1, 64, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_attention_forward(FSDP_DT_F32, p, p, p, p, buf.data(), 1, 4, 3, 2, 64, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_attention_tc_supported(FSDP_DT_BF16, 128), 1);
    EXPECT_EQ(dev::kcu_attention_tc_supported(FSDP_DT_BF16, 96), 0);
}

} // namespace
