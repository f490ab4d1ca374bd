// Mixture-of-experts checkpoints (ckpt/namemap.h "Stacks"): torchtitan's grouped experts
// layers.L.moe.experts.w1|w2|w3 [E, ...] <-> the per-expert Hugging Face tensors, in the name map, in a
// strict load-ckpt (names: hf) that reads each rank's experts only, in save-safetensors (names: hf) and
// in `fsdp-run ckpt convert` HF <-> DCP, bit-exact on the transformers 5.24 fixtures
// (tests/data/moe-5.24: Qwen3-MoE, OLMoE, Mixtral) and a tiny DeepSeek-V3 (tests/data/deepseek_v3_tiny,
// tools/gen/gen_deepseek_v3_fixture.py; bf16 and FP8 block-scaled).
#include <gtest/gtest.h>

#include <jansson.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/namemap.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
#include "ckpt/state_io.h"
#include "pipeline/value_impl.h"
#include "runtime/ctx_impl.h"
#include "runtime/state.h"
#include "stages/stages.h"
}
#include "test_util.h"

using namespace fsdp_test;

namespace {

const char *MOE_DIR = "tests/data/moe-5.24/";
const char *DSV3 = "tests/data/deepseek_v3_tiny/";

std::string moe_fixture(const std::string &m) { return std::string(MOE_DIR) + m; }

std::string map_hf(nmap_dir dir, const std::string &name, const nmap_hf &hf, nmap_info *info) {
    char out[NMAP_NAME_MAX];
    fsdp_err err{};
    int rc = nmap_map_hf(dir, name.c_str(), &hf, out, sizeof out, info, &err);
    return rc ? std::string("ERR:") + err.msg : std::string(out);
}

// ---- the state of a fixture's model: torchtitan's grouped names and shapes from its config.json ----

struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    int layer;
};

struct Model {
    std::vector<Spec> p;
    state_hf_names hf{};
    state_hf_moe_names moe{};
};

