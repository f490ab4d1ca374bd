// Counter-based RNG: Philox4x32-10 known answers, erfinv accuracy, distributions and
// split invariance of the fills.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" {
#include "runtime/rng.h"
}

namespace {

void expect_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                   uint32_t e0, uint32_t e1, uint32_t e2, uint32_t e3) {
    const uint32_t ctr[4] = {c0, c1, c2, c3};
    const uint32_t key[2] = {k0, k1};
    uint32_t out[4];
    rng_philox4x32_10(ctr, key, out);
    EXPECT_EQ(out[0], e0);
    EXPECT_EQ(out[1], e1);
    EXPECT_EQ(out[2], e2);
    EXPECT_EQ(out[3], e3);
}

}  // namespace

// Known-answer vectors of Random123 (kat_vectors: philox4x32 10 rounds).
TEST(RngPhilox, KnownAnswers) {
    expect_philox(0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
    expect_philox(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
                  0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
    expect_philox(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
                  0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1);
}

TEST(RngPhilox, BlockLayout) {
    // rng_block(seed, stream, index) = philox({index lo, index hi, stream lo, stream hi},
    //                                          {seed lo, seed hi})
    uint32_t a[4], b[4];
    rng_block(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, a);
    const uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t key[2] = {0xa4093822, 0x299f31d0};
    rng_philox4x32_10(ctr, key, b);
    EXPECT_EQ(0, memcmp(a, b, sizeof a));
    EXPECT_EQ(a[0], 0xd16cfe09u);
}

TEST(RngHash, Fnv1a64) {
    // Published FNV-1a 64 test values.
    EXPECT_EQ(rng_fnv1a64(""), 0xcbf29ce484222325ull);
    EXPECT_EQ(rng_fnv1a64("a"), 0xaf63dc4c8601ec8cull);
    EXPECT_EQ(rng_fnv1a64("foobar"), 0x85944171f73967e8ull);
    EXPECT_NE(rng_fnv1a64("layers.0.attention.wq.weight"),
              rng_fnv1a64("layers.1.attention.wq.weight"));
}

TEST(RngErfinv, ReferenceValues) {
    // erfinv of the exact double inputs, computed with mpmath at 50 digits.
    struct {
        double x, y;
    } ref[] = {
        {0.5, 0.47693627620446987338},
        {0.9, 1.1630871536766741628},
        {0.99, 1.8213863677184494559},
        {0.999999, 3.4589107372754987775},
        {1e-10, 8.8622692545275804594e-11},
        {1e-300, 8.8622692545275803586e-301},
        {0.3, 0.27246271472675434502},
        {-0.7, -0.73286907795921678488},
        {0.999999999999, 5.0420318985726961301},
        {0.9999999999999999, 5.8635847487551679272},
        {-0.9999999999999999, -5.8635847487551679272},
        {0.1, 0.088855990494257691974},
        {0.75, 0.81341984759761854169},
        {0.9999, 2.7510639057120796917},
        {9.313225746154785e-10, 8.2536314190622234144e-10},
    };
    for (const auto &r : ref) {
        double y = rng_erfinv(r.x);
        EXPECT_NEAR(y, r.y, 4e-16 * std::fabs(r.y)) << "x=" << r.x;
    }
    EXPECT_EQ(rng_erfinv(1.0), INFINITY);
    EXPECT_EQ(rng_erfinv(-1.0), -INFINITY);
    EXPECT_EQ(rng_erfinv(0.0), 0.0);
    EXPECT_TRUE(std::isnan(rng_erfinv(1.5)));
    EXPECT_TRUE(std::isnan(rng_erfinv(NAN)));
}

TEST(RngErfinv, RoundTripGrid) {
    // erf(erfinv(x)) == x to a few ulp over the whole range, and the tail via erfc.
    for (int i = -9999; i <= 9999; i++) {
        if (i == 0) continue;
        double x = i / 10000.0;
        double ulp = std::nextafter(std::fabs(x), INFINITY) - std::fabs(x);
        EXPECT_LE(std::fabs(std::erf(rng_erfinv(x)) - x), 4 * ulp) << "x=" << x;
    }
    for (int e = 1; e <= 50; e++) {
        double d = std::ldexp(1.0, -e);
        double y = rng_erfinv(1.0 - d);
        EXPECT_NEAR(std::erfc(y) / d, 1.0, 1e-14) << "1-x=2^-" << e;
    }
}

TEST(RngUniform, RangeAndMoments) {
    const size_t n = 1 << 20;
    std::vector<float> f(n);
    rng_fill_uniform_f32(f.data(), 7, 11, 0, n);
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        ASSERT_GT(f[i], 0.0f);
        ASSERT_LT(f[i], 1.0f);
        EXPECT_EQ(f[i], rng_uniform_f32_at(7, 11, i)) << i;
        s += f[i];
        s2 += (double)f[i] * f[i];
    }
    double mean = s / n, var = s2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
    EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt(1.0 / 180 / n));
    for (uint64_t i = 0; i < 1000; i++) {
        double u = rng_uniform_at(1, 2, i);
        EXPECT_GT(u, 0.0);
        EXPECT_LT(u, 1.0);
    }
}

