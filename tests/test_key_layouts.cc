// Issue 17, item 3: the key layouts of training checkpoints (ckpt/key_layout.h). load-ckpt restores
// parameters and AdamW moments from torchtitan's layout (top-level parameters, optimizer.*), from
// dcp.save({"model": ..., "optim": ...}) and from the DCP tutorial's {"app": AppState} (app.model.,
// app.optim.), and from any layout named by `prefixes: {model, optim}`; optimizer state it cannot map
// is an error naming the keys (strict) or a listed omission, never moments silently left at zero.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/key_layout.h"
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

std::string everyday(const std::string &name) { return fixtures_dir() + "/torch-2.11/everyday/" + name; }
bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

const char *const PARAMS[] = {"emb.weight", "lin.weight", "lin.bias", "norm.weight", "norm.bias"};

struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> v;
};

Tensor read_tensor(const std::string &path, const std::string &name) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    Tensor t;
    EXPECT_EQ(ckpt_open(path.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    if (!r) return t;
    long i = ckpt_find(r, name.c_str());
    EXPECT_GE(i, 0) << path << ": " << name;
    if (i >= 0) {
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
        t.shape.assign(e->shape, e->shape + e->ndim);
        t.v.resize((size_t)fsdp_numel(e->ndim, e->shape));
        EXPECT_EQ(ckpt_read_rows(r, (size_t)i, 0, e->ndim ? e->shape[0] : 1, t.v.data(), FSDP_DT_F32, &err), 0) << err.msg;
    }
    ckpt_close(r);
    return t;
}

// A DCP of the everyday model's parameters under model_pre and its AdamW moments under
// <optim_pre>state.<id>.<kind>, id the parameter's name (or, ids_by_index, its integer index as a raw
// optimizer.state_dict() keys it).
void write_layout(const std::string &dir, const std::string &model_pre, const std::string &optim_pre,
                  bool ids_by_index = false) {
    ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
    dcp_file_writer w;
    memset(&w, 0, sizeof w);
    std::vector<dcp_record> rec(32);
    size_t n = 0;
    fsdp_err err;
    ASSERT_EQ(dcp_file_open(&w, dir.c_str(), 0, &err), 0) << err.msg;
    std::vector<std::pair<std::string, Tensor>> all;
    for (const char *p : PARAMS) all.push_back({model_pre + p, read_tensor(everyday("expected_state_dict.safetensors"), p)});
    for (int i = 0; i < 5; i++)
        for (const char *k : {"exp_avg", "exp_avg_sq"})
            all.push_back({optim_pre + "state." + (ids_by_index ? std::to_string(i) : PARAMS[i]) + "." + k,
                           read_tensor(everyday("expected_optim_state_" + std::to_string(i) + ".safetensors"), k)});
    for (auto &x : all) {
        std::vector<int64_t> zero(x.second.shape.size(), 0);
        ASSERT_EQ(dcp_file_add_tensor(&w, x.first.c_str(), FSDP_DT_F32, (int)x.second.shape.size(), x.second.shape.data(),
                                      zero.data(), x.second.shape.data(), x.second.v.data(), &rec[n++], &err), 0)
            << err.msg;
    }
    ASSERT_EQ(dcp_file_close(&w, &err), 0) << err.msg;
    ASSERT_EQ(dcp_write_metadata(dir.c_str(), rec.data(), n, &err), 0) << err.msg;
}

// the everyday model as an inline table (names and shapes), load-ckpt with `with`, save-dcp to dir/out
std::string recipe(const std::string &ck, const std::string &with, const std::string &out) {
    return "model:\n  params:\n    - {name: emb.weight, shape: [10, 4]}\n    - {name: lin.weight, shape: [3, 4]}\n"
           "    - {name: lin.bias, shape: [3]}\n    - {name: norm.weight, shape: [3]}\n    - {name: norm.bias, shape: [3]}\n"
           "stages:\n  - {id: l, uses: load-ckpt, with: {path: \"" + ck + "\"" + with + "}}\n"
           "  - {id: d, uses: save-dcp, with: {path: \"" + out + "\"}}\n";
}

int run_recipe(const std::string &dir, const std::string &yaml, std::string *out, const char *cmd = "") {
    write_file(dir + "/r.yaml", yaml);
    return run_cmd(fsdp_run_bin() + " " + cmd + dir + "/r.yaml", out);
}

// the moments and parameters in out (torchtitan's layout) are the fixture's, bit for bit
void expect_restored(const std::string &out, const std::string &what) {
    for (int i = 0; i < 5; i++) {
        Tensor p = read_tensor(out, PARAMS[i]), want = read_tensor(everyday("expected_state_dict.safetensors"), PARAMS[i]);
        EXPECT_EQ(p.v, want.v) << what << ": " << PARAMS[i];
        for (const char *k : {"exp_avg", "exp_avg_sq"}) {
            Tensor m = read_tensor(out, std::string("optimizer.state.") + PARAMS[i] + "." + k);
            Tensor w = read_tensor(everyday("expected_optim_state_" + std::to_string(i) + ".safetensors"), k);
            ASSERT_EQ(m.v.size(), w.v.size()) << what;
            EXPECT_EQ(memcmp(m.v.data(), w.v.data(), w.v.size() * sizeof(float)), 0) << what << ": " << PARAMS[i] << k;
        }
    }
}

}  // namespace

