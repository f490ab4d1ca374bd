// CUDA kernels and GEMMs against the CPU kernels (kernels/cpu/kc.h) on random inputs, in float32
// (1e-5 relative) and bf16 storage (1e-2 relative; the CPU reference then runs on the same
// bf16-rounded inputs). Skipped when no GPU is present.
#include <gtest/gtest.h>

#include "gpu_util.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fsdp/tensor.h"
#include "kernels/cpu/kc.h"
#include "kernels/cuda/kcu.h"
#include "runtime/device.h"
#include "runtime/device_gemm.h"

using fsdp_test::gpu_count;
using fsdp_test::gpu_present;

namespace {

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = d(g);
    return v;
}

// max |a - b| / max |b|
double rel_err(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    double mx = 0.0, diff = 0.0;
    for (size_t i = 0; i < b.size() && i < a.size(); i++) {
        mx = std::max(mx, std::fabs((double)b[i]));
        diff = std::max(diff, std::fabs((double)a[i] - (double)b[i]));
    }
    return mx > 0 ? diff / mx : diff;
}

std::vector<float> round_bf16(std::vector<float> v) {
    for (auto &x : v) x = fsdp_bf16_to_f32(fsdp_f32_to_bf16(x));
    return v;
}

// A device context and helpers to move float data in a given storage dtype.
class GpuTest {
protected:
    bool start() {
        std::string why;
        if (!gpu_present(&why)) return false;
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
    // v stored as dtype t on the device.
    void *up(const std::vector<float> &v, fsdp_dtype t) {
        size_t es = fsdp_dtype_size(t);
        std::vector<unsigned char> host(v.size() * es);
        fsdp_err err;
        EXPECT_EQ(fsdp_convert(host.data(), t, v.data(), FSDP_DT_F32, v.size(), &err), 0);
        void *p = alloc(host.size());
        EXPECT_EQ(dev_upload(d_, p, host.data(), host.size(), &err), 0) << err.msg;
        return p;
    }
    template <class T>
    T *up_raw(const std::vector<T> &v) {
        void *p = alloc(v.size() * sizeof(T));
        fsdp_err err;
        EXPECT_EQ(dev_upload(d_, p, v.data(), v.size() * sizeof(T), &err), 0) << err.msg;
        return static_cast<T *>(p);
    }
    // n elements of dtype t at p, as float (waits for the compute stream).
    std::vector<float> down(const void *p, size_t n, fsdp_dtype t) {
        size_t es = fsdp_dtype_size(t);
        std::vector<unsigned char> host(n * es);
        std::vector<float> out(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, host.data(), p, host.size(), &err), 0) << err.msg;
        EXPECT_EQ(fsdp_convert(out.data(), FSDP_DT_F32, host.data(), t, n, &err), 0);
        return out;
    }
    template <class T>
    std::vector<T> down_raw(const T *p, size_t n) {
        std::vector<T> out(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d_, out.data(), p, n * sizeof(T), &err), 0) << err.msg;
        return out;
    }
    dev_ctx *d_ = nullptr;
    kcu_stream s_ = nullptr;
    std::vector<void *> bufs_;
};

class CudaKernels : public ::testing::TestWithParam<fsdp_dtype>, public GpuTest {
protected:
    void SetUp() override {
        std::string why;
        if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        ASSERT_TRUE(start());
    }
    void TearDown() override { stop(); }
    fsdp_dtype dt() const { return GetParam(); }
    double tol() const { return dt() == FSDP_DT_F32 ? 1e-5 : 1e-2; }
    // Inputs as the kernels see them: rounded to bf16 in the bf16 mode.
    std::vector<float> in(std::vector<float> v) const { return dt() == FSDP_DT_BF16 ? round_bf16(std::move(v)) : v; }
};

class CudaExact : public ::testing::Test, public GpuTest {
protected:
    void SetUp() override {
        std::string why;
        if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        ASSERT_TRUE(start());
    }
    void TearDown() override { stop(); }
};

// ---- GEMM and linear ---------------------------------------------------------------------------------

TEST_P(CudaKernels, GemmAllTranspositionsAndStrides) {
    const int M = 19, N = 23, K = 31;
    fsdp_err err;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            auto A = in(randn((size_t)(ta ? K : M) * lda, 10 + ta));
            auto B = in(randn((size_t)(tb ? N : K) * ldb, 20 + tb));
            auto C = in(randn((size_t)M * ldc, 30));
            std::vector<float> ref(C);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                             (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                    ref[(size_t)i * ldc + j] = (float)(0.5 * s + 0.25 * C[(size_t)i * ldc + j]);
                }
            void *dA = up(A, dt()), *dB = up(B, dt()), *dC = up(C, dt());
            ASSERT_EQ(dev_gemm(d_, ta, tb, M, N, K, 0.5f, dt(), dA, lda, dB, ldb, 0.25f, dt(), dC, ldc, &err), 0)
                << err.msg;
            auto got = down(dC, C.size(), dt());
            // padding columns of C are untouched
            for (int i = 0; i < M; i++)
                for (int j = N; j < ldc; j++) ref[(size_t)i * ldc + j] = C[(size_t)i * ldc + j];
            EXPECT_LT(rel_err(got, ref), tol()) << "trans " << ta << tb;
        }
    }
    // unsupported combination
    EXPECT_EQ(dev_gemm(d_, 0, 0, 1, 1, 1, 1.0f, FSDP_DT_F32, bufs_[0], 1, bufs_[0], 1, 0.0f, FSDP_DT_BF16, bufs_[0], 1,
                       &err),
              FSDP_E_INVALID);
}

