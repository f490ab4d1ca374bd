// Counter-based RNG: Philox4x32-10 known answers, accuracy of the float transforms (rng_math.h)
// against double references, distributions, and invariance of the fills under splits and thread
// counts (the vectorised fills must give the bits of the one-element reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

extern "C" {
#include "runtime/rng.h"
}

namespace {

// Distance of a float result from a double reference, in ulps of the reference rounded to float.
double ulps(float got, double ref) {
    float r = (float)ref;
    double u = (double)std::nextafter(std::fabs(r), INFINITY) - std::fabs(r);
    return std::fabs((double)got - ref) / u;
}

float bits_float(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

rng_dist normal(double mean, double std) {
    rng_dist d;
    fsdp_err err;
    EXPECT_EQ(rng_dist_normal(&d, mean, std, &err), 0) << err.msg;
    return d;
}

rng_dist trunc(double mean, double std, double a, double b) {
    rng_dist d;
    fsdp_err err;
    EXPECT_EQ(rng_dist_trunc_normal(&d, mean, std, a, b, &err), 0) << err.msg;
    return d;
}

std::vector<float> fill(const rng_dist &d, uint64_t seed, uint64_t stream, uint64_t start, size_t n) {
    std::vector<float> v(n);
    rng_fill_dist(&d, v.data(), seed, stream, start, n);
    return v;
}

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

// ---- the float transforms against double references ----------------------------------------

TEST(RngMath, ErfinvfWithinTwoUlpOfDouble) {
    // Every 1013th float in [0, 1) and the last 50000 floats below 1 (the tail), both signs.
    double mx = 0;
    auto check = [&](uint32_t b) {
        float x = bits_float(b);
        double e = ulps(rng_erfinvf(x), rng_erfinv(x));
        double en = ulps(rng_erfinvf(-x), rng_erfinv(-(double)x));
        mx = std::max(mx, std::max(e, en));
        ASSERT_LE(e, 2.5) << "x=" << x;
        ASSERT_LE(en, 2.5) << "x=" << -x;
    };
    for (uint32_t b = 1; b < 0x3f800000u; b += 1013) check(b);
    for (uint32_t b = 0x3f800000u - 50000; b < 0x3f800000u; b++) check(b);
    EXPECT_GT(mx, 0.0);
    EXPECT_EQ(rng_erfinvf(0.0f), 0.0f);
    EXPECT_EQ(rng_erfinvf(1.0f), INFINITY);
    EXPECT_EQ(rng_erfinvf(-1.0f), -INFINITY);
    EXPECT_TRUE(std::isnan(rng_erfinvf(1.5f)));
    EXPECT_TRUE(std::isnan(rng_erfinvf(-2.0f)));
    EXPECT_TRUE(std::isnan(rng_erfinvf(NAN)));
}

TEST(RngMath, LogfWithinTwoUlpOfLibm) {
    for (uint32_t b = 0x00800000u; b < 0x7f800000u; b += 4093) {
        float x = bits_float(b);
        ASSERT_LE(ulps(rng_logf(x), std::log((double)x)), 2.0) << "x=" << x;
    }
    // around 1, where ln is small and needs its relative precision
    for (uint32_t b = 0x3f800000u - 30000; b < 0x3f800000u + 30000; b++) {
        float x = bits_float(b);
        if (x == 1.0f) {
            EXPECT_EQ(rng_logf(x), 0.0f);
            continue;
        }
        ASSERT_LE(ulps(rng_logf(x), std::log((double)x)), 2.0) << "x=" << x;
    }
}

TEST(RngMath, CosSinOfATurn) {
    // cos and sin of 2 pi ((w >> 8) + 0.5) 2^-24, including every quadrant boundary.
    auto check = [](uint32_t w) {
        float c, s;
        rng_hd_cossin_turn(w, &c, &s);
        double a = 2 * M_PI * (((w >> 8) + 0.5) * 0x1p-24);
        ASSERT_LE(std::fabs(c - std::cos(a)), 1.6 * 0x1p-24) << "w=" << w;
        ASSERT_LE(std::fabs(s - std::sin(a)), 1.6 * 0x1p-24) << "w=" << w;
    };
    for (uint64_t w = 0; w <= 0xffffffffu; w += 7919) check((uint32_t)w);
    for (uint32_t q = 0; q < 8; q++)
        for (int d = -1024; d <= 1024; d += 256) check((uint32_t)(q * 0x20000000u + (uint32_t)d));
}

TEST(RngMath, ElementLayoutAndTransforms) {
    // The documented algorithm, recomputed in double from the Philox words: every element within
    // a few float ulp of it (any mismatch in the layout would be off by O(1)).
    const uint64_t seed = 0x1234567890ull, stream = rng_fnv1a64("w");
    const rng_dist n = normal(0.25, 2.0), t = trunc(0.5, 0.3, -0.1, 1.2), u = [] {
        rng_dist d;
        rng_dist_uniform(&d);
        return d;
    }();
    const rng_dist *dists[] = {&u, &n, &t};
    const double sqrt2 = std::sqrt(2.0);
    const double lo = 2 * rng_norm_cdf((-0.1 - 0.5) / 0.3) - 1, hi = 2 * rng_norm_cdf((1.2 - 0.5) / 0.3) - 1;
    for (const rng_dist *d : dists) {
        std::vector<float> v = fill(*d, seed, stream, 1000, 4000);
        for (uint64_t e = 1000; e < 5000; e++) {
            uint32_t x[4];
            rng_block(seed, stream, e / 4, x);
            const int j = (int)(e % 4);
            double want;
            if (d->kind == RNG_DIST_UNIFORM) {
                want = ((x[j] >> 9) + 0.5) * 0x1p-23;
            } else if (d->kind == RNG_DIST_NORMAL) {
                const int p = j / 2;
                double r = std::sqrt(-2 * std::log(((x[2 * p] >> 9) + 0.5) * 0x1p-23));
                double ang = 2 * M_PI * (((x[2 * p + 1] >> 8) + 0.5) * 0x1p-24);
                want = 0.25 + 2.0 * r * (j % 2 ? std::sin(ang) : std::cos(ang));
            } else {
                double uu = ((x[j] >> 9) + 0.5) * 0x1p-23;
                want = std::min(1.2, std::max(-0.1, 0.5 + 0.3 * sqrt2 * rng_erfinv(lo + uu * (hi - lo))));
            }
            const float got = v[e - 1000];
            ASSERT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want))) << "kind " << d->kind << " e=" << e;
        }
    }
}

