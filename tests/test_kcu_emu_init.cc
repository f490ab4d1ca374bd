// kernels/cuda/kcu_init.cu under the host emulation (tests/kcu_emu.h): kcu_init_fill through its
// host wrapper equals the host's rng_fill_dist bit for bit for every distribution (uniform(a, b) and constants included), at ranges that
// start and end inside a Philox block, span several blocks of threads, and leave the bytes around
// them untouched.
#include "tests/kcu_emu_test.h"

extern "C" {
#include "runtime/rng.h"
}

namespace {

using namespace kcu_emu_test;
namespace dev = kcu_emu_dev;

TEST(KcuEmuInit, FillEqualsTheHostForEveryDistribution) {
    fsdp_err err;
    rng_dist dists[6];
    ASSERT_EQ(rng_dist_normal(&dists[0], 0.0, 0.02, &err), 0) << err.msg;
    ASSERT_EQ(rng_dist_trunc_normal(&dists[1], 0.0, 0.02, -0.04, 0.04, &err), 0) << err.msg;
    ASSERT_EQ(rng_dist_trunc_normal(&dists[2], 1.5, 2.0, -1.0, 3.0, &err), 0) << err.msg;
    rng_dist_uniform(&dists[3]);
    ASSERT_EQ(rng_dist_uniform_ab(&dists[4], -0.125, 0.0625, &err), 0) << err.msg;
    rng_dist_const(&dists[5], 0.5f);
    const uint64_t seed = 0x1234abcdULL, stream = rng_fnv1a64("layers.3.attention.wq.weight");
    struct Range {
        uint64_t start;
        int64_t n;
    } ranges[] = {{0, 1}, {3, 2}, {5, 1027}, {1022, 3000}, {(1ULL << 33) + 1, 515}};
    for (const rng_dist &d : dists)
        for (const Range &r : ranges) {
            std::vector<float> want((size_t)r.n);
            rng_fill_dist(&d, want.data(), seed, stream, r.start, (size_t)r.n);
            Buf out((size_t)r.n, FSDP_DT_F32);
            ASSERT_EQ(dev::kcu_init_fill(out.f(), &d, seed, stream, r.start, r.n, nullptr, &err), 0) << err.msg;
            std::vector<float> got = out.get();
            EXPECT_EQ(nonfinite(got), 0u) << "start " << r.start;
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
                << "kind " << d.kind << " start " << r.start << " n " << r.n;
            EXPECT_TRUE(out.guard_ok()) << "wrote past the end: start " << r.start;
        }
    // argument checks of the wrapper
    Buf b(4, FSDP_DT_F32);
    EXPECT_EQ(dev::kcu_init_fill(b.f(), &dists[0], seed, stream, 0, -1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_init_fill(b.f(), nullptr, seed, stream, 0, 4, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_init_fill(nullptr, &dists[0], seed, stream, 0, 4, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_init_fill(b.f(), &dists[0], seed, stream, UINT64_MAX - 1, 4, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev::kcu_init_fill(b.f(), &dists[0], seed, stream, 0, 0, nullptr, &err), 0);
}

}  // namespace
