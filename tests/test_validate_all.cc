// Issue 16 item 6: `validate` and the start of a run report every error they find, each with its
// file:line:col, and the checks that can be static are: data files, the global batch over the world
// (MPI, --nproc or SLURM_NTASKS), warmup_steps <= steps, the metrics file's directory, mixed: bf16 on
// a CPU run, a chained recipe whose model differs from the state it continues; --set errors point at
// the --set argument. (Recipes that would exhaust the machine are tests/test_harden_recipe.cc.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-valall");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

// fsdp-run without any MPI or Slurm variables of the environment the tests run in, plus `env`.
int run(const std::string &env, const std::string &args, std::string *out) {
    return run_cmd("env -u SLURM_NTASKS -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK -u PMI_RANK " + env +
                       " timeout 300 " + fsdp_run_bin() + " " + args,
                   out);
}

size_t count_lines_with(const std::string &s, const std::string &what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
    return n;
}

}  // namespace

TEST(ValidateAll, FiveIndependentMistakesAreAllReported) {
    Dir d;
    write_file(d / "plain.txt", "x");
    // 1. a misspelt stage parameter      (line 6)
    // 2. warmup longer than the run      (line 7)
    // 3. a data file that does not exist (line 3)
    // 4. a batch of 3 over 2 Slurm tasks (line 3)
    // 5. mixed: bf16 on a CPU run        (line 8)
    // 6. a metrics directory under a regular file (line 9)
    const std::string p = d / "five.yaml";
    write_file(p, "runtime: {device: cpu}\n"
                  "model: {preset: tiny}\n"
                  "data: {kind: tokens, path: " + d / "nope.bin" + ", batch_size: 3, seq_len: 8}\n"
                  "stages:\n"
                  "  - {id: i, uses: init-meta}\n"
                  "  - id: t\n    uses: train-steps\n    with: {steps: 10, warmup_step: 2,\n"
                  "           warmup_steps: 50,\n"
                  "           mixed: bf16,\n"
                  "           metrics: " + d / "plain.txt/m.jsonl" + "}\n");
    std::string out;
    EXPECT_EQ(run("SLURM_NTASKS=2", "validate " + p, &out), 2) << out;
    const std::string datacol = std::to_string(std::string("data: {kind: tokens, path: ").size() + 1);
    const std::string bcol = std::to_string(std::string("data: {kind: tokens, path: " + d / "nope.bin" + ", batch_size: ").size() + 1);
    const std::vector<std::string> expect = {
        p + ":8:23: stage 't' (train-steps): unknown parameter 'warmup_step'",
        p + ":9:26: stage 't' (train-steps): warmup_steps 50 is more than steps 10",
        p + ":3:" + datacol + ": data.path '" + d / "nope.bin" + "': no file matches",
        p + ":3:" + bcol + ": data.batch_size: the global batch of 3 does not divide evenly over 2 ranks",
        p + ":10:19: stage 't' (train-steps): mixed: bf16 is the GPU path's precision, but this run trains on the "
            "CPU (runtime.device: cpu)",
        p + ":11:21: stage 't' (train-steps): metrics: cannot create the directory " + d / "plain.txt" + " of " +
            d / "plain.txt/m.jsonl" + " at " + d / "plain.txt" + ": Not a directory",
    };
    for (const auto &e : expect) EXPECT_NE(out.find(e), std::string::npos) << "missing: " << e << "\nin:\n" << out;
    EXPECT_EQ(count_lines_with(out, p + ":"), expect.size()) << out;
    // a run stops at the same errors before anything runs (no stage starts)
    EXPECT_EQ(run("", p, &out), 2) << out;
    EXPECT_NE(out.find(expect[0]), std::string::npos) << out;
    EXPECT_NE(out.find(expect[1]), std::string::npos) << out;
    EXPECT_EQ(out.find("stage i (init-meta)"), std::string::npos) << out;
}