// ---- the fills: vectorised == one element at a time, splits, threads -----------------------

TEST(RngFill, VectorisedEqualsReference) {
    // The fills (vectorised clones) give the bits of rng_dist_at (the shared header, scalar), for
    // every kind, on chunk-aligned and unaligned ranges, including far stream positions.
    rng_dist u, c;
    rng_dist_uniform(&u);
    rng_dist_const(&c, 1.0f);
    const rng_dist dists[] = {u, normal(0, 1), normal(-3, 0.01), trunc(0, 0.02, -2, 2),
                              trunc(0, 1.0 / 32, -3.0 / 32, 3.0 / 32), trunc(1, 1, 0.5, 2), c};
    const uint64_t starts[] = {0, 3, 1000, (1ull << 32) * 4 - 37, 0xfffffffffff00000ull};
    for (const rng_dist &d : dists)
        for (uint64_t start : starts) {
            std::vector<float> v = fill(d, 77, 0xabcdefull, start, 3001);
            for (size_t k = 0; k < v.size(); k++) {
                float want = rng_dist_at(&d, 77, 0xabcdefull, start + k);
                ASSERT_EQ(0, memcmp(&v[k], &want, sizeof want))
                    << "kind " << d.kind << " element " << start + k << ": " << v[k] << " vs " << want;
            }
        }
}

