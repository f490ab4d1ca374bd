// kernels/cuda/kcu_optim.cu under the host emulation (tests/kcu_emu.h): the multi-tensor AdamW step,
// gradient sum of squares and scaling through kcu_tensor_list, bit-exact against kc_adamw_step, with
// empty tensors (first, between, last), tensors of several 4096-element chunks and a partial last chunk.
#include "tests/kcu_emu_test.h"

namespace {

using namespace kcu_emu_test;
namespace dev = kcu_emu_dev;

TEST(KcuEmuOptim, AdamWMultiTensorIsBitExact) {
    for (double beta1 : {0.9, 0.3}) { // both branches of torch's lerp
        const int64_t sizes[] = {0, 300, 0, 4097, 1, 0}; // empty tensors first, between and last
        std::vector<std::vector<float>> p, g, m, v, dp, dg, dm, dv;
        unsigned seed = 1;
        for (int64_t n : sizes) {
            p.push_back(randn(n, seed++));
            g.push_back(randn(n, seed++, 0.01f));
            m.push_back(randn(n, seed++, 0.001f));
            v.push_back(randn(n, seed++, 0.001f));
            for (auto &x : v.back()) x = x * x;
        }
        dp = p, dg = g, dm = m, dv = v;
        std::vector<dev::kcu_tensor> ts;
        for (size_t t = 0; t < p.size(); t++) ts.push_back({dp[t].data(), dg[t].data(), dm[t].data(), dv[t].data(), sizes[t]});
        fsdp_err err;
        dev::kcu_tensor_list *l = nullptr;
        ASSERT_EQ(dev::kcu_tensor_list_create(ts.data(), (int)ts.size(), &l, &err), 0) << err.msg;
        kc_adamw_hparams h = {3e-3, beta1, 0.95, 1e-8, 0.1};
        launches();
        for (int64_t step = 1; step <= 2; step++) {
            ASSERT_EQ(dev::kcu_adamw_step(l, &h, step, nullptr, &err), 0) << err.msg;
            for (size_t t = 0; t < ts.size(); t++)
                kc_adamw_step(p[t].data(), g[t].data(), m[t].data(), v[t].data(), sizes[t], &h, step);
        }
        EXPECT_EQ(max_blocks(launches()), 4u); // 0 + 1 + 0 + 2 + 1 + 0 chunks
        for (size_t t = 0; t < ts.size(); t++)
            for (int64_t i = 0; i < sizes[t]; i++) {
                ASSERT_EQ(memcmp(&dp[t][i], &p[t][i], 4), 0) << "param " << t << "[" << i << "]";
                ASSERT_EQ(memcmp(&dm[t][i], &m[t][i], 4), 0) << "exp_avg " << t << "[" << i << "]";
                ASSERT_EQ(memcmp(&dv[t][i], &v[t][i], 4), 0) << "exp_avg_sq " << t << "[" << i << "]";
            }
        double s = NAN;
        ASSERT_EQ(dev::kcu_list_grad_sumsq(l, &s, nullptr, &err), 0) << err.msg;
        double ref = 0;
        for (size_t t = 0; t < ts.size(); t++) ref += kc_sumsq(g[t].data(), sizes[t]);
        EXPECT_NEAR(s, ref, 1e-12 * ref);
        const float coef = (float)kc_clip_coef(std::sqrt(ref), 0.01);
        ASSERT_EQ(dev::kcu_list_grad_scale(l, coef, nullptr, &err), 0) << err.msg;
        for (size_t t = 0; t < ts.size(); t++) {
            kc_scale(g[t].data(), sizes[t], coef);
            EXPECT_EQ(dg[t], g[t]) << t;
        }
        dev::kcu_tensor_list_free(l);
    }
    EXPECT_EQ(kcu_emu::live_allocs(), 0);
}

// Clipping on the device: the coefficient of kc_clip_coef from the all-reduced statistics, the
// scaling by it, and the guard that makes a non-finite step change nothing.
TEST(KcuEmuOptim, DeviceClipCoefScaleAndNonFiniteGuard) {
    const int64_t sizes[] = {300, 0, 4097};
    std::vector<std::vector<float>> p, g, m, v;
    unsigned seed = 11;
    for (int64_t n : sizes) {
        p.push_back(randn(n, seed++));
        g.push_back(randn(n, seed++, 0.5f));
        m.push_back(randn(n, seed++, 0.001f));
        v.push_back(randn(n, seed++, 0.001f));
        for (auto &x : v.back()) x = x * x;
    }
    auto dp = p, dg = g, dm = m, dv = v;
    std::vector<dev::kcu_tensor> ts;
    for (size_t t = 0; t < p.size(); t++) ts.push_back({dp[t].data(), dg[t].data(), dm[t].data(), dv[t].data(), sizes[t]});
    fsdp_err err;
    dev::kcu_tensor_list *l = nullptr;
    ASSERT_EQ(dev::kcu_tensor_list_create(ts.data(), (int)ts.size(), &l, &err), 0) << err.msg;
    double sumsq = 0;
    for (size_t t = 0; t < ts.size(); t++) sumsq += kc_sumsq(g[t].data(), sizes[t]);
    const double norm = std::sqrt(sumsq);
    float clip[2] = {NAN, NAN};
    // no clipping needed, clipping off, clipping
    for (double max_norm : {10 * norm, 0.0, 0.1 * norm}) {
        double stats[2] = {3.5, sumsq};
        ASSERT_EQ(dev::kcu_clip_coef(stats, max_norm, clip, nullptr, &err), 0) << err.msg;
        const double ref = max_norm > 0 ? kc_clip_coef(norm, max_norm) : 1.0;
        EXPECT_EQ(clip[0], (float)ref) << max_norm;
        EXPECT_EQ(clip[1], 0.0f);
    }
    ASSERT_LT(clip[0], 1.0f);
    ASSERT_EQ(dev::kcu_list_grad_scale_dev(l, clip, nullptr, &err), 0) << err.msg;
    for (size_t t = 0; t < ts.size(); t++) {
        kc_scale(g[t].data(), sizes[t], clip[0]);
        EXPECT_EQ(dg[t], g[t]) << t;
    }
    kc_adamw_hparams h = {3e-3, 0.9, 0.95, 1e-8, 0.1};
    ASSERT_EQ(dev::kcu_adamw_step_guarded(l, &h, 1, clip, nullptr, &err), 0) << err.msg;
    for (size_t t = 0; t < ts.size(); t++) {
        kc_adamw_step(p[t].data(), g[t].data(), m[t].data(), v[t].data(), sizes[t], &h, 1);
        EXPECT_EQ(dp[t], p[t]) << t;
        EXPECT_EQ(dm[t], m[t]) << t;
    }
    // a non-finite loss sum, a non-finite norm and a negative sum of squares: flagged, nothing changes
    for (int k = 0; k < 3; k++) {
        double stats[2] = {k == 0 ? NAN : 1.0, k == 1 ? INFINITY : k == 2 ? -1.0 : sumsq};
        ASSERT_EQ(dev::kcu_clip_coef(stats, 0.01, clip, nullptr, &err), 0) << err.msg;
        EXPECT_EQ(clip[1], 1.0f) << k;
        EXPECT_EQ(clip[0], 1.0f) << k;
        clip[0] = 0.5f; // even with a coefficient below 1, the guard wins
        ASSERT_EQ(dev::kcu_list_grad_scale_dev(l, clip, nullptr, &err), 0);
        ASSERT_EQ(dev::kcu_adamw_step_guarded(l, &h, 2, clip, nullptr, &err), 0);
        for (size_t t = 0; t < ts.size(); t++) {
            EXPECT_EQ(dg[t], g[t]) << t;
            EXPECT_EQ(dp[t], p[t]) << t;
            EXPECT_EQ(dm[t], m[t]) << t;
            EXPECT_EQ(dv[t], v[t]) << t;
        }
    }
    EXPECT_EQ(dev::kcu_clip_coef(nullptr, 1.0, clip, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_list_grad_scale_dev(l, nullptr, nullptr, &err), FSDP_E_INVALID);
    dev::kcu_tensor_list_free(l);
    EXPECT_EQ(kcu_emu::live_allocs(), 0);
}

TEST(KcuEmuOptim, ListErrors) {
    std::vector<float> a(16, 1.0f), b(16, 1.0f);
    dev::kcu_tensor t = {a.data(), b.data(), nullptr, nullptr, 16};
    dev::kcu_tensor_list *l = nullptr;
    fsdp_err err;
    ASSERT_EQ(dev::kcu_tensor_list_create(&t, 1, &l, &err), 0) << err.msg;
    kc_adamw_hparams h = {1e-3, 0.9, 0.95, 1e-8, 0.0};
    EXPECT_EQ(dev::kcu_adamw_step(l, &h, 1, nullptr, &err), FSDP_E_INVALID); // no optimizer state
    dev::kcu_tensor_list_free(l);
    // a failing cudaMalloc: an error, nothing leaked
    for (long k = 0; k < 2; k++) {
        kcu_emu::fail_malloc_after(k);
        EXPECT_EQ(dev::kcu_tensor_list_create(&t, 1, &l, &err), FSDP_E_DEVICE);
        EXPECT_EQ(l, nullptr);
        EXPECT_NE(std::string(err.msg).find("cudaErrorMemoryAllocation"), std::string::npos) << err.msg;
    }
    kcu_emu::fail_malloc_after(-1);
    EXPECT_EQ(kcu_emu::live_allocs(), 0);
    t.n = -1;
    EXPECT_EQ(dev::kcu_tensor_list_create(&t, 1, &l, &err), FSDP_E_INVALID);
}

} // namespace
