// A reader never returns a mix of two checkpoints (issue 25): readers held between `.metadata` and
// their data files while saves overwrite the checkpoint, and readers of every kind looping while a
// writer overwrites it 40 times. Every read is one save, whole, or a clear error.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-rc");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

const char *MODEL = "model: {preset: tiny}\n";

// saves the tiny model drawn with seed into path on np ranks, replacing what is there
void save_seed(const Dir &t, int np, int seed, const std::string &path) {
    std::string r = t / ("save" + std::to_string(seed) + ".yaml");
    write_file(r, std::string(MODEL) + "runtime: {seed: " + std::to_string(seed) +
                      "}\nstages:\n  - {id: i, uses: init-meta}\n  - {id: s, uses: save-dcp, after: [i], with: {path: " +
                      path + ", overwrite: true}}\n");
    int rc;
    std::string out = run_np(np, r, &rc);
    ASSERT_EQ(rc, 0) << out;
}

// `ckpt diff a b` exits 0 (every tensor and value equal)
bool same_ckpt(const std::string &a, const std::string &b, std::string *out) {
    return run_cmd(fsdp_run_bin() + " ckpt diff " + a + " " + b, out) == 0;
}

// waits (up to 60 s) for the reader paused at go to say so
bool wait_paused(const std::string &go) {
    for (int i = 0; i < 12000; i++) {
        if (exists(go + ".paused")) return true;
        usleep(5000);
    }
    return false;
}

}  // namespace

// Readers held between `.metadata` and their data files (after reading it, and after opening the
// first data file), two 3-rank overwrites while they wait, then released. Before the save
// identities and fresh file names, the second overwrite wrote its files back under the first
// names, and a reader held after its first data file took rank 0's rows from the first save and
// the others' from the third, exit 0. Now each reads the newest save, whole, and says it restarted.
TEST(ReadConsistency, HeldReadersOfEveryKindReadOneSave) {
    for (const char *point : {"dcp.open.metadata:1", "dcp.open.data:1"}) {
        Dir t;
        std::string ck = t / "ck", s1 = t / "s1", s3 = t / "s3", go = t / "go";
        save_seed(t, 3, 1, ck);
        save_seed(t, 3, 1, s1);
        save_seed(t, 3, 3, s3);
        struct Reader {
            std::string what, cmd, out;
        };
        std::string load = t / "load.yaml";
        write_file(load, std::string(MODEL) + "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + ck +
                             "}}\n  - {id: x, uses: save-dcp, after: [l], with: {path: " + t / "r_load" + "}}\n");
        std::string reshard = t / "reshard.yaml";
        write_file(reshard, "stages:\n  - {id: r, uses: reshard-dcp, with: {src: " + ck + ", dst: " + t / "r_reshard" +
                                ", world: 2}}\n");
        std::vector<Reader> readers = {
            {"ckpt convert", fsdp_run_bin() + " ckpt convert " + ck + " " + t / "r_convert" + " --to dcp", t / "r_convert"},
            {"load-ckpt on 2 ranks", mpirun_prefix(2) + " " + fsdp_run_bin() + " " + load, t / "r_load"},
            {"reshard-dcp on 2 ranks", mpirun_prefix(2) + " " + fsdp_run_bin() + " " + reshard, t / "r_reshard"},
        };
        for (auto &r : readers) {
            // each reader from a fresh first save, held, two overwrites, released
            save_seed(t, 3, 1, ck);
            rm_rf(go);
            std::string cmd = "FSDP_PAUSE_AT=" + std::string(point) + "=" + go + " " + r.cmd;
            int rc = -1;
            std::thread th([&] { rc = run_cmd(cmd, &r.out); });
            bool paused = wait_paused(go);
            if (paused) {
                save_seed(t, 3, 2, ck);
                save_seed(t, 3, 3, ck);
            }
            write_file(go, "");
            th.join();
            ASSERT_TRUE(paused) << r.what << " never reached " << point << ": " << r.out;
            ASSERT_EQ(rc, 0) << r.what << " (" << point << "): " << r.out;
            EXPECT_NE(r.out.find("changed while it was being opened"), std::string::npos) << r.what << ": " << r.out;
            std::string d;
            EXPECT_TRUE(same_ckpt(t / (std::string("r_") + (r.what.find("convert") != std::string::npos ? "convert"
                                                             : r.what.find("load") != std::string::npos   ? "load"
                                                                                                           : "reshard")),
                                  s3, &d))
                << r.what << " (" << point << ") read something else than the newest save: " << d;
            rm_rf(t / "r_convert");
            rm_rf(t / "r_load");
            rm_rf(t / "r_reshard");
        }
    }
}

