// Issue 26 item 18: the classic torch.save({"model": sd, "optimizer": ..., "epoch": e,
// "rng": torch.get_rng_state()}) loads strictly: load-ckpt is strict over the model keys under the
// prefix it detects (or is given) and lists the entries outside it once; `exclude:` (globs on the
// checkpoint's own keys) leaves entries out on purpose, checked when the recipe is validated.
// Before: "unexpected key rng in the checkpoint" and no option to scope strictness.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "test_util.h"

extern "C" {
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/zip.h"
}

using namespace fsdp_test;

namespace {

bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

// REDUCE(torch._utils._rebuild_tensor_v2, (persid(('storage', torch.<cls>, key, 'cpu', n)), 0, (n,),
// (1,), False, OrderedDict())): a 1-d tensor over its whole storage
void tensor_1d(pkl_w *w, const char *cls, const char *key, int64_t n) {
    pkl_w_global(w, "torch._utils", "_rebuild_tensor_v2");
    pkl_w_mark(w);
    pkl_w_mark(w);
    pkl_w_str(w, "storage");
    pkl_w_global(w, "torch", cls);
    pkl_w_str(w, key);
    pkl_w_str(w, "cpu");
    pkl_w_int(w, n);
    pkl_w_tuple(w);
    pkl_w_binpersid(w);
    pkl_w_int(w, 0);
    int64_t one = 1;
    pkl_w_int_tuple(w, &n, 1);
    pkl_w_int_tuple(w, &one, 1);
    pkl_w_bool(w, 0);
    pkl_w_global(w, "collections", "OrderedDict");
    pkl_w_empty_tuple(w);
    pkl_w_reduce(w);
    pkl_w_tuple(w);
    pkl_w_reduce(w);
}

// {"model": {"w": f32[2] = (1.5, -2)}, "epoch": 3, "rng": u8[8]} as torch.save writes it
void write_classic(const std::string &path) {
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    pkl_w_str(&w, "model");
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    pkl_w_str(&w, "w");
    tensor_1d(&w, "FloatStorage", "0", 2);
    pkl_w_setitems(&w);
    pkl_w_str(&w, "epoch");
    pkl_w_int(&w, 3);
    pkl_w_str(&w, "rng");
    tensor_1d(&w, "ByteStorage", "1", 8);
    pkl_w_setitems(&w);
    pkl_w_stop(&w);
    ASSERT_FALSE(w.oom);
    FILE *f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    zip_writer z;
    fsdp_err err;
    uint64_t len = 0;
    const float vals[2] = {1.5f, -2.0f};
    const unsigned char rng[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int rc = zip_writer_begin(&z, f, &err);
    if (!rc) rc = zip_writer_add(&z, "classic/data.pkl", w.buf, w.len, &err);
    if (!rc) rc = zip_writer_add(&z, "classic/byteorder", "little", 6, &err);
    if (!rc) rc = zip_writer_add(&z, "classic/data/0", vals, sizeof vals, &err);
    if (!rc) rc = zip_writer_add(&z, "classic/data/1", rng, sizeof rng, &err);
    if (!rc) rc = zip_writer_add(&z, "classic/version", "3\n", 2, &err);
    if (!rc) rc = zip_writer_finish(&z, &len, &err);
    zip_writer_free(&z);
    fclose(f);
    pkl_w_free(&w);
    ASSERT_EQ(rc, 0) << err.msg;
}

std::string recipe(const std::string &dir, const std::string &load_with) {
    return "model:\n  params: [{name: w, shape: [2]}]\nstages:\n"
           "  - {id: l, uses: load-ckpt, with: {path: \"" + dir + "/classic.pt\"" + load_with + "}}\n"
           "  - {id: s, uses: save-safetensors, with: {path: \"" + dir + "/o.safetensors\", overwrite: true}}\n";
}

int run(const std::string &dir, const std::string &load_with, std::string *out, const char *cmd = "") {
    write_file(dir + "/r.yaml", recipe(dir, load_with));
    return run_cmd(fsdp_run_bin() + " " + cmd + dir + "/r.yaml", out);
}

}  // namespace

TEST(LoadScope, ClassicCheckpointIsStrictOverTheModelPrefixAndListsTheRest) {
    std::string t = make_tmpdir("load-scope"), out;
    write_classic(t + "/classic.pt");
    // detected prefix model.: rng and epoch are ignored, listed once; w restored
    ASSERT_EQ(run(t, "", &out), 0) << out;
    EXPECT_TRUE(has(out, "the checkpoint's parameters are under the prefix 'model.' (removed)")) << out;
    EXPECT_TRUE(has(out, "ignored 2 entries outside the model prefix 'model.'")) << out;
    EXPECT_TRUE(has(out, "rng")) << out;
    EXPECT_FALSE(has(out, "unexpected key")) << out;
    ckpt_reader *r = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open((t + "/o.safetensors").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    float v[2] = {0, 0};
    ASSERT_EQ(ckpt_read_rows(r, (size_t)ckpt_find(r, "w"), 0, 2, v, FSDP_DT_F32, &err), 0) << err.msg;
    EXPECT_EQ(v[0], 1.5f);
    EXPECT_EQ(v[1], -2.0f);
    ckpt_close(r);
    // the same with the prefix declared
    ASSERT_EQ(run(t, ", strip_prefix: model.", &out), 0) << out;
    EXPECT_TRUE(has(out, "ignored 2 entries outside the model prefix 'model.'")) << out;
    ASSERT_EQ(run(t, ", prefixes: {model: model.}", &out), 0) << out;
    EXPECT_TRUE(has(out, "ignored 2 entries")) << out;
    // exclude: those entries left out on purpose, not listed
    ASSERT_EQ(run(t, ", exclude: [rng, \"ep*\"]", &out), 0) << out;
    EXPECT_FALSE(has(out, "ignored")) << out;
    // still strict under the prefix: a model key that names no parameter is unexpected
    write_file(t + "/r2.yaml", "model:\n  params: [{name: v, shape: [2]}, {name: w, shape: [2]}]\nstages:\n"
                               "  - {id: l, uses: load-ckpt, with: {path: \"" + t + "/classic.pt\", strip_prefix: "
                               "model.}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " " + t + "/r2.yaml", &out), 1) << out;
    EXPECT_TRUE(has(out, "v not restored")) << out;
    // exclude is checked before anything runs: a bad glob, a non-string entry
    EXPECT_EQ(run(t, ", exclude: [\"a***\"]", &out, "validate "), 2) << out;
    EXPECT_TRUE(has(out, "load-ckpt: exclude:")) << out;
    EXPECT_EQ(run(t, ", exclude: [\"\"]", &out, "validate "), 2) << out;
    EXPECT_TRUE(has(out, "each entry is a non-empty glob")) << out;
    rm_rf(t);
}
