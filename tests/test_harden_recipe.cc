// Issue 13, the recipe halves of items 4, 5 and 7: recipes cannot expand without bound (YAML
// aliases, ${var} chains, include fan-out and depth), loading is not quadratic in the recipe's size,
// and sizes from recipes (model, data, threads, memory) are validated before anything is allocated.
// Everything goes through the fsdp-run binary, as a user runs it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "test_util.h"

extern "C" {
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {

struct Dir {
    std::string dir = make_tmpdir("fsdp-hrecipe");
    ~Dir() { rm_rf(dir); }
    std::string put(const std::string &name, const std::string &text) const {
        write_file(dir + "/" + name, text);
        return dir + "/" + name;
    }
};

struct Result {
    int rc = -1;
    std::string out;
    long peak_rss_kib = -1; // the child's peak resident memory
};

// Runs `fsdp-run validate PATH` (under `timeout`, so that a run that would not end fails the test
// instead) in a child of a fresh process, whose RUSAGE_CHILDREN then holds that run's peak memory.
Result validate(const std::string &path, const std::string &extra = "", int timeout_s = 120) {
    Result r;
    std::string outdir = make_tmpdir("fsdp-hrecipe-out"), outp = outdir + "/out.txt";
    std::string cmd = "timeout " + std::to_string(timeout_s) + " " + fsdp_run_bin() + " validate " + extra + " '" +
                      path + "'";
#ifndef __SANITIZE_ADDRESS__
    // without the fixes some of these would take every byte of the machine: cap the address space
    // (ASan reserves terabytes of it, so not there)
    cmd = "ulimit -v 4000000; " + cmd;
#endif
    const char *c_cmd = cmd.c_str(), *c_out = outp.c_str();
    int fds[2];
    if (pipe(fds)) return r;
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        pid_t g = fork();
        if (g == 0) {
            int fd = open(c_out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execl("/bin/sh", "sh", "-c", c_cmd, (char *)nullptr);
            _exit(127);
        }
        int st = 0;
        waitpid(g, &st, 0);
        struct rusage ru;
        getrusage(RUSAGE_CHILDREN, &ru);
        long v[2] = {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), ru.ru_maxrss};
        ssize_t w = write(fds[1], v, sizeof v);
        _exit(w == (ssize_t)sizeof v ? 0 : 1);
    }
    close(fds[1]);
    long v[2] = {-1, -1};
    ssize_t n = read(fds[0], v, sizeof v);
    close(fds[0]);
    int st;
    waitpid(child, &st, 0);
    if (n == (ssize_t)sizeof v) {
        r.rc = (int)v[0];
        r.peak_rss_kib = v[1];
    }
    r.out = read_file(outp);
    rm_rf(outdir);
    return r;
}

const char *STAGE = "model: {preset: tiny}\nstages: [{id: a, uses: init-meta}]\n";

std::string repeat(const std::string &s, int n, const std::string &sep = ", ") {
    std::string out;
    for (int i = 0; i < n; i++) out += (i ? sep : "") + s;
    return out;
}

// vars v1..vn: v1 = "f32", v(i) = "${v(i-1)}"; the stage reads ${vn}.
std::string var_chain(int n) {
    std::string t = "vars:\n  v1: f32\n";
    for (int i = 2; i <= n; i++) t += "  v" + std::to_string(i) + ": \"${v" + std::to_string(i - 1) + "}\"\n";
    return t + "stages:\n  - {id: a, uses: init-meta, with: {dtype: \"${v" + std::to_string(n) + "}\"}}\n" +
           "model: {preset: tiny}\n";
}

} // namespace

// ---- item 4: unbounded expansion ------------------------------------------------------------------

TEST(HardenRecipeExpansion, BillionLaughsStopsAtTheBoundWithLittleMemory) {
    // 10 copies of the level below per level, 9 levels: 10^9 values (before: out of memory)
    Dir d;
    std::string t = "vars:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i < 9; i++)
        t += "  l" + std::to_string(i) + ": &l" + std::to_string(i) + " [" +
             repeat("*l" + std::to_string(i - 1), 10) + "]\n";
    std::string p = d.put("laughs.yaml", t + STAGE);
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    // l1..l4 copy 123440 values, each alias of l5 111111 more: the 8th (line 7, column 47) crosses 10^6
    EXPECT_NE(r.out.find(p + ":7:47: the recipe expands to more than 1000000 values (YAML aliases: '*l4' copies "
                             "111111 values at each use, 901217 copied before it)"),
              std::string::npos)
        << r.out;
    // what was copied before the bound: about a million small values, far below a gigabyte
    EXPECT_GT(r.peak_rss_kib, 0);
    EXPECT_LT(r.peak_rss_kib, 1024L * 1024) << "peak RSS " << r.peak_rss_kib << " KiB";
}