// load-ckpt of DIR/latest on 2 ranks, held after reading step-2's .metadata while a run commits
// step-3 and prunes step-2 (keep_last: 1): the ranks look up `latest` again and load step-3.
TEST(ReadConsistency, LatestWhoseStepIsPrunedWhileOpeningIsLookedUpAgain) {
    Dir t;
    std::string base = t / "run", s3 = t / "s3", go = t / "go";
    ASSERT_EQ(::mkdir(base.c_str(), 0755), 0);
    save_seed(t, 2, 2, base + "/step-2");
    save_seed(t, 2, 3, s3);
    std::string load = t / "load.yaml";
    write_file(load, std::string(MODEL) + "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + base +
                         "/latest}}\n  - {id: x, uses: save-dcp, after: [l], with: {path: " + t / "r" + "}}\n");
    std::string out;
    int rc = -1;
    std::thread th([&] {
        rc = run_cmd("FSDP_PAUSE_AT=dcp.open.metadata:1=" + go + " " + mpirun_prefix(2) + " " + fsdp_run_bin() + " " +
                         load, &out);
    });
    bool paused = wait_paused(go);
    if (paused) {
        save_seed(t, 2, 3, base + "/step-3");
        rm_rf(base + "/step-2");
    }
    write_file(go, "");
    th.join();
    ASSERT_TRUE(paused) << out;
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("step-3"), std::string::npos) << out;
    EXPECT_NE(out.find("changed while it was being opened"), std::string::npos) << out;
    std::string d;
    EXPECT_TRUE(same_ckpt(t / "r", s3, &d)) << d;
}

// An HF directory (index + shards, save-safetensors overwrite: true) read by `ckpt convert`, held
// after reading the index while two saves replace it: the shard names of a split never come back,
// so the reader finds its shards gone, reads the new index, and converts the newest save.
TEST(ReadConsistency, HfDirectoryHeldAfterItsIndexReadsOneSave) {
    Dir t;
    std::string hf = t / "hf", go = t / "go";
    auto save_hf = [&](int seed, const std::string &path) {
        std::string r = t / ("hf" + std::to_string(seed) + ".yaml");
        write_file(r, std::string(MODEL) + "runtime: {seed: " + std::to_string(seed) +
                          "}\nstages:\n  - {id: i, uses: init-meta}\n  - {id: s, uses: save-safetensors, after: [i], "
                          "with: {path: " + path + ", shard_mb: 1, overwrite: true}}\n");
        int rc;
        std::string out = run_np(1, r, &rc);
        ASSERT_EQ(rc, 0) << out;
    };
    save_hf(1, hf);
    save_hf(3, t / "s3");
    std::string out;
    int rc = -1;
    std::thread th([&] {
        rc = run_cmd("FSDP_PAUSE_AT=st.open.index=" + go + " " + fsdp_run_bin() + " ckpt convert " + hf + " " +
                         t / "r" + " --to dcp", &out);
    });
    bool paused = wait_paused(go);
    if (paused) {
        save_hf(2, hf);
        save_hf(3, hf);
    }
    write_file(go, "");
    th.join();
    ASSERT_TRUE(paused) << out;
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("changed while it was being opened"), std::string::npos) << out;
    std::string d;
    EXPECT_TRUE(same_ckpt(t / "r", t / "s3", &d)) << d;
}

