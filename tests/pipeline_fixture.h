// Test stages and helpers for the recipe engine tests: a registry with stages the test
// binary registers itself, and a runner that captures stdout/stderr.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

extern "C" {
#include "fsdp/stage.h"
#include "cli/cli.h"
#include "pipeline/registry.h"
}
#include "test_util.h"

namespace fsdp_test {

// Each test stage appends "<id>" to the file named by the TRACE variable of the recipe
// (vars.trace) so tests can check the execution order across processes or calls.
inline void trace(fsdp_ctx *ctx) {
    const char *path = fsdp_value_text(fsdp_value_get(fsdp_ctx_section(ctx, "vars"), "trace"));
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s\n", fsdp_ctx_stage_id(ctx));
    fclose(f);
}

inline int t_init_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *) {
    trace(ctx);
    fsdp_ctx_metric(ctx, "seed", (double)fsdp_arg_int(with, "seed", -1));
    fsdp_ctx_metric_str(ctx, "note", "initialised");
    return 0;
}
inline int t_train_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    trace(ctx);
    if (!fsdp_ctx_has_state(ctx, "params")) return fsdp_err_set(err, FSDP_E_RUNTIME, "no params in the context");
    fsdp_ctx_metric(ctx, "steps", (double)fsdp_arg_int(with, "steps", -1));
    fsdp_ctx_metric(ctx, "lr", fsdp_arg_float(with, "lr", -1));
    return 0;
}
inline int t_fail_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    trace(ctx);
    fsdp_ctx_metric(ctx, "before_failure", 1.0);
    return fsdp_err_set(err, FSDP_E_IO, "t-fail: %s", fsdp_arg_str(with, "why", "planned failure"));
}

inline fsdp_registry *test_registry() {
    static const char *const provides_params[] = {"params", nullptr};
    static const char *const needs_params[] = {"params", nullptr};
    static const char *const provides_opt[] = {"params", "optimizer", nullptr};
    static const char *const modes[] = {"fast", "exact", nullptr};
    static const fsdp_param_spec init_params[] = {
        {"seed", FSDP_T_INT, 0, "7", nullptr, "seed"},
        {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    static const fsdp_param_spec train_params[] = {
        {"steps", FSDP_T_INT, 1, nullptr, nullptr, "number of steps"},
        {"lr", FSDP_T_FLOAT, 0, "1e-3", nullptr, "learning rate"},
        {"mode", FSDP_T_STRING, 0, "fast", modes, "mode"},
        {"flag", FSDP_T_BOOL, 0, "false", nullptr, "a flag"},
        {"betas", FSDP_T_LIST, 0, "[0.9, 0.95]", nullptr, "a list"},
        {"opts", FSDP_T_MAP, 0, nullptr, nullptr, "a map"},
        {"name", FSDP_T_STRING, 0, nullptr, nullptr, "a string"},
        {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    static const fsdp_param_spec fail_params[] = {
        {"why", FSDP_T_STRING, 0, nullptr, nullptr, "message"},
        {nullptr, FSDP_T_STRING, 0, nullptr, nullptr, nullptr}};
    static const fsdp_stage_desc t_init = {FSDP_STAGE_DESC_INIT, "t-init", "test init", init_params, nullptr,
                                           provides_params, t_init_run, nullptr};
    static const fsdp_stage_desc t_train = {FSDP_STAGE_DESC_INIT, "t-train", "test train", train_params,
                                            needs_params, provides_opt, t_train_run, nullptr};
    static const fsdp_stage_desc t_fail = {FSDP_STAGE_DESC_INIT, "t-fail", "test failure", fail_params, nullptr,
                                           nullptr, t_fail_run, nullptr};
    fsdp_registry *reg = registry_new();
    fsdp_err err;
    EXPECT_EQ(fsdp_registry_add(reg, &t_init, &err), 0) << err.msg;
    EXPECT_EQ(fsdp_registry_add(reg, &t_train, &err), 0) << err.msg;
    EXPECT_EQ(fsdp_registry_add(reg, &t_fail, &err), 0) << err.msg;
    return reg;
}

struct CliResult {
    int rc;
    std::string out, log;
};

// Runs the CLI in-process on a fresh test registry.
inline CliResult cli(std::vector<std::string> args) {
    fsdp_registry *reg = test_registry();
    args.insert(args.begin(), "fsdp-run");
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    FILE *out = tmpfile(), *log = tmpfile();
    CliResult r;
    r.rc = fsdp_cli_run(reg, (int)args.size(), argv.data(), out, log);
    auto slurp = [](FILE *f) {
        std::string s;
        rewind(f);
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
        fclose(f);
        return s;
    };
    r.out = slurp(out);
    r.log = slurp(log);
    registry_free(reg);
    return r;
}

// A temporary directory with recipe files, removed at the end of the test.
struct RecipeDir {
    std::string dir;
    RecipeDir() : dir(make_tmpdir("fsdp-recipe")) {}
    ~RecipeDir() { rm_rf(dir); }
    std::string put(const std::string &name, const std::string &text) {
        std::string p = dir + "/" + name;
        write_file(p, text);
        return p;
    }
    std::string path(const std::string &name) const { return dir + "/" + name; }
};

}  // namespace fsdp_test
