// Trainers' checkpoint layouts as data (layouts/layout.h) and views (ckpt/reader_view.h): the row maps
// (fused q/k/v in both orders, equal halves, the RoPE row order), round trips bit for bit, sharded reads of a
// view, detection, and the errors of a layout that cannot apply.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckpt_compare.h"
#include "test_util.h"

extern "C" {
#include "ckpt/namemap.h"
#include "ckpt/reader_view.h"
#include "layouts/layout.h"
}

using namespace fsdp_test;

namespace {

const int H = 4, KV = 2, HD = 16, DIM = 64; // the torch-2.11 tiny fixture

std::vector<float> rows_of(ckpt_reader *r, const std::string &name, int64_t r0 = 0, int64_t r1 = -1) {
    long i = ckpt_find(r, name.c_str());
    EXPECT_GE(i, 0) << name;
    if (i < 0) return {};
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    int64_t rows = e->ndim ? e->shape[0] : 1, per = 1;
    for (int d = 1; d < e->ndim; d++) per *= e->shape[d];
    if (r1 < 0) r1 = rows;
    std::vector<float> v((size_t)((r1 - r0) * per));
    fsdp_err err;
    EXPECT_EQ(ckpt_read_rows(r, (size_t)i, r0, r1, v.data(), FSDP_DT_F32, &err), 0) << name << ": " << err.msg;
    return v;
}

ckpt_reader *open_ckpt(const std::string &p) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    EXPECT_EQ(ckpt_open(p.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    return r;
}

ckpt_reader *view(ckpt_reader *src, const lay_layout *L, lay_dir dir, int h = H, int kv = KV) {
    lay_facts f = {h, kv, nullptr, nullptr, 0};
    ckpt_reader *v = nullptr;
    fsdp_err err;
    EXPECT_EQ(lay_view(src, 0, L, dir, &f, &v, nullptr, &err), 0) << err.msg;
    return v;
}

// Every tensor and value of a equals b's under the same name, and both have the same names.
void expect_same_entries(ckpt_reader *a, ckpt_reader *b) {
    ASSERT_EQ(ckpt_count(a), ckpt_count(b));
    for (size_t i = 0; i < ckpt_count(a); i++) {
        const ckpt_entry *e = ckpt_entry_at(a, i);
        long j = ckpt_find(b, e->name);
        ASSERT_GE(j, 0) << e->name;
        const ckpt_entry *f = ckpt_entry_at(b, (size_t)j);
        ASSERT_EQ(e->is_tensor, f->is_tensor) << e->name;
        if (!e->is_tensor) {
            const char *x = nullptr, *y = nullptr;
            fsdp_err err;
            ASSERT_EQ(ckpt_value(a, i, &x, &err), 0) << err.msg;
            ASSERT_EQ(ckpt_value(b, (size_t)j, &y, &err), 0) << err.msg;
            EXPECT_STREQ(x, y) << e->name;
            continue;
        }
        EXPECT_EQ(e->dtype, f->dtype) << e->name;
        EXPECT_TRUE(tensor_bytes(a, e->name) == tensor_bytes(b, e->name)) << "values differ: " << e->name;
    }
}

// torchtitan 0.3's wqkv from wq/wk/wv, written out as its attention builds it: per kv head j, its H/KV q heads,
// then k head j, then v head j.
std::vector<float> gqa_fused(const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v) {
    std::vector<float> out;
    int g = H / KV;
    for (int j = 0; j < KV; j++) {
        for (int i = 0; i < g; i++) out.insert(out.end(), q.begin() + (j * g + i) * HD * DIM, q.begin() + (j * g + i + 1) * HD * DIM);
        out.insert(out.end(), k.begin() + j * HD * DIM, k.begin() + (j + 1) * HD * DIM);
        out.insert(out.end(), v.begin() + j * HD * DIM, v.begin() + (j + 1) * HD * DIM);
    }
    return out;
}

TEST(Layouts, TableNamesAndAliases) {
    ASSERT_GE(lay_count(), 2u);
    EXPECT_EQ(lay_find("torchtitan"), lay_find("torchtitan-0.2"));
    EXPECT_NE(lay_find("torchtitan-0.3"), nullptr);
    EXPECT_EQ(lay_find("torchtitan-9"), nullptr);
    char names[512];
    EXPECT_NE(std::string(lay_names(names, sizeof names)).find("torchtitan-0.3"), std::string::npos);
    // every layout is told apart: by marks of its keys, or (a container whose keys are another's: OLMo's safetensors
    // twins) by its files
    for (size_t i = 0; i < lay_count(); i++)
        EXPECT_TRUE(lay_at(i)->n_marks > 0 || (lay_at(i)->n_parts > 0 && lay_at(i)->parts_stkey)) << lay_at(i)->name;
}

TEST(Layouts, ACheckpointOfTwoLayoutsIsAnErrorListingBoth) {
    ckpt_reader *st = open_ckpt(tiny("model_step5.safetensors"));
    ASSERT_TRUE(st);
    long wq = ckpt_find(st, "layers.0.attention.wq.weight");
    ckv_builder *b = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckv_new(st, 0, &b, &err), 0);
    ASSERT_EQ(ckv_add_same(b, "layers.0.attention.wq.weight", (size_t)wq, &err), 0);
    ASSERT_EQ(ckv_add_same(b, "layers.0.attention.qkv_linear.wq.weight", (size_t)wq, &err), 0);
    ckpt_reader *two = nullptr;
    ASSERT_EQ(ckv_finish(b, &two, &err), 0) << err.msg;
    const lay_layout *got = nullptr;
    EXPECT_EQ(lay_detect(two, nullptr, &got, &err), FSDP_E_FORMAT);
    std::string m = err.msg;
    EXPECT_NE(m.find("matches more than one layout"), std::string::npos) << m;
    EXPECT_NE(m.find("torchtitan-0.2 (key layers.0.attention.wq.weight)"), std::string::npos) << m;
    EXPECT_NE(m.find("torchtitan-0.3 (key layers.0.attention.qkv_linear.wq.weight)"), std::string::npos) << m;
    EXPECT_EQ(got, nullptr);
    ckpt_close(two);
    ckpt_close(st);
}

TEST(Layouts, Torchtitan03FusesTheMomentsInItsGqaOrderAndRoundTripsBitForBit) {
    ckpt_reader *src = open_ckpt(tiny("dcp_full_ws3"));
    ASSERT_TRUE(src);
    const lay_layout *tt3 = lay_find("torchtitan-0.3");
    ckpt_reader *v3 = view(src, tt3, LAY_FROM_CANON);
    ASSERT_TRUE(v3);
    for (int l = 0; l < 2; l++) {
        std::string L = "layers." + std::to_string(l) + ".attention.";
        // the weights are renamed, not fused
        EXPECT_TRUE(rows_of(v3, L + "qkv_linear.wq.weight") == rows_of(src, L + "wq.weight"));
        EXPECT_LT(ckpt_find(v3, (L + "wq.weight").c_str()), 0);
        for (const char *kind : {"exp_avg", "exp_avg_sq"}) {
            std::string s = "optimizer.state." + L;
            std::vector<float> want = gqa_fused(rows_of(src, s + "wq.weight." + kind), rows_of(src, s + "wk.weight." + kind),
                                                rows_of(src, s + "wv.weight." + kind));
            EXPECT_TRUE(rows_of(v3, s + "qkv_linear.wqkv.weight." + kind) == want) << kind;
            // any row range of the fused moment reads the same rows (a rank's shard)
            std::vector<float> part = rows_of(v3, s + "qkv_linear.wqkv.weight." + kind, 37, 101);
            EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + 37 * DIM));
        }
        EXPECT_GE(ckpt_find(v3, ("optimizer.state." + L + "qkv_linear.wqkv.weight.step").c_str()), 0);
        EXPECT_GE(ckpt_find(v3, ("optimizer.param_groups." + L + "qkv_linear.wqkv.weight.lr").c_str()), 0);
        EXPECT_LT(ckpt_find(v3, ("optimizer.state." + L + "wk.weight.exp_avg").c_str()), 0);
    }
    EXPECT_GE(ckpt_find(v3, "lm_head.weight"), 0);
    EXPECT_GE(ckpt_find(v3, "train_state.step"), 0);
    EXPECT_TRUE(lay_matches(v3, tt3));
    const lay_layout *got = nullptr;
    fsdp_err err;
    ASSERT_EQ(lay_detect(v3, nullptr, &got, &err), 0) << err.msg;
    EXPECT_EQ(got, tt3);
    // back: every entry as it was, bit for bit
    ckpt_reader *back = view(v3, tt3, LAY_TO_CANON);
    ASSERT_TRUE(back);
    expect_same_entries(back, src);
    ckpt_close(back);
    ckpt_close(v3);
    ckpt_close(src);
}