int64_t jint(json_t *c, const char *k, int64_t dflt) {
    json_t *v = json_object_get(c, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

Model model_of(const std::string &dir) {
    Model m;
    json_error_t je;
    json_t *c = json_load_file((dir + "/config.json").c_str(), 0, &je);
    EXPECT_NE(c, nullptr) << je.text;
    if (!c) return m;
    std::string mt = json_string_value(json_object_get(c, "model_type"));
    int64_t d = jint(c, "hidden_size", 0), V = jint(c, "vocab_size", 0), L = jint(c, "num_hidden_layers", 0);
    int64_t nh = jint(c, "num_attention_heads", 0), nkv = jint(c, "num_key_value_heads", nh);
    int64_t hd = jint(c, "head_dim", d / nh), E = jint(c, "num_local_experts", jint(c, "num_experts", 0));
    int64_t F = jint(c, "moe_intermediate_size", jint(c, "intermediate_size", 0)), Fd = jint(c, "intermediate_size", 0);
    std::vector<int64_t> dense;
    json_t *mlp_only = json_object_get(c, "mlp_only_layers");
    for (size_t i = 0; i < json_array_size(mlp_only); i++) dense.push_back(json_integer_value(json_array_get(mlp_only, i)));
    json_decref(c);
    m.hf = {1, (int)nh, (int)nkv, 0};
    m.moe = {mt == "olmoe", mt == "mixtral" ? STATE_HF_MOE_MIXTRAL : STATE_HF_MOE_MLP};
    m.p.push_back({"tok_embeddings.weight", {V, d}, -1});
    for (int l = 0; l < (int)L; l++) {
        std::string pre = "layers." + std::to_string(l) + ".";
        m.p.push_back({pre + "attention.wq.weight", {nh * hd, d}, l});
        m.p.push_back({pre + "attention.wk.weight", {nkv * hd, d}, l});
        m.p.push_back({pre + "attention.wv.weight", {nkv * hd, d}, l});
        m.p.push_back({pre + "attention.wo.weight", {d, nh * hd}, l});
        if (mt == "qwen3_moe") {
            m.p.push_back({pre + "attention.q_norm.weight", {hd}, l});
            m.p.push_back({pre + "attention.k_norm.weight", {hd}, l});
        } else if (mt == "olmoe") {
            m.p.push_back({pre + "attention.q_norm.weight", {nh * hd}, l});
            m.p.push_back({pre + "attention.k_norm.weight", {nkv * hd}, l});
        }
        m.p.push_back({pre + "attention_norm.weight", {d}, l});
        m.p.push_back({pre + "ffn_norm.weight", {d}, l});
        bool is_dense = false;
        for (int64_t x : dense) is_dense |= x == l;
        if (is_dense) {
            m.p.push_back({pre + "feed_forward.w1.weight", {Fd, d}, l});
            m.p.push_back({pre + "feed_forward.w2.weight", {d, Fd}, l});
            m.p.push_back({pre + "feed_forward.w3.weight", {Fd, d}, l});
        } else {
            m.p.push_back({pre + "moe.router.gate.weight", {E, d}, l});
            m.p.push_back({pre + "moe.experts.w1", {E, F, d}, l});
            m.p.push_back({pre + "moe.experts.w2", {E, d, F}, l});
            m.p.push_back({pre + "moe.experts.w3", {E, F, d}, l});
        }
    }
    m.p.push_back({"norm.weight", {d}, -1});
    m.p.push_back({"output.weight", {V, d}, -1});
    return m;
}

void add_params(fsdp_state *s, const Model &m) {
    fsdp_err err{};
    for (const Spec &p : m.p)
        ASSERT_EQ(state_add_param(s, p.name.c_str(), (int)p.shape.size(), p.shape.data(), p.layer, &err), 0) << err.msg;
    s->hf = m.hf;
    s->hf_moe = m.moe;
}

fsdp_state *bare_state(int rank, int world, const Model &m) {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof *s);
    s->layout = STATE_SHARDED;
    s->rank = rank;
    s->world = world;
    add_params(s, m);
    return s;
}

int load_hf(fsdp_state *s, const std::string &path, sio_load_result *res, fsdp_err *err, const char *exclude = nullptr) {
    sio_load_opts o;
    memset(&o, 0, sizeof o);
    o.names = SIO_NAMES_HF;
    o.strict = 1;
    o.load_optimizer = 0;
    const char *ex[1] = {exclude};
    if (exclude) o.exclude = ex, o.n_exclude = 1;
    return sio_load(s, path.c_str(), &o, res, err);
}

// Every tensor of two safetensors files equal (names, dtypes, shapes, bytes): "" or what differs.
std::string st_diff(const std::string &a, const std::string &b) {
    st_reader *ra = nullptr, *rb = nullptr;
    fsdp_err err{};
    if (st_open(&ra, a.c_str(), &err)) return std::string("open ") + a + ": " + err.msg;
    if (st_open(&rb, b.c_str(), &err)) {
        st_close(ra);
        return std::string("open ") + b + ": " + err.msg;
    }
    std::string out;
    if (st_count(ra) != st_count(rb))
        out = "tensor counts " + std::to_string(st_count(ra)) + " vs " + std::to_string(st_count(rb)) + "; ";
    for (size_t i = 0; i < st_count(ra) && out.size() < 2000; i++) {
        const st_tensor_info *x = st_tensor(ra, i), *y = st_find(rb, x->name);
        if (!y) {
            out += std::string(x->name) + " missing; ";
            continue;
        }
        if (x->dtype != y->dtype || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * x->ndim) ||
            x->nbytes != y->nbytes || memcmp(st_data(ra, x), st_data(rb, y), x->nbytes))
            out += std::string(x->name) + " differs; ";
    }
    st_close(ra);
    st_close(rb);
    return out;
}

// The float32 values of tensor `name` of a safetensors file.
std::vector<float> st_values(const std::string &path, const std::string &name) {
    st_reader *r = nullptr;
    fsdp_err err{};
    std::vector<float> v;
    if (st_open(&r, path.c_str(), &err)) return v;
    const st_tensor_info *t = st_find(r, name.c_str());
    if (t) {
        v.resize((size_t)(t->nbytes / fsdp_dtype_size(t->dtype)));
        EXPECT_EQ(st_read(r, t, v.data(), FSDP_DT_F32, &err), 0) << err.msg;
    }
    st_close(r);
    return v;
}

// save-safetensors (names: hf) of the state of a context into path.
int save_hf(fsdp_ctx *ctx, const std::string &path, fsdp_err *err) {
    fsdp_value *with = val_new(FSDP_V_MAP, nullptr, 0, 0);
    val_map_set(with, "path", val_scalar(path.c_str(), 1, nullptr, 0, 0), 0, 0);
    val_map_set(with, "names", val_scalar("hf", 1, nullptr, 0, 0), 0, 0);
    int rc = stage_save_safetensors.run(ctx, with, err);
    val_free(with);
    return rc;
}

