// The tensor-core attention kernels of kernels/cuda/kcu_attention_tc.cu, compiled as host C++ and run
// on the emulation of tests/kcu_tc_emu.h (128 threads per block, real barriers, reference WMMA with
// alignment, leading-dimension and shared-memory bounds checks), against the CPU reference
// kc_attention_* on the same bf16 values. Runs everywhere, GPU or not: it tests the kernels' tiling,
// indexing, masking, synchronisation and shared-memory layout; the GPU tests
// (test_cuda_attention_tc.cc) test the same code compiled by nvcc on the hardware.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kc.h"
#include "tests/kcu_tc_emu.h"

#define KCU_TC_EMULATE 1
#include "kernels/cuda/kcu_attention_tc.cu"

namespace {

struct EmuCase {
    int B, T, H, KV, hd;
};

std::vector<uint16_t> rand_bf16(size_t n, unsigned seed, float scale) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<uint16_t> v(n);
    for (auto &e : v) e = kcu_tc_emu::f2bf(d(g));
    return v;
}

std::vector<float> widen(const std::vector<uint16_t> &v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); i++) f[i] = kcu_tc_emu::bf2f(v[i]);
    return f;
}

// ||a - b|| / max(||b||, 1e-2 sqrt(n)), as test_cuda_attention_tc.cc
double rel_norm(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return std::sqrt(num) / std::max(std::sqrt(den), 1e-2 * std::sqrt((double)b.size()));
}

bool all_finite(const std::vector<float> &v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

template <int HD>
void run_case(const EmuCase &a) {
    typedef tc_cfg<HD> C;
    const int B = a.B, T = a.T, H = a.H, KV = a.KV;
    const size_t nq = (size_t)B * T * H * HD, nk = (size_t)B * T * KV * HD, nl = (size_t)B * H * T;
    const std::vector<uint16_t> q = rand_bf16(nq, 10 + T, 1.5f), k = rand_bf16(nk, 20 + T, 1.0f),
                                v = rand_bf16(nk, 30 + T, 1.0f), dout = rand_bf16(nq, 40 + T, 1.0f);
    // NaN poison: an element no kernel writes stays non-finite
    std::vector<uint16_t> out(nq, 0xffffu), dq(nq, 0xffffu), dk(nk, 0xffffu), dv(nk, 0xffffu);
    std::vector<float> lse(nl, NAN);
    const float scale = (float)(1.0 / std::sqrt((double)HD)), sl2 = (float)(1.4426950408889634 / std::sqrt((double)HD));
    const unsigned nt = (unsigned)((T + TC_BR - 1) / TC_BR);

    std::string e = kcu_tc_emu::launch(nt, H, B, C::FWD_SMEM, [&] {
        attn_tc_fwd<HD>(q.data(), k.data(), v.data(), out.data(), lse.data(), T, H, KV, sl2);
    });
    ASSERT_EQ(e, "") << "forward";
    const std::vector<float> outf = widen(out);
    std::vector<float> D(nl); // rowsum(dO * O), as attn_bwd_dot
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const size_t off = (((size_t)b * T + t) * H + h) * HD;
                float s = 0.0f;
                for (int d = 0; d < HD; d++) s += kcu_tc_emu::bf2f(dout[off + d]) * outf[off + d];
                D[((size_t)b * H + h) * T + t] = s;
            }
    e = kcu_tc_emu::launch(nt, H, B, C::DQ_SMEM, [&] {
        attn_tc_bwd_dq<HD>(q.data(), k.data(), v.data(), lse.data(), D.data(), dout.data(), dq.data(), T, H, KV, scale,
                           sl2);
    });
    ASSERT_EQ(e, "") << "backward dq";
    e = kcu_tc_emu::launch(nt, KV, B, C::DKDV_SMEM, [&] {
        attn_tc_bwd_dkdv<HD>(q.data(), k.data(), v.data(), lse.data(), D.data(), dout.data(), dk.data(), dv.data(), T,
                             H, KV, scale, sl2);
    });
    ASSERT_EQ(e, "") << "backward dk dv";

    const std::vector<float> qf = widen(q), kf = widen(k), vf = widen(v), dof = widen(dout);
    std::vector<float> ro(nq), rl(nl), rdq(nq), rdk(nk), rdv(nk);
    fsdp_err err;
    ASSERT_EQ(kc_attention_forward(qf.data(), kf.data(), vf.data(), ro.data(), rl.data(), B, T, H, KV, HD, nullptr,
                                   &err),
              0)
        << err.msg;
    ASSERT_EQ(kc_attention_backward(qf.data(), kf.data(), vf.data(), outf.data(), lse.data(), dof.data(), rdq.data(),
                                    rdk.data(), rdv.data(), B, T, H, KV, HD, nullptr, &err),
              0)
        << err.msg;
    const std::vector<float> dqf = widen(dq), dkf = widen(dk), dvf = widen(dv);
    EXPECT_TRUE(all_finite(outf));
    EXPECT_TRUE(all_finite(lse));
    EXPECT_TRUE(all_finite(dqf));
    EXPECT_TRUE(all_finite(dkf));
    EXPECT_TRUE(all_finite(dvf));
    double lmax = 0.0;
    for (size_t i = 0; i < nl; i++) lmax = std::max(lmax, std::fabs((double)lse[i] - (double)rl[i]));
    EXPECT_LE(lmax, 1e-3);
    EXPECT_LE(rel_norm(outf, ro), 1e-2);
    EXPECT_LE(rel_norm(dqf, rdq), 1e-2);
    EXPECT_LE(rel_norm(dkf, rdk), 1e-2);
    EXPECT_LE(rel_norm(dvf, rdv), 1e-2);
}

// T = 70: two tiles, the second partial (rows and keys past T), diagonal tiles with skipped blocks;
// GQA with 2 query heads per kv head.
TEST(KcuAttentionTcEmu, HeadDim64PartialTilesGqa) { run_case<64>({1, 70, 4, 2, 64}); }

// hd 128, B 2, T 17 (one partial tile: warps 2 and 3 hold only padding rows), every query head on one kv head.
TEST(KcuAttentionTcEmu, HeadDim128OnePartialTile) { run_case<128>({2, 17, 2, 1, 128}); }

// T = 1: a single key, dq and dk exactly zero up to rounding.
TEST(KcuAttentionTcEmu, SingleToken) { run_case<64>({1, 1, 2, 2, 64}); }

} // namespace