// A rotate-half trainer with prefixes of its own, q/k/v fused one after another and the gate and up
// projections fused in halves, written here as its row would be.
const lay_name kHalfNames[] = {
    {"tok_embeddings.weight", "emb.weight"},
    {"layers.*.attention.wo.weight", "blocks.*.attn.out.weight"},
    {"layers.*.feed_forward.w2.weight", "blocks.*.mlp.down.weight"},
    {"layers.*.attention_norm.weight", "blocks.*.ln1.weight"},
    {"layers.*.ffn_norm.weight", "blocks.*.ln2.weight"},
    {"norm.weight", "ln_f.weight"},
    {"output.weight", "head.weight"},
};
const lay_fuse kHalfFuse[] = {
    {"blocks.*.attn.qkv.weight",
     {"layers.*.attention.wq.weight", "layers.*.attention.wk.weight", "layers.*.attention.wv.weight"}, 3, LAY_FUSE_QKV,
     LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS},
    {"blocks.*.mlp.gate_up.weight", {"layers.*.feed_forward.w1.weight", "layers.*.feed_forward.w3.weight"}, 2,
     LAY_FUSE_EQUAL, LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS},
};
const char *const kHalfMarks[] = {"model.blocks.*.attn.qkv.weight"};
const char *const kHalfExtra[] = {"train_state.**"};
// the fields a test row sets; every other one zero (no designated initializers in C++17)
lay_layout half_row() {
    lay_layout L{};
    L.name = "test-half", L.system = "a test trainer", L.covers = "weights, optimizer", L.model = "model.";
    L.optim = "optim.", L.rope = LAY_ROPE_HALF, L.names = kHalfNames, L.n_names = 7, L.fuse = kHalfFuse, L.n_fuse = 2;
    L.marks = kHalfMarks, L.n_marks = 1, L.groups = LAY_GROUPS_INDEXED, L.extra = kHalfExtra, L.n_extra = 1;
    return L;
}
const lay_layout kHalf = half_row();

