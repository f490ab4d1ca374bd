// The mixture-of-experts feed-forward on the GPU (decoder/decoder_moe_cuda.h) against the double-precision
// reference of tests/moe_ref.h and, in float32, against the CPU's kc_moe (kernels/cpu/kc_moe.c): outputs,
// routing choices (with exact ties), the expert sort, the routing statistics and every gradient, for several
// shapes (an expert that receives no token, K = 1, K = E, norm_topk on and off, token counts that fill no
// block, the load-balancing gradient), in float32 and bf16 storage; a non-finite router logit is
// kc_moe_forward's error naming the lowest such token. Skipped when no GPU is present (the emulated device
// of `make test-emu` runs it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "moe_ref.h"

extern "C" {
#include "decoder/decoder_moe_cuda.h"
#include "fsdp/tensor.h"
#include "runtime/device.h"
}

namespace {

using moe_ref::rel_err;

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = dist(g);
    return v;
}

std::vector<float> rounded(std::vector<float> v, fsdp_dtype dt) {
    if (dt == FSDP_DT_BF16)
        for (auto &x : v) x = fsdp_bf16_to_f32(fsdp_f32_to_bf16(x));
    return v;
}

struct Case {
    int n, d, F, E, K, norm;
    bool empty_expert; // the last expert's router row makes it lose every token
    bool tie;          // experts 1 and 2 have equal router rows: equal probabilities on every token
    bool aux;          // a load-balancing gradient dp_aux
};

class CudaMoe : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        if (!fsdp_test::gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        fsdp_err err;
        d_ = dev_ctx_create(nullptr, &err);
        ASSERT_NE(d_, nullptr) << err.msg;
    }
    void TearDown() override {
        if (!d_) return;
        fsdp_err err;
        for (void *p : bufs_) EXPECT_EQ(dev_free(d_, p, &err), 0) << err.msg;
        dev_ctx_free(d_);
    }
    void *alloc(size_t bytes, unsigned char fill = 0xff) { // NaN-filled unless told
        void *p = nullptr;
        fsdp_err err;
        EXPECT_EQ(dev_alloc(d_, bytes, &p, &err), 0) << err.msg;
        std::vector<unsigned char> h(bytes, fill);
        EXPECT_EQ(dev_upload(d_, p, h.data(), bytes, &err), 0) << err.msg;
        bufs_.push_back(p);
        return p;
    }
    void *up(const std::vector<float> &v, fsdp_dtype dt) {
        const size_t es = fsdp_dtype_size(dt);
        std::vector<unsigned char> h(v.size() * es);
        fsdp_err err;
        EXPECT_EQ(fsdp_convert(h.data(), dt, v.data(), FSDP_DT_F32, v.size(), &err), 0) << err.msg;
        void *p = alloc(h.size());
        EXPECT_EQ(dev_upload(d_, p, h.data(), h.size(), &err), 0) << err.msg;
        return p;
    }
    std::vector<float> down(const void *p, size_t n, fsdp_dtype dt) {
        const size_t es = fsdp_dtype_size(dt);
        std::vector<unsigned char> h(n * es);
        std::vector<float> v(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, h.data(), p, h.size(), &err), 0) << err.msg;
        EXPECT_EQ(fsdp_convert(v.data(), FSDP_DT_F32, h.data(), dt, n, &err), 0) << err.msg;
        return v;
    }
    template <class I>
    std::vector<I> down_raw(const I *p, size_t n) {
        std::vector<I> v(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, v.data(), p, n * sizeof(I), &err), 0) << err.msg;
        return v;
    }
    void run_case(const Case &c, fsdp_dtype dt);

    dev_ctx *d_ = nullptr;
    std::vector<void *> bufs_;
};

