// The generic model table (issue 14): model/model_table.h and its producers (Llama's config, a
// checkpoint header, the table syntax, the model: section with parts), and every stage but
// train-steps on such a model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "mot_inputs.h"
#include "test_util.h"

extern "C" {
#include "decoder/decoder_params.h"
#include "decoder/decoder_table.h"
#include "model/model_table.h"
#include "model/mt_ckpt.h"
#include "model/mt_dims.h"
#include "model/mt_names.h"
#include "model/mt_spec.h"
#include "pipeline/yaml_load.h"
}

using namespace fsdp_test;

namespace {

// A YAML document whose `model:` is built into t (validate: sources may be missing).
struct Spec {
    fsdp_value *root = nullptr;
    mt_table t;
    std::string msg;
    int rc = 0;
    explicit Spec(const std::string &yaml, int validate = 0) {
        mt_init(&t);
        fsdp_err err;
        fsdp_err_clear(&err);
        rc = yaml_load_string(yaml.data(), yaml.size(), "m.yaml", 0, 0, &root, &err);
        EXPECT_EQ(rc, 0) << err.msg;
        if (rc) return;
        mt_spec_opts o = {validate, &decoder_table_arch};
        rc = mt_spec_build(fsdp_value_get(root, "model"), &o, &t, &err);
        msg = err.msg;
    }
    ~Spec() {
        mt_free(&t);
        val_free(root);
    }
    const mt_param *p(const std::string &name) const {
        long i = mt_find(&t, name.c_str());
        return i >= 0 ? &t.p[i] : nullptr;
    }
    std::vector<int64_t> shape(const std::string &name) const {
        const mt_param *q = p(name);
        return q ? std::vector<int64_t>(q->shape, q->shape + q->ndim) : std::vector<int64_t>{-1};
    }
};

mt_param param(const char *name, std::vector<int64_t> shape, int part, fsdp_dtype dt = FSDP_DT_F32,
               init_kind k = INIT_NONE) {
    mt_param p;
    memset(&p, 0, sizeof p);
    p.name = (char *)name;
    p.ndim = (int)shape.size();
    for (size_t i = 0; i < shape.size(); i++) p.shape[i] = shape[i];
    p.dtype = dt;
    init_rule_default(k, &p.init);
    p.part = part;
    p.layer = -1;
    return p;
}

std::string run_bin(const std::string &args, int *rc) {
    std::string out;
    *rc = run_cmd("timeout -k 10 120 " + fsdp_run_bin() + " " + args, &out);
    return out;
}

}  // namespace

// ---- the table ---------------------------------------------------------------------------------