TEST_P(CudaKernels, LinearMatchesCpuAndPlansAreCached) {
    const int n = 37, inf = 70, outf = 45;
    auto x = in(randn((size_t)n * inf, 1)), w = in(randn((size_t)outf * inf, 2, 0.1f)),
         dy = in(randn((size_t)n * outf, 3));
    auto dx0 = in(randn((size_t)n * inf, 4)), dw0 = randn((size_t)outf * inf, 5);
    fsdp_err err;
    void *dX = up(x, dt()), *dW = up(w, dt()), *dY = alloc((size_t)n * outf * 4), *dDY = up(dy, dt());
    void *dDX = up(dx0, dt());
    float *dDW = (float *)up(dw0, FSDP_DT_F32);
    ASSERT_EQ(dev_linear_forward(d_, dt(), dX, dW, dY, n, inf, outf, &err), 0) << err.msg;
    ASSERT_EQ(dev_linear_backward_input(d_, dt(), dDY, dW, dDX, n, inf, outf, 1.0f, &err), 0) << err.msg;
    ASSERT_EQ(dev_linear_backward_weight(d_, dt(), dDY, dX, dDW, n, inf, outf, &err), 0) << err.msg;
    std::vector<float> y(n * outf), dx(dx0), dw(dw0);
    kc_linear_forward(x.data(), w.data(), y.data(), n, inf, outf, nullptr);
    kc_linear_backward_input(dy.data(), w.data(), dx.data(), n, inf, outf, 1.0f, nullptr);
    kc_linear_backward_weight(dy.data(), x.data(), dw.data(), n, inf, outf, nullptr);
    EXPECT_LT(rel_err(down(dY, y.size(), dt()), y), tol());
    EXPECT_LT(rel_err(down(dDX, dx.size(), dt()), dx), tol());
    EXPECT_LT(rel_err(down(dDW, dw.size(), FSDP_DT_F32), dw), dt() == FSDP_DT_F32 ? 1e-5 : 1e-3); // f32 output
    // beta 0 overwrites whatever dx held
    ASSERT_EQ(dev_linear_backward_input(d_, dt(), dDY, dW, dDX, n, inf, outf, 0.0f, &err), 0) << err.msg;
    kc_linear_backward_input(dy.data(), w.data(), dx.data(), n, inf, outf, 0.0f, nullptr);
    EXPECT_LT(rel_err(down(dDX, dx.size(), dt()), dx), tol());
    // the same shapes again: no new heuristic query
    int plans = 0;
    uint64_t q0 = 0, q1 = 0;
    dev_gemm_plan_stats(d_, &plans, &q0);
    EXPECT_GE(plans, 3);
    ASSERT_EQ(dev_linear_forward(d_, dt(), dX, dW, dY, n, inf, outf, &err), 0);
    ASSERT_EQ(dev_linear_backward_weight(d_, dt(), dDY, dX, dDW, n, inf, outf, &err), 0);
    dev_gemm_plan_stats(d_, nullptr, &q1);
    EXPECT_EQ(q1, q0);
}

// The residual add folded into the GEMM: y = res + x W^T with C = res, D = y (and in place, y = res).
TEST_P(CudaKernels, LinearForwardResidual) {
    const int n = 37, inf = 70, outf = 45;
    auto x = in(randn((size_t)n * inf, 1)), w = in(randn((size_t)outf * inf, 2, 0.1f)), r = in(randn((size_t)n * outf, 3));
    fsdp_err err;
    void *dX = up(x, dt()), *dW = up(w, dt()), *dR = up(r, dt()), *dY = alloc((size_t)n * outf * 4);
    ASSERT_EQ(dev_linear_forward_residual(d_, dt(), dX, dW, dR, dY, n, inf, outf, &err), 0) << err.msg;
    std::vector<float> y((size_t)n * outf);
    kc_linear_forward(x.data(), w.data(), y.data(), n, inf, outf, nullptr);
    for (size_t i = 0; i < y.size(); i++) y[i] = r[i] + y[i];
    EXPECT_LT(rel_err(down(dY, y.size(), dt()), y), tol());
    EXPECT_EQ(down(dR, r.size(), dt()), r); // the residual is only read
    ASSERT_EQ(dev_linear_forward_residual(d_, dt(), dX, dW, dR, dR, n, inf, outf, &err), 0) << err.msg;
    EXPECT_LT(rel_err(down(dR, y.size(), dt()), y), tol());
    EXPECT_EQ(dev_linear_forward_residual(d_, dt(), dX, dW, nullptr, dY, n, inf, outf, &err), FSDP_E_INVALID);
}

