// Tensor-core attention (kcu_attention_*_impl with KCU_ATTN_TC, bf16) against the float32 SIMT kernel
// on the same bf16 inputs and against the CPU reference kc_attention_* in float32 on the bf16-rounded
// inputs; the dispatch of kcu_attention_forward/backward; a throughput print. GPU tests skip without a
// GPU; the argument checks run wherever the build has CUDA.
#include <gtest/gtest.h>

#include "gpu_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fsdp/tensor.h"
#include "kernels/cpu/kc.h"
#include "kernels/cuda/kcu.h"
#include "runtime/device.h"

using fsdp_test::gpu_count;
using fsdp_test::gpu_present;

namespace {

// Normal values rounded to bf16 (what the kernels see), as float and as bf16 bits.
struct Bf16Data {
    std::vector<float> f;
    std::vector<uint16_t> bits;
};

Bf16Data make_bf16(size_t n, unsigned seed, float scale) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    Bf16Data r;
    r.f.resize(n);
    r.bits.resize(n);
    for (size_t i = 0; i < n; i++) {
        r.bits[i] = fsdp_f32_to_bf16(d(g));
        r.f[i] = fsdp_bf16_to_f32(r.bits[i]);
    }
    return r;
}

std::vector<float> to_f32(const std::vector<uint16_t> &bits) {
    std::vector<float> f(bits.size());
    for (size_t i = 0; i < bits.size(); i++) f[i] = fsdp_bf16_to_f32(bits[i]);
    return f;
}

// ||a - b|| / max(||b||, 1e-2 sqrt(n)) (2-norms): the relative error norm, with a floor for a reference
// that is exactly zero in exact arithmetic (dq and dk at T = 1, where the softmax has one key and only
// rounding noise remains), so that noise of ~1e-7 is not read as a relative error of 100%.
double rel_norm(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return std::sqrt(num) / std::max(std::sqrt(den), 1e-2 * std::sqrt((double)b.size()));
}

double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    double mx = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) mx = std::max(mx, std::fabs((double)a[i] - (double)b[i]));
    return mx;
}

// Index of the first non-finite element (an element the kernel did not write keeps its NaN poison), or -1.
long first_nonfinite(const std::vector<float> &v) {
    for (size_t i = 0; i < v.size(); i++)
        if (!std::isfinite(v[i])) return (long)i;
    return -1;
}

class TcGpu {
protected:
    bool start() {
        fsdp_err err;
        d_ = dev_ctx_create(nullptr, &err);
        EXPECT_NE(d_, nullptr) << err.msg;
        if (d_) s_ = dev_ctx_stream(d_, DEV_STREAM_COMPUTE);
        return d_ != nullptr;
    }
    void stop() {
        if (!d_) return;
        fsdp_err err;
        for (void *p : bufs_) EXPECT_EQ(dev_free(d_, p, &err), 0) << err.msg;
        bufs_.clear();
        dev_ctx_free(d_);
        d_ = nullptr;
    }
    void *alloc(size_t bytes) {
        void *p = nullptr;
        fsdp_err err;
        EXPECT_EQ(dev_alloc(d_, bytes, &p, &err), 0) << err.msg;
        bufs_.push_back(p);
        return p;
    }
    template <class T>
    void put(void *dst, const std::vector<T> &v) {
        fsdp_err err;
        ASSERT_EQ(dev_upload(d_, dst, v.data(), v.size() * sizeof(T), &err), 0) << err.msg;
    }
    template <class T>
    void *up(const std::vector<T> &v) {
        void *p = alloc(v.size() * sizeof(T));
        put(p, v);
        return p;
    }
    // A bf16 buffer of n elements filled with NaN (0xffff), or a float buffer of NaNs.
    void *poison_bf16(size_t n) { return up(std::vector<uint16_t>(n, 0xffffu)); }
    float *poison_f32(size_t n) { return (float *)up(std::vector<float>(n, NAN)); }
    std::vector<float> down_bf16(const void *p, size_t n) {
        std::vector<uint16_t> bits(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, bits.data(), p, n * 2, &err), 0) << err.msg;
        return to_f32(bits);
    }
    std::vector<uint16_t> down_bits(const void *p, size_t n) {
        std::vector<uint16_t> bits(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, bits.data(), p, n * 2, &err), 0) << err.msg;
        return bits;
    }
    std::vector<float> down_f32(const void *p, size_t n) {
        std::vector<float> v(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, v.data(), p, n * 4, &err), 0) << err.msg;
        return v;
    }
    dev_ctx *d_ = nullptr;
    kcu_stream s_ = nullptr;
    std::vector<void *> bufs_;
};

