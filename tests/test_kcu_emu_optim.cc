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
