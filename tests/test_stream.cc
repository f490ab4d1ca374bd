// The streamed bootstrap (issue 40 item 1, runtime/state_defer.h): values that no stage before a save
// needs are not held; init-meta's draws, load-ckpt's rows and transform's copies are produced into the
// save's write buffers. Every case below is run twice, streamed (the default) and with
// runtime.stream=false (every value materialised where it is made, the path before the change), and the
// two outputs must be the same bytes (the save's random identity aside); the report must show that the
// streamed run streamed and the other did not. Failures of a deferred read fail the save, naming the
// tensor, and leave no checkpoint.
#include <gtest/gtest.h>

#include <jansson.h>

#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using namespace fsdp_test;

namespace {

std::vector<std::string> files_in(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) out.push_back(e->d_name);
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

// Two outputs of one recipe (directories whose names have one length): the same files, each the same
// bytes once the save identity is blanked (DCP .metadata and data files), byte for byte otherwise.
void expect_same_output(const std::string &a, const std::string &b, const std::string &what) {
    std::vector<std::string> fa = files_in(a), fb = files_in(b);
    ASSERT_FALSE(fa.empty()) << what << ": nothing in " << a;
    ASSERT_EQ(fa, fb) << what;
    for (const std::string &f : fa) {
        std::string pa = a + "/" + f, pb = b + "/" + f;
        if (f == ".metadata") {
            EXPECT_TRUE(dcp_metadata_blanked(a) == dcp_metadata_blanked(b)) << what << ": " << f;
        } else if (f.size() > 7 && f.compare(f.size() - 7, 7, ".distcp") == 0) {
            EXPECT_TRUE(dcp_data_blanked(pa) == dcp_data_blanked(pb)) << what << ": " << f;
        } else {
            EXPECT_TRUE(read_file(pa) == read_file(pb)) << what << ": " << f;
        }
    }
}

// The largest value of metric `name` over the report's stages (rank 0's); -1 when no stage has it.
double report_metric(const std::string &report, const std::string &name) {
    json_error_t je;
    json_t *root = json_load_file(report.c_str(), 0, &je);
    EXPECT_NE(root, nullptr) << report << ": " << je.text;
    double v = -1;
    size_t i;
    json_t *st;
    json_array_foreach(json_object_get(root, "stages"), i, st) {
        json_t *m = json_object_get(json_object_get(st, "metrics"), name.c_str());
        if (json_is_number(m)) v = std::max(v, json_number_value(m));
    }
    json_decref(root);
    return v;
}

struct Streamed {
    std::string dir = make_tmpdir("fsdp-stream");
    ~Streamed() { rm_rf(dir); }
    // runs `args` (with {OUT} replaced by the output path) streamed ("on") and not ("of"); both must pass
    void run_both(int np, const std::string &args, std::string *on, std::string *of, double *streamed_on,
                  double *streamed_of) {
        for (int k = 0; k < 2; k++) {
            std::string out = dir + (k ? "/of" : "/on"), a = args;
            for (size_t p; (p = a.find("{OUT}")) != std::string::npos;) a.replace(p, 5, out);
            std::string rep = out + ".json";
            int rc;
            std::string log = run_np(np, a + " --report " + rep + (k ? " --set runtime.stream=false" : ""), &rc);
            ASSERT_EQ(rc, 0) << log;
            (k ? *of : *on) = out;
            (k ? *streamed_of : *streamed_on) = report_metric(rep, "params_streamed");
        }
    }
    void expect_same(int np, const std::string &args, const std::string &what, bool expect_streamed = true) {
        std::string on, of;
        double son = -1, sof = -1;
        run_both(np, args, &on, &of, &son, &sof);
        if (::testing::Test::HasFatalFailure()) return;
        if (expect_streamed) {
            EXPECT_GT(son, 0) << what << ": the streamed run held every value";
        }
        EXPECT_LE(sof, 0) << what << ": runtime.stream=false streamed";
        expect_same_output(on, of, what);
        rm_rf(on);
        rm_rf(of);
    }
};

std::string bagel_args(const std::string &layout, const std::string &extra = "") {
    std::string f = fixtures_dir() + "/bagel-056b5fd/sources";
    return "recipes/bagel_bootstrap.yaml --set vars.llm=" + f + "/llm --set vars.vit=" + f +
           "/vit --set vars.out={OUT} --set vars.max_latent_size=4 --set vars.vit_max_num_patch_per_side=5 "
           "--set vars.layout=" + layout + " " + extra;
}

TEST(StreamedBootstrap, BagelEqualsTheMaterialisedPathInEveryLayoutOnOneAndThreeRanks) {
    Streamed t;
    for (int np : {1, 3}) {
        t.expect_same(np, bagel_args("pr240"), "pr240 on " + std::to_string(np));
        t.expect_same(np, bagel_args("dcp"), "dcp on " + std::to_string(np));
        t.expect_same(np, bagel_args("pr240", "--set vars.with_optimizer=true"),
                      "pr240 with optimizer on " + std::to_string(np));
    }
    // head: save-safetensors writes a parameter from its producer on one rank; on several it gathers
    // each parameter whole on rank 0 (each rank producing its rows)
    t.expect_same(1, bagel_args("head"), "head on 1");
    t.expect_same(3, bagel_args("head", "--set vars.visual_und=false"), "head without the ViT on 3", false);
}

// A recipe of its own in t.dir: `model` and the stages after init-meta.
std::string write_recipe(const Streamed &t, const std::string &name, const std::string &body) {
    std::string p = t.dir + "/" + name + ".yaml";
    write_file(p, "version: 1\nname: " + name + "\nvars: {out: \"\"}\nruntime: {device: cpu, seed: 7}\n" + body);
    return p + " --set vars.out={OUT}";
}

TEST(StreamedBootstrap, HfRowsWithPermutedQkAndDrawsInEveryDtypeEqualTheMaterialisedPath) {
    Streamed t;
    for (const char *m : {"llama32_tiny", "qwen2_tiny", "qwen3_tiny"}) {
        std::string hf = hf_fixture(m);
        // the HF q/k rows are un-permuted on the way (names: hf), on 1 and 2 ranks (rows cut mid-head)
        std::string r = write_recipe(t, std::string("hf_") + m,
                                     "model: {from_hf: " + hf + "}\nstages:\n"
                                     "  - {id: l, uses: load-ckpt, with: {path: " + hf + ", names: hf}}\n"
                                     "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
        for (int np : {1, 2}) t.expect_same(np, r, std::string(m) + " hf load on " + std::to_string(np));
        // pieces of 5 KiB: rows cut by the pieces, q/k rows permuted inside a piece
        setenv("FSDP_SAVE_PIECE_KB", "5", 1);
        t.expect_same(2, r, std::string(m) + " hf load, 5 KiB pieces, on 2");
        unsetenv("FSDP_SAVE_PIECE_KB");
    }
    // init rules drawn in bf16 and f16 (rounded as they are produced), copies that narrow, a cast, a
    // fill, an async save's snapshot
    std::string r = write_recipe(t, "draws",
                                 "model: {arch: llama3, dim: 48, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 97, "
                                 "ffn_hidden: 80}\nstages:\n"
                                 "  - {id: i, uses: init-meta, with: {dtype: bf16}}\n"
                                 "  - {id: c, uses: transform, with: {ops: [{copy: {from: layers.0.**, to: layers.1.**}},"
                                 " {cast: {keys: output.weight, dtype: f16}}, {fill: {keys: norm.weight, value: 0.5}}]}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\", async: true}}\n");
    for (int np : {1, 2, 3}) t.expect_same(np, r, "bf16 draws, copies, cast, fill, async on " + std::to_string(np));
    r = write_recipe(t, "f16", "model: {arch: qwen3, dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 1, vocab_size: 61, "
                               "ffn_hidden: 40}\nstages:\n"
                               "  - {id: i, uses: init-meta, with: {dtype: f16}}\n"
                               "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    t.expect_same(2, r, "f16 draws on 2");
}

TEST(StreamedBootstrap, ADcpSourceIsReadWholeAtTheLoadAndTheSaveIsTheSame) {
    // a DCP tensor is read at the load, whole, so that its records' CRC-32 is checked: nothing of it is
    // deferred; the init-meta draws beside it still are
    Streamed t;
    std::string r = write_recipe(t, "dcp_src",
                                 "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: l, uses: load-ckpt, with: {path: " + tiny("dcp_model_ws2") +
                                 ", keys: [\"layers.0.**\"], strict: false}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    for (int np : {1, 2}) {
        std::string on, of;
        double son = -1, sof = -1;
        t.run_both(np, r, &on, &of, &son, &sof);
        ASSERT_FALSE(::testing::Test::HasFatalFailure());
        EXPECT_GT(son, 0);
        EXPECT_LE(sof, 0);
        EXPECT_EQ(report_metric(on + ".json", "params_loaded") > 0, true);
        json_error_t je;
        json_t *rep = json_load_file((on + ".json").c_str(), 0, &je);
        ASSERT_NE(rep, nullptr);
        json_t *l = json_array_get(json_object_get(rep, "stages"), 1);
        EXPECT_EQ(json_number_value(json_object_get(json_object_get(l, "metrics"), "params_deferred")), 0) << on;
        json_decref(rep);
        expect_same_output(on, of, "dcp source on " + std::to_string(np));
        rm_rf(on);
        rm_rf(of);
    }
}

TEST(StreamedBootstrap, AStageThatReadsValuesGetsThemMaterialised) {
    // train-steps reads the values as they are held: everything is materialised before it, and the
    // trained checkpoint is the same either way
    Streamed t;
    std::string hf = hf_fixture("llama32_tiny");
    std::string r = write_recipe(t, "train",
                                 "model: {from_hf: " + hf + "}\ndata: {kind: synthetic, seq_len: 8, batch_size: 2}\n"
                                 "stages:\n"
                                 "  - {id: l, uses: load-ckpt, with: {path: " + hf + ", names: hf}}\n"
                                 "  - {id: t, uses: train-steps, with: {steps: 2, lr: 1.0e-3}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    t.expect_same(2, r, "load, train, save", false);
}

// A safetensors file of one float32 tensor "w" [rows, cols] holding `values`.
void write_st(const std::string &path, int rows, int cols, const std::vector<float> &values) {
    std::string h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(rows) + "," + std::to_string(cols) +
                    "],\"data_offsets\":[0," + std::to_string(values.size() * 4) + "]}}";
    while (h.size() % 8) h += ' ';
    std::string f(8, '\0');
    uint64_t n = h.size();
    memcpy(&f[0], &n, 8);
    f += h;
    f.append((const char *)values.data(), values.size() * 4);
    write_file(path, f);
}

TEST(StreamedBootstrap, RoundedLoadsAndCopiesKeepTheirRoundingWhenProduced) {
    // f32 source values that bf16 does not hold: loaded into a bf16 parameter (rounded as it is read),
    // then copied into f32 and f16 parameters (the f32 copy keeps the bf16-rounded values, the f16 one is
    // rounded again), a bf16 draw copied into f32, on 1 and 3 ranks
    Streamed t;
    std::vector<float> v(64 * 40);
    for (size_t i = 0; i < v.size(); i++) v[i] = 0.001f * (float)i + 1.0f / 3.0f + (float)(i % 7) * 1e-4f;
    write_st(t.dir + "/src.safetensors", 64, 40, v);
    std::string r = write_recipe(t, "rounding",
                                 "model:\n  parts:\n    - {name: p, from: " + t.dir + "/src.safetensors, dtype: bf16}\n"
                                 "    - {name: q, params: [{name: c32, shape: [64, 40], dtype: f32, init: none},"
                                 " {name: c16, shape: [64, 40], dtype: f16, init: none},"
                                 " {name: d, shape: [64, 40], dtype: bf16, init: \"normal(0, 0.3)\"},"
                                 " {name: d32, shape: [64, 40], dtype: f32, init: none}]}\n"
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: l, uses: load-ckpt, with: {parts: [p]}}\n"
                                 "  - {id: c, uses: transform, with: {ops: [{copy: {from: w, to: c32}}, {copy: {from: w, to: c16}},"
                                 " {copy: {from: d, to: d32}}]}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    for (int np : {1, 3}) t.expect_same(np, r, "rounded loads and copies on " + std::to_string(np));
    // pieces of 3 KiB (768 values): most pieces start and end inside a row of 40, on 1 and 3 ranks
    setenv("FSDP_SAVE_PIECE_KB", "3", 1);
    for (int np : {1, 3}) t.expect_same(np, r, "rounded loads and copies, 3 KiB pieces, on " + std::to_string(np));
    unsetenv("FSDP_SAVE_PIECE_KB");
}

TEST(StreamedBootstrap, NaNInADeferredSourceFailsTheSaveNamingItAndLeavesNoCheckpoint) {
    Streamed t;
    std::vector<float> v(64 * 40, 0.25f);
    v[64 * 40 - 3] = NAN;
    write_st(t.dir + "/src.safetensors", 64, 40, v);
    std::string r = write_recipe(t, "nan",
                                 "model:\n  parts:\n    - {name: p, from: " + t.dir + "/src.safetensors, dtype: f32}\n"
                                 "stages:\n  - {id: i, uses: init-meta}\n"
                                 "  - {id: l, uses: load-ckpt, with: {parts: [p]}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + t.dir + "/out}}\n");
    for (int np : {1, 2}) {
        for (const char *stream : {"true", "false"}) {
            int rc;
            std::string log = run_np(np, r + " --set runtime.stream=" + stream, &rc);
            EXPECT_EQ(rc, 1) << log;
            EXPECT_NE(log.find("holds NaN"), std::string::npos) << log;
            EXPECT_NE(log.find("w"), std::string::npos) << log;
            EXPECT_FALSE(exists(t.dir + "/out/.metadata")) << "stream " << stream << " on " << np << ": " << log;
            rm_rf(t.dir + "/out");
        }
    }
}

TEST(StreamedBootstrap, RuntimeStreamIsCheckedByValidate) {
    Streamed t;
    std::string r = write_recipe(t, "bad", "model: {arch: llama3, dim: 32, n_layers: 1, n_heads: 2, vocab_size: 61}\n"
                                           "stages:\n  - {id: i, uses: init-meta}\n");
    int rc;
    std::string log = run_np(1, "validate " + r + " --set runtime.stream=sometimes", &rc);
    EXPECT_EQ(rc, 2) << log;
    EXPECT_NE(log.find("stream"), std::string::npos) << log;
}

}  // namespace

// ---- the pieces: ckpt_pwrite_gen and the deferral's bookkeeping -------------------------------------

extern "C" {
#include "ckpt/ckpt_pwrite.h"
#include "runtime/state_defer.h"
}

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

namespace {

float value_at(uint64_t e) { return (float)((double)(e % 977) * 0.37 - 150.0) / (1.0f + (float)(e % 13)); }

// a producer of value_at(e) that fails (naming the element) from element fail_at on
struct gen_user {
    uint64_t fail_at = UINT64_MAX;
};
int gen_values(void *user, uint64_t e0, size_t n, float *dst, fsdp_err *err) {
    const gen_user *u = (const gen_user *)user;
    for (size_t k = 0; k < n; k++) {
        if (e0 + k >= u->fail_at) return fsdp_err_set(err, FSDP_E_FORMAT, "bad value at element %llu", (unsigned long long)(e0 + k));
        dst[k] = value_at(e0 + k);
    }
    return 0;
}

std::string fd_bytes(int fd) {
    off_t n = lseek(fd, 0, SEEK_END);
    std::string s((size_t)n, '\0');
    EXPECT_EQ(pread(fd, &s[0], s.size(), 0), (ssize_t)n);
    return s;
}

}  // namespace

// The produced payload is the bytes (and CRC) of converting the whole array at once, for every dtype,
// thread count and piece size, buffered and O_DIRECT (at a block boundary and inside a block)
TEST(StreamedPwrite, ProducedBytesAndCrcAreThoseOfTheWholeArray) {
    std::string t = make_tmpdir("fsdp-genwrite");
    const size_t n = 300001;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = value_at(i);
    for (fsdp_dtype dt : {FSDP_DT_F32, FSDP_DT_BF16, FSDP_DT_F16}) {
        std::string want(n * fsdp_dtype_size(dt), '\0');
        fsdp_err err;
        ASSERT_EQ(fsdp_convert(&want[0], dt, v.data(), FSDP_DT_F32, n, &err), 0) << err.msg;
        uint32_t want_crc = (uint32_t)crc32(0L, (const Bytef *)want.data(), (uInt)want.size());
        for (int threads : {1, 2, 3}) {
            for (size_t piece : {(size_t)4096, (size_t)12345, (size_t)1 << 20}) {
                // offsets at a block boundary and inside one (written up to the boundary through the page
                // cache, direct from there on)
                for (int mode = 0; mode < 4; mode++) {
                    int direct = mode > 0;
                    std::string p = t + "/f";
                    int fd = open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
                    ASSERT_GE(fd, 0);
                    uint64_t off = mode == 1 ? 4096 : mode == 2 ? 4100 : 6;
                    ASSERT_EQ(pwrite(fd, std::string(off, 'h').data(), off, 0), (ssize_t)off);
                    ckpt_pio_opts o = {piece, threads, 1, direct};
                    gen_user u;
                    uint32_t crc = 0;
                    ASSERT_EQ(ckpt_pwrite_gen(fd, gen_values, &u, dt, n, off, &crc, "t", &o, &err), 0) << err.msg;
                    std::string got = fd_bytes(fd);
                    close(fd);
                    std::string what = std::string(fsdp_dtype_name(dt)) + " threads " + std::to_string(threads) +
                                       " piece " + std::to_string(piece) + " direct " + std::to_string(direct) +
                                       " at " + std::to_string(off);
                    EXPECT_EQ(got.substr(0, off), std::string(off, 'h')) << what;
                    EXPECT_TRUE(got.substr(off) == want) << what;
                    EXPECT_EQ(crc, want_crc) << what;
                }
            }
        }
    }
    rm_rf(t);
}

// A producer's error ends the write with its message, whichever thread met it
TEST(StreamedPwrite, AProducersErrorReachesTheCaller) {
    std::string t = make_tmpdir("fsdp-genwrite");
    int fd = open((t + "/f").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    for (int threads : {1, 2, 4}) {
        ckpt_pio_opts o = {4096, threads, 0, 0};
        gen_user u;
        u.fail_at = 50000;
        fsdp_err err;
        uint32_t crc = 0;
        EXPECT_EQ(ckpt_pwrite_gen(fd, gen_values, &u, FSDP_DT_BF16, 100000, 0, &crc, "t", &o, &err), FSDP_E_FORMAT);
        EXPECT_NE(strstr(err.msg, "bad value at element"), nullptr) << err.msg;
    }
    close(fd);
    rm_rf(t);
}

namespace {
struct count_src {
    state_src base;
    int *destroyed;
    float scale;
};
int count_fill(const state_src *s, int64_t e0, size_t n, float *dst, fsdp_err *) {
    const count_src *c = (const count_src *)s;
    for (size_t k = 0; k < n; k++) dst[k] = c->scale * (float)(e0 + (int64_t)k) + 0.1f;
    return 0;
}
void count_destroy(state_src *s) {
    count_src *c = (count_src *)s;
    (*c->destroyed)++;
    delete c;
}
}  // namespace

// A deferred parameter reads as its producer's values (rounded to its round dtype) through every host
// access, shares its producer by reference, and holds host rows once materialised or written
TEST(StreamedState, DeferredValuesReadMaterialiseAndShare) {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof *s);
    s->layout = STATE_SHARDED;
    s->world = 1;
    fsdp_err err;
    int64_t shape[2] = {300, 7000}; // 2.1M values: materialised in several pieces
    ASSERT_EQ(state_add_param(s, "a", 2, shape, -1, &err), 0) << err.msg;
    ASSERT_EQ(state_add_param(s, "b", 2, shape, -1, &err), 0) << err.msg;
    int destroyed = 0;
    count_src *c = new count_src();
    state_src_init(&c->base, count_fill, count_destroy, 300 * 7000);
    c->destroyed = &destroyed;
    c->scale = 1.0f / 3.0f;
    ASSERT_EQ(state_param_defer(s, &s->p[0], &c->base, FSDP_DT_INVALID, &err), 0) << err.msg;
    ASSERT_EQ(state_param_defer(s, &s->p[1], &c->base, FSDP_DT_BF16, &err), 0) << err.msg; // a narrowing copy
    state_src_unref(&c->base);
    EXPECT_EQ(destroyed, 0);
    EXPECT_EQ(state_deferred_count(s), 2u);
    EXPECT_EQ(s->p[0].data, nullptr);
    EXPECT_EQ(state_place_of(&s->p[0], STATE_DATA), STATE_HOST);
    size_t n = state_param_local_numel(&s->p[0]);
    std::vector<float> got(n), want(n);
    for (size_t k = 0; k < n; k++) want[k] = (1.0f / 3.0f) * (float)k + 0.1f;
    ASSERT_EQ(state_param_get(s, &s->p[0], STATE_DATA, got.data(), &err), 0) << err.msg;
    EXPECT_TRUE(got == want);
    std::vector<float> part(10);
    ASSERT_EQ(state_param_fill(&s->p[1], 12345, 10, part.data(), &err), 0);
    for (int k = 0; k < 10; k++) EXPECT_EQ(part[k], fsdp_bf16_to_f32(fsdp_f32_to_bf16(want[12345 + k])));
    EXPECT_NE(state_param_fill(&s->p[1], (int64_t)n - 5, 10, part.data(), &err), 0) << "past the end";
    // a read-only map is a produced copy, the parameter stays deferred
    float *m = nullptr;
    ASSERT_EQ(state_param_map(s, &s->p[0], STATE_DATA, &m, &err), 0);
    EXPECT_EQ(m[7], want[7]);
    ASSERT_EQ(state_param_unmap(s, &s->p[0], STATE_DATA, m, 0, &err), 0);
    EXPECT_TRUE(s->p[0].deferred);
    // materialised: host rows with the same values; the producer lives on for b
    ASSERT_EQ(state_param_materialize(s, &s->p[0], &err), 0) << err.msg;
    EXPECT_FALSE(s->p[0].deferred);
    ASSERT_NE(s->p[0].data, nullptr);
    EXPECT_TRUE(std::vector<float>(s->p[0].data, s->p[0].data + n) == want);
    EXPECT_EQ(destroyed, 0);
    // a written-back map replaces the producer: b holds the written values, the producer is gone
    ASSERT_EQ(state_param_map(s, &s->p[1], STATE_DATA, &m, &err), 0);
    m[0] = 42;
    ASSERT_EQ(state_param_unmap(s, &s->p[1], STATE_DATA, m, 1, &err), 0);
    EXPECT_FALSE(s->p[1].deferred);
    EXPECT_EQ(s->p[1].data[0], 42);
    EXPECT_EQ(destroyed, 1);
    EXPECT_EQ(state_deferred_count(s), 0u);
    // a parameter with moments cannot be deferred
    ASSERT_EQ(state_alloc_optimizer(s, &err), 0);
    count_src *c2 = new count_src();
    state_src_init(&c2->base, count_fill, count_destroy, 300 * 7000);
    c2->destroyed = &destroyed;
    EXPECT_EQ(state_param_defer(s, &s->p[0], &c2->base, FSDP_DT_INVALID, &err), FSDP_E_INVALID);
    state_src_unref(&c2->base);
    EXPECT_EQ(destroyed, 2);
    state_free(s);
}

extern "C" {
#include "ckpt/reader.h"
}

// A mapped safetensors source truncated in place after it was opened (a deferred read comes long after the
// load opened it) is an error naming the file, not a fault of the mapping
TEST(StreamedState, ASafetensorsSourceTruncatedAfterItWasOpenedIsAnError) {
    std::string dir = make_tmpdir("fsdp-sttrunc");
    std::vector<float> v(512 * 1024, 0.5f); // 2 MiB
    write_st(dir + "/src.safetensors", 512, 1024, v);
    ckpt_reader *r = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open((dir + "/src.safetensors").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    std::vector<float> got(1024 * 100);
    ASSERT_EQ(ckpt_read_rows(r, 0, 400, 500, got.data(), FSDP_DT_F32, &err), 0) << err.msg;
    EXPECT_EQ(got[5], 0.5f);
    ASSERT_EQ(truncate((dir + "/src.safetensors").c_str(), 1 << 20), 0);
    EXPECT_EQ(ckpt_read_rows(r, 0, 400, 500, got.data(), FSDP_DT_F32, &err), FSDP_E_FORMAT);
    EXPECT_NE(strstr(err.msg, "truncated after it was opened"), nullptr) << err.msg;
    EXPECT_NE(strstr(err.msg, "src.safetensors"), nullptr) << err.msg;
    ASSERT_EQ(ckpt_read_rows(r, 0, 0, 10, got.data(), FSDP_DT_F32, &err), 0) << "rows still in the file: " << err.msg;
    ckpt_close(r);
    rm_rf(dir);
}
