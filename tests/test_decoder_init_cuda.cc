// Parameter init on the GPU (decoder_init_rows_dev, kcu_init_fill) against the host
// (decoder_init_rows_f32, rng_fill_dist): every init rule, sharded ranges, the world-size invariance
// on the GPU, and the argument checks (which need no GPU). The transforms are shared
// (runtime/rng_math.h) and use only correctly rounded operations, so the values must agree to
// within 1 ulp and are expected to be identical. The GPU tests skip when no GPU is present.
#include <gtest/gtest.h>

#include "gpu_util.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "kernels/cuda/kcu.h"
#include "decoder/decoder_config.h"
#include "decoder/decoder_init.h"
#include "decoder/decoder_params.h"
#include "runtime/device.h"
#include "runtime/rng.h"
#include "runtime/shard.h"
}

using fsdp_test::gpu_count;
using fsdp_test::gpu_present;

namespace {

// Distance in ulps between two floats of the same sign (order of their bit patterns).
int64_t ulp_diff(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0)) return a == b ? 0 : INT64_MAX;  // +0 / -0
    return std::llabs((int64_t)ia - (int64_t)ib);
}

struct Cmp {
    int64_t max_ulp = 0;
    size_t differ = 0;
};

Cmp compare(const std::vector<float> &dev, const std::vector<float> &host) {
    Cmp c;
    EXPECT_EQ(dev.size(), host.size());
    for (size_t k = 0; k < dev.size() && k < host.size(); k++) {
        if (memcmp(&dev[k], &host[k], 4) == 0) continue;
        c.differ++;
        c.max_ulp = std::max(c.max_ulp, ulp_diff(dev[k], host[k]));
    }
    return c;
}

class LlamaInitCuda : public ::testing::Test {
protected:
    void SetUp() override {
        if (!gpu_present()) GTEST_SKIP() << "no GPU";
        fsdp_err err;
        d_ = dev_ctx_create(nullptr, &err);
        ASSERT_NE(d_, nullptr) << err.msg;
    }
    void TearDown() override {
        if (d_) dev_ctx_free(d_);
    }
    // Rows [r0, r1) of p generated on the GPU, downloaded.
    std::vector<float> dev_rows(const decoder_param &p, uint64_t seed, int64_t r0, int64_t r1) {
        const size_t n = (size_t)((r1 - r0) * p.row_numel);
        std::vector<float> out(n);
        if (n == 0) return out;
        void *buf = nullptr;
        fsdp_err err;
        EXPECT_EQ(dev_alloc(d_, n * sizeof(float), &buf, &err), 0) << err.msg;
        if (!buf) return out;
        EXPECT_EQ(decoder_init_rows_dev(d_, &p, seed, r0, r1, (float *)buf, &err), 0) << err.msg;
        EXPECT_EQ(dev_download(d_, out.data(), buf, n * sizeof(float), &err), 0) << err.msg;
        EXPECT_EQ(dev_free(d_, buf, &err), 0) << err.msg;
        return out;
    }
    dev_ctx *d_ = nullptr;
};

decoder_config small_config() {
    // every rule: normal (tok_embeddings), trunc_normal at +-100 sigma (wq..w3), trunc_normal at
    // +-3 sigma (output), ones (norms); vocab 1001 and dim 256 give uneven shards.
    decoder_config c;
    decoder_config_defaults(&c);
    c.dim = 256, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 1001;
    fsdp_err err;
    EXPECT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    return c;
}

}  // namespace

TEST_F(LlamaInitCuda, EveryRuleAndShardEqualsHost) {
    decoder_config c = small_config();
    decoder_params t;
    fsdp_err err;
    ASSERT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
    bool rules[INIT_KIND_COUNT] = {};
    for (int i = 0; i < t.n; i++) {
        const decoder_param &p = t.p[i];
        rules[p.init.kind] = true;
        std::vector<float> host((size_t)p.numel);
        ASSERT_EQ(decoder_init_rows_f32(&p, 7, 0, p.shape[0], host.data(), &err), 0) << err.msg;
        std::vector<float> whole = dev_rows(p, 7, 0, p.shape[0]);
        Cmp cw = compare(whole, host);
        ASSERT_LE(cw.max_ulp, 1) << p.name;
        EXPECT_EQ(cw.differ, 0u) << p.name << ": " << cw.differ << " elements differ by 1 ulp";
        for (int world : {2, 3, 7}) {
            std::vector<float> cat;
            for (int r = 0; r < world; r++) {
                int64_t row0, rows;
                shard_rows(p.shape[0], world, r, &row0, &rows);
                std::vector<float> part = dev_rows(p, 7, row0, row0 + rows);
                cat.insert(cat.end(), part.begin(), part.end());
            }
            // world-size invariant on the GPU: the shards are the whole parameter, bit for bit
            ASSERT_EQ(cat.size(), whole.size());
            EXPECT_EQ(0, memcmp(cat.data(), whole.data(), whole.size() * sizeof(float)))
                << p.name << " world " << world;
        }
    }
    EXPECT_TRUE(rules[INIT_NORMAL] && rules[INIT_TRUNC_NORMAL] && rules[INIT_ONES]);
    decoder_params_free(&t);
}

