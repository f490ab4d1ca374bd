// CPU kernels against double-precision references: forward values directly, backward passes by
// central finite differences of the double reference (or by the exact formula where it is linear).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kc.h"

namespace {

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = d(g);
    return v;
}

std::vector<double> to_d(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

// max |a - b| / max |b|
template <class A, class B>
double rel_err(const A &a, const B &b) {
    double mx = 0.0, diff = 0.0;
    for (size_t i = 0; i < b.size(); i++) {
        mx = std::max(mx, std::fabs((double)b[i]));
        diff = std::max(diff, std::fabs((double)a[i] - (double)b[i]));
    }
    return mx > 0 ? diff / mx : diff;
}

// Central-difference gradient of f at x (double) for every coordinate listed (all when empty).
std::vector<double> fd_grad(const std::function<double(const std::vector<double> &)> &f, std::vector<double> x,
                            double h = 1e-6) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(x);
        x[i] = x0 - h;
        double fm = f(x);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
    return g;
}

double dot(const std::vector<double> &a, const std::vector<double> &b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

// ---- linear ------------------------------------------------------------------------------------

TEST(KcLinear, ForwardBackwardAndTimingHook) {
    const int n = 7, in = 13, out = 5;
    auto x = randn(n * in, 1), w = randn(out * in, 2), dy = randn(n * out, 3);
    std::vector<float> y(n * out);
    kc_stats st;
    kc_stats_reset(&st);
    kc_linear_forward(x.data(), w.data(), y.data(), n, in, out, &st);
    std::vector<double> yr(n * out, 0.0);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++)
            for (int k = 0; k < in; k++) yr[i * out + o] += (double)x[i * in + k] * w[o * in + k];
    EXPECT_LT(rel_err(y, yr), 1e-6);

    // dx = dy W (beta 0 overwrites garbage; beta 1 adds)
    std::vector<float> dx(n * in, 123.0f);
    kc_linear_backward_input(dy.data(), w.data(), dx.data(), n, in, out, 0.0f, &st);
    std::vector<double> dxr(n * in, 0.0);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < in; k++)
            for (int o = 0; o < out; o++) dxr[i * in + k] += (double)dy[i * out + o] * w[o * in + k];
    EXPECT_LT(rel_err(dx, dxr), 1e-6);
    kc_linear_backward_input(dy.data(), w.data(), dx.data(), n, in, out, 1.0f, &st);
    for (auto &v : dxr) v *= 2;
    EXPECT_LT(rel_err(dx, dxr), 1e-6);

    // dw += dy^T x
    std::vector<float> dw(out * in, 0.25f);
    kc_linear_backward_weight(dy.data(), x.data(), dw.data(), n, in, out, &st);
    std::vector<double> dwr(out * in, 0.25);
    for (int o = 0; o < out; o++)
        for (int k = 0; k < in; k++)
            for (int i = 0; i < n; i++) dwr[o * in + k] += (double)dy[i * out + o] * x[i * in + k];
    EXPECT_LT(rel_err(dw, dwr), 1e-6);

    EXPECT_EQ(st.gemm_calls, 4u);
    EXPECT_DOUBLE_EQ(st.gemm_flops, 4.0 * 2 * n * in * out);
    EXPECT_GE(st.gemm_seconds, 0.0);
    // The hook is optional.
    kc_linear_forward(x.data(), w.data(), y.data(), n, in, out, nullptr);
    EXPECT_EQ(st.gemm_calls, 4u);
}

// ---- embedding ----------------------------------------------------------------------------------

