// Helpers of the tests/test_kcu_emu_*.cc tests: random inputs, storage in f32 or bf16 with NaN
// poison and guard words, and the comparison the GPU tests (tests/test_cuda_kernels.cc) use.
#ifndef FSDP_TESTS_KCU_EMU_TEST_H
#define FSDP_TESTS_KCU_EMU_TEST_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/kcu_emu_api.h"

namespace kcu_emu_test {

inline std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = d(g);
    return v;
}

inline std::vector<float> round_to(std::vector<float> v, fsdp_dtype dt) {
    if (dt == FSDP_DT_BF16)
        for (auto &x : v) x = fsdp_bf16_to_f32(fsdp_f32_to_bf16(x));
    return v;
}

// max |a - b| / max |b|, as test_cuda_kernels.cc
inline double rel_err(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    double mx = 0.0, diff = 0.0;
    for (size_t i = 0; i < b.size() && i < a.size(); i++) {
        mx = std::max(mx, std::fabs((double)b[i]));
        diff = std::max(diff, std::fabs((double)a[i] - (double)b[i]));
    }
    return mx > 0 ? diff / mx : diff;
}

inline size_t nonfinite(const std::vector<float> &v) {
    size_t c = 0;
    for (float x : v) c += !std::isfinite(x);
    return c;
}

// "Device" memory: n elements of dtype dt (4 or 2 bytes each) followed by guard bytes that a kernel
// writing past the end would change; filled with NaN unless given values.
class Buf {
public:
    Buf(size_t n, fsdp_dtype dt) : n_(n), dt_(dt), bytes_(n * fsdp_dtype_size(dt)), mem_(bytes_ + kGuard + 16) {
        std::memset(mem_.data(), 0xff, bytes_);
        std::memset(mem_.data() + off() + bytes_, 0xa5, kGuard);
    }
    Buf(const std::vector<float> &v, fsdp_dtype dt) : Buf(v.size(), dt) { set(v); }
    void set(const std::vector<float> &v) {
        fsdp_err err;
        ASSERT_EQ(v.size(), n_);
        ASSERT_EQ(fsdp_convert(ptr(), dt_, v.data(), FSDP_DT_F32, n_, &err), 0);
    }
    std::vector<float> get() const {
        std::vector<float> out(n_);
        fsdp_err err;
        EXPECT_EQ(fsdp_convert(out.data(), FSDP_DT_F32, ptr(), dt_, n_, &err), 0);
        return out;
    }
    bool guard_ok() const {
        for (size_t i = 0; i < kGuard; i++)
            if (mem_[off() + bytes_ + i] != 0xa5) return false;
        return true;
    }
    void *ptr() { return mem_.data() + off(); }
    const void *ptr() const { return mem_.data() + off(); }
    float *f() { return static_cast<float *>(ptr()); }
    size_t size() const { return n_; }

private:
    static constexpr size_t kGuard = 64;
    size_t off() const { return (16 - ((uintptr_t)mem_.data() & 15)) & 15; } // 16-byte aligned data
    size_t n_;
    fsdp_dtype dt_;
    size_t bytes_;
    std::vector<unsigned char> mem_;
};

// The kernels launched since the last call, as "name gx,gy,gz x bx,by,bz smem" lines.
inline std::vector<kcu_emu::LaunchRecord> launches() { return kcu_emu::take_launches(); }

inline unsigned max_blocks(const std::vector<kcu_emu::LaunchRecord> &ls) {
    unsigned m = 0;
    for (auto &l : ls) m = std::max(m, l.grid.x * l.grid.y * l.grid.z);
    return m;
}

class KcuEmuDt : public ::testing::TestWithParam<fsdp_dtype> {
protected:
    void SetUp() override { kcu_emu::take_launches(); }
    fsdp_dtype dt() const { return GetParam(); }
    double tol() const { return dt() == FSDP_DT_F32 ? 1e-5 : 1e-2; }
    std::vector<float> in(std::vector<float> v) const { return round_to(std::move(v), dt()); }
};

inline std::string dt_name(const ::testing::TestParamInfo<fsdp_dtype> &info) {
    return std::string(fsdp_dtype_name(info.param));
}

} // namespace kcu_emu_test

#endif
