// Recipe inputs neither leak nor get rewritten: a file that is not a recipe (included or given as the
// recipe) is refused without quoting its text, and a --set value is read as YAML only where that
// cannot change what was typed (a ` #` is not cut, a newline not folded).
#include <gtest/gtest.h>

#include "pipeline_fixture.h"

using namespace fsdp_test;

namespace {

const char *const SECRET = "S3cr3tH4sh";
const std::string STAGES = "stages:\n  - {id: a, uses: t-init}\n";

// `fsdp-run validate` of a recipe that includes `inc` (a path beside it).
CliResult validate_including(RecipeDir &d, const std::string &inc) {
    std::string p = d.put("r.yaml", "version: 1\ninclude: [" + inc + "]\n" + STAGES);
    return cli({"validate", p});
}

// The vars line of `--dry-run` with the given --set arguments.
std::string vars_after(RecipeDir &d, const std::vector<std::string> &sets) {
    std::string p = d.put("s.yaml", "vars: {out: a}\n" + STAGES);
    std::vector<std::string> args = {"--dry-run"};
    for (const auto &s : sets) {
        args.push_back("--set");
        args.push_back(s);
    }
    args.push_back(p);
    CliResult r = cli(args);
    EXPECT_EQ(r.rc, 0) << r.log;
    size_t at = r.out.find("vars: {");
    if (at == std::string::npos) return r.out;
    return r.out.substr(at, r.out.find('\n', at) - at);
}

}  // namespace

TEST(RecipeInputs, NonRecipeFilesAreRefusedWithoutTheirText) {
    RecipeDir d;
    std::string s = SECRET;
    struct Case {
        const char *name;
        std::string text;
        const char *says;
    } cases[] = {
        {"shadow", "root:$6$" + s + ":19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n", "not a recipe"},
        {"keys.yaml", "api_key: " + s + "\n" + s + ": 1\n", "not a recipe"},
        {"word", s + "\n", "not a recipe (its top level is a scalar"},
        {"list.yaml", "- " + s + "\n", "not a recipe (its top level is a list"},
        {"bin", std::string("\x7f" "ELF\x02\x01", 6) + s + std::string("\0\0", 2), "not YAML text"},
    };
    for (const Case &c : cases) {
        std::string p = d.put(c.name, c.text);
        CliResult inc = validate_including(d, c.name);
        EXPECT_EQ(inc.rc, 2) << c.name << ": " << inc.log;
        EXPECT_NE(inc.log.find(c.says), std::string::npos) << c.name << ": " << inc.log;
        EXPECT_NE(inc.log.find(c.name), std::string::npos) << c.name << ": " << inc.log;
        EXPECT_EQ(inc.log.find(SECRET), std::string::npos) << c.name << ": " << inc.log;
        CliResult top = cli({"validate", p});
        EXPECT_EQ(top.rc, 2) << c.name << ": " << top.log;
        EXPECT_NE(top.log.find(p + ":1:"), std::string::npos) << c.name << ": " << top.log;
        EXPECT_NE(top.log.find(c.says), std::string::npos) << c.name << ": " << top.log;
        EXPECT_EQ(top.log.find(SECRET), std::string::npos) << c.name << ": " << top.log;
    }
    // an empty include is still an empty recipe part, and a recipe's own unknown key is still named
    d.put("empty.yaml", "");
    EXPECT_EQ(validate_including(d, "empty.yaml").rc, 0);
    CliResult typo = cli({"validate", d.put("t.yaml", STAGES + "stagez: []\n")});
    EXPECT_NE(typo.log.find("unknown top-level key 'stagez'"), std::string::npos) << typo.log;
}