TEST(HardenRecipeExpansion, AliasCopiesUpToTheBoundStillValidate) {
    // an anchor of 1001 values used 999 times copies 999999 values: valid; 1000 times: one too many
    Dir d;
    std::string anchor = "vars:\n  a: &a [" + repeat("x", 1000) + "]\n";
    std::string ok = d.put("ok.yaml", anchor + "  b: [" + repeat("*a", 999) + "]\n" + STAGE);
    Result r = validate(ok);
    EXPECT_EQ(r.rc, 0) << r.out;
    std::string bad = d.put("bad.yaml", anchor + "  b: [" + repeat("*a", 1000) + "]\n" + STAGE);
    r = validate(bad);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(bad + ":3:" + std::to_string(7 + 4 * 999) + ": the recipe expands to more than 1000000 values"),
              std::string::npos)
        << r.out;
}

TEST(HardenRecipeExpansion, AliasesCannotNestPastTheDepthBound) {
    // a is 40 lists deep; b puts *a inside 40 more: 2 + 40 + 40 levels, past the bound of 64
    Dir d;
    std::string open(40, '['), close(40, ']');
    std::string p = d.put("deep.yaml", "vars:\n  a: &a " + open + "x" + close + "\n  b: " + open + "*a" + close +
                                           "\n" + STAGE);
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":3:46: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("nesting deeper than 64 levels (through YAML alias '*a')"), std::string::npos) << r.out;
}

TEST(HardenRecipeExpansion, VarChainStopsAtTheLengthBound) {
    // v(i) is ten copies of v(i-1): 10^16 bytes at v16 (before: out of memory after minutes)
    Dir d;
    std::string t = "vars:\n  v0: xxxxxxxxxx\n";
    for (int i = 1; i <= 16; i++)
        t += "  v" + std::to_string(i) + ": \"" + repeat("${v" + std::to_string(i - 1) + "}", 10, "") + "\"\n";
    std::string p = d.put("chain.yaml", t + "stages:\n  - {id: a, uses: init-meta, with: {dtype: \"${v16}\"}}\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    // v6 would be 10^7 bytes: the error is at its definition (line 8)
    EXPECT_NE(r.out.find(p + ":8:7: substituting variables makes a value longer than 1048576 bytes (at '${v5}')"),
              std::string::npos)
        << r.out;
    EXPECT_LT(r.peak_rss_kib, 1024L * 1024) << "peak RSS " << r.peak_rss_kib << " KiB";
}

TEST(HardenRecipeExpansion, VarWorkIsBoundedAcrossTheRecipe) {
    // one variable of 1 MiB - 1 byte (within the per-value bound), used by 80 stages: 80 MiB in all
    Dir d;
    std::string t = "vars:\n  big: " + std::string((1 << 20) - 1, 'y') + "\nstages:\n";
    for (int i = 0; i < 80; i++)
        t += "  - {id: s" + std::to_string(i) + ", uses: init-meta, with: {dtype: \"${big}\"}}\n";
    std::string p = d.put("work.yaml", t);
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("substituting variables produces more than 67108864 bytes in all"), std::string::npos)
        << r.out;
}

