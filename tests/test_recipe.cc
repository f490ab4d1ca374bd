// Recipe engine: parsing, includes, variables, overrides and every validation error with
// its file:line:column.
#include <gtest/gtest.h>

#include "pipeline_fixture.h"

using namespace fsdp_test;

namespace {

std::string validate_err(RecipeDir &d, const std::string &text, int *rc = nullptr) {
    std::string p = d.put("r.yaml", text);
    CliResult r = cli({"validate", p});
    if (rc) *rc = r.rc;
    EXPECT_EQ(r.rc, 2) << r.out << r.log;
    return r.log;
}

}  // namespace

TEST(Recipe, ValidRecipePrintsOrder) {
    RecipeDir d;
    std::string p = d.put("ok.yaml",
                          "version: 1\nname: demo\nstages:\n"
                          "  - {id: a, uses: t-init}\n"
                          "  - {id: b, uses: t-train, with: {steps: 3}}\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("valid (recipe demo, 2 stages: a -> b)"), std::string::npos) << r.out;
}

TEST(Recipe, SyntaxErrorHasPosition) {
    RecipeDir d;
    std::string log = validate_err(d, "version: 1\nstages:\n  - id: a\n    uses: [t-init\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":5:1: YAML syntax error"), std::string::npos) << log;
}

TEST(Recipe, UnknownTopLevelKey) {
    RecipeDir d;
    std::string log = validate_err(d, "version: 1\nstagez: []\nstages:\n  - {id: a, uses: t-init}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":2:1: unknown top-level key 'stagez'"), std::string::npos) << log;
}

TEST(Recipe, DuplicateId) {
    RecipeDir d;
    std::string log = validate_err(d, "stages:\n  - {id: a, uses: t-init}\n  - {id: a, uses: t-init}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:10: duplicate stage id 'a'"), std::string::npos) << log;
}

TEST(Recipe, MissingId) {
    RecipeDir d;
    std::string log = validate_err(d, "stages:\n  - {id: a, uses: t-init}\n  - uses: t-init\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:5: stages[1]: missing `id`"), std::string::npos) << log;
}

TEST(Recipe, UnknownStage) {
    RecipeDir d;
    std::string log = validate_err(d, "stages:\n  - id: a\n    uses: no-such-stage\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:11: stage 'a': unknown stage 'no-such-stage'"), std::string::npos)
        << log;
    EXPECT_NE(log.find("t-init"), std::string::npos) << log;  // lists what is registered
}

TEST(Recipe, UnknownWithKey) {
    RecipeDir d;
    std::string log =
        validate_err(d, "stages:\n  - id: a\n    uses: t-init\n  - id: b\n    uses: t-train\n    with:\n"
                        "      steps: 2\n      stepz: 3\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":8:7: stage 'b' (t-train): unknown parameter 'stepz'"),
              std::string::npos)
        << log;
}

TEST(Recipe, MistypedWithValues) {
    RecipeDir d;
    const char *head = "stages:\n  - {id: a, uses: t-init}\n  - id: b\n    uses: t-train\n    with:\n";
    struct Case {
        std::string body, expect;
    } cases[] = {
        {"      steps: many\n", ":6:14: stage 'b' (t-train): parameter 'steps' expects int, got 'many'"},
        {"      steps: 1.5\n", ":6:14: stage 'b' (t-train): parameter 'steps' expects int, got '1.5'"},
        {"      steps: 1\n      lr: fast\n", ":7:11: stage 'b' (t-train): parameter 'lr' expects float, got 'fast'"},
        {"      steps: 1\n      flag: maybe\n", ":7:13: stage 'b' (t-train): parameter 'flag' expects bool"},
        {"      steps: 1\n      betas: 0.9\n", ":7:14: stage 'b' (t-train): parameter 'betas' expects list"},
        {"      steps: 1\n      opts: [1]\n", ":7:13: stage 'b' (t-train): parameter 'opts' expects map, got a list"},
        {"      steps: 1\n      name: {a: 1}\n", ":7:13: stage 'b' (t-train): parameter 'name' expects string"},
        {"      steps: 1\n      mode: slow\n",
         ":7:13: stage 'b' (t-train): parameter 'mode' must be one of: fast, exact (got 'slow')"},
        {"      lr: 0.1\n", ":3:5: stage 'b' (t-train): missing required parameter 'steps' (int: number of steps)"},
    };
    for (auto &c : cases) {
        std::string log = validate_err(d, head + c.body);
        EXPECT_NE(log.find(d.path("r.yaml") + c.expect), std::string::npos) << c.body << "\n" << log;
    }
}