// ---- embedding ------------------------------------------------------------------------------------------

TEST_P(CudaKernels, Embedding) {
    const int vocab = 50, dim = 24, n = 40;
    auto table = in(randn((size_t)vocab * dim, 1));
    std::vector<int32_t> tok(n);
    for (int i = 0; i < n; i++) tok[i] = (i * 7) % 13; // repeats
    auto dout = in(randn((size_t)n * dim, 2));
    auto dtab0 = randn((size_t)vocab * dim, 3);
    fsdp_err err;
    void *dT = up(table, dt()), *dO = alloc((size_t)n * dim * 4), *dG = up(dout, dt());
    float *dTab = (float *)up(dtab0, FSDP_DT_F32);
    int32_t *dTok = up_raw(tok);
    int *dBad = up_raw(std::vector<int>{0});
    ASSERT_EQ(kcu_embedding_forward(dt(), dT, dTok, dO, n, vocab, dim, dBad, s_, &err), 0) << err.msg;
    ASSERT_EQ(kcu_embedding_backward(dt(), dG, dTok, dTab, n, vocab, dim, -1, dBad, s_, &err), 0) << err.msg;
    std::vector<float> out(n * dim), dtab(dtab0);
    ASSERT_EQ(kc_embedding_forward(table.data(), tok.data(), out.data(), n, vocab, dim, &err), 0);
    ASSERT_EQ(kc_embedding_backward(dout.data(), tok.data(), dtab.data(), n, vocab, dim, -1, &err), 0);
    EXPECT_EQ(down(dO, out.size(), dt()), out); // a copy: exact
    EXPECT_LT(rel_err(down(dTab, dtab.size(), FSDP_DT_F32), dtab), 1e-5);
    EXPECT_EQ(down_raw(dBad, 1)[0], 0);
    // padding_idx 7 (a token of the batch): its row keeps its value, the others are the CPU kernel's
    float *dPad = (float *)up(dtab0, FSDP_DT_F32);
    ASSERT_EQ(kcu_embedding_backward(dt(), dG, dTok, dPad, n, vocab, dim, 7, dBad, s_, &err), 0) << err.msg;
    std::vector<float> dpad(dtab0);
    ASSERT_EQ(kc_embedding_backward(dout.data(), tok.data(), dpad.data(), n, vocab, dim, 7, &err), 0);
    std::vector<float> gp = down(dPad, dpad.size(), FSDP_DT_F32);
    for (int j = 0; j < dim; j++) ASSERT_EQ(gp[(size_t)7 * dim + j], dtab0[(size_t)7 * dim + j]);
    EXPECT_LT(rel_err(gp, dpad), 1e-5);
    // bad ids: zero rows, no out-of-range access, the flag names a bad row
    tok[5] = vocab;
    tok[9] = -3;
    int32_t *dTok2 = up_raw(tok);
    ASSERT_EQ(kcu_embedding_forward(dt(), dT, dTok2, dO, n, vocab, dim, dBad, s_, &err), 0) << err.msg;
    auto got = down(dO, out.size(), dt());
    int bad = down_raw(dBad, 1)[0];
    EXPECT_TRUE(bad == 6 || bad == 10) << bad;
    for (int j = 0; j < dim; j++) {
        EXPECT_EQ(got[5 * dim + j], 0.0f);
        EXPECT_EQ(got[9 * dim + j], 0.0f);
        EXPECT_EQ(got[6 * dim + j], out[6 * dim + j]);
    }
}

// ---- RMSNorm ----------------------------------------------------------------------------------------------

TEST_P(CudaKernels, RmsNorm) {
    for (int dim : {96, 1000}) {
        const int n = 33;
        auto x = in(randn((size_t)n * dim, 1)), w = in(randn(dim, 2)), dy = in(randn((size_t)n * dim, 3));
        auto dx0 = in(randn((size_t)n * dim, 4)), dw0 = randn(dim, 5);
        fsdp_err err;
        void *dX = up(x, dt()), *dW = up(w, dt()), *dY = alloc((size_t)n * dim * 4), *dDY = up(dy, dt());
        void *dDX = up(dx0, dt());
        float *dR = (float *)alloc(n * 4), *dDW = (float *)up(dw0, FSDP_DT_F32);
        ASSERT_EQ(kcu_rmsnorm_forward(dt(), dX, dW, dY, dR, n, dim, 1e-5f, s_, &err), 0) << err.msg;
        ASSERT_EQ(kcu_rmsnorm_backward(dt(), dDY, dX, dW, dR, dDX, dDW, n, dim, s_, &err), 0) << err.msg;
        std::vector<float> y((size_t)n * dim), r(n), dx(dx0), dw(dw0);
        kc_rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), n, dim, 1e-5f);
        kc_rmsnorm_backward(dy.data(), x.data(), w.data(), r.data(), dx.data(), dw.data(), n, dim);
        EXPECT_LT(rel_err(down(dY, y.size(), dt()), y), tol()) << dim;
        EXPECT_LT(rel_err(down(dR, n, FSDP_DT_F32), r), 1e-6) << dim;
        EXPECT_LT(rel_err(down(dDX, dx.size(), dt()), dx), tol()) << dim;
        EXPECT_LT(rel_err(down(dDW, dim, FSDP_DT_F32), dw), 1e-5) << dim;
    }
}

