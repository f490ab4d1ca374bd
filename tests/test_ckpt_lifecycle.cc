// Issue 16, item 4: the checkpoint lifecycle of a run left alone. An async save is committed as soon
// as its files are written (a later stage of the same run loads it; a SIGKILL after its commit keeps
// it); keep_last never leaves fewer than K committed step-<N> checkpoints, even when the run is killed
// mid-save; load-ckpt DIR/latest skips an incomplete newest directory; "load if there is a checkpoint,
// else initialise" is one recipe for the first run and every restart; periodic saves refuse to replace
// a step-<N> unless told; strict: false lists what it did not restore.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/ckpt_steps.h"
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

struct Tmp {
    std::string t = make_tmpdir("life");
    ~Tmp() { rm_rf(t); }
    std::string operator/(const std::string &s) const { return t + "/" + s; }
};

// fsdp-run on np ranks; crash: an FSDP_CRASH_AT spec (runtime/crash.h) or ""
std::string launch(int np, const std::string &crash = "") {
    if (np == 1) return (crash.empty() ? "" : "env FSDP_CRASH_AT=" + crash + " ") + fsdp_run_bin();
    return mpirun_prefix(np) + (crash.empty() ? "" : " -x FSDP_CRASH_AT=" + crash) + " " + fsdp_run_bin();
}

const char *HEAD =
    "model: {preset: tiny}\n"
    "data: {kind: text, path: data/quickstart.txt, batch_size: 4, seq_len: 32}\n"
    "stages:\n";

// train-steps `with:` for periodic saves under dir
std::string train_with(int steps, const std::string &dir, const std::string &extra) {
    return "{steps: " + std::to_string(steps) + ", save_every: 1, save_path: " + dir + extra + "}";
}

int run_recipe(int np, const std::string &yaml_path, const std::string &text, std::string *out,
               const std::string &crash = "", const std::string &args = "") {
    write_file(yaml_path, text);
    return run_cmd("timeout -s KILL 300 " + launch(np, crash) + " " + yaml_path + args, out);
}

bool committed(const std::string &dir) {
    struct stat st;
    return stat((dir + "/.metadata").c_str(), &st) == 0;
}

// the committed step-<N> of base, newest last
std::vector<int64_t> committed_steps(const std::string &base) {
    ckpt_step_dir *v = nullptr;
    size_t n = 0;
    fsdp_err err;
    std::vector<int64_t> out;
    if (ckpt_steps_list(base.c_str(), &v, &n, &err)) return out;
    for (size_t i = 0; i < n; i++)
        if (v[i].committed) out.push_back(v[i].step);
    free(v);
    return out;
}

// "" when every tensor of a and b has the same bytes (both ways); else the first difference
std::string same_tensors(const std::string &a, const std::string &b) {
    ckpt_reader *x = nullptr, *y = nullptr;
    fsdp_err err;
    if (ckpt_open(a.c_str(), CKPT_AUTO, &x, &err)) return a + ": " + err.msg;
    if (ckpt_open(b.c_str(), CKPT_AUTO, &y, &err)) {
        ckpt_close(x);
        return b + ": " + err.msg;
    }
    std::string diff;
    size_t compared = 0;
    for (int pass = 0; pass < 2 && diff.empty(); pass++) {
        ckpt_reader *p = pass ? y : x, *q = pass ? x : y;
        for (size_t i = 0; i < ckpt_count(p) && diff.empty(); i++) {
            const ckpt_entry *e = ckpt_entry_at(p, i);
            if (!e->is_tensor) continue;
            long j = ckpt_find(q, e->name);
            if (j < 0) {
                diff = std::string("missing ") + e->name;
                break;
            }
            int64_t numel = 1;
            for (int d = 0; d < e->ndim; d++) numel *= e->shape[d];
            std::vector<float> u((size_t)numel + 1), w((size_t)numel + 1);
            int64_t rows = e->ndim ? e->shape[0] : 1;
            if (ckpt_read_rows(p, i, 0, rows, u.data(), FSDP_DT_F32, &err) ||
                ckpt_read_rows(q, (size_t)j, 0, rows, w.data(), FSDP_DT_F32, &err))
                diff = err.msg;
            else if (u != w)
                diff = std::string("values of ") + e->name;
            compared++;
        }
    }
    ckpt_close(x);
    ckpt_close(y);
    return diff.empty() && !compared ? "no tensors" : diff;
}

