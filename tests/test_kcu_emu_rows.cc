// kernels/cuda/kcu_rows.cu under the host emulation (tests/kcu_emu.h): RMSNorm and cross-entropy
// through their kcu_* host wrappers against the CPU kernels, f32 and bf16, with rows longer than a
// block (strided loops), a partial warp of columns, and several blocks of the backward's dw atomics.
#include "tests/kcu_emu_test.h"

namespace {

using namespace kcu_emu_test;
namespace dev = kcu_emu_dev;

typedef KcuEmuDt KcuEmuRows;

TEST_P(KcuEmuRows, RmsNorm) {
    // dim 300: 256 threads, two passes per row; dim 40: 64 threads, the second warp partly idle.
    // n 35: the backward has 2 blocks of 32 rows (the second partial), both adding into dw.
    // dim 13000 (n 3): the backward's 52000 bytes of dynamic shared memory need the opt-in.
    for (int dim : {300, 40, 13000}) {
        const int n = dim > 1000 ? 3 : 35;
        auto x = in(randn((size_t)n * dim, 1)), w = in(randn(dim, 2)), dy = in(randn((size_t)n * dim, 3));
        auto dx0 = in(randn((size_t)n * dim, 4)), dw0 = randn(dim, 5);
        Buf X(x, dt()), W(w, dt()), Y((size_t)n * dim, dt()), DY(dy, dt()), DX(dx0, dt()), R(n, FSDP_DT_F32),
            DW(dw0, FSDP_DT_F32);
        fsdp_err err;
        ASSERT_EQ(dev::kcu_rmsnorm_forward(dt(), X.ptr(), W.ptr(), Y.ptr(), R.f(), n, dim, 1e-5f, nullptr, &err), 0)
            << err.msg;
        ASSERT_EQ(dev::kcu_rmsnorm_backward(dt(), DY.ptr(), X.ptr(), W.ptr(), R.f(), DX.ptr(), DW.f(), n, dim, nullptr,
                                            &err),
                  0)
            << err.msg;
        std::vector<float> y((size_t)n * dim), r(n), dx(dx0), dw(dw0);
        kc_rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), n, dim, 1e-5f);
        kc_rmsnorm_backward(dy.data(), x.data(), w.data(), r.data(), dx.data(), dw.data(), n, dim);
        EXPECT_EQ(nonfinite(Y.get()) + nonfinite(R.get()), 0u);
        EXPECT_LT(rel_err(Y.get(), y), tol()) << dim;
        EXPECT_LT(rel_err(R.get(), r), 1e-6) << dim;
        EXPECT_LT(rel_err(DX.get(), dx), tol()) << dim;
        EXPECT_LT(rel_err(DW.get(), dw), 1e-5) << dim;
        for (auto *b : {&X, &W, &Y, &DY, &DX, &R, &DW}) EXPECT_TRUE(b->guard_ok());
    }
    fsdp_err err;
    EXPECT_EQ(dev::kcu_rmsnorm_backward(dt(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 60000, nullptr,
                                        &err),
              FSDP_E_INVALID);
}

