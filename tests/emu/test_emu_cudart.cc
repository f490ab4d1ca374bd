// The fake CUDA runtime's semantics (tests/emu/emu_cudart.cc), in the emulated-device build only:
// streams are deferred, so missing synchronisation and missing cross-stream waits show up as wrong
// data; bad frees and copies of untracked memory are errors; kernels and GEMMs run on their stream.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

extern "C" {
#include "kernels/cuda/kcu.h"
#include "runtime/device.h"
#include "runtime/device_gemm.h"
}

namespace {

struct Bufs {
    float *d = nullptr, *h = nullptr;
    cudaStream_t a = nullptr, b = nullptr;
    cudaEvent_t e = nullptr;
    size_t n = 64;
    Bufs() {
        EXPECT_EQ(cudaMalloc((void **)&d, n * sizeof(float)), cudaSuccess);
        EXPECT_EQ(cudaHostAlloc((void **)&h, n * sizeof(float), cudaHostAllocPortable), cudaSuccess);
        EXPECT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
        EXPECT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
        EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
        for (size_t i = 0; i < n; i++) h[i] = -1.0f;
    }
    ~Bufs() {
        cudaEventDestroy(e);
        cudaStreamDestroy(a);
        cudaStreamDestroy(b);
        cudaFreeHost(h);
        cudaFree(d);
    }
};

TEST(EmuCudart, DeviceToPinnedCopyIsStaleUntilTheStreamIsSynchronised) {
    Bufs x;
    std::vector<float> ones(x.n, 1.0f);
    ASSERT_EQ(cudaMemcpy(x.d, ones.data(), x.n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(x.h, x.d, x.n * sizeof(float), cudaMemcpyDeviceToHost, x.a), cudaSuccess);
    EXPECT_EQ(x.h[0], -1.0f); // not run yet
    ASSERT_EQ(cudaStreamSynchronize(x.a), cudaSuccess);
    EXPECT_EQ(x.h[0], 1.0f);
    EXPECT_EQ(x.h[x.n - 1], 1.0f);
}

TEST(EmuCudart, MissingCrossStreamWaitReadsTheOldData) {
    Bufs x;
    std::vector<float> ones(x.n, 1.0f);
    ASSERT_EQ(cudaMemcpy(x.d, ones.data(), x.n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    // stream a overwrites d with zeros; stream b copies d out without waiting for a
    ASSERT_EQ(cudaMemsetAsync(x.d, 0, x.n * sizeof(float), x.a), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(x.h, x.d, x.n * sizeof(float), cudaMemcpyDeviceToHost, x.b), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(x.b), cudaSuccess);
    EXPECT_EQ(x.h[0], 1.0f); // b ran before a: the race a GPU may also lose
    ASSERT_EQ(cudaStreamSynchronize(x.a), cudaSuccess);

    // the same with the wait: b sees a's zeros
    ASSERT_EQ(cudaMemcpy(x.d, ones.data(), x.n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(x.d, 0, x.n * sizeof(float), x.a), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(x.e, x.a), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(x.b, x.e, 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(x.h, x.d, x.n * sizeof(float), cudaMemcpyDeviceToHost, x.b), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(x.b), cudaSuccess);
    EXPECT_EQ(x.h[0], 0.0f);
}

TEST(EmuCudart, EventSynchronizeRunsUpToTheRecordOnly) {
    Bufs x;
    std::vector<float> ones(x.n, 1.0f);
    ASSERT_EQ(cudaMemcpy(x.d, ones.data(), x.n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(x.h, x.d, sizeof(float), cudaMemcpyDeviceToHost, x.a), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(x.e, x.a), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(x.h + 1, x.d, sizeof(float), cudaMemcpyDeviceToHost, x.a), cudaSuccess);
    ASSERT_EQ(cudaEventSynchronize(x.e), cudaSuccess);
    EXPECT_EQ(x.h[0], 1.0f);
    EXPECT_EQ(x.h[1], -1.0f); // queued after the record
    ASSERT_EQ(cudaStreamSynchronize(x.a), cudaSuccess);
    EXPECT_EQ(x.h[1], 1.0f);
}

TEST(EmuCudart, PageableSourceIsReadAtTheCall) {
    Bufs x;
    std::vector<float> src(x.n, 2.0f);
    ASSERT_EQ(cudaMemcpyAsync(x.d, src.data(), x.n * sizeof(float), cudaMemcpyHostToDevice, x.a), cudaSuccess);
    src.assign(x.n, 3.0f); // staged: the copy keeps the 2s
    ASSERT_EQ(cudaMemcpyAsync(x.h, x.d, x.n * sizeof(float), cudaMemcpyDeviceToHost, x.a), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(x.a), cudaSuccess);
    EXPECT_EQ(x.h[5], 2.0f);
}

TEST(EmuCudart, BadPointersAreErrors) {
    Bufs x;
    float host[4];
    EXPECT_EQ(cudaFree(host), cudaErrorInvalidValue);
    EXPECT_EQ(cudaFree(x.d + 1), cudaErrorInvalidValue);
    EXPECT_EQ(cudaFreeHost(x.d), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemsetAsync(host, 0, sizeof host, x.a), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemcpyAsync(x.d, host, (x.n + 1) * sizeof(float), cudaMemcpyHostToDevice, x.a),
              cudaErrorInvalidValue); // runs past the allocation
    EXPECT_EQ(cudaMemcpyAsync(host, x.d, sizeof host, cudaMemcpyHostToDevice, x.a), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    EXPECT_EQ(cudaStreamSynchronize(x.a), cudaSuccess);
}

TEST(EmuCudart, KernelsRunWhenTheirStreamIsForced) {
    Bufs x;
    std::vector<float> ones(x.n, 1.0f);
    ASSERT_EQ(cudaMemcpy(x.d, ones.data(), x.n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    fsdp_err err;
    fsdp_err_clear(&err);
    ASSERT_EQ(kcu_scale(x.d, (int64_t)x.n, 3.0f, x.a, &err), FSDP_OK) << err.msg;
    // a legacy-stream copy does not wait for the non-blocking stream a: the kernel has not run
    std::vector<float> out(x.n, 0.0f);
    ASSERT_EQ(cudaMemcpy(out.data(), x.d, x.n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(out[0], 1.0f);
    ASSERT_EQ(cudaStreamSynchronize(x.a), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.data(), x.d, x.n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(out[0], 3.0f);
    EXPECT_EQ(out[x.n - 1], 3.0f);
}

TEST(EmuCudart, GemmRunsOnTheComputeStream) {
    fsdp_err err;
    fsdp_err_clear(&err);
    dev_ctx *d = dev_ctx_create(nullptr, &err);
    ASSERT_NE(d, nullptr) << err.msg;
    // row-major C(2x3) = A(2x4) B(4x3)
    const float A[8] = {1, 2, 3, 4, 5, 6, 7, 8}, B[12] = {1, 0, 2, 0, 1, 0, 3, 0, 1, 1, 1, 1};
    float want[6];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            float s = 0;
            for (int k = 0; k < 4; k++) s += A[i * 4 + k] * B[k * 3 + j];
            want[i * 3 + j] = s;
        }
    void *dA, *dB, *dC;
    ASSERT_EQ(dev_alloc(d, sizeof A, &dA, &err), FSDP_OK);
    ASSERT_EQ(dev_alloc(d, sizeof B, &dB, &err), FSDP_OK);
    ASSERT_EQ(dev_alloc(d, sizeof want, &dC, &err), FSDP_OK);
    ASSERT_EQ(dev_upload(d, dA, A, sizeof A, &err), FSDP_OK);
    ASSERT_EQ(dev_upload(d, dB, B, sizeof B, &err), FSDP_OK);
    ASSERT_EQ(dev_gemm(d, 0, 0, 2, 3, 4, 1.0f, FSDP_DT_F32, dA, 4, dB, 3, 0.0f, FSDP_DT_F32, dC, 3, &err), FSDP_OK)
        << err.msg;
    float *pin;
    ASSERT_EQ(dev_host_alloc(d, sizeof want, (void **)&pin, &err), FSDP_OK);
    std::memset(pin, 0, sizeof want);
    // copied on the COPY stream without waiting for COMPUTE: the GEMM has not run, C is still unwritten
    ASSERT_EQ(dev_copy_d2h(d, pin, dC, sizeof want, DEV_STREAM_COPY, &err), FSDP_OK);
    ASSERT_EQ(dev_stream_sync(d, DEV_STREAM_COPY, &err), FSDP_OK);
    EXPECT_NE(pin[0], want[0]);
    ASSERT_EQ(dev_stream_wait(d, DEV_STREAM_COPY, DEV_STREAM_COMPUTE, &err), FSDP_OK);
    ASSERT_EQ(dev_copy_d2h(d, pin, dC, sizeof want, DEV_STREAM_COPY, &err), FSDP_OK);
    ASSERT_EQ(dev_stream_sync(d, DEV_STREAM_COPY, &err), FSDP_OK);
    for (int i = 0; i < 6; i++) EXPECT_EQ(pin[i], want[i]) << i;
    ASSERT_EQ(dev_host_free(d, pin, &err), FSDP_OK);
    ASSERT_EQ(dev_free(d, dA, &err), FSDP_OK);
    ASSERT_EQ(dev_free(d, dB, &err), FSDP_OK);
    ASSERT_EQ(dev_free(d, dC, &err), FSDP_OK);
    dev_ctx_free(d);
}

} // namespace