// ---- RoPE -------------------------------------------------------------------------------------------------

TEST_P(CudaKernels, Rope) {
    const int B = 2, T = 9, nh = 3, hd = 16;
    kc_rope_params p = {500000.0, 1, 8.0, 1.0, 4.0, 16.0};
    std::vector<float> c((size_t)T * hd / 2), s((size_t)T * hd / 2);
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    auto x = in(randn((size_t)B * T * nh * hd, 1));
    float *dC = (float *)up(c, FSDP_DT_F32), *dS = (float *)up(s, FSDP_DT_F32);
    void *dX = up(x, dt());
    ASSERT_EQ(kcu_rope_forward(dt(), dX, dC, dS, B, T, nh, hd, s_, &err), 0) << err.msg;
    std::vector<float> ref(x);
    kc_rope_forward(ref.data(), c.data(), s.data(), B, T, nh, hd);
    auto got = down(dX, x.size(), dt());
    EXPECT_LT(rel_err(got, ref), dt() == FSDP_DT_F32 ? 1e-6 : 1e-2);
    // backward on the result, against the CPU backward on the same input
    std::vector<float> back(got);
    kc_rope_backward(back.data(), c.data(), s.data(), B, T, nh, hd);
    ASSERT_EQ(kcu_rope_backward(dt(), dX, dC, dS, B, T, nh, hd, s_, &err), 0) << err.msg;
    auto got2 = down(dX, x.size(), dt());
    EXPECT_LT(rel_err(got2, back), dt() == FSDP_DT_F32 ? 1e-6 : 1e-2);
    EXPECT_LT(rel_err(got2, x), dt() == FSDP_DT_F32 ? 1e-5 : 2e-2); // a rotation and its inverse
}

// q and k in one launch equal the per-tensor kernel bit for bit; the norm output from a saved rstd
// equals the forward's.
TEST_P(CudaKernels, RopeQkAndRmsNormApplyMatchTheUnfusedKernels) {
    const int B = 2, T = 9, H = 4, KV = 2, hd = 16, n = 33, dim = 96;
    kc_rope_params p = {500000.0, 1, 8.0, 1.0, 4.0, 16.0};
    std::vector<float> c((size_t)T * hd / 2), s((size_t)T * hd / 2);
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    auto q = in(randn((size_t)B * T * H * hd, 1)), k = in(randn((size_t)B * T * KV * hd, 2));
    float *dC = (float *)up(c, FSDP_DT_F32), *dS = (float *)up(s, FSDP_DT_F32);
    void *dQ = up(q, dt()), *dK = up(k, dt()), *dQ1 = up(q, dt()), *dK1 = up(k, dt());
    for (int dir = 0; dir < 2; dir++) {
        if (dir == 0) {
            ASSERT_EQ(kcu_rope_qk_forward(dt(), dQ, dK, dC, dS, B, T, H, KV, hd, s_, &err), 0) << err.msg;
            ASSERT_EQ(kcu_rope_forward(dt(), dQ1, dC, dS, B, T, H, hd, s_, &err), 0) << err.msg;
            ASSERT_EQ(kcu_rope_forward(dt(), dK1, dC, dS, B, T, KV, hd, s_, &err), 0) << err.msg;
        } else {
            ASSERT_EQ(kcu_rope_qk_backward(dt(), dQ, dK, dC, dS, B, T, H, KV, hd, s_, &err), 0) << err.msg;
            ASSERT_EQ(kcu_rope_backward(dt(), dQ1, dC, dS, B, T, H, hd, s_, &err), 0) << err.msg;
            ASSERT_EQ(kcu_rope_backward(dt(), dK1, dC, dS, B, T, KV, hd, s_, &err), 0) << err.msg;
        }
        EXPECT_EQ(down(dQ, q.size(), dt()), down(dQ1, q.size(), dt())) << "direction " << dir;
        EXPECT_EQ(down(dK, k.size(), dt()), down(dK1, k.size(), dt())) << "direction " << dir;
    }
    auto x = in(randn((size_t)n * dim, 3)), w = in(randn(dim, 4));
    void *dX = up(x, dt()), *dW = up(w, dt()), *dY = alloc((size_t)n * dim * 4), *dY2 = alloc((size_t)n * dim * 4);
    float *dR = (float *)alloc(n * 4);
    ASSERT_EQ(kcu_rmsnorm_forward(dt(), dX, dW, dY, dR, n, dim, 1e-5f, s_, &err), 0) << err.msg;
    ASSERT_EQ(kcu_rmsnorm_apply(dt(), dX, dW, dR, dY2, n, dim, s_, &err), 0) << err.msg;
    EXPECT_EQ(down(dY2, x.size(), dt()), down(dY, x.size(), dt()));
}

