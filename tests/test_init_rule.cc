// Init rules with torch.nn.init's definitions (model/init_rule.h) and the generic parallel fill
// (model/init_fill.h): parsing and formatting, torch's fans and gains from the FULL shape, and the
// distributions of large draws (mean, variance, bounds) against the formulas torch documents; the
// fixed sincos_2d table (model/init_sincos.h) against the numpy tables of the Bagel fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/reader.h"
#include "model/init_fill.h"
#include "model/init_rule.h"
#include "model/init_sincos.h"
#include "runtime/shard.h"
}

namespace {

init_rule parse_ok(const char *text) {
    init_rule r;
    fsdp_err err;
    EXPECT_EQ(init_rule_parse(text, &r, &err), 0) << text << ": " << err.msg;
    return r;
}

std::string parse_err(const char *text) {
    init_rule r;
    fsdp_err err;
    if (init_rule_parse(text, &r, &err) == 0) return "(accepted)";
    return err.msg;
}

// n values of rule r for a parameter of FULL shape `shape` (elements [e0, e0 + n)).
std::vector<float> draw(const init_rule &r, std::vector<int64_t> shape, int64_t n, const char *name = "p",
                        int64_t e0 = 0) {
    init_job j = {};
    fsdp_err err;
    EXPECT_EQ(init_rule_dist(&r, (int)shape.size(), shape.data(), name, &j.dist, &err), 0) << err.msg;
    std::vector<float> v((size_t)n);
    j.stream = init_stream(name);
    j.e0 = e0;
    j.n = n;
    j.f32 = v.data();
    j.dtype = FSDP_DT_F32;
    EXPECT_EQ(init_fill_jobs(&j, 1, 1234, "test", &err), 0) << err.msg;
    return v;
}

struct Moments {
    double mean, var, lo, hi;
};
Moments moments(const std::vector<float> &v) {
    double s = 0, s2 = 0, lo = INFINITY, hi = -INFINITY;
    for (float x : v) {
        s += x;
        s2 += (double)x * x;
        lo = std::min(lo, (double)x);
        hi = std::max(hi, (double)x);
    }
    double m = s / v.size();
    return {m, s2 / v.size() - m * m, lo, hi};
}

// Sample mean and variance within 6 standard errors of the distribution's (4th moment given as
// kurtosis * var^2), bounds inside [a, b] and reaching near them.
void expect_dist(const std::vector<float> &v, double mean, double var, double kurt, const char *what) {
    Moments m = moments(v);
    double n = (double)v.size();
    EXPECT_NEAR(m.mean, mean, 6 * std::sqrt(var / n) + 1e-12) << what;
    EXPECT_NEAR(m.var, var, 6 * var * std::sqrt((kurt - 1) / n) + 1e-15) << what;
}

void expect_uniform(const std::vector<float> &v, double a, double b, const char *what) {
    double var = (b - a) * (b - a) / 12;
    expect_dist(v, (a + b) / 2, var, 1.8, what);
    Moments m = moments(v);
    EXPECT_GE(m.lo, (float)a) << what;
    EXPECT_LE(m.hi, (float)b) << what;
    EXPECT_LT(m.lo, a + (b - a) * 1e-3) << what;  // reaches both ends
    EXPECT_GT(m.hi, b - (b - a) * 1e-3) << what;
}

void expect_normal(const std::vector<float> &v, double mean, double std, const char *what) {
    expect_dist(v, mean, std * std, 3.0, what);
    Moments m = moments(v);
    EXPECT_GT(m.hi, mean + 4 * std) << what;  // tails present at n = 1M
    EXPECT_LT(m.lo, mean - 4 * std) << what;
}

const int64_t N = 1 << 20;

TEST(InitRule, ParsesTorchSignaturesPositionalAndKeyword) {
    init_rule r = parse_ok("trunc_normal(0, 0.02, a=-0.04, b=0.04)");
    EXPECT_EQ(r.kind, INIT_TRUNC_NORMAL);
    EXPECT_EQ(r.mean, 0.0);
    EXPECT_EQ(r.std, 0.02);
    EXPECT_EQ(r.a, -0.04);
    EXPECT_EQ(r.b, 0.04);
    r = parse_ok("trunc_normal");  // torch defaults
    EXPECT_EQ(r.std, 1.0);
    EXPECT_EQ(r.a, -2.0);
    EXPECT_EQ(r.b, 2.0);
    r = parse_ok(" kaiming_uniform( a = sqrt(5), mode='fan_out', nonlinearity=relu ) ");
    EXPECT_EQ(r.kind, INIT_KAIMING_UNIFORM);
    EXPECT_DOUBLE_EQ(r.a, std::sqrt(5.0));
    EXPECT_EQ(r.fan_out_mode, 1);
    EXPECT_EQ(r.nonlin, INIT_NL_RELU);
    EXPECT_EQ(parse_ok("uniform(-1, 1)").b, 1.0);
    EXPECT_EQ(parse_ok("constant(0.5)").value, 0.5);
    EXPECT_EQ(parse_ok("xavier_normal(gain=2)").gain, 2.0);
    EXPECT_EQ(parse_ok("zeros").kind, INIT_ZEROS);
    EXPECT_EQ(parse_ok("ones()").kind, INIT_ONES);
    EXPECT_EQ(parse_ok("default_linear").kind, INIT_DEFAULT_LINEAR);
    EXPECT_EQ(parse_ok("default_embedding").kind, INIT_DEFAULT_EMBEDDING);
    EXPECT_EQ(parse_ok("none").kind, INIT_NONE);
    EXPECT_EQ(parse_ok("kaiming_normal(0, fan_in, conv2d)").nonlin, INIT_NL_LINEAR);
}

TEST(InitRule, FormatParsesBackToTheSameRule) {
    for (const char *t : {"normal(0.5, 0.25)", "trunc_normal(0, 0.02, -0.04, 0.04)", "uniform(-3, 7)", "zeros",
                          "ones", "constant(-2.5)", "kaiming_uniform(0.1, fan_out, tanh)", "kaiming_normal",
                          "xavier_uniform(1.5)", "xavier_normal", "default_linear", "default_embedding", "none",
                          "sincos_2d(grid=5)", "sincos_2d(7, base=100.5)", "normal(0, 0.02, padding_idx=3)",
                          "default_embedding(padding_idx=0)", "zeros(padding_idx=2)", "uniform(padding_idx=1, a=-1)"}) {
        init_rule a = parse_ok(t), b;
        char buf[256];
        init_rule_format(&a, buf, sizeof buf);
        fsdp_err err;
        ASSERT_EQ(init_rule_parse(buf, &b, &err), 0) << buf << ": " << err.msg;
        EXPECT_EQ(0, memcmp(&a, &b, sizeof a)) << t << " -> " << buf;
    }
}

TEST(InitRule, BadRulesNameWhatIsWrong) {
    EXPECT_NE(parse_err("gaussian(0, 1)").find("unknown rule 'gaussian'"), std::string::npos);
    EXPECT_NE(parse_err("normal(0, 1, 2)").find("too many arguments"), std::string::npos);
    EXPECT_NE(parse_err("normal(mean=0, sd=1)").find("normal takes no argument 'sd'"), std::string::npos);
    EXPECT_NE(parse_err("normal(0, -1)").find("std must be > 0"), std::string::npos);
    EXPECT_NE(parse_err("normal(std=1, 0)").find("positional argument after a keyword"), std::string::npos);
    EXPECT_NE(parse_err("normal(0, std=1, std=2)").find("given twice"), std::string::npos);
    EXPECT_NE(parse_err("uniform(1, 0)").find("a <= b"), std::string::npos);
    EXPECT_NE(parse_err("trunc_normal(0, 1, 2, 2)").find("a < b"), std::string::npos);
    EXPECT_NE(parse_err("constant").find("needs its value"), std::string::npos);
    EXPECT_NE(parse_err("zeros(1)").find("takes no arguments"), std::string::npos);
    EXPECT_NE(parse_err("kaiming_uniform(mode=fan_both)").find("fan_in or fan_out"), std::string::npos);
    EXPECT_NE(parse_err("kaiming_uniform(nonlinearity=gelu)").find("nonlinearity must be"), std::string::npos);
    EXPECT_NE(parse_err("normal(0, 1) x").find("unexpected text"), std::string::npos);
    EXPECT_NE(parse_err("normal(0, 1e999)").find("finite number"), std::string::npos);
    EXPECT_NE(parse_err("normal(0, 1").find("expected ',' or ')'"), std::string::npos);
    EXPECT_NE(parse_err("").find("expected a rule name"), std::string::npos);
    // the message quotes the text
    EXPECT_NE(parse_err("normal(0, -1)").find("init rule 'normal(0, -1)'"), std::string::npos);
    // padding_idx: a row (a whole number >= 0), once, on a rule that gives values
    EXPECT_NE(parse_err("normal(0, 1, padding_idx=-1)").find("padding_idx must be a whole number >= 0"), std::string::npos);
    EXPECT_NE(parse_err("default_embedding(padding_idx=1.5)").find("padding_idx must be a whole number"), std::string::npos);
    EXPECT_NE(parse_err("normal(padding_idx=1, padding_idx=2)").find("given twice"), std::string::npos);
    EXPECT_NE(parse_err("sincos_2d(grid=4, padding_idx=0)").find("sincos_2d takes no argument 'padding_idx'"),
              std::string::npos);
    EXPECT_NE(parse_err("none(padding_idx=0)").find("takes no arguments"), std::string::npos);
}

// padding_idx=N: row N of dim 0 is zeros (nn.Embedding's padding row, as transformers' _init_weights
// leaves it), every other element the value the rule draws without it, in any slice of rows and in
// float32, bf16 and f16; a row outside the shape is an error naming the parameter.
TEST(InitRule, PaddingRowIsZerosAndTheRestIsUnchanged) {
    init_rule plain = parse_ok("normal(0, 0.02)"), pad = parse_ok("normal(0, 0.02, padding_idx=7)");
    const int64_t shape[2] = {50, 24}, n = 50 * 24;
    for (fsdp_dtype dt : {FSDP_DT_F32, FSDP_DT_BF16, FSDP_DT_F16})
        for (int64_t r0 : {0, 6, 7, 8}) {
            int64_t e0 = r0 * 24, m = n - e0;
            init_job a = {}, b = {};
            fsdp_err err;
            ASSERT_EQ(init_job_for_rule(&a, &plain, 2, shape, "tok_embeddings.weight", &err), 0) << err.msg;
            ASSERT_EQ(init_job_for_rule(&b, &pad, 2, shape, "tok_embeddings.weight", &err), 0) << err.msg;
            EXPECT_EQ(b.zero_e0, 7 * 24);
            EXPECT_EQ(b.zero_e1, 8 * 24);
            std::vector<float> va((size_t)m), vb((size_t)m);
            std::vector<uint16_t> ha((size_t)m), hb((size_t)m);
            for (init_job *j : {&a, &b}) {
                j->stream = init_stream("tok_embeddings.weight");
                j->e0 = e0;
                j->n = m;
                j->dtype = dt;
            }
            if (dt == FSDP_DT_F32) {
                a.f32 = va.data(), b.f32 = vb.data();
            } else {
                a.half = ha.data(), b.half = hb.data();
            }
            ASSERT_EQ(init_fill_jobs(&a, 1, 11, "t", &err), 0) << err.msg;
            ASSERT_EQ(init_fill_jobs(&b, 1, 11, "t", &err), 0) << err.msg;
            for (int64_t i = 0; i < m; i++) {
                const int64_t row = (e0 + i) / 24;
                const bool zero = dt == FSDP_DT_F32 ? vb[i] == 0.0f : hb[i] == 0;
                if (row == 7) {
                    ASSERT_TRUE(zero) << "dtype " << dt << ", rows from " << r0 << ", element " << i;
                } else if (dt == FSDP_DT_F32) {
                    ASSERT_EQ(vb[i], va[i]) << i;
                } else {
                    ASSERT_EQ(hb[i], ha[i]) << i;
                }
            }
        }
    init_rule far = parse_ok("normal(0, 0.02, padding_idx=50)");
    init_job j = {};
    fsdp_err err;
    EXPECT_EQ(init_job_for_rule(&j, &far, 2, shape, "tok_embeddings.weight", &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("tok_embeddings.weight: padding_idx 50 is not a row of its 50"), std::string::npos)
        << err.msg;
}

TEST(InitRule, FansAreTorchsFromTheFullShape) {
    int64_t fi, fo;
    fsdp_err err;
    int64_t lin[2] = {300, 70}, conv[4] = {16, 3, 5, 7};
    ASSERT_EQ(init_fans(2, lin, &fi, &fo, "w", &err), 0);
    EXPECT_EQ(fi, 70);
    EXPECT_EQ(fo, 300);
    ASSERT_EQ(init_fans(4, conv, &fi, &fo, "c", &err), 0);
    EXPECT_EQ(fi, 3 * 35);
    EXPECT_EQ(fo, 16 * 35);
    int64_t bias[1] = {300};
    EXPECT_EQ(init_fans(1, bias, &fi, &fo, "layer.bias", &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("layer.bias: fan in and fan out can not be computed"), std::string::npos);
    // a rule that needs fans on a 1-D tensor is an error naming it, as in torch
    init_rule r = parse_ok("xavier_uniform");
    rng_dist d;
    EXPECT_EQ(init_rule_dist(&r, 1, bias, "norm.weight", &d, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("norm.weight"), std::string::npos) << err.msg;
    r = parse_ok("none");
    EXPECT_EQ(init_rule_dist(&r, 2, lin, "x.weight", &d, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("x.weight has no init rule"), std::string::npos) << err.msg;
}

TEST(InitRule, SimpleDistributionsHaveTorchsMomentsAndBounds) {
    expect_normal(draw(parse_ok("normal(0.5, 0.02)"), {1024, 1024}, N), 0.5, 0.02, "normal");
    expect_normal(draw(parse_ok("default_embedding"), {1024, 1024}, N), 0.0, 1.0, "default_embedding");
    expect_uniform(draw(parse_ok("uniform(-0.3, 0.1)"), {N}, N), -0.3, 0.1, "uniform");
    // trunc_normal(0, 1, -1, 2): moments of the truncated normal
    {
        double a = -1, b = 2, pa = std::exp(-a * a / 2) / std::sqrt(2 * M_PI), pb = std::exp(-b * b / 2) / std::sqrt(2 * M_PI);
        double Z = 0.5 * (std::erf(b / std::sqrt(2.0)) - std::erf(a / std::sqrt(2.0)));
        double mean = (pa - pb) / Z, var = 1 + (a * pa - b * pb) / Z - mean * mean;
        std::vector<float> v = draw(parse_ok("trunc_normal(0, 1, -1, 2)"), {N}, N);
        expect_dist(v, mean, var, 3.0, "trunc_normal");
        Moments m = moments(v);
        EXPECT_GE(m.lo, -1.0f);
        EXPECT_LE(m.hi, 2.0f);
        EXPECT_LT(m.lo, -0.999);
        EXPECT_GT(m.hi, 1.99);
    }
    for (auto c : std::vector<std::pair<const char *, float>>{{"zeros", 0.f}, {"ones", 1.f}, {"constant(-2.5)", -2.5f}}) {
        std::vector<float> v = draw(parse_ok(c.first), {33, 7}, 231);
        for (float x : v) ASSERT_EQ(x, c.second) << c.first;
    }
}

TEST(InitRule, FanRulesUseTheFullShapeOfTheParameter) {
    // [out, in] = [2048, 512]: fan_in 512, fan_out 2048
    const std::vector<int64_t> w = {2048, 512};
    double fi = 512, fo = 2048;
    expect_uniform(draw(parse_ok("kaiming_uniform"), w, N), -std::sqrt(2.0) * std::sqrt(3 / fi),
                   std::sqrt(2.0) * std::sqrt(3 / fi), "kaiming_uniform");
    expect_uniform(draw(parse_ok("kaiming_uniform(mode=fan_out, nonlinearity=tanh)"), w, N),
                   -5.0 / 3 * std::sqrt(3 / fo), 5.0 / 3 * std::sqrt(3 / fo), "kaiming_uniform fan_out tanh");
    expect_normal(draw(parse_ok("kaiming_normal(a=0.2)"), w, N), 0, std::sqrt(2 / (1 + 0.04)) / std::sqrt(fi),
                  "kaiming_normal");
    expect_uniform(draw(parse_ok("xavier_uniform(gain=2)"), w, N), -2 * std::sqrt(6 / (fi + fo)),
                   2 * std::sqrt(6 / (fi + fo)), "xavier_uniform");
    expect_normal(draw(parse_ok("xavier_normal"), w, N), 0, std::sqrt(2 / (fi + fo)), "xavier_normal");
    // nn.Linear: weight U(+-1/sqrt(fan_in)) (kaiming_uniform(a=sqrt(5))), bias U(+-1/sqrt(fan_in of the weight))
    expect_uniform(draw(parse_ok("default_linear"), w, N), -1 / std::sqrt(fi), 1 / std::sqrt(fi), "linear weight");
    init_rule b = parse_ok("default_linear");
    b.fan_in = 512;
    expect_uniform(draw(b, {2048}, 2048 * 64, "fc.bias"), -1 / std::sqrt(fi), 1 / std::sqrt(fi), "linear bias");
    b.fan_in = 0;
    rng_dist d;
    fsdp_err err;
    int64_t bs[1] = {2048};
    EXPECT_EQ(init_rule_dist(&b, 1, bs, "fc.bias", &d, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("fc.bias: default_linear on a bias needs its layer's weight"),
              std::string::npos)
        << err.msg;
    // conv weights: receptive field counts
    expect_uniform(draw(parse_ok("default_linear"), {64, 16, 4, 4}, 64 * 16 * 16), -1 / std::sqrt(256.0),
                   1 / std::sqrt(256.0), "conv weight");
}

// The shape the rule sees is the parameter's, never a shard's: rows [r0, r1) drawn alone are the
// same bits as those rows of the whole parameter.
TEST(InitRule, ShardsAreRowsOfTheWholeParameter) {
    init_rule r = parse_ok("kaiming_uniform(a=sqrt(5))");
    std::vector<int64_t> shape = {37, 129};
    std::vector<float> whole = draw(r, shape, 37 * 129, "layers.0.w");
    for (int64_t r0 : {0, 5, 36}) {
        int64_t r1 = std::min<int64_t>(37, r0 + 13);
        std::vector<float> part = draw(r, shape, (r1 - r0) * 129, "layers.0.w", r0 * 129);
        EXPECT_EQ(0, memcmp(part.data(), whole.data() + r0 * 129, part.size() * sizeof(float))) << r0;
    }
}

TEST(InitFill, HalfOutputsAndRoundingMatchTheFloatDraw) {
    init_rule r = parse_ok("normal(0, 3)");
    int64_t shape[2] = {100, 100};
    init_job j[3] = {};
    fsdp_err err;
    std::vector<float> f(10000), fr(10000);
    std::vector<uint16_t> h(10000), bf(10000);
    for (auto &x : j) {
        ASSERT_EQ(init_rule_dist(&r, 2, shape, "p", &x.dist, &err), 0);
        x.stream = init_stream("p");
        x.n = 10000;
    }
    j[0].f32 = f.data();
    j[1].f32 = fr.data(), j[1].dtype = FSDP_DT_F16;
    j[2].half = h.data(), j[2].dtype = FSDP_DT_F16;
    ASSERT_EQ(init_fill_jobs(j, 3, 7, "t", &err), 0) << err.msg;
    init_job k = j[2];
    k.half = bf.data(), k.dtype = FSDP_DT_BF16;
    ASSERT_EQ(init_fill_jobs(&k, 1, 7, "t", &err), 0) << err.msg;
    for (int i = 0; i < 10000; i++) {
        ASSERT_EQ(h[i], fsdp_f32_to_f16(f[i])) << i;
        ASSERT_EQ(fr[i], fsdp_f16_to_f32(h[i])) << i;
        ASSERT_EQ(bf[i], fsdp_f32_to_bf16(f[i])) << i;
    }
    // bad jobs are refused before anything runs
    init_job bad = j[0];
    bad.f32 = nullptr;
    EXPECT_EQ(init_fill_jobs(&bad, 1, 7, "t", &err), FSDP_E_INVALID);
    bad = j[0];
    bad.dtype = FSDP_DT_I32;
    EXPECT_EQ(init_fill_jobs(&bad, 1, 7, "t", &err), FSDP_E_INVALID);
    bad = j[0];
    bad.n = -1;
    EXPECT_EQ(init_fill_jobs(&bad, 1, 7, "t", &err), FSDP_E_INVALID);
}

TEST(InitRule, UniformBoundsAreCheckedAndDegenerateRulesAreConstants) {
    rng_dist d;
    fsdp_err err;
    EXPECT_EQ(rng_dist_uniform_ab(&d, 1, 1, &err), FSDP_E_INVALID);
    EXPECT_EQ(rng_dist_uniform_ab(&d, -3e38, 3e38, &err), FSDP_E_INVALID);  // b - a overflows float
    EXPECT_EQ(rng_dist_uniform_ab(&d, 0, INFINITY, &err), FSDP_E_INVALID);
    // uniform(a, a) is the constant a (torch fills a); a zero fan rule gives zeros
    std::vector<float> v = draw(parse_ok("uniform(2, 2)"), {10}, 10);
    for (float x : v) EXPECT_EQ(x, 2.0f);
    v = draw(parse_ok("default_linear"), {8, 0}, 0);
    EXPECT_TRUE(v.empty());
    // every element of the host fill is rng_dist_at's
    ASSERT_EQ(rng_dist_uniform_ab(&d, -0.5, 0.25, &err), 0);
    std::vector<float> w(1000);
    rng_fill_dist(&d, w.data(), 9, 77, 3, w.size());
    for (size_t i = 0; i < w.size(); i++) ASSERT_EQ(w[i], rng_dist_at(&d, 9, 77, 3 + i)) << i;
}

// ---- sincos_2d: the fixed 2-D sine-cosine table ----------------------------------------------------

TEST(InitSincos, ParsesPositionalAndKeywordAndFormatsBack) {
    init_rule r = parse_ok("sincos_2d(grid=5)");
    EXPECT_EQ(r.kind, INIT_SINCOS_2D);
    EXPECT_EQ(r.grid, 5);
    EXPECT_EQ(r.base, 10000.0);
    EXPECT_TRUE(init_rule_is_fixed(&r));
    init_rule z = parse_ok("zeros");
    EXPECT_FALSE(init_rule_is_fixed(&z));
    r = parse_ok(" sincos_2d( 4 , base = 100 ) ");
    EXPECT_EQ(r.grid, 4);
    EXPECT_EQ(r.base, 100.0);
    EXPECT_STREQ(init_kind_name(INIT_SINCOS_2D), "sincos_2d");
    char buf[128];
    r = parse_ok("sincos_2d(5)");
    init_rule_format(&r, buf, sizeof buf);
    EXPECT_STREQ(buf, "sincos_2d(grid=5, base=10000)");
    init_rule b = parse_ok(buf);
    EXPECT_EQ(0, memcmp(&r, &b, sizeof r)) << buf;
    EXPECT_NE(parse_err("sincos_2d").find("sincos_2d needs its grid: sincos_2d(grid=S)"), std::string::npos);
    EXPECT_NE(parse_err("sincos_2d()").find("sincos_2d needs its grid"), std::string::npos);
    for (const char *t : {"sincos_2d(0)", "sincos_2d(grid=-3)", "sincos_2d(2.5)", "sincos_2d(1e12)"})
        EXPECT_NE(parse_err(t).find("grid must be a whole number >= 1"), std::string::npos) << t;
    EXPECT_NE(parse_err("sincos_2d(5, base=0)").find("base must be > 0"), std::string::npos);
    EXPECT_NE(parse_err("sincos_2d(5, std=1)").find("sincos_2d takes no argument 'std'"), std::string::npos);
    EXPECT_NE(parse_err("sincos_2d(5, 10, 3)").find("too many arguments"), std::string::npos);
    EXPECT_NE(parse_err("sincos").find("sincos_2d, none"), std::string::npos);  // listed among the rules
}

namespace {

// The error of rule `text` on a parameter named pos_embed of FULL shape `shape` ("" if accepted).
std::string sincos_err(const init_rule &r, std::vector<int64_t> shape) {
    init_job j = {};
    fsdp_err err;
    fsdp_err_clear(&err);
    if (init_job_for_rule(&j, &r, (int)shape.size(), shape.data(), "init of pos_embed", &err) == 0) return "";
    EXPECT_EQ(err.code, FSDP_E_INVALID);
    return err.msg;
}

}  // namespace

TEST(InitSincos, ShapesThatAreNotSxSByAMultipleOf4AreErrorsNamingTheParameter) {
    init_rule r = parse_ok("sincos_2d(grid=5)");
    EXPECT_EQ(sincos_err(r, {25, 48}), "");
    EXPECT_EQ(sincos_err(r, {25, 4}), "");
    const std::string need = "init of pos_embed: sincos_2d(grid=5) needs a 2-D shape [grid*grid, D] = [25, D] with D a "
                             "positive multiple of 4; the parameter is ";
    EXPECT_EQ(sincos_err(r, {48}), need + "[48] (it has 1 dimension)");
    EXPECT_EQ(sincos_err(r, {5, 5, 48}), need + "[5, 5, 48] (it has 3 dimensions)");
    EXPECT_EQ(sincos_err(r, {25, 50}), need + "[25, 50] (D = 50 is not a positive multiple of 4)");
    EXPECT_EQ(sincos_err(r, {25, 0}), need + "[25, 0] (D = 0 is not a positive multiple of 4)");
    EXPECT_EQ(sincos_err(r, {24, 48}), need + "[24, 48] (it has 24 rows, not 25)");
    EXPECT_EQ(sincos_err(r, {5, 48}), need + "[5, 48] (it has 5 rows, not 25)");
    r.grid = 0;  // a rule built in code, not parsed
    EXPECT_EQ(sincos_err(r, {0, 48}), "init of pos_embed: sincos_2d needs grid >= 1 (the side S of the S x S grid), not 0");
    r.grid = -2;
    EXPECT_NE(sincos_err(r, {4, 48}).find("init of pos_embed: sincos_2d needs grid >= 1"), std::string::npos);
    // a fixed table has no distribution
    r = parse_ok("sincos_2d(5)");
    rng_dist d;
    fsdp_err err;
    int64_t shape[2] = {25, 48};
    EXPECT_EQ(init_rule_dist(&r, 2, shape, "init of pos_embed", &d, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("init of pos_embed: sincos_2d is a fixed table"), std::string::npos) << err.msg;
}

namespace {

struct Table {
    std::vector<float> f32;
    std::vector<double> f64;
};

// pos_embed (float32) and pos_embed_float64 of the fixture's sincos_<S>x48.safetensors, read with the
// project's reader.
Table fixture_table(int S) {
    std::string path = fsdp_test::fixtures_dir() + "/bagel-056b5fd/expected/sincos_" + std::to_string(S) + "x48.safetensors";
    Table t;
    ckpt_reader *r = nullptr;
    fsdp_err err;
    EXPECT_EQ(ckpt_open(path.c_str(), CKPT_AUTO, &r, &err), 0) << path << ": " << err.msg;
    if (!r) return t;
    for (const char *name : {"pos_embed", "pos_embed_float64"}) {
        long i = ckpt_find(r, name);
        EXPECT_GE(i, 0) << name;
        if (i < 0) continue;
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
        EXPECT_EQ(e->ndim, 2);
        EXPECT_EQ(e->shape[0], S * S);
        EXPECT_EQ(e->shape[1], 48);
        bool f64 = !strcmp(name, "pos_embed_float64");
        EXPECT_EQ(e->dtype, f64 ? FSDP_DT_F64 : FSDP_DT_F32) << name;
        size_t n = (size_t)(S * S * 48);
        if (f64) t.f64.resize(n);
        else t.f32.resize(n);
        EXPECT_EQ(ckpt_read_rows(r, (size_t)i, 0, S * S, f64 ? (void *)t.f64.data() : (void *)t.f32.data(),
                                 f64 ? FSDP_DT_F64 : FSDP_DT_F32, &err), 0)
            << err.msg;
    }
    ckpt_close(r);
    return t;
}

// Elements [e0, e0 + n) of sincos_2d(grid=S) on a [S*S, D] parameter through init_fill_jobs.
std::vector<float> sincos_fill(int S, int D, int64_t e0, int64_t n, uint64_t seed = 1,
                               fsdp_dtype dt = FSDP_DT_F32) {
    init_rule r = parse_ok(("sincos_2d(grid=" + std::to_string(S) + ")").c_str());
    std::vector<int64_t> shape = {(int64_t)S * S, D};
    init_job j = {};
    fsdp_err err;
    EXPECT_EQ(init_job_for_rule(&j, &r, 2, shape.data(), "p", &err), 0) << err.msg;
    std::vector<float> v((size_t)n);
    j.stream = init_stream("p");
    j.e0 = e0;
    j.n = n;
    j.f32 = v.data();
    j.dtype = dt;
    EXPECT_EQ(init_fill_jobs(&j, 1, seed, "test", &err), 0) << err.msg;
    return v;
}

}  // namespace

TEST(InitSincos, EqualsNumpysTablesOfTheBagelFixtureBitForBit) {
    for (int S : {4, 5}) {
        Table want = fixture_table(S);
        const size_t n = (size_t)S * S * 48;
        ASSERT_EQ(want.f32.size(), n);
        ASSERT_EQ(want.f64.size(), n);
        std::vector<float> got = sincos_fill(S, 48, 0, (int64_t)n);
        EXPECT_EQ(0, memcmp(got.data(), want.f32.data(), n * sizeof(float))) << S << "x48 float32";
        for (size_t k = 0; k < n; k++) ASSERT_EQ(got[k], want.f32[k]) << S << "x48 element " << k;
        // the float64 values before the cast: numpy's, exactly (glibc's pow, sin, cos)
        init_sincos t;
        fsdp_err err;
        int64_t shape[2] = {(int64_t)S * S, 48};
        ASSERT_EQ(init_sincos_make(S, 10000.0, 2, shape, "p", &t, &err), 0) << err.msg;
        std::vector<double> omega(12), f64(n);
        init_sincos_omega(&t, omega.data());
        init_sincos_fill_f64(&t, omega.data(), 0, (int64_t)n, f64.data());
        size_t ulp = 0;
        for (size_t k = 0; k < n; k++) ulp += f64[k] != want.f64[k];
        EXPECT_EQ(ulp, 0u) << S << "x48: float64 values that differ from numpy's";
    }
    // the layout: row h*S + w is [sin(w om) | cos(w om) | sin(h om) | cos(h om)], om_0 = 1
    std::vector<float> v = sincos_fill(5, 48, 0, 25 * 48);
    const int row = 2 * 5 + 3;  // h = 2, w = 3
    EXPECT_EQ(v[row * 48 + 0], (float)std::sin(3.0));
    EXPECT_EQ(v[row * 48 + 12], (float)std::cos(3.0));
    EXPECT_EQ(v[row * 48 + 24], (float)std::sin(2.0));
    EXPECT_EQ(v[row * 48 + 36], (float)std::cos(2.0));
}

TEST(InitSincos, ShardsAreRowsOfTheWholeTableOnAnySeedAndWorld) {
    const int S = 7, D = 40, rows = S * S;
    std::vector<float> whole = sincos_fill(S, D, 0, (int64_t)rows * D);
    EXPECT_EQ(whole, sincos_fill(S, D, 0, (int64_t)rows * D, 987654321));  // no RNG: the seed changes nothing
    for (int world : {2, 3, 4, 7, 64}) {
        std::vector<float> cat;
        for (int rank = 0; rank < world; rank++) {
            int64_t row0, n;
            shard_rows(rows, world, rank, &row0, &n);  // torch.chunk's rows
            std::vector<float> part = sincos_fill(S, D, row0 * D, n * D, 1 + rank);
            cat.insert(cat.end(), part.begin(), part.end());
        }
        ASSERT_EQ(cat.size(), whole.size()) << world;
        EXPECT_EQ(0, memcmp(cat.data(), whole.data(), whole.size() * sizeof(float))) << "world " << world;
    }
    // any element range, e.g. one starting and ending inside rows
    std::vector<float> mid = sincos_fill(S, D, 333, 1001);
    EXPECT_EQ(0, memcmp(mid.data(), whole.data() + 333, mid.size() * sizeof(float)));
    // a range past the table is refused before anything runs
    init_rule r = parse_ok("sincos_2d(7)");
    int64_t shape[2] = {rows, D};
    init_job j = {};
    fsdp_err err;
    ASSERT_EQ(init_job_for_rule(&j, &r, 2, shape, "p", &err), 0);
    j.e0 = 10, j.n = (int64_t)rows * D;
    j.f32 = whole.data();
    EXPECT_EQ(init_fill_jobs(&j, 1, 1, "t", &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("outside the sincos_2d table [49, 40]"), std::string::npos) << err.msg;
}

TEST(InitSincos, Bf16AndF16GetTheFloatValueRoundedToTheirDtype) {
    Table want = fixture_table(4);
    const size_t n = 16 * 48;
    ASSERT_EQ(want.f32.size(), n);
    std::vector<float> bf = sincos_fill(4, 48, 0, (int64_t)n, 1, FSDP_DT_BF16);
    std::vector<float> h = sincos_fill(4, 48, 0, (int64_t)n, 1, FSDP_DT_F16);
    size_t changed = 0;
    for (size_t k = 0; k < n; k++) {
        ASSERT_EQ(bf[k], fsdp_bf16_to_f32(fsdp_f32_to_bf16(want.f32[k]))) << k;
        ASSERT_EQ(h[k], fsdp_f16_to_f32(fsdp_f32_to_f16(want.f32[k]))) << k;
        changed += bf[k] != want.f32[k];
    }
    EXPECT_GT(changed, n / 2);  // the rounding did happen
    // half output: the bf16 bits
    init_rule r = parse_ok("sincos_2d(4)");
    int64_t shape[2] = {16, 48};
    init_job j = {};
    fsdp_err err;
    ASSERT_EQ(init_job_for_rule(&j, &r, 2, shape, "p", &err), 0);
    std::vector<uint16_t> bits(n);
    j.n = (int64_t)n;
    j.half = bits.data();
    j.dtype = FSDP_DT_BF16;
    ASSERT_EQ(init_fill_jobs(&j, 1, 1, "t", &err), 0) << err.msg;
    for (size_t k = 0; k < n; k++) ASSERT_EQ(bits[k], fsdp_f32_to_bf16(want.f32[k])) << k;
}

}  // namespace