TEST(ValidateAll, ErrorsOfEveryStageAndEverySectionTogether) {
    Dir d;
    const std::string p = d / "many.yaml";
    write_file(p, "runtime: {threads: -2, colour: blue}\n"
                  "model: {preset: tiny}\n"
                  "data: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                  "stages:\n"
                  "  - {id: i, uses: init-meta, with: {sed: 1}}\n"
                  "  - {id: t, uses: train-steps, with: {steps: many, lr: fast}}\n"
                  "  - {id: s, uses: save-dcp}\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + p, &out), 2) << out;
    for (const char *e : {":1:24: runtime: unknown parameter 'colour'", ":5:37: stage 'i' (init-meta): unknown parameter 'sed'",
                          ":6:46: stage 't' (train-steps): parameter 'steps' expects int, got 'many'",
                          ":6:56: stage 't' (train-steps): parameter 'lr' expects float, got 'fast'",
                          ":7:5: stage 's' (save-dcp): missing required parameter 'path'",
                          ":1:20: runtime.threads: -2 is negative"})
        EXPECT_NE(out.find(p + e), std::string::npos) << "missing: " << e << "\nin:\n" << out;
}

TEST(ValidateAll, SetErrorsPointAtTheSetArgument) {
    Dir d;
    const std::string p = d / "r.yaml";
    write_file(p, "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 4}}\n");
    std::string out;
    EXPECT_EQ(run("", "validate --set stages.t.with.lr=fast --set stages.t.with.warmup_steps=9 " + p, &out), 2) << out;
    EXPECT_NE(out.find("--set 'stages.t.with.lr=fast':1:18: stage 't' (train-steps): parameter 'lr' expects float, "
                       "got 'fast'"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("--set 'stages.t.with.warmup_steps=9':1:28: stage 't' (train-steps): warmup_steps 9 is more "
                       "than steps 4"),
              std::string::npos)
        << out;
}

TEST(ValidateAll, BatchDividesOverTheSlurmTasks) {
    Dir d;
    const std::string p = d / "r.yaml";
    write_file(p, "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 4, seq_len: 8}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 4}}\n");
    std::string out;
    EXPECT_EQ(run("SLURM_NTASKS=3", "validate " + p, &out), 2) << out;
    EXPECT_NE(out.find(p + ":2:37: data.batch_size: the global batch of 4 does not divide evenly over 3 ranks"),
              std::string::npos)
        << out;
    EXPECT_EQ(run("SLURM_NTASKS=2", "validate " + p, &out), 0) << out;
    EXPECT_EQ(run("", "validate " + p, &out), 0) << out;
}

TEST(ValidateAll, MetricsDirectoryIsCreatedByTheRun) {
    Dir d;
    const std::string m = d / "runs/a/b/metrics.jsonl";
    const std::string p = d / "r.yaml";
    write_file(p, "runtime: {device: cpu}\nmodel: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 2, metrics: " +
                      m + "}}\n");
    std::string out;
    // validate creates nothing
    EXPECT_EQ(run("", "validate " + p, &out), 0) << out;
    EXPECT_FALSE(exists(d / "runs"));
    // before: "cannot open ... No such file or directory" after init
    EXPECT_EQ(run("", "-q " + p, &out), 0) << out;
    EXPECT_EQ(count_lines_with(read_file(m), "\"step\""), 2u) << read_file(m);
}

TEST(ValidateAll, MixedBf16OnTheCpuPath) {
    Dir d;
    const std::string p = d / "r.yaml";
    write_file(p, "runtime: {device: cpu}\nmodel: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n"
                  "  - {id: t, uses: train-steps, with: {steps: 2, mixed: bf16}}\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + p, &out), 2) << out;
    EXPECT_NE(out.find(p + ":6:56: stage 't' (train-steps): mixed: bf16 is the GPU path's precision"), std::string::npos)
        << out;
    // mixed: none, and bf16 on device auto under validate (the run's host decides), are fine
    write_file(p, "runtime: {device: auto}\nmodel: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n"
                  "  - {id: t, uses: train-steps, with: {steps: 2, mixed: none}}\n");
    EXPECT_EQ(run("", "validate " + p, &out), 0) << out;
}

TEST(ValidateAll, ChainedRecipeWithAnotherModelThanItsState) {
    Dir d;
    write_file(d / "a.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n");
    write_file(d / "b.yaml", "model: {preset: tiny, dim: 128}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                             "stages:\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + d / "a.yaml " + d / "b.yaml", &out), 2) << out;
    EXPECT_NE(out.find(d / "b.yaml:1:8: model: {preset: tiny, dim: 128} differs from the model {preset: tiny} of " +
                       d / "a.yaml:1:8, whose state this recipe continues"),
              std::string::npos)
        << out;
    // the same model, or none (it continues the earlier one), or its own init: valid
    write_file(d / "c.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                             "stages:\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    EXPECT_EQ(run("", "validate " + d / "a.yaml " + d / "c.yaml", &out), 0) << out;
    write_file(d / "e.yaml", "model: {preset: tiny, dim: 128}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                             "stages:\n  - {id: i2, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    EXPECT_EQ(run("", "validate " + d / "a.yaml " + d / "e.yaml", &out), 0) << out;
}

TEST(ValidateAll, TransformGlobsThatMatchNothing) {
    // before: found only at run time, after init ("the keys match no parameter")
    Dir d;
    const std::string p = d / "t.yaml";
    write_file(p, "model: {preset: tiny}\n"
                  "stages:\n  - {id: i, uses: init-cpu}\n"
                  "  - id: x\n    uses: transform\n    with:\n      ops:\n"
                  "        - {copy: {from: output.weight, to: tok_embeddings.weight}}\n"
                  "        - {scale: {keys: 'layers.*.attention.wq.weight', by: 0.5}}\n"
                  "        - {fill: {keys: [layers.*.feed_forward.w9.weight, nope.*], value: 0}}\n"
                  "        - {copy: {from: output.weight, to: 'tok_embedings.weight'}}\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + p, &out), 2) << out;
    EXPECT_NE(out.find(p + ":10:25: stage 'x' (transform): fill keys matches no parameter of the model"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(p + ":11:44: stage 'x' (transform): copy target matches no parameter of the model"),
              std::string::npos)
        << out;
    EXPECT_EQ(count_lines_with(out, p + ":"), 2u) << out;  // the first two ops match
}

// Issue 26 item 1: a recipe without `model:` whose stages declare one is refused by `validate` (and by the
// run, before any stage), at the stage, saying what to add.
TEST(ValidateAll, ARecipeWithoutAModelIsRefusedAtTheStageThatDeclaresIt) {
    Dir d;
    write_file(d / "t.txt", std::string(4096, 'a'));
    write_file(d / "r.yaml", "data: {kind: text, path: t.txt, batch_size: 2, seq_len: 16}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + d / "r.yaml", &out), 2) << out;
    EXPECT_NE(out.find(d / "r.yaml" + ":3:19: stage 'i' (init-meta) declares the model from the recipe's `model:` "
                       "section, and the recipe has none: add one, e.g. `model: {arch: llama3, preset: debugmodel}`"),
              std::string::npos)
        << out;
    EXPECT_EQ(run("", "-q " + d / "r.yaml", &out), 2) << out;
    EXPECT_NE(out.find("stage 'i' (init-meta) declares the model"), std::string::npos) << out;
    EXPECT_EQ(out.find("model.dim must be > 0"), std::string::npos) << out;
    // a load-ckpt that declares it, the same
    write_file(d / "l.yaml", "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + d.d + "}}\n");
    EXPECT_EQ(run("", "validate " + d / "l.yaml", &out), 2) << out;
    EXPECT_NE(out.find("stage 'l' (load-ckpt) declares the model"), std::string::npos) << out;
}

// Issue 26 item 6: warmup_steps past the schedule is one error, not two messages for the same mistake.
TEST(ValidateAll, WarmupPastTheScheduleIsReportedOnce) {
    Dir d;
    write_file(d / "t.txt", std::string(4096, 'a'));
    for (const std::string with : {"steps: 10, warmup_steps: 20", "steps: 10, schedule_steps: 15, warmup_steps: 20"}) {
        write_file(d / "r.yaml", "model: {preset: tiny}\ndata: {kind: text, path: t.txt, batch_size: 2, seq_len: 16}\n"
                                 "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {" +
                                     with + "}}\n");
        std::string out;
        EXPECT_EQ(run("", "validate " + d / "r.yaml", &out), 2) << out;
        EXPECT_EQ(count_lines_with(out, "warmup_steps"), 1u) << with << ": " << out;
        EXPECT_NE(out.find("stage 't' (train-steps): warmup_steps 20 is more than"), std::string::npos) << out;
    }
}

// Issue 26 item 2: a load-ckpt path that nothing provides is refused before any stage runs (a path an
// earlier stage writes is not); a run directory given for a checkpoint names the steps it holds.
TEST(ValidateAll, LoadCkptPathsThatNothingProvides) {
    Dir d;
    auto recipe = [&](const std::string &load) {
        write_file(d / "r.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + d / "out" + "}}\n"
                                 "  - {id: l, uses: load-ckpt, with: {path: " + load + "}}\n");
        return d / "r.yaml";
    };
    std::string out;
    EXPECT_EQ(run("", "validate " + recipe(d / "nothere"), &out), 2) << out;
    EXPECT_NE(out.find(d / "r.yaml:5:43: stage 'l' (load-ckpt): path " + d / "nothere" +
                       " does not exist and no stage of the recipe writes it"),
              std::string::npos)
        << out;
    EXPECT_EQ(run("", "-q " + recipe(d / "nothere"), &out), 2) << out;
    EXPECT_FALSE(exists(d / "out")) << out; // refused before the save ran
    // written by an earlier stage (itself, or its latest step): valid
    EXPECT_EQ(run("", "validate " + recipe(d / "out"), &out), 0) << out;
    // a run directory: its steps named, and what to load
    ASSERT_EQ(system(("mkdir -p " + d / "run/step-10" + " " + d / "run/step-20" + " " + d / "empty").c_str()), 0);
    write_file(d / "run/step-10/.metadata", "x");
    EXPECT_EQ(run("", "validate " + recipe(d / "run"), &out), 2) << out;
    EXPECT_NE(out.find("path " + d / "run" + " is a run directory, not a checkpoint: it holds step-10, step-20 "
                       "(not committed: no .metadata): load " + d / "run/step-10" + " (a step) or " + d / "run/latest" +
                       " (the newest committed)"),
              std::string::npos)
        << out;
    EXPECT_EQ(run("", "validate " + recipe(d / "run/latest"), &out), 0) << out;
    EXPECT_EQ(run("", "validate " + recipe(d / "empty/latest"), &out), 2) << out;
    EXPECT_NE(out.find("holds no committed step-<N> checkpoint"), std::string::npos) << out;
}

// Issue 26 item 9: an unknown name (stage parameter, stage, preset, model or data key) says which known
// name it is nearest to.
TEST(ValidateAll, UnknownNamesSayTheNearestKnownOne) {
    Dir d;
    write_file(d / "t.txt", std::string(4096, 'a'));
    write_file(d / "r.yaml", "model: {preset: llama3_8bb}\n"
                             "data: {kind: text, path: t.txt, batch_size: 2, seq_len: 16, seqlen: 3}\n"
                             "stages:\n  - {id: i, uses: init-mta}\n"
                             "  - {id: t, uses: train-steps, with: {steps: 1, warmup_step: 2, zzzz: 1}}\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + d / "r.yaml", &out), 2) << out;
    for (const char *want : {"unknown preset 'llama3_8bb': did you mean 'llama3_8b'? (known: ",
                             "data: unknown key 'seqlen': did you mean 'seq_len'? (expected ",
                             "unknown stage 'init-mta': did you mean 'init-meta'? (registered stages: ",
                             "unknown parameter 'warmup_step': did you mean 'warmup_steps'? (known: ",
                             "unknown parameter 'zzzz' (known: "})
        EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
    write_file(d / "m.yaml", "model: {preset: tiny, n_layer: 2}\nstages: [{id: i, uses: init-meta}]\n");
    EXPECT_EQ(run("", "validate " + d / "m.yaml", &out), 2) << out;
    EXPECT_NE(out.find("model: unknown key 'n_layer': did you mean 'n_layers'? (known: "), std::string::npos) << out;
}

// Issue 26 item 7: a periodic save that would replace an existing step-<N> is refused by `validate` (and
// before init by a run) when the training starts at step 0, not only when train-steps starts.
TEST(ValidateAll, PeriodicSaveOntoAnExistingStepIsRefusedBeforeInit) {
    Dir d;
    write_file(d / "t.txt", std::string(4096, 'a'));
    ASSERT_EQ(system(("mkdir -p " + d / "ck/step-4" + " " + d / "ck/step-3").c_str()), 0);
    write_file(d / "ck/step-4/.metadata", "x");
    write_file(d / "ck/step-3/.metadata", "x"); // not a step this run saves
    auto recipe = [&](const std::string &extra) {
        write_file(d / "r.yaml", "model: {preset: tiny}\ndata: {kind: text, path: t.txt, batch_size: 2, seq_len: 16}\n"
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 4, save_every: 2, save_path: " +
                                     d / "ck" + extra + "}}\n");
        return d / "r.yaml";
    };
    std::string out;
    EXPECT_EQ(run("", "validate " + recipe(""), &out), 2) << out;
    EXPECT_NE(out.find("stage 't' (train-steps): the periodic save of step 4 would replace the checkpoint " +
                       d / "ck/step-4" + "; resume from it (load-ckpt path: " + d / "ck/latest" +
                       "), choose another save_path, or set save_overwrite: true"),
              std::string::npos)
        << out;
    EXPECT_EQ(run("", "-q " + recipe(""), &out), 2) << out; // before init-meta runs
    EXPECT_EQ(run("", "validate " + recipe(", save_overwrite: true"), &out), 0) << out;
    write_file(d / "r.yaml", "model: {preset: tiny}\ndata: {kind: text, path: t.txt, batch_size: 2, seq_len: 16}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: t, uses: train-steps, with: {steps: 3, save_every: 2, save_path: " +
                                 d / "ck" + "}}\n");
    EXPECT_EQ(run("", "validate " + d / "r.yaml", &out), 0) << out; // saves step-2 only
}

// Issue 26 item 10: --dry-run prints the model as resolved (dims, FFN width, parameter count) and the
// memory rank 0 needs, the figures of the memory check.
TEST(ValidateAll, DryRunPrintsTheResolvedModelAndTheMemoryPerRank) {
    Dir d;
    write_file(d / "t.txt", std::string(4096, 'a'));
    write_file(d / "r.yaml", "model: {preset: tiny, dim: 128, n_layers: 4, n_heads: 8, n_kv_heads: 4, max_seq_len: 128}\n"
                             "data: {kind: text, path: t.txt, batch_size: 8, seq_len: 128}\n"
                             "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    std::string out;
    EXPECT_EQ(run("", "--dry-run " + d / "r.yaml", &out), 0) << out;
    EXPECT_NE(out.find("  model (resolved): llama3 (preset tiny): dim 128, 4 layers, 8 heads (4 kv, head_dim 16), "
                       "ffn 352, vocab 256, max_seq_len 128\n"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("  parameters: 803968 (803968 on rank 0 of 1)\n"), std::string::npos) << out;
    EXPECT_NE(out.find("  memory of rank 0, stage 't' (train-steps): parameters 3.2 MB, gradients 3.2 MB, optimizer "
                       "6.4 MB (AdamW, 2 moments), activations and buffers "),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("(8 x 128 tokens, 1 micro-batch): "), std::string::npos) << out;
    // two ranks: half the parameters each, half the batch
    EXPECT_EQ(run("SLURM_NTASKS=2", "--dry-run " + d / "r.yaml", &out), 0) << out;
    EXPECT_NE(out.find("  parameters: 803968 (401984 on rank 0 of 2)\n"), std::string::npos) << out;
    EXPECT_NE(out.find("(4 x 128 tokens, 1 micro-batch): "), std::string::npos) << out;
}

// Issue 26 item 9, continued: an unknown top-level key and an undefined variable say the nearest known name.
TEST(ValidateAll, UnknownTopLevelKeysAndVariablesSayTheNearest) {
    Dir d;
    write_file(d / "r.yaml", "modle: {preset: tiny}\nstages: [{id: i, uses: init-meta}]\n");
    std::string out;
    EXPECT_EQ(run("", "validate " + d / "r.yaml", &out), 2) << out;
    EXPECT_NE(out.find("unknown top-level key 'modle': did you mean 'model'? (expected one of: "), std::string::npos)
        << out;
    write_file(d / "v.yaml", "vars: {out_dir: x}\nmodel: {preset: tiny}\n"
                             "stages: [{id: i, uses: init-meta}, {id: s, uses: save-dcp, with: {path: \"${outdir}\"}}]\n");
    EXPECT_EQ(run("", "validate " + d / "v.yaml", &out), 2) << out;
    EXPECT_NE(out.find("undefined variable '${outdir}': did you mean 'out_dir'? (defined in vars: out_dir)"),
              std::string::npos)
        << out;
    // the same for a key given with --set
    write_file(d / "s.yaml", "model: {preset: tiny}\nstages: [{id: i, uses: init-meta}]\n");
    EXPECT_EQ(run("", "validate " + d / "s.yaml --set runtim.device=cpu", &out), 2) << out;
    EXPECT_NE(out.find("--set runtim.device=cpu: unknown top-level key 'runtim': did you mean 'runtime'? (expected one "
                       "of: version, "),
              std::string::npos)
        << out;
}

// The structural errors of a recipe together (issue 42): an unknown stage kind, an unknown `after:` id and both of
// two keys of another schedule in one validate, each at its place; with the ids known, the cycle beside the kind.
TEST(ValidateAll, StructuralErrorsComeTogether) {
    Dir d;
    std::string p = d / "s.yaml", out;
    const std::string head = "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\nstages:\n"
                             "  - {id: a, uses: init-meta, after: [c]}\n  - {id: b, uses: no-such-stage}\n";
    const std::string tail = "  - {id: e, uses: train-steps, after: [a], with: {steps: 2, decay: cosine, decay_ratio: 0.1, "
                             "min_lr_factor: 0.1}}\n";
    write_file(p, head + "  - {id: c, uses: save-dcp, after: [a, zz], with: {path: " + (d / "x") + "}}\n" + tail);
    EXPECT_EQ(run("", "validate " + p, &out), 2) << out;
    EXPECT_NE(out.find("s.yaml:5:19: stage 'b': unknown stage 'no-such-stage'"), std::string::npos) << out;
    EXPECT_NE(out.find("s.yaml:6:40: stage 'c': after: unknown stage id 'zz'"), std::string::npos) << out;
    EXPECT_NE(out.find("decay_ratio is a key of the wsd schedule"), std::string::npos) << out;
    EXPECT_NE(out.find("min_lr_factor is a key of the wsd schedule"), std::string::npos) << out;
    write_file(p, head + "  - {id: c, uses: save-dcp, after: [a], with: {path: " + (d / "x") + "}}\n" + tail);
    EXPECT_EQ(run("", "validate " + p, &out), 2) << out;
    EXPECT_NE(out.find("unknown stage 'no-such-stage'"), std::string::npos) << out;
    EXPECT_NE(out.find("s.yaml:4:5: cycle in the stage graph (each stage runs after the next): a -> c -> a"),
              std::string::npos) << out;
    // five kinds at once: an unknown kind, an unknown after: id, a stage after itself, a cycle, a duplicate id,
    // and keys of another schedule, each at its place, from one validate
    write_file(p, head + "  - {id: c, uses: save-dcp, after: [a, zz], with: {path: " + (d / "x") + "}}\n"
                         "  - {id: f, uses: verify, after: [f]}\n  - {id: b, uses: verify}\n" + tail);
    EXPECT_EQ(run("", "validate " + p, &out), 2) << out;
    for (const char *want : {"s.yaml:5:19: stage 'b': unknown stage 'no-such-stage'",
                             "s.yaml:6:40: stage 'c': after: unknown stage id 'zz'",
                             "s.yaml:7:35: stage 'f': after: names the stage itself",
                             "s.yaml:4:5: cycle in the stage graph (each stage runs after the next): a -> c -> a",
                             "s.yaml:8:10: duplicate stage id 'b' (first used at line 5)",
                             "decay_ratio is a key of the wsd schedule", "min_lr_factor is a key of the wsd schedule"})
        EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

// A run validation refuses leaves the file system as it was: not even the metrics directory.
TEST(ValidateAll, ARefusedRunCreatesNothing) {
    Dir d;
    const std::string m = d / "runs/a/metrics.jsonl", p = d / "r.yaml";
    write_file(p, "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\nstages:\n"
                  "  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 2, lr: fast, metrics: " + m +
                      "}}\n  - {id: s, uses: save-dcp, after: [t], with: {path: " + (d / "runs/ck") + "}}\n");
    std::string out;
    EXPECT_EQ(run("", "-q " + p, &out), 2) << out;
    EXPECT_FALSE(exists(d / "runs")) << out;
}

// A message names the knob the user turns: the recipe var that gives a stage's overwrite (the Bagel recipe's
// `overwrite: "${overwrite}"`), else the key.
TEST(ValidateAll, AnExistingOutputNamesTheVarThatGivesOverwrite) {
    Dir d;
    std::string out, ck = d / "ck";
    write_file(d / "a.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: s, uses: save-dcp, with: {path: " + ck + "}}\n");
    ASSERT_EQ(run("", "-q " + (d / "a.yaml"), &out), 0) << out;
    EXPECT_EQ(run("", "validate " + (d / "a.yaml"), &out), 2) << out;
    EXPECT_NE(out.find("already holds a checkpoint: set overwrite: true to replace it"), std::string::npos) << out;
    write_file(d / "b.yaml", "vars: {ow: false}\nmodel: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: s, uses: save-dcp, with: {path: " + ck + ", overwrite: \"${ow}\"}}\n");
    EXPECT_EQ(run("", "validate " + (d / "b.yaml"), &out), 2) << out;
    EXPECT_NE(out.find("already holds a checkpoint: pass --set vars.ow=true (the recipe's var for overwrite)"),
              std::string::npos) << out;
    EXPECT_EQ(run("", "validate --set vars.ow=true " + (d / "b.yaml"), &out), 0) << out;
}

// Any error at a value a recipe var gives whole names the var, the knob the user turns (issue 42 item 6):
// a bad default in vars: and a bad --set of it, each error at its place, both together.
TEST(ValidateAll, AnErrorAtAVarsValueNamesTheVar) {
    Dir d;
    std::string out;
    write_file(d / "v.yaml", "vars: {steps: many, lr: 1e-3}\nmodel: {preset: tiny}\n"
                             "data: {kind: synthetic, batch_size: 4, seq_len: 16}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: t, uses: train-steps, with: {steps: \"${steps}\", lr: \"${lr}\"}}\n");
    EXPECT_EQ(run("", "validate --set vars.lr=fast " + (d / "v.yaml"), &out), 2) << out;
    EXPECT_NE(out.find("parameter 'steps' expects int, got 'many' (this value is the recipe's var steps: --set "
                       "vars.steps=... changes it)"), std::string::npos) << out;
    EXPECT_NE(out.find("parameter 'lr' expects float, got 'fast' (this value is the recipe's var lr: --set vars.lr=... "
                       "changes it)"), std::string::npos) << out;
    EXPECT_EQ(run("", "validate --set vars.steps=5 " + (d / "v.yaml"), &out), 0) << out;
}
