// Device collectives (NCCL): errors without a GPU here, and on a machine with GPUs every
// collective with uneven torch.chunk blocks (tests/mpi/nccl_check.c) on 1 rank and, with two or
// more GPUs, on one rank per GPU under mpirun.
#include <gtest/gtest.h>

extern "C" {
#include "runtime/comm.h"
#include "runtime/device.h"
}
#include "runtime/nccl_api.h"  // C++-safe itself (it includes the CUDA headers)
#include "gpu_util.h"
#include "test_util.h"

using namespace fsdp_test;

TEST(CommNccl, CollectiveBeforeInitIsAnError) {
    fsdp_err err;
    comm *c = nullptr;
    ASSERT_EQ(comm_create_single(&c, &err), FSDP_OK);
    EXPECT_FALSE(comm_dev_ready(c));
    EXPECT_EQ(comm_dev_backend(c), nullptr);
    size_t bytes[1] = {4};
    int x = 0;
    int rc = comm_dev_allgatherv(c, &x, &x, bytes, nullptr, &err);
    EXPECT_NE(rc, FSDP_OK);
    if (dev_built_with_cuda())
        EXPECT_NE(std::string(err.msg).find("before comm_dev_init"), std::string::npos) << err.msg;
    else
        EXPECT_NE(std::string(err.msg).find("built without CUDA"), std::string::npos) << err.msg;
    comm_destroy(c);
}

TEST(CommNccl, InitWorksWithAGpuAndIsAClearErrorWithout) {
    fsdp_err err;
    comm *c = nullptr;
    ASSERT_EQ(comm_create_single(&c, &err), FSDP_OK);
    if (gpu_present()) {
        // a world of 1 uses NCCL too: the same code at every size
        dev_options opt = {0, 0};
        dev_ctx *d = dev_ctx_create(&opt, &err);
        ASSERT_NE(d, nullptr) << err.msg;
        ASSERT_EQ(comm_dev_init(c, &err), FSDP_OK) << err.msg;
        EXPECT_TRUE(comm_dev_ready(c));
        EXPECT_STREQ(comm_dev_backend(c), "nccl");
        EXPECT_EQ(comm_dev_init(c, &err), FSDP_OK) << "a second init is a no-op";
        comm_destroy(c);  // the NCCL communicator before its device
        dev_ctx_free(d);
        return;
    }
    EXPECT_EQ(comm_dev_init(c, &err), FSDP_E_DEVICE);
    std::string m = err.msg;
    EXPECT_TRUE(m.find("no usable GPU") != std::string::npos || m.find("ncclGetUniqueId") != std::string::npos ||
                m.find("built without CUDA") != std::string::npos)
        << m;
    EXPECT_FALSE(comm_dev_ready(c));
    comm_destroy(c);
}

// NCCL is loaded when a device communicator is made, not linked: fsdp-run starts without mapping it
// (every CPU run, --version, validate), and the loader finds the library and its functions (no GPU needed).
// Which CUDA libraries (runtime, driver, NCCL, cuBLAS) the loader maps while CMD runs; "" when none.
static std::string cuda_libs_mapped(const std::string &cmd) {
    std::string out;
    EXPECT_EQ(run_cmd("LD_DEBUG=files " + cmd + " 2>&1", &out), 0) << out;
    EXPECT_NE(out.find("file=libgomp"), std::string::npos) << out;  // the trace did list the libraries
    std::string found;
    for (const char *lib : {"file=libcudart", "file=libcuda.", "file=libnccl", "file=libcublas"}) {
        size_t at = out.find(lib);
        if (at != std::string::npos) found += out.substr(at, out.find('\n', at) - at) + "\n";
    }
    return found;
}

// NCCL, cuBLAS, the CUDA runtime and the driver are loaded only when a GPU is used: `--version`,
// `validate` and a whole CPU run map none of them (the runtime is linked statically, the others are
// dlopened), and the executable does not name libcudart as a library it needs. A build without CUDA
// maps none of them either.
TEST(CommNccl, LoadedOnFirstUseNotLinked) {
    const std::string bin = fsdp_run_bin();
    EXPECT_EQ(cuda_libs_mapped(bin + " --version"), "");
    EXPECT_EQ(cuda_libs_mapped(bin + " validate recipes/quickstart.yaml"), "");
    std::string tmp = make_tmpdir("fsdp-nocuda");
    ASSERT_FALSE(tmp.empty());
    // the quickstart, shortened: init, save, 3 steps, save, load, 2 more steps, save
    const std::string d = tmp + "/q";
    EXPECT_EQ(cuda_libs_mapped(bin + " recipes/quickstart.yaml --set vars.dir=" + d +
                               " --set stages.train.with.steps=3 --set stages.train.with.warmup_steps=1"
                               " --set stages.continue.with.steps=5 --set stages.continue.with.warmup_steps=1"
                               " --set stages.save.with.path=" + d + "/step-3 --set stages.resume.with.path=" + d +
                               "/step-3"),
              "");
    rm_rf(tmp);
    std::string dyn;
    ASSERT_EQ(run_cmd("readelf -d '" + bin + "'", &dyn), 0) << dyn;
    EXPECT_EQ(dyn.find("libcudart"), std::string::npos) << dyn;
    EXPECT_EQ(dyn.find("libnccl"), std::string::npos) << dyn;
#if FSDP_HAVE_CUDA && !FSDP_NCCL_LINKED
    nccl_api api;
    fsdp_err err;
    ASSERT_EQ(nccl_api_load(&api, &err), FSDP_OK) << err.msg;
    ASSERT_NE(api.GetErrorString, nullptr);
    EXPECT_NE(api.GetErrorString(ncclSuccess), nullptr);
    EXPECT_NE(api.Broadcast, nullptr);
#endif
}

TEST(CommNccl, CollectivesOnOneGpu) {
    if (!gpu_present()) GTEST_SKIP() << "no GPU";
    std::string bin = std::string(FSDP_BUILD_DIR) + "/tests/mpi/nccl_check";
    std::string out;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + bin, &out), 0) << out;  // world of 1, no launcher
    EXPECT_NE(out.find("nccl_check ok (world 1)"), std::string::npos) << out;
}

// NCCL needs one GPU per rank: uneven blocks across ranks need two or more GPUs.
TEST(CommNccl, CollectivesOneRankPerGpu) {
    int n = gpu_count();
    if (n < 2) GTEST_SKIP() << n << " GPU(s): one rank per GPU needs at least 2";
    std::string bin = std::string(FSDP_BUILD_DIR) + "/tests/mpi/nccl_check";
    std::string out;
    int np = n < 4 ? n : 4;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + mpirun_prefix(np) + " " + bin, &out), 0) << out;
    EXPECT_NE(out.find("nccl_check ok (world " + std::to_string(np) + ")"), std::string::npos) << out;
}
