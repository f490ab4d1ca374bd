// Helpers to compare checkpoints through ckpt_reader in tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/reader.h"
}

namespace fsdp_test {

// All bytes of a tensor (as stored dtype, or converted).
inline std::vector<unsigned char> tensor_bytes(ckpt_reader *r, const std::string &name, fsdp_dtype dt = FSDP_DT_INVALID) {
    long i = ckpt_find(r, name.c_str());
    EXPECT_GE(i, 0) << name;
    if (i < 0) return {};
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    fsdp_dtype out = dt == FSDP_DT_INVALID ? e->dtype : dt;
    int64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) numel *= e->shape[d];
    std::vector<unsigned char> b((size_t)numel * fsdp_dtype_size(out));
    fsdp_err err;
    int64_t rows = e->ndim ? e->shape[0] : 1;
    EXPECT_EQ(ckpt_read_rows(r, (size_t)i, 0, rows, b.data(), out, &err), 0) << err.msg;
    return b;
}

// Every tensor of `want` (optionally with a name prefix/suffix mapping) equals `got`'s bit for bit.
inline void expect_same_tensors(ckpt_reader *got, ckpt_reader *want, const std::string &got_prefix = "",
                                const std::string &want_suffix_strip = "", const std::string &got_suffix = "") {
    size_t n = ckpt_count(want), checked = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_entry *w = ckpt_entry_at(want, i);
        if (!w->is_tensor) continue;
        std::string name = w->name;
        if (!want_suffix_strip.empty()) {
            if (name.size() < want_suffix_strip.size() ||
                name.compare(name.size() - want_suffix_strip.size(), want_suffix_strip.size(), want_suffix_strip))
                continue;
            name = name.substr(0, name.size() - want_suffix_strip.size());
        }
        std::string gname = got_prefix + name + got_suffix;
        long gi = ckpt_find(got, gname.c_str());
        ASSERT_GE(gi, 0) << "missing " << gname;
        const ckpt_entry *g = ckpt_entry_at(got, (size_t)gi);
        ASSERT_EQ(g->ndim, w->ndim) << gname;
        for (int d = 0; d < w->ndim; d++) ASSERT_EQ(g->shape[d], w->shape[d]) << gname;
        EXPECT_TRUE(tensor_bytes(got, gname, w->dtype) == tensor_bytes(want, w->name)) << "values differ: " << gname;
        checked++;
    }
    EXPECT_GT(checked, 0u);
}

// Every tensor of `want` is in `got` with its shape, and within tol(name, max|want|) of it element by
// element (both read as float32): for two runs whose float32 sums are ordered differently (the CPU's and
// the GPU's). Returns the largest difference relative to max|want| seen.
inline double expect_close_tensors(ckpt_reader *got, ckpt_reader *want,
                                   const std::function<double(const std::string &, double)> &tol) {
    size_t n = ckpt_count(want), checked = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_entry *w = ckpt_entry_at(want, i);
        if (!w->is_tensor) continue;
        long gi = ckpt_find(got, w->name);
        EXPECT_GE(gi, 0) << "missing " << w->name;
        if (gi < 0) continue;
        const ckpt_entry *g = ckpt_entry_at(got, (size_t)gi);
        EXPECT_EQ(g->ndim, w->ndim) << w->name;
        if (g->ndim != w->ndim) continue;
        bool same_shape = true;
        for (int d = 0; d < w->ndim; d++) same_shape = same_shape && g->shape[d] == w->shape[d];
        EXPECT_TRUE(same_shape) << w->name;
        if (!same_shape) continue;
        std::vector<unsigned char> a = tensor_bytes(got, w->name, FSDP_DT_F32), b = tensor_bytes(want, w->name, FSDP_DT_F32);
        size_t k = b.size() / sizeof(float);
        if (a.size() != b.size()) continue;
        std::vector<float> x(k), y(k);
        if (k) memcpy(x.data(), a.data(), b.size()), memcpy(y.data(), b.data(), b.size());
        double m = 0, d = 0;
        for (size_t j = 0; j < k; j++) m = std::max(m, (double)std::fabs(y[j]));
        for (size_t j = 0; j < k; j++) d = std::max(d, (double)std::fabs(x[j] - y[j]));
        EXPECT_LE(d, tol(w->name, m)) << w->name << ": max |got - want| " << d << ", max |want| " << m;
        if (m > 0) worst = std::max(worst, d / m);
        checked++;
    }
    EXPECT_GT(checked, 0u);
    return worst;
}

struct Ckpt {
    ckpt_reader *r = nullptr;
    explicit Ckpt(const std::string &p, ckpt_format f = CKPT_AUTO) {
        fsdp_err err;
        EXPECT_EQ(ckpt_open(p.c_str(), f, &r, &err), 0) << err.msg;
    }
    ~Ckpt() { ckpt_close(r); }
};

}  // namespace fsdp_test
