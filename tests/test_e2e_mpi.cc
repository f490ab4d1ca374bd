// Multi-rank runs of the fsdp-run binary under mpirun.
#include <gtest/gtest.h>

#include <chrono>

#include "test_util.h"

using namespace fsdp_test;

TEST(E2EMpi, OneFailingRankEndsTheJobWithItsMessage) {
    std::string dir = make_tmpdir("fsdp-mpi");
    std::string p = dir + "/fail.yaml", rep = dir + "/report.json";
    write_file(p, "plugins: [" + std::string(FSDP_BUILD_DIR) + "/tests/plugins/librank_fail.so]\nstages:\n"
                  "  - {id: wait, uses: rank-fail, with: {rank: 2}}\n");
    std::string out;
    auto t0 = std::chrono::steady_clock::now();
    int rc = run_cmd("timeout 60 " + mpirun_prefix(3) + " " + fsdp_run_bin() + " --report " + rep + " " + p, &out);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(rc, 124) << "the job hung until the timeout: " << out;
    EXPECT_LT(secs, 30.0) << out;
    EXPECT_NE(out.find("rank-fail: rank 2 cannot open /no/such/file"), std::string::npos) << out;
    EXPECT_NE(out.find("[r2"), std::string::npos) << out;
    // the failing rank wrote the report before ending the job
    std::string report = read_file(rep);
    EXPECT_NE(report.find("\"status\": \"failed\""), std::string::npos) << report;
    rm_rf(dir);
}

TEST(E2EMpi, NprocRelaunchesUnderMpirun) {
    std::string dir = make_tmpdir("fsdp-mpi");
    std::string p = dir + "/ok.yaml", f = dir + "/out.txt";
    write_file(p, "plugins: [" + plugin_dir() + "/libecho_stage.so]\nstages:\n"
                  "  - {id: hi, uses: echo, with: {message: hello, file: " + f + "}}\n");
    std::string out;
    std::string cmd = fsdp_run_bin() + " --nproc 3 " + p;
    ASSERT_EQ(run_cmd("timeout 60 env OMPI_MCA_rmaps_base_oversubscribe=1 ASAN_OPTIONS=detect_leaks=0 " + cmd, &out), 0) << out;
    EXPECT_EQ(read_file(f), "hello\nhello\nhello\n");  // every rank ran the stage
    rm_rf(dir);
}
