// cuBLAS / cuBLASLt are loaded with dlopen by the device context (runtime/device_blas.h), not
// linked: a CPU run does not pay for mapping libcublasLt (~210 MB of resident memory per process).
#include <gtest/gtest.h>

extern "C" {
#include "runtime/device.h"
}
#if FSDP_HAVE_CUDA
#include "runtime/device_blas.h"
#endif
#include "test_util.h"

TEST(CudaBlas, NotLinkedIntoTheBinary) {
    std::string out;
    ASSERT_EQ(fsdp_test::run_cmd("ldd '" + fsdp_test::fsdp_run_bin() + "'", &out), 0) << out;
    EXPECT_EQ(out.find("libcublas"), std::string::npos) << out;
}

#if FSDP_HAVE_CUDA
TEST(CudaBlas, LoadsEveryEntryPointWithoutAGpu) {
    dev_blas_api api;
    fsdp_err err;
    ASSERT_EQ(dev_blas_load(&api, &err), FSDP_OK) << err.msg;
    EXPECT_NE(api.lib_lt, nullptr);
    EXPECT_NE(api.lib_blas, nullptr);
    void *fns[] = {
#define PTR(f) (void *)api.f,
        DEV_BLAS_FNS(PTR) DEV_BLASLT_FNS(PTR)
#undef PTR
    };
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) EXPECT_NE(fns[i], nullptr) << "entry " << i;
    // a call that needs no device: the status strings
    std::string ok = api.cublasGetStatusString(CUBLAS_STATUS_SUCCESS);
    std::string bad = api.cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_FALSE(ok.empty());
    EXPECT_FALSE(bad.empty());
    EXPECT_NE(ok, bad);
    dev_blas_unload(&api);
    EXPECT_EQ(api.lib_lt, nullptr);
}

TEST(CudaBlas, ACpuRunNeverLoadsIt) {
    // the dynamic loader's trace of a CPU run names no cuBLAS library
    std::string out;
    ASSERT_EQ(fsdp_test::run_cmd("env LD_DEBUG=libs '" + fsdp_test::fsdp_run_bin() + "' validate recipes/quickstart.yaml",
                                 &out),
              0)
        << out.substr(0, 4000);
    EXPECT_NE(out.find("libyaml"), std::string::npos) << "no loader trace: " << out.substr(0, 2000);
    EXPECT_EQ(out.find("libcublas"), std::string::npos) << out.substr(0, 4000);
}
#endif
