// The hand-written SIMD generators (runtime/rng_avx2.c, runtime/rng_avx512.c) against the portable
// path (issue 18, item 3): the same bits for every distribution, range and output dtype; and a golden
// digest of init-cpu's state computed before they existed, so the values never change.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/reader.h"
#include "fsdp/tensor.h"
#include "model/init_fill.h"
#include "runtime/rng.h"
}

using namespace fsdp_test;

namespace {

uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

// FNV-1a 64 over every tensor of a checkpoint, in its order: name, dtype, and the values as float32
// bits (bf16 / f16 widen exactly).
uint64_t ckpt_digest(const std::string &path, std::string *why) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    if (ckpt_open(path.c_str(), CKPT_AUTO, &r, &err)) {
        *why = path + ": " + err.msg;
        return 0;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        const int64_t n = fsdp_numel(e->ndim, e->shape);
        std::vector<float> v((size_t)n + 1);
        if (ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, v.data(), FSDP_DT_F32, &err)) {
            *why = path + ": " + err.msg;
            ckpt_close(r);
            return 0;
        }
        h = fnv_bytes(h, e->name, strlen(e->name) + 1);
        const int dt = (int)e->dtype;
        h = fnv_bytes(h, &dt, sizeof dt);
        h = fnv_bytes(h, v.data(), (size_t)n * sizeof(float));
    }
    ckpt_close(r);
    return h;
}

// Every init rule the table syntax knows, every dtype, shapes whose sizes are not multiples of the
// vector width nor of RNG_CHUNK, and a 0-d tensor.
const char *const GOLDEN_MODEL =
    "runtime: {device: cpu, seed: 1234}\n"
    "model:\n"
    "  params:\n"
    "    - {name: emb.weight, shape: [301, 67], init: \"normal(0, 0.02)\"}\n"
    "    - {name: emb16.weight, shape: [97, 33], init: \"normal(0.5, 2)\", dtype: bf16}\n"
    "    - {name: tn, shape: [129, 65], init: \"trunc_normal(0.1, 1, a=-1, b=2)\", dtype: f16}\n"
    "    - {name: tn32, shape: [3, 1000], init: \"trunc_normal(0, 0.02, a=-0.04, b=0.04)\"}\n"
    "    - {name: un, shape: [77, 13], init: \"uniform(-0.3, 0.7)\"}\n"
    "    - {name: lin.weight, shape: [130, 250], init: default_linear, dtype: bf16}\n"
    "    - {name: lin.bias, shape: [130], init: default_linear}\n"
    "    - {name: kn, shape: [64, 70], init: \"kaiming_normal(mode=fan_out, nonlinearity=relu)\"}\n"
    "    - {name: ku, shape: [31, 40], init: \"kaiming_uniform(a=0.2)\", dtype: f16}\n"
    "    - {name: xn, shape: [5, 3, 4, 4], init: xavier_normal}\n"
    "    - {name: xu, shape: [6, 9], init: xavier_uniform}\n"
    "    - {name: de, shape: [40, 24], init: default_embedding}\n"
    "    - {name: one, shape: [1, 1, 7], init: ones}\n"
    "    - {name: zero, shape: [9], init: zeros}\n"
    "    - {name: \"scale\", shape: [], init: \"constant(0.5)\"}\n"
    "stages:\n"
    "  - {id: i, uses: init-cpu}\n"
    "  - {id: t, uses: save-safetensors, with: {path: \"${out}\"}}\n";

// The digest of GOLDEN_MODEL's state, computed with the build of main before the AVX2 generator
// (commit efc5aed, portable target_clones fills).
const uint64_t GOLDEN_DIGEST = 0xc8947d410255520cull;

