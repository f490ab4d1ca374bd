// kernels/cuda/kcu_elementwise.cu under the host emulation (tests/kcu_emu.h): casts, add, scale,
// sumsq, SwiGLU, RoPE and embedding through their kcu_* host wrappers, against the CPU kernels, in
// f32 and bf16 storage, at sizes with several blocks and a partial last block. Outputs start as NaN.
#include "tests/kcu_emu_test.h"

namespace {

using namespace kcu_emu_test;
namespace dev = kcu_emu_dev;

typedef KcuEmuDt KcuEmuElementwise;

TEST_P(KcuEmuElementwise, AddScaleSumsq) {
    const int n = 1000; // 4 blocks of 256, the last partial
    auto a = in(randn(n, 1)), b = in(randn(n, 2));
    Buf A(a, dt()), B(b, dt()), O(n, dt());
    fsdp_err err;
    ASSERT_EQ(dev::kcu_add(dt(), A.ptr(), B.ptr(), O.ptr(), n, nullptr, &err), 0) << err.msg;
    EXPECT_EQ(max_blocks(launches()), 4u);
    std::vector<float> sum(n);
    for (int i = 0; i < n; i++) sum[i] = a[i] + b[i];
    auto got = O.get();
    EXPECT_EQ(nonfinite(got), 0u);
    EXPECT_LT(rel_err(got, sum), dt() == FSDP_DT_F32 ? 1e-7 : 1e-2);
    ASSERT_EQ(dev::kcu_add(dt(), A.ptr(), B.ptr(), A.ptr(), n, nullptr, &err), 0) << err.msg; // out aliases a
    EXPECT_EQ(A.get(), got);
    double s = NAN;
    ASSERT_EQ(dev::kcu_sumsq(dt(), B.ptr(), n, &s, nullptr, &err), 0) << err.msg;
    const double ref = kc_sumsq(b.data(), n);
    EXPECT_NEAR(s, ref, 1e-12 * ref);
    EXPECT_TRUE(A.guard_ok() && B.guard_ok() && O.guard_ok());
    EXPECT_EQ(dev::kcu_add(dt(), A.ptr(), B.ptr(), O.ptr(), -1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_add(FSDP_DT_I64, A.ptr(), B.ptr(), O.ptr(), n, nullptr, &err), FSDP_E_INVALID);
}

TEST_P(KcuEmuElementwise, SwiGlu) {
    const int n = 700;
    auto a = in(randn(n, 1, 3.0f)), b = in(randn(n, 2)), g = in(randn(n, 3));
    Buf A(a, dt()), B(b, dt()), G(g, dt()), O(n, dt()), DA(n, dt()), DB(n, dt());
    fsdp_err err;
    ASSERT_EQ(dev::kcu_swiglu_forward(dt(), A.ptr(), B.ptr(), O.ptr(), n, nullptr, &err), 0) << err.msg;
    ASSERT_EQ(dev::kcu_swiglu_backward(dt(), A.ptr(), B.ptr(), G.ptr(), DA.ptr(), DB.ptr(), n, nullptr, &err), 0)
        << err.msg;
    std::vector<float> out(n), da(n), db(n);
    kc_swiglu_forward(a.data(), b.data(), out.data(), n);
    kc_swiglu_backward(a.data(), b.data(), g.data(), da.data(), db.data(), n);
    for (auto *p : {&O, &DA, &DB}) EXPECT_EQ(nonfinite(p->get()), 0u);
    EXPECT_LT(rel_err(O.get(), out), tol());
    EXPECT_LT(rel_err(DA.get(), da), tol());
    EXPECT_LT(rel_err(DB.get(), db), tol());
    EXPECT_TRUE(O.guard_ok() && DA.guard_ok() && DB.guard_ok());
}

// The backward that recomputes the product (selective checkpointing): da and db of the backward,
// out of the forward, bit for bit, on the device and on the CPU.
TEST_P(KcuEmuElementwise, SwiGluBackwardRecompute) {
    const int n = 700; // 3 blocks, the last partial
    auto a = in(randn(n, 1, 3.0f)), b = in(randn(n, 2)), g = in(randn(n, 3));
    Buf A(a, dt()), B(b, dt()), G(g, dt()), O(n, dt()), DA(n, dt()), DB(n, dt()), O2(n, dt()), DA2(n, dt()),
        DB2(n, dt());
    fsdp_err err;
    ASSERT_EQ(dev::kcu_swiglu_forward(dt(), A.ptr(), B.ptr(), O.ptr(), n, nullptr, &err), 0) << err.msg;
    ASSERT_EQ(dev::kcu_swiglu_backward(dt(), A.ptr(), B.ptr(), G.ptr(), DA.ptr(), DB.ptr(), n, nullptr, &err), 0)
        << err.msg;
    launches();
    ASSERT_EQ(dev::kcu_swiglu_backward_recompute(dt(), A.ptr(), B.ptr(), G.ptr(), DA2.ptr(), DB2.ptr(), O2.ptr(), n,
                                                 nullptr, &err),
              0)
        << err.msg;
    auto ls = launches();
    EXPECT_EQ(ls.size(), 1u);
    EXPECT_EQ(max_blocks(ls), 3u);
    EXPECT_EQ(nonfinite(O2.get()), 0u);
    EXPECT_EQ(O2.get(), O.get());
    EXPECT_EQ(DA2.get(), DA.get());
    EXPECT_EQ(DB2.get(), DB.get());
    std::vector<float> out(n), da(n), db(n), out2(n), da2(n), db2(n);
    kc_swiglu_forward(a.data(), b.data(), out.data(), n);
    kc_swiglu_backward(a.data(), b.data(), g.data(), da.data(), db.data(), n);
    kc_swiglu_backward_recompute(a.data(), b.data(), g.data(), da2.data(), db2.data(), out2.data(), n);
    EXPECT_EQ(out2, out);
    EXPECT_EQ(da2, da);
    EXPECT_EQ(db2, db);
    EXPECT_LT(rel_err(O2.get(), out), tol());
    EXPECT_LT(rel_err(DA2.get(), da), tol());
    for (auto *p : {&O2, &DA2, &DB2}) EXPECT_TRUE(p->guard_ok());
    EXPECT_EQ(dev::kcu_swiglu_backward_recompute(dt(), A.ptr(), B.ptr(), G.ptr(), DA2.ptr(), DB2.ptr(), O2.ptr(), -1,
                                                 nullptr, &err),
              FSDP_E_INVALID);
}

TEST_P(KcuEmuElementwise, Rope) {
    const int B = 2, T = 9, nh = 3, hd = 16; // 432 pairs: 2 blocks
    kc_rope_params p = {500000.0, 1, 8.0, 1.0, 4.0, 16.0};
    std::vector<float> c((size_t)T * hd / 2), s((size_t)T * hd / 2);
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    auto x = in(randn((size_t)B * T * nh * hd, 1));
    Buf X(x, dt());
    ASSERT_EQ(dev::kcu_rope_forward(dt(), X.ptr(), c.data(), s.data(), B, T, nh, hd, nullptr, &err), 0) << err.msg;
    std::vector<float> ref(x);
    kc_rope_forward(ref.data(), c.data(), s.data(), B, T, nh, hd);
    auto got = X.get();
    EXPECT_LT(rel_err(got, ref), dt() == FSDP_DT_F32 ? 1e-6 : 1e-2);
    std::vector<float> back(got);
    kc_rope_backward(back.data(), c.data(), s.data(), B, T, nh, hd);
    ASSERT_EQ(dev::kcu_rope_backward(dt(), X.ptr(), c.data(), s.data(), B, T, nh, hd, nullptr, &err), 0) << err.msg;
    EXPECT_LT(rel_err(X.get(), back), dt() == FSDP_DT_F32 ? 1e-6 : 1e-2);
    EXPECT_TRUE(X.guard_ok());
    EXPECT_EQ(dev::kcu_rope_forward(dt(), X.ptr(), c.data(), s.data(), B, T, nh, 15, nullptr, &err), FSDP_E_INVALID);
}

// q and k rotated in one launch: bit for bit what kcu_rope_forward / kcu_rope_backward give on each.
TEST_P(KcuEmuElementwise, RopeQkOneLaunch) {
    const int B = 2, T = 9, H = 4, KV = 2, hd = 16; // 576 + 288 pairs: 4 blocks, the k pairs start mid-block
    kc_rope_params p = {500000.0, 1, 8.0, 1.0, 4.0, 16.0};
    std::vector<float> c((size_t)T * hd / 2), s((size_t)T * hd / 2);
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    auto q = in(randn((size_t)B * T * H * hd, 1)), k = in(randn((size_t)B * T * KV * hd, 2));
    Buf Q(q, dt()), K(k, dt()), Q1(q, dt()), K1(k, dt());
    ASSERT_EQ(dev::kcu_rope_qk_forward(dt(), Q.ptr(), K.ptr(), c.data(), s.data(), B, T, H, KV, hd, nullptr, &err), 0)
        << err.msg;
    auto ls = launches();
    EXPECT_EQ(ls.size(), 1u);
    EXPECT_EQ(max_blocks(ls), 4u);
    ASSERT_EQ(dev::kcu_rope_forward(dt(), Q1.ptr(), c.data(), s.data(), B, T, H, hd, nullptr, &err), 0) << err.msg;
    ASSERT_EQ(dev::kcu_rope_forward(dt(), K1.ptr(), c.data(), s.data(), B, T, KV, hd, nullptr, &err), 0) << err.msg;
    EXPECT_EQ(Q.get(), Q1.get());
    EXPECT_EQ(K.get(), K1.get());
    std::vector<float> rq(q), rk(k);
    kc_rope_forward(rq.data(), c.data(), s.data(), B, T, H, hd);
    kc_rope_forward(rk.data(), c.data(), s.data(), B, T, KV, hd);
    EXPECT_LT(rel_err(Q.get(), rq), dt() == FSDP_DT_F32 ? 1e-6 : 1e-2);
    EXPECT_LT(rel_err(K.get(), rk), dt() == FSDP_DT_F32 ? 1e-6 : 1e-2);
    ASSERT_EQ(dev::kcu_rope_qk_backward(dt(), Q.ptr(), K.ptr(), c.data(), s.data(), B, T, H, KV, hd, nullptr, &err), 0)
        << err.msg;
    ASSERT_EQ(dev::kcu_rope_backward(dt(), Q1.ptr(), c.data(), s.data(), B, T, H, hd, nullptr, &err), 0) << err.msg;
    ASSERT_EQ(dev::kcu_rope_backward(dt(), K1.ptr(), c.data(), s.data(), B, T, KV, hd, nullptr, &err), 0) << err.msg;
    EXPECT_EQ(Q.get(), Q1.get());
    EXPECT_EQ(K.get(), K1.get());
    EXPECT_LT(rel_err(Q.get(), q), dt() == FSDP_DT_F32 ? 1e-5 : 2e-2); // a rotation and its inverse
    EXPECT_LT(rel_err(K.get(), k), dt() == FSDP_DT_F32 ? 1e-5 : 2e-2);
    for (auto *b : {&Q, &K, &Q1, &K1}) EXPECT_TRUE(b->guard_ok());
    EXPECT_EQ(dev::kcu_rope_qk_forward(dt(), Q.ptr(), K.ptr(), c.data(), s.data(), B, T, H, KV, 15, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("kcu_rope_qk_forward"), std::string::npos) << err.msg;
    EXPECT_EQ(dev::kcu_rope_qk_backward(dt(), Q.ptr(), K.ptr(), c.data(), s.data(), B, T, H, 0, hd, nullptr, &err),
              FSDP_E_INVALID);
}

TEST_P(KcuEmuElementwise, Embedding) {
    const int vocab = 50, dim = 24, n = 40; // 960 elements: 4 blocks
    auto table = in(randn((size_t)vocab * dim, 1));
    std::vector<int32_t> tok(n);
    for (int i = 0; i < n; i++) tok[i] = (i * 7) % 13; // repeats: concurrent atomic adds
    auto dout = in(randn((size_t)n * dim, 2));
    auto dtab0 = randn((size_t)vocab * dim, 3);
    Buf T(table, dt()), O((size_t)n * dim, dt()), G(dout, dt()), DT(dtab0, FSDP_DT_F32);
    int bad = 0;
    fsdp_err err;
    ASSERT_EQ(dev::kcu_embedding_forward(dt(), T.ptr(), tok.data(), O.ptr(), n, vocab, dim, &bad, nullptr, &err), 0)
        << err.msg;
    ASSERT_EQ(dev::kcu_embedding_backward(dt(), G.ptr(), tok.data(), DT.f(), n, vocab, dim, -1, &bad, nullptr, &err), 0)
        << err.msg;
    std::vector<float> out((size_t)n * dim), dtab(dtab0);
    ASSERT_EQ(kc_embedding_forward(table.data(), tok.data(), out.data(), n, vocab, dim, &err), 0);
    ASSERT_EQ(kc_embedding_backward(dout.data(), tok.data(), dtab.data(), n, vocab, dim, -1, &err), 0);
    EXPECT_EQ(O.get(), out); // a copy: exact
    EXPECT_LT(rel_err(DT.get(), dtab), 1e-5);
    EXPECT_EQ(bad, 0);
    // padding_idx 7 (a token of the batch): its row keeps its value, the others are the CPU kernel's
    Buf DP(dtab0, FSDP_DT_F32);
    ASSERT_EQ(dev::kcu_embedding_backward(dt(), G.ptr(), tok.data(), DP.f(), n, vocab, dim, 7, &bad, nullptr, &err), 0)
        << err.msg;
    std::vector<float> dpad(dtab0);
    ASSERT_EQ(kc_embedding_backward(dout.data(), tok.data(), dpad.data(), n, vocab, dim, 7, &err), 0);
    std::vector<float> gp = DP.get();
    for (int j = 0; j < dim; j++) ASSERT_EQ(gp[(size_t)7 * dim + j], dtab0[(size_t)7 * dim + j]);
    EXPECT_LT(rel_err(gp, dpad), 1e-5);
    EXPECT_EQ(dev::kcu_embedding_backward(dt(), G.ptr(), tok.data(), DP.f(), n, vocab, dim, vocab, &bad, nullptr, &err),
              FSDP_E_INVALID);
    // bad ids: zero rows, the flag names a bad row, nothing out of range is touched
    tok[5] = vocab;
    tok[9] = -3;
    O.set(std::vector<float>((size_t)n * dim, NAN));
    ASSERT_EQ(dev::kcu_embedding_forward(dt(), T.ptr(), tok.data(), O.ptr(), n, vocab, dim, &bad, nullptr, &err), 0);
    auto got = O.get();
    EXPECT_TRUE(bad == 6 || bad == 10) << bad;
    for (int j = 0; j < dim; j++) {
        EXPECT_EQ(got[5 * dim + j], 0.0f);
        EXPECT_EQ(got[9 * dim + j], 0.0f);
        EXPECT_EQ(got[6 * dim + j], out[6 * dim + j]);
    }
    bad = 0;
    std::vector<float> before = DT.get();
    ASSERT_EQ(dev::kcu_embedding_backward(dt(), G.ptr(), tok.data(), DT.f(), n, vocab, dim, -1, &bad, nullptr, &err), 0);
    EXPECT_TRUE(bad == 6 || bad == 10) << bad;
    std::vector<float> ref(before);
    for (int i = 0; i < n; i++)
        if (tok[i] >= 0 && tok[i] < vocab)
            for (int j = 0; j < dim; j++) ref[(size_t)tok[i] * dim + j] += dout[(size_t)i * dim + j];
    EXPECT_LT(rel_err(DT.get(), ref), 1e-5); // the bad rows contribute nothing
    EXPECT_TRUE(T.guard_ok() && O.guard_ok() && DT.guard_ok());
}

INSTANTIATE_TEST_SUITE_P(KcuEmuDtypes, KcuEmuElementwise, ::testing::Values(FSDP_DT_F32, FSDP_DT_BF16), dt_name);

TEST(KcuEmuElementwiseExact, CastsRoundLikeTheHost) {
    std::vector<float> v = randn(900, 9, 100.0f);
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                 0xffa00000u, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                 0x7f7fffffu, 0x3f7fffffu, 0x00008000u, 0x00018000u};
    for (uint32_t u : specials) {
        float f;
        memcpy(&f, &u, 4);
        v.push_back(f);
    }
    const size_t n = v.size();
    std::vector<uint16_t> want(n), h(n + 8, 0xffffu), copy(n, 0xffffu);
    for (size_t i = 0; i < n; i++) want[i] = fsdp_f32_to_bf16(v[i]);
    fsdp_err err;
    ASSERT_EQ(dev::kcu_cast(h.data(), FSDP_DT_BF16, v.data(), FSDP_DT_F32, (int64_t)n, nullptr, &err), 0) << err.msg;
    EXPECT_EQ(std::vector<uint16_t>(h.begin(), h.begin() + n), want);
    for (size_t i = n; i < h.size(); i++) EXPECT_EQ(h[i], 0xffffu); // nothing past the end
    std::vector<float> back(n, 1.0f);
    ASSERT_EQ(dev::kcu_cast(back.data(), FSDP_DT_F32, h.data(), FSDP_DT_BF16, (int64_t)n, nullptr, &err), 0);
    for (size_t i = 0; i < n; i++) {
        const float f = fsdp_bf16_to_f32(want[i]);
        ASSERT_EQ(memcmp(&back[i], &f, 4), 0) << i;
    }
    ASSERT_EQ(dev::kcu_cast(copy.data(), FSDP_DT_BF16, h.data(), FSDP_DT_BF16, (int64_t)n, nullptr, &err), 0);
    EXPECT_EQ(copy, want);
    EXPECT_EQ(dev::kcu_cast(copy.data(), FSDP_DT_F16, h.data(), FSDP_DT_BF16, (int64_t)n, nullptr, &err),
              FSDP_E_INVALID);
}

TEST(KcuEmuElementwiseExact, ScaleIsExact) {
    const int n = 600;
    auto x = randn(n, 3);
    std::vector<float> d(x);
    fsdp_err err;
    ASSERT_EQ(dev::kcu_scale(d.data(), n, 0.37f, nullptr, &err), 0) << err.msg;
    kc_scale(x.data(), n, 0.37f);
    EXPECT_EQ(d, x);
}

} // namespace