TEST(ModelTable, NameCollisionsAndShapeConflictsNameBothParts) {
    mt_table t;
    mt_init(&t);
    fsdp_err err;
    int a, b;
    ASSERT_EQ(mt_add_part(&t, "llm", "lm.", "HF directory /x", "r.yaml:3:5", &a, &err), 0);
    ASSERT_EQ(mt_add_part(&t, "extra", "lm.", "inline table", "r.yaml:9:5", &b, &err), 0);
    EXPECT_EQ(mt_add_part(&t, "llm", "", "table file t.yaml", "r.yaml:12:5", nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("two parts are named 'llm' (HF directory /x at r.yaml:3:5 and table file t.yaml at "
                                        "r.yaml:12:5)"),
              std::string::npos)
        << err.msg;
    mt_param p = param("lm.norm.weight", {32}, a);
    ASSERT_EQ(mt_add(&t, &p, &err), 0) << err.msg;
    p.part = b;
    EXPECT_EQ(mt_add(&t, &p, &err), FSDP_E_INVALID);
    EXPECT_STREQ(err.msg, "model: parameter lm.norm.weight is declared twice: by part 'llm' (HF directory /x, r.yaml:3:5) "
                          "and by part 'extra' (inline table, r.yaml:9:5)");
    p.shape[0] = 31;
    EXPECT_EQ(mt_add(&t, &p, &err), FSDP_E_INVALID);
    EXPECT_STREQ(err.msg, "model: shape conflict: parameter lm.norm.weight is [32] in part 'llm' (HF directory /x, "
                          "r.yaml:3:5) and [31] in part 'extra' (inline table, r.yaml:9:5)");
    // dtypes a parameter may have, dims, names
    mt_param q = param("lm.x", {2, 3}, a, FSDP_DT_I64);
    EXPECT_EQ(mt_add(&t, &q, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("dtype i64 (a parameter is f32, bf16 or f16)"), std::string::npos) << err.msg;
    q = param("lm.x", {2, -3}, a);
    EXPECT_EQ(mt_add(&t, &q, &err), FSDP_E_INVALID);
    std::string long_name(MT_NAME_MAX + 1, 'a');
    q = param(long_name.c_str(), {2}, a);
    EXPECT_EQ(mt_add(&t, &q, &err), FSDP_E_INVALID);
    // sizes: uneven and empty shards, 0-d values replicated
    mt_param r1 = param("lm.w", {5, 4}, b), r2 = param("lm.probe", {1, 1, 3}, b), r3 = param("lm.s", {}, b);
    ASSERT_EQ(mt_add(&t, &r1, &err), 0);
    ASSERT_EQ(mt_add(&t, &r2, &err), 0);
    ASSERT_EQ(mt_add(&t, &r3, &err), 0);
    EXPECT_EQ(mt_total(&t), 32 + 20 + 3 + 1);
    EXPECT_EQ(mt_shard_numel(&t, 1), 56);
    EXPECT_EQ(mt_shard_numel(&t, 3), 11 + 2 * 4 + 3 + 1);  // ceil(32/3), ceil(5/3) rows of 4, 1 row of 3, the 0-d
    EXPECT_EQ(mt_shard_numel(&t, 0), -1);
    EXPECT_EQ(mt_find(&t, "lm.w"), 1);
    EXPECT_EQ(mt_find(&t, "lm.nope"), -1);
    mt_free(&t);
}

TEST(ModelTable, DefaultLinearBiasTakesTheFanInOfItsWeight) {
    Spec ok("model:\n  params:\n    - {name: fc.weight, shape: [8, 300], init: default_linear}\n"
            "    - {name: fc.bias, shape: [8], init: default_linear}\n");
    ASSERT_EQ(ok.rc, 0) << ok.msg;
    EXPECT_EQ(ok.p("fc.bias")->init.fan_in, 300);
    rng_dist d;
    fsdp_err err;
    ASSERT_EQ(mt_param_dist(ok.p("fc.bias"), &d, &err), 0) << err.msg;
    Spec orphan("model:\n  params:\n    - {name: head.bias, shape: [8], init: default_linear}\n");
    EXPECT_EQ(orphan.rc, FSDP_E_INVALID);
    EXPECT_NE(orphan.msg.find("head.bias (part 'model' (inline table, m.yaml:2:3)): default_linear on a 1-D tensor takes the "
                              "fan_in of its layer's weight head.weight, which the model does not declare"),
              std::string::npos)
        << orphan.msg;
    Spec fans("model:\n  params:\n    - {name: v, shape: [8], init: xavier_uniform}\n");
    EXPECT_EQ(fans.rc, FSDP_E_INVALID);
    EXPECT_NE(fans.msg.find("init of v"), std::string::npos) << fans.msg;
}

TEST(ModelTable, DimsExpressionsShapesAndConfigKeys) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/config.json", "{\"hidden_size\": 96, \"text_config\": {\"num_heads\": 12}, \"x\": 1.5}");
    Spec s("model:\n  dims:\n    hidden: {config: " + dir + "/config.json, key: hidden_size}\n"
           "    heads: {config: " + dir + "/config.json, key: text_config.num_heads}\n"
           "    head_dim: hidden / heads\n    ffn: (hidden * 8 + 2) // 3 - -1\n"
           "    rows: {shape: a.weight, dim: -1}\n"
           "  parts:\n    - params: [{name: a.weight, shape: [heads*head_dim, 7 % 4 + hidden % 5]}]\n"
           "    - params: [{name: b.weight, shape: [ffn, rows]}]\n");
    ASSERT_EQ(s.rc, 0) << s.msg;
    EXPECT_EQ(s.shape("a.weight"), (std::vector<int64_t>{96, 4}));
    EXPECT_EQ(s.shape("b.weight"), (std::vector<int64_t>{257, 4}));
    struct Case {
        std::string dims, shape, want;
    } cases[] = {
        {"{h: 10, n: 3}", "[h / n]", "m.yaml:5:29: model: 'h / n': 10 / 3 leaves a remainder (use // to round down)"},
        {"{h: 10}", "[h * heads]", "m.yaml:5:29: model: 'h * heads': unknown dim 'heads' (dims: h)"},
        {"{a: b + 1, b: 2 * a}", "[a]", "model dims: a is defined in terms of itself (a -> b -> a)"},
        {"{h: 9223372036854775807}", "[h + 1]", "'h + 1': the value overflows int64"},
        {"{h: 4}", "[h / (h - 4)]", "division by zero"},
        {"{h: 4}", "[h ^ 2]", "'h ^ 2': unexpected '^ 2'"},
        {"{h: 4}", "[h - 5]", "m.yaml:5:29: model: size 'h - 5' is -1, a negative size"},
        {"{h: {shape: nope.weight, dim: 0}}", "[h]", "model dims: h: no parameter nope.weight among the parts declared"},
        {"{h: {config: " + dir + "/config.json, key: x}}", "[h]", "config.json has no integer at key x"},
        {"{h: {config: " + dir + "/none.json, key: x}}", "[h]", "none.json: cannot open"},
        {"{9h: 1}", "[1]", "model dims: '9h' is not a dim name"},
        {"{h: {shape: a, key: 1}}", "[1]", "model dims: h: unknown key 'key' (shape, dim)"},
    };
    for (const Case &c : cases) {
        Spec bad("model:\n  dims: " + c.dims + "\n  parts:\n    - params:\n        - {name: w, shape: " + c.shape + "}\n");
        EXPECT_NE(bad.rc, 0) << c.dims << " " << c.shape;
        EXPECT_NE(bad.msg.find(c.want), std::string::npos) << c.dims << " " << c.shape << ": " << bad.msg;
    }
    rm_rf(dir);
}

TEST(ModelTable, NamesExpandRangesAndAlternatives) {
    fsdp_value *root = nullptr;
    fsdp_err err;
    std::string y = "dims: {L: 3}\n";
    ASSERT_EQ(yaml_load_string(y.data(), y.size(), "n.yaml", 0, 0, &root, &err), 0);
    mt_dims *d;
    mt_table t;
    mt_init(&t);
    ASSERT_EQ(mt_dims_new(fsdp_value_get(root, "dims"), &t, nullptr, &d, &err), 0);
    mt_names n;
    ASSERT_EQ(mt_names_expand("layers.{1..L-1}.attn.{q,k}_proj.{weight,bias}", d, root, 1, &n, &err), 0) << err.msg;
    std::vector<std::string> got(n.v, n.v + n.n);
    EXPECT_EQ(got.size(), 8u);
    EXPECT_EQ(got.front(), "layers.1.attn.q_proj.weight");
    EXPECT_EQ(got[1], "layers.1.attn.q_proj.bias");
    EXPECT_EQ(got.back(), "layers.2.attn.k_proj.bias");
    mt_names_free(&n);
    ASSERT_EQ(mt_names_expand("x.{3..L-1}", d, root, 1, &n, &err), 0);
    EXPECT_EQ(n.n, 0u);  // an empty range
    mt_names_free(&n);
    for (const char *bad : {"a.{0..2", "a.}b", "a.{x,,y}", "a.{0..Q}", "a.{{0..1}}"}) {
        EXPECT_EQ(mt_names_expand(bad, d, root, 1, &n, &err), FSDP_E_INVALID) << bad;
        EXPECT_EQ(n.n, 0u);
    }
    EXPECT_EQ(mt_names_expand("a.{0..2000000}", d, root, 1, &n, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("more than"), std::string::npos) << err.msg;
    mt_dims_free(d);
    val_free(root);
}

// ---- the model: section ------------------------------------------------------------------------

TEST(ModelTableSpec, ArchFormIsLlamasTableAndItsTrainer) {
    Spec s("model: {arch: llama3, preset: tiny}\n");
    ASSERT_EQ(s.rc, 0) << s.msg;
    decoder_config cfg;
    fsdp_err err;
    ASSERT_EQ(decoder_config_preset(&cfg, "tiny", &err), 0);
    decoder_params lp;
    ASSERT_EQ(decoder_params_build(&cfg, &lp, &err), 0);
    ASSERT_EQ(s.t.n, (size_t)lp.n);
    for (int i = 0; i < lp.n; i++) {
        const mt_param *p = &s.t.p[i];
        EXPECT_STREQ(p->name, lp.p[i].name);
        EXPECT_EQ(p->ndim, lp.p[i].ndim);
        EXPECT_EQ(p->shape[0], lp.p[i].shape[0]);
        EXPECT_EQ(p->layer, lp.p[i].layer);
        EXPECT_EQ(0, memcmp(&p->init, &lp.p[i].init, sizeof p->init)) << p->name;
        EXPECT_EQ(p->dtype, FSDP_DT_F32);
    }
    EXPECT_EQ(mt_total(&s.t), lp.total);
    EXPECT_EQ(mt_shard_numel(&s.t, 3), decoder_param_count_shard(&cfg, 3));
    EXPECT_TRUE(mt_can_train(&s.t));
    EXPECT_STREQ(mt_kind(&s.t), "llama3 (preset tiny)");
    decoder_params_free(&lp);
}

TEST(ModelTableSpec, InlineTableFileAndCheckpointForms) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/conn.yaml", "dims: {hidden: 8, width: 5}\ndtype: bf16\ninit: \"normal(0, 0.02)\"\n"
                                   "params:\n  fc.weight: {shape: [hidden, width]}\n"
                                   "  fc2.weight: {shape: [width], dtype: f16, init: ones}\n");
    write_st(dir + "/vit.safetensors", {st_tensor("vision_model.a.weight", FSDP_DT_F32, {4, 6}, 1),
                                        st_tensor("vision_model.a.bias", FSDP_DT_BF16, {4}, 2),
                                        st_tensor("vision_model.pos_ids", FSDP_DT_F32, {4}, 3),
                                        st_tensor("other.x", FSDP_DT_F32, {2}, 4)});
    // a table file relative to the recipe (dims the recipe gives win over the file's), a checkpoint
    // with a stripped prefix and exclusions, an inline table deriving parameters with like/as
    write_file(dir + "/r.yaml",
               "model:\n  dims: {width: 6}\n  parts:\n"
               "    - {name: vit, prefix: vit., from: " + dir + "/vit.safetensors, strip_prefix: vision_model., "
               "exclude: [pos_ids]}\n"
               "    - {prefix: connector., table: conn.yaml}\n"
               "    - {name: vit_gen, prefix: vit., params: [{like: \"a.*\", as: \"a_gen.*\", init: zeros}], init: ones}\n");
    fsdp_value *root = nullptr;
    fsdp_err err;
    ASSERT_EQ(yaml_load_file((dir + "/r.yaml").c_str(), nullptr, &root, &err), 0) << err.msg;
    mt_table t;
    mt_spec_opts arch_only = {0, &decoder_table_arch};
    ASSERT_EQ(mt_spec_build(fsdp_value_get(root, "model"), &arch_only, &t, &err), 0) << err.msg;
    std::vector<std::string> names;
    for (size_t i = 0; i < t.n; i++) names.push_back(t.p[i].name);
    EXPECT_EQ(names, (std::vector<std::string>{"vit.a.weight", "vit.a.bias", "connector.fc.weight", "connector.fc2.weight",
                                               "vit.a_gen.weight", "vit.a_gen.bias"}));
    auto at = [&](const char *n) { return &t.p[mt_find(&t, n)]; };
    EXPECT_EQ(at("vit.a.bias")->dtype, FSDP_DT_BF16);  // the checkpoint's dtypes
    EXPECT_EQ(at("vit.a.weight")->init.kind, INIT_NONE);
    EXPECT_EQ(at("connector.fc.weight")->shape[1], 6);  // width from the recipe, not the file's 5
    EXPECT_EQ(at("connector.fc.weight")->dtype, FSDP_DT_BF16);
    EXPECT_EQ(at("connector.fc.weight")->init.kind, INIT_NORMAL);
    EXPECT_EQ(at("connector.fc2.weight")->dtype, FSDP_DT_F16);
    EXPECT_EQ(at("connector.fc2.weight")->init.kind, INIT_ONES);
    EXPECT_EQ(at("vit.a_gen.bias")->dtype, FSDP_DT_BF16);  // like: the matched parameter's
    EXPECT_EQ(at("vit.a_gen.bias")->init.kind, INIT_ZEROS);
    EXPECT_EQ(t.n_parts, 3u);
    EXPECT_STREQ(t.parts[1].name, "connector");  // a part's default name: its prefix
    EXPECT_STREQ(t.parts[2].name, "vit_gen");
    EXPECT_FALSE(mt_can_train(&t));
    EXPECT_STREQ(mt_kind(&t), "composed model (3 parts: vit, connector, vit_gen)");
    mt_free(&t);
    val_free(root);
    rm_rf(dir);
}