// The norm output from a saved rstd (selective activation checkpointing): the forward's y bit for bit,
// and the CPU's kc_rmsnorm_apply on the same rstd.
TEST_P(KcuEmuRows, RmsNormApplyEqualsForward) {
    for (int dim : {300, 40}) { // 11 and 2 blocks of 256 elements, the last partial
        const int n = 9;
        auto x = in(randn((size_t)n * dim, 1)), w = in(randn(dim, 2));
        Buf X(x, dt()), W(w, dt()), Y((size_t)n * dim, dt()), Y2((size_t)n * dim, dt()), R(n, FSDP_DT_F32);
        fsdp_err err;
        ASSERT_EQ(dev::kcu_rmsnorm_forward(dt(), X.ptr(), W.ptr(), Y.ptr(), R.f(), n, dim, 1e-5f, nullptr, &err), 0)
            << err.msg;
        launches();
        ASSERT_EQ(dev::kcu_rmsnorm_apply(dt(), X.ptr(), W.ptr(), R.f(), Y2.ptr(), n, dim, nullptr, &err), 0) << err.msg;
        auto ls = launches(); // one elementwise launch over n*dim, 256 threads a block
        EXPECT_EQ(ls.size(), 1u);
        EXPECT_EQ(max_blocks(ls), (unsigned)((n * dim + 255) / 256)) << dim;
        auto y = Y.get(), y2 = Y2.get();
        EXPECT_EQ(nonfinite(y2), 0u);
        EXPECT_EQ(y2, y) << dim;
        std::vector<float> ref((size_t)n * dim), yc((size_t)n * dim), rc(n);
        auto r = R.get();
        kc_rmsnorm_apply(x.data(), w.data(), r.data(), ref.data(), n, dim);
        if (dt() == FSDP_DT_F32) EXPECT_EQ(y2, ref) << dim; // the same two float roundings
        else EXPECT_LT(rel_err(y2, ref), 1e-2) << dim;       // then one to bf16
        kc_rmsnorm_forward(x.data(), w.data(), yc.data(), rc.data(), n, dim, 1e-5f);
        kc_rmsnorm_apply(x.data(), w.data(), rc.data(), ref.data(), n, dim);
        EXPECT_EQ(ref, yc) << dim; // the CPU pair agrees bit for bit too
        for (auto *b : {&X, &W, &Y, &Y2, &R}) EXPECT_TRUE(b->guard_ok());
    }
    fsdp_err err;
    EXPECT_EQ(dev::kcu_rmsnorm_apply(dt(), nullptr, nullptr, nullptr, nullptr, 4, 0, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_rmsnorm_apply(FSDP_DT_I64, nullptr, nullptr, nullptr, nullptr, 4, 8, nullptr, &err),
              FSDP_E_INVALID);
}

TEST_P(KcuEmuRows, CrossEntropy) {
    const int n = 13, V = 300, ignore = -100;
    auto logits = in(randn((size_t)n * V, 1, 2.0f));
    std::vector<int32_t> lab(n);
    std::mt19937 g(5);
    for (int i = 0; i < n; i++) lab[i] = i % 7 == 3 ? ignore : (int32_t)(g() % V);
    lab[1] = V - 1; // the last column
    Buf X(logits, dt()), L(n, FSDP_DT_F32), D((size_t)n * V, dt());
    double sums[2] = {NAN, NAN};
    int bad = 0;
    fsdp_err err;
    ASSERT_EQ(dev::kcu_xent_forward(dt(), X.ptr(), lab.data(), n, V, ignore, L.f(), sums, &bad, nullptr, &err), 0)
        << err.msg;
    std::vector<float> lse(n);
    double loss_sum = 0;
    int64_t n_valid = 0;
    ASSERT_EQ(kc_xent_forward(logits.data(), lab.data(), n, V, ignore, lse.data(), &loss_sum, &n_valid, &err), 0);
    EXPECT_NEAR(sums[0], loss_sum, 1e-6 * std::fabs(loss_sum));
    EXPECT_EQ(sums[1], (double)n_valid);
    EXPECT_EQ(nonfinite(L.get()), 0u);
    EXPECT_LT(rel_err(L.get(), lse), 1e-6);
    EXPECT_EQ(bad, 0);
    const float scale = 1.0f / (float)n_valid;
    ASSERT_EQ(dev::kcu_xent_backward(dt(), X.ptr(), lab.data(), L.f(), D.ptr(), n, V, ignore, scale, nullptr, &err), 0)
        << err.msg;
    std::vector<float> dref((size_t)n * V);
    kc_xent_backward(logits.data(), lab.data(), lse.data(), dref.data(), n, V, ignore, scale);
    EXPECT_EQ(nonfinite(D.get()), 0u);
    EXPECT_LT(rel_err(D.get(), dref), tol());
    // in place
    ASSERT_EQ(dev::kcu_xent_backward(dt(), X.ptr(), lab.data(), L.f(), X.ptr(), n, V, ignore, scale, nullptr, &err), 0);
    EXPECT_LT(rel_err(X.get(), dref), tol());
    // a label out of range is flagged and contributes nothing
    lab[4] = V;
    X.set(logits);
    ASSERT_EQ(dev::kcu_xent_forward(dt(), X.ptr(), lab.data(), n, V, ignore, L.f(), sums, &bad, nullptr, &err), 0);
    EXPECT_EQ(bad, 5);
    EXPECT_EQ(sums[1], (double)(n_valid - 1));
    EXPECT_EQ(L.get()[4], 0.0f);
    EXPECT_TRUE(X.guard_ok() && L.guard_ok() && D.guard_ok());
}

// The training head's per-chunk kernel: rows processed in chunks (offsets into the same buffers),
// sums added over the chunks, gradient in place; equal to the CPU forward + backward of the whole
// batch, with ignored rows, a label in the last column and a chunk of a single row.
TEST_P(KcuEmuRows, CrossEntropyChunkedForwardAndBackward) {
    const int n = 7, V = 300, ignore = -100;
    auto logits = in(randn((size_t)n * V, 7, 2.0f));
    std::vector<int32_t> lab(n);
    std::mt19937 g(9);
    for (int i = 0; i < n; i++) lab[i] = i % 5 == 2 ? ignore : (int32_t)(g() % V);
    lab[0] = V - 1;
    std::vector<float> lse(n), dref((size_t)n * V);
    double loss_sum = 0;
    int64_t n_valid = 0;
    fsdp_err err;
    ASSERT_EQ(kc_xent_forward(logits.data(), lab.data(), n, V, ignore, lse.data(), &loss_sum, &n_valid, &err), 0);
    const float scale = 1.0f / (float)n_valid;
    kc_xent_backward(logits.data(), lab.data(), lse.data(), dref.data(), n, V, ignore, scale);
    for (int chunk : {3, 1}) {
        for (bool backward : {false, true}) {
            if (chunk == 1 && !backward) continue;
            Buf X(logits, dt()), L(n, FSDP_DT_F32);
            double sums[2] = {0, 0};
            int bad = 0;
            const size_t es = fsdp_dtype_size(dt());
            for (int r0 = 0; r0 < n; r0 += chunk) {
                const int rows = r0 + chunk <= n ? chunk : n - r0;
                void *xc = (char *)X.ptr() + (size_t)r0 * V * es;
                ASSERT_EQ(dev::kcu_xent_chunk(dt(), xc, lab.data() + r0, rows, V, ignore, scale, L.f() + r0, sums, &bad,
                                              backward ? xc : nullptr, nullptr, &err),
                          0)
                    << err.msg;
            }
            EXPECT_NEAR(sums[0], loss_sum, 1e-6 * std::fabs(loss_sum)) << chunk;
            EXPECT_EQ(sums[1], (double)n_valid) << chunk;
            EXPECT_EQ(bad, 0);
            EXPECT_LT(rel_err(L.get(), lse), 1e-6) << chunk;
            if (backward) {
                EXPECT_EQ(nonfinite(X.get()), 0u);
                EXPECT_LT(rel_err(X.get(), dref), tol()) << chunk;
                const std::vector<float> got = X.get();
                for (int i = 0; i < n; i++) {
                    if (lab[i] != ignore) continue;
                    for (int j = 0; j < V; j++) ASSERT_EQ(got[(size_t)i * V + j], 0.0f) << i;
                }
            } else {
                EXPECT_EQ(X.get(), logits) << "forward only leaves the logits";
            }
            EXPECT_TRUE(X.guard_ok() && L.guard_ok());
        }
    }
    // the same bits as kcu_xent_forward + kcu_xent_backward
    Buf A(logits, dt()), B(logits, dt()), LA(n, FSDP_DT_F32), LB(n, FSDP_DT_F32);
    double sa[2] = {0, 0}, sb[2];
    ASSERT_EQ(dev::kcu_xent_chunk(dt(), A.ptr(), lab.data(), n, V, ignore, scale, LA.f(), sa, nullptr, A.ptr(), nullptr,
                                  &err),
              0);
    ASSERT_EQ(dev::kcu_xent_forward(dt(), B.ptr(), lab.data(), n, V, ignore, LB.f(), sb, nullptr, nullptr, &err), 0);
    ASSERT_EQ(dev::kcu_xent_backward(dt(), B.ptr(), lab.data(), LB.f(), B.ptr(), n, V, ignore, scale, nullptr, &err), 0);
    EXPECT_EQ(A.get(), B.get());
    EXPECT_EQ(LA.get(), LB.get());
    EXPECT_EQ(sa[0], sb[0]);
    // a label out of range is flagged, its row contributes nothing and gets a zero gradient
    lab[3] = -7;
    Buf Y(logits, dt()), LY(n, FSDP_DT_F32);
    double sy[2] = {0, 0};
    int bad = 0;
    ASSERT_EQ(dev::kcu_xent_chunk(dt(), Y.ptr(), lab.data(), n, V, ignore, scale, LY.f(), sy, &bad, Y.ptr(), nullptr,
                                  &err),
              0);
    EXPECT_EQ(bad, 4);
    EXPECT_EQ(sy[1], (double)(n_valid - 1));
    const std::vector<float> gy = Y.get();
    for (int j = 0; j < V; j++) ASSERT_EQ(gy[(size_t)3 * V + j], 0.0f);
    EXPECT_EQ(dev::kcu_xent_chunk(dt(), Y.ptr(), lab.data(), n, 0, ignore, scale, LY.f(), sy, &bad, nullptr, nullptr,
                                  &err),
              FSDP_E_INVALID);
}

INSTANTIATE_TEST_SUITE_P(KcuEmuDtypes, KcuEmuRows, ::testing::Values(FSDP_DT_F32, FSDP_DT_BF16), dt_name);

} // namespace