// ---- argument checks (no GPU needed: they fail before any CUDA call) -----------------------------------

TEST(KcuAttentionTc, ArgumentChecks) {
    if (!dev_built_with_cuda()) {
        // a CPU-only build has no tensor-core kernels: never chosen, and forcing them is a clear error
        fsdp_err err;
        void *fake = (void *)(uintptr_t)0x10000;
        EXPECT_EQ(kcu_attention_tc_supported(FSDP_DT_BF16, 64), 0);
        EXPECT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_BF16, fake, fake, fake, fake, (float *)fake, 1, 8, 2,
                                             2, 64, nullptr, &err),
                  FSDP_E_DEVICE);
        EXPECT_NE(strstr(err.msg, "built without CUDA"), nullptr) << err.msg;
        return;
    }
    EXPECT_EQ(kcu_attention_tc_supported(FSDP_DT_BF16, 64), 1);
    EXPECT_EQ(kcu_attention_tc_supported(FSDP_DT_BF16, 128), 1);
    EXPECT_EQ(kcu_attention_tc_supported(FSDP_DT_BF16, 96), 0);
    EXPECT_EQ(kcu_attention_tc_supported(FSDP_DT_F32, 64), 0);
    fsdp_err err;
    void *fake = (void *)(uintptr_t)0x10000; // never dereferenced: every case fails its checks first
    float *lse = (float *)fake;
    EXPECT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_F32, fake, fake, fake, fake, lse, 1, 8, 2, 2, 64, nullptr,
                                         &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "need bf16 and head_dim 64 or 128"), nullptr) << err.msg;
    EXPECT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_BF16, fake, fake, fake, fake, lse, 1, 8, 2, 2, 32,
                                         nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "head_dim 32"), nullptr) << err.msg;
    void *odd = (void *)(uintptr_t)0x10002; // bf16-aligned, not 16-byte aligned
    EXPECT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_BF16, fake, odd, fake, fake, lse, 1, 8, 2, 2, 64, nullptr,
                                         &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "16-byte aligned"), nullptr) << err.msg;
    EXPECT_EQ(kcu_attention_backward_impl(KCU_ATTN_TC, FSDP_DT_BF16, fake, fake, fake, fake, lse, fake, fake, fake,
                                          odd, 1, 8, 2, 2, 128, lse, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "kcu_attention_backward: the tensor-core kernels need 16-byte aligned"), nullptr)
        << err.msg;
    EXPECT_EQ(kcu_attention_forward_impl((kcu_attn_impl)7, FSDP_DT_BF16, fake, fake, fake, fake, lse, 1, 8, 2, 2, 64,
                                         nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "unknown implementation 7"), nullptr) << err.msg;
    // the shape checks come first, for either implementation
    EXPECT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_BF16, fake, fake, fake, fake, lse, 1, 8, 6, 4, 64,
                                         nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "not a multiple of n_kv_heads"), nullptr) << err.msg;
    EXPECT_EQ(kcu_attention_backward_impl(KCU_ATTN_SIMT, FSDP_DT_BF16, fake, fake, fake, fake, lse, fake, fake, fake,
                                          fake, 1, 8, 2, 2, 64, nullptr, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "no scratch buffer"), nullptr) << err.msg;
}

// ---- tensor cores against the SIMT kernel and the CPU reference ------------------------------------------

struct TcCase {
    int B, T, H, KV, hd;
};

std::string case_name(const TcCase &c) {
    return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_KV" +
           std::to_string(c.KV) + "_hd" + std::to_string(c.hd);
}