TEST(ModelTableSpec, ErrorsNameFileLineAndColumn) {
    struct Case {
        std::string yaml, want;
    } cases[] = {
        {"model:\n  params: []\n  colour: red\n", "m.yaml:3:11: model: unknown key 'colour' for a table declared with 'params'"},
        {"model:\n  params: []\n  preset: tiny\n",
         "m.yaml:3:11: model: 'preset' is the built-in arch form, this model is a parameter table (params); the two "
         "forms do not mix"},
        {"model:\n  arch: llama3\n  dims: {h: 1}\n",
         "m.yaml:3:9: model: 'dims' belongs to a parameter table (params, table, from or parts), not to the built-in arch"},
        {"model:\n  params: []\n  from: x\n", "m.yaml:3:9: model: 'params' and 'from' are two ways of declaring"},
        {"model:\n  parts:\n    - {parts: []}\n", "m.yaml:3:15: model: parts do not nest"},
        {"model:\n  parts:\n    - {prefix: a.}\n", "m.yaml:3:7: model: a part needs params, table, from, or an arch"},
        {"model:\n  params:\n    - {name: w, shape: 4}\n", "m.yaml:3:24: model: shape must be a list of sizes"},
        {"model:\n  params:\n    - {name: w, shape: [4, [2]]}\n", "m.yaml:3:28: model: a size must be an integer"},
        {"model:\n  params:\n    - {name: w, shape: [hidden]}\n", "m.yaml:3:25: model: 'hidden': unknown dim 'hidden'"},
        {"model:\n  params:\n    - {name: w, shape: [4], init: \"normal(0, std=x)\"}\n",
         "m.yaml:3:35: init rule 'normal(0, std=x)'"},
        {"model:\n  params:\n    - {name: w, shape: [4], init: gaussian}\n", "m.yaml:3:35: init rule 'gaussian'"},
        {"model:\n  params:\n    - {name: w, shape: [4], dtype: f64}\n", "m.yaml:3:36: model: dtype 'f64'"},
        {"model:\n  params:\n    - {name: w, shap: [4]}\n",
         "m.yaml:3:23: model: unknown key 'shap' in a parameter entry: did you mean 'shape'? (name, "},
        {"model:\n  params:\n    - {name: w}\n", "m.yaml:3:7: model: parameter entry 'w' needs 'shape'"},
        {"model:\n  params:\n    - {like: \"x.*\", as: \"y.*\"}\n",
         "m.yaml:3:14: model: like 'x.*' matches no parameter declared before it"},
        {"model:\n  params:\n    - {like: \"x.*\", as: \"y.**\"}\n", "m.yaml:3:14: "},
        {"model:\n  params:\n    - {name: w, shape: [2]}\n    - {name: w, shape: [2]}\n",
         "m.yaml:4:7: model: parameter w is declared twice"},
        {"model:\n  parts:\n    - {name: a, params: [{name: w, shape: [2]}]}\n    - {name: a, params: []}\n",
         "m.yaml:4:14: model: two parts are named 'a'"},
        {"model:\n  from: /no/such/ckpt\n", "m.yaml:2:9: "},
        {"model:\n  table: /no/such/table.yaml\n", "m.yaml:2:10: model table file /no/such/table.yaml"},
        {"model:\n  arch: llama3\n  preset: huge\n", "m.yaml:3:11: model.preset: unknown preset 'huge'"},
    };
    for (const Case &c : cases) {
        Spec s(c.yaml);
        EXPECT_EQ(s.rc, FSDP_E_INVALID == s.rc ? FSDP_E_INVALID : s.rc) << c.yaml;
        EXPECT_NE(s.rc, 0) << c.yaml;
        EXPECT_EQ(s.msg.find(c.want), 0u) << c.yaml << "\n  got: " << s.msg << "\n  want: " << c.want;
    }
}

