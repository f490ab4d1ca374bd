// Issue 16 item 7: under Slurm (SLURM_NTASKS > 1) a run started without srun/mpirun refuses, with a
// message saying how to launch, instead of training silently as one rank of one.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-launch");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

int run(const std::string &env, const std::string &args, std::string *out) {
    return run_cmd("env -u SLURM_NTASKS -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK -u PMI_RANK " + env +
                       " timeout 120 " + fsdp_run_bin() + " " + args,
                   out);
}

std::string recipe(const Dir &d) {
    std::string p = d / "r.yaml";
    write_file(p, "runtime: {device: cpu}\nmodel: {preset: tiny}\ndata: {kind: synthetic, batch_size: 4, seq_len: 8}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n"
                  "  - {id: t, uses: train-steps, with: {steps: 1, metrics: " + d / "m.jsonl" + "}}\n");
    return p;
}

}  // namespace

TEST(Launch, SlurmTasksWithoutALauncherRefuse) {
    Dir d;
    std::string p = recipe(d), out;
    // before: trained as rank 0 of 1 in each of the 4 tasks Slurm started
    EXPECT_EQ(run("SLURM_NTASKS=4", "-q " + p, &out), 2) << out;
    EXPECT_NE(out.find("fsdp-run: error: SLURM_NTASKS is 4, but this fsdp-run was not started by srun or mpirun as one "
                       "of 4 ranks (it would train alone as rank 0 of 1): launch it inside the allocation with `srun "
                       "--mpi=pmix fsdp-run RECIPE.yaml` (or `mpirun -np 4 fsdp-run RECIPE.yaml`)"),
              std::string::npos)
        << out;
    EXPECT_FALSE(exists(d / "m.jsonl"));  // nothing ran
}

TEST(Launch, OneSlurmTaskAndNoSlurmRun) {
    Dir d;
    std::string p = recipe(d), out;
    EXPECT_EQ(run("SLURM_NTASKS=1", "-q " + p, &out), 0) << out;
    EXPECT_EQ(run("", "-q " + p, &out), 0) << out;
    EXPECT_EQ(run("SLURM_NTASKS=garbage", "-q " + p, &out), 0) << out;  // not a count: not Slurm's
}

TEST(Launch, ValidateAndDryRunCheckForTheSlurmWorld) {
    // validate and --dry-run run nothing: no refusal; validate checks the batch over the tasks
    Dir d;
    std::string p = recipe(d), out;
    EXPECT_EQ(run("SLURM_NTASKS=4", "validate " + p, &out), 0) << out;
    EXPECT_EQ(run("SLURM_NTASKS=4", "--dry-run " + p, &out), 0) << out;
    EXPECT_EQ(run("SLURM_NTASKS=3", "validate " + p, &out), 2) << out;
    EXPECT_NE(out.find("does not divide evenly over 3 ranks"), std::string::npos) << out;
}

TEST(Launch, UnderMpirunInsideASlurmAllocation) {
    // launched as MPI ranks: the run proceeds (2 ranks, SLURM_NTASKS 2)
    Dir d;
    std::string p = recipe(d), out;
    int rc = run_cmd("SLURM_NTASKS=2 timeout 120 " + mpirun_prefix(2) + " " + fsdp_run_bin() + " -q " + p, &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_TRUE(exists(d / "m.jsonl")) << out;
}
