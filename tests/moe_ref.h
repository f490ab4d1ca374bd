// A double-precision reference of kernels/cpu/kc_moe.h's mixture-of-experts feed-forward (forward,
// backward, routing statistics), written from the header's formulas, for the GPU tests
// (tests/test_cuda_moe.cc, tests/test_kcu_emu_moe.cc).
#ifndef FSDP_TESTS_MOE_REF_H
#define FSDP_TESTS_MOE_REF_H

#include <algorithm>
#include <cmath>
#include <vector>

namespace moe_ref {

struct Dims {
    int n, d, F, E, K, norm;
};

struct Routing {
    std::vector<double> probs;               // [n, E]
    std::vector<int> top;                    // [n, K]
    std::vector<double> topw;                // [n, K]
    std::vector<int> offsets, slot_of, pair_of; // [E+1], [nK], [nK]
};

// probs = softmax(logits); top-K descending, equal probabilities: the lower expert first; the stable
// counting sort of the pairs by expert.
inline Routing route(const Dims &m, const std::vector<double> &logits) {
    Routing r;
    const int n = m.n, E = m.E, K = m.K;
    r.probs.assign((size_t)n * E, 0.0);
    r.top.assign((size_t)n * K, 0);
    r.topw.assign((size_t)n * K, 0.0);
    for (int t = 0; t < n; t++) {
        const double *l = &logits[(size_t)t * E];
        double mx = *std::max_element(l, l + E), s = 0.0;
        double *p = &r.probs[(size_t)t * E];
        for (int e = 0; e < E; e++) s += p[e] = std::exp(l[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= s;
        std::vector<int> idx(E);
        for (int e = 0; e < E; e++) idx[e] = e;
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
        double ws = 0.0;
        for (int k = 0; k < K; k++) ws += p[idx[k]];
        for (int k = 0; k < K; k++) {
            r.top[(size_t)t * K + k] = idx[k];
            r.topw[(size_t)t * K + k] = m.norm ? p[idx[k]] / ws : p[idx[k]];
        }
    }
    r.offsets.assign(E + 1, 0);
    r.slot_of.assign((size_t)n * K, -1);
    r.pair_of.assign((size_t)n * K, -1);
    int s = 0;
    for (int e = 0; e < E; e++) {
        r.offsets[e] = s;
        for (int p = 0; p < n * K; p++)
            if (r.top[p] == e) {
                r.slot_of[p] = s;
                r.pair_of[s++] = p;
            }
    }
    r.offsets[E] = s;
    return r;
}

struct Result {
    Routing r;
    std::vector<double> out;                        // [n, d]
    std::vector<double> dx, drouter, dw1, dw2, dw3; // gradients (weights: this call's contribution)
    std::vector<double> counts, psum;               // kc_moe_stats of this layer
};

inline double sig(double a) { return 1.0 / (1.0 + std::exp(-a)); }

// The whole layer: x [n,d], router [E,d], w1/w3 [E,F,d], w2 [E,d,F], dout [n,d], dp_aux [E] (empty: none).
inline Result run(const Dims &m, const std::vector<double> &x, const std::vector<double> &router,
                  const std::vector<double> &w1, const std::vector<double> &w2, const std::vector<double> &w3,
                  const std::vector<double> &dout, const std::vector<double> &dp_aux) {
    const int n = m.n, d = m.d, F = m.F, E = m.E, K = m.K;
    std::vector<double> logits((size_t)n * E, 0.0);
    for (int t = 0; t < n; t++)
        for (int e = 0; e < E; e++) {
            double s = 0.0;
            for (int j = 0; j < d; j++) s += x[(size_t)t * d + j] * router[(size_t)e * d + j];
            logits[(size_t)t * E + e] = s;
        }
    Result res;
    res.r = route(m, logits);
    const Routing &r = res.r;
    res.out.assign((size_t)n * d, 0.0);
    res.dx.assign((size_t)n * d, 0.0);
    res.drouter.assign((size_t)E * d, 0.0);
    res.dw1.assign((size_t)E * F * d, 0.0);
    res.dw3.assign((size_t)E * F * d, 0.0);
    res.dw2.assign((size_t)E * d * F, 0.0);
    std::vector<double> dtopw((size_t)n * K, 0.0);
    std::vector<double> a(F), b(F), g(F), y(d), dy(d), dg(F), da(F), db(F);
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) {
            const int e = r.top[(size_t)t * K + k];
            const double w = r.topw[(size_t)t * K + k];
            const double *h = &x[(size_t)t * d];
            const double *W1 = &w1[(size_t)e * F * d], *W3 = &w3[(size_t)e * F * d], *W2 = &w2[(size_t)e * d * F];
            for (int f = 0; f < F; f++) {
                double sa = 0.0, sb = 0.0;
                for (int j = 0; j < d; j++) {
                    sa += W1[(size_t)f * d + j] * h[j];
                    sb += W3[(size_t)f * d + j] * h[j];
                }
                a[f] = sa;
                b[f] = sb;
                g[f] = sa * sig(sa) * sb;
            }
            double dw = 0.0;
            for (int j = 0; j < d; j++) {
                double s = 0.0;
                for (int f = 0; f < F; f++) s += W2[(size_t)j * F + f] * g[f];
                y[j] = s;
                res.out[(size_t)t * d + j] += w * s;
                dw += dout[(size_t)t * d + j] * s;
                dy[j] = w * dout[(size_t)t * d + j];
            }
            dtopw[(size_t)t * K + k] = dw;
            for (int f = 0; f < F; f++) {
                double s = 0.0;
                for (int j = 0; j < d; j++) s += W2[(size_t)j * F + f] * dy[j];
                dg[f] = s;
                const double sg = sig(a[f]);
                da[f] = s * b[f] * sg * (1.0 + a[f] * (1.0 - sg));
                db[f] = s * a[f] * sg;
            }
            double *DW1 = &res.dw1[(size_t)e * F * d], *DW3 = &res.dw3[(size_t)e * F * d],
                   *DW2 = &res.dw2[(size_t)e * d * F];
            for (int j = 0; j < d; j++)
                for (int f = 0; f < F; f++) DW2[(size_t)j * F + f] += dy[j] * g[f];
            for (int f = 0; f < F; f++)
                for (int j = 0; j < d; j++) {
                    DW1[(size_t)f * d + j] += da[f] * h[j];
                    DW3[(size_t)f * d + j] += db[f] * h[j];
                    res.dx[(size_t)t * d + j] += W1[(size_t)f * d + j] * da[f] + W3[(size_t)f * d + j] * db[f];
                }
        }
    // router: dL/dp, then the softmax backward, then the router GEMM's gradients
    for (int t = 0; t < n; t++) {
        const double *p = &r.probs[(size_t)t * E];
        std::vector<double> dp(E, 0.0);
        for (int e = 0; e < E; e++) dp[e] = dp_aux.empty() ? 0.0 : dp_aux[e];
        double S = 0.0, c = 0.0;
        for (int k = 0; k < K; k++) {
            S += p[r.top[(size_t)t * K + k]];
            c += dtopw[(size_t)t * K + k] * p[r.top[(size_t)t * K + k]];
        }
        for (int k = 0; k < K; k++) {
            const int e = r.top[(size_t)t * K + k];
            const double g1 = dtopw[(size_t)t * K + k];
            dp[e] += m.norm ? g1 / S - c / (S * S) : g1;
        }
        double dot = 0.0;
        for (int e = 0; e < E; e++) dot += p[e] * dp[e];
        for (int e = 0; e < E; e++) {
            const double dl = p[e] * (dp[e] - dot);
            for (int j = 0; j < d; j++) {
                res.drouter[(size_t)e * d + j] += dl * x[(size_t)t * d + j];
                res.dx[(size_t)t * d + j] += dl * router[(size_t)e * d + j];
            }
        }
    }
    res.counts.assign(E, 0.0);
    res.psum.assign(E, 0.0);
    for (int e = 0; e < E; e++) {
        res.counts[e] = r.offsets[e + 1] - r.offsets[e];
        for (int t = 0; t < n; t++) res.psum[e] += r.probs[(size_t)t * E + e];
    }
    return res;
}

// max |a - b| / max |b|
inline double rel_err(const std::vector<float> &a, const std::vector<double> &b) {
    double mx = 0.0, diff = a.size() == b.size() ? 0.0 : INFINITY;
    for (size_t i = 0; i < b.size() && i < a.size(); i++) {
        mx = std::max(mx, std::fabs(b[i]));
        diff = std::max(diff, std::fabs((double)a[i] - b[i]));
    }
    return mx > 0 ? diff / mx : diff;
}

inline std::vector<double> to_double(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

} // namespace moe_ref

#endif