// A copy of a safetensors file without the tensors named in drop, with one renamed (from -> to) or
// one of another shape (reshape: its first dim one less).
std::string rewrite_st(const std::string &src, const std::string &dst, const std::vector<std::string> &drop,
                       const std::string &reshape = "") {
    st_reader *r = nullptr;
    st_writer *w = nullptr;
    fsdp_err err{};
    if (st_open(&r, src.c_str(), &err)) return err.msg;
    EXPECT_EQ(st_writer_new(&w, dst.c_str(), &err), 0) << err.msg;
    std::vector<std::pair<size_t, size_t>> keep;
    for (size_t i = 0; i < st_count(r); i++) {
        const st_tensor_info *t = st_tensor(r, i);
        bool skip = false;
        for (const std::string &d : drop) skip |= d == t->name;
        if (skip) continue;
        int64_t shape[FSDP_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (reshape == t->name) shape[0] -= 1;
        size_t idx;
        EXPECT_EQ(st_writer_declare(w, t->name, t->dtype, t->ndim, shape, &idx, &err), 0) << err.msg;
        keep.push_back({i, idx});
    }
    EXPECT_EQ(st_writer_begin(w, &err), 0) << err.msg;
    for (auto &k : keep) {
        const st_tensor_info *t = st_tensor(r, k.first);
        size_t n = t->nbytes;
        if (reshape == t->name) n -= n / (size_t)t->shape[0];
        EXPECT_EQ(st_writer_write(w, k.second, st_data(r, t), n, &err), 0) << err.msg;
    }
    EXPECT_EQ(st_writer_finish(w, &err), 0) << err.msg;
    st_writer_free(w);
    st_close(r);
    return "";
}

const std::vector<std::string> FIXTURES = {"qwen3_moe_tiny", "olmoe_tiny", "mixtral_tiny"};

}  // namespace

// ---- the name map ------------------------------------------------------------------------------------