TEST(KcEmbedding, GatherAndScatterAdd) {
    const int V = 10, d = 70;  // more than one 64-column block
    auto table = randn(V * d, 4);
    std::vector<int32_t> tok = {3, 0, 9, 3, 3, 7};
    const int n = (int)tok.size();
    std::vector<float> out(n * d);
    fsdp_err err;
    ASSERT_EQ(kc_embedding_forward(table.data(), tok.data(), out.data(), n, V, d, &err), 0);
    for (int i = 0; i < n; i++) EXPECT_EQ(0, memcmp(&out[i * d], &table[tok[i] * d], d * sizeof(float)));
    auto dout = randn(n * d, 5);
    std::vector<float> dt(V * d, 1.0f);
    ASSERT_EQ(kc_embedding_backward(dout.data(), tok.data(), dt.data(), n, V, d, -1, &err), 0);
    std::vector<double> ref(V * d, 1.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) ref[tok[i] * d + j] += dout[i * d + j];
    EXPECT_LT(rel_err(dt, ref), 1e-6);
    // padding_idx 3 (nn.Embedding's): the three rows of token 3 add nothing, every other row as before
    std::vector<float> dp(V * d, 1.0f);
    ASSERT_EQ(kc_embedding_backward(dout.data(), tok.data(), dp.data(), n, V, d, 3, &err), 0);
    for (int r = 0; r < V; r++)
        for (int j = 0; j < d; j++) {
            if (r == 3)
                ASSERT_EQ(dp[r * d + j], 1.0f) << "the padding row is untouched";
            else
                ASSERT_EQ(dp[r * d + j], dt[r * d + j]) << r;
        }
    EXPECT_EQ(kc_embedding_backward(dout.data(), tok.data(), dp.data(), n, V, d, V, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("padding_idx 10"), std::string::npos) << err.msg;
    tok[4] = V;
    EXPECT_EQ(kc_embedding_forward(table.data(), tok.data(), out.data(), n, V, d, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("token 4 is 10"), std::string::npos) << err.msg;
    tok[4] = -1;
    EXPECT_EQ(kc_embedding_backward(dout.data(), tok.data(), dt.data(), n, V, d, -1, &err), FSDP_E_INVALID);
}

// ---- RMSNorm ------------------------------------------------------------------------------------

TEST(KcRmsnorm, ForwardAndFiniteDifferenceBackward) {
    const int n = 5, d = 67;
    const double eps = 1e-5;
    auto x = randn(n * d, 6), w = randn(d, 7), r = randn(n * d, 8);
    auto ref = [&](const std::vector<double> &xx, const std::vector<double> &ww, std::vector<double> *y) {
        for (int i = 0; i < n; i++) {
            double ss = 0;
            for (int j = 0; j < d; j++) ss += xx[i * d + j] * xx[i * d + j];
            double rs = 1.0 / std::sqrt(ss / d + eps);
            for (int j = 0; j < d; j++) (*y)[i * d + j] = xx[i * d + j] * rs * ww[j];
        }
    };
    std::vector<float> y(n * d), rstd(n);
    kc_rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, d, (float)eps);
    std::vector<double> yr(n * d);
    ref(to_d(x), to_d(w), &yr);
    EXPECT_LT(rel_err(y, yr), 1e-6);

    std::vector<float> dx(n * d, 0.5f), dw(d, -0.5f);
    kc_rmsnorm_backward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, d);
    for (auto &v : dx) v -= 0.5f;  // accumulation on top of the prefill
    for (auto &v : dw) v += 0.5f;
    auto rd = to_d(r), wd = to_d(w), xd = to_d(x);
    auto loss_x = [&](const std::vector<double> &xx) {
        std::vector<double> yy(n * d);
        ref(xx, wd, &yy);
        return dot(yy, rd);
    };
    auto loss_w = [&](const std::vector<double> &ww) {
        std::vector<double> yy(n * d);
        ref(xd, ww, &yy);
        return dot(yy, rd);
    };
    EXPECT_LT(rel_err(dx, fd_grad(loss_x, xd)), 1e-5);
    EXPECT_LT(rel_err(dw, fd_grad(loss_w, wd)), 1e-5);
}

// ---- RoPE ---------------------------------------------------------------------------------------