// the "loss" of each metrics line, in order
std::vector<double> losses(const std::string &metrics) {
    std::vector<double> v;
    std::string s = read_file(metrics);
    for (size_t p = s.find("\"loss\": "); p != std::string::npos; p = s.find("\"loss\": ", p + 1))
        v.push_back(std::stod(s.substr(p + 8)));
    return v;
}

size_t count(const std::string &s, const std::string &what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
    return n;
}

}  // namespace

// save-dcp async: a later stage of the same run loads it (before: .metadata came only at the run's
// end, so the load found no checkpoint).
TEST(CkptLifecycle, AsyncSaveDcpLoadableByLaterStageOfTheSameRun) {
    for (int np : {1, 2}) {
        Tmp t;
        std::string out;
        int rc = run_recipe(np, t / "r.yaml",
                            std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                                "  - {id: s, uses: save-dcp, with: {path: " + (t / "ck") +
                                ", async: true}}\n"
                                "  - {id: l, uses: load-ckpt, after: [s], with: {path: " + (t / "ck") + "}}\n"
                                "  - {id: t, uses: train-steps, after: [l], with: {steps: 1}}\n",
                            &out);
        EXPECT_EQ(rc, 0) << np << " ranks:\n" << out;
        EXPECT_NE(out.find("committed"), std::string::npos) << out;
        EXPECT_NE(out.find("loaded 21 parameters"), std::string::npos) << out;
    }
}

// save_every with save_async: each step-<N> is committed during training (the run loads step-2 in a
// later stage) and a SIGKILL after its commit (at step 4, while step-4's save may be in flight) keeps
// it: the same bytes as a synchronous run's step-2.
TEST(CkptLifecycle, AsyncPeriodicSaveLoadableInRunAndSurvivesKillAfterCommit) {
    for (int np : {1, 2}) {
        Tmp t;
        std::string out;
        // reference: synchronous periodic saves
        int rc = run_recipe(np, t / "ref.yaml",
                            std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                                "  - {id: t, uses: train-steps, after: [i], with: " +
                                train_with(6, t / "ref", "") + "}\n",
                            &out);
        ASSERT_EQ(rc, 0) << out;
        // async, then a later stage loads step-2 (a committed async save, not the current state)
        rc = run_recipe(np, t / "a.yaml",
                        std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                            "  - {id: t, uses: train-steps, after: [i], with: " +
                            train_with(6, t / "a", ", save_async: true") +
                            "}\n"
                            "  - {id: l, uses: load-ckpt, after: [t], with: {path: " + (t / "a/step-2") + "}}\n",
                        &out);
        ASSERT_EQ(rc, 0) << np << " ranks:\n" << out;
        EXPECT_NE(out.find("(step 2)"), std::string::npos) << out;
        for (int s = 1; s <= 6; s++)
            EXPECT_EQ(same_tensors(t / ("a/step-" + std::to_string(s)), t / ("ref/step-" + std::to_string(s))), "")
                << "step " << s;
        // killed (SIGKILL, no cleanup) once step 4 is trained: step-3's save was committed when step-4's
        // began (one in flight), step-2 and step-1 before
        rc = run_recipe(np, t / "k.yaml",
                        std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                            "  - {id: t, uses: train-steps, after: [i], with: " +
                            train_with(6, t / "k", ", save_async: true") + "}\n",
                        &out, "train.step:4@0");
        EXPECT_NE(rc, 0) << out;
        EXPECT_EQ(out.find("step 5/6"), std::string::npos) << "not killed at step 4:\n" << out;
        for (int s = 1; s <= 3; s++) {
            std::string d = t / ("k/step-" + std::to_string(s));
            EXPECT_TRUE(committed(d)) << d << " was not committed before the kill\n" << out;
            EXPECT_EQ(same_tensors(d, t / ("ref/step-" + std::to_string(s))), "") << d;
        }
    }
}