class KcuAttentionTcMatch : public ::testing::TestWithParam<TcCase>, public TcGpu {
protected:
    void SetUp() override {
        std::string why;
        if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        ASSERT_TRUE(start());
    }
    void TearDown() override { stop(); }
};

TEST_P(KcuAttentionTcMatch, ForwardBackward) {
    const TcCase a = GetParam();
    const size_t nq = (size_t)a.B * a.T * a.H * a.hd, nk = (size_t)a.B * a.T * a.KV * a.hd,
                 nl = (size_t)a.B * a.H * a.T;
    const unsigned seed = (unsigned)(a.T * 131 + a.hd * 7 + a.H);
    // q scaled up so that some rows have a peaked softmax
    Bf16Data q = make_bf16(nq, seed + 1, 1.5f), k = make_bf16(nk, seed + 2, 1.0f), v = make_bf16(nk, seed + 3, 1.0f),
             dout = make_bf16(nq, seed + 4, 1.0f);
    void *dQ = up(q.bits), *dK = up(k.bits), *dV = up(v.bits), *dDO = up(dout.bits);
    void *out_tc = poison_bf16(nq), *out_s = poison_bf16(nq);
    float *lse_tc = poison_f32(nl), *lse_s = poison_f32(nl);
    fsdp_err err;

    // forward
    ASSERT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_BF16, dQ, dK, dV, out_tc, lse_tc, a.B, a.T, a.H, a.KV,
                                         a.hd, s_, &err),
              0)
        << err.msg;
    ASSERT_EQ(kcu_attention_forward_impl(KCU_ATTN_SIMT, FSDP_DT_BF16, dQ, dK, dV, out_s, lse_s, a.B, a.T, a.H, a.KV,
                                         a.hd, s_, &err),
              0)
        << err.msg;
    ASSERT_EQ(dev_sync(d_, &err), 0) << err.msg;
    std::vector<uint16_t> out_tc_bits = down_bits(out_tc, nq);
    std::vector<float> got_out = to_f32(out_tc_bits), got_lse = down_f32(lse_tc, nl);
    std::vector<float> simt_out = down_bf16(out_s, nq), simt_lse = down_f32(lse_s, nl);
    EXPECT_EQ(first_nonfinite(got_out), -1) << "out element not written (or not finite)";
    EXPECT_EQ(first_nonfinite(got_lse), -1) << "lse element not written (or not finite)";
    std::vector<float> ref_out(nq), ref_lse(nl);
    ASSERT_EQ(kc_attention_forward(q.f.data(), k.f.data(), v.f.data(), ref_out.data(), ref_lse.data(), a.B, a.T, a.H,
                                   a.KV, a.hd, nullptr, &err),
              0)
        << err.msg;
    EXPECT_LE(rel_norm(got_out, simt_out), 1e-2) << "out vs SIMT";
    EXPECT_LE(rel_norm(got_out, ref_out), 1e-2) << "out vs CPU";
    EXPECT_LE(max_abs_diff(got_lse, simt_lse), 1e-3) << "lse vs SIMT";
    EXPECT_LE(max_abs_diff(got_lse, ref_lse), 1e-3) << "lse vs CPU";

    // backward: both implementations from the same (tensor-core) out and lse
    float *scratch = (float *)alloc(kcu_attention_scratch_floats(a.B, a.T, a.H) * sizeof(float));
    void *dq_tc = poison_bf16(nq), *dk_tc = poison_bf16(nk), *dv_tc = poison_bf16(nk);
    void *dq_s = poison_bf16(nq), *dk_s = poison_bf16(nk), *dv_s = poison_bf16(nk);
    ASSERT_EQ(kcu_attention_backward_impl(KCU_ATTN_TC, FSDP_DT_BF16, dQ, dK, dV, out_tc, lse_tc, dDO, dq_tc, dk_tc,
                                          dv_tc, a.B, a.T, a.H, a.KV, a.hd, scratch, s_, &err),
              0)
        << err.msg;
    ASSERT_EQ(kcu_attention_backward_impl(KCU_ATTN_SIMT, FSDP_DT_BF16, dQ, dK, dV, out_tc, lse_tc, dDO, dq_s, dk_s,
                                          dv_s, a.B, a.T, a.H, a.KV, a.hd, scratch, s_, &err),
              0)
        << err.msg;
    ASSERT_EQ(dev_sync(d_, &err), 0) << err.msg;
    std::vector<float> ref_dq(nq), ref_dk(nk), ref_dv(nk);
    ASSERT_EQ(kc_attention_backward(q.f.data(), k.f.data(), v.f.data(), got_out.data(), got_lse.data(), dout.f.data(),
                                    ref_dq.data(), ref_dk.data(), ref_dv.data(), a.B, a.T, a.H, a.KV, a.hd, nullptr,
                                    &err),
              0)
        << err.msg;
    struct {
        const char *name;
        void *tc, *simt;
        size_t n;
        const std::vector<float> *ref;
    } grads[] = {{"dq", dq_tc, dq_s, nq, &ref_dq}, {"dk", dk_tc, dk_s, nk, &ref_dk}, {"dv", dv_tc, dv_s, nk, &ref_dv}};
    for (const auto &g : grads) {
        std::vector<float> got = down_bf16(g.tc, g.n), simt = down_bf16(g.simt, g.n);
        EXPECT_EQ(first_nonfinite(got), -1) << g.name << " element not written (or not finite)";
        EXPECT_LE(rel_norm(got, simt), 1e-2) << g.name << " vs SIMT";
        EXPECT_LE(rel_norm(got, *g.ref), 1e-2) << g.name << " vs CPU";
    }
}