// ---- attention ---------------------------------------------------------------------------------------------

struct AttnCase {
    int B, T, H, KV, hd;
};

TEST_P(CudaKernels, AttentionForwardBackward) {
    const AttnCase cases[] = {{2, 77, 4, 2, 16}, {1, 40, 2, 1, 64}, {1, 33, 2, 2, 128}, {1, 21, 2, 1, 200}};
    for (const AttnCase &a : cases) {
        SCOPED_TRACE("B " + std::to_string(a.B) + " T " + std::to_string(a.T) + " H " + std::to_string(a.H) + " KV " +
                     std::to_string(a.KV) + " hd " + std::to_string(a.hd));
        const size_t nq = (size_t)a.B * a.T * a.H * a.hd, nk = (size_t)a.B * a.T * a.KV * a.hd,
                     nl = (size_t)a.B * a.H * a.T;
        auto q = in(randn(nq, 1)), k = in(randn(nk, 2)), v = in(randn(nk, 3)), dout = in(randn(nq, 4));
        fsdp_err err;
        void *dQ = up(q, dt()), *dK = up(k, dt()), *dV = up(v, dt()), *dDO = up(dout, dt());
        void *dO = alloc(nq * 4), *dDQ = alloc(nq * 4), *dDK = alloc(nk * 4), *dDV = alloc(nk * 4);
        float *dL = (float *)alloc(nl * 4);
        float *scratch = (float *)alloc(kcu_attention_scratch_floats(a.B, a.T, a.H) * 4);
        ASSERT_EQ(kcu_attention_forward(dt(), dQ, dK, dV, dO, dL, a.B, a.T, a.H, a.KV, a.hd, s_, &err), 0) << err.msg;
        ASSERT_EQ(kcu_attention_backward(dt(), dQ, dK, dV, dO, dL, dDO, dDQ, dDK, dDV, a.B, a.T, a.H, a.KV, a.hd, scratch,
                                         s_, &err),
                  0)
            << err.msg;
        std::vector<float> out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
        ASSERT_EQ(kc_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), a.B, a.T, a.H, a.KV, a.hd,
                                       nullptr, &err),
                  0);
        auto got_out = down(dO, nq, dt());
        EXPECT_LT(rel_err(got_out, out), tol());
        EXPECT_LT(rel_err(down(dL, nl, FSDP_DT_F32), lse), 1e-5);
        // the backward's reference uses the output the GPU stored (bf16-rounded in the bf16 mode)
        ASSERT_EQ(kc_attention_backward(q.data(), k.data(), v.data(), got_out.data(), lse.data(), dout.data(), dq.data(),
                                        dk.data(), dv.data(), a.B, a.T, a.H, a.KV, a.hd, nullptr, &err),
                  0);
        EXPECT_LT(rel_err(down(dDQ, nq, dt()), dq), tol());
        EXPECT_LT(rel_err(down(dDK, nk, dt()), dk), tol());
        EXPECT_LT(rel_err(down(dDV, nk, dt()), dv), tol());
    }
}

// ---- SwiGLU --------------------------------------------------------------------------------------------------

TEST_P(CudaKernels, SwiGlu) {
    const int n = 1000;
    auto a = in(randn(n, 1, 3.0f)), b = in(randn(n, 2)), g = in(randn(n, 3));
    fsdp_err err;
    void *dA = up(a, dt()), *dB = up(b, dt()), *dG = up(g, dt());
    void *dO = alloc(n * 4), *dDA = alloc(n * 4), *dDB = alloc(n * 4);
    ASSERT_EQ(kcu_swiglu_forward(dt(), dA, dB, dO, n, s_, &err), 0) << err.msg;
    ASSERT_EQ(kcu_swiglu_backward(dt(), dA, dB, dG, dDA, dDB, n, s_, &err), 0) << err.msg;
    std::vector<float> out(n), da(n), db(n);
    kc_swiglu_forward(a.data(), b.data(), out.data(), n);
    kc_swiglu_backward(a.data(), b.data(), g.data(), da.data(), db.data(), n);
    EXPECT_LT(rel_err(down(dO, n, dt()), out), tol());
    EXPECT_LT(rel_err(down(dDA, n, dt()), da), tol());
    EXPECT_LT(rel_err(down(dDB, n, dt()), db), tol());
}

// ---- cross-entropy ----------------------------------------------------------------------------------------------

