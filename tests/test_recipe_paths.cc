// Relative paths in a recipe (README "Relative paths"): an input resolves against the directory of the
// file that names it (the recipe or an included file), else the working directory; --set values and
// paths a stage of the run writes are the working directory's. Data is checked only when a stage reads it.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "pipeline_fixture.h"

using namespace fsdp_test;

namespace {

std::string abs_path(const std::string &p) {
    char buf[PATH_MAX];
    return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// `fsdp-run ARGS` run from directory `dir`; its output and exit status.
int run_in(const std::string &dir, const std::string &args, std::string *out) {
    return run_cmd("cd '" + dir + "' && " + abs_path(fsdp_run_bin()) + " " + args + " 2>&1", out);
}

}  // namespace

TEST(RecipePaths, ShippedRecipesValidateFromAnyDirectory) {
    RecipeDir elsewhere;
    std::string root = abs_path(".");
    for (const char *r : {"quickstart.yaml", "export_safetensors.yaml", "train_resume.yaml", "llama_train.yaml",
                          "llama_bootstrap.yaml", "reshard.yaml"}) {
        std::string out;
        EXPECT_EQ(run_in(elsewhere.dir, "validate " + root + "/recipes/" + r, &out), 0) << r << ": " << out;
        EXPECT_EQ(run_in(root, "validate recipes/" + std::string(r), &out), 0) << r << ": " << out;
    }
}

TEST(RecipePaths, InputsResolveBesideTheFileThatNamesThemThenTheWorkingDirectory) {
    RecipeDir d, cwd;
    ASSERT_EQ(system(("mkdir -p '" + d.path("sub") + "' '" + d.path("ck") + "'").c_str()), 0);
    write_file(d.path("sub/tok.txt"), std::string(4096, 'a'));
    d.put("sub/inc.yaml", "data: {kind: text, path: tok.txt, batch_size: 2, seq_len: 16}\n");
    std::string r = d.put("r.yaml", "include: [sub/inc.yaml]\nmodel: {preset: tiny}\nruntime: {device: cpu}\n"
                                    "stages:\n  - {id: i, uses: init-meta}\n"
                                    "  - {id: t, uses: train-steps, with: {steps: 1}}\n"
                                    "  - {id: s, uses: save-dcp, with: {path: ck, overwrite: true}}\n"
                                    "  - {id: l, uses: load-ckpt, with: {path: ck}}\n"
                                    "  - {id: l2, uses: load-ckpt, with: {path: sub}}\n");
    std::string out;
    // the data path of the included file resolves beside it, from any working directory
    ASSERT_EQ(run_in(cwd.dir, "validate " + r, &out), 0) << out;
    ASSERT_EQ(run_in(cwd.dir, "--dry-run " + r, &out), 0) << out;
    EXPECT_NE(out.find("path: " + d.path("sub/tok.txt")), std::string::npos) << out;
    // an input beside the recipe resolves there; one a stage of the run writes stays the working directory's
    EXPECT_NE(out.find("with: {path: " + d.path("sub") + ","), std::string::npos) << out;
    EXPECT_NE(out.find("with: {path: ck, format"), std::string::npos) << out;
    // a --set value resolves against the working directory only, also through a ${var}
    EXPECT_EQ(run_in(cwd.dir, "validate " + r + " --set data.path=tok.txt", &out), 2) << out;
    EXPECT_NE(out.find("data.path 'tok.txt': no file matches"), std::string::npos) << out;
    std::string v = d.put("v.yaml", "include: [sub/inc.yaml]\nmodel: {preset: tiny}\nvars: {p: sub/tok.txt}\n"
                                    "data: {path: \"${p}\"}\nstages:\n  - {id: i, uses: init-meta}\n"
                                    "  - {id: t, uses: train-steps, with: {steps: 1}}\n");
    EXPECT_EQ(run_in(cwd.dir, "validate " + v, &out), 0) << out;
    EXPECT_EQ(run_in(cwd.dir, "validate " + v + " --set vars.p=sub/tok.txt", &out), 2) << out;
    write_file(cwd.path("tok2.txt"), std::string(4096, 'b'));
    EXPECT_EQ(run_in(cwd.dir, "validate " + v + " --set vars.p=tok2.txt", &out), 0) << out;
}

TEST(RecipePaths, DataIsCheckedOnlyWhenAStageReadsIt) {
    RecipeDir d;
    std::string r = d.put("r.yaml", "model: {preset: tiny}\n"
                                    "data: {kind: text, path: nowhere.txt, batch_size: 2, seq_len: 16}\n"
                                    "stages:\n  - {id: i, uses: init-meta}\n"
                                    "  - {id: s, uses: save-safetensors, with: {path: " + d.path("o.safetensors") +
                                    "}}\n");
    std::string out;
    EXPECT_EQ(run_in(d.dir, "validate " + r, &out), 0) << out;
    std::string t = d.put("t.yaml", "model: {preset: tiny}\n"
                                    "data: {kind: text, path: nowhere.txt, batch_size: 2, seq_len: 16}\n"
                                    "stages:\n  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps}\n");
    EXPECT_EQ(run_in(d.dir, "validate " + t, &out), 2) << out;
    EXPECT_NE(out.find("data.path 'nowhere.txt': no file matches"), std::string::npos) << out;
}
