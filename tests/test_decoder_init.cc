// Llama-3 parameter table and init: torchtitan order and shapes, init rules, shard invariance,
// statistics, speed.
#include <gtest/gtest.h>

#include <jansson.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "test_util.h"

extern "C" {
#include "fsdp/tensor.h"
#include "decoder/decoder_config.h"
#include "decoder/decoder_init.h"
#include "decoder/decoder_params.h"
#include "runtime/rng.h"
#include "runtime/shard.h"
}

namespace {

struct Table {
    decoder_params t{};
    explicit Table(const decoder_config &c) {
        fsdp_err err;
        EXPECT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
    }
    ~Table() { decoder_params_free(&t); }
    const decoder_param &operator[](const char *name) const {
        int i = decoder_params_find(&t, name);
        EXPECT_GE(i, 0) << name;
        return t.p[i < 0 ? 0 : i];
    }
};

decoder_config preset(const char *name) {
    decoder_config c;
    fsdp_err err;
    EXPECT_EQ(decoder_config_preset(&c, name, &err), 0) << err.msg;
    return c;
}

// A config with several ~1M-element parameters for the statistics.
decoder_config stats_config() {
    decoder_config c;
    decoder_config_defaults(&c);
    c.dim = 1024, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 8, c.vocab_size = 1024;
    fsdp_err err;
    EXPECT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    return c;
}

std::vector<float> init_rows(const decoder_param &p, uint64_t seed, int64_t r0, int64_t r1) {
    std::vector<float> v((size_t)((r1 - r0) * p.row_numel));
    fsdp_err err;
    EXPECT_EQ(decoder_init_rows_f32(&p, seed, r0, r1, v.data(), &err), 0) << err.msg;
    return v;
}

double phi(double x) { return std::exp(-x * x / 2) / std::sqrt(2 * M_PI); }

}  // namespace

TEST(LlamaParams, TinyMatchesFixtureOrderAndShapes) {
    Table tb(preset("tiny"));
    json_error_t je;
    json_t *ref = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
    ASSERT_TRUE(ref) << je.text;
    json_t *names = json_object_get(ref, "param_names");
    json_t *shapes = json_object_get(ref, "param_shapes");
    ASSERT_EQ((size_t)tb.t.n, json_array_size(names));
    int64_t off = 0;
    for (int i = 0; i < tb.t.n; i++) {
        const decoder_param &p = tb.t.p[i];
        const char *want = json_string_value(json_array_get(names, (size_t)i));
        EXPECT_STREQ(p.name, want) << i;
        json_t *shp = json_object_get(shapes, want);
        ASSERT_EQ((size_t)p.ndim, json_array_size(shp)) << want;
        for (int d = 0; d < p.ndim; d++)
            EXPECT_EQ(p.shape[d], json_integer_value(json_array_get(shp, (size_t)d))) << want;
        EXPECT_EQ(p.numel, p.shape[0] * p.shape[1]);
        EXPECT_EQ(p.row_numel, p.ndim == 2 ? p.shape[1] : 1);
        EXPECT_EQ(p.offset, off);
        off += p.numel;
        EXPECT_EQ(decoder_params_find(&tb.t, want), i);
        EXPECT_EQ(decoder_params_index(&tb.t, p.kind, p.layer), i);
    }
    EXPECT_EQ(tb.t.total, off);
    EXPECT_EQ(tb.t.total, 131392);
    EXPECT_EQ(decoder_params_find(&tb.t, "layers.2.attention.wq.weight"), -1);
    EXPECT_EQ(decoder_params_index(&tb.t, DECODER_P_WQ, 2), -1);
    EXPECT_EQ(decoder_params_index(&tb.t, DECODER_P_KIND_COUNT, 0), -1);
    json_decref(ref);
}

