// Crash safety of save-dcp: a save killed at any point never leaves a directory that loads
// as a checkpoint, and the previous checkpoint still loads; a full disk is a clear error.
#include <gtest/gtest.h>

#include <random>

#include "ckpt_compare.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {
const char *RECIPE_HEAD =
    "model: {preset: debugmodel}\n"
    "stages:\n  - {id: i, uses: init-meta}\n";
}

TEST(E2ECrash, KilledSavesNeverLookLikeCheckpoints) {
    std::string t = make_tmpdir("fsdp-crash"), out;
    std::string prev = t + "/prev";
    write_file(t + "/prev.yaml", std::string(RECIPE_HEAD) + "  - {id: s, uses: save-dcp, with: {path: " + prev + "}}\n");
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " -q " + t + "/prev.yaml", &out), 0) << out;
    std::mt19937 rng(1234);
    int complete = 0, incomplete = 0;
    for (int k = 0; k < 20; k++) {
        std::string dst = t + "/c" + std::to_string(k);
        write_file(t + "/s.yaml", std::string(RECIPE_HEAD) + "  - {id: s, uses: save-dcp, with: {path: " + dst + "}}\n");
        int np = 1 + (int)(rng() % 2);
        // most kills land inside the write: wait for the data file to appear, then a few ms
        bool in_write = k % 4 != 0;
        double delay = in_write ? (rng() % 1000) / 1000.0 * 0.04 : 0.05 + (rng() % 1000) / 1000.0 * 0.8;
        bool one_rank = np == 2 && (rng() % 2);
        // kill every process of the run (or just one rank) with SIGKILL after `delay` seconds
        std::string launch = np == 1 ? fsdp_run_bin() : mpirun_prefix(np) + " " + fsdp_run_bin();
        std::string killer = one_rank ? "pkill -KILL -n -f 'fsdp-run -q " + t + "/s.yaml'"
                                      : "pkill -KILL -f 'fsdp-run -q " + t + "/s.yaml'";
        std::string wait = in_write ? "for i in $(seq 1 1000); do ls " + dst + "/*.tmp >/dev/null 2>&1 && break; sleep 0.005; done; "
                                    : std::string();
        std::string cmd = "(" + launch + " -q " + t + "/s.yaml >/dev/null 2>&1 &) ; " + wait + "sleep " + std::to_string(delay) +
                          "; " + killer + "; sleep 0.3; pkill -KILL -f 'fsdp-run -q " + t + "/s.yaml'; sleep 0.2; true";
        run_cmd(cmd, &out);
        ckpt_reader *r = nullptr;
        fsdp_err err;
        int rc = ckpt_open(dst.c_str(), CKPT_AUTO, &r, &err);
        if (rc == 0) {
            // the save finished before the kill: then it must be whole and equal to prev
            complete++;
            Ckpt p(prev);
            expect_same_tensors(r, p.r);
            ckpt_close(r);
        } else {
            incomplete++;
            EXPECT_EQ(access((dst + "/.metadata").c_str(), F_OK), -1) << dst << ": " << err.msg;
        }
        Ckpt p(prev);  // the previous checkpoint is untouched
        ASSERT_TRUE(p.r);
        EXPECT_EQ(ckpt_count(p.r), 60u);  // 57 parameters + train_state.{step,ntokens_seen,data_pos}
    }
    std::cout << "[crash] " << complete << " saves completed before the kill, " << incomplete << " were cut\n";
    EXPECT_GT(incomplete, 0);
    rm_rf(t);
}

TEST(E2ECrash, FullDiskIsAClearError) {
    std::string t = make_tmpdir("fsdp-full"), out;
    write_file(t + "/s.yaml", std::string(RECIPE_HEAD) + "  - {id: s, uses: save-dcp, with: {path: " + t + "/c}}\n");
    // a 2 MB file-size limit stands in for a full disk (writes fail with EFBIG)
    int rc = run_cmd("bash -c 'trap \"\" XFSZ; ulimit -f 2048; exec " + fsdp_run_bin() + " " + t + "/s.yaml'", &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("stage s (save-dcp) failed"), std::string::npos) << out;
    EXPECT_NE(out.find("File too large"), std::string::npos) << out;
    EXPECT_EQ(access((t + "/c/.metadata").c_str(), F_OK), -1);
    ckpt_reader *r = nullptr;
    fsdp_err err;
    EXPECT_NE(ckpt_open((t + "/c").c_str(), CKPT_AUTO, &r, &err), 0);
    rm_rf(t);
}