std::vector<TcCase> tc_cases() {
    std::vector<TcCase> v;
    for (int hd : {64, 128})
        for (int T : {1, 17, 64, 130, 1024}) {
            v.push_back({2, T, 8, 2, hd});
            v.push_back({2, T, 4, 4, hd});
        }
    return v;
}

INSTANTIATE_TEST_SUITE_P(KcuAttentionTc, KcuAttentionTcMatch, ::testing::ValuesIn(tc_cases()),
                         [](const ::testing::TestParamInfo<TcCase> &i) { return case_name(i.param); });

// ---- dispatch -----------------------------------------------------------------------------------------------

class KcuAttentionTcGpu : public ::testing::Test, public TcGpu {
protected:
    void SetUp() override {
        std::string why;
        if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        ASSERT_TRUE(start());
    }
    void TearDown() override { stop(); }
    // Prints the median time and TFLOP/s of both implementations, forward and backward (bf16).
    void throughput(int B, int T, int H, int KV, int hd);
};

// kcu_attention_forward/backward run the tensor-core kernels exactly when they apply (both
// implementations are deterministic, so the auto result equals the forced one bit for bit).
TEST_F(KcuAttentionTcGpu, DispatchPicksTensorCoresForBf16) {
    const int B = 1, T = 70, H = 4, KV = 2;
    fsdp_err err;
    for (int hd : {64, 32}) {
        SCOPED_TRACE("hd " + std::to_string(hd));
        const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
        // one element of slack so that the same data can also be passed 2 bytes off alignment
        Bf16Data q = make_bf16(nq + 1, 11, 1.0f), k = make_bf16(nk + 1, 12, 1.0f), v = make_bf16(nk + 1, 13, 1.0f),
                 dout = make_bf16(nq + 1, 14, 1.0f);
        void *dQ = up(q.bits), *dK = up(k.bits), *dV = up(v.bits), *dDO = up(dout.bits);
        float *scratch = (float *)alloc(kcu_attention_scratch_floats(B, T, H) * sizeof(float));
        struct Run {
            std::vector<uint16_t> out, dq, dk, dv;
            std::vector<float> lse;
        };
        // runs forward + backward with impl on inputs offset by `off` elements
        auto run = [&](int impl, size_t off) {
            Run r;
            void *o = poison_bf16(nq + 1), *gq = poison_bf16(nq + 1), *gk = poison_bf16(nk + 1),
                 *gv = poison_bf16(nk + 1);
            float *l = poison_f32(nl);
            auto at = [off](void *p) { return (void *)((uint16_t *)p + off); };
            int rc = impl < 0 ? kcu_attention_forward(FSDP_DT_BF16, at(dQ), at(dK), at(dV), at(o), l, B, T, H, KV, hd,
                                                      s_, &err)
                              : kcu_attention_forward_impl((kcu_attn_impl)impl, FSDP_DT_BF16, at(dQ), at(dK), at(dV),
                                                           at(o), l, B, T, H, KV, hd, s_, &err);
            EXPECT_EQ(rc, 0) << err.msg;
            rc = impl < 0 ? kcu_attention_backward(FSDP_DT_BF16, at(dQ), at(dK), at(dV), at(o), l, at(dDO), at(gq),
                                                   at(gk), at(gv), B, T, H, KV, hd, scratch, s_, &err)
                          : kcu_attention_backward_impl((kcu_attn_impl)impl, FSDP_DT_BF16, at(dQ), at(dK), at(dV),
                                                        at(o), l, at(dDO), at(gq), at(gk), at(gv), B, T, H, KV, hd,
                                                        scratch, s_, &err);
            EXPECT_EQ(rc, 0) << err.msg;
            auto cut = [off](std::vector<uint16_t> b, size_t n) {
                return std::vector<uint16_t>(b.begin() + off, b.begin() + off + n);
            };
            r.out = cut(down_bits(o, nq + 1), nq);
            r.dq = cut(down_bits(gq, nq + 1), nq);
            r.dk = cut(down_bits(gk, nk + 1), nk);
            r.dv = cut(down_bits(gv, nk + 1), nk);
            r.lse = down_f32(l, nl);
            return r;
        };
        auto same = [](const Run &x, const Run &y) {
            return x.out == y.out && x.dq == y.dq && x.dk == y.dk && x.dv == y.dv &&
                   memcmp(x.lse.data(), y.lse.data(), x.lse.size() * 4) == 0;
        };
        Run autor = run(-1, 0), simt = run(KCU_ATTN_SIMT, 0);
        if (hd == 64) {
            Run tc = run(KCU_ATTN_TC, 0);
            EXPECT_TRUE(same(autor, tc)) << "bf16 hd 64 must run the tensor-core kernels";
            EXPECT_FALSE(same(tc, simt)) << "the two implementations should differ in rounding somewhere";
            // 2 bytes off 16-byte alignment: auto falls back to SIMT, forced TC refuses
            Run auto_odd = run(-1, 1), simt_odd = run(KCU_ATTN_SIMT, 1);
            EXPECT_TRUE(same(auto_odd, simt_odd)) << "misaligned tensors must fall back to SIMT";
            EXPECT_EQ(kcu_attention_forward_impl(KCU_ATTN_TC, FSDP_DT_BF16, (uint16_t *)dQ + 1, dK, dV, dQ, scratch, B,
                                                 T, H, KV, hd, s_, &err),
                      FSDP_E_INVALID);
        } else {
            EXPECT_TRUE(same(autor, simt)) << "hd 32 must run the SIMT kernels";
        }
    }
}