// A writer replaces the checkpoint 40 times (alternating two saves) while readers of every kind
// loop over it: every read succeeds and is one of the two saves. Before the readers kept what they
// opened, some failed with "cannot open __0_0.distcp: No such file or directory".
TEST(ReadConsistency, ReadersLoopingWhileAWriterOverwrites40TimesSeeOneSaveEach) {
    Dir t;
    std::string ck = t / "ck", a = t / "a", b = t / "b";
    save_seed(t, 3, 1, a);
    save_seed(t, 3, 2, b);
    save_seed(t, 3, 1, ck);
    // each reading kind as a command of its source and output; the outputs of reading a and b by
    // the same command are what every read of ck must give
    struct Kind {
        std::string name;
        std::function<std::string(const std::string &, const std::string &)> cmd;
        bool writes;
        std::string ref_a, ref_b;
    };
    auto load_cmd = [&](const std::string &src, const std::string &out) {
        std::string y = out + ".yaml";
        write_file(y, std::string(MODEL) + "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + src +
                          "}}\n  - {id: x, uses: save-safetensors, after: [l], with: {path: " + out +
                          "/model.safetensors}}\n");
        return fsdp_run_bin() + " -q " + y;
    };
    std::vector<Kind> kinds = {
        {"convert",
         [&](const std::string &src, const std::string &out) {
             return fsdp_run_bin() + " ckpt convert " + src + " " + out + " --to safetensors";
         },
         true, "", ""},
        {"inspect", [&](const std::string &src, const std::string &) { return fsdp_run_bin() + " ckpt inspect " + src; },
         false, "", ""},
        {"load-ckpt", load_cmd, true, "", ""},
    };
    for (auto &k : kinds) {
        if (!k.writes) continue;
        k.ref_a = t / ("ref_a_" + k.name);
        k.ref_b = t / ("ref_b_" + k.name);
        std::string out;
        ASSERT_EQ(run_cmd(k.cmd(a, k.ref_a), &out), 0) << out;
        ASSERT_EQ(run_cmd(k.cmd(b, k.ref_b), &out), 0) << out;
    }
    std::atomic<bool> done{false};
    std::atomic<int> writes{0};
    std::string werr;
    std::thread writer([&] {
        for (int i = 0; i < 40; i++) {
            std::string out;
            int rc = run_cmd(fsdp_run_bin() + " ckpt convert " + (i % 2 ? a : b) + " " + ck +
                                 " --to dcp --world 3 --overwrite", &out);
            if (rc != 0 && werr.empty()) werr = out;
            writes++;
        }
        done = true;
    });
    // two reader loops at once (the 3 of 132 failures reported came from concurrent readers)
    std::atomic<int> reads{0};
    std::mutex mu;
    std::vector<std::string> failures;
    auto fail = [&](const std::string &m) {
        std::lock_guard<std::mutex> g(mu);
        failures.push_back(m);
    };
    auto loop = [&](int id) {
        while (!done) {
            for (auto &k : kinds) {
                std::string res = t / ("read" + std::to_string(id) + "_" + k.name), out, d;
                rm_rf(res);
                int rc = run_cmd(k.cmd(ck, res), &out);
                reads++;
                if (rc != 0) {
                    fail(k.name + ": exit " + std::to_string(rc) + ": " + out);
                    continue;
                }
                if (k.writes && !same_ckpt(res, k.ref_a, &d) && !same_ckpt(res, k.ref_b, &d))
                    fail(k.name + " read neither save: " + d);
            }
            // diff reads two checkpoints: ck against a is equal or differs, never an error
            std::string out;
            int rc = run_cmd(fsdp_run_bin() + " ckpt diff " + ck + " " + a, &out);
            reads++;
            if (rc != 0 && rc != 1) fail("diff: exit " + std::to_string(rc) + ": " + out);
        }
    };
    std::thread second(loop, 2);
    loop(1);
    second.join();
    writer.join();
    EXPECT_TRUE(werr.empty()) << werr;
    EXPECT_EQ(writes.load(), 40);
    EXPECT_GT(reads.load(), 8);
    EXPECT_TRUE(failures.empty()) << failures.size() << " of " << reads.load() << " reads failed; the first: "
                                  << failures[0];
}

// ---- symlinks inside a checkpoint -----------------------------------------------------------