TEST(RngFill, SplitInvariant) {
    // Any split of [0, n) into calls gives the same bits as one call, for every fill.
    const size_t n = 150000;
    rng_dist u;
    rng_dist_uniform(&u);
    const rng_dist dists[] = {u, normal(0.5, 2.0), trunc(0, 0.3, -0.9, 0.9)};
    for (const rng_dist &d : dists) {
        std::vector<float> whole = fill(d, 3, 4, 0, n), parts(n);
        size_t cuts[] = {0, 1, 17, 255, 256, 16383, 16384, 20000, 70001, 149999, n};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof *cuts; c++)
            rng_fill_dist(&d, parts.data() + cuts[c], 3, 4, cuts[c], cuts[c + 1] - cuts[c]);
        EXPECT_EQ(0, memcmp(whole.data(), parts.data(), n * sizeof(float))) << "kind " << d.kind;
        std::vector<float> serial(n);
        rng_fill_dist_serial(&d, serial.data(), 3, 4, 0, n);
        EXPECT_EQ(0, memcmp(whole.data(), serial.data(), n * sizeof(float))) << "kind " << d.kind;
    }
}

TEST(RngFill, ThreadCountInvariant) {
    const size_t n = 300001;
    const rng_dist d = trunc(0, 0.02, -0.03, 0.05), z = normal(0, 1);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    std::vector<float> one = fill(d, 5, 6, 11, n), onez = fill(z, 5, 6, 11, n);
    for (int t : {2, 3, 7}) {
        omp_set_num_threads(t);
        EXPECT_EQ(fill(d, 5, 6, 11, n), one) << t << " threads";
        EXPECT_EQ(fill(z, 5, 6, 11, n), onez) << t << " threads";
    }
    omp_set_num_threads(saved);
}

// ---- statistics ----------------------------------------------------------------------------

TEST(RngUniform, RangeAndMoments) {
    const size_t n = 1 << 20;
    rng_dist u;
    rng_dist_uniform(&u);
    std::vector<float> f = fill(u, 7, 11, 0, n);
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        ASSERT_GT(f[i], 0.0f);
        ASSERT_LT(f[i], 1.0f);
        s += f[i];
        s2 += (double)f[i] * f[i];
    }
    double mean = s / n, var = s2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
    EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt(1.0 / 180 / n));
}

TEST(RngNormal, KolmogorovSmirnovAndTails) {
    const size_t n = 1000000;
    std::vector<float> f = fill(normal(0, 1), 123, rng_fnv1a64("x"), 0, n);
    std::vector<double> d(f.begin(), f.end());
    double s = 0, s2 = 0, s4 = 0;
    size_t beyond3 = 0;
    for (double v : d) {
        s += v;
        s2 += v * v;
        s4 += v * v * v * v;
        beyond3 += std::fabs(v) > 3;
    }
    double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt((double)n));
    EXPECT_NEAR(sd, 1.0, 5.0 / std::sqrt(2.0 * n));
    EXPECT_NEAR(s4 / n, 3.0, 5 * std::sqrt(96.0 / n));  // kurtosis: Var(z^4) = 96
    // P(|z| > 3) = 0.0026998: the tails are there in the right amount
    const double p3 = 2 * (1 - rng_norm_cdf(3));
    EXPECT_NEAR((double)beyond3 / n, p3, 5 * std::sqrt(p3 / n));
    std::sort(d.begin(), d.end());
    double ks = 0;
    for (size_t i = 0; i < n; i++) {
        double F = rng_norm_cdf(d[i]);
        ks = std::max(ks, std::max(F - (double)i / n, (double)(i + 1) / n - F));
    }
    // Critical value at alpha = 0.001 is 1.95/sqrt(n).
    EXPECT_LT(ks, 1.95 / std::sqrt((double)n)) << "KS statistic " << ks;
    // the two halves of a Box-Muller pair are uncorrelated
    double cross = 0;
    for (size_t i = 0; i + 1 < n; i += 2) cross += (double)f[i] * f[i + 1];
    EXPECT_LT(std::fabs(cross / (n / 2)), 5 / std::sqrt(n / 2.0));
}