std::vector<float> permuted(const std::vector<float> &w, int64_t rows, int heads) {
    std::vector<float> out(w.size());
    fsdp_err err;
    EXPECT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, out.data(), w.data(), rows, (int64_t)(w.size() / rows), sizeof(float),
                                heads, &err), 0) << err.msg;
    return out;
}

TEST(Layouts, RotateHalfFusedLayoutPermutesInsideEachPartAndRoundTrips) {
    ckpt_reader *src = open_ckpt(tiny("dcp_full_ws3"));
    ASSERT_TRUE(src);
    ckpt_reader *v = view(src, &kHalf, LAY_FROM_CANON);
    ASSERT_TRUE(v);
    for (const char *pre : {"model.", "optim.state."}) {
        std::string sfx = !strcmp(pre, "model.") ? "" : ".exp_avg", cpre = !strcmp(pre, "model.") ? "" : "optimizer.state.";
        std::vector<float> q = rows_of(src, cpre + "layers.1.attention.wq.weight" + sfx),
                           k = rows_of(src, cpre + "layers.1.attention.wk.weight" + sfx),
                           vv = rows_of(src, cpre + "layers.1.attention.wv.weight" + sfx);
        std::vector<float> want = permuted(q, H * HD, H), kp = permuted(k, KV * HD, KV);
        want.insert(want.end(), kp.begin(), kp.end());
        want.insert(want.end(), vv.begin(), vv.end()); // v keeps its rows
        EXPECT_TRUE(rows_of(v, std::string(pre) + "blocks.1.attn.qkv.weight" + sfx) == want) << pre;
        std::vector<float> g = rows_of(src, cpre + "layers.1.feed_forward.w1.weight" + sfx),
                           u = rows_of(src, cpre + "layers.1.feed_forward.w3.weight" + sfx);
        g.insert(g.end(), u.begin(), u.end());
        EXPECT_TRUE(rows_of(v, std::string(pre) + "blocks.1.mlp.gate_up.weight" + sfx) == g) << pre;
        // a shard that starts inside q and ends inside v
        std::vector<float> part = rows_of(v, std::string(pre) + "blocks.1.attn.qkv.weight" + sfx, 5, 119);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + 5 * DIM)) << pre;
    }
    EXPECT_GE(ckpt_find(v, "optim.param_groups.0.lr"), 0); // one group: every parameter has the same options
    EXPECT_LT(ckpt_find(v, "optim.param_groups.1.lr"), 0);
    EXPECT_GE(ckpt_find(v, "optim.param_groups.0.params"), 0);
    EXPECT_GE(ckpt_find(v, "model.head.weight"), 0);
    ckpt_reader *back = view(v, &kHalf, LAY_TO_CANON);
    ASSERT_TRUE(back);
    expect_same_entries(back, src);
    ckpt_close(back);
    ckpt_close(v);
    ckpt_close(src);
}