TEST_P(CudaKernels, CrossEntropy) {
    const int n = 29, V = 300, ignore = -100;
    auto logits = in(randn((size_t)n * V, 1, 2.0f));
    std::vector<int32_t> lab(n);
    std::mt19937 g(5);
    for (int i = 0; i < n; i++) lab[i] = i % 7 == 3 ? ignore : (int32_t)(g() % V);
    fsdp_err err;
    void *dX = up(logits, dt());
    int32_t *dLab = up_raw(lab);
    float *dLse = (float *)alloc(n * 4);
    double *dSums = (double *)alloc(16);
    int *dBad = up_raw(std::vector<int>{0});
    ASSERT_EQ(kcu_xent_forward(dt(), dX, dLab, n, V, ignore, dLse, dSums, dBad, s_, &err), 0) << err.msg;
    std::vector<float> lse(n);
    double loss_sum = 0;
    int64_t n_valid = 0;
    ASSERT_EQ(kc_xent_forward(logits.data(), lab.data(), n, V, ignore, lse.data(), &loss_sum, &n_valid, &err), 0);
    auto sums = down_raw(dSums, 2);
    EXPECT_NEAR(sums[0], loss_sum, 1e-6 * std::fabs(loss_sum));
    EXPECT_EQ(sums[1], (double)n_valid);
    EXPECT_LT(rel_err(down(dLse, n, FSDP_DT_F32), lse), 1e-6);
    EXPECT_EQ(down_raw(dBad, 1)[0], 0);
    const float scale = 1.0f / (float)n_valid;
    void *dD = alloc((size_t)n * V * 4);
    ASSERT_EQ(kcu_xent_backward(dt(), dX, dLab, dLse, dD, n, V, ignore, scale, s_, &err), 0) << err.msg;
    std::vector<float> dref((size_t)n * V);
    kc_xent_backward(logits.data(), lab.data(), lse.data(), dref.data(), n, V, ignore, scale);
    EXPECT_LT(rel_err(down(dD, dref.size(), dt()), dref), tol());
    // in place (dlogits aliasing logits)
    ASSERT_EQ(kcu_xent_backward(dt(), dX, dLab, dLse, dX, n, V, ignore, scale, s_, &err), 0) << err.msg;
    EXPECT_LT(rel_err(down(dX, dref.size(), dt()), dref), tol());
    // a label out of range is flagged and contributes nothing
    lab[4] = V;
    int32_t *dLab2 = up_raw(lab);
    void *dX2 = up(logits, dt());
    ASSERT_EQ(kcu_xent_forward(dt(), dX2, dLab2, n, V, ignore, dLse, dSums, dBad, s_, &err), 0) << err.msg;
    EXPECT_EQ(down_raw(dBad, 1)[0], 5);
    EXPECT_EQ(down_raw(dSums, 2)[1], (double)(n_valid - 1));
}

// ---- small elementwise ----------------------------------------------------------------------------------------

TEST_P(CudaKernels, AddSumsqScale) {
    const int n = 5000;
    auto a = in(randn(n, 1)), b = in(randn(n, 2));
    fsdp_err err;
    void *dA = up(a, dt()), *dB = up(b, dt());
    ASSERT_EQ(kcu_add(dt(), dA, dB, dA, n, s_, &err), 0) << err.msg; // out aliases a
    std::vector<float> sum(n);
    for (int i = 0; i < n; i++) sum[i] = a[i] + b[i];
    EXPECT_LT(rel_err(down(dA, n, dt()), sum), dt() == FSDP_DT_F32 ? 1e-7 : 1e-2);
    double *dS = (double *)alloc(8);
    ASSERT_EQ(kcu_sumsq(dt(), dB, n, dS, s_, &err), 0) << err.msg;
    double ref = kc_sumsq(b.data(), n);
    EXPECT_NEAR(down_raw(dS, 1)[0], ref, 1e-12 * ref);
    auto x = randn(n, 3);
    float *dXf = (float *)up(x, FSDP_DT_F32);
    ASSERT_EQ(kcu_scale(dXf, n, 0.37f, s_, &err), 0) << err.msg;
    kc_scale(x.data(), n, 0.37f);
    EXPECT_EQ(down(dXf, n, FSDP_DT_F32), x);
}

INSTANTIATE_TEST_SUITE_P(CudaDtypes, CudaKernels, ::testing::Values(FSDP_DT_F32, FSDP_DT_BF16),
                         [](const ::testing::TestParamInfo<fsdp_dtype> &info) {
                             return std::string(fsdp_dtype_name(info.param));
                         });

// ---- bit-exact kernels -----------------------------------------------------------------------------------------