// Every distribution kind the init rules produce, with parameters that reach the clamps (trunc with
// bounds inside the bulk, uniform_ab) and the far tails (wide trunc, normal with large std).
std::vector<rng_dist> all_dists() {
    std::vector<rng_dist> v;
    fsdp_err err;
    rng_dist d;
    rng_dist_uniform(&d);
    v.push_back(d);
    rng_dist_const(&d, -0.75f);
    v.push_back(d);
    const double normals[][2] = {{0, 1}, {0, 0.02}, {-3, 0.01}, {0.5, 2}, {1e-3, 1e3}};
    for (auto &n : normals) {
        EXPECT_EQ(rng_dist_normal(&d, n[0], n[1], &err), 0) << err.msg;
        v.push_back(d);
    }
    const double truncs[][4] = {{0, 0.02, -0.04, 0.04}, {0, 1, -2, 2}, {0.1, 1, -1, 2}, {1, 1, 0.5, 2},
                                {0, 1, -1e30, 1e30}, {0, 1.0 / 32, -3.0 / 32, 3.0 / 32}, {0, 1, 2.5, 6}};
    for (auto &t : truncs) {
        EXPECT_EQ(rng_dist_trunc_normal(&d, t[0], t[1], t[2], t[3], &err), 0) << err.msg;
        v.push_back(d);
    }
    const double unis[][2] = {{-0.3, 0.7}, {-1e-3, 1e-3}, {0, 1}, {-5, -4.999}};
    for (auto &u : unis) {
        EXPECT_EQ(rng_dist_uniform_ab(&d, u[0], u[1], &err), 0) << err.msg;
        v.push_back(d);
    }
    return v;
}

std::vector<rng_path> simd_paths() {
    std::vector<rng_path> v;
    for (rng_path p : {RNG_PATH_AVX2, RNG_PATH_AVX512})
        if (rng_path_supported(p)) v.push_back(p);
    return v;
}

std::string bits_diff(const std::vector<float> &a, const std::vector<float> &b, uint64_t start) {
    for (size_t k = 0; k < a.size(); k++)
        if (memcmp(&a[k], &b[k], sizeof(float)))
            return "element " + std::to_string(start + k) + ": " + std::to_string(a[k]) + " vs " + std::to_string(b[k]);
    return "";
}

}  // namespace

TEST(RngSimdPaths, ThePortablePathIsAlwaysThereAndTheDefaultFollowsTheEnvironment) {
    EXPECT_TRUE(rng_path_supported(RNG_PATH_PORTABLE));
    const char *old = getenv("FSDP_RNG_SIMD");
    std::string saved = old ? old : "";
    setenv("FSDP_RNG_SIMD", "0", 1);
    EXPECT_EQ(rng_path_default(), RNG_PATH_PORTABLE);
    setenv("FSDP_RNG_SIMD", "avx2", 1);
    EXPECT_EQ(rng_path_default(), rng_path_supported(RNG_PATH_AVX2) ? RNG_PATH_AVX2 : RNG_PATH_PORTABLE);
    unsetenv("FSDP_RNG_SIMD");
    rng_path best = rng_path_supported(RNG_PATH_AVX512) ? RNG_PATH_AVX512
                    : rng_path_supported(RNG_PATH_AVX2) ? RNG_PATH_AVX2
                                                        : RNG_PATH_PORTABLE;
    EXPECT_EQ(rng_path_default(), best);
    EXPECT_FALSE(rng_path_supported((rng_path)99));
    if (old) setenv("FSDP_RNG_SIMD", saved.c_str(), 1);
    if (simd_paths().empty()) GTEST_SKIP() << "this CPU has no SIMD generator path (AVX2+FMA or AVX-512)";
}