void CudaMoe::run_case(const Case &c, fsdp_dtype dt) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " d " + std::to_string(c.d) + " F " + std::to_string(c.F) + " E " +
                 std::to_string(c.E) + " K " + std::to_string(c.K) + " norm " + std::to_string(c.norm) + " " +
                 fsdp_dtype_name(dt));
    const kc_moe_dims m = {c.n, c.d, c.F, c.E, c.K, c.norm};
    const int n = c.n, d = c.d, F = c.F, E = c.E, K = c.K;
    auto x = randn((size_t)n * d, 1), router = randn((size_t)E * d, 2, 0.5f);
    auto w1 = randn((size_t)E * F * d, 3, 0.3f), w3 = randn((size_t)E * F * d, 4, 0.3f),
         w2 = randn((size_t)E * d * F, 5, 0.3f), dout = randn((size_t)n * d, 6);
    if (c.empty_expert) { // feature 0 of every token >= 2, the last expert's row -4 e_0: logit <= -8
        for (int t = 0; t < n; t++) x[(size_t)t * d] = 2.0f + std::fabs(x[(size_t)t * d]);
        for (int j = 0; j < d; j++) router[(size_t)(E - 1) * d + j] = j == 0 ? -4.0f : 0.0f;
        for (int e = 0; e + 1 < E; e++) router[(size_t)e * d] = 0.0f;
    }
    if (c.tie)
        for (int j = 0; j < d; j++) router[(size_t)2 * d + j] = router[(size_t)1 * d + j];
    std::vector<float> aux;
    if (c.aux) aux = randn(E, 7, 0.1f);
    for (auto *v : {&x, &router, &w1, &w2, &w3, &dout}) *v = rounded(*v, dt);
    const moe_ref::Dims rd = {n, d, F, E, K, c.norm};
    using moe_ref::to_double;
    const moe_ref::Result ref = moe_ref::run(rd, to_double(x), to_double(router), to_double(w1), to_double(w2),
                                             to_double(w3), to_double(dout), to_double(aux));
    if (c.empty_expert) {
        ASSERT_EQ(ref.r.offsets[E - 1], ref.r.offsets[E]) << "the last expert should get no token";
    }
    if (c.tie) {
        int both = 0;
        for (int p = 0; p + 1 < n * K; p++) both += ref.r.top[p] == 1 && ref.r.top[p + 1] == 2 && (p + 1) % K;
        if (K > 1 && K < E) {
            ASSERT_GT(both, 0) << "no token chose both tied experts";
        }
    }

    void *X = up(x, dt), *R = up(router, dt), *W1 = up(w1, dt), *W2 = up(w2, dt), *W3 = up(w3, dt),
         *DOUT = up(dout, dt), *OUT = alloc((size_t)n * d * fsdp_dtype_size(dt)),
         *DX = alloc((size_t)n * d * fsdp_dtype_size(dt));
    // weight gradients start from non-zero values: the backward adds to them
    const auto g_r0 = randn((size_t)E * d, 11), g_10 = randn((size_t)E * F * d, 12), g_20 = randn((size_t)E * d * F, 13),
               g_30 = randn((size_t)E * F * d, 14);
    float *DR = (float *)up(g_r0, FSDP_DT_F32), *DW1 = (float *)up(g_10, FSDP_DT_F32),
          *DW2 = (float *)up(g_20, FSDP_DT_F32), *DW3 = (float *)up(g_30, FSDP_DT_F32);
    float *AUX = c.aux ? (float *)up(aux, FSDP_DT_F32) : nullptr;
    double *CNT = (double *)alloc(E * sizeof(double), 0), *PS = (double *)alloc(E * sizeof(double), 0);

    fsdp_err err;
    const size_t ab = decoder_moe_cuda_acts_bytes(&m, dt), sb = decoder_moe_cuda_scratch_bytes(&m, dt);
    ASSERT_GT(ab, 0u);
    ASSERT_GT(sb, 0u);
    std::vector<int32_t> host_off(E + 2, -7);
    decoder_moe_cuda_acts a;
    decoder_moe_cuda_scratch s;
    ASSERT_EQ(decoder_moe_cuda_acts_bind(&m, dt, alloc(ab), host_off.data(), &a, &err), 0) << err.msg;
    ASSERT_EQ(decoder_moe_cuda_scratch_bind(&m, dt, alloc(sb), &s, &err), 0) << err.msg;
    ASSERT_EQ(decoder_moe_cuda_forward(d_, dt, &m, X, R, W1, W2, W3, &a, OUT, &err), 0) << err.msg;
    ASSERT_EQ(decoder_moe_cuda_stats(d_, &m, &a, CNT, PS, &err), 0) << err.msg;
    ASSERT_EQ(decoder_moe_cuda_stats(d_, &m, &a, CNT, PS, &err), 0) << err.msg; // accumulates
    ASSERT_EQ(decoder_moe_cuda_backward(d_, dt, &m, DOUT, X, R, W1, W2, W3, &a, AUX, &s, DX, DR, DW1, DW2, DW3, &err), 0)
        << err.msg;
    ASSERT_EQ(dev_sync(d_, &err), 0) << err.msg;

    // routing: the same experts in the same order, the same sort, probabilities and weights
    const size_t nK = (size_t)n * K;
    EXPECT_EQ(down_raw(a.top, nK), std::vector<int32_t>(ref.r.top.begin(), ref.r.top.end()));
    const auto offs = down_raw(a.offsets, E + 1);
    EXPECT_EQ(offs, std::vector<int32_t>(ref.r.offsets.begin(), ref.r.offsets.end()));
    EXPECT_EQ(std::vector<int32_t>(host_off.begin(), host_off.begin() + E + 1), offs);
    EXPECT_EQ(host_off[E + 1], 0);
    EXPECT_EQ(down_raw(a.slot_of, nK), std::vector<int32_t>(ref.r.slot_of.begin(), ref.r.slot_of.end()));
    EXPECT_EQ(down_raw(a.pair_of, nK), std::vector<int32_t>(ref.r.pair_of.begin(), ref.r.pair_of.end()));
    const double tol_r = dt == FSDP_DT_F32 ? 2e-6 : 1e-5; // float routing from float logits either way
    EXPECT_LT(rel_err(down_raw(a.probs, (size_t)n * E), ref.r.probs), tol_r);
    EXPECT_LT(rel_err(down_raw(a.topw, nK), ref.r.topw), tol_r);
    if (c.tie) { // bit-equal probabilities for the tied experts
        const auto p = down_raw(a.probs, (size_t)n * E);
        for (int t = 0; t < n; t++) EXPECT_EQ(p[(size_t)t * E + 1], p[(size_t)t * E + 2]) << t;
    }
    // statistics, added twice
    const auto cnt = down_raw(CNT, E), ps = down_raw(PS, E);
    for (int e = 0; e < E; e++) {
        EXPECT_EQ(cnt[e], 2.0 * ref.counts[e]) << e;
        EXPECT_NEAR(ps[e], 2.0 * ref.psum[e], 1e-5 * n) << e;
    }
    // output and gradients (weight gradients: minus their starting values)
    const double tol = dt == FSDP_DT_F32 ? 1e-5 : 3e-2, tol_g = dt == FSDP_DT_F32 ? 2e-5 : 5e-2;
    EXPECT_LT(rel_err(down(OUT, (size_t)n * d, dt), ref.out), tol);
    EXPECT_LT(rel_err(down(DX, (size_t)n * d, dt), ref.dx), tol_g);
    auto minus = [](std::vector<float> v, const std::vector<float> &v0) {
        for (size_t i = 0; i < v.size(); i++) v[i] -= v0[i];
        return v;
    };
    EXPECT_LT(rel_err(minus(down(DR, (size_t)E * d, FSDP_DT_F32), g_r0), ref.drouter), tol_g);
    EXPECT_LT(rel_err(minus(down(DW1, (size_t)E * F * d, FSDP_DT_F32), g_10), ref.dw1), tol_g);
    EXPECT_LT(rel_err(minus(down(DW2, (size_t)E * d * F, FSDP_DT_F32), g_20), ref.dw2), tol_g);
    EXPECT_LT(rel_err(minus(down(DW3, (size_t)E * F * d, FSDP_DT_F32), g_30), ref.dw3), tol_g);
    if (c.empty_expert) { // an expert with no token: its weight gradients are untouched
        const auto g1 = down(DW1, (size_t)E * F * d, FSDP_DT_F32);
        for (size_t i = (size_t)(E - 1) * F * d; i < g1.size(); i++) ASSERT_EQ(g1[i], g_10[i]) << i;
    }
    if (dt == FSDP_DT_F32) { // the CPU implementation (kernels/cpu/kc_moe.c) on the same float inputs
        std::vector<float> ab(kc_moe_acts_floats(&m)), sbuf(kc_moe_scratch_floats(&m));
        kc_moe_acts ka;
        kc_moe_scratch ks;
        kc_moe_acts_bind(&m, ab.data(), &ka);
        kc_moe_scratch_bind(&m, sbuf.data(), &ks);
        std::vector<float> kout((size_t)n * d), kdx((size_t)n * d), kdr((size_t)E * d, 0.0f),
            kd1((size_t)E * F * d, 0.0f), kd2((size_t)E * d * F, 0.0f), kd3((size_t)E * F * d, 0.0f);
        ASSERT_EQ(kc_moe_forward(&m, x.data(), router.data(), w1.data(), w2.data(), w3.data(), &ka, kout.data(), nullptr,
                                 &err),
                  0)
            << err.msg;
        ASSERT_EQ(kc_moe_backward(&m, dout.data(), x.data(), router.data(), w1.data(), w2.data(), w3.data(), &ka,
                                  c.aux ? aux.data() : nullptr, &ks, kdx.data(), kdr.data(), kd1.data(), kd2.data(),
                                  kd3.data(), nullptr, &err),
                  0)
            << err.msg;
        EXPECT_EQ(down_raw(a.top, nK), std::vector<int32_t>(ka.top, ka.top + nK));
        EXPECT_EQ(offs, std::vector<int32_t>(ka.offsets, ka.offsets + E + 1));
        EXPECT_EQ(down_raw(a.slot_of, nK), std::vector<int32_t>(ka.slot_of, ka.slot_of + nK));
        EXPECT_EQ(down_raw(a.pair_of, nK), std::vector<int32_t>(ka.pair_of, ka.pair_of + nK));
        using moe_ref::to_double;
        EXPECT_LT(rel_err(down_raw(a.probs, (size_t)n * E), to_double({ka.probs, ka.probs + (size_t)n * E})), 1e-6);
        EXPECT_LT(rel_err(down_raw(a.topw, nK), to_double({ka.topw, ka.topw + nK})), 1e-6);
        EXPECT_LT(rel_err(down(OUT, (size_t)n * d, dt), to_double(kout)), 1e-5);
        EXPECT_LT(rel_err(down(DX, (size_t)n * d, dt), to_double(kdx)), 2e-5);
        EXPECT_LT(rel_err(minus(down(DR, (size_t)E * d, FSDP_DT_F32), g_r0), to_double(kdr)), 2e-5);
        EXPECT_LT(rel_err(minus(down(DW1, (size_t)E * F * d, FSDP_DT_F32), g_10), to_double(kd1)), 2e-5);
        EXPECT_LT(rel_err(minus(down(DW2, (size_t)E * d * F, FSDP_DT_F32), g_20), to_double(kd2)), 2e-5);
        EXPECT_LT(rel_err(minus(down(DW3, (size_t)E * F * d, FSDP_DT_F32), g_30), to_double(kd3)), 2e-5);
        std::vector<double> kc_cnt(E, 0.0), kc_ps(E, 0.0);
        kc_moe_stats(&m, &ka, kc_cnt.data(), kc_ps.data());
        kc_moe_stats(&m, &ka, kc_cnt.data(), kc_ps.data());
        EXPECT_EQ(cnt, kc_cnt);
        for (int e = 0; e < E; e++) EXPECT_NEAR(ps[e], kc_ps[e], 1e-6 * n) << e;
    }
    // the same inputs again give the same bits (no atomics, fixed orders)
    std::vector<float> out1 = down(OUT, (size_t)n * d, dt), dx1 = down(DX, (size_t)n * d, dt);
    ASSERT_EQ(decoder_moe_cuda_forward(d_, dt, &m, X, R, W1, W2, W3, &a, OUT, &err), 0) << err.msg;
    ASSERT_EQ(decoder_moe_cuda_backward(d_, dt, &m, DOUT, X, R, W1, W2, W3, &a, AUX, &s, DX, DR, DW1, DW2, DW3, &err), 0)
        << err.msg;
    EXPECT_EQ(down(OUT, (size_t)n * d, dt), out1);
    EXPECT_EQ(down(DX, (size_t)n * d, dt), dx1);
}