TEST(RecipeInputs, YamlErrorsQuoteOnlyPlainWords) {
    RecipeDir d;
    std::string s = SECRET;
    // a duplicate key that is not a plain word is named by its position only
    std::string p = d.put("dup.yaml", STAGES + "\"u:$" + s + "\": 1\n\"u:$" + s + "\": 2\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 2) << r.log;
    EXPECT_NE(r.log.find(p + ":4:1: duplicate key (first at line 3 column 1)"), std::string::npos) << r.log;
    EXPECT_EQ(r.log.find(SECRET), std::string::npos) << r.log;
    p = d.put("dupw.yaml", STAGES + "vars: {lr: 1, lr: 2}\n");
    r = cli({"validate", p});
    EXPECT_NE(r.log.find(p + ":3:15: duplicate key 'lr' (first at line 3 column 8)"), std::string::npos) << r.log;
    // a control character or a bad UTF-8 byte is placed at its line and column, not at 1:1
    p = d.put("ctl.yaml", STAGES + "vars: {x: a\x01" + s + "}\n");
    r = cli({"validate", p});
    EXPECT_EQ(r.rc, 2) << r.log;
    EXPECT_NE(r.log.find(p + ":3:12: not YAML text: control characters are not allowed (byte 45)"),
              std::string::npos)
        << r.log;
    EXPECT_EQ(r.log.find(SECRET), std::string::npos) << r.log;
    p = d.put("utf.yaml", STAGES + "vars: {x: \xff}\n");
    r = cli({"validate", p});
    EXPECT_NE(r.log.find(p + ":3:11: not YAML text: invalid leading UTF-8 octet"), std::string::npos) << r.log;
}

TEST(RecipeInputs, SetKeepsCommentsAndNewlinesLiterally) {
    RecipeDir d;
    EXPECT_EQ(vars_after(d, {"vars.out=/x/run #3"}), "vars: {out: \"/x/run #3\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=/x/a\nb"}), "vars: {out: \"/x/a\\nb\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=# all of it"}), "vars: {out: \"# all of it\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=[1, 2] # two"}), "vars: {out: \"[1, 2] # two\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=a\t#c"}), "vars: {out: \"a\t#c\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=\"q\" # 1"}), "vars: {out: \"\\\"q\\\" # 1\"}");
    // the run saves to exactly that path
    RecipeDir w;
    std::string p = w.put("s.yaml", "vars: {out: a}\nstages:\n  - {id: a, uses: t-init, with: {seed: \"${out}\"}}\n");
    CliResult r = cli({"--dry-run", "--set", "vars.out=7 #3", p});
    EXPECT_EQ(r.rc, 2) << r.log; // seed is an int: "7 #3" is a string, not 7
    EXPECT_NE(r.log.find("got '7 #3'"), std::string::npos) << r.log;
}

TEST(RecipeInputs, SetParsesFlowCollectionsAndWholeScalars) {
    RecipeDir d;
    EXPECT_EQ(vars_after(d, {"vars.out=[1, 2]"}), "vars: {out: [1, 2]}");
    EXPECT_EQ(vars_after(d, {"vars.out={a: 1, b: [x]}"}), "vars: {out: {a: 1, b: [x]}}");
    EXPECT_EQ(vars_after(d, {"vars.out=\"q #1\""}), "vars: {out: \"q #1\"}");
    EXPECT_EQ(vars_after(d, {"vars.out='it''s'"}), "vars: {out: \"it's\"}");
    EXPECT_EQ(vars_after(d, {"vars.out="}), "vars: {out: \"\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=1e-4", "vars.b=true", "vars.n=null"}), "vars: {out: 1e-4, b: true, n: null}");
    EXPECT_EQ(vars_after(d, {"vars.out=runs/a#1"}), "vars: {out: \"runs/a#1\"}");
    // text YAML would read as something else is kept as written
    EXPECT_EQ(vars_after(d, {"vars.out=a: b"}), "vars: {out: \"a: b\"}");
    EXPECT_EQ(vars_after(d, {"vars.out=- x"}), "vars: {out: - x}"); // a string: a list prints [x]
    EXPECT_EQ(vars_after(d, {"vars.out= x "}), "vars: {out: \" x \"}");
    // a malformed flow collection is an error at the argument
    std::string p = d.put("s.yaml", "vars: {out: a}\n" + STAGES);
    CliResult bad = cli({"validate", "--set", "vars.out=[1", p});
    EXPECT_EQ(bad.rc, 2) << bad.log;
    EXPECT_NE(bad.log.find("--set 'vars.out=[1':1:12:"), std::string::npos) << bad.log; // its end, in its one line
}

// An error in a value a --set gave names that argument, never the recipe's line 1 (issue 42).
TEST(RecipeInputs, SetErrorsNameTheArgument) {
    std::string out;
    int rc = run_cmd(fsdp_run_bin() + " validate --set stages.train.with.warmup_step=5 recipes/quickstart.yaml", &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("--set 'stages.train.with.warmup_step=5':1:1: stage 'train' (train-steps): unknown parameter "
                       "'warmup_step': did you mean 'warmup_steps'?"), std::string::npos) << out;
    EXPECT_EQ(out.find("quickstart.yaml:1:1"), std::string::npos) << out;
    rc = run_cmd(fsdp_run_bin() + " validate --set 'model.dims=[1,,2]' recipes/quickstart.yaml", &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("--set 'model.dims=[1,,2]':1:"), std::string::npos) << out;
}
