// The host emulation of tests/kcu_emu.h itself: warp collectives, barriers, shared memory, atomics
// and launch checks on small kernels, and that misuse (divergent barriers, partial masks, missing
// shared-memory opt-in, bad launch shapes) is reported as a launch error instead of a hang.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/kcu_emu.h"

namespace {

// Per lane of a (32, 2) block: every shuffle mode, width 16, and the votes.
__global__ void shuffles(int *out) {
    const int lane = threadIdx.x, t = threadIdx.y * 32 + lane;
    int *o = out + t * 8;
    o[0] = __shfl_sync(0xffffffffu, lane * 10, 7);
    o[1] = __shfl_up_sync(0xffffffffu, lane, 3);
    o[2] = __shfl_down_sync(0xffffffffu, lane, 5);
    o[3] = __shfl_xor_sync(0xffffffffu, lane, 9);
    o[4] = __shfl_sync(0xffffffffu, lane, 3, 16);
    o[5] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0 || threadIdx.y == 1);
    o[6] = __any_sync(0xffffffffu, lane == 31) + 2 * __all_sync(0xffffffffu, lane < 31);
    o[7] = (int)__shfl_xor_sync(0xffffffffu, (double)lane + 0.5, 1) * 2;
}

TEST(KcuEmuRuntime, WarpShufflesAndVotes) {
    std::vector<int> out(64 * 8, -1);
    KCU_LAUNCH(shuffles, 1, dim3(32, 2), 0, nullptr)(out.data());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
    for (int y = 0; y < 2; y++)
        for (int l = 0; l < 32; l++) {
            const int *o = &out[(y * 32 + l) * 8];
            EXPECT_EQ(o[0], 70);
            EXPECT_EQ(o[1], l >= 3 ? l - 3 : l);
            EXPECT_EQ(o[2], l + 5 < 32 ? l + 5 : l);
            EXPECT_EQ(o[3], l ^ 9);
            EXPECT_EQ(o[4], (l & 16) + 3);
            EXPECT_EQ((unsigned)o[5], y == 1 ? 0xffffffffu : 0x49249249u);
            EXPECT_EQ(o[6], 1);
            EXPECT_EQ(o[7], 2 * (l ^ 1)); // (int)(partner + 0.5) * 2
        }
}

// Block sums through static shared memory over several blocks, accumulated with atomics.
__global__ void block_sums(const float *x, int n, float *sum, int *count) {
    KCU_SHARED(float, part, 64);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (unsigned t = 0; t < blockDim.x; t++) s += part[t];
        atomicAdd(sum, s);
        atomicAdd(count, 1);
    }
}

TEST(KcuEmuRuntime, StaticSharedMemoryAndAtomics) {
    std::vector<float> x(300, 1.5f);
    float sum = 0.0f;
    int count = 0;
    KCU_LAUNCH(block_sums, 5, 64, 0, nullptr)(x.data(), 300, &sum, &count);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
    EXPECT_EQ(sum, 450.0f);
    EXPECT_EQ(count, 5);
}

__global__ void read_unwritten(float *out) {
    KCU_DYN_SHARED(float, sm);
    KCU_SHARED(float, st, 4);
    out[0] = sm[threadIdx.x];
    out[1] = st[threadIdx.x];
}

TEST(KcuEmuRuntime, SharedMemoryStartsPoisoned) {
    float out[2] = {0.0f, 0.0f};
    KCU_LAUNCH(read_unwritten, 1, 1, 16, nullptr)(out);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
}

__global__ void early_exit(int *x) {
    if (threadIdx.x >= 40) return;
    __syncthreads();
    x[threadIdx.x] = 1;
}

__global__ void divergent_warp(int *x) {
    if (threadIdx.x & 1)
        __syncwarp();
    else
        x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void partial_mask(int *x) { x[threadIdx.x] = __shfl_xor_sync(0xffffu, (int)threadIdx.x, 1); }

__global__ void partial_warp(int *x) { x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1); }

TEST(KcuEmuRuntime, MisuseIsALaunchFailureNotAHang) {
    std::vector<int> x(64, 0);
    KCU_LAUNCH(early_exit, 2, 64, 0, nullptr)(x.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_NE(kcu_emu::last_detail.find("__syncthreads"), std::string::npos) << kcu_emu::last_detail;
    KCU_LAUNCH(divergent_warp, 1, 32, 0, nullptr)(x.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_NE(kcu_emu::last_detail.find("diverged"), std::string::npos) << kcu_emu::last_detail;
    KCU_LAUNCH(partial_mask, 1, 32, 0, nullptr)(x.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_NE(kcu_emu::last_detail.find("mask"), std::string::npos) << kcu_emu::last_detail;
    KCU_LAUNCH(partial_warp, 1, 48, 0, nullptr)(x.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_NE(kcu_emu::last_detail.find("warp of 16"), std::string::npos) << kcu_emu::last_detail;
    // the emulator is still usable afterwards
    KCU_LAUNCH(partial_warp, 1, 64, 0, nullptr)(x.data());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(x[6], 7);
}

__global__ void touch_dyn(float *out) {
    KCU_DYN_SHARED(float, sm);
    sm[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = sm[31 - threadIdx.x];
}

TEST(KcuEmuRuntime, LaunchChecks) {
    std::vector<float> out(32, 0.0f);
    KCU_LAUNCH(touch_dyn, 1, 2048, 128, nullptr)(out.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    KCU_LAUNCH(touch_dyn, dim3(1, 70000), 32, 128, nullptr)(out.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    KCU_LAUNCH(touch_dyn, 1, 32, 64 * 1024, nullptr)(out.data()); // above 48 KiB without the opt-in
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT_EQ(out[0], 0.0f);
    ASSERT_EQ(cudaFuncSetAttribute(touch_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024), cudaSuccess);
    KCU_LAUNCH(touch_dyn, 1, 32, 64 * 1024, nullptr)(out.data());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(out[0], 2.0f);
    EXPECT_EQ(cudaFuncSetAttribute(touch_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024),
              cudaErrorInvalidValue);
    cudaGetLastError();
}

} // namespace