TEST_F(CudaExact, CastsRoundLikeTheHost) {
    std::vector<float> v = randn(3000, 9, 100.0f);
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                 0xffa00000u, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                 0x7f7fffffu, 0x3f7fffffu, 0x00008000u, 0x00018000u};
    for (uint32_t u : specials) {
        float f;
        memcpy(&f, &u, 4);
        v.push_back(f);
    }
    const size_t n = v.size();
    std::vector<uint16_t> want(n);
    for (size_t i = 0; i < n; i++) want[i] = fsdp_f32_to_bf16(v[i]);
    fsdp_err err;
    float *dF = (float *)up(v, FSDP_DT_F32);
    uint16_t *dH = (uint16_t *)alloc(n * 2);
    ASSERT_EQ(kcu_cast(dH, FSDP_DT_BF16, dF, FSDP_DT_F32, (int64_t)n, s_, &err), 0) << err.msg;
    EXPECT_EQ(down_raw(dH, n), want);
    float *dBack = (float *)alloc(n * 4);
    ASSERT_EQ(kcu_cast(dBack, FSDP_DT_F32, dH, FSDP_DT_BF16, (int64_t)n, s_, &err), 0) << err.msg;
    auto back = down_raw(dBack, n);
    for (size_t i = 0; i < n; i++) {
        float f = fsdp_bf16_to_f32(want[i]);
        ASSERT_EQ(memcmp(&back[i], &f, 4), 0) << i;
    }
    uint16_t *dCopy = (uint16_t *)alloc(n * 2);
    ASSERT_EQ(kcu_cast(dCopy, FSDP_DT_BF16, dH, FSDP_DT_BF16, (int64_t)n, s_, &err), 0) << err.msg;
    EXPECT_EQ(down_raw(dCopy, n), want);
}

TEST_F(CudaExact, AdamWMultiTensorIsBitExact) {
    for (double beta1 : {0.9, 0.3}) { // both branches of torch's lerp
        const int64_t sizes[] = {1000, 0, 4097, 8193, 1};
        std::vector<std::vector<float>> p, g, m, v;
        std::vector<kcu_tensor> ts;
        std::vector<float *> dp, dg, dm, dv;
        unsigned seed = 1;
        for (int64_t n : sizes) {
            p.push_back(randn(n, seed++));
            g.push_back(randn(n, seed++, 0.01f));
            m.push_back(std::vector<float>(n, 0.0f));
            v.push_back(std::vector<float>(n, 0.0f));
            dp.push_back((float *)up(p.back(), FSDP_DT_F32));
            dg.push_back((float *)up(g.back(), FSDP_DT_F32));
            dm.push_back((float *)up(m.back(), FSDP_DT_F32));
            dv.push_back((float *)up(v.back(), FSDP_DT_F32));
            ts.push_back({dp.back(), dg.back(), dm.back(), dv.back(), n});
        }
        fsdp_err err;
        kcu_tensor_list *l = nullptr;
        ASSERT_EQ(kcu_tensor_list_create(ts.data(), (int)ts.size(), &l, &err), 0) << err.msg;
        kc_adamw_hparams h = {3e-3, beta1, 0.95, 1e-8, 0.1};
        for (int64_t step = 1; step <= 3; step++) {
            ASSERT_EQ(kcu_adamw_step(l, &h, step, s_, &err), 0) << err.msg;
            for (size_t t = 0; t < ts.size(); t++)
                kc_adamw_step(p[t].data(), g[t].data(), m[t].data(), v[t].data(), sizes[t], &h, step);
        }
        for (size_t t = 0; t < ts.size(); t++) {
            auto gp = down_raw(dp[t], sizes[t]), gm = down_raw(dm[t], sizes[t]), gv = down_raw(dv[t], sizes[t]);
            for (int64_t i = 0; i < sizes[t]; i++) {
                ASSERT_EQ(memcmp(&gp[i], &p[t][i], 4), 0) << "param " << t << "[" << i << "] " << gp[i] << " vs " << p[t][i];
                ASSERT_EQ(memcmp(&gm[i], &m[t][i], 4), 0) << "exp_avg " << t << "[" << i << "]";
                ASSERT_EQ(memcmp(&gv[i], &v[t][i], 4), 0) << "exp_avg_sq " << t << "[" << i << "]";
            }
        }
        // gradient norm and clipping over the same list
        double *dS = (double *)alloc(8);
        ASSERT_EQ(kcu_list_grad_sumsq(l, dS, s_, &err), 0) << err.msg;
        double ref = 0;
        for (size_t t = 0; t < ts.size(); t++) ref += kc_sumsq(g[t].data(), sizes[t]);
        EXPECT_NEAR(down_raw(dS, 1)[0], ref, 1e-12 * ref);
        const float coef = (float)kc_clip_coef(std::sqrt(ref), 0.01);
        ASSERT_EQ(kcu_list_grad_scale(l, coef, s_, &err), 0) << err.msg;
        for (size_t t = 0; t < ts.size(); t++) {
            kc_scale(g[t].data(), sizes[t], coef);
            EXPECT_EQ(down_raw(dg[t], sizes[t]), g[t]) << t;
        }
        kcu_tensor_list_free(l);
    }
    // a list without optimizer state cannot take an AdamW step
    kcu_tensor t = {(float *)alloc(64), (float *)alloc(64), nullptr, nullptr, 16};
    kcu_tensor_list *l = nullptr;
    fsdp_err err;
    ASSERT_EQ(kcu_tensor_list_create(&t, 1, &l, &err), 0) << err.msg;
    kc_adamw_hparams h = {1e-3, 0.9, 0.95, 1e-8, 0.0};
    EXPECT_EQ(kcu_adamw_step(l, &h, 1, s_, &err), FSDP_E_INVALID);
    kcu_tensor_list_free(l);
}