TEST(RngNormal, KolmogorovSmirnov) {
    const size_t n = 1000000;
    std::vector<float> f(n);
    rng_fill_normal(f.data(), 123, rng_fnv1a64("x"), 0, n, 0.0, 1.0);
    std::vector<double> d(f.begin(), f.end());
    double s = 0, s2 = 0;
    for (double v : d) {
        s += v;
        s2 += v * v;
    }
    double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt((double)n));
    EXPECT_NEAR(sd, 1.0, 5.0 / std::sqrt(2.0 * n));
    std::sort(d.begin(), d.end());
    double ks = 0;
    for (size_t i = 0; i < n; i++) {
        double F = rng_norm_cdf(d[i]);
        ks = std::max(ks, std::max(F - (double)i / n, (double)(i + 1) / n - F));
    }
    // Critical value at alpha = 0.001 is 1.95/sqrt(n).
    EXPECT_LT(ks, 1.95 / std::sqrt((double)n)) << "KS statistic " << ks;
}

TEST(RngTruncNormal, InitValidation) {
    rng_trunc_normal t;
    fsdp_err err;
    EXPECT_NE(rng_trunc_normal_init(&t, 0, 0, -1, 1, &err), 0);
    EXPECT_NE(std::string(err.msg).find("std"), std::string::npos) << err.msg;
    EXPECT_NE(rng_trunc_normal_init(&t, 0, 1, 1, -1, &err), 0);
    EXPECT_NE(std::string(err.msg).find("a < b"), std::string::npos) << err.msg;
    EXPECT_NE(rng_trunc_normal_init(&t, 0, 1, NAN, 1, &err), 0);
    EXPECT_NE(rng_trunc_normal_init(&t, NAN, 1, -1, 1, &err), 0);
    EXPECT_NE(rng_trunc_normal_init(&t, 0, 1, 50, 60, &err), 0);  // no mass in double
    EXPECT_NE(std::string(err.msg).find("no probability mass"), std::string::npos) << err.msg;
    ASSERT_EQ(rng_trunc_normal_init(&t, 0, 0.02, -2, 2, &err), 0) << err.msg;
    EXPECT_EQ(t.lo, -1.0);  // Phi(-100) == 0 in double: the draw is never truncated
    EXPECT_EQ(t.hi, 1.0);
}