TEST(NmapMoe, ExpertsRouterAndStackedPartsBothWays) {
    nmap_hf mlp{4, 2, 0, 0, 0}, mix{4, 2, 0, 1, 0};
    nmap_info info{};
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.3.mlp.experts.17.gate_proj.weight", mlp, &info), "layers.3.moe.experts.w1");
    EXPECT_TRUE(info.stacked);
    EXPECT_EQ(info.part, 17);
    EXPECT_EQ(info.layer, 3);
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.0.mlp.experts.0.down_proj.weight", mlp, &info), "layers.0.moe.experts.w2");
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.0.mlp.experts.2.up_proj.weight", mlp, &info), "layers.0.moe.experts.w3");
    EXPECT_EQ(info.part, 2);
    // Mixtral's names map the same way, whatever hf says (HF -> torchtitan accepts both)
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.block_sparse_moe.experts.3.w1.weight", mlp, &info),
              "layers.1.moe.experts.w1");
    EXPECT_EQ(info.part, 3);
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.block_sparse_moe.experts.3.w2.weight", mlp, &info),
              "layers.1.moe.experts.w2");
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.block_sparse_moe.experts.3.w3.weight", mlp, &info),
              "layers.1.moe.experts.w3");
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.block_sparse_moe.gate.weight", mlp, &info), "layers.1.moe.router.gate.weight");
    EXPECT_FALSE(info.stacked);
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.mlp.gate.weight", mlp, &info), "layers.1.moe.router.gate.weight");
    // torchtitan -> HF: the router by the style, a stack has no single name
    EXPECT_EQ(map_hf(NMAP_TT_TO_HF, "layers.1.moe.router.gate.weight", mlp, &info), "model.layers.1.mlp.gate.weight");
    EXPECT_EQ(map_hf(NMAP_TT_TO_HF, "layers.1.moe.router.gate.weight", mix, &info), "model.layers.1.block_sparse_moe.gate.weight");
    EXPECT_EQ(map_hf(NMAP_TT_TO_HF, "layers.5.moe.experts.w2", mlp, &info), "");
    EXPECT_TRUE(info.stacked);
    char out[NMAP_NAME_MAX];
    fsdp_err err{};
    ASSERT_EQ(nmap_stack_part_name("layers.5.moe.experts.w2", 7, &mlp, out, sizeof out, &err), 0) << err.msg;
    EXPECT_STREQ(out, "model.layers.5.mlp.experts.7.down_proj.weight");
    ASSERT_EQ(nmap_stack_part_name("layers.5.moe.experts.w3", 0, &mix, out, sizeof out, &err), 0) << err.msg;
    EXPECT_STREQ(out, "model.layers.5.block_sparse_moe.experts.0.w3.weight");
    EXPECT_EQ(nmap_stack_part_name("layers.5.feed_forward.w1.weight", 0, &mlp, out, sizeof out, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("layers.5.feed_forward.w1.weight"), std::string::npos) << err.msg;
    // not experts: "experts.x", a part name of the other style, no expert number
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.mlp.experts.x.gate_proj.weight", mlp, &info).rfind("ERR:", 0), 0u);
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.mlp.experts.0.w1.weight", mlp, &info).rfind("ERR:", 0), 0u);
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.1.mlp.experts.gate_proj.weight", mlp, &info).rfind("ERR:", 0), 0u);
    // the one-tensor mapping refuses a stack or a part of one, naming it
    EXPECT_EQ(nmap_map(NMAP_HF_TO_TT, "model.layers.3.mlp.experts.1.gate_proj.weight", 4, 2, out, sizeof out, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("experts.1.gate_proj"), std::string::npos) << err.msg;
    EXPECT_EQ(nmap_map(NMAP_TT_TO_HF, "layers.3.moe.experts.w1", 4, 2, out, sizeof out, nullptr, &err), FSDP_E_INVALID);
    // the router maps through the one-tensor mapping too
    ASSERT_EQ(nmap_map(NMAP_TT_TO_HF, "layers.3.moe.router.gate.weight", 4, 2, out, sizeof out, nullptr, &err), 0);
    EXPECT_STREQ(out, "model.layers.3.mlp.gate.weight");
}

TEST(NmapMoe, QkNormsOverTheWholeProjectionPermuteAsQAndKRows) {
    nmap_hf per_head{4, 2, 0, 0, 0}, full{4, 2, 1, 0, 0};
    nmap_info info{};
    map_hf(NMAP_HF_TO_TT, "model.layers.0.self_attn.q_norm.weight", per_head, &info);
    EXPECT_EQ(info.qk, NMAP_QK_HEAD);
    EXPECT_EQ(info.heads, 1);
    EXPECT_EQ(map_hf(NMAP_HF_TO_TT, "model.layers.0.self_attn.q_norm.weight", full, &info), "layers.0.attention.q_norm.weight");
    EXPECT_EQ(info.qk, NMAP_QK_Q);
    EXPECT_EQ(info.heads, 4);
    map_hf(NMAP_TT_TO_HF, "layers.0.attention.k_norm.weight", full, &info);
    EXPECT_EQ(info.qk, NMAP_QK_K);
    EXPECT_EQ(info.heads, 2);
}

TEST(NmapMoe, DeepSeekV3NamesAreRenamedOnly) {
    nmap_hf mla{4, 4, 0, 0, 1};
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {"layers.1.attention.wq_a.weight", "model.layers.1.self_attn.q_a_proj.weight"},
        {"layers.1.attention.q_norm.weight", "model.layers.1.self_attn.q_a_layernorm.weight"},
        {"layers.1.attention.wq_b.weight", "model.layers.1.self_attn.q_b_proj.weight"},
        {"layers.1.attention.wq.weight", "model.layers.1.self_attn.q_proj.weight"},
        {"layers.1.attention.wkv_a.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"},
        {"layers.1.attention.kv_norm.weight", "model.layers.1.self_attn.kv_a_layernorm.weight"},
        {"layers.1.attention.wkv_b.weight", "model.layers.1.self_attn.kv_b_proj.weight"},
        {"layers.1.attention.wo.weight", "model.layers.1.self_attn.o_proj.weight"},
        {"layers.1.moe.shared_experts.w1.weight", "model.layers.1.mlp.shared_experts.gate_proj.weight"},
        {"layers.1.moe.shared_experts.w2.weight", "model.layers.1.mlp.shared_experts.down_proj.weight"},
        {"layers.1.moe.shared_experts.w3.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"},
        {"layers.1.moe.expert_bias", "model.layers.1.mlp.gate.e_score_correction_bias"},
        {"layers.1.moe.router.gate.weight", "model.layers.1.mlp.gate.weight"},
        {"layers.0.feed_forward.w1.weight", "model.layers.0.mlp.gate_proj.weight"},
    };
    for (auto &p : pairs) {
        nmap_info info{};
        EXPECT_EQ(map_hf(NMAP_TT_TO_HF, p.first, mla, &info), p.second);
        EXPECT_EQ(info.qk, NMAP_QK_NONE) << p.first;
        EXPECT_EQ(map_hf(NMAP_HF_TO_TT, p.second, mla, &info), p.first);
        EXPECT_EQ(info.qk, NMAP_QK_NONE) << p.second;
    }
    // without MLA, q_norm is Qwen3's per-head norm
    nmap_info info{};
    EXPECT_EQ(map_hf(NMAP_TT_TO_HF, "layers.1.attention.q_norm.weight", nmap_hf{4, 4, 0, 0, 0}, &info),
              "model.layers.1.self_attn.q_norm.weight");
    EXPECT_EQ(info.qk, NMAP_QK_HEAD);
}