TEST(Layouts, WhatALayoutCannotDoIsAnErrorNamingTheTensor) {
    ckpt_reader *src = open_ckpt(tiny("dcp_full_ws3"));
    ASSERT_TRUE(src);
    fsdp_err err;
    ckpt_reader *v = nullptr;
    // head counts unknown: the fused order cannot be computed
    EXPECT_EQ(lay_view(src, 0, lay_find("torchtitan-0.3"), LAY_FROM_CANON, nullptr, &v, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("--n-heads"), std::string::npos) << err.msg;
    EXPECT_NE(std::string(err.msg).find("torchtitan-0.3"), std::string::npos) << err.msg;
    // head counts that do not divide the rows
    lay_facts bad = {5, 2, nullptr, nullptr, 0};
    EXPECT_EQ(lay_view(src, 0, lay_find("torchtitan-0.3"), LAY_FROM_CANON, &bad, &v, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("not q, k and v of 5 heads"), std::string::npos) << err.msg;
    // a layout that holds no train state leaves fsdp-run's out, and says how many
    lay_facts hk = {H, KV, nullptr, nullptr, 0};
    size_t left = 0;
    ASSERT_EQ(lay_view(src, 0, lay_find("olmo-core-3"), LAY_FROM_CANON, &hk, &v, &left, &err), 0) << err.msg;
    EXPECT_EQ(left, 1u); // train_state.step
    EXPECT_LT(ckpt_find(v, "train_state.step"), 0);
    EXPECT_LT(ckpt_find(v, "model.train_state.step"), 0);
    ckpt_close(v);
    ckpt_close(src);
    // a part missing: the weights alone (no moments) fuse, but a checkpoint lacking wk cannot
    ckpt_reader *st = open_ckpt(tiny("model_step5.safetensors"));
    ASSERT_TRUE(st);
    ckv_builder *b = nullptr;
    ASSERT_EQ(ckv_new(st, 0, &b, &err), 0);
    for (size_t i = 0; i < ckpt_count(st); i++) {
        if (strcmp(ckpt_entry_at(st, i)->name, "layers.0.attention.wk.weight")) {
            ASSERT_EQ(ckv_add_same(b, ckpt_entry_at(st, i)->name, i, &err), 0);
        }
    }
    ckpt_reader *nok = nullptr;
    ASSERT_EQ(ckv_finish(b, &nok, &err), 0) << err.msg;
    lay_facts f = {H, KV, nullptr, nullptr, 0};
    EXPECT_EQ(lay_view(nok, 0, &kHalf, LAY_FROM_CANON, &f, &v, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("layers.0.attention.wk.weight"), std::string::npos) << err.msg;
    EXPECT_NE(std::string(err.msg).find("lacks"), std::string::npos) << err.msg;
    ckpt_close(nok);
    ckpt_close(st);
}

TEST(Layouts, AViewChecksItsRuns) {
    ckpt_reader *st = open_ckpt(tiny("model_step5.safetensors"));
    ASSERT_TRUE(st);
    long wq = ckpt_find(st, "layers.0.attention.wq.weight"), wk = ckpt_find(st, "layers.0.attention.wk.weight"),
         norm = ckpt_find(st, "norm.weight");
    ckv_builder *b = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckv_new(st, 0, &b, &err), 0);
    int64_t shape[2] = {96, DIM};
    ckv_run runs[2] = {{(size_t)wq, 0, 1, 0, 1, 64}, {(size_t)wk, 64, 1, 0, 1, 31}};
    EXPECT_EQ(ckv_add_tensor(b, "x", 2, shape, runs, 2, &err), FSDP_E_INVALID); // row 95 given by none
    EXPECT_NE(std::string(err.msg).find("row 95 is given by no part"), std::string::npos) << err.msg;
    runs[1].n = 32;
    runs[1].v0 = 63;
    EXPECT_EQ(ckv_add_tensor(b, "x", 2, shape, runs, 2, &err), FSDP_E_INVALID); // row 63 twice
    EXPECT_NE(std::string(err.msg).find("twice"), std::string::npos) << err.msg;
    ckv_run other = {(size_t)norm, 0, 1, 0, 1, 64};
    EXPECT_EQ(ckv_add_tensor(b, "y", 2, shape, &other, 1, &err), FSDP_E_INVALID); // another row shape
    runs[1].v0 = 64;
    ASSERT_EQ(ckv_add_tensor(b, "x", 2, shape, runs, 2, &err), 0) << err.msg;
    // element pieces of a flat source: a gap, an overlap, and a piece past the source's end are refused
    long flat = ckpt_find(st, "norm.weight"); // [64]
    int64_t s88[2] = {8, 8};
    ckv_piece gap[2] = {{(size_t)flat, 0, 0, 30}, {(size_t)flat, 30, 31, 33}};
    EXPECT_EQ(ckv_add_pieces(b, "p", 2, s88, gap, 2, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("element 30 is given by no piece"), std::string::npos) << err.msg;
    ckv_piece twice[2] = {{(size_t)flat, 0, 0, 32}, {(size_t)flat, 0, 31, 33}};
    EXPECT_EQ(ckv_add_pieces(b, "p", 2, s88, twice, 2, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("element 32 is given twice"), std::string::npos) << err.msg;
    ckv_piece past[1] = {{(size_t)flat, 1, 0, 64}};
    EXPECT_EQ(ckv_add_pieces(b, "p", 2, s88, past, 1, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("outside norm.weight's 64"), std::string::npos) << err.msg;
    // pieces out of order, reversed halves: rows read back in the view's order, whole or in part
    ckv_piece swap[2] = {{(size_t)flat, 32, 0, 32}, {(size_t)flat, 0, 32, 32}};
    ASSERT_EQ(ckv_add_pieces(b, "p", 2, s88, swap, 2, &err), 0) << err.msg;
    ASSERT_EQ(ckv_add_same(b, "x", (size_t)norm, &err), 0);
    ckpt_reader *v = nullptr;
    EXPECT_EQ(ckv_finish(b, &v, &err), FSDP_E_INVALID); // two entries named x
    EXPECT_NE(std::string(err.msg).find("two entries would be named x"), std::string::npos) << err.msg;
    // the same pieces in a view that finishes
    ASSERT_EQ(ckv_new(st, 0, &b, &err), 0);
    ASSERT_EQ(ckv_add_pieces(b, "p", 2, s88, swap, 2, &err), 0) << err.msg;
    ASSERT_EQ(ckv_finish(b, &v, &err), 0) << err.msg;
    std::vector<float> n64 = rows_of(st, "norm.weight"), p = rows_of(v, "p"), p35 = rows_of(v, "p", 3, 5);
    for (int k = 0; k < 64; k++) EXPECT_EQ(p[k], n64[(k + 32) % 64]) << k;
    for (int k = 0; k < 16; k++) EXPECT_EQ(p35[k], n64[(24 + k + 32) % 64]) << k;
    ckpt_close(v);
    ckpt_close(st);
}

struct Dir {
    std::string d = make_tmpdir("fsdp-lay");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

int ckpt_cmd(const std::string &args, std::string *out) { return run_cmd(fsdp_run_bin() + " ckpt " + args, out); }

TEST(LayoutsCli, ConvertBetweenLayoutsRoundTripsAndInspectNamesTheLayout) {
    Dir t;
    std::string out, src = tiny("dcp_full_ws3");
    ASSERT_EQ(ckpt_cmd("inspect " + src, &out), 0) << out;
    EXPECT_NE(out.find("layout: torchtitan-0.2"), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("convert " + src + " " + (t / "tt3") + " --to torchtitan-0.3 --n-heads 4 --n-kv-heads 2 --world 2",
                       &out), 0) << out;
    EXPECT_NE(out.find("layout: torchtitan-0.2 -> torchtitan-0.3"), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("inspect " + (t / "tt3"), &out), 0) << out;
    EXPECT_NE(out.find("layout: torchtitan-0.3"), std::string::npos) << out;
    EXPECT_NE(out.find("optimizer.state.layers.1.attention.qkv_linear.wqkv.weight.exp_avg"), std::string::npos);
    ASSERT_EQ(ckpt_cmd("inspect --json " + (t / "tt3"), &out), 0) << out;
    EXPECT_NE(out.find("\"layout\": \"torchtitan-0.3\""), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("convert " + (t / "tt3") + " " + (t / "back") + " --from auto --n-heads 4 --n-kv-heads 2", &out), 0)
        << out;
    EXPECT_NE(out.find("layout: torchtitan-0.3 -> torchtitan-0.2"), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("diff " + src + " " + (t / "back"), &out), 0) << out;
    // without head counts the fused order is unknown: an error, nothing written
    EXPECT_EQ(ckpt_cmd("convert " + (t / "tt3") + " " + (t / "nohead") + " --from torchtitan-0.3", &out), 2) << out;
    EXPECT_NE(out.find("--n-heads"), std::string::npos) << out;
    EXPECT_FALSE(exists(t / "nohead"));
    EXPECT_NE(ckpt_cmd("convert " + src + " " + (t / "x") + " --from bagel-9", &out), 0) << out;
    EXPECT_NE(out.find("no layout named bagel-9"), std::string::npos) << out;
    EXPECT_FALSE(exists(t / "x"));
}

TEST(LayoutsCli, ConvertCreatesTheDirectoriesAndAnHfExportIsADirectoryAsSaveSafetensorsMakes) {
    Dir t;
    std::string out, st = tiny("model_step5.safetensors");
    ASSERT_EQ(ckpt_cmd("convert " + st + " " + (t / "a/b/model.safetensors"), &out), 0) << out;
    EXPECT_TRUE(exists(t / "a/b/model.safetensors"));
    // --to hf (= --names hf --to safetensors) into a path without .safetensors: the export's directory
    ASSERT_EQ(ckpt_cmd("convert " + st + " " + (t / "x/hf") + " --to hf --model tiny", &out), 0) << out;
    for (const char *f : {"model.safetensors", "config.json", "generation_config.json", "model.safetensors.index.json"})
        EXPECT_TRUE(exists(t / "x/hf/" + f)) << f;
    std::string idx = read_file(t / "x/hf/model.safetensors.index.json");
    EXPECT_NE(idx.find("\"model.layers.1.self_attn.k_proj.weight\": \"model.safetensors\""), std::string::npos) << idx;
    Ckpt hf(t / "x/hf"), back(st);
    ASSERT_TRUE(hf.r);
    EXPECT_EQ(ckpt_count(hf.r), ckpt_count(back.r));
    // and back into fsdp-run's names, bit for bit
    ASSERT_EQ(ckpt_cmd("convert " + (t / "x/hf") + " " + (t / "tt.safetensors") + " --names torchtitan --model tiny", &out), 0)
        << out;
    Ckpt tt(t / "tt.safetensors");
    expect_same_tensors(tt.r, back.r);
}

// A fused tensor's parts (runs of whole rows) stream from the source's bytes as a renamed tensor does; the
// permuted q/k rows of a rotate-half layout are read and written whole: the same checkpoint either way.
TEST(LayoutsCli, StreamedPartsAreTheRowsReadWhole) {
    Dir t;
    std::string out;
    for (const char *src : {"tests/data/trainers/torchtitan-0.3/ws2/step-3", "tests/data/trainers/olmo-core-3.0/ws2",
                            "tests/data/trainers/fms-1.13/ws2/checkpoints/step_3_ckp"}) {
        rm_rf(t / "a");
        rm_rf(t / "b");
        ASSERT_EQ(ckpt_cmd(std::string("convert ") + src + " " + (t / "a") + " --from auto --n-heads 4 --n-kv-heads 2 --world 3",
                           &out), 0) << out;
        ASSERT_EQ(run_cmd("FSDP_CONVERT_STREAM=0 " + fsdp_run_bin() + " ckpt convert " + src + " " + (t / "b") +
                              " --from auto --n-heads 4 --n-kv-heads 2 --world 3", &out), 0) << out;
        Ckpt a(t / "a"), b(t / "b");
        expect_same_tensors(a.r, b.r);
        ASSERT_EQ(ckpt_cmd("inspect --verify " + (t / "a"), &out), 0) << out;
    }
}

TEST(LayoutsLoad, Torchtitan03CheckpointLoadsStrictlyOnOneAndThreeRanks) {
    Dir t;
    std::string out;
    ASSERT_EQ(ckpt_cmd("convert " + tiny("dcp_full_ws3") + " " + (t / "tt3") +
                       " --to torchtitan-0.3 --n-heads 4 --n-kv-heads 2 --world 2", &out), 0) << out;
    for (int np : {1, 3}) {
        std::string o = t / ("re" + std::to_string(np));
        write_file(t / "l.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                     (t / "tt3") + "}}\n  - {id: s, uses: save-dcp, with: {path: " + o + "}}\n");
        int rc;
        std::string log = run_np(np, t / "l.yaml", &rc);
        ASSERT_EQ(rc, 0) << log;
        Ckpt got(o), want(tiny("dcp_full_ws3"));
        expect_same_tensors(got.r, want.r);
    }
    // layout named explicitly: the same; a layout that does not fit is refused by validate
    write_file(t / "bad.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + (t / "tt3") +
                                   ", layout: torchtitan-0.9}}\n");
    int rc;
    std::string log = run_np(1, "validate " + (t / "bad.yaml"), &rc);
    EXPECT_EQ(rc, 2) << log;
    EXPECT_NE(log.find("layout: 'torchtitan-0.9' is none of auto, hf, torchtitan-0.2, torchtitan-0.3"), std::string::npos)
        << log;
    // read as torchtitan-0.2 on purpose: the strict load names the keys it cannot place
    write_file(t / "as02.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + (t / "tt3") +
                                    ", layout: torchtitan-0.2}}\n");
    log = run_np(1, t / "as02.yaml", &rc);
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find("optimizer.state.layers.0.attention.qkv_linear.wqkv.weight.exp_avg"), std::string::npos) << log;
    EXPECT_NE(log.find("layout torchtitan-0.2 was named, but"), std::string::npos) << log;
}

} // namespace