TEST(KcRope, TablesInDoubleThenRounded) {
    const int hd = 16, T = 40;
    std::vector<float> c(T * hd / 2), s(T * hd / 2);
    kc_rope_params p = {10000.0, 0, 0, 0, 0, 0};
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < hd / 2; j++) {
            double f = 1.0 / std::pow(10000.0, (2.0 * j) / hd);
            EXPECT_EQ(c[t * hd / 2 + j], (float)std::cos(t * f));
            EXPECT_EQ(s[t * hd / 2 + j], (float)std::sin(t * f));
        }
    EXPECT_EQ(kc_rope_tables(15, T, &p, c.data(), s.data(), &err), FSDP_E_INVALID);
    p.theta = 0;
    EXPECT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), FSDP_E_INVALID);
}

TEST(KcRope, Llama3FrequencyScaling) {
    const int hd = 128, T = 2;
    std::vector<float> c(T * hd / 2), s(T * hd / 2);
    kc_rope_params p = {500000.0, 1, 8.0, 1.0, 4.0, 8192.0};
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    int kept = 0, divided = 0, smoothed = 0;
    for (int j = 0; j < hd / 2; j++) {
        double f0 = 1.0 / std::pow(500000.0, (2.0 * j) / hd);
        double wavelen = 2 * M_PI / f0;
        double f = std::atan2((double)s[hd / 2 + j], (double)c[hd / 2 + j]);  // angle at t = 1
        if (wavelen < 8192.0 / 4.0) {
            EXPECT_NEAR(f, f0, 1e-6 * f0 + 1e-7) << j;
            kept++;
        } else if (wavelen > 8192.0) {
            EXPECT_NEAR(f, f0 / 8, 1e-6 * f0) << j;
            divided++;
        } else {
            double sm = (8192.0 / wavelen - 1.0) / 3.0;
            EXPECT_NEAR(f, (1 - sm) * f0 / 8 + sm * f0, 1e-6 * f0) << j;
            EXPECT_GT(f, f0 / 8);
            EXPECT_LT(f, f0);
            smoothed++;
        }
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(smoothed, 0);
    p.high_freq_factor = 1.0;  // low == high
    EXPECT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), FSDP_E_INVALID);
}

TEST(KcRope, ForwardRotatesPairsAndBackwardIsTheTranspose) {
    const int B = 2, T = 5, nh = 3, hd = 8, half = hd / 2;
    std::vector<float> c(T * half), s(T * half);
    kc_rope_params p = {10000.0, 0, 0, 0, 0, 0};
    fsdp_err err;
    ASSERT_EQ(kc_rope_tables(hd, T, &p, c.data(), s.data(), &err), 0);
    auto x = randn(B * T * nh * hd, 9), y = randn(B * T * nh * hd, 10);
    auto rx = x;
    kc_rope_forward(rx.data(), c.data(), s.data(), B, T, nh, hd);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++)
                for (int j = 0; j < half; j++) {
                    size_t o = (((size_t)b * T + t) * nh + h) * hd + 2 * j;
                    double cc = c[t * half + j], ss = s[t * half + j];
                    EXPECT_NEAR(rx[o], x[o] * cc - x[o + 1] * ss, 1e-6);
                    EXPECT_NEAR(rx[o + 1], x[o] * ss + x[o + 1] * cc, 1e-6);
                }
    auto ry = y;
    kc_rope_backward(ry.data(), c.data(), s.data(), B, T, nh, hd);
    // <R x, y> == <x, R^T y>, and R^T R x == x
    EXPECT_NEAR(dot(to_d(rx), to_d(y)), dot(to_d(x), to_d(ry)), 1e-4);
    kc_rope_backward(rx.data(), c.data(), s.data(), B, T, nh, hd);
    EXPECT_LT(rel_err(rx, x), 1e-6);
}

// ---- attention ----------------------------------------------------------------------------------

struct AttnShape {
    int B, T, H, KV, hd;
};