TEST(NmapMoe, StackPiecesCoverARowRangeAcrossParts) {
    // parts of 3 rows; flat rows [2, 10) = part 0 rows [2,3), part 1 [0,3), part 2 [0,3), part 3 [0,1)
    std::vector<std::vector<int64_t>> got;
    for (int64_t f = 2; f < 10;) {
        int k;
        int64_t a, b;
        nmap_stack_piece(3, f, 10, &k, &a, &b);
        got.push_back({k, a, b});
        f += b - a;
    }
    std::vector<std::vector<int64_t>> want = {{0, 2, 3}, {1, 0, 3}, {2, 0, 3}, {3, 0, 1}};
    EXPECT_EQ(got, want);
    int k;
    int64_t a, b;
    nmap_stack_piece(4, 5, 6, &k, &a, &b);
    EXPECT_EQ(k, 1);
    EXPECT_EQ(a, 1);
    EXPECT_EQ(b, 2);
}

// ---- load-ckpt and save-safetensors ----------------------------------------------------------------

// HF -> state (strict, names: hf) -> save-safetensors names: hf gives the fixture's bytes, every tensor.
TEST(MoeLoad, HfToStateToHfIsBitExactForEveryFixture) {
    for (const std::string &f : FIXTURES) {
        SCOPED_TRACE(f);
        Model m = model_of(moe_fixture(f));
        fsdp_ctx *ctx = ctx_new(nullptr, 0, stderr);
        ASSERT_NE(ctx, nullptr);
        fsdp_state *s = nullptr;
        fsdp_err err{};
        ASSERT_EQ(state_create(ctx, STATE_SHARDED, &s, &err), 0) << err.msg;
        add_params(s, m);
        sio_load_result res;
        ASSERT_EQ(load_hf(s, moe_fixture(f) + "/model.safetensors", &res, &err), 0) << err.msg;
        EXPECT_EQ(res.params_loaded, s->n);
        // expert 2 of layer 0's w2 is rows [2] of the stack, the fixture's tensor as it is
        const char *w2 = f == "mixtral_tiny" ? "model.layers.0.block_sparse_moe.experts.2.w2.weight"
                                             : "model.layers.0.mlp.experts.2.down_proj.weight";
        std::vector<float> want = st_values(moe_fixture(f) + "/model.safetensors", w2);
        state_param *p = state_find(s, "layers.0.moe.experts.w2");
        ASSERT_NE(p, nullptr);
        ASSERT_EQ((int64_t)want.size(), p->row_numel);
        EXPECT_EQ(memcmp(p->data + 2 * p->row_numel, want.data(), want.size() * sizeof(float)), 0);
        std::string t = make_tmpdir("moe_save");
        ASSERT_EQ(save_hf(ctx, t + "/o.safetensors", &err), 0) << err.msg;
        EXPECT_EQ(st_diff(moe_fixture(f) + "/model.safetensors", t + "/o.safetensors"), "");
        ctx_free(ctx);
        rm_rf(t);
    }
}

// Sharded over 3 ranks (4 experts: ranks 0 and 1 hold two each, rank 2 none): each rank's rows equal
// the full load's, and a rank reads only the bytes of its own experts (what it reads beyond the same
// load without the experts).
TEST(MoeLoad, EachRankReadsOnlyItsExperts) {
    const std::string f = moe_fixture("olmoe_tiny");
    Model m = model_of(f);
    fsdp_state *full = bare_state(0, 1, m);
    sio_load_result res_full;
    fsdp_err err{};
    ASSERT_EQ(load_hf(full, f + "/model.safetensors", &res_full, &err), 0) << err.msg;
    uint64_t expert_bytes = 0;
    for (size_t i = 0; i < full->n; i++)
        if (strstr(full->p[i].name, "moe.experts.")) expert_bytes += (uint64_t)state_param_numel(&full->p[i]) * 4;
    Model no_experts = m;
    no_experts.p.clear();
    for (const Spec &p : m.p)
        if (p.name.find("moe.experts.") == std::string::npos) no_experts.p.push_back(p);
    for (int r = 0; r < 3; r++) {
        fsdp_state *s = bare_state(r, 3, m);
        sio_load_result res;
        ASSERT_EQ(load_hf(s, f + "/model.safetensors", &res, &err), 0) << err.msg;
        EXPECT_EQ(res.params_loaded, s->n);
        for (size_t i = 0; i < s->n; i++) {
            const state_param *p = &s->p[i], *q = &full->p[i];
            ASSERT_EQ(memcmp(p->data, q->data + p->row0 * p->row_numel, state_param_local_numel(p) * sizeof(float)), 0)
                << p->name << " rank " << r;
        }
        uint64_t mine = 0;
        for (size_t i = 0; i < s->n; i++)
            if (strstr(s->p[i].name, "moe.experts.")) mine += state_param_local_numel(&s->p[i]) * 4;
        if (r == 2) EXPECT_EQ(mine, 0u);
        else EXPECT_EQ(mine, expert_bytes / 2);
        fsdp_state *rest = bare_state(r, 3, no_experts);
        sio_load_result res_rest;
        ASSERT_EQ(load_hf(rest, f + "/model.safetensors", &res_rest, &err, "model.layers.*.mlp.experts.**"), 0) << err.msg;
        EXPECT_EQ(res.bytes_read - res_rest.bytes_read, mine) << "rank " << r;
        state_free(rest);
        state_free(s);
    }
    state_free(full);
}