TEST(ModelTableSpec, ValidateSkipsSourcesThatDoNotExistYetButChecksTheRest) {
    Spec later("model:\n  parts:\n    - {name: llm, from: /no/such/dir}\n"
               "    - {params: [{like: \"model.*\", as: \"gen.*\"}, {name: w, shape: [4]}]}\n", 1);
    EXPECT_EQ(later.rc, 0) << later.msg;
    EXPECT_TRUE(later.t.incomplete);
    Spec bad("model:\n  parts:\n    - {name: llm, from: /no/such/dir}\n    - {params: [{name: w, shape: [hidden]}]}\n", 1);
    EXPECT_NE(bad.rc, 0);
    EXPECT_NE(bad.msg.find("m.yaml:4:35: model: 'hidden': unknown dim 'hidden'"), std::string::npos) << bad.msg;
}

// Bytes this process has read through read(2)/pread(2) so far (/proc/self/io rchar).
static long long rchar() {
    std::string io = read_file("/proc/self/io");
    size_t p = io.find("rchar: ");
    return p == std::string::npos ? -1 : atoll(io.c_str() + p + 7);
}

TEST(ModelTableSpec, ATableFromACheckpointReadsItsHeaderOnly) {
    std::string dir = make_tmpdir("fsdp-mt"), ck = dir + "/ck";
    write_file(dir + "/r.yaml", "runtime: {device: cpu}\nmodel:\n  params:\n"
                                "    - {name: \"layers.{0..1}.w\", shape: [1024, 1024], init: \"normal(0, 1)\"}\n"
                                "    - {name: norm.weight, shape: [1024], init: ones}\n"
                                "    - {name: wk, shape: [8], init: ones}\n"
                                "stages:\n  - {id: i, uses: init-meta}\n  - {id: s, uses: save-dcp, with: {path: " + ck + "}}\n");
    int rc;
    std::string out = run_bin(dir + "/r.yaml", &rc);
    ASSERT_EQ(rc, 0) << out;
    long long r0 = rchar();
    ASSERT_GE(r0, 0);
    Spec s("model: {from: " + ck + ", dtype: bf16, init: \"normal(0, 0.02)\", keys: [\"layers.**\", norm.weight], "
           "exclude: [wk]}\n");
    long long header = rchar() - r0;
    ASSERT_EQ(s.rc, 0) << s.msg;
    EXPECT_EQ(s.t.n, 3u);  // the two layers and the norm; no optimizer / train_state keys
    EXPECT_EQ(s.shape("layers.1.w"), (std::vector<int64_t>{1024, 1024}));
    EXPECT_EQ(s.p("norm.weight")->dtype, FSDP_DT_BF16);
    EXPECT_EQ(s.p("norm.weight")->init.kind, INIT_NORMAL);
    // 8 MB of tensors, a few KB of metadata and zip directories read
    EXPECT_LT(header, 64 * 1024) << header;
    Reader r(ck);
    long long r1 = rchar();
    std::vector<float> v = read_tensor(r.r, "layers.0.w");
    EXPECT_GE(rchar() - r1, 4 << 20) << "a tensor read is seen by the measure";
    Spec unused("model: {from: " + ck + ", keys: [\"nope.*\"]}\n");
    EXPECT_NE(unused.msg.find("keys glob 'nope.*' matches no tensor of the checkpoint"), std::string::npos) << unused.msg;
    rm_rf(dir);
}

// ---- validate ----------------------------------------------------------------------------------

TEST(ModelTableValidate, TrainStepsRefusesAModelItCannotTrainAndMemoryUsesTheTable) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/t.yaml", "model:\n  params: [{name: w, shape: [64, 64], init: \"normal(0, 1)\"}]\n"
                                "data: {kind: synthetic, batch_size: 2, seq_len: 8}\nstages:\n"
                                "  - {id: i, uses: init-meta}\n  - {id: train, uses: train-steps, with: {steps: 1}}\n");
    int rc;
    std::string out = run_bin("validate " + dir + "/t.yaml", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("t.yaml:6:23: stage 'train' (train-steps): cannot train the model: it is a parameter table (inline "
                       "table); train-steps trains the built-in architectures"),
              std::string::npos)
        << out;
    // the memory check counts the table's parameters (1 TB of them here)
    write_file(dir + "/big.yaml", "model:\n  params: [{name: w, shape: [262144, 1048576], init: zeros}]\nstages:\n"
                                  "  - {id: i, uses: init-cpu}\n");
    out = run_bin("validate " + dir + "/big.yaml", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("model: the model needs 1.1 TB for parameters on rank 0 (stage 'i' (init-cpu) holds all "
                       "274877906944 parameters whole, as float32)"),
              std::string::npos)
        << out;
    rm_rf(dir);
}

// ---- the stages on a table -----------------------------------------------------------------------

namespace {

// A table with every dtype, a 0-d and a 4-D tensor, first dims that shard unevenly or not at all over
// 2 and 3 ranks, and big random tensors (moments).
const char *const TABLE =
    "model:\n"
    "  dims: {d: 512}\n"
    "  params:\n"
    "    - {name: lin.weight, shape: [d, 2*d], init: default_linear}\n"
    "    - {name: lin.bias, shape: [d], init: default_linear, dtype: bf16}\n"
    "    - {name: emb.weight, shape: [1000, d], init: \"normal(0, 0.02)\", dtype: bf16}\n"
    "    - {name: tn, shape: [d, d], init: \"trunc_normal(0.1, 1, a=-1, b=2)\", dtype: f16}\n"
    "    - {name: kn, shape: [d, d], init: \"kaiming_normal(mode=fan_out, nonlinearity=relu)\"}\n"
    "    - {name: conv, shape: [5, 3, 4, 4], init: xavier_uniform}\n"
    "    - {name: probe, shape: [1, 1, 7], init: ones}\n"
    "    - {name: \"scale\", shape: [], init: \"constant(0.5)\"}\n";

void moments(const std::vector<float> &v, double *mean, double *sd, double *lo, double *hi) {
    double s = 0, s2 = 0;
    *lo = 1e30, *hi = -1e30;
    for (float x : v) {
        s += x;
        s2 += (double)x * x;
        *lo = std::min(*lo, (double)x);
        *hi = std::max(*hi, (double)x);
    }
    *mean = s / (double)v.size();
    *sd = std::sqrt(s2 / (double)v.size() - *mean * *mean);
}

}  // namespace

