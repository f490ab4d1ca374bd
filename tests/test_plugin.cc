// Plugin loading: the example plugin from a recipe, and the ABI / symbol / duplicate errors.
#include <gtest/gtest.h>

#include "pipeline_fixture.h"

using namespace fsdp_test;

TEST(Plugin, ExamplePluginRunsFromRecipe) {
    RecipeDir d;
    std::string out = d.path("echo.txt");
    std::string so = plugin_dir() + "/libecho_stage.so";
    ASSERT_TRUE(exists(so)) << so << " (built by make)";
    std::string p = d.put("p.yaml", "plugins: [" + so + "]\nstages:\n  - id: hello\n    uses: echo\n"
                                    "    with: {message: hi there, repeat: 3, file: " + out + "}\n");
    CliResult r = cli({p});
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_EQ(read_file(out), "hi there\nhi there\nhi there\n");
    EXPECT_NE(r.log.find("hello: hi there"), std::string::npos) << r.log;
    // its schema is enforced like a built-in one, including its own check function
    std::string bad = d.put("b.yaml", "plugins: [" + so + "]\nstages:\n  - id: hello\n    uses: echo\n"
                                      "    with: {message: x, repeat: -4}\n");
    CliResult rb = cli({"validate", bad});
    EXPECT_EQ(rb.rc, 2);
    EXPECT_NE(rb.log.find(d.path("b.yaml") + ":5:32: echo: repeat must be between 0 and 1000000"), std::string::npos)
        << rb.log;
    CliResult st = cli({"stages", "--plugin", so});
    EXPECT_EQ(st.rc, 0);
    EXPECT_NE(st.out.find("echo  print a message"), std::string::npos) << st.out;
}

TEST(Plugin, AbiMismatchIsClearError) {
    RecipeDir d;
    std::string so = std::string(FSDP_BUILD_DIR) + "/tests/plugins/libbad_abi.so";
    std::string p = d.put("p.yaml", "plugins:\n  - " + so + "\nstages:\n  - {id: a, uses: t-init}\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.log.find(d.path("p.yaml") + ":2:5: "), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("stage ABI mismatch: the stage was built for stage ABI version 42, this fsdp-run provides "
                         "version 1"),
              std::string::npos)
        << r.log;
}

TEST(Plugin, MissingSymbolIsClearError) {
    RecipeDir d;
    std::string so = std::string(FSDP_BUILD_DIR) + "/tests/plugins/libno_symbol.so";
    std::string p = d.put("p.yaml", "plugins: [" + so + "]\nstages:\n  - {id: a, uses: t-init}\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.log.find("missing symbol 'fsdp_stage_register'"), std::string::npos) << r.log;
}

TEST(Plugin, MissingFileAndDuplicateName) {
    RecipeDir d;
    std::string p = d.put("p.yaml", "plugins: [/no/such/lib.so]\nstages:\n  - {id: a, uses: t-init}\n");
    CliResult r = cli({"validate", p});
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.log.find(":1:11: plugin /no/such/lib.so: no such file"), std::string::npos) << r.log;
    std::string so = plugin_dir() + "/libecho_stage.so";
    std::string dup = std::string(FSDP_BUILD_DIR) + "/tests/plugins/libdup_stage.so";
    std::string q = d.put("q.yaml", "plugins: [" + so + ", " + dup + "]\nstages:\n  - {id: a, uses: t-init}\n");
    CliResult r2 = cli({"validate", q});
    EXPECT_EQ(r2.rc, 2);
    EXPECT_NE(r2.log.find("duplicate stage name 'echo' (already registered by " + so + ")"), std::string::npos)
        << r2.log;
}

TEST(Plugin, RegistryRejectsBadDescriptors) {
    fsdp_registry *reg = registry_new();
    fsdp_err err;
    static const fsdp_param_spec bad_default[] = {{"n", FSDP_T_INT, 0, "abc", nullptr, ""},
                                                  {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    fsdp_stage_desc d = {FSDP_STAGE_DESC_INIT, "ok-name", "s", bad_default, nullptr, nullptr, t_init_run, nullptr};
    EXPECT_NE(fsdp_registry_add(reg, &d, &err), 0);
    EXPECT_NE(std::string(err.msg).find("default 'abc' does not match its type"), std::string::npos) << err.msg;
    fsdp_stage_desc n = {FSDP_STAGE_DESC_INIT, "Bad Name", "s", nullptr, nullptr, nullptr, t_init_run, nullptr};
    EXPECT_NE(fsdp_registry_add(reg, &n, &err), 0);
    fsdp_stage_desc norun = {FSDP_STAGE_DESC_INIT, "norun", "s", nullptr, nullptr, nullptr, nullptr, nullptr};
    EXPECT_NE(fsdp_registry_add(reg, &norun, &err), 0);
    fsdp_stage_desc small = {FSDP_STAGE_ABI_VERSION, 8, "small", "s", nullptr, nullptr, nullptr, t_init_run, nullptr};
    EXPECT_NE(fsdp_registry_add(reg, &small, &err), 0);
    EXPECT_NE(std::string(err.msg).find("descriptor size 8"), std::string::npos) << err.msg;
    // stage.h: a default of the parameter's type and one of its choices, YAML text (a string YAML reads
    // otherwise quoted); a name of a-z, 0-9, '-' and '_'
    static const char *const modes[] = {"fast", "slow", nullptr};
    static const fsdp_param_spec off_choice[] = {{"mode", FSDP_T_STRING, 0, "medium", modes, ""},
                                                 {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    fsdp_stage_desc oc = {FSDP_STAGE_DESC_INIT, "off-choice", "s", off_choice, nullptr, nullptr, t_init_run, nullptr};
    EXPECT_NE(fsdp_registry_add(reg, &oc, &err), 0);
    EXPECT_NE(std::string(err.msg).find("default 'medium' is not one of its choices"), std::string::npos) << err.msg;
    static const fsdp_param_spec glob_raw[] = {{"keys", FSDP_T_STRING, 0, "**", nullptr, ""},
                                               {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    fsdp_stage_desc gr = {FSDP_STAGE_DESC_INIT, "glob-raw", "s", glob_raw, nullptr, nullptr, t_init_run, nullptr};
    EXPECT_NE(fsdp_registry_add(reg, &gr, &err), 0);
    EXPECT_NE(std::string(err.msg).find("defaults are YAML text: quote a string YAML reads otherwise, e.g. \"'**'\""),
              std::string::npos) << err.msg;
    EXPECT_EQ(registry_count(reg), 0u);
    static const fsdp_param_spec glob_quoted[] = {{"keys", FSDP_T_STRING, 0, "'**'", nullptr, ""},
                                                  {"mode", FSDP_T_STRING, 0, "slow", modes, ""},
                                                  {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    fsdp_stage_desc gq = {FSDP_STAGE_DESC_INIT, "glob_quoted-2", "s", glob_quoted, nullptr, nullptr, t_init_run, nullptr};
    EXPECT_EQ(fsdp_registry_add(reg, &gq, &err), 0) << err.msg;
    EXPECT_EQ(registry_count(reg), 1u);
    registry_free(reg);
}