TEST(RngSimdFill, EveryDistributionEqualsThePortablePathAndTheReference) {
    // many seeds and streams; starts that are not multiples of the vector width (8 lanes = 32
    // elements) nor of RNG_CHUNK; lengths 0..N with tails; far counters where the block index
    // carries into its high word inside a vector
    const std::vector<rng_path> paths = simd_paths();
    if (paths.empty()) GTEST_SKIP() << "this CPU has no SIMD generator path (AVX2+FMA or AVX-512)";
    const uint64_t seeds[] = {0, 1, 1234, 0xffffffffull, 0x123456789abcdefull, ~0ull};
    const uint64_t streams[] = {0, 7, 0xabcdefull, 0xfedcba9876543210ull};
    const uint64_t starts[] = {0, 1, 3, 31, 33, 255, 257, 1000, (1ull << 32) * 4 - 37, (1ull << 34) - 5,
                               0xfffffffffff00000ull};
    const size_t lens[] = {0, 1, 2, 5, 31, 32, 33, 255, 256, 257, 1000, 3001};
    const std::vector<rng_dist> dists = all_dists();
    int di = 0;
    for (const rng_dist &d : dists) {
        di++;
        for (size_t si = 0; si < sizeof seeds / sizeof *seeds; si++) {
            // every seed with one stream and start set, every stream with the others (coverage without
            // the full product)
            const uint64_t seed = seeds[si], stream = streams[(si + (size_t)di) % 4];
            for (size_t ti = 0; ti < sizeof starts / sizeof *starts; ti++) {
                const uint64_t start = starts[ti];
                const size_t n = lens[(ti + si + (size_t)di) % (sizeof lens / sizeof *lens)];
                std::vector<float> ref(n + 1, 42.0f), got(n + 1, 42.0f);
                rng_fill_dist_path(RNG_PATH_PORTABLE, &d, ref.data(), seed, stream, start, n);
                for (size_t k = 0; k < n; k += 97) {
                    float want = rng_dist_at(&d, seed, stream, start + k);
                    ASSERT_EQ(0, memcmp(&ref[k], &want, sizeof want)) << "portable, kind " << d.kind;
                }
                for (rng_path p : paths) {
                    rng_fill_dist_path(p, &d, got.data(), seed, stream, start, n);
                    ASSERT_EQ(bits_diff(ref, got, start), "")
                        << "path " << p << ", dist " << di << " (kind " << d.kind << "), seed " << seed << ", stream "
                        << stream << ", start " << start << ", n " << n;
                    EXPECT_EQ(got[n], 42.0f) << "wrote past the end";
                }
            }
        }
    }
}

TEST(RngSimdFill, LongRangesOfEveryKindAreBitIdentical) {
    // 2^18 elements of each distribution from an unaligned start: tails of the polynomials, the
    // clamps and the quadrant rotations are all reached many times
    const std::vector<rng_path> paths = simd_paths();
    if (paths.empty()) GTEST_SKIP() << "this CPU has no SIMD generator path (AVX2+FMA or AVX-512)";
    const size_t n = (size_t)1 << 18;
    std::vector<float> ref(n), got(n);
    for (const rng_dist &d : all_dists()) {
        rng_fill_dist_path(RNG_PATH_PORTABLE, &d, ref.data(), 99, 0x5eed, 77, n);
        for (rng_path p : paths) {
            rng_fill_dist_path(p, &d, got.data(), 99, 0x5eed, 77, n);
            ASSERT_EQ(bits_diff(ref, got, 77), "") << "path " << p << ", kind " << d.kind;
        }
    }
}