TEST(ModelTableStages, InitMetaAndInitCpuGiveTheSameTableOnAnyWorldSizeInEachDtype) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/meta.yaml", std::string("runtime: {device: cpu, seed: 3}\n") + TABLE +
                                       "stages:\n  - {id: i, uses: init-meta}\n"
                                       "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n"
                                       "  - {id: t, uses: save-safetensors, with: {path: \"${out}.safetensors\"}}\n");
    write_file(dir + "/cpu.yaml", std::string("runtime: {device: cpu, seed: 3}\n") + TABLE +
                                      "stages:\n  - {id: i, uses: init-cpu}\n  - {id: sh, uses: shard}\n"
                                      "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    std::string log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/meta.yaml --set vars.out=" + dir + "/m1", &log), 0) << log;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + mpirun_prefix(3) + " " + fsdp_run_bin() + " " + dir + "/meta.yaml --set vars.out=" +
                          dir + "/m3", &log), 0) << log;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + mpirun_prefix(2) + " " + fsdp_run_bin() + " " + dir + "/cpu.yaml --set vars.out=" +
                          dir + "/c2", &log), 0) << log;
    for (const char *o : {"/m3", "/c2"})
        EXPECT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + dir + "/m1 " + dir + o, &log), 0) << o << ": " << log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + dir + "/m1.safetensors " + dir + "/m3.safetensors", &log), 0) << log;
    Reader r(dir + "/m1.safetensors");
    struct {
        const char *name;
        fsdp_dtype dt;
    } dts[] = {{"lin.weight", FSDP_DT_F32}, {"lin.bias", FSDP_DT_BF16}, {"emb.weight", FSDP_DT_BF16},
               {"tn", FSDP_DT_F16},         {"scale", FSDP_DT_F32}};
    for (auto &d : dts) {
        const ckpt_entry *e = nullptr;
        read_tensor(r.r, d.name, &e);
        ASSERT_NE(e, nullptr);
        EXPECT_EQ(e->dtype, d.dt) << d.name;
    }
    // nn.Linear's init: U(+-1/sqrt(fan_in)) for the weight and (its fan_in) for the bias
    expect_uniform(read_tensor(r.r, "lin.weight"), 1 / std::sqrt(1024.0), "lin.weight");
    for (float x : read_tensor(r.r, "lin.bias")) EXPECT_LE(std::fabs(x), 1 / std::sqrt(1024.0));
    double m, sd, lo, hi;
    moments(read_tensor(r.r, "emb.weight"), &m, &sd, &lo, &hi);
    EXPECT_NEAR(m, 0, 0.001);
    EXPECT_NEAR(sd, 0.02, 0.0005);
    moments(read_tensor(r.r, "tn"), &m, &sd, &lo, &hi);
    EXPECT_GE(lo, -1.0);
    EXPECT_LE(hi, 2.0);
    // the mean of N(0.1, 1) truncated to [-1, 2]: mu + (phi(alpha) - phi(beta)) / (Phi(beta) - Phi(alpha))
    double al = -1.1, be = 1.9, z = 0.5 * (std::erf(be / std::sqrt(2.0)) - std::erf(al / std::sqrt(2.0)));
    EXPECT_NEAR(m, 0.1 + (std::exp(-0.5 * al * al) - std::exp(-0.5 * be * be)) / std::sqrt(2 * M_PI) / z, 0.005);
    moments(read_tensor(r.r, "kn"), &m, &sd, &lo, &hi);
    EXPECT_NEAR(sd, std::sqrt(2.0) / std::sqrt(512.0), 0.002);  // gain sqrt(2) / sqrt(fan_out)
    moments(read_tensor(r.r, "conv"), &m, &sd, &lo, &hi);       // fans 3*16, 5*16
    EXPECT_LE(std::max(-lo, hi), std::sqrt(6.0 / (48 + 80)));
    EXPECT_EQ(read_tensor(r.r, "probe"), std::vector<float>(7, 1.0f));
    EXPECT_EQ(read_tensor(r.r, "scale"), std::vector<float>(1, 0.5f));
    rm_rf(dir);
}

