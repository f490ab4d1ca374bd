// DAG scheduling, execution, chaining, failures and the run report.
#include <gtest/gtest.h>

#include <jansson.h>

#include "pipeline_fixture.h"

using namespace fsdp_test;

TEST(Dag, TopologicalOrderTiesBrokenByFileOrder) {
    RecipeDir d;
    std::string trace = d.path("trace.txt");
    std::string p = d.put("t.yaml",
                          "vars: {trace: " + trace + "}\nstages:\n"
                          "  - {id: late, uses: t-init, after: [mid]}\n"
                          "  - {id: first, uses: t-init, after: []}\n"
                          "  - {id: mid, uses: t-init, after: [first]}\n"
                          "  - {id: other, uses: t-init, after: []}\n"
                          "  - {id: last, uses: t-train, after: [late, other], with: {steps: 1}}\n");
    CliResult r = cli({p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_EQ(read_file(trace), "first\nmid\nlate\nother\nlast\n");
}

TEST(Dag, FailingStageStopsRunAndReportsSkipped) {
    RecipeDir d;
    std::string trace = d.path("trace.txt"), report = d.path("report.json");
    std::string p = d.put("f.yaml",
                          "name: failing\nvars: {trace: " + trace + "}\nstages:\n"
                          "  - {id: a, uses: t-init, with: {seed: 11}}\n"
                          "  - {id: boom, uses: t-fail, with: {why: disk on fire}}\n"
                          "  - {id: c, uses: t-train, with: {steps: 2}}\n");
    CliResult r = cli({"--report", report, p});
    EXPECT_EQ(r.rc, 1) << r.log;
    EXPECT_EQ(read_file(trace), "a\nboom\n");
    EXPECT_NE(r.log.find("stage boom (t-fail) failed: t-fail: disk on fire"), std::string::npos) << r.log;
    json_error_t je;
    json_t *j = json_load_file(report.c_str(), 0, &je);
    ASSERT_TRUE(j) << je.text;
    EXPECT_STREQ(json_string_value(json_object_get(j, "status")), "failed");
    EXPECT_EQ(json_integer_value(json_object_get(j, "exit_code")), 1);
    json_t *st = json_object_get(j, "stages");
    ASSERT_EQ(json_array_size(st), 3u);
    EXPECT_STREQ(json_string_value(json_object_get(json_array_get(st, 0), "status")), "ok");
    EXPECT_EQ(json_real_value(json_object_get(json_object_get(json_array_get(st, 0), "metrics"), "seed")), 11.0);
    json_t *boom = json_array_get(st, 1);
    EXPECT_STREQ(json_string_value(json_object_get(boom, "status")), "failed");
    EXPECT_STREQ(json_string_value(json_object_get(boom, "stage")), "t-fail");
    EXPECT_STREQ(json_string_value(json_object_get(boom, "error")), "t-fail: disk on fire");
    EXPECT_EQ(json_real_value(json_object_get(json_object_get(boom, "metrics"), "before_failure")), 1.0);
    EXPECT_STREQ(json_string_value(json_object_get(json_array_get(st, 2), "status")), "skipped");
    json_decref(j);
}

TEST(Dag, ReportOnSuccess) {
    RecipeDir d;
    std::string report = d.path("report.json");
    std::string p = d.put("ok.yaml",
                          "name: good\nstages:\n  - {id: i, uses: t-init}\n  - {id: t, uses: t-train, with: {steps: 4, lr: 0.5}}\n");
    CliResult r = cli({"--report", report, p});
    ASSERT_EQ(r.rc, 0) << r.log;
    json_error_t je;
    json_t *j = json_load_file(report.c_str(), 0, &je);
    ASSERT_TRUE(j) << je.text;
    EXPECT_STREQ(json_string_value(json_object_get(j, "status")), "ok");
    EXPECT_STREQ(json_string_value(json_object_get(json_array_get(json_object_get(j, "recipes"), 0), "name")), "good");
    EXPECT_TRUE(json_is_string(json_object_get(j, "start_time")));
    EXPECT_TRUE(json_is_string(json_object_get(j, "end_time")));
    json_t *st = json_object_get(j, "stages");
    ASSERT_EQ(json_array_size(st), 2u);
    json_t *t = json_array_get(st, 1);
    EXPECT_STREQ(json_string_value(json_object_get(t, "id")), "t");
    EXPECT_STREQ(json_string_value(json_object_get(t, "stage")), "t-train");
    EXPECT_STREQ(json_string_value(json_object_get(t, "status")), "ok");
    EXPECT_GE(json_real_value(json_object_get(t, "seconds")), 0.0);
    EXPECT_EQ(json_real_value(json_object_get(json_object_get(t, "metrics"), "steps")), 4.0);
    EXPECT_EQ(json_real_value(json_object_get(json_object_get(t, "metrics"), "lr")), 0.5);
    EXPECT_STREQ(json_string_value(json_object_get(json_object_get(json_array_get(st, 0), "metrics"), "note")),
                 "initialised");
    EXPECT_EQ(json_object_get(t, "error"), nullptr);
    json_decref(j);
}

TEST(Dag, ChainingTwoRecipesSharesState) {
    RecipeDir d;
    std::string trace = d.path("trace.txt"), report = d.path("report.json");
    std::string a = d.put("a.yaml", "name: boot\nvars: {trace: " + trace + "}\nstages:\n  - {id: init, uses: t-init}\n");
    // b needs params, which only recipe a provides: valid only when chained after a
    std::string b = d.put("b.yaml",
                          "name: train\nvars: {trace: " + trace + "}\nstages:\n  - {id: train, uses: t-train, with: {steps: 1}}\n");
    CliResult alone = cli({"validate", b});
    EXPECT_EQ(alone.rc, 2);
    EXPECT_NE(alone.log.find("needs 'params'"), std::string::npos) << alone.log;
    CliResult r = cli({"--report", report, a, b});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_EQ(read_file(trace), "init\ntrain\n");
    json_error_t je;
    json_t *j = json_load_file(report.c_str(), 0, &je);
    ASSERT_TRUE(j);
    EXPECT_EQ(json_array_size(json_object_get(j, "recipes")), 2u);
    EXPECT_STREQ(json_string_value(json_object_get(json_array_get(json_object_get(j, "stages"), 1), "recipe")), "train");
    json_decref(j);
}

TEST(Dag, NothingRunsWhenLaterRecipeIsInvalid) {
    RecipeDir d;
    std::string trace = d.path("trace.txt");
    std::string a = d.put("a.yaml", "vars: {trace: " + trace + "}\nstages:\n  - {id: init, uses: t-init}\n");
    std::string b = d.put("b.yaml", "stages:\n  - {id: t, uses: t-train}\n");  // missing steps
    CliResult r = cli({a, b});
    EXPECT_EQ(r.rc, 2);
    EXPECT_FALSE(exists(trace));
}

TEST(Dag, DryRunPrintsPlanAndRunsNothing) {
    RecipeDir d;
    std::string trace = d.path("trace.txt");
    std::string p = d.put("p.yaml", "vars: {trace: " + trace + "}\nstages:\n  - {id: i, uses: t-init}\n"
                                    "  - {id: t, uses: t-train, with: {steps: 2}}\n");
    CliResult r = cli({"--dry-run", p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_FALSE(exists(trace));
    EXPECT_NE(r.out.find("1. i (t-init)\n     with: {seed: 7}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2. t (t-train) after i\n     with: {steps: 2, lr: 1e-3, mode: fast, flag: false, betas: [0.9, 0.95]}"),
              std::string::npos)
        << r.out;
}

TEST(Cli, UsageErrorsExitTwo) {
    EXPECT_EQ(cli({}).rc, 2);
    EXPECT_EQ(cli({"--bogus", "x.yaml"}).rc, 2);
    EXPECT_EQ(cli({"--dry-run"}).rc, 2);
    CliResult h = cli({"--help"});
    EXPECT_EQ(h.rc, 0);
    EXPECT_NE(h.out.find("usage: fsdp-run"), std::string::npos);
    CliResult v = cli({"--version"});
    EXPECT_EQ(v.rc, 0);
    EXPECT_NE(v.out.find("fsdp-run " FSDP_VERSION_STRING), std::string::npos);
}

TEST(Cli, StagesListsParametersAndJson) {
    CliResult r = cli({"stages"});
    ASSERT_EQ(r.rc, 0);
    EXPECT_NE(r.out.find("t-train  test train"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("mode             string = fast (fast|exact)  mode"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("steps            int    required  number of steps"), std::string::npos) << r.out;
    CliResult j = cli({"stages", "--json"});
    ASSERT_EQ(j.rc, 0);
    json_error_t je;
    json_t *arr = json_loads(j.out.c_str(), 0, &je);
    ASSERT_TRUE(json_is_array(arr)) << je.text;
    json_t *train = json_array_get(arr, 1);
    EXPECT_STREQ(json_string_value(json_object_get(train, "name")), "t-train");
    EXPECT_STREQ(json_string_value(json_array_get(json_object_get(train, "needs"), 0)), "params");
    json_t *p0 = json_array_get(json_object_get(train, "params"), 0);
    EXPECT_STREQ(json_string_value(json_object_get(p0, "type")), "int");
    EXPECT_TRUE(json_is_true(json_object_get(p0, "required")));
    json_decref(arr);
}