TEST(HardenRecipeExpansion, VarChainDeeperThan16IsNotACycle) {
    Dir d;
    // 16 variables deep: valid
    std::string ok = d.put("ok.yaml", var_chain(16));
    Result r = validate(ok);
    EXPECT_EQ(r.rc, 0) << r.out;
    for (int n : {17, 40}) {
        std::string p = d.put("deep" + std::to_string(n) + ".yaml", var_chain(n));
        r = validate(p);
        EXPECT_EQ(r.rc, 2) << r.out;
        EXPECT_NE(r.out.find("variables nested deeper than 16: ${v"), std::string::npos) << n << ": " << r.out;
        EXPECT_EQ(r.out.find("refers to itself"), std::string::npos) << n << ": " << r.out;
    }
    // whatever the order of the definitions: the nesting, not the resolution order, counts
    std::string rev = "vars:\n";
    for (int i = 17; i >= 2; i--) rev += "  v" + std::to_string(i) + ": \"${v" + std::to_string(i - 1) + "}\"\n";
    rev += "  v1: f32\n";
    std::string p = d.put("rev.yaml", rev + STAGE);
    r = validate(p);
    EXPECT_NE(r.out.find("variables nested deeper than 16: ${v17} -> ${v16} -> "), std::string::npos) << r.out;
    // a real cycle still refers to itself
    p = d.put("cycle.yaml", "vars: {a: \"${b}\", b: \"x${c}\", c: \"${a}\"}\n" + std::string(STAGE));
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("variable '${a}' refers to itself: ${a} -> ${b} -> ${c} -> ${a}"), std::string::npos)
        << r.out;
}

TEST(HardenRecipeExpansion, ListVariableInsideAStringIsAnErrorNotACrash) {
    // before: a segfault (strlen of NULL) resolving c
    Dir d;
    std::string p = d.put("list.yaml", "vars: {b: [1, 2], a: \"${b}\", c: \"x${a}\"}\n" + std::string(STAGE));
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1:33: variable '${a}' is a list or map and can only stand alone as a value"),
              std::string::npos)
        << r.out;
}