TEST(LlamaParams, InitRules) {
    decoder_config c = preset("tiny");
    {
        Table tb(c);
        const decoder_param &emb = tb["tok_embeddings.weight"];
        EXPECT_EQ(emb.init.kind, INIT_NORMAL);
        EXPECT_EQ(emb.init.mean, 0.0);
        EXPECT_EQ(emb.init.std, 1.0);
        EXPECT_EQ(emb.layer, -1);
        for (const char *n : {"layers.0.attention.wq.weight", "layers.1.attention.wk.weight",
                              "layers.1.attention.wv.weight", "layers.1.feed_forward.w1.weight"}) {
            const decoder_param &p = tb[n];
            EXPECT_EQ(p.init.kind, INIT_TRUNC_NORMAL) << n;
            EXPECT_EQ(p.init.std, 0.02) << n;
            EXPECT_EQ(p.init.a, -2.0) << n;  // absolute bounds, not multiples of std
            EXPECT_EQ(p.init.b, 2.0) << n;
        }
        // depth_init: 0.02 / sqrt(2 (layer + 1)); w3 is depth-scaled, w1 is not
        for (const char *n : {"attention.wo.weight", "feed_forward.w2.weight",
                              "feed_forward.w3.weight"}) {
            const decoder_param &p0 = tb[("layers.0." + std::string(n)).c_str()];
            const decoder_param &p1 = tb[("layers.1." + std::string(n)).c_str()];
            EXPECT_EQ(p0.init.kind, INIT_TRUNC_NORMAL);
            EXPECT_DOUBLE_EQ(p0.init.std, 0.02 / std::sqrt(2.0));
            EXPECT_DOUBLE_EQ(p1.init.std, 0.01);
            EXPECT_EQ(p1.layer, 1);
            EXPECT_EQ(p1.init.a, -2.0);
            EXPECT_EQ(p1.init.b, 2.0);
        }
        for (const char *n : {"layers.0.attention_norm.weight", "layers.1.ffn_norm.weight",
                              "norm.weight"}) {
            EXPECT_EQ(tb[n].init.kind, INIT_ONES) << n;
            EXPECT_EQ(tb[n].ndim, 1) << n;
        }
        const decoder_param &out = tb["output.weight"];
        EXPECT_EQ(out.init.kind, INIT_TRUNC_NORMAL);
        EXPECT_EQ(out.init.std, 0.125);  // 64 ** -0.5
        EXPECT_EQ(out.init.a, -0.375);
        EXPECT_EQ(out.init.b, 0.375);
    }
    c.depth_init = 0;  // 0.02 / sqrt(2 n_layers) for every layer
    Table tb(c);
    EXPECT_DOUBLE_EQ(tb["layers.0.feed_forward.w2.weight"].init.std, 0.01);
    EXPECT_DOUBLE_EQ(tb["layers.1.attention.wo.weight"].init.std, 0.01);
}

