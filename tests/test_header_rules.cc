// What the public headers state is what the code does (issue 39 item 6): every init rule params.h names
// for fsdp_param_add parses (read from the header's own comment, so a rule named there cannot be
// forgotten), and the stage-name characters stage.h states are exactly those the registry takes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "fsdp/stage.h"
#include "model/init_rule.h"
#include "pipeline/registry.h"
}

using namespace fsdp_test;

namespace {

// The backticked words of the comment of fsdp_param_add between "init rule of the" and "...;".
std::vector<std::string> header_rules() {
    std::string h = read_file("include/fsdp/params.h");
    size_t a = h.find("drawn by an init rule of the"), b = h.find("...;", a);
    std::vector<std::string> out;
    if (a == std::string::npos || b == std::string::npos) return out;
    for (size_t p = h.find('`', a); p != std::string::npos && p < b; p = h.find('`', p + 1)) {
        size_t q = h.find('`', p + 1);
        if (q == std::string::npos || q > b) break;
        out.push_back(h.substr(p + 1, q - p - 1));
        p = q;
    }
    return out;
}

// The rules with the header's symbolic arguments (v, a, b) given numbers.
std::string concrete(std::string r) {
    if (r == "constant(v)") return "constant(0.5)";
    if (r == "uniform(a, b)") return "uniform(-0.1, 0.1)";
    return r;
}

int noop_run(fsdp_ctx *, const fsdp_value *, fsdp_err *) { return 0; }

}  // namespace

TEST(HeaderRules, EveryInitRuleParamsHNamesParses) {
    std::vector<std::string> rules = header_rules();
    ASSERT_GE(rules.size(), 6u) << "the comment of fsdp_param_add in include/fsdp/params.h lists its init rules";
    for (const std::string &r : rules) {
        init_rule ir;
        fsdp_err err;
        EXPECT_EQ(init_rule_parse(concrete(r).c_str(), &ir, &err), 0) << r << ": " << err.msg;
    }
}

TEST(HeaderRules, StageNamesAreWhatStageHSays) {
    std::string h = read_file("include/fsdp/stage.h");
    ASSERT_NE(h.find("1 to 64 of a-z, 0-9, '-' and '_'"), std::string::npos) << "stage.h's rule changed: update this test";
    fsdp_registry *reg = registry_new();
    ASSERT_TRUE(reg);
    std::string ok64(64, 'a');
    const char *good[] = {"a", "x-y_z09", ok64.c_str()};
    std::string bad65(65, 'a');
    const char *bad[] = {"", "Upper", "dot.name", "sp ace", "slash/x", bad65.c_str()};
    // the registry keeps the descriptors (a plugin's are static): they live as long as it
    std::vector<fsdp_stage_desc> descs;
    descs.reserve(16);
    for (const char *n : good) {
        descs.push_back({FSDP_STAGE_DESC_INIT, n, "t", nullptr, nullptr, nullptr, noop_run, nullptr});
        fsdp_err err;
        EXPECT_EQ(fsdp_registry_add(reg, &descs.back(), &err), 0) << "'" << n << "': " << err.msg;
    }
    for (const char *n : bad) {
        descs.push_back({FSDP_STAGE_DESC_INIT, n, "t", nullptr, nullptr, nullptr, noop_run, nullptr});
        fsdp_err err;
        EXPECT_NE(fsdp_registry_add(reg, &descs.back(), &err), 0) << "'" << n << "' was taken";
    }
    registry_free(reg);
}