TEST(ModelTableStages, LoadsIntoPartsStrictlyAndReadsBothKeyLayouts) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_st(dir + "/a.safetensors", {st_tensor("x.weight", FSDP_DT_F32, {6, 4}, 1), st_tensor("x.bias", FSDP_DT_F32, {6}, 2)});
    write_st(dir + "/b.safetensors", {st_tensor("y", FSDP_DT_BF16, {5, 3}, 3)});
    // the model: part a from a's header, part b declared by a table in bf16 / f16; loads fill each
    std::string model = "model:\n  parts:\n    - {name: a, prefix: enc., from: " + dir + "/a.safetensors}\n"
                        "    - {name: b, prefix: dec., params: [{name: y, shape: [5, 3], dtype: f16}]}\n";
    write_file(dir + "/save.yaml", "runtime: {device: cpu}\n" + model +
               "stages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: la, uses: load-ckpt, with: {path: " + dir + "/a.safetensors, parts: [a]}}\n"
               "  - {id: lb, uses: load-ckpt, with: {path: " + dir + "/b.safetensors, parts: [b]}}\n"
               "  - {id: s, uses: save-dcp, with: {path: \"${out}\", prefix: \"model.\"}}\n");
    std::string log;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + mpirun_prefix(2) + " " + fsdp_run_bin() + " " + dir + "/save.yaml --set vars.out=" +
                          dir + "/p", &log), 0) << log;
    Reader p(dir + "/p");
    const ckpt_entry *e = nullptr;
    EXPECT_EQ(read_tensor(p.r, "model.enc.x.weight", &e), st_tensor("x.weight", FSDP_DT_F32, {6, 4}, 1).vals);
    // a bf16 checkpoint into an f16 parameter: kept in f16, the values rounded to it
    std::vector<float> y = read_tensor(p.r, "model.dec.y", &e);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, FSDP_DT_F16);
    std::vector<float> want = st_tensor("y", FSDP_DT_BF16, {5, 3}, 3).vals;
    for (float &v : want) v = fsdp_f16_to_f32(fsdp_f32_to_f16(v));
    EXPECT_EQ(y, want);
    // a run that starts from that checkpoint: the "model." layout is recognised, strict over the model
    write_file(dir + "/load.yaml", "runtime: {device: cpu}\n" + model +
               "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + dir + "/p}}\n"
               "  - {id: v, uses: verify, with: {against: " + dir + "/u}}\n");
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + dir + "/p " + dir + "/u --strip-prefix model.", &log), 0) << log;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + mpirun_prefix(3) + " " + fsdp_run_bin() + " " + dir + "/load.yaml", &log), 0) << log;
    EXPECT_NE(log.find("the checkpoint's parameters are under the prefix 'model.' (removed)"), std::string::npos) << log;
    // keys: only those, strict over them; the checkpoint's other tensors are not this load's business
    write_file(dir + "/keys.yaml", "runtime: {device: cpu}\nmodel: {params: [{name: enc.x.bias, shape: [6]}]}\n"
               "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + dir + "/u, keys: [\"enc.**\"]}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/keys.yaml", &log), 1) << log;
    EXPECT_NE(log.find("unexpected key enc.x.weight in the checkpoint"), std::string::npos) << log;
    EXPECT_EQ(log.find("unexpected key dec.y"), std::string::npos) << log;
    // strict over the parts it is responsible for: a missing tensor, an unknown part
    write_file(dir + "/bad.yaml", "runtime: {device: cpu}\n" + model +
               "stages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: la, uses: load-ckpt, with: {path: " + dir + "/b.safetensors, parts: [a]}}\n");
    int rc = run_cmd(fsdp_run_bin() + " " + dir + "/bad.yaml", &log);
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find("enc.x.weight not restored"), std::string::npos) << log;
    EXPECT_NE(log.find("unexpected key y in the checkpoint"), std::string::npos) << log;
    write_file(dir + "/bad2.yaml", "runtime: {device: cpu}\n" + model +
               "stages:\n  - {id: la, uses: load-ckpt, with: {path: " + dir + "/a.safetensors, parts: [c]}}\n");
    rc = run_cmd(fsdp_run_bin() + " " + dir + "/bad2.yaml", &log);
    EXPECT_NE(log.find("load-ckpt: the model has no part 'c' (parts: a, b)"), std::string::npos) << log;
    rm_rf(dir);
}

TEST(ModelTableStages, TransformCopyReplaceAndWhatItRefuses) {
    std::string dir = make_tmpdir("fsdp-mt");
    std::string model = "runtime: {device: cpu}\nmodel:\n  params:\n"
                        "    - {name: \"l.{0..1}.attn.w\", shape: [4, 4], init: \"normal(0, 1)\"}\n"
                        "    - {name: \"l.{0..1}.attn_moe_gen.w\", shape: [4, 4], dtype: bf16}\n"
                        "    - {name: odd_moe_gen, shape: [3]}\n    - {name: odd, shape: [2], init: ones}\n"
                        "    - {name: ghost, shape: [3]}\n    - {name: ghost2_moe_gen, shape: [3]}\n";
    auto run = [&](const std::string &ops, std::string *log) {
        write_file(dir + "/r.yaml", model + "stages:\n  - {id: i, uses: init-cpu}\n"
                   "  - {id: t, uses: transform, with: {ops: " + ops + "}}\n"
                   "  - {id: s, uses: save-safetensors, with: {path: " + dir + "/o.safetensors}}\n");
        return run_cmd(fsdp_run_bin() + " " + dir + "/r.yaml", log);
    };
    std::string log;
    EXPECT_EQ(run("[{copy: {to: \"l.**_moe_gen**\", replace: {_moe_gen: \"\"}}}]", &log), 1) << log;
    // the copies were made; the untouched parameters without a value stop the save, named
    EXPECT_NE(log.find("save-safetensors: 3 parameters hold no value: odd_moe_gen, ghost, ghost2_moe_gen"),
              std::string::npos) << log;
    EXPECT_EQ(run("[{copy: {to: \"*_moe_gen\", replace: {_moe_gen: \"\"}}}]", &log), 1);
    EXPECT_NE(log.find("transform copy: odd [2] and odd_moe_gen [3] have different shapes"), std::string::npos) << log;
    EXPECT_EQ(run("[{copy: {to: \"ghost2_moe_gen\", replace: {_moe_gen: \"\"}}}]", &log), 1);
    EXPECT_NE(log.find("transform copy: no parameter ghost2 (source of ghost2_moe_gen)"), std::string::npos) << log;
    EXPECT_EQ(run("[{copy: {to: odd_moe_gen, from: ghost}}]", &log), 1);
    EXPECT_NE(log.find("transform copy: ghost (source of odd_moe_gen) holds no value yet"), std::string::npos) << log;
    EXPECT_EQ(run("[{copy: {to: x, from: y, replace: {a: b}}}]", &log), 2);
    EXPECT_NE(log.find("copy takes either 'from' or 'replace', not both"), std::string::npos) << log;
    // every parameter given a value: the bf16 copies are the f32 sources rounded, cast to f16 works
    EXPECT_EQ(run("[{copy: {to: \"l.**_moe_gen**\", replace: {_moe_gen: \"\"}}}, {fill: {keys: [odd_moe_gen, ghost], "
                  "value: 0.1}}, {copy: {to: ghost2_moe_gen, from: ghost}}, {cast: {keys: odd, dtype: f16}}]",
                  &log), 0) << log;
    Reader r(dir + "/o.safetensors");
    const ckpt_entry *e = nullptr;
    std::vector<float> src = read_tensor(r.r, "l.1.attn.w"), dst = read_tensor(r.r, "l.1.attn_moe_gen.w", &e);
    ASSERT_EQ(src.size(), dst.size());
    for (size_t i = 0; i < src.size(); i++) EXPECT_EQ(dst[i], fsdp_bf16_to_f32(fsdp_f32_to_bf16(src[i])));
    EXPECT_EQ(e->dtype, FSDP_DT_BF16);
    read_tensor(r.r, "odd", &e);
    EXPECT_EQ(e->dtype, FSDP_DT_F16);
    EXPECT_EQ(read_tensor(r.r, "ghost2_moe_gen"), std::vector<float>(3, 0.1f));
    rm_rf(dir);
}