// Double reference: softmax over j <= i of (q.k)/sqrt(hd), GQA kv head h / (H/KV).
void attn_ref(const AttnShape &a, const std::vector<double> &q, const std::vector<double> &k,
              const std::vector<double> &v, std::vector<double> *out, std::vector<double> *lse) {
    int rep = a.H / a.KV;
    std::vector<double> sc(a.T);
    for (int b = 0; b < a.B; b++)
        for (int h = 0; h < a.H; h++)
            for (int i = 0; i < a.T; i++) {
                const double *qi = &q[(((size_t)b * a.T + i) * a.H + h) * a.hd];
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const double *kj = &k[(((size_t)b * a.T + j) * a.KV + h / rep) * a.hd];
                    double s = 0;
                    for (int d = 0; d < a.hd; d++) s += qi[d] * kj[d];
                    sc[j] = s / std::sqrt((double)a.hd);
                    mx = std::max(mx, sc[j]);
                }
                double z = 0;
                for (int j = 0; j <= i; j++) z += std::exp(sc[j] - mx);
                double *oi = &(*out)[(((size_t)b * a.T + i) * a.H + h) * a.hd];
                for (int d = 0; d < a.hd; d++) oi[d] = 0;
                for (int j = 0; j <= i; j++) {
                    const double *vj = &v[(((size_t)b * a.T + j) * a.KV + h / rep) * a.hd];
                    double p = std::exp(sc[j] - mx) / z;
                    for (int d = 0; d < a.hd; d++) oi[d] += p * vj[d];
                }
                if (lse) (*lse)[((size_t)b * a.H + h) * a.T + i] = mx + std::log(z);
            }
}

static_assert(KC_ATTN_QBLOCK * 2 < 150, "the attention tests need several query blocks");

TEST(KcAttention, ForwardMatchesDoubleForMhaGqaMqa) {
    for (int KV : {4, 2, 1}) {
        AttnShape a = {2, 150, 4, KV, 8};  // T > 2 * KC_ATTN_QBLOCK: three query blocks, the last short
        auto q = randn(a.B * a.T * a.H * a.hd, 11, 1.5f), k = randn(a.B * a.T * KV * a.hd, 12, 1.5f),
             v = randn(a.B * a.T * KV * a.hd, 13);
        std::vector<float> out(q.size()), lse(a.B * a.H * a.T);
        fsdp_err err;
        ASSERT_EQ(kc_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), a.B, a.T, a.H, a.KV,
                                       a.hd, nullptr, &err),
                  0);
        std::vector<double> outr(q.size()), lser(lse.size());
        attn_ref(a, to_d(q), to_d(k), to_d(v), &outr, &lser);
        EXPECT_LT(rel_err(out, outr), 1e-5) << "KV " << KV;
        EXPECT_LT(rel_err(lse, lser), 1e-6) << "KV " << KV;
    }
    std::vector<float> z(64);
    fsdp_err err;
    EXPECT_EQ(kc_attention_forward(z.data(), z.data(), z.data(), z.data(), z.data(), 1, 1, 3, 2, 8, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(kc_attention_forward(z.data(), z.data(), z.data(), z.data(), z.data(), 1, 0, 1, 1, 8, nullptr, &err),
              FSDP_E_INVALID);
}

TEST(KcAttention, BackwardMatchesFiniteDifferences) {
    AttnShape a = {1, 150, 4, 2, 8};  // three query blocks
    auto q = randn(a.B * a.T * a.H * a.hd, 14), k = randn(a.B * a.T * a.KV * a.hd, 15),
         v = randn(a.B * a.T * a.KV * a.hd, 16), r = randn(q.size(), 17);
    std::vector<float> out(q.size()), lse(a.B * a.H * a.T), dq(q.size(), 9.0f), dk(k.size(), 9.0f),
        dv(v.size(), 9.0f);
    fsdp_err err;
    ASSERT_EQ(kc_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), a.B, a.T, a.H, a.KV, a.hd,
                                   nullptr, &err),
              0);
    ASSERT_EQ(kc_attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), r.data(), dq.data(),
                                    dk.data(), dv.data(), a.B, a.T, a.H, a.KV, a.hd, nullptr, &err),
              0);
    auto qd = to_d(q), kd = to_d(k), vd = to_d(v), rd = to_d(r);
    std::vector<double> o(q.size());
    auto L = [&](const std::vector<double> &qq, const std::vector<double> &kk, const std::vector<double> &vv) {
        attn_ref(a, qq, kk, vv, &o, nullptr);
        return dot(o, rd);
    };
    // Directional derivatives along random directions, and a sample of single coordinates.
    std::mt19937 g(18);
    const double h = 1e-5;
    struct Which {
        std::vector<double> *x;
        std::vector<float> *grad;
        const char *name;
    } which[3] = {{&qd, &dq, "dq"}, {&kd, &dk, "dk"}, {&vd, &dv, "dv"}};
    for (auto &w : which) {
        double gmax = 0;
        for (float x : *w.grad) gmax = std::max(gmax, (double)std::fabs(x));
        ASSERT_GT(gmax, 0.0);
        for (int trial = 0; trial < 3; trial++) {
            auto u = to_d(randn(w.x->size(), 100 + trial));
            auto x0 = *w.x;
            for (size_t i = 0; i < u.size(); i++) (*w.x)[i] = x0[i] + h * u[i];
            double fp = L(qd, kd, vd);
            for (size_t i = 0; i < u.size(); i++) (*w.x)[i] = x0[i] - h * u[i];
            double fm = L(qd, kd, vd);
            *w.x = x0;
            double fd = (fp - fm) / (2 * h), an = dot(to_d(*w.grad), u);
            EXPECT_NEAR(an, fd, 1e-4 * (std::fabs(fd) + gmax)) << w.name;
        }
        std::uniform_int_distribution<size_t> pick(0, w.x->size() - 1);
        for (int trial = 0; trial < 25; trial++) {
            size_t i = pick(g);
            double x0 = (*w.x)[i];
            (*w.x)[i] = x0 + h;
            double fp = L(qd, kd, vd);
            (*w.x)[i] = x0 - h;
            double fm = L(qd, kd, vd);
            (*w.x)[i] = x0;
            EXPECT_NEAR((*w.grad)[i], (fp - fm) / (2 * h), 1e-5 * gmax) << w.name << "[" << i << "]";
        }
    }
}