TEST(RngSimdFill, TruncArgumentsAtOrOutsidePlusMinusOneGiveTheScalarInfinitiesAndNaNs) {
    // rng_dist_trunc_normal never builds these (its arguments lie inside (-1, 1)), but the SIMD codes take
    // a shorter path only when every lane of a step is inside: hand-made parameters put the inverse
    // error function's argument at exactly -1 or 1 (lo = +-1, a span below half an ulp), beyond them
    // (NaN), or a mixture inside each vector, with clamps at +-inf so that inf and NaN come out as they are
    const std::vector<rng_path> paths = simd_paths();
    if (paths.empty()) GTEST_SKIP() << "this CPU has no SIMD generator path (AVX2+FMA or AVX-512)";
    const float inf = std::numeric_limits<float>::infinity();
    const float cases[][2] = {{1.0f, 0x1p-30f}, {-1.0f, 0x1p-30f}, {0.5f, 1.0f}, {-1.5f, 1.0f}, {-1.25f, 2.5f},
                              {-0.999f, 1.998f}, {0.99f, 0.0099f}};
    const size_t n = 4099;
    for (const auto &c : cases) {
        rng_dist d;
        memset(&d, 0, sizeof d);
        d.kind = RNG_DIST_TRUNC_NORMAL;
        d.mean = 0.25f, d.std = 1.0f, d.lo = c[0], d.span = c[1], d.scale = 0x1.6a09e6p+0f, d.a = -inf, d.b = inf;
        std::vector<float> ref(n), got(n);
        rng_fill_dist_path(RNG_PATH_PORTABLE, &d, ref.data(), 5, 11, 3, n);
        size_t special = 0;
        for (float x : ref) special += !std::isfinite(x);
        if (c[0] == 1.0f || c[0] == -1.0f) {
            EXPECT_EQ(special, n) << "lo " << c[0] << ": every value infinite";
        } else if (c[0] == 0.5f || c[0] == -1.5f) {
            EXPECT_GT(special, n / 3) << "lo " << c[0] << ": NaNs expected";
        }
        for (rng_path p : paths) {
            rng_fill_dist_path(p, &d, got.data(), 5, 11, 3, n);
            ASSERT_EQ(bits_diff(ref, got, 3), "") << "path " << p << ", lo " << c[0] << ", span " << c[1];
        }
    }
}

TEST(RngSimdFill, HalfOutputsOfInitFillAreTheSameOnEveryPath) {
    // init_fill_jobs with f32, f32 rounded to bf16 / f16, and bf16 / f16 bits, on the default path
    // and with FSDP_RNG_SIMD=0: the same bits
    fsdp_err err;
    rng_dist dn, dt;
    ASSERT_EQ(rng_dist_normal(&dn, 0, 3, &err), 0);
    ASSERT_EQ(rng_dist_trunc_normal(&dt, 0.1, 1, -1, 2, &err), 0);
    const int64_t n = 1200001, e0 = 13; // several pieces of init_fill (2^19 elements), the first partial
    auto run = [&](std::vector<float> f[4], std::vector<uint16_t> h[4]) {
        init_job j[8] = {};
        const fsdp_dtype dts[4] = {FSDP_DT_F32, FSDP_DT_BF16, FSDP_DT_F16, FSDP_DT_BF16};
        for (int i = 0; i < 4; i++) {
            f[i].assign((size_t)n, 0.0f);
            h[i].assign((size_t)n, 0);
            for (int k = 0; k < 2; k++) {
                init_job &x = j[2 * i + k];
                x.dist = i % 2 ? dt : dn;
                x.stream = 1000 + (uint64_t)i;
                x.e0 = e0;
                x.n = n;
                x.dtype = dts[i];
                if (k == 0) x.f32 = f[i].data();
                else x.half = h[i].data();
            }
            if (dts[i] == FSDP_DT_F32) j[2 * i + 1].dtype = FSDP_DT_BF16; /* half output needs a half dtype */
        }
        EXPECT_EQ(init_fill_jobs(j, 8, 5, "t", &err), 0) << err.msg;
    };
    std::vector<float> fa[4], fb[4];
    std::vector<uint16_t> ha[4], hb[4];
    run(fa, ha);
    setenv("FSDP_RNG_SIMD", "0", 1);
    run(fb, hb);
    unsetenv("FSDP_RNG_SIMD");
    for (int i = 0; i < 4; i++) {
        EXPECT_EQ(bits_diff(fa[i], fb[i], (uint64_t)e0), "") << "output " << i;
        EXPECT_EQ(ha[i], hb[i]) << "output " << i;
        for (int64_t k = 0; k < n; k += 101) {
            float want = rng_dist_at(i % 2 ? &dt : &dn, 5, 1000 + (uint64_t)i, (uint64_t)(e0 + k));
            if (i == 1 || i == 3) want = fsdp_bf16_to_f32(fsdp_f32_to_bf16(want));
            if (i == 2) want = fsdp_f16_to_f32(fsdp_f32_to_f16(want));
            ASSERT_EQ(0, memcmp(&fa[i][(size_t)k], &want, sizeof want)) << "output " << i << " element " << k;
        }
    }
}

