// Host emulation of the CUDA features kernels/cuda/kcu_attention_tc.cu's kernels use, so that the
// kernel code runs (as plain C++) on a machine without a GPU: a block is 128 std::threads, one per
// CUDA thread; __syncthreads and __syncwarp are real barriers; __shfl_xor_sync goes through a
// per-warp exchange array; WMMA fragments hold the whole 16x16 tile and are loaded, multiplied and
// stored by lane 0 only (bf16 operands exact in float, float accumulation), so a missing __syncwarp
// between a store_matrix_sync and other lanes' reads yields stale data (and a ThreadSanitizer race).
// Every fragment pointer is checked for 32-byte alignment, the leading dimension for WMMA's multiple
// and the tile for lying inside the dynamic shared memory (allocated at its exact size, filled with
// NaN bytes, so ASan catches overruns and unwritten reads show up as NaN).
#ifndef FSDP_TESTS_KCU_TC_EMU_H
#define FSDP_TESTS_KCU_TC_EMU_H

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/kcu.h"

namespace kcu_tc_emu {

class Barrier {
public:
    explicit Barrier(int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> l(m_);
        const unsigned g = gen_;
        if (++count_ == n_) {
            count_ = 0;
            gen_++;
            cv_.notify_all();
        } else {
            cv_.wait(l, [&] { return gen_ != g; });
        }
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int n_, count_ = 0;
    unsigned gen_ = 0;
};

struct Idx {
    unsigned x, y, z;
};

struct Block {
    Barrier block{128};
    Barrier warp[4] = {Barrier(32), Barrier(32), Barrier(32), Barrier(32)};
    float shfl[4][32];
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    std::mutex err_m;
    std::string err; // first emulation check that failed (the lane then stops doing work)
};

struct Thread {
    Idx tid, bid;
    Block *block;
};

inline thread_local Thread *cur = nullptr;

inline void fail(const std::string &what) {
    std::lock_guard<std::mutex> l(cur->block->err_m);
    if (cur->block->err.empty()) cur->block->err = what;
}

// Runs f() as every thread of every block of the grid, one block at a time, with `smem` bytes of
// dynamic shared memory. Returns "" or the first failed check.
inline std::string launch(unsigned gx, unsigned gy, unsigned gz, size_t smem, const std::function<void()> &f) {
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                Block blk;
                blk.smem_bytes = smem;
                blk.smem = static_cast<unsigned char *>(std::aligned_alloc(128, (smem + 127) / 128 * 128));
                if (!blk.smem) return "cannot allocate emulated shared memory";
                std::memset(blk.smem, 0xff, smem);
                std::vector<std::thread> th;
                for (unsigned t = 0; t < 128; t++)
                    th.emplace_back([&, t, x, y, z] {
                        Thread me{{t, 0, 0}, {x, y, z}, &blk};
                        cur = &me;
                        f();
                        cur = nullptr;
                    });
                for (auto &t : th) t.join();
                std::free(blk.smem);
                if (!blk.err.empty()) return blk.err;
            }
    return "";
}

inline float bf2f(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f2bf(float f) { // as kcu_f2bf (kernels/cuda/kcu_common.cuh)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

} // namespace kcu_tc_emu

// ---- the CUDA surface ----------------------------------------------------------------------------------

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define KCU_FULL_MASK 0xffffffffu
#define threadIdx (kcu_tc_emu::cur->tid)
#define blockIdx (kcu_tc_emu::cur->bid)
#define TC_SMEM_DECL unsigned char *tc_smem = kcu_tc_emu::cur->block->smem

struct uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline uint4 __ldg(const uint4 *p) { return *p; }
inline void __syncthreads() { kcu_tc_emu::cur->block->block.wait(); }
inline void __syncwarp() { kcu_tc_emu::cur->block->warp[kcu_tc_emu::cur->tid.x >> 5].wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
    kcu_tc_emu::cur->block->shfl[w][l] = v;
    __syncwarp();
    const float r = kcu_tc_emu::cur->block->shfl[w][l ^ (unsigned)o];
    __syncwarp();
    return r;
}
inline float kcu_bf2f(uint16_t h) { return kcu_tc_emu::bf2f(h); }
inline uint16_t kcu_f2bf(float f) { return kcu_tc_emu::f2bf(f); }

struct __nv_bfloat16 {
    uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{kcu_tc_emu::f2bf(f)}; }

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 fragments only");
    float x[256];
};

// A 16-row tile at p with leading dimension ldm (elements of esz bytes) must be 32-byte aligned,
// ldm a multiple of `mult`, and lie inside the block's shared memory.
inline bool tile_ok(const void *p, unsigned ldm, size_t esz, unsigned mult) {
    const unsigned char *c = static_cast<const unsigned char *>(p), *lo = kcu_tc_emu::cur->block->smem;
    if (((uintptr_t)p & 31u) != 0) {
        kcu_tc_emu::fail("fragment pointer not 32-byte aligned");
        return false;
    }
    if (ldm % mult != 0) {
        kcu_tc_emu::fail("leading dimension " + std::to_string(ldm) + " not a multiple of " + std::to_string(mult));
        return false;
    }
    if (c < lo || c + (15 * (size_t)ldm + 16) * esz > lo + kcu_tc_emu::cur->block->smem_bytes) {
        kcu_tc_emu::fail("fragment outside the dynamic shared memory");
        return false;
    }
    return true;
}

inline bool lane0() { return (threadIdx.x & 31) == 0; }

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v) {
    for (float &e : f.x) e = v;
}
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    if (!lane0() || !tile_ok(p, ldm, 2, 8)) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = kcu_tc_emu::bf2f(p[(size_t)r * ldm + c].bits);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    if (!lane0() || !tile_ok(p, ldm, 2, 8)) return;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.x[k * 16 + n] = kcu_tc_emu::bf2f(p[(size_t)k * ldm + n].bits);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    if (!lane0() || !tile_ok(p, ldm, 2, 8)) return;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.x[k * 16 + n] = kcu_tc_emu::bf2f(p[(size_t)n * ldm + k].bits);
}
template <class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    if (!lane0()) return;
    float t[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + n];
            t[r * 16 + n] = s;
        }
    std::memcpy(d.x, t, sizeof t);
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t lay) {
    if (!lane0() || !tile_ok(p, ldm, 4, 4)) return;
    if (lay != mem_row_major) {
        kcu_tc_emu::fail("only mem_row_major stores are emulated");
        return;
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) p[(size_t)r * ldm + c] = f.x[r * 16 + c];
}
} // namespace wmma
} // namespace nvcuda

#endif