// ---- SwiGLU -------------------------------------------------------------------------------------

TEST(KcSwiglu, ForwardAndDerivatives) {
    const int n = 1000;
    auto a = randn(n, 19, 3.0f), b = randn(n, 20), dout = randn(n, 21);
    std::vector<float> out(n), da(n, 7.0f), db(n, 7.0f);
    kc_swiglu_forward(a.data(), b.data(), out.data(), n);
    kc_swiglu_backward(a.data(), b.data(), dout.data(), da.data(), db.data(), n);
    std::vector<double> outr(n), dar(n), dbr(n);
    auto f = [](double x, double y) { return x / (1 + std::exp(-x)) * y; };
    const double h = 1e-6;
    for (int i = 0; i < n; i++) {
        outr[i] = f(a[i], b[i]);
        dar[i] = dout[i] * (f(a[i] + h, b[i]) - f(a[i] - h, b[i])) / (2 * h);
        dbr[i] = dout[i] * (f(a[i], b[i] + h) - f(a[i], b[i] - h)) / (2 * h);
    }
    EXPECT_LT(rel_err(out, outr), 1e-6);
    EXPECT_LT(rel_err(da, dar), 1e-6);
    EXPECT_LT(rel_err(db, dbr), 1e-6);
}

// ---- cross-entropy ------------------------------------------------------------------------------