TEST(MoeLoad, StrictNamesAMissingExpertAWrongShapeAndAnExtraExpert) {
    const std::string f = moe_fixture("qwen3_moe_tiny");
    std::string t = make_tmpdir("moe_bad");
    Model m = model_of(f);
    fsdp_err err{};
    // expert 3 of layer 0's up_proj missing
    rewrite_st(f + "/model.safetensors", t + "/missing.safetensors", {"model.layers.0.mlp.experts.3.up_proj.weight"});
    fsdp_state *s = bare_state(0, 1, m);
    sio_load_result res;
    EXPECT_EQ(load_hf(s, t + "/missing.safetensors", &res, &err), FSDP_E_INVALID);
    std::string msg = err.msg;
    EXPECT_NE(msg.find("layers.0.moe.experts.w3 [4, 32, 64] not restored: 1 of its 4 experts missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.0.mlp.experts.3.up_proj.weight"), std::string::npos) << msg;
    EXPECT_TRUE(std::isnan(state_find(s, "layers.0.moe.experts.w3")->data[0]));  // strict: NaN, not a partial stack
    state_free(s);
    // expert 1's gate_proj one row short
    rewrite_st(f + "/model.safetensors", t + "/shape.safetensors", {}, "model.layers.0.mlp.experts.1.gate_proj.weight");
    s = bare_state(0, 1, m);
    EXPECT_EQ(load_hf(s, t + "/shape.safetensors", &res, &err), FSDP_E_INVALID);
    msg = err.msg;
    EXPECT_NE(msg.find("model.layers.0.mlp.experts.1.gate_proj.weight (expert 1 of layers.0.moe.experts.w1 [4, 32, 64]) "
                       "has shape [31, 64] in the checkpoint, the model needs [32, 64]"),
              std::string::npos)
        << msg;
    state_free(s);
    // a model of 3 experts: the checkpoint's expert 3 is too many
    Model m3 = m;
    for (Spec &p : m3.p)
        if (p.name.find("moe.") != std::string::npos) p.shape[0] = 3;
    s = bare_state(0, 1, m3);
    EXPECT_EQ(load_hf(s, f + "/model.safetensors", &res, &err), FSDP_E_INVALID);
    msg = err.msg;
    EXPECT_NE(msg.find("model.layers.0.mlp.experts.3.gate_proj.weight is expert 3 of layers.0.moe.experts.w1, whose "
                       "shape [3, 32, 64] holds experts 0 to 2 only"),
              std::string::npos)
        << msg;
    state_free(s);
    rm_rf(t);
}

// ---- ckpt convert HF <-> DCP ------------------------------------------------------------------------

