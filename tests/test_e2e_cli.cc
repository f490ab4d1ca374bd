// The fsdp-run binary itself: exit codes and messages as a user sees them.
#include <gtest/gtest.h>

#include "test_util.h"

using namespace fsdp_test;

namespace {
struct Tmp {
    std::string dir = make_tmpdir("fsdp-e2e");
    ~Tmp() { rm_rf(dir); }
};
}  // namespace

TEST(E2ECli, HelpVersionStages) {
    std::string out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " --help", &out), 0);
    EXPECT_NE(out.find("usage: fsdp-run"), std::string::npos);
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " --version", &out), 0);
    EXPECT_NE(out.find("fsdp-run 0."), std::string::npos);
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " stages --plugin " + plugin_dir() + "/libecho_stage.so", &out), 0);
    EXPECT_NE(out.find("echo  print a message"), std::string::npos) << out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " --no-such-flag r.yaml", &out), 2);
}

// The passive OpenMP wait policy is in place when libgomp initialises (it reads it then), without the
// program executing itself a second time (which loaded every library twice): libgomp starts once.
TEST(E2ECli, PassiveWaitPolicyWithoutASecondExec) {
    std::string out;
    ASSERT_EQ(run_cmd("OMP_NUM_THREADS=3 OMP_DISPLAY_ENV=verbose " + fsdp_run_bin() + " --version", &out), 0) << out;
    size_t at = out.find("OMP_WAIT_POLICY = 'PASSIVE'");
    EXPECT_NE(at, std::string::npos) << out;
    // libgomp shows PASSIVE for an unset policy too: its spin count says whether it took it
    EXPECT_NE(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << out;
    EXPECT_NE(out.find("OMP_NUM_THREADS = '3'"), std::string::npos) << out;  // and the rest of the environment
    EXPECT_EQ(out.find("OPENMP DISPLAY ENVIRONMENT BEGIN", out.find("OPENMP DISPLAY ENVIRONMENT BEGIN") + 1),
              std::string::npos)
        << out;  // one libgomp start: one process image
    EXPECT_EQ(run_cmd("LD_DEBUG=files " + fsdp_run_bin() + " --version 2>&1 | grep -c 'transferring control'", &out),
              0);
    EXPECT_EQ(out, "1\n");
    // the processes it starts inherit the policy (as when it executed itself with it)
    Tmp t;
    write_file(t.dir + "/env.sh", "#!/bin/sh\nenv\n");
    ASSERT_EQ(run_cmd("chmod +x " + t.dir + "/env.sh && FSDP_MPIRUN=" + t.dir + "/env.sh " + fsdp_run_bin() +
                          " --nproc 1 x.yaml",
                      &out),
              0);
    EXPECT_NE(out.find("OMP_WAIT_POLICY=passive"), std::string::npos) << out;
    // a policy the user set is kept
    ASSERT_EQ(run_cmd("OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=true " + fsdp_run_bin() + " --version", &out), 0);
    EXPECT_NE(out.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << out;
    // without a `_` entry to stand in for, fsdp-run executes itself once with the policy set
    ASSERT_EQ(run_cmd("env -i PATH=/usr/bin:/bin OMP_DISPLAY_ENV=verbose " + fsdp_run_bin() + " --version", &out), 0);
    EXPECT_NE(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << out;
}

TEST(E2ECli, ValidateCycleExitsTwoAndPrintsCycle) {
    Tmp t;
    std::string p = t.dir + "/cycle.yaml";
    write_file(p, "plugins: [" + plugin_dir() + "/libecho_stage.so]\nstages:\n"
                  "  - {id: a, uses: echo, after: [b], with: {message: x}}\n"
                  "  - {id: b, uses: echo, after: [a], with: {message: y}}\n");
    std::string out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + p, &out), 2);
    EXPECT_NE(out.find("cycle in the stage graph"), std::string::npos) << out;
    EXPECT_NE(out.find("a -> b -> a"), std::string::npos) << out;
}

// Options before a sub-command belong to it (validate) or are refused naming it; never a recipe name.
TEST(E2ECli, OptionsBeforeSubcommand) {
    Tmp t;
    std::string p = t.dir + "/ok.yaml", out;
    write_file(p, "plugins: [" + plugin_dir() + "/libecho_stage.so]\nvars: {m: hi}\nstages:\n"
                  "  - {id: a, uses: echo, with: {message: \"${m}\"}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -v validate " + p, &out), 0) << out;
    EXPECT_EQ(out.find("validate"), std::string::npos) << out;  // not taken as a recipe
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q --set vars.m=x validate " + p, &out), 0) << out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " --set stages.a.with.nope=1 validate " + p, &out), 2) << out;
    EXPECT_NE(out.find("unknown parameter 'nope'"), std::string::npos) << out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -v ckpt inspect " + p, &out), 2) << out;
    EXPECT_NE(out.find("option '-v' before `ckpt`: the ckpt command takes its options after its name"),
              std::string::npos)
        << out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q stages", &out), 2) << out;
    // a recipe comes first: later words are recipes, not sub-commands
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q " + p + " plot", &out), 2) << out;
    EXPECT_NE(out.find("plot"), std::string::npos) << out;
}

TEST(E2ECli, ValidateUnknownWithKeyPrintsPosition) {
    Tmp t;
    std::string p = t.dir + "/unknown.yaml";
    write_file(p, "plugins: [" + plugin_dir() + "/libecho_stage.so]\nstages:\n  - id: a\n    uses: echo\n"
                  "    with:\n      message: hi\n      mesage: typo\n");
    std::string out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + p, &out), 2);
    EXPECT_NE(out.find(p + ":7:7: stage 'a' (echo): unknown parameter 'mesage'"), std::string::npos) << out;
}

TEST(E2ECli, RunWritesReportAndExitCodes) {
    Tmp t;
    std::string p = t.dir + "/ok.yaml", rep = t.dir + "/report.json";
    write_file(p, "plugins: [" + plugin_dir() + "/libecho_stage.so]\nstages:\n"
                  "  - {id: a, uses: echo, with: {message: hello}}\n"
                  "  - {id: b, uses: echo, with: {message: bye, file: /nonexistent-dir/x.txt}}\n"
                  "  - {id: c, uses: echo, with: {message: never}}\n");
    std::string out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " --report " + rep + " " + p, &out), 1);
    EXPECT_NE(out.find("stage b (echo) failed: echo: cannot open /nonexistent-dir/x.txt"), std::string::npos) << out;
    EXPECT_EQ(out.find("never"), std::string::npos) << out;
    std::string report = read_file(rep);
    EXPECT_NE(report.find("\"status\": \"skipped\""), std::string::npos) << report;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q " + p + " --set stages.b.with.file=" + t.dir + "/y.txt", &out), 0) << out;
    EXPECT_EQ(out.find("hello"), std::string::npos) << "quiet mode prints no info lines: " << out;
    EXPECT_EQ(read_file(t.dir + "/y.txt"), "bye\n");
}