// The commit waits neither for the next save nor for the end of the run: step-50's commit is logged
// before step 100 (whose save would commit it otherwise), and a run SIGKILLed (by its pid) as soon as
// it logs it, while it still trains, keeps step-50 (before: .metadata came only at the run's end).
TEST(CkptLifecycle, AsyncSaveCommittedWhileTrainingSurvivesSigkill) {
    Tmp t;
    std::string out;
    write_file(t / "r.yaml", std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                                  "  - {id: t, uses: train-steps, after: [i], with: {steps: 200, "
                                                  "save_every: 50, save_path: " + (t / "k") + ", save_async: true, "
                                                  "decay: none, log_every: 1}}\n");
    std::string log = t / "log", d = t / "k/step-50";
    std::string cmd = "sh -c '" + fsdp_run_bin() + " " + (t / "r.yaml") + " > " + log + " 2>&1 & echo $! > " +
                      (t / "pid") + "'; for i in $(seq 1 1200); do grep -q '" + d + " committed' " + log +
                      " && break; sleep 0.05; done; kill -KILL $(cat " + (t / "pid") + "); sleep 0.2";
    run_cmd(cmd, &out);
    std::string l = read_file(log);
    ASSERT_NE(l.find(d + " committed"), std::string::npos) << l;
    EXPECT_LT(l.find(d + " committed"), l.find("step 100/200")) << "committed only by the next save:\n" << l;
    EXPECT_TRUE(committed(d)) << l;
    int rc = run_recipe(1, t / "ref.yaml",
                        std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                            "  - {id: t, uses: train-steps, after: [i], with: {steps: 50, "
                                            "save_every: 50, save_path: " + (t / "ref") + ", decay: none}}\n",
                        &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(same_tensors(d, t / "ref/step-50"), "");
}

// keep_last 2, run killed at deterministic points of the save/commit/prune sequence and at random
// moments: at every end at least 2 committed checkpoints remain, each readable whole; a run that
// completes leaves exactly the 2 newest.
TEST(CkptLifecycle, KeepLastNeverLeavesFewerThanKEvenWhenKilled) {
    Tmp t;
    std::string out, base = t / "ck";
    auto recipe = [&](int steps, bool async) {
        return std::string(HEAD) + "  - {id: l, uses: load-ckpt, with: {path: " + base +
               "/latest, if_missing: init}}\n"
               "  - {id: t, uses: train-steps, after: [l], with: " +
               train_with(steps, base, std::string(", keep_last: 2, save_overwrite: true") +
                                           (async ? ", save_async: true" : "")) +
               "}\n";
    };
    int rc = run_recipe(1, t / "r.yaml", recipe(2, false), &out);
    ASSERT_EQ(rc, 0) << out;
    ASSERT_EQ(committed_steps(base), (std::vector<int64_t>{1, 2}));
    // crash points of the save, commit and prune sequence (the 2-rank runs are ended by mpirun when one
    // rank is killed), then kills of 1-rank runs at random moments
    const char *points[] = {"save.committed",     "steps.uncommitted", "dcp.data.written", "dcp.data.item:7",
                            "dcp.meta.renamed",   "save.cleaned"};
    std::mt19937 rng(1616);
    int steps = 2, killed = 0;
    // how long a whole 3-step run takes here, to spread the random kills over it
    auto t0 = std::chrono::steady_clock::now();
    rc = run_recipe(1, t / "r.yaml", recipe(steps += 3, true), &out);
    ASSERT_EQ(rc, 0) << out;
    double whole = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int k = 0; k < 12; k++) {
        int np = k < 6 ? 1 + k % 2 : 1;
        bool async = k % 3 != 2;
        steps += 3;
        std::string crash = k < 6 ? points[k] : "";
        // the kill: SIGKILL of the (1-rank) process itself after a random delay
        std::string kill = "timeout -s KILL " + (k < 6 ? std::string("120") : std::to_string(0.05 + (rng() % 1000) / 1000.0 * whole));
        write_file(t / "k.yaml", recipe(steps, async));
        killed += run_cmd(kill + " " + launch(np, crash) + " " + (t / "k.yaml"), &out) != 0;
        std::vector<int64_t> c = committed_steps(base);
        ASSERT_GE(c.size(), 2u) << "run " << k << " (crash point \"" << crash << "\", " << kill << ", " << np
                                << " ranks) left " << c.size()
                                << " committed checkpoints\n" << out;
        for (int64_t s : c) {
            ckpt_reader *r = nullptr;
            fsdp_err err;
            std::string d = base + "/step-" + std::to_string(s);
            ASSERT_EQ(ckpt_open(d.c_str(), CKPT_AUTO, &r, &err), 0) << d << ": " << err.msg;
            size_t recs = 0;
            EXPECT_EQ(ckpt_verify(r, &recs, &err), 0) << d << ": " << err.msg;
            ckpt_close(r);
        }
    }
    std::cout << "[lifecycle] " << killed << " of 12 runs killed\n";
    EXPECT_GE(killed, 6);
    // a run that completes: exactly the 2 newest, incomplete leftovers gone
    steps += 2;
    rc = run_recipe(2, t / "k.yaml", recipe(steps, true), &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(committed_steps(base), (std::vector<int64_t>{steps - 1, steps}));
    ckpt_step_dir *v = nullptr;
    size_t n = 0;
    fsdp_err err;
    ASSERT_EQ(ckpt_steps_list(base.c_str(), &v, &n, &err), 0);
    free(v);
    EXPECT_EQ(n, 2u) << "incomplete step directories left behind";
}

// DIR/latest: the newest committed step-<N>; a newer directory without .metadata (a save killed
// before its commit) and one holding only temporaries are skipped.
TEST(CkptLifecycle, ResumeLatestSkipsIncompleteNewestDirectory) {
    for (int np : {1, 2}) {
        Tmp t;
        std::string out, base = t / "ck";
        int rc = run_recipe(np, t / "a.yaml",
                            std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                                "  - {id: t, uses: train-steps, after: [i], with: {steps: 4, "
                                                "save_every: 2, save_path: " + base + "}}\n",
                            &out);
        ASSERT_EQ(rc, 0) << out;
        // step-6: step-4's data files without .metadata; step-9: a temporary only
        mkdir((base + "/step-6").c_str(), 0755);
        mkdir((base + "/step-9").c_str(), 0755);
        for (int r = 0; r < np; r++) {
            std::string f = "/__" + std::to_string(r) + "_0.distcp";
            write_file(base + "/step-6" + f, read_file(base + "/step-4" + f));
        }
        write_file(base + "/step-9/.metadata.tmp", "partial");
        rc = run_recipe(np, t / "b.yaml",
                        std::string(HEAD) + "  - {id: l, uses: load-ckpt, with: {path: " + base + "/latest}}\n"
                                            "  - {id: t, uses: train-steps, after: [l], with: {steps: 5}}\n",
                        &out);
        ASSERT_EQ(rc, 0) << np << " ranks:\n" << out;
        EXPECT_NE(out.find(base + "/step-4 (the newest committed step)"), std::string::npos) << out;
        EXPECT_NE(out.find("training steps 5..5"), std::string::npos) << out;
        // nothing committed at all: a clear error naming the directory, before any stage runs
        rm_rf(base + "/step-2");
        rm_rf(base + "/step-4");
        rc = run_recipe(np, t / "b.yaml", read_file(t / "b.yaml"), &out);
        EXPECT_EQ(rc, 2) << out;
        EXPECT_NE(out.find(base + " holds no committed step-<N> checkpoint"), std::string::npos) << out;
    }
}

// One recipe for the first run and every restart: on a fresh directory it initialises (as init-meta
// would), on an existing one it resumes; two halves give the losses of one whole run (decay: none:
// the schedule's length is `steps`, which differs between the halves).
TEST(CkptLifecycle, LoadOrInitOnFreshThenExistingDirectory) {
    for (int np : {1, 2}) {
        Tmp t;
        std::string out, base = t / "ck";
        auto recipe = [&](int steps, const std::string &metrics) {
            return std::string(HEAD) + "  - {id: l, uses: load-ckpt, with: {path: " + base +
                   "/latest, if_missing: init}}\n"
                   "  - {id: t, uses: train-steps, after: [l], with: {steps: " + std::to_string(steps) +
                   ", save_every: 2, save_path: " + base + ", metrics: " + metrics + ", decay: none}}\n";
        };
        int rc = run_recipe(np, t / "r.yaml", recipe(2, t / "m1.jsonl"), &out);
        ASSERT_EQ(rc, 0) << out;
        EXPECT_NE(out.find("(if_missing: init)"), std::string::npos) << out;
        rc = run_recipe(np, t / "r.yaml", recipe(4, t / "m2.jsonl"), &out);
        ASSERT_EQ(rc, 0) << out;
        EXPECT_NE(out.find("(step 2)"), std::string::npos) << out;
        EXPECT_EQ(out.find("if_missing"), std::string::npos) << "initialised although step-2 exists:\n" << out;
        // the whole run in one go
        rc = run_recipe(np, t / "w.yaml",
                        std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                            "  - {id: t, uses: train-steps, after: [i], with: {steps: 4, metrics: " +
                            (t / "mw.jsonl") + ", decay: none}}\n",
                        &out);
        ASSERT_EQ(rc, 0) << out;
        std::vector<double> a = losses(t / "m1.jsonl"), b = losses(t / "m2.jsonl"), w = losses(t / "mw.jsonl");
        a.insert(a.end(), b.begin(), b.end());
        ASSERT_EQ(a.size(), 4u);
        ASSERT_EQ(w.size(), 4u);
        for (size_t i = 0; i < 4; i++) EXPECT_NEAR(a[i], w[i], 1e-6 * std::fabs(w[i])) << "step " << i + 1;
    }
}

// A periodic save never replaces an existing step-<N> silently: an error before the first step,
// naming the checkpoint; save_overwrite: true allows it.
TEST(CkptLifecycle, PeriodicSaveRefusesExistingStepUnlessTold) {
    Tmp t;
    std::string out, base = t / "ck";
    std::string r = std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                        "  - {id: t, uses: train-steps, after: [i], with: {steps: 4, save_every: 2, "
                                        "save_path: " + base;
    int rc = run_recipe(1, t / "a.yaml", r + "}}\n", &out);
    ASSERT_EQ(rc, 0) << out;
    std::string before = read_file(base + "/step-2/.metadata");
    rc = run_recipe(2, t / "a.yaml", r + "}}\n", &out);
    EXPECT_EQ(rc, 2) << out; // refused by the run's own validation, before init (issue 26 item 7)
    EXPECT_NE(out.find("would replace the checkpoint " + base + "/step-2"), std::string::npos) << out;
    EXPECT_EQ(out.find("step 1/4"), std::string::npos) << "trained before refusing:\n" << out;
    rc = run_recipe(2, t / "a.yaml", r + ", save_overwrite: true}}\n", &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(read_file(base + "/step-2/.metadata"), before) << "not replaced (2 ranks write other records)";
}

// strict: false names every parameter it did not restore and what it holds instead, in the report
// and in the log (the first 16 there, then how many more).
TEST(CkptLifecycle, NonStrictLoadListsEveryParameterNotRestored) {
    Tmp t;
    std::string out, ck = t / "ck";
    int rc = run_recipe(1, t / "s.yaml",
                        std::string(HEAD) + "  - {id: i, uses: init-meta}\n"
                                            "  - {id: s, uses: save-dcp, after: [i], with: {path: " + ck + "}}\n",
                        &out);
    ASSERT_EQ(rc, 0) << out;
    // the layers.0.* keys of the checkpoint, dropped by the load
    std::vector<std::string> dropped;
    ckpt_reader *r = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(ck.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    for (size_t i = 0; i < ckpt_count(r); i++)
        if (!strncmp(ckpt_entry_at(r, i)->name, "layers.0.", 9)) dropped.push_back(ckpt_entry_at(r, i)->name);
    ckpt_close(r);
    ASSERT_GT(dropped.size(), 2u);
    std::string load = "uses: load-ckpt, with: {path: " + ck +
                       ", strict: false, rename: {'layers.0.*.*': null, 'layers.0.*.*.*': null}}}\n";
    // after init-meta: the dropped ones keep their init values
    rc = run_recipe(1, t / "a.yaml", std::string(HEAD) + "  - {id: i, uses: init-meta}\n  - {id: l, after: [i], " + load,
                    &out, "", " --report " + (t / "rep.json"));
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(count(out, "not restored from " + ck), dropped.size()) << out;
    for (const std::string &n : dropped) {
        EXPECT_NE(out.find(n + " not restored from " + ck + "; it holds its value from before this load"),
                  std::string::npos) << n << "\n" << out;
        EXPECT_NE(read_file(t / "rep.json").find(n + ": value from before this load"), std::string::npos) << n;
    }
    // as the first stage: the dropped ones hold no value (and training refuses them)
    rc = run_recipe(1, t / "b.yaml", std::string(HEAD) + "  - {id: l, " + load, &out);
    ASSERT_EQ(rc, 0) << out;
    for (const std::string &n : dropped)
        EXPECT_NE(out.find(n + " not restored from " + ck + "; it holds no value"), std::string::npos) << n << "\n"
                                                                                                        << out;
    // every layer dropped: the log names the first 16 and counts the rest; the report names each
    std::string all = "uses: load-ckpt, with: {path: " + ck +
                      ", strict: false, rename: {'layers.*.*.*': null, 'layers.*.*.*.*': null}}}\n";
    rc = run_recipe(1, t / "c.yaml", std::string(HEAD) + "  - {id: i, uses: init-meta}\n  - {id: l, after: [i], " + all,
                    &out, "", " --report " + (t / "rep2.json"));
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(count(out, "not restored from " + ck + ";"), 16u) << out;
    EXPECT_NE(out.find("more parameters not restored from " + ck), std::string::npos) << out;
    EXPECT_NE(read_file(t / "rep2.json").find("layers.1.feed_forward"), std::string::npos);
}

// The step directories themselves: which names count, which are committed, what keep_last removes.
TEST(CkptLifecycleSteps, ListLatestAndPrune) {
    Tmp t;
    char base[4200];
    EXPECT_EQ(ckpt_steps_is_latest((t / "latest").c_str(), base, sizeof base), 1);
    EXPECT_EQ(std::string(base), t.t);
    EXPECT_EQ(ckpt_steps_is_latest("latest", base, sizeof base), 1);
    EXPECT_EQ(std::string(base), ".");
    EXPECT_EQ(ckpt_steps_is_latest((t / "step-3").c_str(), base, sizeof base), 0);
    mkdir((t / "latest").c_str(), 0755);  // a real directory of that name is a path like any other
    EXPECT_EQ(ckpt_steps_is_latest((t / "latest").c_str(), base, sizeof base), 0);
    // committed: 1 2 4 5 7; incomplete: 3 6 8; not step directories: step-01, step-x, a file step-9
    for (int s : {1, 2, 3, 4, 5, 6, 7, 8}) {
        std::string d = t / ("step-" + std::to_string(s));
        mkdir(d.c_str(), 0755);
        write_file(d + "/__0_0.distcp", "data");
        if (s != 3 && s != 6 && s != 8) write_file(d + "/.metadata", "meta");
    }
    mkdir((t / "step-01").c_str(), 0755);
    mkdir((t / "step-x").c_str(), 0755);
    write_file(t / "step-9", "a file");
    int64_t latest = 0;
    fsdp_err err;
    ASSERT_EQ(ckpt_steps_latest(t.t.c_str(), &latest, &err), 0) << err.msg;
    EXPECT_EQ(latest, 7);
    EXPECT_EQ(committed_steps(t.t), (std::vector<int64_t>{1, 2, 4, 5, 7}));
    // keep 2 after step 5 was committed: 7 (newer) and 5 are the two kept; 4, 2, 1 and the incomplete 3
    // go; the incomplete 6 and 8 are newer than 5 (a save of another run may be writing them): left
    EXPECT_EQ(ckpt_steps_prune(t.t.c_str(), 2, 5, nullptr, nullptr), 4);
    EXPECT_EQ(committed_steps(t.t), (std::vector<int64_t>{5, 7}));
    EXPECT_TRUE(exists(t / "step-6") && exists(t / "step-8") && exists(t / "step-01") && exists(t / "step-x"));
    EXPECT_FALSE(exists(t / "step-3"));
    // keep 0: nothing removed
    EXPECT_EQ(ckpt_steps_prune(t.t.c_str(), 0, 7, nullptr, nullptr), 0);
    int64_t none = 0;
    ASSERT_EQ(ckpt_steps_latest((t / "absent").c_str(), &none, &err), 0);
    EXPECT_EQ(none, -1);
    // step-010 is not the directory of step 10 (that is step-10, which does not exist)
    mkdir((t / "z").c_str(), 0755);
    mkdir((t / "z/step-010").c_str(), 0755);
    write_file(t / "z/step-010/.metadata", "meta");
    ASSERT_EQ(ckpt_steps_latest((t / "z").c_str(), &none, &err), 0);
    EXPECT_EQ(none, -1);
}