TEST(KcXent, LossGradientAndIgnoreIndex) {
    const int n = 6, V = 37;
    auto logits = randn(n * V, 22, 2.0f);
    std::vector<int32_t> lab = {3, 36, -100, 0, 17, 17};
    auto loss_ref = [&](const std::vector<double> &x) {
        double s = 0;
        for (int i = 0; i < n; i++) {
            if (lab[i] == -100) continue;
            double mx = -INFINITY, z = 0;
            for (int j = 0; j < V; j++) mx = std::max(mx, x[i * V + j]);
            for (int j = 0; j < V; j++) z += std::exp(x[i * V + j] - mx);
            s += mx + std::log(z) - x[i * V + lab[i]];
        }
        return s;
    };
    std::vector<float> lse(n);
    double loss_sum = 0;
    int64_t kept = 0;
    fsdp_err err;
    ASSERT_EQ(kc_xent_forward(logits.data(), lab.data(), n, V, -100, lse.data(), &loss_sum, &kept, &err), 0);
    EXPECT_EQ(kept, 5);
    EXPECT_NEAR(loss_sum, loss_ref(to_d(logits)), 1e-5);
    EXPECT_EQ(lse[2], 0.0f);
    // Gradient of the mean: (softmax - onehot) / kept, checked against finite differences.
    std::vector<float> d(n * V, 5.0f);
    kc_xent_backward(logits.data(), lab.data(), lse.data(), d.data(), n, V, -100, 1.0f / kept);
    auto fd = fd_grad([&](const std::vector<double> &x) { return loss_ref(x) / kept; }, to_d(logits));
    EXPECT_LT(rel_err(d, fd), 1e-5);
    for (int j = 0; j < V; j++) EXPECT_EQ(d[2 * V + j], 0.0f);
    // In place (dlogits aliasing logits) gives the same numbers.
    auto inplace = logits;
    kc_xent_backward(inplace.data(), lab.data(), lse.data(), inplace.data(), n, V, -100, 1.0f / kept);
    EXPECT_EQ(0, memcmp(inplace.data(), d.data(), d.size() * sizeof(float)));
    // Stable for huge logits.
    std::vector<float> big(V, -3e4f);
    big[5] = 3e4f;
    int32_t l1 = 5;
    ASSERT_EQ(kc_xent_forward(big.data(), &l1, 1, V, -100, lse.data(), &loss_sum, &kept, &err), 0);
    EXPECT_EQ(loss_sum, 0.0);
    l1 = 6;
    ASSERT_EQ(kc_xent_forward(big.data(), &l1, 1, V, -100, lse.data(), &loss_sum, &kept, &err), 0);
    EXPECT_NEAR(loss_sum, 6e4, 1e-2);
    // Bad labels.
    lab[4] = V;
    EXPECT_EQ(kc_xent_forward(logits.data(), lab.data(), n, V, -100, lse.data(), &loss_sum, &kept, &err),
              FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("label 4 is 37"), std::string::npos) << err.msg;
}

// ---- AdamW and clipping --------------------------------------------------------------------------

TEST(KcAdamw, FirstStepByHand) {
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    kc_adamw_hparams h = {0.1, 0.9, 0.999, 1e-8, 0.1};
    kc_adamw_step(&p, &g, &m, &v, 1, &h, 1);
    // m = 0.05, v = 0.00025; m_hat/(sqrt(v_hat)+eps) = 0.5/0.5 = 1; p = 1*(1 - 0.01) - 0.1
    EXPECT_FLOAT_EQ(m, 0.05f);
    EXPECT_FLOAT_EQ(v, 0.00025f);
    EXPECT_NEAR(p, 0.89f, 1e-6);
    // Zero gradient: only the decoupled weight decay acts.
    float p2 = 2.0f, g2 = 0.0f, m2 = 0.0f, v2 = 0.0f;
    kc_adamw_step(&p2, &g2, &m2, &v2, 1, &h, 1);
    EXPECT_FLOAT_EQ(p2, 2.0f * (1.0f - 0.01f));
}

TEST(KcAdamw, TenStepsMatchDoubleReference) {
    const int n = 500;
    auto p = randn(n, 23), m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
    auto pd = to_d(p), md = std::vector<double>(n, 0.0), vd = std::vector<double>(n, 0.0);
    kc_adamw_hparams h = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    for (int step = 1; step <= 10; step++) {
        auto g = randn(n, 200 + step, 0.1f);
        h.lr = 1e-3 * (1.0 - 0.05 * step);
        kc_adamw_step(p.data(), g.data(), m.data(), v.data(), n, &h, step);
        double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
        for (int i = 0; i < n; i++) {
            pd[i] *= 1 - h.lr * h.weight_decay;
            md[i] = 0.9 * md[i] + 0.1 * g[i];
            vd[i] = 0.95 * vd[i] + 0.05 * (double)g[i] * g[i];
            pd[i] -= h.lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + 1e-8);
        }
    }
    EXPECT_LT(rel_err(p, pd), 1e-6);
    EXPECT_LT(rel_err(m, md), 1e-6);
    EXPECT_LT(rel_err(v, vd), 1e-6);
}

