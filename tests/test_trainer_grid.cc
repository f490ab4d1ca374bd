// The trainer grid (tests/data/trainers/grid, tools/gen/trainers/gen_grid.sh): checkpoints of three more model
// shapes written by each trainer's own code -- MHA (3 heads, 3 kv heads, head_dim 16, 3 layers), MQA (4 heads, 1 kv
// head, head_dim 8, 1 layer) and GQA with 3 q heads per kv head (6 heads, 2 kv heads, head_dim 8) -- where the
// layouts' row orders (torchtitan 0.3's fused wqkv, fms's qkv_fused, OLMo's att_proj, the rotate-half rows of
// OLMo-core / OLMo / Hugging Face names) and DeepSpeed's partition cuts (2 and 3 ranks) differ from the common
// fixtures' one shape. Each is recognised, round-trips through fsdp-run's layout into its own bit for bit, loads
// strictly with its optimizer on 1 and 3 ranks, and the next two steps are the trainer's own (expected.json).
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt_compare.h"
#include "jsonl_util.h"
#include "test_util.h"

extern "C" {
#include "layouts/lay_deepspeed.h"
}

using namespace fsdp_test;

namespace {

const char *const kRoot = "tests/data/trainers/grid";

struct GridSys {
    const char *dir;    // under tests/data/trainers/grid
    const char *sub;    // the checkpoint inside wsN/
    const char *layout; // the layout fsdp-run names it (--to)
    int start;          // the step fsdp-run resumes at: the trainer's train state (none in OLMo-core's, Megatron's,
                        // accelerate's as read; OLMo's train.pt is not read)
    const char *parts;  // the files or DCP directories of a checkpoint of several: their names, ',' between
    int ds_stage;       // a DeepSpeed ZeRO stage (its files compared as one reader), else 0
    std::vector<std::string> configs; // the grid configs it saved on 2 ranks
    const char *ws3;                  // the config also saved on 3 ranks ("" none)
};

// torchtitan, OLMo-core, fms and OLMo saved every config; the systems of Hugging Face names mqa and gqa3 (mha's
// head_dim 16 is the common fixtures'); DeepSpeed mqa also on 3 ranks (its partitions padded there).
const std::vector<std::string> kAll = {"mha", "mqa", "gqa3"}, kHf = {"mqa", "gqa3"};
const GridSys kGrid[] = {
    {"torchtitan-0.3", "step-3", "torchtitan-0.3", 3, "", 0, kAll, ""},
    {"olmo-core-3.0", "", "olmo-core-3", 0, "", 0, kAll, ""},
    {"fms-1.13", "checkpoints/step_3_ckp", "fms-1.13", 3, "", 0, kAll, ""},
    {"olmo-0.6", "step3-unsharded", "olmo-0.6", 0, "model.pt,optim.pt", 0, kAll, ""},
    {"deepspeed-0.19-zero2", "", "deepspeed-zero2", 3, "", 2, kHf, "mqa"},
    {"deepspeed-0.19-zero3", "", "deepspeed-zero3", 3, "", 3, kHf, "mqa"},
    {"megatron-fsdp-0.6", "", "megatron-fsdp-0.6", 0, "", 0, kHf, ""},
    {"accelerate-1.15", "", "accelerate-1.15", 0, "pytorch_model_fsdp_0,optimizer_0", 0, kHf, ""},
};

// A grid fixture: system s's checkpoint of config c saved on ws ranks.
struct Fix {
    const GridSys &s;
    std::string cfg;
    int ws;
    std::string dir() const { return std::string(kRoot) + "/" + s.dir + "/" + cfg; }
    std::string ckpt() const {
        std::string d = dir() + "/ws" + std::to_string(ws);
        return *s.sub ? d + "/" + s.sub : d;
    }
    std::string what() const { return std::string(s.dir) + "/" + cfg + "/ws" + std::to_string(ws); }
};

std::vector<Fix> fixtures() {
    std::vector<Fix> v;
    for (const GridSys &s : kGrid)
        for (const std::string &c : s.configs)
            for (int ws : {2, 3})
                if (ws == 2 || c == s.ws3) v.push_back({s, c, ws});
    return v;
}

// config.json's plain sizes
struct Shape {
    int dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn_hidden = 0, vocab = 0;
    double norm_eps = 0, rope_theta = 0;
};

Shape shape_of(const Fix &f) {
    Shape sh;
    json_error_t je;
    std::string p = f.dir() + "/config.json";
    json_t *j = json_load_file(p.c_str(), 0, &je);
    EXPECT_TRUE(j) << p << ": " << je.text;
    if (!j) return sh;
    auto i = [&](const char *k) { return (int)json_integer_value(json_object_get(j, k)); };
    sh.dim = i("dim"), sh.n_layers = i("n_layers"), sh.n_heads = i("n_heads"), sh.n_kv_heads = i("n_kv_heads");
    sh.head_dim = i("head_dim"), sh.ffn_hidden = i("ffn_hidden"), sh.vocab = i("vocab");
    sh.norm_eps = json_number_value(json_object_get(j, "norm_eps"));
    sh.rope_theta = json_number_value(json_object_get(j, "rope_theta"));
    json_decref(j);
    EXPECT_GT(sh.dim * sh.n_layers * sh.n_heads * sh.n_kv_heads * sh.head_dim * sh.ffn_hidden * sh.vocab, 0) << p;
    return sh;
}

std::string heads(const Shape &sh) {
    return " --n-heads " + std::to_string(sh.n_heads) + " --n-kv-heads " + std::to_string(sh.n_kv_heads);
}

std::string num(double x) {
    char b[64];
    snprintf(b, sizeof b, "%.17g", x);
    return b;
}

// the model: line with the config's sizes (ffn_hidden as given: no multiple_of rounding)
std::string model_line(const Shape &sh) {
    return "model: {arch: llama3, dim: " + std::to_string(sh.dim) + ", n_layers: " + std::to_string(sh.n_layers) +
           ", n_heads: " + std::to_string(sh.n_heads) + ", n_kv_heads: " + std::to_string(sh.n_kv_heads) +
           ", head_dim: " + std::to_string(sh.head_dim) + ", ffn_hidden: " + std::to_string(sh.ffn_hidden) +
           ", vocab_size: " + std::to_string(sh.vocab) + ", norm_eps: " + num(sh.norm_eps) +
           ", rope_theta: " + num(sh.rope_theta) + ", tie_embeddings: false}\n";
}

std::vector<double> expected(const Fix &f, const char *key) {
    json_error_t je;
    std::string p = f.dir() + "/expected.json";
    json_t *j = json_load_file(p.c_str(), 0, &je);
    EXPECT_TRUE(j) << p << ": " << je.text;
    std::vector<double> v;
    json_t *a = json_object_get(json_object_get(j, ("ws" + std::to_string(f.ws)).c_str()), key);
    for (size_t i = 0; i < json_array_size(a); i++) v.push_back(json_number_value(json_array_get(a, i)));
    json_decref(j);
    EXPECT_EQ(v.size(), 2u) << p << " ws" << f.ws << " " << key;
    return v;
}

struct Dir {
    std::string d = make_tmpdir("fsdp-grid");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

int ckpt_cmd(const std::string &args, std::string *out) { return run_cmd(fsdp_run_bin() + " ckpt " + args, out); }

std::vector<std::string> parts(const Fix &f, const std::string &path) {
    std::string p = f.s.parts;
    if (p.empty()) return {path};
    std::vector<std::string> v;
    for (size_t a = 0, b; a <= p.size(); a = b + 1) {
        b = p.find(',', a);
        if (b == std::string::npos) b = p.size();
        v.push_back(path + "/" + p.substr(a, b - a));
    }
    return v;
}

// Every non-tensor value of a is in b, the same (OLMo's param_names, FSDP1's wrapped names which OLMo's loader
// strips, are written as its params; DeepSpeed's ds_config is the job's dict and global_samples is left for
// DeepSpeed to take: not compared, as in test_trainer_ckpts.cc).
size_t expect_same_values(ckpt_reader *a, ckpt_reader *b, const std::string &what) {
    size_t n = 0;
    for (size_t i = 0; i < ckpt_count(a); i++) {
        const ckpt_entry *e = ckpt_entry_at(a, i);
        size_t len = strlen(e->name);
        if (e->is_tensor || !strncmp(e->name, "dataloader.", 11) || strstr(e->name, "ds_config") ||
            strstr(e->name, "global_samples") || (len > 11 && !strcmp(e->name + len - 11, "param_names")))
            continue;
        long j = ckpt_find(b, e->name);
        EXPECT_GE(j, 0) << what << ": value " << e->name << " lost";
        if (j < 0) continue;
        const char *x = ckpt_value_text(a, i), *y = ckpt_value_text(b, (size_t)j);
        EXPECT_STREQ(x ? x : "?", y ? y : "-") << what << ": " << e->name;
        n++;
    }
    return n;
}

// A DeepSpeed directory's files as one reader ("ms." the model states, "r<R>." rank R's optimizer state).
struct DsFiles {
    ckpt_reader *r = nullptr;
    explicit DsFiles(const std::string &dir) {
        int ranks;
        fsdp_err err;
        EXPECT_EQ(lay_ds_open_files(dir.c_str(), &r, &ranks, &err), 0) << dir << ": " << err.msg;
    }
    ~DsFiles() {
        if (r) ckpt_close(r);
    }
};

// The elements of a torch.Size((a, b),) value.
int64_t numel_of(const char *size_text) {
    const char *p = strstr(size_text ? size_text : "", "((");
    if (!p) return -1;
    int64_t n = 1;
    for (p += 2; *p && *p != ')';) {
        char *end;
        long long d = strtoll(p, &end, 10);
        if (end == p) break;
        n *= d;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

// Tensor name of a DeepSpeed ZeRO-3 rank file's flat fp32 partition (sub group g).
bool is_z3_flat(const char *name) { return strstr(name, ".optimizer_state_dict.fp32_flat_groups.") != nullptr; }

// DeepSpeed ZeRO-3 cuts each parameter of n elements into ws parts of ceil(n / ws), the last rank's part padded.
// Its own partitions hold whatever memory was there in the padding (torch.empty; values like -5.4e25 in the
// grid's mqa ws3): its loader never maps them to a weight, and a writer cannot reproduce them. fsdp-run writes
// zeros there. So: every element of the trainer's flat partitions that belongs to a parameter equals fsdp-run's
// bit for bit, and fsdp-run's padding is 0 (the padding located from param_shapes, in DeepSpeed's order).
void expect_same_z3_partitions(ckpt_reader *got, ckpt_reader *want, int ws, const std::string &what) {
    std::vector<int64_t> numels;
    for (size_t i = 0; i < ckpt_count(want); i++) {
        const ckpt_entry *e = ckpt_entry_at(want, i);
        if (!e->is_tensor && !strncmp(e->name, "ms.param_shapes.", 16))
            numels.push_back(numel_of(ckpt_value_text(want, i)));
    }
    ASSERT_FALSE(numels.empty()) << what;
    size_t padded = 0;
    for (int r = 0; r < ws; r++) {
        std::vector<float> a, b; // the rank's sub groups, one after the other
        for (int g = 0;; g++) {
            std::string k = "r" + std::to_string(r) + ".optimizer_state_dict.fp32_flat_groups." + std::to_string(g);
            if (ckpt_find(want, k.c_str()) < 0) break;
            std::vector<unsigned char> x = tensor_bytes(want, k, FSDP_DT_F32), y = tensor_bytes(got, k, FSDP_DT_F32);
            ASSERT_EQ(x.size(), y.size()) << what << ": " << k;
            size_t at = a.size();
            a.resize(at + x.size() / 4), b.resize(at + y.size() / 4);
            memcpy(a.data() + at, x.data(), x.size()), memcpy(b.data() + at, y.data(), y.size());
        }
        size_t pos = 0;
        for (int64_t n : numels) {
            ASSERT_GT(n, 0) << what;
            int64_t part = (n + ws - 1) / ws, real = std::max<int64_t>(0, std::min<int64_t>(part, n - part * r));
            ASSERT_LE(pos + (size_t)part, a.size()) << what << " rank " << r;
            EXPECT_EQ(memcmp(a.data() + pos, b.data() + pos, (size_t)real * 4), 0)
                << what << " rank " << r << " at " << pos;
            for (size_t k = pos + (size_t)real; k < pos + (size_t)part; k++, padded++)
                EXPECT_EQ(b[k], 0.0f) << what << " rank " << r << " padding " << k;
            pos += (size_t)part;
        }
        EXPECT_EQ(pos, a.size()) << what << " rank " << r << ": the partitions are the parameters' parts";
    }
    if (ws == 3) {
        EXPECT_GT(padded, 0u) << what; // mqa's sizes are not multiples of 3
    }
}

// Every tensor of want is got's, bit for bit (ZeRO-3's flat partitions: expect_same_z3_partitions).
void expect_same_ds_tensors(ckpt_reader *got, ckpt_reader *want, int stage, const std::string &what) {
    size_t n = 0;
    for (size_t i = 0; i < ckpt_count(want); i++) {
        const ckpt_entry *w = ckpt_entry_at(want, i);
        if (!w->is_tensor || (stage == 3 && is_z3_flat(w->name))) continue;
        long j = ckpt_find(got, w->name);
        EXPECT_GE(j, 0) << what << ": " << w->name << " not written";
        if (j < 0) continue;
        EXPECT_TRUE(tensor_bytes(got, w->name, w->dtype) == tensor_bytes(want, w->name)) << what << ": " << w->name;
        n++;
    }
    EXPECT_GT(n, 0u) << what;
}

TEST(TrainerGrid, EveryFixtureIsThere) {
    size_t n = 0;
    for (const Fix &f : fixtures()) {
        EXPECT_TRUE(exists(f.ckpt())) << f.what();
        EXPECT_TRUE(exists(f.dir() + "/expected.json")) << f.what();
        n++;
    }
    EXPECT_TRUE(exists(std::string(kRoot) + "/batch.safetensors"));
    EXPECT_EQ(n, 4u * 3 + 4 * 2 + 2); // 4 systems x 3 configs, 4 x 2 (2 DeepSpeed stages), DeepSpeed mqa on 3 ranks
}

// (a) inspect names the layout; (b) into fsdp-run's layout and back into the trainer's own: every tensor under its
// own name bit for bit, and every value.
TEST(TrainerGrid, EachIsRecognisedAndRoundTripsThroughFsdpRunsLayoutBitForBit) {
    Dir t;
    for (const Fix &f : fixtures()) {
        Shape sh = shape_of(f);
        std::string src = f.ckpt(), out, canon = t / (std::string(f.s.dir) + "_" + f.cfg + std::to_string(f.ws)),
                    back = canon + "_back", w = " --world " + std::to_string(f.ws);
        ASSERT_EQ(ckpt_cmd("inspect " + src, &out), 0) << out;
        std::string named = f.s.ds_stage ? "layout: a DeepSpeed ZeRO checkpoint of " + std::to_string(f.ws) + " ranks"
                                         : std::string("layout: ") + f.s.layout + " (";
        EXPECT_NE(out.find(named), std::string::npos) << f.what() << ": " << out;
        ASSERT_EQ(ckpt_cmd("convert " + src + " " + canon + " --from auto" + heads(sh), &out), 0)
            << f.what() << ": " << out;
        ASSERT_EQ(ckpt_cmd("inspect " + canon, &out), 0) << out;
        EXPECT_NE(out.find("layout: torchtitan-0.2 ("), std::string::npos) << f.what() << ": " << out;
        std::string opt = f.s.ds_stage == 2 ? " --option gradient_clipping=1.0" : "";
        ASSERT_EQ(ckpt_cmd("convert " + canon + " " + back + " --to " + f.s.layout + heads(sh) + w + opt, &out), 0)
            << f.what() << ": " << out;
        size_t values = 0;
        if (f.s.ds_stage) {
            DsFiles a(src), b(back);
            ASSERT_TRUE(a.r && b.r) << f.what();
            expect_same_ds_tensors(b.r, a.r, f.s.ds_stage, f.what()); // every tensor of every file, under its own key
            expect_same_ds_tensors(a.r, b.r, f.s.ds_stage, f.what());
            if (f.s.ds_stage == 3) expect_same_z3_partitions(b.r, a.r, f.ws, f.what());
            values = expect_same_values(a.r, b.r, f.what()); // partition_count, group_paddings, param_shapes, ...
        } else {
            std::vector<std::string> pa = parts(f, src), pb = parts(f, back);
            for (size_t k = 0; k < pa.size(); k++) {
                Ckpt a(pa[k]), b(pb[k]);
                ASSERT_TRUE(a.r && b.r) << pa[k];
                expect_same_tensors(b.r, a.r);
                expect_same_tensors(a.r, b.r);
                values += expect_same_values(a.r, b.r, pa[k]);
            }
        }
        EXPECT_GT(values, 0u) << f.what();
    }
}

// (c) loaded strictly with its optimizer by a recipe of the config's sizes, on 1 and 3 ranks (the 6-row batch
// divides): the next two steps' loss and grad norm are the trainer's own after its own load (float32 against
// float32, as TrainerCkpts.TheNextStepsEqualTheTrainersOwnOnOneAndTwoRanks).
TEST(TrainerGrid, TheNextStepsEqualTheTrainersOwnOnOneAndThreeRanks) {
    Dir t;
    for (const Fix &f : fixtures()) {
        Shape sh = shape_of(f);
        std::vector<double> loss = expected(f, "resumed_losses"), gn = expected(f, "resumed_grad_norms");
        ASSERT_EQ(loss.size(), 2u);
        ASSERT_EQ(gn.size(), 2u);
        for (int np : {1, 3}) {
            std::string m = t / "m.jsonl", what = f.what() + " on " + std::to_string(np);
            rm_rf(m);
            write_file(t / "r.yaml", model_line(sh) + "data: {kind: safetensors, path: " + kRoot +
                                         "/batch.safetensors, batch_size: 6, seq_len: 16}\nstages:\n"
                                         "  - {id: l, uses: load-ckpt, with: {path: " + f.ckpt() +
                                         ", load_optimizer: true}}\n  - {id: t, uses: train-steps, with: {steps: " +
                                         std::to_string(f.s.start + 2) +
                                         ", lr: 1e-3, decay: none, betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, "
                                         "max_grad_norm: 1.0, metrics: " + m + "}}\n");
            int rc;
            std::string log = run_np(np, t / "r.yaml", &rc);
            ASSERT_EQ(rc, 0) << what << ": " << log;
            std::vector<double> got = jsonl_field(m, "loss"), gg = jsonl_field(m, "grad_norm");
            ASSERT_EQ(got.size(), 2u) << what << ": " << log;
            ASSERT_EQ(gg.size(), 2u) << what << ": " << log;
            for (size_t k = 0; k < 2; k++) {
                EXPECT_NEAR(got[k], loss[k], 5e-7 * loss[k]) << what << " step " << k;
                EXPECT_NEAR(gg[k], gn[k], 2e-6 * gn[k]) << what << " step " << k;
            }
        }
    }
}

} // namespace