TEST(HardenRecipeExpansion, IncludeFanOutIsBounded) {
    // f0 includes f1 ten times, f1 includes f2 ten times, ...: 10^8 loads (before: ran forever)
    Dir d;
    for (int i = 0; i < 8; i++)
        d.put("f" + std::to_string(i) + ".yaml",
              "include: [" + repeat("f" + std::to_string(i + 1) + ".yaml", 10) + "]\n");
    d.put("f8.yaml", "vars: {leaf: 1}\n");
    std::string top = d.put("top.yaml", "include: [f0.yaml]\n" + std::string(STAGE));
    Result r = validate(top, "", 60);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("the recipe's includes load more than 256 files in all"), std::string::npos) << r.out;
    // three per level over four levels: 3 + 9 + 27 + 81 = 120 loads, valid
    for (int i = 0; i < 3; i++)
        d.put("g" + std::to_string(i) + ".yaml",
              "include: [" + repeat("g" + std::to_string(i + 1) + ".yaml", 3) + "]\n");
    d.put("g3.yaml", "vars: {leaf: 1}\n");
    std::string ok = d.put("ok.yaml", "include: [" + repeat("g0.yaml", 3) + "]\n" + std::string(STAGE));
    r = validate(ok);
    EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(HardenRecipeExpansion, IncludeChainDeeperThan16) {
    // i(k) includes i(k+1): the top recipe plus 16 nested includes is valid, 17 is not
    Dir d;
    for (int k = 1; k <= 16; k++)
        d.put("i" + std::to_string(k) + ".yaml", "include: [i" + std::to_string(k + 1) + ".yaml]\n");
    d.put("i17.yaml", "vars: {leaf: 1}\n"); // the chain ends at i17
    std::string top16 = d.put("top16.yaml", "include: [i2.yaml]\n" + std::string(STAGE));
    Result r = validate(top16);
    EXPECT_EQ(r.rc, 0) << r.out; // top16 -> i2 -> ... -> i17: 16 nested includes
    std::string top17 = d.put("top17.yaml", "include: [i1.yaml]\n" + std::string(STAGE));
    r = validate(top17);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(d.dir + "/i16.yaml:1:11: includes nested deeper than 16 (including 'i17.yaml')"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("cycle"), std::string::npos) << r.out;
    // a real cycle is still a cycle
    d.put("c1.yaml", "include: [c2.yaml]\n");
    d.put("c2.yaml", "include: [c1.yaml]\n");
    std::string cyc = d.put("cyc.yaml", "include: [c1.yaml]\n" + std::string(STAGE));
    r = validate(cyc);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("include cycle: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("refers to itself through its includes"), std::string::npos) << r.out;
}

// ---- item 5: no quadratic step --------------------------------------------------------------------

TEST(HardenRecipeScale, MillionKeyMapKeepsPositions) {
    // 10^6 keys (before: over an hour of linear key lookups); errors still name line and column
    Dir d;
    std::string keys;
    keys.reserve(20u << 20);
    for (int i = 0; i < 1000000; i++) keys += "  k" + std::to_string(i) + ": " + std::to_string(i) + "\n";
    std::string p = d.put("unknown.yaml", "vars:\n" + keys + STAGE + "bogus: 1\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1000004:1: unknown top-level key 'bogus'"), std::string::npos) << r.out;
    p = d.put("dup.yaml", "vars:\n" + keys + "  k999999: again\n" + STAGE);
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1000002:3: duplicate key 'k999999'"), std::string::npos) << r.out;
    p = d.put("ok.yaml", "vars:\n" + keys + STAGE);
    r = validate(p);
    EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(HardenRecipeScale, HundredThousandStagesPlan) {
    // a chain of 10^5 stages (before: two n^2 matrices, 20 GB, and an n^3 topological sort)
    Dir d;
    std::string t = "stages:\n  - {id: s0, uses: init-meta}\n";
    for (int i = 1; i < 100000; i++) t += "  - {id: s" + std::to_string(i) + ", uses: save-dcp, with: {path: x}}\n";
    std::string p = d.put("stages.yaml", t + "model: {preset: tiny}\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 0) << r.out.substr(0, 2000);
    EXPECT_NE(r.out.find("valid (recipe stages, 100000 stages: s0 -> s1 -> s2"), std::string::npos)
        << r.out.substr(0, 2000);
    // a cycle through the whole chain is still found and printed from where it closes
    p = d.put("cycle.yaml", "stages:\n  - {id: s0, uses: init-meta, after: [s99999]}\n" + t.substr(t.find("\n  - {id: s1,") + 1));
    r = validate(p);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.out.find(p + ":2:5: cycle in the stage graph (each stage runs after the next): s0 -> s99999 -> "
                             "s99998"),
              std::string::npos)
        << r.out.substr(0, 2000);
}

// ---- item 7: sizes from recipes -------------------------------------------------------------------

TEST(HardenRecipeSizes, ModelLargerThanTheHostIsAValidationError) {
    Dir d;
    std::string p = d.put("big.yaml", "runtime: {device: cpu}\nmodel: {preset: debugmodel, dim: 1048576}\n"
                                      "stages:\n  - {id: init, uses: init-cpu}\n  - {id: shard, uses: shard}\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    // 6 layers of dim 2^20 with FFN 2796288 and vocab 2048: 79170756411392 parameters
    EXPECT_NE(r.out.find(p + ":2:34: model.dim: the model needs "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" for parameters on rank 0 (stage 'shard' (shard) holds the whole model and rank 0's shard "
                         "of it while it scatters: 79170756411392 + 79170756411392 parameters as float32), this host "
                         "has "),
              std::string::npos)
        << r.out;
    // training it: parameters, gradients and AdamW moments
    p = d.put("train.yaml", "runtime: {device: cpu}\nmodel: {preset: debugmodel, dim: 1048576}\n"
                            "data: {kind: synthetic, batch_size: 8, seq_len: 64}\n"
                            "stages:\n  - {id: init, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":2:34: model.dim: the model needs 1.4 PB for parameters, gradients and optimizer state "
                             "on rank 0 (stage 't' (train-steps): 16 bytes for each of the 79170756411392 parameters"),
              std::string::npos)
        << r.out;
}

TEST(HardenRecipeSizes, ActivationsThatDoNotFitBlameTheBatch) {
    // a small model with a sequence of 2^30 tokens: hundreds of terabytes of activations
    Dir d;
    std::string p = d.put("act.yaml", "runtime: {device: cpu}\nmodel: {preset: debugmodel, max_seq_len: 1073741824}\n"
                                      "data: {kind: synthetic, batch_size: 1, seq_len: 1073741824}\n"
                                      "stages:\n  - {id: init, uses: init-meta}\n"
                                      "  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":3:49: data.seq_len: the model needs "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("of gathered weights, activations and scratch for 1 x 1073741824 tokens), this host has "),
              std::string::npos)
        << r.out;
}