TEST(RngTruncNormal, Validation) {
    rng_dist d;
    fsdp_err err;
    EXPECT_NE(rng_dist_trunc_normal(&d, 0, 0, -1, 1, &err), 0);
    EXPECT_NE(std::string(err.msg).find("std"), std::string::npos) << err.msg;
    EXPECT_NE(rng_dist_trunc_normal(&d, 0, 1, 1, -1, &err), 0);
    EXPECT_NE(std::string(err.msg).find("a < b"), std::string::npos) << err.msg;
    EXPECT_NE(rng_dist_trunc_normal(&d, 0, 1, NAN, 1, &err), 0);
    EXPECT_NE(rng_dist_trunc_normal(&d, NAN, 1, -1, 1, &err), 0);
    EXPECT_NE(rng_dist_trunc_normal(&d, 0, 1e-60, -1, 1, &err), 0);  // std is 0 in float
    EXPECT_NE(rng_dist_trunc_normal(&d, 0, 1, 50, 60, &err), 0);    // no mass
    EXPECT_NE(std::string(err.msg).find("no probability mass"), std::string::npos) << err.msg;
    EXPECT_NE(rng_dist_normal(&d, 0, 0, &err), 0);
    EXPECT_NE(rng_dist_normal(&d, 1e300, 1, &err), 0);
    EXPECT_NE(rng_dist_normal(&d, 0, INFINITY, &err), 0);
    ASSERT_EQ(rng_dist_trunc_normal(&d, 0, 0.02, -2, 2, &err), 0) << err.msg;
    EXPECT_EQ(d.lo, -1.0f);  // Phi(-100) == 0: the draw is never truncated
    EXPECT_EQ(d.span, 2.0f);
    EXPECT_EQ(d.a, -2.0f);
    EXPECT_EQ(d.b, 2.0f);
}

TEST(RngTruncNormal, BoundsAndMoments) {
    // Truncation at +-3 sigma, like output.weight; also an asymmetric window.
    const size_t n = 1000000;
    const double sig = 0.125;
    std::vector<float> f = fill(trunc(0, sig, -3 * sig, 3 * sig), 5, 9, 0, n);
    double s = 0, s2 = 0, mx = 0;
    for (float v : f) {
        s += v;
        s2 += (double)v * v;
        mx = std::max(mx, (double)std::fabs(v));
    }
    EXPECT_LE(mx, (double)(float)(3 * sig));
    EXPECT_GT(mx, 2.99 * sig);  // the tails are reached
    // Var of N(0,s^2) cut at +-k s: s^2 (1 - 2 k phi(k) / (2 Phi(k) - 1)).
    const double k = 3, phi = std::exp(-k * k / 2) / std::sqrt(2 * M_PI);
    const double sd_exp = sig * std::sqrt(1 - 2 * k * phi / (2 * rng_norm_cdf(k) - 1));
    double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5 * sd_exp / std::sqrt((double)n));
    EXPECT_NEAR(sd, sd_exp, 5 * sd_exp / std::sqrt(2.0 * n));
    EXPECT_GT(std::fabs(sd - sig), 10 * sd_exp / std::sqrt(2.0 * n));  // visibly below sigma

    // [0.5, 2] of N(1, 1): every value inside, mean of the truncated distribution.
    f = fill(trunc(1.0, 1.0, 0.5, 2.0), 5, 10, 0, n);
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

    // Untruncated in practice (+-100 sigma, like wq): the normal's tail mass beyond 3 sigma.
    f = fill(trunc(0, 0.02, -2, 2), 5, 11, 0, n);
    size_t beyond3 = 0;
    double m2 = 0;
    for (float v : f) {
        beyond3 += std::fabs(v) > 0.06;
        m2 += (double)v * v;
    }
    const double p3 = 2 * (1 - rng_norm_cdf(3));
    EXPECT_NEAR((double)beyond3 / n, p3, 5 * std::sqrt(p3 / n));
    EXPECT_NEAR(std::sqrt(m2 / n), 0.02, 5 * 0.02 / std::sqrt(2.0 * n));
}

TEST(RngFill, SeedsAndStreamsDiffer) {
    const size_t n = 4096;
    std::vector<float> a = fill(normal(0, 1), 1, 100, 0, n), b = fill(normal(0, 1), 2, 100, 0, n),
                       c = fill(normal(0, 1), 1, 101, 0, n);
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
