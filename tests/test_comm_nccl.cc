// Device collectives (NCCL): errors without a GPU here, and on a machine with GPUs every
// collective with uneven torch.chunk blocks (tests/mpi/nccl_check.c) on 1 rank and, with two or
// more GPUs, on one rank per GPU under mpirun.
#include <gtest/gtest.h>

extern "C" {
#include "runtime/comm.h"
#include "runtime/device.h"
}
#include "test_util.h"

using namespace fsdp_test;

namespace {

int gpu_count() {
    fsdp_err err;
    int n = 0;
    if (!dev_built_with_cuda() || dev_count(&n, &err) != FSDP_OK) return 0;
    return n;
}

}  // namespace

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

TEST(CommNccl, InitWithoutGpuIsAClearError) {
    if (gpu_count() > 0) GTEST_SKIP() << "a GPU is present (CommNccl.CollectivesOnGpus covers NCCL)";
    fsdp_err err;
    comm *c = nullptr;
    ASSERT_EQ(comm_create_single(&c, &err), FSDP_OK);
    EXPECT_EQ(comm_dev_init(c, &err), FSDP_E_DEVICE);
    std::string m = err.msg;
    EXPECT_TRUE(m.find("no usable GPU") != std::string::npos || m.find("ncclGetUniqueId") != std::string::npos ||
                m.find("built without CUDA") != std::string::npos)
        << m;
    EXPECT_FALSE(comm_dev_ready(c));
    comm_destroy(c);
}

TEST(CommNccl, CollectivesOnGpus) {
    int n = gpu_count();
    if (n == 0) GTEST_SKIP() << "no GPU";
    std::string bin = std::string(FSDP_BUILD_DIR) + "/tests/mpi/nccl_check";
    std::string out;
    ASSERT_EQ(run_cmd("timeout 120 " + bin, &out), 0) << out;  // world of 1, no launcher
    EXPECT_NE(out.find("nccl_check ok (world 1)"), std::string::npos) << out;
    // NCCL needs one GPU per rank: uneven blocks across ranks need two or more GPUs
    if (n < 2) GTEST_SKIP() << "world 1 passed; only one GPU, so the multi-rank NCCL run needs a 2-GPU machine";
    int np = n < 4 ? n : 4;
    ASSERT_EQ(run_cmd("timeout 120 " + mpirun_prefix(np) + " " + bin, &out), 0) << out;
    EXPECT_NE(out.find("nccl_check ok (world " + std::to_string(np) + ")"), std::string::npos) << out;
}