TEST(HardenRecipeSizes, SeqLenBounds) {
    Dir d;
    std::string p = d.put("s32.yaml", "data: {kind: synthetic, seq_len: 4294967296}\n" + std::string(STAGE));
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1:34: data.seq_len: 4294967296 is more than 2147483647 (2^31 - 1)"), std::string::npos)
        << r.out;
    p = d.put("max.yaml", "runtime: {device: cpu}\nmodel: {preset: tiny}\ndata: {kind: synthetic, seq_len: 65}\n"
                          "stages:\n  - {id: init, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":3:34: data.seq_len: 65 is more than model.max_seq_len 64"), std::string::npos) << r.out;
    p = d.put("tokens.yaml", "runtime: {device: cpu}\nmodel: {preset: debugmodel}\n"
                             "data: {kind: synthetic, batch_size: 65536, seq_len: 65536}\n"
                             "stages:\n  - {id: init, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":3:53: data: batch_size 65536 over 1 ranks x seq_len 65536 is 4294967296 tokens per "
                             "rank, more than 2147483647"),
              std::string::npos)
        << r.out;
}

TEST(HardenRecipeSizes, ThreadsAndModelKeyBounds) {
    Dir d;
    std::string p = d.put("t.yaml", "runtime: {threads: 100000000}\n" + std::string(STAGE));
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1:20: runtime.threads: 100000000 OpenMP threads per rank is more than 4096"),
              std::string::npos)
        << r.out;
    p = d.put("neg.yaml", "runtime: {threads: -3}\n" + std::string(STAGE));
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1:20: runtime.threads: -3 is negative"), std::string::npos) << r.out;
    p = d.put("m.yaml", "model: {preset: tiny, dim: 2097152, n_layers: 100000}\nstages: [{id: a, uses: init-meta}]\n");
    r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1:28: model.dim: 2097152 is more than 1048576"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + ":1:47: model.n_layers: 100000 is more than 65536"), std::string::npos) << r.out;
}

TEST(HardenRecipeSizes, EveryErrorIsReported) {
    Dir d;
    std::string p = d.put("all.yaml", "runtime: {device: cpu, threads: 100000000}\n"
                                      "model: {preset: debugmodel, dim: 1048576}\n"
                                      "data: {kind: synthetic, seq_len: 4294967296}\n"
                                      "stages:\n  - {id: init, uses: init-cpu}\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(p + ":1:33: runtime.threads: 100000000"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + ":3:34: data.seq_len: 4294967296 is more than 2147483647"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + ":2:34: model.dim: the model needs "), std::string::npos) << r.out;
}

TEST(HardenRecipeSizes, RecipesNearTheBoundsValidate) {
    Dir d;
    std::string p = d.put("near.yaml", "runtime: {device: cpu, threads: 4096}\n"
                                       "model: {preset: tiny, n_layers: 3}\n"
                                       "data: {kind: synthetic, batch_size: 4, seq_len: 64}\n"
                                       "stages:\n  - {id: init, uses: init-cpu}\n  - {id: shard, uses: shard}\n"
                                       "  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    Result r = validate(p);
    EXPECT_EQ(r.rc, 0) << r.out;
    for (const char *rec : {"recipes/quickstart.yaml", "recipes/llama_bootstrap.yaml", "recipes/llama_train.yaml"}) {
        r = validate(rec);
        EXPECT_EQ(r.rc, 0) << rec << ": " << r.out;
    }
}

TEST(HardenRecipeSizes, OutOfMemoryNamesTheRealCount) {
#ifdef __SANITIZE_ADDRESS__
    GTEST_SKIP() << "ASan aborts on a calloc that overflows instead of returning NULL";
#else
    // before: "out of memory allocating huge (0 floats)": the count was read after the parameter was cleared
    fsdp_state *s = static_cast<fsdp_state *>(calloc(1, sizeof(fsdp_state)));
    ASSERT_NE(s, nullptr);
    s->layout = STATE_SHARDED;
    s->world = 1;
    const int64_t shape[2] = {int64_t(1) << 40, int64_t(1) << 20};
    fsdp_err err;
    fsdp_err_clear(&err);
    EXPECT_EQ(state_add_param(s, "huge", 2, shape, -1, &err), FSDP_E_NOMEM);
    EXPECT_STREQ(err.msg, "out of memory allocating huge (1152921504606846976 floats)");
    EXPECT_EQ(s->n, 0u);
    state_free(s);
#endif
}