namespace {

// ck copied to dst (cp -a: links kept as links)
void copy_dir(const std::string &src, const std::string &dst) {
    std::string out;
    ASSERT_EQ(run_cmd("cp -a " + src + " " + dst, &out), 0) << out;
}

void symlink_to(const std::string &target, const std::string &link) {
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link;
}

// every reader of ck fails naming the link and its target, and writes nothing
void expect_refused(const Dir &t, const std::string &ck, const std::string &link, const std::string &target,
                    const std::string &env) {
    std::string load = t / "load_refused.yaml";
    write_file(load, std::string(MODEL) + "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + ck +
                         "}}\n  - {id: x, uses: save-dcp, after: [l], with: {path: " + t / "refused_load" + "}}\n");
    struct C {
        std::string cmd, out_path;
    };
    std::vector<C> cmds = {{fsdp_run_bin() + " ckpt convert " + ck + " " + t / "refused_cv" + " --to safetensors",
                            t / "refused_cv"},
                           {fsdp_run_bin() + " ckpt convert " + ck + " " + t / "refused_dcp" + " --to dcp", t / "refused_dcp"},
                           {fsdp_run_bin() + " ckpt inspect " + ck, ""},
                           {fsdp_run_bin() + " ckpt diff " + ck + " " + ck, ""},
                           {fsdp_run_bin() + " " + load, t / "refused_load"}};
    for (auto &c : cmds) {
        std::string out;
        int rc = run_cmd(env + c.cmd, &out);
        EXPECT_TRUE(rc == 1 || rc == 2) << env << c.cmd << " exited " << rc << ": " << out;
        EXPECT_NE(out.find(link), std::string::npos) << env << c.cmd << ": " << out;
        EXPECT_NE(out.find("symbolic link"), std::string::npos) << env << c.cmd << ": " << out;
        if (!target.empty()) {
            EXPECT_NE(out.find(target), std::string::npos) << env << c.cmd << ": " << out;
        }
        if (!c.out_path.empty()) {
            std::string ls;
            run_cmd("ls -A " + c.out_path + " 2>/dev/null", &ls);
            EXPECT_EQ(ls.find("safetensors"), std::string::npos) << env << c.cmd << " wrote " << ls;
            EXPECT_FALSE(exists(c.out_path + "/.metadata")) << env << c.cmd;
            rm_rf(c.out_path);
        }
    }
}

void expect_reads(const std::string &ck, const std::string &same_as, const std::string &env) {
    std::string out;
    EXPECT_EQ(run_cmd(env + fsdp_run_bin() + " ckpt inspect " + ck, &out), 0) << env << out;
    EXPECT_EQ(run_cmd(env + fsdp_run_bin() + " ckpt diff " + ck + " " + same_as, &out), 0) << env << out;
}

}  // namespace

TEST(ReadConsistency, SymlinksOutOfADcpCheckpointAreRefusedAndInsideItFollowed) {
    Dir t;
    std::string ck = t / "ck";
    save_seed(t, 2, 1, ck);
    ASSERT_EQ(::mkdir((t / "elsewhere").c_str(), 0755), 0);
    for (const std::string env : {"", "FSDP_NO_OPENAT2=1 "}) {
        // a data file linked (absolute) to a copy of itself outside: the old reader read it and
        // copied its values on
        std::string c1 = t / "c1";
        copy_dir(ck, c1);
        std::string out_file = t / "elsewhere/data.distcp";
        ASSERT_EQ(::rename((c1 + "/__0_0.distcp").c_str(), out_file.c_str()), 0);
        symlink_to(out_file, c1 + "/__0_0.distcp");
        expect_refused(t, c1, "__0_0.distcp", out_file, env);
        // the same through a relative link out of the directory
        std::string c2 = t / "c2";
        copy_dir(ck, c2);
        ASSERT_EQ(::rename((c2 + "/__1_0.distcp").c_str(), (t / "elsewhere/d1.distcp").c_str()), 0);
        symlink_to("../elsewhere/d1.distcp", c2 + "/__1_0.distcp");
        expect_refused(t, c2, "__1_0.distcp", "../elsewhere/d1.distcp", env);
        // .metadata linked out
        std::string c3 = t / "c3";
        copy_dir(ck, c3);
        ASSERT_EQ(::rename((c3 + "/.metadata").c_str(), (t / "elsewhere/meta").c_str()), 0);
        symlink_to(t / "elsewhere/meta", c3 + "/.metadata");
        expect_refused(t, c3, ".metadata", t / "elsewhere/meta", env);
        // links that stay inside are followed: a data file and .metadata in a subdirectory
        std::string c4 = t / "c4";
        copy_dir(ck, c4);
        ASSERT_EQ(::mkdir((c4 + "/sub").c_str(), 0755), 0);
        ASSERT_EQ(::rename((c4 + "/__0_0.distcp").c_str(), (c4 + "/sub/r0").c_str()), 0);
        symlink_to("sub/r0", c4 + "/__0_0.distcp");
        ASSERT_EQ(::rename((c4 + "/.metadata").c_str(), (c4 + "/sub/meta").c_str()), 0);
        symlink_to("sub/meta", c4 + "/.metadata");
        expect_reads(c4, ck, env);
        // a checkpoint directory that is itself a link is fine
        symlink_to(ck, t / "link_to_ck");
        expect_reads(t / "link_to_ck", ck, env);
        for (const std::string &d : {c1, c2, c3, c4, t / "link_to_ck"}) rm_rf(d);
        ::unlink((t / "link_to_ck").c_str());
        rm_rf(t / "elsewhere");
        ASSERT_EQ(::mkdir((t / "elsewhere").c_str(), 0755), 0);
    }
}