TEST_F(LlamaInitCuda, KernelEqualsHostFillOnOddRanges) {
    // kcu_init_fill directly: every distribution kind, starts that are not block aligned, a range
    // long enough for the grid-stride loop (more than 65536 x 256 blocks of 4), far stream positions.
    rng_dist u, n, tn, tn3, c;
    fsdp_err err;
    rng_dist_uniform(&u);
    ASSERT_EQ(rng_dist_normal(&n, 0.5, 2.0, &err), 0);
    ASSERT_EQ(rng_dist_trunc_normal(&tn, 0, 0.02, -2, 2, &err), 0);
    ASSERT_EQ(rng_dist_trunc_normal(&tn3, 0.1, 0.5, -1.0, 1.2, &err), 0);
    rng_dist_const(&c, 1.0f);
    const rng_dist *dists[] = {&u, &n, &tn, &tn3, &c};
    struct Range {
        uint64_t start;
        size_t n;
    } ranges[] = {{0, 1}, {1, 2}, {3, 5}, {1001, 77777}, {(1ull << 34) - 6, 4099}, {5, (size_t)70000000}};
    size_t cap = 0;
    for (const Range &r : ranges) cap = std::max(cap, r.n);
    void *buf = nullptr;
    ASSERT_EQ(dev_alloc(d_, cap * sizeof(float), &buf, &err), 0) << err.msg;
    for (const rng_dist *d : dists)
        for (const Range &r : ranges) {
            if (r.n > 1000000 && d != &tn3) continue;  // the long range once
            std::vector<float> host(r.n), dev(r.n);
            rng_fill_dist(d, host.data(), 99, 0x5eedull, r.start, r.n);
            ASSERT_EQ(kcu_init_fill((float *)buf, d, 99, 0x5eedull, r.start, (int64_t)r.n,
                                    (kcu_stream)dev_ctx_stream(d_, DEV_STREAM_COMPUTE), &err),
                      0)
                << err.msg;
            ASSERT_EQ(dev_download(d_, dev.data(), buf, r.n * sizeof(float), &err), 0) << err.msg;
            Cmp cmp = compare(dev, host);
            ASSERT_LE(cmp.max_ulp, 1) << "kind " << d->kind << " start " << r.start;
            EXPECT_EQ(cmp.differ, 0u) << "kind " << d->kind << " start " << r.start;
        }
    // elements outside [start, start + n) are never written
    std::vector<float> sentinel(16, -7.0f), back(16);
    ASSERT_EQ(dev_upload(d_, buf, sentinel.data(), 16 * sizeof(float), &err), 0) << err.msg;
    ASSERT_EQ(kcu_init_fill((float *)buf + 4, &n, 1, 2, 6, 5, (kcu_stream)dev_ctx_stream(d_, DEV_STREAM_COMPUTE),
                            &err),
              0)
        << err.msg;
    ASSERT_EQ(dev_download(d_, back.data(), buf, 16 * sizeof(float), &err), 0) << err.msg;
    for (int k = 0; k < 16; k++) {
        if (k >= 4 && k < 9) EXPECT_EQ(back[k], rng_dist_at(&n, 1, 2, 6 + (uint64_t)(k - 4))) << k;
        else EXPECT_EQ(back[k], -7.0f) << k;
    }
    ASSERT_EQ(kcu_init_fill((float *)buf, &n, 1, 2, 0, -1, nullptr, &err), FSDP_E_INVALID);
    rng_dist bad = n;
    bad.kind = 42;
    ASSERT_EQ(kcu_init_fill((float *)buf, &bad, 1, 2, 0, 4, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("kind 42"), std::string::npos) << err.msg;
    ASSERT_EQ(dev_free(d_, buf, &err), 0) << err.msg;
}

TEST(LlamaInitCudaArgs, ChecksAndBuildWithoutCuda) {
    // Argument checks come first (no GPU needed); then a build without CUDA says so.
    decoder_config c = small_config();
    decoder_params t;
    fsdp_err err;
    ASSERT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
    const decoder_param &p = t.p[0];
    EXPECT_EQ(decoder_init_rows_dev(nullptr, nullptr, 0, 0, 1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_rows_dev(nullptr, &p, 0, 0, p.shape[0] + 1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find(p.name), std::string::npos) << err.msg;
    EXPECT_EQ(decoder_init_rows_dev(nullptr, &p, 0, 3, 2, nullptr, &err), FSDP_E_INVALID);
    if (dev_built_with_cuda()) {
        EXPECT_EQ(decoder_init_rows_dev(nullptr, &p, 0, 0, 1, nullptr, &err), FSDP_E_INVALID);
        EXPECT_NE(std::string(err.msg).find("no device context"), std::string::npos) << err.msg;
        EXPECT_EQ(decoder_init_rows_dev(nullptr, &p, 0, 2, 2, nullptr, &err), 0);  // empty shard
    } else {
        EXPECT_EQ(decoder_init_rows_dev(nullptr, &p, 0, 0, 1, nullptr, &err), FSDP_E_DEVICE);
        EXPECT_NE(std::string(err.msg).find("built without CUDA"), std::string::npos) << err.msg;
        rng_dist u;
        rng_dist_uniform(&u);
        EXPECT_EQ(kcu_init_fill(nullptr, &u, 0, 0, 0, 1, nullptr, &err), FSDP_E_DEVICE);
    }
    decoder_params_free(&t);
}