// ---- the device runtime on a GPU -------------------------------------------------------------------------------

TEST_F(CudaExact, RuntimeStreamsMemoryAndTimers) {
    fsdp_err err;
    EXPECT_GE(dev_ctx_ordinal(d_), 0);
    EXPECT_GT(dev_ctx_sm_count(d_), 0);
    EXPECT_GT(dev_ctx_total_mem(d_), 0u);
    EXPECT_NE(dev_ctx_cublaslt(d_), nullptr);
    EXPECT_NE(dev_ctx_stream(d_, DEV_STREAM_COMM), dev_ctx_stream(d_, DEV_STREAM_COMPUTE));
    // a step loop: no cudaMalloc after the first step
    const size_t sizes[] = {1000, 1 << 20, 3 << 20, 1000, 12345};
    dev_mem_stats st;
    uint64_t after_warmup = 0;
    for (int step = 0; step < 4; step++) {
        std::vector<void *> ps;
        for (size_t s : sizes) {
            void *p = nullptr;
            ASSERT_EQ(dev_alloc(d_, s, &p, &err), 0) << err.msg;
            ASSERT_EQ(dev_memset0(d_, p, s, DEV_STREAM_COMPUTE, &err), 0) << err.msg;
            ps.push_back(p);
        }
        // the last block is used on the copy stream and freed behind it
        ASSERT_EQ(dev_stream_wait(d_, DEV_STREAM_COPY, DEV_STREAM_COMPUTE, &err), 0) << err.msg;
        ASSERT_EQ(dev_memset0(d_, ps.back(), sizes[4], DEV_STREAM_COPY, &err), 0) << err.msg;
        ASSERT_EQ(dev_free_after(d_, ps.back(), DEV_STREAM_COPY, &err), 0) << err.msg;
        ps.pop_back();
        for (void *p : ps) ASSERT_EQ(dev_free(d_, p, &err), 0) << err.msg;
        ASSERT_EQ(dev_sync(d_, &err), 0) << err.msg;
        dev_mem_stats_get(d_, &st, nullptr);
        if (step == 0) after_warmup = st.backend_allocs;
    }
    EXPECT_EQ(st.backend_allocs, after_warmup);
    EXPECT_EQ(st.in_use, 0u);
    EXPECT_GE(st.peak_in_use, (size_t)(4 << 20));
    // pinned host memory and an asynchronous round trip through the copy stream
    const size_t n = 1 << 16;
    float *h = nullptr, *h2 = nullptr;
    void *dbuf = nullptr;
    ASSERT_EQ(dev_host_alloc(d_, n * 4, (void **)&h, &err), 0) << err.msg;
    ASSERT_EQ(dev_host_alloc(d_, n * 4, (void **)&h2, &err), 0) << err.msg;
    ASSERT_EQ(dev_alloc(d_, n * 4, &dbuf, &err), 0) << err.msg;
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    dev_timer tm;
    ASSERT_EQ(dev_timer_start(d_, &tm, DEV_STREAM_COPY, &err), 0) << err.msg;
    ASSERT_EQ(dev_copy_h2d(d_, dbuf, h, n * 4, DEV_STREAM_COPY, &err), 0) << err.msg;
    ASSERT_EQ(dev_copy_d2h(d_, h2, dbuf, n * 4, DEV_STREAM_COPY, &err), 0) << err.msg;
    float ms = -1.0f;
    ASSERT_EQ(dev_timer_stop(&tm, &ms, &err), 0) << err.msg;
    EXPECT_GE(ms, 0.0f);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(h2[i], (float)i);
    ASSERT_EQ(dev_free_after(d_, dbuf, DEV_STREAM_COPY, &err), 0) << err.msg;
    EXPECT_EQ(dev_host_free(d_, h, &err), 0);
    EXPECT_EQ(dev_host_free(d_, h2, &err), 0);
    EXPECT_EQ(dev_free(d_, h, &err), FSDP_E_INVALID); // not a device block
    ASSERT_EQ(dev_empty_cache(d_, &err), 0) << err.msg;
    dev_mem_stats pinned;
    dev_mem_stats_get(d_, &st, &pinned);
    EXPECT_EQ(st.reserved, 0u);
    EXPECT_EQ(pinned.reserved, 0u);
    // a GPU beyond the visible ones
    int count = 0;
    ASSERT_EQ(dev_count(&count, &err), 0);
    dev_options opt = {count, 0};
    dev_ctx *d2 = dev_ctx_create(&opt, &err);
    if (count == 1) {
        ASSERT_NE(d2, nullptr) << err.msg; // one visible GPU (CUDA_VISIBLE_DEVICES per rank): use it
        EXPECT_EQ(dev_ctx_ordinal(d2), 0);
        dev_ctx_free(d2);
        ASSERT_EQ(dev_ctx_bind(d_, &err), 0);
    } else {
        EXPECT_EQ(d2, nullptr);
        EXPECT_EQ(err.code, FSDP_E_DEVICE);
    }
}

} // namespace