TEST(KeyLayouts, EveryKnownLayoutLoadsParametersAndMomentsStrictly) {
    // before: the optim. / app.optim. moments were not found (only optimizer.state.* was read): a strict
    // load failed on unexpected keys, and load_optimizer: true said there was no optimizer state
    std::string t = make_tmpdir("layouts"), out;
    struct {
        const char *model, *optim, *name;
    } cases[] = {{"", "optimizer.", "torchtitan"},
                 {"model.", "optimizer.", "{model, optimizer}"},
                 {"model.", "optim.", "{model, optim}"},
                 {"app.model.", "app.optim.", "the DCP tutorial's {app: AppState}"}};
    for (auto &c : cases) {
        write_layout(t + "/ck", c.model, c.optim);
        rm_rf(t + "/out");
        ASSERT_EQ(run_recipe(t, recipe(t + "/ck", ", load_optimizer: true", t + "/out"), &out), 0) << c.name << ": " << out;
        expect_restored(t + "/out", c.name);
    }
    rm_rf(t);
}

TEST(KeyLayouts, ExplicitPrefixesNameAnyLayout) {
    std::string t = make_tmpdir("layouts-x"), out;
    write_layout(t + "/ck", "net.", "opt.");
    // detected: the optimizer under opt., but the parameters are not under model.: strict fails naming them
    EXPECT_EQ(run_recipe(t, recipe(t + "/ck", ", load_optimizer: true", t + "/out"), &out), 1) << out;
    EXPECT_TRUE(has(out, "emb.weight not restored")) << out;
    rm_rf(t + "/out");
    ASSERT_EQ(run_recipe(t, recipe(t + "/ck", ", load_optimizer: true, prefixes: {model: net., optim: opt.}", t + "/out"),
                         &out), 0) << out;
    expect_restored(t + "/out", "prefixes: {model: net., optim: opt.}");
    // an explicit model prefix of "" with the optimizer given: torchtitan's own layout
    write_layout(t + "/ck2", "", "optimizer.");
    rm_rf(t + "/out");
    ASSERT_EQ(run_recipe(t, recipe(t + "/ck2", ", prefixes: {model: \"\", optim: optimizer.}", t + "/out"), &out), 0)
        << out;
    expect_restored(t + "/out", "prefixes: {model: '', optim: optimizer.}");
    rm_rf(t);
}

TEST(KeyLayouts, PrefixesAreValidatedBeforeAnyStageRuns) {
    std::string t = make_tmpdir("layouts-v"), out;
    struct {
        const char *with, *msg;
    } bad[] = {{", prefixes: {model: model}", "prefixes.model: prefix 'model' must be empty or dotted names ending in '.'"},
               {", prefixes: {optim: \"o*.\"}", "prefixes.optim: prefix 'o*.' must be"},
               {", prefixes: {moel: model.}", "prefixes: unknown key 'moel': did you mean 'model'? (model, optim)"},
               {", prefixes: {model: [a.]}", "prefixes.model must be a string"}};
    for (auto &b : bad) {
        EXPECT_EQ(run_recipe(t, recipe(t + "/nothing-yet", b.with, t + "/out"), &out, "validate "), 2) << b.with << out;
        EXPECT_TRUE(has(out, b.msg)) << b.with << ": " << out;
        EXPECT_TRUE(has(out, "r.yaml:")) << "points at the value: " << out;
    }
    rm_rf(t);
}

TEST(KeyLayouts, UnmappedOptimizerStateIsAnErrorOrAListedOmission) {
    // a DCP of a raw optimizer.state_dict(): moments keyed by integer ids, which name no parameter
    std::string t = make_tmpdir("layouts-u"), out;
    write_layout(t + "/ck", "", "optimizer.", true);
    EXPECT_EQ(run_recipe(t, recipe(t + "/ck", "", t + "/out"), &out), 1) << out;
    EXPECT_TRUE(has(out, "optimizer moment(s) under a key layout that does not map onto the model's parameters")) << out;
    EXPECT_TRUE(has(out, "optimizer.state.0.exp_avg") && has(out, "optimizer.state.4.exp_avg_sq")) << out;
    // strict: false: loaded, the omission listed (before: nothing said, the moments started at zero)
    rm_rf(t + "/out");
    ASSERT_EQ(run_recipe(t, recipe(t + "/ck", ", strict: false", t + "/out"), &out), 0) << out;
    EXPECT_TRUE(has(out, "10 optimizer moment(s) not restored")) << out;
    EXPECT_TRUE(has(out, "optimizer.state.2.exp_avg")) << out;
    // load_optimizer: false asks for none: no complaint
    rm_rf(t + "/out");
    EXPECT_EQ(run_recipe(t, recipe(t + "/ck", ", load_optimizer: false", t + "/out"), &out), 0) << out;
    rm_rf(t);
}