TEST(ModelTableStages, SavesAndCheckpointToolsWorkOnATable) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/r.yaml", std::string("runtime: {device: cpu}\n") + TABLE +
               "stages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: s, uses: save-safetensors, with: {path: " + dir + "/hf, shard_mb: 1}}\n"
               "  - {id: d, uses: save-dcp, with: {path: " + dir + "/d}}\n"
               "  - {id: v, uses: verify, with: {against: " + dir + "/hf}}\n");
    std::string log;
    ASSERT_EQ(run_cmd("timeout -k 10 120 " + mpirun_prefix(2) + " " + fsdp_run_bin() + " " + dir + "/r.yaml", &log), 0) << log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + dir + "/d " + dir + "/c.safetensors --to safetensors", &log), 0);
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + dir + "/hf " + dir + "/c.safetensors", &log), 0) << log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt inspect " + dir + "/c.safetensors", &log), 0) << log;
    EXPECT_NE(log.find("tn                                                       f16"), std::string::npos) << log;
    // Llama's HF names need a Llama model
    write_file(dir + "/hf.yaml", std::string("runtime: {device: cpu}\n") + TABLE +
               "stages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: s, uses: save-safetensors, with: {path: " + dir + "/x.safetensors, names: hf}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/hf.yaml", &log), 1);
    EXPECT_NE(log.find("save-safetensors: names: hf maps Llama-family names, and the model is a parameter table"),
              std::string::npos) << log;
    // nothing reads a parameter that has no value
    write_file(dir + "/none.yaml", "runtime: {device: cpu}\nmodel: {params: [{name: w, shape: [2]}]}\n"
               "stages:\n  - {id: i, uses: init-meta}\n  - {id: v, uses: verify}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/none.yaml", &log), 1);
    EXPECT_NE(log.find("verify: 1 parameter holds no value: w"), std::string::npos) << log;
    rm_rf(dir);
}

// ---- sincos_2d: the fixed position table, against the Bagel fixture's numpy tables -----------------------

namespace {

// The float32 pos_embed of ../shared/fixtures/bagel-056b5fd/expected/sincos_<S>x48.safetensors.
std::vector<float> numpy_sincos(int S) {
    Reader r(fixtures_dir() + "/bagel-056b5fd/expected/sincos_" + std::to_string(S) + "x48.safetensors");
    return r.r ? read_tensor(r.r, "pos_embed") : std::vector<float>{};
}

// A table declaring the two Bagel tables (f32), a bf16 one and a random neighbour.
const char *const SINCOS_TABLE =
    "model:\n"
    "  params:\n"
    "    - {name: vit_pos_embed.pos_embed, shape: [25, 48], init: \"sincos_2d(grid=5)\"}\n"
    "    - {name: latent_pos_embed.pos_embed, shape: [16, 48], init: \"sincos_2d(4)\"}\n"
    "    - {name: half.pos_embed, shape: [16, 48], init: \"sincos_2d(grid=4, base=10000)\", dtype: bf16}\n"
    "    - {name: w, shape: [9, 5], init: \"normal(0, 1)\"}\n";

// The checkpoint at path holds the fixture's tables bit for bit (the bf16 one rounded to bf16).
void expect_numpy_tables(const std::string &path) {
    std::vector<float> t5 = numpy_sincos(5), t4 = numpy_sincos(4);
    ASSERT_EQ(t5.size(), 25u * 48);
    ASSERT_EQ(t4.size(), 16u * 48);
    Reader r(path);
    ASSERT_TRUE(r.r) << path;
    const ckpt_entry *e = nullptr;
    std::vector<float> v = read_tensor(r.r, "vit_pos_embed.pos_embed", &e);
    ASSERT_EQ(v.size(), t5.size()) << path;
    EXPECT_EQ(e->dtype, FSDP_DT_F32);
    EXPECT_EQ(0, memcmp(v.data(), t5.data(), v.size() * sizeof(float))) << path << ": vit_pos_embed";
    v = read_tensor(r.r, "latent_pos_embed.pos_embed");
    ASSERT_EQ(v.size(), t4.size()) << path;
    EXPECT_EQ(0, memcmp(v.data(), t4.data(), v.size() * sizeof(float))) << path << ": latent_pos_embed";
    v = read_tensor(r.r, "half.pos_embed", &e);
    ASSERT_EQ(v.size(), t4.size()) << path;
    EXPECT_EQ(e->dtype, FSDP_DT_BF16);
    for (size_t k = 0; k < v.size(); k++)
        ASSERT_EQ(fsdp_f32_to_bf16(v[k]), fsdp_f32_to_bf16(t4[k])) << path << ": half.pos_embed element " << k;
}

}  // namespace

TEST(ModelTableSpec, Sincos2dOnAShapeItCannotFillIsAnErrorNamingTheParameter) {
    Spec flat("model:\n  params:\n    - {name: pe, shape: [48], init: \"sincos_2d(grid=5)\"}\n");
    EXPECT_EQ(flat.rc, FSDP_E_INVALID);
    EXPECT_NE(flat.msg.find("init of pe: sincos_2d(grid=5) needs a 2-D shape [grid*grid, D] = [25, D] with D a positive "
                            "multiple of 4; the parameter is [48] (it has 1 dimension)"),
              std::string::npos) << flat.msg;
    Spec odd("model:\n  params:\n    - {name: pe, shape: [25, 50], init: \"sincos_2d(grid=5)\"}\n");
    EXPECT_NE(odd.msg.find("init of pe: sincos_2d(grid=5) needs"), std::string::npos) << odd.msg;
    EXPECT_NE(odd.msg.find("[25, 50] (D = 50 is not a positive multiple of 4)"), std::string::npos) << odd.msg;
    Spec rows("model:\n  params:\n    - {name: pe, shape: [24, 48], init: \"sincos_2d(grid=5)\"}\n");
    EXPECT_NE(rows.msg.find("init of pe: sincos_2d(grid=5) needs"), std::string::npos) << rows.msg;
    EXPECT_NE(rows.msg.find("(it has 24 rows, not 25)"), std::string::npos) << rows.msg;
    // a grid that is not a side is refused where the rule is written
    Spec zero("model:\n  params:\n    - {name: pe, shape: [25, 48], init: \"sincos_2d(grid=0)\"}\n");
    EXPECT_EQ(zero.msg.find("m.yaml:3:41: init rule 'sincos_2d(grid=0)': grid must be a whole number >= 1"), 0u)
        << zero.msg;
    Spec ok{std::string(SINCOS_TABLE)};
    ASSERT_EQ(ok.rc, 0) << ok.msg;
    EXPECT_EQ(ok.p("half.pos_embed")->init.kind, INIT_SINCOS_2D);
    EXPECT_EQ(ok.p("half.pos_embed")->init.grid, 4);
}