TEST(RngTruncNormal, BoundsAndMoments) {
    // Truncation at +-3 sigma, like output.weight; also an asymmetric window.
    const size_t n = 1000000;
    std::vector<float> f(n);
    rng_trunc_normal t;
    fsdp_err err;
    const double sig = 0.125;
    ASSERT_EQ(rng_trunc_normal_init(&t, 0, sig, -3 * sig, 3 * sig, &err), 0) << err.msg;
    rng_fill_trunc_normal(f.data(), &t, 5, 9, 0, n);
    double s = 0, s2 = 0, mx = 0;
    for (float v : f) {
        s += v;
        s2 += (double)v * v;
        mx = std::max(mx, (double)std::fabs(v));
    }
    EXPECT_LE(mx, (double)(float)(3 * sig));
    EXPECT_GT(mx, 2.9 * sig);  // the tails are reached
    // Var of N(0,s^2) cut at +-k s: s^2 (1 - 2 k phi(k) / (2 Phi(k) - 1)).
    const double k = 3, phi = std::exp(-k * k / 2) / std::sqrt(2 * M_PI);
    const double sd_exp = sig * std::sqrt(1 - 2 * k * phi / (2 * rng_norm_cdf(k) - 1));
    double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5 * sd_exp / std::sqrt((double)n));
    EXPECT_NEAR(sd, sd_exp, 5 * sd_exp / std::sqrt(2.0 * n));
    EXPECT_GT(std::fabs(sd - sig), 10 * sd_exp / std::sqrt(2.0 * n));  // visibly below sigma

    // [0.5, 2] of N(1, 1): every value inside, mean of the truncated distribution.
    ASSERT_EQ(rng_trunc_normal_init(&t, 1.0, 1.0, 0.5, 2.0, &err), 0) << err.msg;
    rng_fill_trunc_normal(f.data(), &t, 5, 10, 0, n);
    s = 0;
    for (float v : f) {
        ASSERT_GE(v, 0.5f);
        ASSERT_LE(v, 2.0f);
        s += v;
    }
    const double al = -0.5, be = 1.0;
    const double pa = std::exp(-al * al / 2) / std::sqrt(2 * M_PI);
    const double pb = std::exp(-be * be / 2) / std::sqrt(2 * M_PI);
    const double Z = rng_norm_cdf(be) - rng_norm_cdf(al);
    const double mean_exp = 1.0 + (pa - pb) / Z;
    EXPECT_NEAR(s / n, mean_exp, 5 * 0.5 / std::sqrt((double)n));
}

TEST(RngFill, SplitInvariant) {
    // Any split of [0, n) into calls gives the same bits as one call, for every fill.
    const size_t n = 50000;
    rng_trunc_normal t;
    fsdp_err err;
    ASSERT_EQ(rng_trunc_normal_init(&t, 0, 0.3, -0.9, 0.9, &err), 0);
    std::vector<float> whole(n), parts(n);
    for (int kind = 0; kind < 3; kind++) {
        auto fill = [&](float *d, uint64_t start, size_t m) {
            if (kind == 0) rng_fill_uniform_f32(d, 3, 4, start, m);
            if (kind == 1) rng_fill_normal(d, 3, 4, start, m, 0.5, 2.0);
            if (kind == 2) rng_fill_trunc_normal(d, &t, 3, 4, start, m);
        };
        fill(whole.data(), 0, n);
        size_t cuts[] = {0, 1, 17, 16383, 16384, 20000, 49999, n};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof *cuts; c++)
            fill(parts.data() + cuts[c], cuts[c], cuts[c + 1] - cuts[c]);
        EXPECT_EQ(0, memcmp(whole.data(), parts.data(), n * sizeof(float))) << "kind " << kind;
        // and element by element through the single-value functions
        for (size_t i = 0; i < n; i += 997) {
            if (kind == 1) {
                EXPECT_EQ(whole[i], (float)(0.5 + 2.0 * rng_normal_at(3, 4, i)));
            } else if (kind == 2) {
                EXPECT_EQ(whole[i], (float)rng_trunc_normal_at(&t, 3, 4, i));
            }
        }
    }
}

TEST(RngFill, SeedsAndStreamsDiffer) {
    const size_t n = 4096;
    std::vector<float> a(n), b(n), c(n);
    rng_fill_normal(a.data(), 1, 100, 0, n, 0, 1);
    rng_fill_normal(b.data(), 2, 100, 0, n, 0, 1);
    rng_fill_normal(c.data(), 1, 101, 0, n, 0, 1);
    size_t same_ab = 0, same_ac = 0;
    double dot_ab = 0, dot_ac = 0;
    for (size_t i = 0; i < n; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
        dot_ab += (double)a[i] * b[i];
        dot_ac += (double)a[i] * c[i];
    }
    EXPECT_LT(same_ab, 2u);
    EXPECT_LT(same_ac, 2u);
    // uncorrelated: |corr| below 5 standard errors
    EXPECT_LT(std::fabs(dot_ab / n), 5 / std::sqrt((double)n));
    EXPECT_LT(std::fabs(dot_ac / n), 5 / std::sqrt((double)n));
}