TEST_F(CudaMoe, EmptyExpertTiesAndRenormalisedTopK) { run_case({37, 24, 20, 6, 2, 1, true, true, false}, FSDP_DT_F32); }

TEST_F(CudaMoe, TopOneWithoutRenormalisation) { run_case({50, 16, 12, 4, 1, 0, false, true, false}, FSDP_DT_F32); }

TEST_F(CudaMoe, EveryExpertPerToken) {
    run_case({19, 20, 8, 3, 3, 1, false, false, false}, FSDP_DT_F32); // K = E, renormalised: topw = probs
    run_case({19, 20, 8, 3, 3, 0, false, false, true}, FSDP_DT_F32);
}

TEST_F(CudaMoe, SeveralSortChunksAndTheLoadBalancingGradient) {
    run_case({131, 33, 24, 8, 2, 0, true, false, true}, FSDP_DT_F32); // 262 pairs: 5 chunks of the sort
}

TEST_F(CudaMoe, Bf16Storage) { run_case({45, 32, 16, 5, 2, 1, true, false, true}, FSDP_DT_BF16); }

TEST_F(CudaMoe, NonFiniteRouterLogitIsAnError) {
    const kc_moe_dims m = {9, 8, 4, 3, 2, 1};
    auto x = randn(9 * 8, 1), router = randn(3 * 8, 2);
    x[7 * 8 + 1] = NAN;      // tokens 5 and 7 have non-finite logits: the error names the lower one
    x[5 * 8 + 3] = INFINITY; // inf * w gives +-inf or nan logits
    void *X = up(x, FSDP_DT_F32), *R = up(router, FSDP_DT_F32), *W1 = up(randn(3 * 4 * 8, 3), FSDP_DT_F32),
         *W2 = up(randn(3 * 8 * 4, 4), FSDP_DT_F32), *W3 = up(randn(3 * 4 * 8, 5), FSDP_DT_F32),
         *OUT = alloc(9 * 8 * 4);
    fsdp_err err;
    std::vector<int32_t> host_off(5);
    decoder_moe_cuda_acts a;
    ASSERT_EQ(decoder_moe_cuda_acts_bind(&m, FSDP_DT_F32, alloc(decoder_moe_cuda_acts_bytes(&m, FSDP_DT_F32)),
                                         host_off.data(), &a, &err),
              0)
        << err.msg;
    ASSERT_EQ(decoder_moe_cuda_forward(d_, FSDP_DT_F32, &m, X, R, W1, W2, W3, &a, OUT, &err), FSDP_E_NUMERIC);
    EXPECT_NE(std::string(err.msg).find("token 5 has a router logit that is not finite"), std::string::npos) << err.msg;
    // the backward refuses activations of a failed forward
    decoder_moe_cuda_scratch s;
    ASSERT_EQ(decoder_moe_cuda_scratch_bind(&m, FSDP_DT_F32, alloc(decoder_moe_cuda_scratch_bytes(&m, FSDP_DT_F32)),
                                            &s, &err),
              0);
    EXPECT_EQ(decoder_moe_cuda_backward(d_, FSDP_DT_F32, &m, OUT, X, R, W1, W2, W3, &a, nullptr, &s, OUT, (float *)W1,
                                        (float *)W1, (float *)W2, (float *)W3, &err),
              FSDP_E_INVALID);
    // bad dims
    const kc_moe_dims bad = {9, 8, 4, 3, 4, 1}; // K > E
    EXPECT_EQ(decoder_moe_cuda_acts_bytes(&bad, FSDP_DT_F32), 0u);
    EXPECT_EQ(decoder_moe_cuda_forward(d_, FSDP_DT_F32, &bad, X, R, W1, W2, W3, &a, OUT, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_moe_cuda_acts_bytes(&m, FSDP_DT_I64), 0u);
}

} // namespace