TEST(ModelTableStages, Sincos2dIsNumpysTableOnOneAndThreeRanksThroughEveryInitPath) {
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/meta.yaml", std::string("runtime: {device: cpu, seed: 3}\n") + SINCOS_TABLE +
                                       "stages:\n  - {id: i, uses: init-meta}\n"
                                       "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    write_file(dir + "/cpu.yaml", std::string("runtime: {device: cpu, seed: 4}\n") + SINCOS_TABLE +
                                      "stages:\n  - {id: i, uses: init-cpu}\n  - {id: sh, uses: shard}\n"
                                      "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    write_file(dir + "/load.yaml", std::string("runtime: {device: cpu}\n") + SINCOS_TABLE +
                                       "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + dir +
                                       "/none, if_missing: init, seed: 5}}\n"
                                       "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    int rc;
    std::string out = run_np(1, dir + "/meta.yaml --set vars.out=" + dir + "/m1", &rc);
    ASSERT_EQ(rc, 0) << out;
    out = run_np(3, dir + "/meta.yaml --set vars.out=" + dir + "/m3", &rc);  // rows 9 + 9 + 7, 6 + 6 + 4
    ASSERT_EQ(rc, 0) << out;
    out = run_np(2, dir + "/cpu.yaml --set vars.out=" + dir + "/c2", &rc);
    ASSERT_EQ(rc, 0) << out;
    out = run_np(1, dir + "/load.yaml --set vars.out=" + dir + "/l1", &rc);
    ASSERT_EQ(rc, 0) << out;
    for (const char *o : {"/m1", "/m3", "/c2", "/l1"}) expect_numpy_tables(dir + o);
    rm_rf(dir);
}

// ---- on the GPU (the emulated device in `make test`; skipped without one) -----------------------------

namespace {

// Every tensor of a and b within one unit in the last place of its dtype (the GPU's libm may differ by
// one ulp from the host's in the transforms), with the same dtypes and shapes.
void expect_within_one_ulp(const std::string &a, const std::string &b) {
    Reader ra(a), rb(b);
    ASSERT_TRUE(ra.r && rb.r);
    size_t n = 0;
    for (size_t i = 0; i < ckpt_count(rb.r); i++) {
        const ckpt_entry *eb = ckpt_entry_at(rb.r, i), *ea = nullptr;
        if (!eb->is_tensor) continue;
        std::vector<float> x = read_tensor(ra.r, eb->name, &ea), y = read_tensor(rb.r, eb->name);
        ASSERT_NE(ea, nullptr) << eb->name;
        EXPECT_EQ(ea->dtype, eb->dtype) << eb->name;
        ASSERT_EQ(x.size(), y.size()) << eb->name;
        size_t bad = 0;
        for (size_t k = 0; k < x.size(); k++) {
            int64_t u, v;
            if (eb->dtype == FSDP_DT_F32) {
                int32_t p, q;
                memcpy(&p, &x[k], 4);
                memcpy(&q, &y[k], 4);
                u = p, v = q;
            } else {
                u = eb->dtype == FSDP_DT_BF16 ? fsdp_f32_to_bf16(x[k]) : fsdp_f32_to_f16(x[k]);
                v = eb->dtype == FSDP_DT_BF16 ? fsdp_f32_to_bf16(y[k]) : fsdp_f32_to_f16(y[k]);
            }
            if (std::llabs(u - v) > 1) bad++;
        }
        EXPECT_EQ(bad, 0u) << eb->name;
        n++;
    }
    EXPECT_GT(n, 5u);
}

}  // namespace

TEST(ModelTableDevice, InitMetaOnTheGpuEqualsTheHostForAnyTable) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/r.yaml", std::string("runtime: {seed: 5}\n") + TABLE +
               "    - {name: later, shape: [3, 2], dtype: f16}\n"
               "stages:\n  - {id: i, uses: init-meta}\n"
               "  - {id: t, uses: transform, with: {ops: [{fill: {keys: later, value: 0.1}}]}}\n"
               "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    std::string log;
    for (const char *dev : {"cpu", "cuda"})
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/r.yaml --set runtime.device=" + dev + " --set vars.out=" + dir +
                              "/" + dev, &log), 0) << dev << ": " << log;
    expect_within_one_ulp(dir + "/cuda", dir + "/cpu");
    if (gpu_count() >= 2) {
        std::string x = getenv("FSDP_EMU_DEVICES") ? " -x FSDP_EMU_DEVICES" : "";
        ASSERT_EQ(run_cmd("timeout -k 10 300 " + mpirun_prefix(2) + x + " " + fsdp_run_bin() + " " + dir +
                              "/r.yaml --set runtime.device=cuda --set vars.out=" + dir + "/cuda2", &log), 0) << log;
        expect_within_one_ulp(dir + "/cuda2", dir + "/cpu");
    }
    // a staged load on the GPU rounds into each parameter's dtype like the host load
    write_file(dir + "/l.yaml", "model:\n  params:\n    - {name: lin.weight, shape: [512, 1024], dtype: f16}\n"
               "    - {name: kn, shape: [512, 512], dtype: bf16}\n"
               "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + dir + "/cpu, keys: [lin.weight, kn]}}\n"
               "  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    for (const char *dev : {"cpu", "cuda"})
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/l.yaml --set runtime.device=" + dev + " --set vars.out=" + dir +
                              "/l-" + dev, &log), 0) << dev << ": " << log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + dir + "/l-cpu " + dir + "/l-cuda", &log), 0) << log;
    Reader r(dir + "/l-cuda");
    const ckpt_entry *e = nullptr;
    read_tensor(r.r, "lin.weight", &e);
    EXPECT_EQ(e->dtype, FSDP_DT_F16);
    rm_rf(dir);
}

// sincos_2d on the GPU: computed on the host and uploaded, so the device holds numpy's bits exactly
// (not within an ulp), on one device and sharded over two.
TEST(ModelTableDevice, Sincos2dOnTheGpuIsNumpysTableBitForBit) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
    std::string dir = make_tmpdir("fsdp-mt");
    write_file(dir + "/r.yaml", std::string("runtime: {device: cuda, seed: 2}\n") + SINCOS_TABLE +
               "stages:\n  - {id: i, uses: init-meta}\n  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    std::string log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + dir + "/r.yaml --set vars.out=" + dir + "/g1", &log), 0) << log;
    expect_numpy_tables(dir + "/g1");
    if (gpu_count() >= 2) {
        std::string x = getenv("FSDP_EMU_DEVICES") ? " -x FSDP_EMU_DEVICES" : "";
        ASSERT_EQ(run_cmd("timeout -k 10 300 " + mpirun_prefix(2) + x + " " + fsdp_run_bin() + " " + dir +
                              "/r.yaml --set vars.out=" + dir + "/g2", &log), 0) << log;
        expect_numpy_tables(dir + "/g2");
    }
    rm_rf(dir);
}