// The same for an HF directory: a shard, the index and a single model.safetensors linked out of it
// are refused (the old reader read them and converted their values on); links inside are followed.
TEST(ReadConsistency, SymlinksOutOfAnHfDirectoryAreRefusedAndInsideItFollowed) {
    Dir t;
    std::string hf = t / "hf", r = t / "hf.yaml";
    write_file(r, std::string(MODEL) + "stages:\n  - {id: i, uses: init-meta}\n  - {id: s, uses: save-safetensors, "
                                       "after: [i], with: {path: " + hf + ", shard_mb: 1}}\n");
    int rc;
    std::string out = run_np(1, r, &rc);
    ASSERT_EQ(rc, 0) << out;
    const std::string shard = "model-00001-of-00001.safetensors", index = "model.safetensors.index.json";
    ASSERT_TRUE(exists(hf + "/" + shard) && exists(hf + "/" + index));
    ASSERT_EQ(::mkdir((t / "elsewhere").c_str(), 0755), 0);
    for (const std::string env : {"", "FSDP_NO_OPENAT2=1 "}) {
        std::string h1 = t / "h1", h2 = t / "h2", h3 = t / "h3", h4 = t / "h4";
        // a shard linked out
        copy_dir(hf, h1);
        ASSERT_EQ(::rename((h1 + "/" + shard).c_str(), (t / "elsewhere/s1").c_str()), 0);
        symlink_to(t / "elsewhere/s1", h1 + "/" + shard);
        expect_refused(t, h1, shard, t / "elsewhere/s1", env);
        // the index linked out (its shard stays): the directory names the checkpoint
        copy_dir(hf, h2);
        ASSERT_EQ(::rename((h2 + "/" + index).c_str(), (t / "elsewhere/i2").c_str()), 0);
        symlink_to("../elsewhere/i2", h2 + "/" + index);
        expect_refused(t, h2, index, "../elsewhere/i2", env);
        // a single model.safetensors linked out
        ASSERT_EQ(::mkdir(h3.c_str(), 0755), 0);
        std::string o;
        ASSERT_EQ(run_cmd("cp " + hf + "/" + shard + " " + t / "elsewhere/m3", &o), 0) << o;
        symlink_to(t / "elsewhere/m3", h3 + "/model.safetensors");
        expect_refused(t, h3, "model.safetensors", t / "elsewhere/m3", env);
        // inside: the shard and the index in a subdirectory, linked
        copy_dir(hf, h4);
        ASSERT_EQ(::mkdir((h4 + "/sub").c_str(), 0755), 0);
        ASSERT_EQ(::rename((h4 + "/" + shard).c_str(), (h4 + "/sub/s").c_str()), 0);
        symlink_to("sub/s", h4 + "/" + shard);
        ASSERT_EQ(::rename((h4 + "/" + index).c_str(), (h4 + "/sub/i").c_str()), 0);
        symlink_to("sub/i", h4 + "/" + index);
        expect_reads(h4, hf, env);
        // a file named on the command line may be a link anywhere: the user named it
        symlink_to(hf + "/" + shard, t / "named.safetensors");
        expect_reads(t / "named.safetensors", hf, env);
        ::unlink((t / "named.safetensors").c_str());
        for (const std::string &d : {h1, h2, h3, h4}) rm_rf(d);
        rm_rf(t / "elsewhere");
        ASSERT_EQ(::mkdir((t / "elsewhere").c_str(), 0755), 0);
    }
}