TEST(LlamaParams, LargePresets) {
    Table tb(preset("llama3_8b"));
    EXPECT_EQ(tb.t.n, 3 + 9 * 32);
    EXPECT_EQ(tb.t.total, 8030261248LL);
    const decoder_param &wk = tb["layers.31.attention.wk.weight"];
    EXPECT_EQ(wk.shape[0], 1024);
    EXPECT_EQ(wk.shape[1], 4096);
    const decoder_param &w2 = tb["layers.0.feed_forward.w2.weight"];
    EXPECT_EQ(w2.shape[0], 4096);
    EXPECT_EQ(w2.shape[1], 14336);
    EXPECT_EQ(tb.t.p[tb.t.n - 1].offset + tb.t.p[tb.t.n - 1].numel, tb.t.total);
    Table t70(preset("llama3_70b"));
    EXPECT_EQ(t70.t.total, 70553706496LL);
    EXPECT_EQ(t70["layers.79.attention.wk.weight"].shape[0], 1024);
    EXPECT_EQ(t70["layers.79.attention.wk.weight"].shape[1], 8192);

    decoder_config bad;
    memset(&bad, 0, sizeof bad);
    decoder_params t;
    fsdp_err err;
    EXPECT_EQ(decoder_params_build(&bad, &t, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("invalid or not finalized"), std::string::npos);
}

TEST(LlamaInit, ShardedEqualsWhole) {
    // torch.chunk sharding over 1..7 ranks, concatenated, is bit-identical to the whole parameter.
    // vocab 250: uneven shards for every world size; vocab 5: empty shards (world 4: 2, 2, 1, 0)
    for (int vocab : {250, 5}) {
        decoder_config c = preset("tiny");
        c.vocab_size = vocab;
        fsdp_err err;
        ASSERT_EQ(decoder_config_finalize(&c, &err), 0);
        Table tb(c);
        for (int i = 0; i < tb.t.n; i++) {
            const decoder_param &p = tb.t.p[i];
            std::vector<float> whole = init_rows(p, 42, 0, p.shape[0]);
            std::vector<uint16_t> whole16((size_t)p.numel);
            ASSERT_EQ(decoder_init_rows_bf16(&p, 42, 0, p.shape[0], whole16.data(), &err), 0)
                << err.msg;
            for (size_t k = 0; k < whole.size(); k++)
                ASSERT_EQ(whole16[k], fsdp_f32_to_bf16(whole[k])) << p.name << " " << k;
            for (int world = 1; world <= 7; world++) {
                std::vector<float> cat;
                std::vector<uint16_t> cat16;
                for (int r = 0; r < world; r++) {
                    int64_t row0, rows;
                    shard_rows(p.shape[0], world, r, &row0, &rows);
                    std::vector<float> part = init_rows(p, 42, row0, row0 + rows);
                    cat.insert(cat.end(), part.begin(), part.end());
                    std::vector<uint16_t> part16((size_t)(rows * p.row_numel));
                    ASSERT_EQ(
                        decoder_init_rows_bf16(&p, 42, row0, row0 + rows, part16.data(), &err), 0);
                    cat16.insert(cat16.end(), part16.begin(), part16.end());
                }
                ASSERT_EQ(cat.size(), whole.size());
                EXPECT_EQ(0, memcmp(cat.data(), whole.data(), whole.size() * sizeof(float)))
                    << p.name << " world " << world;
                EXPECT_EQ(cat16, whole16) << p.name << " world " << world;
            }
        }
    }
}

TEST(LlamaInit, ShardedEqualsWholeLargeParam) {
    // A parameter large enough for the OpenMP path, split at odd row counts.
    decoder_config c = stats_config();
    Table tb(c);
    const decoder_param &p = tb["output.weight"];  // [1024, 1024]
    std::vector<float> whole = init_rows(p, 9, 0, p.shape[0]);
    for (int world : {3, 5, 7}) {
        std::vector<float> cat;
        for (int r = 0; r < world; r++) {
            int64_t row0, rows;
            shard_rows(p.shape[0], world, r, &row0, &rows);
            std::vector<float> part = init_rows(p, 9, row0, row0 + rows);
            cat.insert(cat.end(), part.begin(), part.end());
        }
        EXPECT_EQ(0, memcmp(cat.data(), whole.data(), whole.size() * sizeof(float))) << world;
    }
}

TEST(LlamaInit, WholeModel) {
    Table tb(preset("tiny"));
    std::vector<float> flat((size_t)tb.t.total);
    std::vector<uint16_t> flat16((size_t)tb.t.total);
    fsdp_err err;
    ASSERT_EQ(decoder_init_model_f32(&tb.t, 0, flat.data(), &err), 0) << err.msg;
    ASSERT_EQ(decoder_init_model_bf16(&tb.t, 0, flat16.data(), &err), 0) << err.msg;
    for (int i = 0; i < tb.t.n; i++) {
        const decoder_param &p = tb.t.p[i];
        std::vector<float> v = init_rows(p, 0, 0, p.shape[0]);
        EXPECT_EQ(0, memcmp(v.data(), flat.data() + p.offset, v.size() * sizeof(float))) << p.name;
        if (p.init.kind == INIT_ONES) {
            for (float x : v) ASSERT_EQ(x, 1.0f) << p.name;
        }
    }
    for (size_t k = 0; k < flat.size(); k++) ASSERT_EQ(flat16[k], fsdp_f32_to_bf16(flat[k])) << k;
}

TEST(LlamaInit, JobsEqualRowsAndIgnoreThreadCount) {
    // decoder_init_jobs over several parameters at once (small and large, f32, f32 rounded to
    // bf16, bf16 bits, empty ranges) gives the bits of the one-parameter calls, whatever the
    // number of threads.
    decoder_config c = stats_config();
    Table tb(c);
    struct Want {
        const decoder_param *p;
        int64_t r0, r1;
        int mode;  // 0 f32, 1 f32 rounded to bf16, 2 bf16 bits
    };
    std::vector<Want> want;
    for (int i = 0; i < tb.t.n; i++) {
        const decoder_param &p = tb.t.p[i];
        const int64_t r0 = p.shape[0] / 3, r1 = p.shape[0] - p.shape[0] / 5;
        want.push_back({&p, r0, r1, i % 3});
        if (i == 2) want.push_back({&p, 4, 4, 0});  // empty
    }
    auto run = [&](int threads) {
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        std::vector<std::vector<float>> f(want.size());
        std::vector<std::vector<uint16_t>> h(want.size());
        std::vector<decoder_init_job> jobs(want.size());
        for (size_t k = 0; k < want.size(); k++) {
            const size_t n = (size_t)((want[k].r1 - want[k].r0) * want[k].p->row_numel);
            jobs[k] = decoder_init_job{want[k].p, want[k].r0, want[k].r1, nullptr, nullptr, want[k].mode == 1};
            if (want[k].mode == 2) {
                h[k].resize(n);
                jobs[k].bf16 = h[k].data();
            } else {
                f[k].resize(n);
                jobs[k].f32 = f[k].data();
            }
        }
        fsdp_err err;
        EXPECT_EQ(decoder_init_jobs(jobs.data(), (int)jobs.size(), 31, &err), 0) << err.msg;
        omp_set_num_threads(saved);
        return std::make_pair(f, h);
    };
    auto one = run(1);
    for (size_t k = 0; k < want.size(); k++) {
        std::vector<float> ref = init_rows(*want[k].p, 31, want[k].r0, want[k].r1);
        for (size_t e = 0; e < ref.size(); e++) {
            if (want[k].mode == 0) {
                ASSERT_EQ(one.first[k][e], ref[e]) << want[k].p->name << " " << e;
            } else if (want[k].mode == 1) {
                ASSERT_EQ(one.first[k][e], fsdp_bf16_to_f32(fsdp_f32_to_bf16(ref[e]))) << want[k].p->name;
            } else {
                ASSERT_EQ(one.second[k][e], fsdp_f32_to_bf16(ref[e])) << want[k].p->name;
            }
        }
    }
    for (int threads : {2, 3, 8}) {
        auto many = run(threads);
        EXPECT_TRUE(many.first == one.first) << threads << " threads";
        EXPECT_TRUE(many.second == one.second) << threads << " threads";
    }
    // a bad job anywhere fails the whole call before anything is written
    std::vector<float> buf(16, -5.0f);
    decoder_init_job bad[2] = {{want[0].p, 0, 1, buf.data(), nullptr, 0},
                             {want[1].p, 0, want[1].p->shape[0] + 1, buf.data(), nullptr, 0}};
    fsdp_err err;
    EXPECT_EQ(decoder_init_jobs(bad, 2, 0, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find(want[1].p->name), std::string::npos) << err.msg;
    EXPECT_EQ(buf[0], -5.0f);
    EXPECT_EQ(decoder_init_jobs(nullptr, 1, 0, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_jobs(nullptr, 0, 0, &err), 0);
}

TEST(LlamaInit, Statistics) {
    // ~1M elements per parameter: mean and std within 5 standard errors of the exact values.
    decoder_config c = stats_config();
    Table tb(c);
    struct Case {
        const char *name;
        double sd;     // expected std of the (truncated) distribution
        double bound;  // max |x| allowed (float of the truncation bound)
    };
    const double s = 1.0 / 32;  // 1024 ** -0.5
    const double cut3 = std::sqrt(1 - 2 * 3 * phi(3) / (2 * rng_norm_cdf(3) - 1));
    Case cases[] = {
        {"tok_embeddings.weight", 1.0, INFINITY},
        {"layers.0.attention.wq.weight", 0.02, 2.0},
        {"layers.1.attention.wo.weight", 0.01, 2.0},
        {"layers.0.feed_forward.w1.weight", 0.02, 2.0},
        {"layers.1.feed_forward.w3.weight", 0.01, 2.0},
        {"output.weight", s * cut3, (double)(float)(3 * s)},
    };
    for (const Case &k : cases) {
        const decoder_param &p = tb[k.name];
        ASSERT_GE(p.numel, 1000000) << k.name;
        std::vector<float> v = init_rows(p, 1234, 0, p.shape[0]);
        double sum = 0, sum2 = 0, mx = 0;
        for (float x : v) {
            sum += x;
            sum2 += (double)x * x;
            mx = std::max(mx, (double)std::fabs(x));
        }
        const double n = (double)v.size();
        const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
        EXPECT_NEAR(mean, 0.0, 5 * k.sd / std::sqrt(n)) << k.name;
        EXPECT_NEAR(sd, k.sd, 5 * k.sd / std::sqrt(2 * n)) << k.name;
        EXPECT_LE(mx, k.bound) << k.name;
        if (std::isfinite(k.bound) && k.bound < 1) {
            EXPECT_GT(mx, 0.99 * k.bound) << k.name;  // the cut is reached
            // the truncated std is visibly below sigma
            EXPECT_LT(sd, s - 10 * k.sd / std::sqrt(2 * n)) << k.name;
        }
    }
}

TEST(LlamaInit, SeedsAndNamesGiveDifferentStreams) {
    Table tb(preset("tiny"));
    const decoder_param &a = tb["layers.0.attention.wq.weight"];
    const decoder_param &b = tb["layers.1.attention.wq.weight"];  // same shape and rule
    std::vector<float> a0 = init_rows(a, 0, 0, a.shape[0]);
    std::vector<float> a1 = init_rows(a, 1, 0, a.shape[0]);
    std::vector<float> b0 = init_rows(b, 0, 0, b.shape[0]);
    std::vector<float> a0again = init_rows(a, 0, 0, a.shape[0]);
    EXPECT_EQ(a0, a0again);
    size_t same_seed = 0, same_name = 0;
    for (size_t k = 0; k < a0.size(); k++) {
        same_seed += a0[k] == a1[k];
        same_name += a0[k] == b0[k];
    }
    EXPECT_LT(same_seed, 3u);
    EXPECT_LT(same_name, 3u);
    EXPECT_EQ(decoder_init_stream(&a), rng_fnv1a64("layers.0.attention.wq.weight"));
    // element e of a parameter is rng element e of its stream
    rng_dist t;
    fsdp_err err;
    ASSERT_EQ(rng_dist_trunc_normal(&t, 0, 0.02, -2, 2, &err), 0);
    EXPECT_EQ(a0[100], rng_dist_at(&t, 0, decoder_init_stream(&a), 100));
}

TEST(LlamaInit, BadArguments) {
    Table tb(preset("tiny"));
    const decoder_param &p = tb["tok_embeddings.weight"];
    float buf[64];
    fsdp_err err;
    EXPECT_EQ(decoder_init_rows_f32(&p, 0, -1, 0, buf, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("tok_embeddings.weight"), std::string::npos) << err.msg;
    EXPECT_EQ(decoder_init_rows_f32(&p, 0, 3, 2, buf, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_rows_f32(&p, 0, 0, 257, buf, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("[0, 257)"), std::string::npos) << err.msg;
    EXPECT_EQ(decoder_init_rows_f32(&p, 0, 0, 1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_rows_bf16(&p, 0, 0, 1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_rows_f32(nullptr, 0, 0, 1, buf, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_rows_f32(&p, 0, 5, 5, nullptr, &err), 0);  // empty shard
    decoder_param q = p;
    q.init.kind = INIT_TRUNC_NORMAL;
    q.init.std = 0.0;
    EXPECT_EQ(decoder_init_rows_f32(&q, 0, 0, 1, buf, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("decoder init: tok_embeddings.weight"), std::string::npos)
        << err.msg;
    q.init.kind = INIT_NORMAL;
    EXPECT_EQ(decoder_init_rows_f32(&q, 0, 0, 1, buf, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_init_model_f32(&tb.t, 0, nullptr, &err), FSDP_E_INVALID);
}

TEST(LlamaInit, Speed) {
    // 1e7 elements of a truncated normal and of a normal; prints ns/element.
    decoder_config c;
    decoder_config_defaults(&c);
    c.dim = 1000, c.n_layers = 1, c.n_heads = 10, c.vocab_size = 10000;
    fsdp_err err;
    ASSERT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    Table tb(c);
    for (const char *name : {"output.weight", "tok_embeddings.weight"}) {
        const decoder_param &p = tb[name];
        ASSERT_EQ(p.numel, 10000000);
        std::vector<float> v((size_t)p.numel);
        auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(decoder_init_rows_f32(&p, 1, 0, p.shape[0], v.data(), &err), 0) << err.msg;
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double ns = sec * 1e9 / (double)p.numel;
        printf("[ speed    ] %s (%s): %.1f ns/element wall\n", name,
               p.init.kind == INIT_NORMAL ? "normal" : "trunc_normal", ns);
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
        EXPECT_LT(ns, 1000.0) << name;  // a sanity bound only; sanitizer builds are slower
#else
        (void)ns;
#endif
    }
}