namespace {

std::string convert(const std::string &args, int *rc) {
    std::string out;
    *rc = run_cmd(fsdp_run_bin() + " ckpt convert " + args, &out);
    return out;
}

// HF -> DCP (--world W) -> HF: byte-identical tensors; the DCP holds the stacked experts.
void round_trip(const std::string &dir, const std::string &file, int world, const std::string &stacked,
                const std::vector<int64_t> &shape, const std::string &extra = "") {
    std::string t = make_tmpdir("moe_conv");
    int rc;
    std::string o = convert(dir + "/" + file + " " + t + "/dcp --names torchtitan --world " + std::to_string(world) +
                                " --hf-config " + dir + extra,
                            &rc);
    ASSERT_EQ(rc, 0) << o;
    ckpt_reader *r = nullptr;
    fsdp_err err{};
    ASSERT_EQ(ckpt_open((t + "/dcp").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    long i = ckpt_find(r, stacked.c_str());
    ASSERT_GE(i, 0) << stacked;
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    EXPECT_EQ(std::vector<int64_t>(e->shape, e->shape + e->ndim), shape);
    EXPECT_EQ(e->chunks, world > shape[0] ? (int)shape[0] : world);
    ckpt_close(r);
    o = convert(t + "/dcp " + t + "/back.safetensors --names hf --hf-config " + dir + extra, &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(st_diff(dir + "/" + file, t + "/back.safetensors"), "");
    rm_rf(t);
}

}  // namespace

TEST(ConvertMoe, HfToDcpToHfIsBitExactForEveryFixture) {
    for (const std::string &f : FIXTURES)
        for (int world : {1, 3}) {
            SCOPED_TRACE(f + " world " + std::to_string(world));
            // (Qwen3-MoE's layer 1 is dense)
            round_trip(moe_fixture(f), "model.safetensors", world,
                       f == "qwen3_moe_tiny" ? "layers.0.moe.experts.w2" : "layers.1.moe.experts.w2", {4, 64, 32});
        }
}

// DCP -> HF writes each stack's experts among the other tensors of the file, in runs: the stored CRC of the
// stack's record still covers all of its experts, read in order across the runs, so a byte damaged in expert 2
// fails the convert naming the stack and its file, and no safetensors file is left.
TEST(ConvertMoe, DamagedStackRecordFailsOnItsCrc) {
    const std::string dir = moe_fixture("qwen3_moe_tiny"), t = make_tmpdir("moe_crc");
    int rc;
    std::string o = convert(dir + "/model.safetensors " + t + "/dcp --names torchtitan --hf-config " + dir, &rc);
    ASSERT_EQ(rc, 0) << o;
    st_reader *r = nullptr;
    fsdp_err err{};
    ASSERT_EQ(st_open(&r, (dir + "/model.safetensors").c_str(), &err), 0) << err.msg;
    const st_tensor_info *x = st_find(r, "model.layers.0.mlp.experts.2.gate_proj.weight");
    ASSERT_NE(x, nullptr);
    std::string expert((const char *)st_data(r, x), (size_t)x->nbytes);
    st_close(r);
    std::string f = t + "/dcp/__0_0.distcp", bytes = read_file(f);
    size_t at = bytes.find(expert);
    ASSERT_NE(at, std::string::npos) << "expert 2's bytes in the stacked record";
    bytes[at + expert.size() / 2] ^= 0x21;
    write_file(f, bytes);
    for (const char *env : {"", "FSDP_CONVERT_PIECE=4096 "}) {
        rc = run_cmd(std::string(env) + fsdp_run_bin() + " ckpt convert " + t + "/dcp " + t +
                         "/x.safetensors --names hf --hf-config " + dir, &o);
        EXPECT_EQ(rc, 1) << env << o;
        EXPECT_NE(o.find("CRC"), std::string::npos) << env << o;
        EXPECT_NE(o.find("layers.0.moe.experts.w1"), std::string::npos) << env << o;
        EXPECT_NE(o.find("__0_0.distcp"), std::string::npos) << env << o;
        EXPECT_FALSE(exists(t + "/x.safetensors")) << env;
        EXPECT_FALSE(exists(t + "/x.safetensors.tmp")) << env;
    }
    rm_rf(t);
}

TEST(ConvertMoe, DeepSeekV3HfToDcpToHfIsBitExact) {
    const std::string d = std::string(DSV3) + "bf16";
    round_trip(d, "model.safetensors", 1, "layers.2.moe.experts.w1", {4, 32, 64});
    round_trip(d, "model.safetensors", 2, "layers.1.moe.experts.w2", {4, 64, 32});
    // the MLA names, the shared experts, the router bias and the dense layer 0 under torchtitan's names
    std::string t = make_tmpdir("moe_ds");
    int rc;
    std::string o = convert(d + "/model.safetensors " + t + "/dcp --names torchtitan", &rc);
    ASSERT_EQ(rc, 0) << o;
    ckpt_reader *r = nullptr;
    fsdp_err err{};
    ASSERT_EQ(ckpt_open((t + "/dcp").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    for (const char *k : {"layers.1.attention.wq_a.weight", "layers.1.attention.q_norm.weight", "layers.1.attention.wq_b.weight",
                          "layers.1.attention.wkv_a.weight", "layers.1.attention.kv_norm.weight",
                          "layers.1.attention.wkv_b.weight", "layers.1.attention.wo.weight",
                          "layers.1.moe.shared_experts.w1.weight", "layers.1.moe.shared_experts.w2.weight",
                          "layers.1.moe.shared_experts.w3.weight", "layers.1.moe.expert_bias",
                          "layers.1.moe.router.gate.weight", "layers.0.feed_forward.w1.weight"})
        EXPECT_GE(ckpt_find(r, k), 0) << k;
    EXPECT_EQ(ckpt_count(r), 67u - 2 * 3 * 4 + 2 * 3);  // 2 MoE layers: 12 expert tensors -> 3 stacks each
    ckpt_close(r);
    rm_rf(t);
}

// FP8 block-scaled experts and attention: --dtype bf16 dequantises them (PyTorch's values bit for bit)
// into the stacks; back to HF, every dequantised weight is expected.safetensors' and the rest the source's.
TEST(ConvertMoe, DeepSeekV3Fp8DequantisedWithDtype) {
    const std::string d = std::string(DSV3) + "fp8";
    std::string t = make_tmpdir("moe_fp8");
    int rc;
    std::string o = convert(d + "/model.safetensors " + t + "/dcp --names torchtitan --dtype bf16 --world 2", &rc);
    ASSERT_EQ(rc, 0) << o;
    o = convert(t + "/dcp " + t + "/back.safetensors --names hf --hf-config " + d, &rc);
    ASSERT_EQ(rc, 0) << o;
    st_reader *back = nullptr, *want = nullptr, *src = nullptr;
    fsdp_err err{};
    ASSERT_EQ(st_open(&back, (t + "/back.safetensors").c_str(), &err), 0) << err.msg;
    ASSERT_EQ(st_open(&want, (d + "/expected.safetensors").c_str(), &err), 0) << err.msg;
    ASSERT_EQ(st_open(&src, (d + "/model.safetensors").c_str(), &err), 0) << err.msg;
    size_t weights = 0;
    for (size_t i = 0; i < st_count(src); i++) {
        const st_tensor_info *s = st_tensor(src, i);
        std::string n = s->name;
        if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0) {
            EXPECT_EQ(st_find(back, s->name), nullptr) << n;  // consumed by the dequantisation
            continue;
        }
        const st_tensor_info *b = st_find(back, s->name), *w = st_find(want, s->name);
        ASSERT_NE(b, nullptr) << n;
        EXPECT_EQ(b->dtype, FSDP_DT_BF16) << n;
        const st_tensor_info *ref = w ? w : s;
        ASSERT_EQ(b->nbytes, ref->nbytes) << n;
        EXPECT_EQ(memcmp(st_data(back, b), st_data(w ? want : src, ref), b->nbytes), 0) << n;
        weights++;
    }
    EXPECT_EQ(weights, st_count(back));
    st_close(back);
    st_close(want);
    st_close(src);
    rm_rf(t);
}

TEST(ConvertMoe, MissingOrDuplicateExpertAndWrongDirectionsAreNamed) {
    const std::string f = moe_fixture("mixtral_tiny");
    std::string t = make_tmpdir("moe_cerr");
    rewrite_st(f + "/model.safetensors", t + "/m.safetensors", {"model.layers.1.block_sparse_moe.experts.2.w3.weight"});
    int rc;
    const std::string heads = " --n-heads 4 --n-kv-heads 2";
    std::string o = convert(t + "/m.safetensors " + t + "/dcp --names torchtitan" + heads, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(o.find("layers.1.moe.experts.w3: expert 2 of its 4 is missing (the checkpoint has no "
                     "model.layers.1.block_sparse_moe.experts.2.w3.weight)"),
              std::string::npos)
        << o;
    EXPECT_FALSE(exists(t + "/dcp/.metadata"));
    // stacking into a safetensors file is refused, naming the expert
    o = convert(f + "/model.safetensors " + t + "/tt.safetensors --names torchtitan" + heads, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(o.find("is expert 0 of layers.0.moe.experts.w1: stacking experts writes a DCP checkpoint"), std::string::npos)
        << o;
    // a stacked DCP with Mixtral's names asked for: --moe-names mixtral
    o = convert(f + "/model.safetensors " + t + "/dcp --names torchtitan" + heads, &rc);
    ASSERT_EQ(rc, 0) << o;
    o = convert(t + "/dcp " + t + "/mlp.safetensors --names hf --n-heads 4 --n-kv-heads 2", &rc);
    ASSERT_EQ(rc, 0) << o;
    st_reader *r = nullptr;
    fsdp_err err{};
    ASSERT_EQ(st_open(&r, (t + "/mlp.safetensors").c_str(), &err), 0) << err.msg;
    EXPECT_NE(st_find(r, "model.layers.0.mlp.experts.3.gate_proj.weight"), nullptr);
    st_close(r);
    o = convert(t + "/dcp " + t + "/mix.safetensors --names hf --n-heads 4 --n-kv-heads 2 --moe-names mixtral", &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(st_diff(f + "/model.safetensors", t + "/mix.safetensors"), "");
    rm_rf(t);
}