TEST(Recipe, AfterUnknownId) {
    RecipeDir d;
    std::string log = validate_err(d, "stages:\n  - {id: a, uses: t-init}\n  - {id: b, uses: t-init, after: [a, zz]}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:38: stage 'b': after: unknown stage id 'zz'"), std::string::npos)
        << log;
}

TEST(Recipe, CycleIsPrinted) {
    RecipeDir d;
    std::string log = validate_err(d,
                                   "stages:\n  - {id: a, uses: t-init, after: [c]}\n"
                                   "  - {id: b, uses: t-init, after: [a]}\n  - {id: c, uses: t-init, after: [b]}\n");
    EXPECT_NE(log.find(":2:5: cycle in the stage graph"), std::string::npos) << log;
    EXPECT_NE(log.find("a -> c -> b -> a"), std::string::npos) << log;
    std::string self = validate_err(d, "stages:\n  - {id: a, uses: t-init, after: [a]}\n");
    EXPECT_NE(self.find(":2:35: stage 'a': after: names the stage itself"), std::string::npos) << self;
}

TEST(Recipe, UndefinedVariable) {
    RecipeDir d;
    std::string log = validate_err(d, "vars: {x: 1}\nstages:\n  - id: a\n    uses: t-init\n    with: {seed: \"${y}\"}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":5:18: undefined variable '${y}' (defined in vars: x)"), std::string::npos)
        << log;
}

TEST(Recipe, StateContractNamesStageAndState) {
    RecipeDir d;
    std::string log = validate_err(d, "stages:\n  - {id: a, uses: t-init, after: []}\n  - id: t\n    uses: t-train\n"
                                      "    after: []\n    with: {steps: 1}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":4:11: stage 't' (t-train) needs 'params', which no upstream stage provides"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("stages that provide it: t-init, t-train"), std::string::npos) << log;
}

TEST(Recipe, VariablesSubstituteEverywhereAndReferenceEachOther) {
    RecipeDir d;
    std::string p = d.put("v.yaml",
                          "vars: {base: /data, out: \"${base}/run\", n: 5, list: [1, 2]}\n"
                          "stages:\n  - {id: a, uses: t-init, with: {seed: \"${n}\"}}\n"
                          "  - {id: b, uses: t-train, with: {steps: \"${n}\", name: \"${out}/x $${literal}\", betas: \"${list}\"}}\n");
    CliResult r = cli({"--dry-run", p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("with: {seed: 5}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("steps: 5"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("name: \"/data/run/x ${literal}\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("betas: [1, 2]"), std::string::npos) << r.out;
    std::string loop = d.put("loop.yaml", "vars: {a: \"${b}\", b: \"${a}\"}\nstages:\n  - {id: a, uses: t-init}\n");
    CliResult r2 = cli({"validate", loop});
    EXPECT_EQ(r2.rc, 2);
    EXPECT_NE(r2.log.find("refers to itself"), std::string::npos) << r2.log;
}

TEST(Recipe, EnvironmentVariablesWithDefaults) {
    RecipeDir d;
    setenv("FSDP_TEST_ENV_DIR", "/scratch/job7", 1);
    unsetenv("FSDP_TEST_ENV_UNSET");
    std::string p = d.put("e.yaml",
                          "vars: {out: \"${env:FSDP_TEST_ENV_DIR}/ckpt\"}\n"
                          "stages:\n  - {id: a, uses: t-init, with: {seed: \"${env:FSDP_TEST_ENV_UNSET:-11}\"}}\n"
                          "  - {id: b, uses: t-train, with: {steps: 2, name: \"${out}/r${env:FSDP_TEST_ENV_UNSET:-0}\"}}\n");
    CliResult r = cli({"--dry-run", p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("with: {seed: 11}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("name: /scratch/job7/ckpt/r0"), std::string::npos) << r.out;
    std::string log = validate_err(d, "stages:\n  - id: a\n    uses: t-init\n    with: {seed: \"${env:FSDP_TEST_ENV_UNSET}\"}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":4:18: environment variable FSDP_TEST_ENV_UNSET is not set"),
              std::string::npos)
        << log;
    log = validate_err(d, "stages:\n  - id: a\n    uses: t-init\n    with: {seed: \"${env:9BAD}\"}\n");
    EXPECT_NE(log.find("bad environment variable name '9BAD'"), std::string::npos) << log;
    unsetenv("FSDP_TEST_ENV_DIR");
}

TEST(Recipe, SetOverridesAnyKey) {
    RecipeDir d;
    std::string p = d.put("s.yaml",
                          "vars: {n: 2}\nmodel: {preset: tiny, dim: 64}\nstages:\n  - {id: a, uses: t-init}\n"
                          "  - {id: b, uses: t-train, with: {steps: \"${n}\"}}\n");
    CliResult r = cli({"--dry-run", "--set", "vars.n=9", "--set", "model.dim=128", "--set", "stages.b.with.lr=0.5",
                       "--set=stages.a.with.seed=3", "--set", "vars.extra.deep=[1, 2]", "--set", "stages.1.with.mode=exact",
                       p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("model: {preset: tiny, dim: 128}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("vars: {n: 9, extra: {deep: [1, 2]}}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("with: {seed: 3}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("with: {steps: 9, lr: 0.5, mode: exact"), std::string::npos) << r.out;
    // a mistyped override is reported like a recipe error
    CliResult bad = cli({"validate", "--set", "stages.b.with.steps=lots", p});
    EXPECT_EQ(bad.rc, 2);
    EXPECT_NE(bad.log.find("--set 'stages.b.with.steps=lots':1:21: stage 'b' (t-train): parameter 'steps' expects int, got 'lots'"),
              std::string::npos)
        << bad.log;
    CliResult nokey = cli({"validate", "--set", "stages.zz.with.steps=1", p});
    EXPECT_EQ(nokey.rc, 2);
    EXPECT_NE(nokey.log.find("no recipe has a stage"), std::string::npos) << nokey.log;
    CliResult top = cli({"validate", "--set", "bogus.x=1", p});
    EXPECT_EQ(top.rc, 2);
    EXPECT_NE(top.log.find("unknown top-level key 'bogus'"), std::string::npos) << top.log;
    CliResult noeq = cli({"validate", "--set", "model.dim", p});
    EXPECT_EQ(noeq.rc, 2);
    EXPECT_NE(noeq.log.find("expected KEY=VALUE"), std::string::npos) << noeq.log;
}

TEST(Recipe, IncludesMergeLaterKeysWin) {
    RecipeDir d;
    d.put("common/base.yaml",
          "");  // directory must exist first
    system(("mkdir -p " + d.dir + "/common").c_str());
    d.put("common/base.yaml",
          "model: {preset: tiny, dim: 64, n_layers: 2}\nruntime: {seed: 1}\nvars: {n: 4}\nstages:\n"
          "  - {id: init, uses: t-init, with: {seed: 1}}\n  - {id: train, uses: t-train, with: {steps: \"${n}\"}}\n");
    d.put("common/more.yaml", "model: {n_layers: 3}\n");
    std::string p = d.put("top.yaml",
                          "include: [common/base.yaml, common/more.yaml]\nname: top\nmodel: {dim: 32}\n"
                          "stages:\n  - {id: train, with: {lr: 0.25}}\n  - {id: extra, uses: t-init, after: [train]}\n");
    CliResult r = cli({"--dry-run", p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("model: {preset: tiny, dim: 32, n_layers: 3}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("runtime: {seed: 1"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2. train (t-train) after init\n     with: {steps: 4, lr: 0.25"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("3. extra (t-init) after train"), std::string::npos) << r.out;
}

TEST(Recipe, IncludeCycleDetected) {
    RecipeDir d;
    d.put("a.yaml", "include: [b.yaml]\nstages:\n  - {id: a, uses: t-init}\n");
    d.put("b.yaml", "include: c.yaml\n");
    d.put("c.yaml", "include: [a.yaml]\n");
    CliResult r = cli({"validate", d.path("a.yaml")});
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.log.find(d.path("c.yaml") + ":1:11: include cycle:"), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("a.yaml -> "), std::string::npos) << r.log;
    CliResult miss = cli({"validate", d.put("m.yaml", "include: [nope.yaml]\nstages: [{id: a, uses: t-init}]\n")});
    EXPECT_EQ(miss.rc, 2);
    EXPECT_NE(miss.log.find(d.path("m.yaml") + ":1:11: cannot include"), std::string::npos) << miss.log;
}

TEST(Recipe, StructuralErrors) {
    RecipeDir d;
    EXPECT_NE(validate_err(d, "version: 2\nstages: [{id: a, uses: t-init}]\n").find(":1:10: version: expected 1"),
              std::string::npos);
    EXPECT_NE(validate_err(d, "stages: {id: a}\n").find(":1:9: stages: expected a list"), std::string::npos);
    EXPECT_NE(validate_err(d, "name: x\n").find("has no `stages:` list"), std::string::npos);
    EXPECT_NE(validate_err(d, "stages:\n  - {id: a, uses: t-init, wiht: {}}\n").find(":2:27: unknown stage key 'wiht'"),
              std::string::npos);
    EXPECT_NE(validate_err(d, "runtime: {device: tpu}\nstages: [{id: a, uses: t-init}]\n")
                  .find(":1:19: runtime: parameter 'device' must be one of: auto, cpu, cuda"),
              std::string::npos);
    EXPECT_NE(validate_err(d, "a: 1\na: 2\n").find(":2:1: duplicate key 'a'"), std::string::npos);
    CliResult missing = cli({"validate", d.path("does-not-exist.yaml")});
    EXPECT_EQ(missing.rc, 2);
    EXPECT_NE(missing.log.find("cannot open recipe"), std::string::npos) << missing.log;
}

TEST(Recipe, ImplicitAfterIsThePreviousStage) {
    RecipeDir d;
    std::string p = d.put("o.yaml",
                          "stages:\n  - {id: z, uses: t-init}\n  - {id: y, uses: t-init, after: []}\n"
                          "  - {id: x, uses: t-init}\n  - {id: w, uses: t-init, after: [x]}\n");
    CliResult r = cli({"validate", p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("z -> y -> x -> w"), std::string::npos) << r.out;
}

TEST(Recipe, ModelAndDataSectionsAreValidatedBeforeRunning) {
    RecipeDir d;
    std::string log = validate_err(d, "model: {preset: tiny, dim: 65}\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find(":1:8: model.dim (65) must be divisible by model.n_heads (4)"), std::string::npos) << log;
    log = validate_err(d, "model: {preset: nope}\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find("unknown preset 'nope'"), std::string::npos) << log;
    log = validate_err(d, "data: {kind: text}\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find("data: kind text needs a `path`"), std::string::npos) << log;
    log = validate_err(d, "data: {kind: synthetic, batch: 3}\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find("data: unknown key 'batch'"), std::string::npos) << log;
}