// float32 storage keeps the SIMT kernels: auto and forced SIMT agree bit for bit.
TEST_F(KcuAttentionTcGpu, DispatchKeepsSimtForF32) {
    const int B = 2, T = 33, H = 2, KV = 1, hd = 64;
    const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    std::mt19937 g(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(nq), k(nk), v(nk);
    for (auto *x : {&q, &k, &v})
        for (auto &e : *x) e = nd(g);
    void *dQ = up(q), *dK = up(k), *dV = up(v);
    float *o1 = poison_f32(nq), *o2 = poison_f32(nq), *l1 = poison_f32(nl), *l2 = poison_f32(nl);
    fsdp_err err;
    ASSERT_EQ(kcu_attention_forward(FSDP_DT_F32, dQ, dK, dV, o1, l1, B, T, H, KV, hd, s_, &err), 0) << err.msg;
    ASSERT_EQ(kcu_attention_forward_impl(KCU_ATTN_SIMT, FSDP_DT_F32, dQ, dK, dV, o2, l2, B, T, H, KV, hd, s_, &err), 0)
        << err.msg;
    std::vector<float> a1 = down_f32(o1, nq), a2 = down_f32(o2, nq), b1 = down_f32(l1, nl), b2 = down_f32(l2, nl);
    EXPECT_EQ(first_nonfinite(a1), -1);
    EXPECT_EQ(memcmp(a1.data(), a2.data(), nq * 4), 0);
    EXPECT_EQ(memcmp(b1.data(), b2.data(), nl * 4), 0);
}

// ---- throughput (prints only) ------------------------------------------------------------------------------

// llama3_1b's attention shape (hd 64), then llama3_8b's head size (hd 128).
TEST_F(KcuAttentionTcGpu, ThroughputPrint) {
    for (int hd : {64, 128}) {
        SCOPED_TRACE("hd " + std::to_string(hd));
        throughput(4, 2048, 32, 8, hd);
        if (HasFatalFailure()) return;
        for (void *p : bufs_) { // free this shape's buffers before the next
            fsdp_err err;
            EXPECT_EQ(dev_free(d_, p, &err), 0) << err.msg;
        }
        bufs_.clear();
    }
}

void KcuAttentionTcGpu::throughput(int B, int T, int H, int KV, int hd) {
    const int warm = 2, reps = 7;
    const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    // cheap deterministic bf16 data in [-1, 1): a timing run does not need normal values
    auto fill = [](size_t n, uint32_t seed) {
        std::vector<uint16_t> b(n);
        uint32_t x = seed * 2654435761u + 1u;
        for (auto &e : b) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            e = fsdp_f32_to_bf16((float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f);
        }
        return b;
    };
    void *dQ = up(fill(nq, 1)), *dK = up(fill(nk, 2)), *dV = up(fill(nk, 3)), *dDO = up(fill(nq, 4));
    void *o = alloc(nq * 2), *gq = alloc(nq * 2), *gk = alloc(nk * 2), *gv = alloc(nk * 2);
    float *l = (float *)alloc(nl * 4), *scratch = (float *)alloc(kcu_attention_scratch_floats(B, T, H) * 4);
    // causal FLOPs: forward 2 GEMMs of B*H*T*T/2*hd multiply-adds, backward 5 (recomputation not counted)
    const double mac = (double)B * H * T * (double)T / 2.0 * hd;
    const double fwd_flop = 2.0 * 2.0 * mac, bwd_flop = 5.0 * 2.0 * mac;
    fsdp_err err;
    for (kcu_attn_impl impl : {KCU_ATTN_TC, KCU_ATTN_SIMT}) {
        for (int pass = 0; pass < 2; pass++) { // 0 forward, 1 backward
            std::vector<float> ms;
            for (int it = 0; it < warm + reps; it++) {
                dev_timer tm;
                ASSERT_EQ(dev_timer_start(d_, &tm, DEV_STREAM_COMPUTE, &err), 0) << err.msg;
                int rc = pass == 0 ? kcu_attention_forward_impl(impl, FSDP_DT_BF16, dQ, dK, dV, o, l, B, T, H, KV, hd,
                                                                s_, &err)
                                   : kcu_attention_backward_impl(impl, FSDP_DT_BF16, dQ, dK, dV, o, l, dDO, gq, gk, gv,
                                                                 B, T, H, KV, hd, scratch, s_, &err);
                ASSERT_EQ(rc, 0) << err.msg;
                float t = 0.0f;
                ASSERT_EQ(dev_timer_stop(&tm, &t, &err), 0) << err.msg;
                if (it >= warm) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            const double med = ms[ms.size() / 2];
            printf("[kcu attention %s %s] B %d T %d H %d KV %d hd %d: median %.3f ms over %d, %.1f TFLOP/s\n",
                   impl == KCU_ATTN_TC ? "tensor-core" : "simt", pass == 0 ? "forward " : "backward", B, T, H, KV, hd,
                   med, reps, (pass == 0 ? fwd_flop : bwd_flop) / (med * 1e-3) / 1e12);
        }
    }
}

} // namespace