TEST(KeyLayouts, DetectionAndRewriting) {
    // the pure functions: prefix detection from keys and the rewrite into torchtitan's layout
    std::string t = make_tmpdir("layouts-f");
    write_layout(t + "/ck", "app.model.", "app.optim.");
    ckpt_reader *r = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open((t + "/ck").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    ckl_layout l;
    ASSERT_EQ(ckl_detect(r, nullptr, nullptr, &l, &err), 0) << err.msg;
    EXPECT_STREQ(l.optim, "app.optim.");
    EXPECT_STREQ(l.model, "app.model.");
    char buf[256] = "", unk[256] = "";
    size_t nb = 9, nu = 9, nk = 0;
    ckl_unmapped_moments(r, &l, nullptr, nullptr, buf, unk, sizeof buf, &nb, &nu, &nk);
    EXPECT_EQ(nb + nu, 0u) << buf << unk;
    char o[256];
    ASSERT_EQ(ckl_to_torchtitan(&l, "app.optim.state.lin.bias.exp_avg", o, sizeof o, &err), 0);
    EXPECT_STREQ(o, "optimizer.state.lin.bias.exp_avg");
    ASSERT_EQ(ckl_to_torchtitan(&l, "app.model.lin.bias", o, sizeof o, &err), 0);
    EXPECT_STREQ(o, "lin.bias");
    EXPECT_NE(ckl_to_torchtitan(&l, "app.model.lin.bias", o, 4, &err), 0);
    EXPECT_TRUE(ckl_is_training(&l, "app.optim.param_groups.lin.bias.lr"));
    EXPECT_FALSE(ckl_is_training(&l, "app.model.lin.bias"));
    // explicit prefixes win; a bad one is refused
    ASSERT_EQ(ckl_detect(r, "app.model.", "x.", &l, &err), 0);
    EXPECT_STREQ(l.optim, "x.");
    ckl_unmapped_moments(r, &l, nullptr, nullptr, buf, unk, sizeof buf, &nb, &nu, &nk);
    EXPECT_NE(nb, 0u);
    EXPECT_TRUE(has(buf, "app.optim.state.emb.weight.exp_avg")) << buf;
    EXPECT_NE(ckl_detect(r, "model", nullptr, &l, &err), 0);
    EXPECT_TRUE(has(err.msg, "prefix 'model' must be")) << err.msg;
    ckpt_close(r);
    rm_rf(t);
}

TEST(KeyLayouts, ConvertRewritesAnyLayoutIntoTorchtitans) {
    // before: convert had no --layout / --prefixes (usage error, exit 2)
    std::string t = make_tmpdir("layouts-c"), out, bin = fsdp_run_bin() + " ckpt ";
    write_layout(t + "/tt", "", "optimizer.");
    struct {
        const char *model, *optim, *args;
    } cases[] = {{"app.model.", "app.optim.", ""}, {"model.", "optim.", ""}, {"net.", "opt.", " --prefixes model=net.,optim=opt."}};
    for (auto &c : cases) {
        write_layout(t + "/src", c.model, c.optim);
        rm_rf(t + "/dst");
        ASSERT_EQ(run_cmd(bin + "convert " + t + "/src " + t + "/dst --layout torchtitan" + c.args, &out), 0) << out;
        EXPECT_EQ(run_cmd(bin + "diff " + t + "/dst " + t + "/tt", &out), 0) << c.model << c.optim << ": " << out;
    }
    // --layout keep (the default) leaves the keys as they are
    rm_rf(t + "/dst");
    ASSERT_EQ(run_cmd(bin + "convert " + t + "/src " + t + "/dst", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/dst " + t + "/src", &out), 0) << out;
    // an HF-style checkpoint whose model.* keys sit beside top-level ones keeps them
    EXPECT_EQ(run_cmd(bin + "convert " + everyday("expected_state_dict.safetensors") + " " + t + "/e.safetensors --layout "
                          "torchtitan --add-prefix model.", &out), 0) << out;
    // bad options: usage errors naming what was expected
    EXPECT_EQ(run_cmd(bin + "convert " + t + "/src " + t + "/x --prefixes model=net", &out), 2);
    EXPECT_TRUE(has(out, "prefix 'net' must be")) << out;
    EXPECT_EQ(run_cmd(bin + "convert " + t + "/src " + t + "/x --prefixes foo=net.", &out), 2);
    EXPECT_TRUE(has(out, "expected model=PREFIX or optim=PREFIX")) << out;
    EXPECT_EQ(run_cmd(bin + "convert " + t + "/src " + t + "/x --layout hf", &out), 2);
    EXPECT_TRUE(has(out, "--layout must be torchtitan or keep")) << out;
    rm_rf(t);
}
