// `when:` on list items (stages, model parts, nested lists) and `choices:` of vars: evaluation, the
// DAG around removed stages, --set, the dry-run and report listings, and every error's position.
#include <gtest/gtest.h>

#include <jansson.h>

#include <algorithm>

#include "pipeline_fixture.h"

using namespace fsdp_test;

namespace {

// s as a YAML double-quoted scalar.
std::string dq(const std::string &s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o + "\"";
}

// Whether stage b of a two-stage recipe survives `when: COND` (validate lists the stages it keeps).
bool keeps(const std::string &cond) {
    RecipeDir d;
    std::string p = d.put("c.yaml", "stages:\n  - {id: a, uses: t-init}\n  - {id: b, uses: t-init, when: " + dq(cond) +
                                        "}\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 0) << cond << "\n" << r.log;
    if (r.out.find("2 stages: a -> b)") != std::string::npos) return true;
    EXPECT_NE(r.out.find("1 stages: a; not run (when: false): b)"), std::string::npos) << cond << "\n" << r.out;
    return false;
}

std::string validate_log(RecipeDir &d, const std::string &text, std::vector<std::string> sets = {}) {
    std::string p = d.put("r.yaml", text);
    std::vector<std::string> args = {"validate"};
    for (auto &s : sets) {
        args.push_back("--set");
        args.push_back(s);
    }
    args.push_back(p);
    CliResult r = cli(args);
    EXPECT_EQ(r.rc, 2) << r.out << r.log;
    return r.log;
}

CliResult dry_run(const std::string &path, std::vector<std::string> sets = {}) {
    std::vector<std::string> args = {"--dry-run"};
    for (auto &s : sets) {
        args.push_back("--set");
        args.push_back(s);
    }
    args.push_back(path);
    return cli(args);
}

// stage b's `when:` value is at 6:11
const char *kBlockHead = "stages:\n  - id: a\n    uses: t-init\n  - id: b\n    uses: t-init\n    when: ";

}  // namespace

TEST(RecipeWhen, BooleansAndEveryOperator) {
    struct Case {
        const char *cond;
        bool keep;
    } cases[] = {
        {"true", true},           {"false", false},         {"yes", true},           {"Off", false},
        {"a == a", true},         {"a == b", false},        {"a != b", true},        {"a != a", false},
        {"b in [a, b, c]", true}, {"d in [a, b]", false},   {"x in []", false},      {"1 in [0x1, 1.0]", true},
        {"True == true", true},   {"yes == on", true},      {"true == 1", false},    {"no != false", false},
        {"1e-4 == 0.0001", true}, {"1 == 1.0", true},       {"2 != 2.000", false},   {"1.0 == 1.0x", false},
        {"'a b' == 'a b'", true}, {"\"a b\" == 'a b'", true}, {"'' == \"\"", true},  {"'' != x", true},
        {"'not' in ['not', x]", true}, {"'a' == a", true},   {"pr240 == pr240", true}, {"a==a", true},
        {"a!=a", false},          {"x/y-z.1 == x/y-z.1", true},
    };
    for (auto &c : cases) EXPECT_EQ(keeps(c.cond), c.keep) << c.cond;
}

TEST(RecipeWhen, PrecedenceNotThenAndThenOr) {
    EXPECT_TRUE(keeps("true or true and false"));  // or last: true or (true and false)
    EXPECT_FALSE(keeps("(true or true) and false"));
    EXPECT_FALSE(keeps("not false and false"));  // not first: (not false) and false
    EXPECT_TRUE(keeps("not (false and false)"));
    EXPECT_TRUE(keeps("not a == b"));  // a comparison binds tighter than not
    EXPECT_TRUE(keeps("not not true"));
    EXPECT_TRUE(keeps("false or a == a and (b == c or c in [c])"));
    EXPECT_FALSE(keeps("a == a and not (x in [x, y] or false)"));
    EXPECT_TRUE(keeps("((a == a))"));
}

TEST(RecipeWhen, BadValuesAreErrorsAtTheValue) {
    RecipeDir d;
    std::string f = d.path("r.yaml");
    struct Case {
        std::string value, expect;
    } cases[] = {
        {"[true]", ":6:11: when: expected true, false or a condition (A == B, A != B, A in [x, y], with not, and, or "
                   "and parentheses), got a list"},
        {"{a: 1}", ":6:11: when: expected true, false or a condition"},
        {"~", ":6:11: when: expected true, false or a condition"},
        {"\"\"", ":6:11: when: cannot read the condition '': expected a word, 'not' or '(', got the end (column 1)"},
        {"pr240", ":6:11: when: cannot read the condition 'pr240': 'pr240' is neither a boolean nor a comparison"},
        {"1", ":6:11: when: cannot read the condition '1': '1' is neither a boolean"},
        {"a = b", ":6:11: when: cannot read the condition 'a = b': unknown operator '=' after 'a' (expected ==, != "
                  "or in) (column 3)"},
        {"a > b", "unknown operator '>' after 'a'"},
        {"\"(a == a\"", ":6:11: when: cannot read the condition '(a == a': unbalanced '(' (opened at column 1): "
                        "expected ')', got the end (column 8)"},
        {"\"a == a)\"", ":6:11: when: cannot read the condition 'a == a)': unbalanced ')' (column 7)"},
        {"\"a == 'b\"", "unterminated quote ' (column 6)"},
        {"a == and", "expected a word after '==', got 'and' (column 6)"},
        {"a in b", "expected '[' after 'in', got 'b'"},
        {"\"a in [b\"", "expected ',' or ']' in the list after 'in', got the end"},
        {"a == a b", "expected 'and', 'or' or the end of the condition, got 'b' (column 8)"},
        {"a == a and", "expected a word, 'not' or '(', got the end"},
    };
    for (auto &c : cases) {
        std::string log = validate_log(d, kBlockHead + c.value + "\n");
        std::string want = c.expect[0] == ':' ? f + c.expect : c.expect;
        EXPECT_NE(log.find(want), std::string::npos) << c.value << "\n" << log;
    }
    // parentheses nest at most 64 deep: no stack to exhaust
    std::string deep = std::string(100000, '(') + "true" + std::string(100000, ')');
    std::string log = validate_log(d, kBlockHead + dq(deep) + "\n");
    EXPECT_NE(log.find("parentheses and 'not' nested deeper than 64 (column 65)"), std::string::npos)
        << log.substr(0, 400);
}

TEST(RecipeWhen, FalseStageLeavesTheDagWhole) {
    RecipeDir d;
    // implicit after over a removed stage, explicit after naming one (deduplicated), a chain of removed
    // stages (implicit and explicit), a removed root
    std::string p = d.put("w.yaml",
                          "stages:\n"
                          "  - {id: r0, uses: t-init, when: false}\n"
                          "  - {id: a, uses: t-init}\n"
                          "  - {id: x, uses: t-init, after: []}\n"
                          "  - {id: b, uses: t-init, after: [a, x], when: false}\n"
                          "  - {id: c, uses: t-init, after: [b, x]}\n"
                          "  - {id: d1, uses: t-init, after: [c], when: false}\n"
                          "  - {id: d2, uses: t-init, when: false}\n"
                          "  - {id: d3, uses: t-init, after: [d2, b], when: false}\n"
                          "  - {id: e, uses: t-init}\n"
                          "  - {id: f, uses: t-init, after: [d1, x]}\n"
                          "  - {id: g, uses: t-init, after: [r0]}\n");
    CliResult r = dry_run(p);
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("  1. a (t-init)\n"), std::string::npos) << r.out;  // r0 removed: a is a root
    EXPECT_NE(r.out.find("  2. x (t-init)\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(". c (t-init) after a, x\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(". e (t-init) after c, a, x\n"), std::string::npos) << r.out;  // d3: d2 (-> d1 -> c), b
    EXPECT_NE(r.out.find(". f (t-init) after c, x\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(". g (t-init)\n"), std::string::npos) << r.out;  // after [r0]: a root
    EXPECT_EQ(r.out.substr(0, r.out.find("  (not run: ")).find("when"), std::string::npos) << r.out;
    std::string listing = "  (not run: r0 (t-init): when: false is false)\n"
                          "  (not run: b (t-init): when: false is false)\n"
                          "  (not run: d1 (t-init): when: false is false)\n"
                          "  (not run: d2 (t-init): when: false is false)\n"
                          "  (not run: d3 (t-init): when: false is false)\n";
    EXPECT_NE(r.out.find(listing), std::string::npos) << r.out;
    CliResult v = cli({"validate", p});
    ASSERT_EQ(v.rc, 0) << v.log;
    EXPECT_NE(v.out.find("6 stages: a -> x -> c -> e -> f -> g; not run (when: false): r0, b, d1, d2, d3)"),
              std::string::npos)
        << v.out;
}

TEST(RecipeWhen, RemovedStagesRunNothingAndAreReported) {
    RecipeDir d;
    std::string trace = d.path("trace.txt"), report = d.path("report.json");
    std::string p = d.put("run.yaml",
                          "name: cond\nvars: {trace: " + trace + ", layout: dcp}\nstages:\n"
                          "  - {id: a, uses: t-init}\n"
                          "  - {id: b, uses: t-fail, when: \"${layout} == pr240\"}\n"
                          "  - {id: c, uses: t-train, with: {steps: 1}}\n");
    CliResult r = cli({"--report", report, p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_EQ(read_file(trace), "a\nc\n");
    EXPECT_NE(r.log.find("stage b (t-fail) not run: when: ${layout} == pr240 is false"), std::string::npos) << r.log;
    json_error_t je;
    json_t *j = json_load_file(report.c_str(), 0, &je);
    ASSERT_TRUE(j) << je.text;
    EXPECT_EQ(json_array_size(json_object_get(j, "stages")), 2u);
    json_t *nr = json_object_get(j, "not_run");
    ASSERT_EQ(json_array_size(nr), 1u);
    json_t *b = json_array_get(nr, 0);
    EXPECT_STREQ(json_string_value(json_object_get(b, "recipe")), "cond");
    EXPECT_STREQ(json_string_value(json_object_get(b, "id")), "b");
    EXPECT_STREQ(json_string_value(json_object_get(b, "stage")), "t-fail");
    EXPECT_STREQ(json_string_value(json_object_get(b, "when")), "${layout} == pr240");
    json_decref(j);
    // the same recipe with the variable changed runs the stage (and fails in it)
    remove(trace.c_str());
    CliResult r2 = cli({"--set", "vars.layout=pr240", p});
    EXPECT_EQ(r2.rc, 1) << r2.log;
    EXPECT_EQ(read_file(trace), "a\nb\n");
}

TEST(RecipeWhen, SetVarsAndSetStageWhenChangeTheOutcome) {
    RecipeDir d;
    std::string p = d.put("s.yaml",
                          "vars: {layout: dcp}\nstages:\n"
                          "  - {id: a, uses: t-init}\n"
                          "  - {id: b, uses: t-init, when: \"${layout} in [pr240, head]\"}\n"
                          "  - {id: c, uses: t-init}\n");
    CliResult r = dry_run(p);
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("  (not run: b (t-init): when: ${layout} in [pr240, head] is false)\n"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("2. c (t-init) after a\n"), std::string::npos) << r.out;
    r = dry_run(p, {"vars.layout=head"});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_EQ(r.out.find("not run"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2. b (t-init) after a\n"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("when"), std::string::npos) << r.out;  // a kept item loses its `when`
    // a stage removed from the command line; overrides of its keys still count as applied
    r = dry_run(p, {"vars.layout=head", "stages.b.when=false", "stages.b.with.seed=3", "stages.c.when=true"});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_EQ(r.log.find("no recipe has a stage"), std::string::npos) << r.log;
    EXPECT_NE(r.out.find("  (not run: b (t-init): when: false is false)\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2. c (t-init) after a\n"), std::string::npos) << r.out;
    // the error names the --set argument and the text as written
    std::string log = validate_log(d, read_file(p), {"stages.c.when=${layout} = x"});
    EXPECT_NE(log.find("--set 'stages.c.when=${layout} = x':1:15: when: cannot read the condition 'dcp = x' (from "
                       "'${layout} = x'): unknown operator '='"),
              std::string::npos)
        << log;
}

TEST(RecipeWhen, EveryStageRemovedIsAnError) {
    RecipeDir d;
    std::string log = validate_log(d, "vars: {enabled: false}\nstages:\n"
                                      "  - {id: a, uses: t-init, when: \"${enabled}\"}\n"
                                      "  - {id: b, uses: t-init, when: a == b}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:3: stages: every stage of the recipe has a false when:"),
              std::string::npos)
        << log;
}

TEST(RecipeWhen, RemovedStagesAfterIsStillChecked) {
    RecipeDir d;
    std::string log =
        validate_log(d, "stages:\n  - {id: a, uses: t-init}\n  - {id: b, uses: t-init, after: [zz], when: false}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:35: stage 'b': after: unknown stage id 'zz' (known ids: a, b)"),
              std::string::npos)
        << log;
    log = validate_log(d, "stages:\n  - {id: a, uses: t-init}\n  - {id: b, uses: t-init, after: [c], when: false}\n"
                          "  - {id: c, uses: t-init, after: [b], when: false}\n"
                          "  - {id: d, uses: t-init, after: [c]}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:5: cycle in the stage graph among stages with a false when: (each stage "
                                          "runs after the next): b -> c -> b"),
              std::string::npos)
        << log;
    // a remaining stage naming an id that exists nowhere: the DAG's error, as without `when`
    log = validate_log(d,
                       "stages:\n  - {id: a, uses: t-init, when: false}\n  - {id: b, uses: t-init, after: [a, zz]}\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:38: stage 'b': after: unknown stage id 'zz'"), std::string::npos) << log;
}

TEST(RecipeWhen, VariantsOfOneStageIdWithExclusiveConditions) {
    RecipeDir d;
    std::string p = d.put("v.yaml",
                          "vars: {fast: true}\nstages:\n"
                          "  - {id: a, uses: t-init}\n"
                          "  - {id: t, uses: t-train, with: {steps: 1, mode: fast}, when: \"${fast}\"}\n"
                          "  - {id: t, uses: t-train, with: {steps: 9, mode: exact}, when: \"not ${fast}\"}\n"
                          "  - {id: z, uses: t-init, after: [t]}\n");
    CliResult r = dry_run(p);
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("with: {steps: 1, mode: fast"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(not run: t (t-train): when: not ${fast} is false)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("3. z (t-init) after t\n"), std::string::npos) << r.out;
    r = dry_run(p, {"vars.fast=no"});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("with: {steps: 9, mode: exact"), std::string::npos) << r.out;
}

TEST(RecipeWhen, ModelPartsAndNestedListItems) {
    RecipeDir d;
    std::string p = d.put("m.yaml",
                          "vars: {gen: false}\n"
                          "model:\n  parts:\n"
                          "    - {name: a, prefix: a., init: zeros,\n"
                          "       params: [{name: w, shape: [2]}, {name: v, shape: [3], when: \"${gen}\"}]}\n"
                          "    - {name: g, prefix: g., init: zeros, params: [{name: w, shape: [4]}],\n"
                          "       when: \"${gen} == true\"}\n"
                          "stages:\n  - {id: b, uses: t-init}\n"
                          "  - id: a\n    uses: t-train\n    with:\n      steps: 1\n"
                          "      opts: {items: [{k: 1, when: false}, {k: 2, when: \"1 == 1\"}, [{k: 3, when: no}]]}\n");
    CliResult r = dry_run(p);
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("model: {parts: [{name: a, prefix: a., init: zeros, params: [{name: w, shape: [2]}]}]}"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("opts: {items: [{k: 2}, []]}"), std::string::npos) << r.out;
    CliResult v = cli({"validate", p});
    EXPECT_EQ(v.rc, 0) << v.log;
    r = dry_run(p, {"vars.gen=true"});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.out.find("params: [{name: w, shape: [2]}, {name: v, shape: [3]}]}, {name: g, prefix: g., init: zeros, "
                         "params: [{name: w, shape: [4]}]}]}"),
              std::string::npos)
        << r.out;
    v = cli({"validate", "--set", "vars.gen=true", p});
    EXPECT_EQ(v.rc, 0) << v.log;
    // a bad condition inside a model part names its position
    std::string log =
        validate_log(d, "model:\n  parts:\n    - {name: a, prefix: a., when: maybe}\n"
                        "stages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find(d.path("r.yaml") + ":3:35: when: cannot read the condition 'maybe'"), std::string::npos) << log;
}

TEST(RecipeChoices, AllowedValuesPass) {
    RecipeDir d;
    std::string p = d.put("c.yaml",
                          "vars: {layout: pr240, visual_gen: yes, lr: 1e-4, tag: \"\"}\n"
                          "choices: {layout: [dcp, pr240, head], visual_gen: [true, false], lr: [0.0001, 0.001], "
                          "tag: [\"\", x]}\n"
                          "stages: [{id: a, uses: t-init}]\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 0) << r.log;
    r = cli({"validate", "--set", "vars.layout=head", "--set", "vars.visual_gen=False", p});
    EXPECT_EQ(r.rc, 0) << r.log;
}

TEST(RecipeChoices, EveryViolationNamesWhereTheValueWasSet) {
    RecipeDir d;
    std::string text = "vars: {layout: pr240, visual_gen: maybe, other: \"${layout}x\"}\n"
                       "choices:\n  layout: [dcp, pr240, head]\n  visual_gen: [true, false]\n  other: [ax]\n"
                       "stages: [{id: a, uses: t-init}]\n";
    std::string f = d.path("r.yaml");
    std::string log = validate_log(d, text, {"vars.layout=foo"});
    EXPECT_NE(log.find("--set 'vars.layout=foo':1:13: vars.layout is 'foo', not one of its choices [dcp, pr240, head] "
                       "(choices.layout at " + f + ":3:11)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("\n" + f + ":1:35: vars.visual_gen is 'maybe', not one of its choices [true, false] (choices."
                              "visual_gen at " + f + ":4:15)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("\n" + f + ":1:49: vars.other is 'foox', not one of its choices [ax]"), std::string::npos)
        << log;
    // one line each
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 3) << log;
}

TEST(RecipeChoices, BadEntriesAreErrorsAtTheirPosition) {
    RecipeDir d;
    std::string f = d.path("r.yaml");
    std::string log = validate_log(d, "vars: {a: 1, l: [1]}\nchoices:\n  nope: [1]\n  a: 1\n  l: [1, [2]]\n"
                                      "stages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find(f + ":3:3: choices: 'nope' is not a variable (defined in vars: a, l)"), std::string::npos)
        << log;
    EXPECT_NE(log.find(f + ":4:6: choices.a: expected a list of the allowed values (scalars), e.g. [a, b]"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find(f + ":5:6: choices.l: expected a list of the allowed values"), std::string::npos) << log;
    log = validate_log(d, "vars: {l: [1]}\nchoices: {l: [1]}\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find(f + ":1:11: vars.l is [1], not one of its choices [1]"), std::string::npos) << log;
    log = validate_log(d, "choices: [a]\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find(f + ":1:10: choices: expected a map of variable: [allowed values]"), std::string::npos) << log;
    log = validate_log(d, "choices: {x: [1]}\nstages: [{id: a, uses: t-init}]\n");
    EXPECT_NE(log.find(f + ":1:11: choices: 'x' is not a variable (defined in vars: none)"), std::string::npos) << log;
}

TEST(RecipeChoices, MergeFromIncludesLaterKeysWin) {
    RecipeDir d;
    d.put("base.yaml", "vars: {layout: dcp, mode: a}\nchoices: {layout: [dcp, pr240], mode: [a, b]}\n"
                       "stages: [{id: a, uses: t-init}]\n");
    std::string p = d.put("top.yaml", "include: [base.yaml]\nvars: {layout: head}\nchoices: {layout: [head]}\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 0) << r.log;
    r = cli({"validate", "--set", "vars.mode=c", p});
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.log.find("vars.mode is 'c', not one of its choices [a, b] (choices.mode at " + d.path("base.yaml") +
                         ":2:39)"),
              std::string::npos)
        << r.log;
}
