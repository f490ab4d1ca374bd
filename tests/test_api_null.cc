// Never a crash on a NULL (issue 39): every function of the plugin headers (include/fsdp) called with NULL
// pointers, a NULL err and zero or out-of-range numbers -- with no context, each in a child process so that a crash
// names its function, and inside a stage's run with a real context on 1 and 3 ranks (tests/plugins/api_null_plugin.c).
// The calls are generated from the headers (tools/gen/gen_api_null_calls.py -> tests/api_null_calls.inc); a function
// the headers declare and the calls lack fails here.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "fsdp/callbacks.h"
#include "fsdp/ckpt.h"
#include "fsdp/collectives.h"
#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"
#include "fsdp/tensor.h"
#include "fsdp/value.h"
}

using namespace fsdp_test;

namespace {

struct Call {
    const char *name;
    void (*fn)();
};

#define CALL(name, expr) {#name, [] { fsdp_ctx *ctx = nullptr; (void)ctx; expr; }},
#define SKIPPED(name, why)
const Call kCalls[] = {
#include "api_null_calls.inc"
};
#undef CALL
#undef SKIPPED

#define CALL(name, expr) #name,
#define SKIPPED(name, why) #name,
const char *const kListed[] = {
#include "api_null_calls.inc"
};
#undef CALL
#undef SKIPPED

// fn in a child process: its wait status
int in_child(void (*fn)()) {
    fflush(nullptr);
    pid_t p = fork();
    if (p == 0) {
        alarm(20);
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return st;
}

TEST(ApiNull, EveryCallTakesNullsWithoutAContextAndReturns) {
    for (const Call &c : kCalls) {
        int st = in_child(c.fn);
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
            << c.name << ": " << (WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st)) : "exit");
    }
}

// The headers' functions, parsed here as the generator parses them: each has its CALL (or SKIPPED) line.
TEST(ApiNull, EveryDeclaredFunctionIsCalled) {
    std::set<std::string> listed(std::begin(kListed), std::end(kListed)), declared;
    const std::regex proto(R"((^|\n)[A-Za-z_][\w \*]*?\b(fsdp_\w+)\s*\([^;{]*\)\s*(FSDP_PRINTF\([^)]*\))?\s*;)");
    for (const char *h : {"callbacks", "ckpt", "collectives", "ctx", "error", "params", "stage", "tensor", "value"}) {
        std::ifstream f(std::string("include/fsdp/") + h + ".h");
        ASSERT_TRUE(f) << h;
        std::stringstream ss;
        ss << f.rdbuf();
        std::string text = std::regex_replace(ss.str(), std::regex(R"(/\*[\s\S]*?\*/)"), "");
        text = std::regex_replace(text, std::regex(R"(#[^\n]*)"), "");
        for (std::sregex_iterator it(text.begin(), text.end(), proto), end; it != end; ++it) {
            std::string whole = (*it)[0];
            if (whole.find("typedef") != std::string::npos) continue;
            declared.insert((*it)[2]);
        }
    }
    EXPECT_GT(declared.size(), 70u);
    for (const auto &d : declared)
        EXPECT_TRUE(listed.count(d)) << d << " is declared in include/fsdp/ and has no call in tests/api_null_calls.inc: "
                                        "run tools/gen/gen_api_null_calls.py";
    for (const auto &l : listed) EXPECT_TRUE(declared.count(l)) << l << " is no longer declared: regenerate the calls";
}

TEST(ApiNull, EveryCallTakesNullsInsideAStageOnOneAndThreeRanks) {
    std::string d = make_tmpdir("fsdp-api-null");
    write_file(d + "/r.yaml", "plugins: [" + std::string(FSDP_BUILD_DIR) +
                                  "/tests/plugins/libapi_null_plugin.so]\nmodel: {preset: tiny}\nstages:\n"
                                  "  - {id: i, uses: init-meta}\n  - {id: n, uses: api-null-calls, after: [i]}\n");
    for (int np : {1, 3}) {
        int rc;
        std::string log = run_np(np, d + "/r.yaml", &rc);
        EXPECT_EQ(rc, 0) << np << " ranks: " << log;
    }
    rm_rf(d);
}

} // namespace
