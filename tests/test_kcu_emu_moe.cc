// kernels/cuda/kcu_moe.cu under the host emulation (tests/kcu_emu.h): the router's softmax and top-K with
// exact ties, more experts than a warp has lanes and non-finite rows; the stable counting sort over several
// chunks with an expert that gets nothing and a bad expert index. Against tests/moe_ref.h.
#include "tests/kcu_emu_test.h"
#include "tests/moe_ref.h"

namespace {

using namespace kcu_emu_test;
namespace dev = kcu_emu_dev;

class KcuEmuMoe : public ::testing::Test {
protected:
    void SetUp() override { kcu_emu::take_launches(); }
};

std::vector<int32_t> ints(const Buf &b) {
    std::vector<int32_t> v(b.size());
    std::memcpy(v.data(), b.ptr(), v.size() * 4);
    return v;
}

TEST_F(KcuEmuMoe, RouteTopKTiesAndNonFiniteRows) {
    // E 40 and 300: lanes hold 2 and 10 experts; n 7 fills two blocks of 4 tokens partly
    for (int E : {40, 300})
        for (int norm : {0, 1}) {
            const int n = 7, K = E == 40 ? 5 : 8;
            auto l = randn((size_t)n * E, 3 + E);
            for (int e = 0; e < E; e++) l[(size_t)1 * E + e] = 0.25f;          // token 1: all equal
            for (int e = 0; e < E; e++) l[(size_t)2 * E + e] = e % 3 ? 0.1f * l[(size_t)2 * E + e] : 2.0f; // ties on top
            l[(size_t)4 * E + E / 2] = NAN;                                    // token 4: not finite
            Buf L(l, FSDP_DT_F32), P((size_t)n * E, FSDP_DT_F32), T((size_t)n * K, FSDP_DT_F32),
                W((size_t)n * K, FSDP_DT_F32), BAD(1, FSDP_DT_F32);
            std::memset(BAD.ptr(), 0, 4);
            fsdp_err err;
            ASSERT_EQ(dev::kcu_moe_route(L.f(), n, E, K, norm, P.f(), (int32_t *)T.ptr(), W.f(), (int *)BAD.ptr(),
                                         nullptr, &err),
                      0)
                << err.msg;
            int bad;
            std::memcpy(&bad, BAD.ptr(), 4);
            EXPECT_EQ(bad, 5); // 1 + token 4
            auto ld = moe_ref::to_double(l);
            for (int e = 0; e < E; e++) ld[(size_t)4 * E + e] = 0.0; // the reference of the other rows only
            const moe_ref::Routing r = moe_ref::route({n, 1, 1, E, K, norm}, ld);
            const auto top = ints(T);
            const auto w_ = W.get(), p = P.get();
            for (int t = 0; t < n; t++) {
                for (int k = 0; k < K; k++) {
                    const size_t i = (size_t)t * K + k;
                    if (t == 4) {
                        EXPECT_EQ(top[i], k);
                        EXPECT_EQ(w_[i], 0.0f);
                    } else {
                        EXPECT_EQ(top[i], r.top[i]) << E << " t " << t << " k " << k;
                        EXPECT_NEAR(w_[i], r.topw[i], 2e-6) << E << " t " << t << " k " << k;
                    }
                }
                for (int e = 0; e < E; e++)
                    EXPECT_NEAR(p[(size_t)t * E + e], t == 4 ? 0.0 : r.probs[(size_t)t * E + e], 5e-7) << t << " " << e;
            }
            for (int k = 0; k < K; k++) EXPECT_EQ(top[(size_t)1 * K + k], k);     // equal: the lower experts
            for (int k = 0; k < K; k++) EXPECT_EQ(top[(size_t)2 * K + k], 3 * k); // the tied 2.0s in order
            for (auto *b : {&L, &P, &T, &W}) EXPECT_TRUE(b->guard_ok());
        }
    fsdp_err err;
    EXPECT_EQ(dev::kcu_moe_route(nullptr, 4, 3, 4, 0, nullptr, nullptr, nullptr, nullptr, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_moe_route(nullptr, 4, KCU_MOE_MAX_EXPERTS + 1, 2, 0, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 &err),
              FSDP_E_INVALID);
}

TEST_F(KcuEmuMoe, CountingSortIsStableOverChunks) {
    const int E = 7;
    for (int n : {1, 64, 151}) // 2 pairs; exactly 2 chunks; 5 chunks, the last partial
        for (int K : {1, 2}) {
            std::mt19937 g(n * 10 + K);
            std::vector<int> top((size_t)n * K);
            for (auto &e : top) {
                e = (int)(g() % (E - 1));
                if (e == 3) e = E - 1; // expert 3 gets nothing
            }
            Buf T((size_t)n * K, FSDP_DT_F32), O(E + 1, FSDP_DT_F32), SO((size_t)n * K, FSDP_DT_F32),
                PO((size_t)n * K, FSDP_DT_F32), S(dev::kcu_moe_sort_scratch_ints(n, E, K), FSDP_DT_F32);
            std::memcpy(T.ptr(), top.data(), top.size() * 4);
            fsdp_err err;
            ASSERT_EQ(dev::kcu_moe_sort((const int32_t *)T.ptr(), n, E, K, (int32_t *)O.ptr(), (int32_t *)SO.ptr(),
                                        (int32_t *)PO.ptr(), (int32_t *)S.ptr(), nullptr, nullptr, &err),
                      0)
                << err.msg;
            // the reference sort of the same experts
            moe_ref::Routing r;
            {
                r.top = top;
                r.offsets.assign(E + 1, 0);
                r.slot_of.assign((size_t)n * K, -1);
                r.pair_of.assign((size_t)n * K, -1);
                int s = 0;
                for (int e = 0; e < E; e++) {
                    r.offsets[e] = s;
                    for (int p = 0; p < n * K; p++)
                        if (top[p] == e) r.slot_of[p] = s, r.pair_of[s++] = p;
                }
                r.offsets[E] = s;
            }
            EXPECT_EQ(ints(O), std::vector<int32_t>(r.offsets.begin(), r.offsets.end())) << n << " " << K;
            EXPECT_EQ(ints(SO), std::vector<int32_t>(r.slot_of.begin(), r.slot_of.end())) << n << " " << K;
            EXPECT_EQ(ints(PO), std::vector<int32_t>(r.pair_of.begin(), r.pair_of.end())) << n << " " << K;
            EXPECT_EQ(ints(O)[3], ints(O)[4]);
            for (auto *b : {&T, &O, &SO, &PO, &S}) EXPECT_TRUE(b->guard_ok());
        }
    // an expert index out of range: flagged, sorted nowhere
    const int n = 5, K = 2;
    std::vector<int32_t> top = {0, 1, 2, 9, 1, 0, 2, 2, 1, 0};
    Buf T(10, FSDP_DT_F32), O(E + 1, FSDP_DT_F32), SO(10, FSDP_DT_F32), PO(10, FSDP_DT_F32),
        S(dev::kcu_moe_sort_scratch_ints(n, E, K), FSDP_DT_F32), BAD(1, FSDP_DT_F32);
    std::memcpy(T.ptr(), top.data(), 40);
    std::memset(BAD.ptr(), 0, 4);
    fsdp_err err;
    ASSERT_EQ(dev::kcu_moe_sort((const int32_t *)T.ptr(), n, E, K, (int32_t *)O.ptr(), (int32_t *)SO.ptr(),
                                (int32_t *)PO.ptr(), (int32_t *)S.ptr(), (int *)BAD.ptr(), nullptr, &err),
              0)
        << err.msg;
    EXPECT_EQ(ints(BAD)[0], 4); // 1 + pair 3
    EXPECT_EQ(ints(O)[E], 9);
    EXPECT_EQ(ints(SO)[3], -1);
}

} // namespace
