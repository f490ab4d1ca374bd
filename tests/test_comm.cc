// Communicator and sharded state on 1..4 MPI ranks (tests/mpi/comm_check.c under mpirun),
// and the torch.chunk sharding math.
#include <gtest/gtest.h>

extern "C" {
#include "runtime/shard.h"
}
#include "test_util.h"

using namespace fsdp_test;

TEST(Shard, TorchChunkSemantics) {
    struct C {
        int64_t d0;
        int world, rank;
        int64_t row0, rows;
    } cases[] = {{256, 3, 0, 0, 86}, {256, 3, 1, 86, 86}, {256, 3, 2, 172, 84}, {5, 4, 0, 0, 2},
                 {5, 4, 2, 4, 1},    {5, 4, 3, 5, 0},     {64, 3, 2, 44, 20},  {4, 2, 1, 2, 2},
                 {3, 4, 3, 3, 0},    {7, 1, 0, 0, 7}};
    for (auto &c : cases) {
        int64_t r0, n;
        shard_rows(c.d0, c.world, c.rank, &r0, &n);
        EXPECT_EQ(r0, c.row0) << c.d0 << "/" << c.world << "@" << c.rank;
        EXPECT_EQ(n, c.rows) << c.d0 << "/" << c.world << "@" << c.rank;
    }
}

TEST(Comm, CollectivesAndStateOnOneToFourRanks) {
    std::string bin = std::string(FSDP_BUILD_DIR) + "/tests/mpi/comm_check";
    std::string out;
    ASSERT_EQ(run_cmd(bin, &out), 0) << out;  // single backend, no MPI launcher
    EXPECT_NE(out.find("comm_check ok (single, world 1)"), std::string::npos) << out;
    for (int np = 1; np <= 4; np++) {
        ASSERT_EQ(run_cmd(mpirun_prefix(np) + " " + bin, &out), 0) << out;
        EXPECT_NE(out.find("comm_check ok (mpi, world " + std::to_string(np) + ")"), std::string::npos) << out;
    }
}