TEST(RngSimdHalf, EdgeValuesAndRandomBitsRoundLikeTheScalarConversions) {
    // NaNs (quiet, signalling, with payloads), infinities, f16 overflow and its rounding edge,
    // f16 subnormals and the underflow tie, float subnormals, bf16 ties, then random bit patterns;
    // lengths that leave tails after the vector loops
    std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u,
                                  0x7fffffffu, 0x7fa00000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u,
                                  0x33000000u, 0x33000001u, 0xb3000000u, 0x33800000u, 0x38800000u, 0x387fffffu,
                                  0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0xbf808000u,
                                  0x3f80ffffu, 0x7f7f8000u, 0x3c7fe000u, 0x3c7ff000u};
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 100003; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        bits.push_back((uint32_t)x);
    }
    std::vector<float> src(bits.size());
    memcpy(src.data(), bits.data(), bits.size() * sizeof(float));
    std::vector<rng_path> paths = simd_paths();
    paths.push_back(RNG_PATH_PORTABLE);
    for (rng_path p : paths)
        for (int bf16 : {0, 1})
            for (size_t n : {src.size(), (size_t)27, (size_t)7}) {
                std::vector<uint16_t> h(n + 1, 0xabcd);
                rng_to_half_path(p, src.data(), h.data(), n, bf16);
                std::vector<float> r(src.begin(), src.begin() + (ptrdiff_t)n);
                rng_round_half_path(p, r.data(), n, bf16);
                for (size_t k = 0; k < n; k++) {
                    const uint16_t want = bf16 ? fsdp_f32_to_bf16(src[k]) : fsdp_f32_to_f16(src[k]);
                    ASSERT_EQ(h[k], want) << "path " << p << (bf16 ? " bf16" : " f16") << ", input bits 0x" << std::hex
                                          << bits[k];
                    const float wf = bf16 ? fsdp_bf16_to_f32(want) : fsdp_f16_to_f32(want);
                    ASSERT_EQ(0, memcmp(&r[k], &wf, sizeof wf))
                        << "path " << p << (bf16 ? " bf16" : " f16") << " round, input bits 0x" << std::hex << bits[k];
                }
                EXPECT_EQ(h[n], 0xabcd) << "wrote past the end";
            }
}

TEST(RngSimdGolden, InitCpuStateIsUnchangedOnEveryPathAndThreadCount) {
    std::string dir = make_tmpdir("fsdp-rngsimd");
    write_file(dir + "/m.yaml", GOLDEN_MODEL);
    const char *envs[] = {"", "FSDP_RNG_SIMD=0 ", "FSDP_RNG_SIMD=avx2 "};
    for (const char *env : envs)
        for (int threads : {1, 2, 3}) {
            std::string out = dir + "/s.safetensors", log;
            ASSERT_EQ(run_cmd(std::string(env) + "timeout -k 10 120 " + fsdp_run_bin() + " -q " + dir +
                                  "/m.yaml --set runtime.threads=" + std::to_string(threads) +
                                  " --set vars.out=" + out,
                              &log),
                      0)
                << env << log;
            std::string why;
            uint64_t h = ckpt_digest(out, &why);
            ASSERT_TRUE(why.empty()) << why;
            char hex[32];
            snprintf(hex, sizeof hex, "0x%016llx", (unsigned long long)h);
            EXPECT_EQ(h, GOLDEN_DIGEST) << "env '" << env << "', " << threads << " threads: digest " << hex;
            rm_rf(out);
        }
    rm_rf(dir);
}