// One step from float32 state is the exact AdamW step rounded once: p, m and v within half an ulp of
// the step evaluated in long double, over weights of every scale (norm weights at 1.0, zero biases,
// normal weights, ones a step away from zero) and gradients from 1e-12 to 1e2 of either sign. torch's
// float32 path (the decayed weight rounded before the step is added) misses this by up to several ulps
// and is biased toward a shorter step (kc_adamw.c).
TEST(KcAdamw, OneStepIsTheExactStepRoundedOnce) {
    const int n = 200000;
    std::mt19937 rng(41);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<double> ud(-12.0, 2.0);
    std::vector<float> p(n), g(n), m(n), v(n);
    for (int i = 0; i < n; i++) {
        const int kind = i % 5;
        p[i] = kind == 0 ? 1.0f : kind == 1 ? 0.0f : kind == 2 ? 0.02f * nd(rng) : kind == 3 ? 5e-4f * nd(rng) : nd(rng);
        g[i] = (float)((nd(rng) < 0 ? -1.0 : 1.0) * std::pow(10.0, ud(rng)));
        m[i] = i % 3 ? 0.1f * g[i] * nd(rng) : 0.0f;
        v[i] = i % 3 ? std::fabs(g[i] * g[i] * nd(rng)) : 0.0f;
    }
    for (int step : {1, 3}) {
        const kc_adamw_hparams h = {5e-4, 0.9, 0.95, 1e-8, 0.1};
        std::vector<float> p1 = p, m1 = m, v1 = v;
        kc_adamw_step(p1.data(), g.data(), m1.data(), v1.data(), n, &h, step);
        const long double b1 = 0.9L, b2 = 0.95L, lr = 5e-4L, bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
        int off = 0;
        std::string first;
        for (int i = 0; i < n; i++) {
            const long double gi = g[i], mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
            const long double pi = p[i] * (1 - lr * 0.1L) - lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + 1e-8L);
            const long double want[3] = {pi, mi, vi};
            const float got[3] = {p1[i], m1[i], v1[i]};
            for (int k = 0; k < 3; k++) {
                const float r = (float)want[k];
                const long double half = 0.5L * ((long double)std::nextafter(std::fabs(r), INFINITY) - std::fabs(r));
                if (std::fabs((long double)got[k] - want[k]) > half * (1 + 1e-6L) && off++ == 0) {
                    char b[160];
                    snprintf(b, sizeof b, "element %d %s %.9g, exact %.12Lg", i, k == 0 ? "p" : k == 1 ? "m" : "v",
                             (double)got[k], want[k]);
                    first = b;
                }
            }
        }
        EXPECT_EQ(off, 0) << "step " << step << ": " << off << " results more than half an ulp from the exact step; first: " << first;
    }
}

TEST(KcClip, NormAndCoefficient) {
    auto x = randn(10001, 24);
    double s = 0;
    for (float f : x) s += (double)f * f;
    EXPECT_NEAR(kc_sumsq(x.data(), x.size()), s, 1e-9 * s);
    EXPECT_DOUBLE_EQ(kc_clip_coef(2.0, 1.0), 1.0 / (2.0 + 1e-6));
    EXPECT_DOUBLE_EQ(kc_clip_coef(0.5, 1.0), 1.0);
    EXPECT_DOUBLE_EQ(kc_clip_coef(0.0, 1.0), 1.0);
    float y[3] = {1.0f, -2.0f, 4.0f};
    kc_scale(y, 3, 0.5f);
    EXPECT_EQ(y[0], 0.5f);
    EXPECT_EQ(y[1], -1.0f);
    EXPECT_EQ(y[2], 2.0f);
}

}  // namespace
