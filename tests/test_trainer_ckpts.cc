// Checkpoints written by other trainers' own code (tests/data/trainers/*, tools/gen/trainers/gen_*.py): each is
// recognised, round-trips through fsdp-run's layout bit for bit, loads strictly with its optimizer on 1, 2 and
// 3 ranks, and the next training steps equal the trainer's own next steps (expected.json, the trainer's run
// after loading its checkpoint with its own loader).
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ckpt_compare.h"
#include "jsonl_util.h"
#include "st_test_reader.h"
#include "test_util.h"

extern "C" {
#include "layouts/lay_deepspeed.h"
}

using namespace fsdp_test;

namespace {

struct Sys {
    const char *dir;    // under tests/data/trainers
    const char *sub;    // the checkpoint inside ws1/, ws2/
    const char *layout; // the layout fsdp-run names it
    const char *model;  // its parameters' prefix (the after-step weights have none)
    int start;          // the step fsdp-run resumes at: the trainer's train state (OLMo-core's checkpoint has none)
    const char *parts;  // a container of DCP directories (accelerate's): their names, ',' between; "" for one DCP
};

const Sys kSystems[] = {
    {"torchtitan-0.3", "step-3", "torchtitan-0.3", "", 3, ""},
    {"torchtitan-0.2", "step-3", "torchtitan-0.2", "", 3, ""},
    {"olmo-core-3.0", "", "olmo-core-3", "model.", 0, ""},
    {"fms-1.13", "checkpoints/step_3_ckp", "fms-1.13", "model_state.", 3, ""}, // its metadata.pth
    {"megatron-fsdp-0.6", "", "megatron-fsdp-0.6", "model.", 0, ""},        // after-step weights: module.<HF name>
    {"accelerate-1.15", "", "accelerate-1.15", "model.", 0, "pytorch_model_fsdp_0,optimizer_0"},
};

// OLMo 0.6's step directory of torch.save files (model.pt, optim.pt; train.pt beside them): in the round trips below.
// Its loading and next steps have tests of their own (OlmoCkpts): fsdp-run does not read its train.pt's step.
const Sys kOlmo = {"olmo-0.6", "step3-unsharded", "olmo-0.6", "model.", 0, "model.pt,optim.pt"};

std::vector<Sys> round_trip_systems() {
    std::vector<Sys> v(std::begin(kSystems), std::end(kSystems));
    v.push_back(kOlmo);
    return v;
}

std::string data(const Sys &s, const std::string &f = "") {
    return std::string("tests/data/trainers/") + s.dir + (f.empty() ? "" : "/" + f);
}
std::string ckpt_of(const Sys &s, int ws) {
    std::string d = data(s, "ws" + std::to_string(ws));
    return *s.sub ? d + "/" + s.sub : d;
}

// The DCP directories of a checkpoint of system s at path: itself, or its parts.
std::vector<std::string> dcps(const Sys &s, const std::string &path) {
    std::vector<std::string> v;
    std::string p = s.parts;
    if (p.empty()) return {path};
    for (size_t a = 0, b; a <= p.size(); a = b + 1) {
        b = p.find(',', a);
        if (b == std::string::npos) b = p.size();
        v.push_back(path + "/" + p.substr(a, b - a));
    }
    return v;
}

// Each DCP part of system s's checkpoint at x holds the tensors of the same part at y, bit for bit, and no other.
void expect_same_parts(const Sys &s, const std::string &x, const std::string &y) {
    std::vector<std::string> px = dcps(s, x), py = dcps(s, y);
    for (size_t k = 0; k < px.size(); k++) {
        Ckpt a(px[k]), b(py[k]);
        ASSERT_TRUE(a.r && b.r) << px[k];
        expect_same_tensors(b.r, a.r);
        expect_same_tensors(a.r, b.r);
    }
}

struct Dir {
    std::string d = make_tmpdir("fsdp-trainers");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

int ckpt_cmd(const std::string &args, std::string *out) { return run_cmd(fsdp_run_bin() + " ckpt " + args, out); }

// Every non-tensor entry of a is in b with the same value (the dataloader's per-rank blobs aside: convert --world
// writes them for the ranks it writes).
// Every value of a in b, the same. OLMo's param_names (FSDP1's wrapped-module names of the job that saved, which
// OLMo's loader strips and asserts equal to params) are written as its params, the plain names: not compared.
size_t expect_same_values(ckpt_reader *a, ckpt_reader *b, const std::string &what) {
    size_t n = 0;
    for (size_t i = 0; i < ckpt_count(a); i++) {
        const ckpt_entry *e = ckpt_entry_at(a, i);
        size_t len = strlen(e->name);
        if (e->is_tensor || !strncmp(e->name, "dataloader.", 11) ||
            (len > 11 && !strcmp(e->name + len - 11, "param_names")))
            continue;
        long j = ckpt_find(b, e->name);
        EXPECT_GE(j, 0) << what << ": value " << e->name << " lost";
        if (j < 0) continue;
        const char *x = nullptr, *y = nullptr;
        fsdp_err err;
        EXPECT_EQ(ckpt_value(a, i, &x, &err), 0) << err.msg;
        EXPECT_EQ(ckpt_value(b, (size_t)j, &y, &err), 0) << err.msg;
        EXPECT_STREQ(x ? x : "?", y ? y : "-") << what << ": " << e->name;
        n++;
    }
    return n;
}

std::vector<double> expected(const Sys &s, const char *ws, const char *key) {
    json_error_t je;
    json_t *j = json_load_file(data(s, "expected.json").c_str(), 0, &je);
    EXPECT_TRUE(j) << data(s, "expected.json") << ": " << je.text;
    std::vector<double> v;
    json_t *a = json_object_get(json_object_get(j, ws), key);
    for (size_t i = 0; i < json_array_size(a); i++) v.push_back(json_number_value(json_array_get(a, i)));
    json_decref(j);
    EXPECT_FALSE(v.empty()) << s.dir << " " << ws << " " << key;
    return v;
}

// the training the fixtures' generators ran after the save (tools/gen/trainers: constant lr, AdamW, clip 1)
std::string recipe(const Sys &s, const std::string &ckpt, int steps, const std::string &metrics,
                   const std::string &save) {
    std::string r = "model: {preset: tiny}\ndata: {kind: safetensors, path: " + data(s, "batch.safetensors") +
                    ", batch_size: 4, seq_len: 32}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + ckpt +
                    ", load_optimizer: true}}\n";
    if (steps)
        r += "  - {id: t, uses: train-steps, with: {steps: " + std::to_string(s.start + steps) +
             ", lr: 1e-3, decay: none, betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0, "
             "metrics: " + metrics + "}}\n";
    if (!save.empty()) r += "  - {id: s, uses: save-dcp, with: {path: " + save + "}}\n";
    return r;
}

// fsdp-run's next two steps from ckpt on np ranks (tmp: a scratch directory) give the trainer's own of expected.json's
// `ws` run: float32 against the trainer's float32 run (its own world-1 and world-2 runs differ by up to 1e-7 relative;
// fsdp-run is within 1e-7 of them).
void expect_next_steps(const std::string &tmp, const Sys &s, const std::string &ckpt, int np, const char *ws) {
    std::vector<double> loss = expected(s, ws, "resumed_losses"), gn = expected(s, ws, "resumed_grad_norms");
    std::string m = tmp + "/m.jsonl", what = std::string(s.dir) + " " + ckpt + " on " + std::to_string(np);
    rm_rf(m);
    write_file(tmp + "/r.yaml", recipe(s, ckpt, 2, m, ""));
    int rc;
    std::string log = run_np(np, tmp + "/r.yaml", &rc);
    ASSERT_EQ(rc, 0) << what << ": " << log;
    std::vector<double> got = jsonl_field(m, "loss"), gg = jsonl_field(m, "grad_norm");
    ASSERT_EQ(got.size(), 2u) << what << ": " << log;
    for (size_t k = 0; k < 2; k++) {
        EXPECT_NEAR(got[k], loss[k], 5e-7 * loss[k]) << what << " step " << k;
        EXPECT_NEAR(gg[k], gn[k], 2e-6 * gn[k]) << what << " step " << k;
    }
}

TEST(TrainerCkpts, EachIsRecognisedAndRoundTripsThroughFsdpRunsLayoutBitForBit) {
    Dir t;
    for (const Sys &s : round_trip_systems()) {
        for (int ws : {1, 2}) {
            std::string src = ckpt_of(s, ws), out, canon = t / (std::string(s.dir) + std::to_string(ws)),
                        back = canon + "_back";
            ASSERT_EQ(ckpt_cmd("inspect " + src, &out), 0) << out;
            EXPECT_NE(out.find(std::string("layout: ") + s.layout + " ("), std::string::npos) << out;
            ASSERT_EQ(ckpt_cmd("convert " + src + " " + canon + " --from auto --n-heads 4 --n-kv-heads 2", &out), 0) << out;
            ASSERT_EQ(ckpt_cmd("inspect " + canon, &out), 0) << out;
            EXPECT_NE(out.find("layout: torchtitan-0.2 ("), std::string::npos) << out;
            ASSERT_EQ(ckpt_cmd("convert " + canon + " " + back + " --to " + s.layout + " --n-heads 4 --n-kv-heads 2 --world " +
                                   std::to_string(ws), &out), 0) << out;
            std::vector<std::string> pa = dcps(s, src), pb = dcps(s, back);
            size_t values = 0;
            for (size_t k = 0; k < pa.size(); k++) {
                Ckpt a(pa[k]), b(pb[k]);
                ASSERT_TRUE(a.r && b.r) << pa[k];
                expect_same_tensors(b.r, a.r); // every tensor of the trainer's, under its own name, bit for bit
                expect_same_tensors(a.r, b.r);
                values += expect_same_values(a.r, b.r, pa[k]); // and every value: options, params lists, train state
            }
            EXPECT_GT(values, 0u) << src;
        }
    }
}

// Between every pair of layouts, straight from one trainer's checkpoint into the other's and back: bit for bit.
TEST(TrainerCkpts, EveryPairOfLayoutsRoundTripsBitForBit) {
    Dir t;
    std::vector<Sys> all = round_trip_systems();
    // OLMo's groups need max_grad_norm (its clipping reads it from the loaded groups), which the other trainers'
    // checkpoints lack; a checkpoint that has it (OLMo's own, or one converted from it) keeps its value.
    auto opts = [](const Sys &to) {
        return std::string(" --n-heads 4 --n-kv-heads 2 --world 2") + (to.parts[0] == 'm' ? " --option max_grad_norm=1.0" : "");
    };
    for (const Sys &a : all) {
        for (const Sys &b : all) {
            if (!strcmp(a.dir, b.dir)) continue;
            std::string src = ckpt_of(a, 2), mid = t / (std::string(a.dir) + "_to_" + b.dir), back = mid + "_back", out;
            ASSERT_EQ(ckpt_cmd("convert " + src + " " + mid + " --from " + a.layout + " --to " + b.layout + opts(b), &out), 0)
                << out;
            ASSERT_EQ(ckpt_cmd("inspect " + mid, &out), 0) << out;
            EXPECT_NE(out.find(std::string("layout: ") + b.layout + " ("), std::string::npos) << out;
            ASSERT_EQ(ckpt_cmd("convert " + mid + " " + back + " --from auto --to " + a.layout + opts(a), &out), 0) << out;
            expect_same_parts(a, src, back);
        }
    }
}

// ckpt diff across layouts: a torchtitan 0.3 checkpoint and the same one in OLMo-core's layout compare equal
// once both are read in fsdp-run's layout (not as they are: no key in common).
TEST(TrainerCkpts, DiffComparesAcrossLayouts) {
    Dir t;
    std::string src = ckpt_of(kSystems[0], 2), oc = t / "oc", out;
    ASSERT_EQ(ckpt_cmd("convert " + src + " " + oc + " --to olmo-core-3 --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    std::string ign = " --ignore 'train_state.**,lr_scheduler.**,dataloader.**'";
    EXPECT_EQ(ckpt_cmd("diff " + src + " " + oc + ign, &out), 1) << out;
    EXPECT_EQ(ckpt_cmd("diff " + src + " " + oc + ign + " --layout auto --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_NE(out.find("layout olmo-core-3 -> torchtitan-0.2"), std::string::npos) << out;
    EXPECT_NE(out.find("equal: "), std::string::npos) << out;
    // one moment changed in the OLMo-core copy: found, under fsdp-run's name
    std::string mod = t / "mod";
    ASSERT_EQ(ckpt_cmd("convert " + src + " " + mod + " --to olmo-core-3 --n-heads 4 --n-kv-heads 2 "
                       "--exclude optim.state.blocks.1.attention.w_k.weight.exp_avg", &out), 0) << out;
    EXPECT_EQ(ckpt_cmd("diff " + src + " " + mod + ign + " --layout auto --n-heads 4 --n-kv-heads 2", &out), 1) << out;
    EXPECT_NE(out.find("only in " + src + ": optimizer.state.layers.1.attention.wk.weight.exp_avg"), std::string::npos) << out;
}

TEST(TrainerCkpts, TheNextStepsEqualTheTrainersOwnOnOneAndTwoRanks) {
    Dir t;
    for (const Sys &s : kSystems)
        for (int ws : {1, 2})
            for (int np : {1, 2}) expect_next_steps(t.d, s, ckpt_of(s, ws), np, "ws1");
}

TEST(TrainerCkpts, ThreeRanksLoadWhatOneRankLoads) {
    Dir t;
    for (const Sys &s : kSystems) {
        std::string one = t / (std::string(s.dir) + "_1"), three = t / (std::string(s.dir) + "_3");
        for (auto [np, out] : {std::pair<int, std::string>{1, one}, {3, three}}) {
            write_file(t / "r.yaml", recipe(s, ckpt_of(s, 2), 0, "", out));
            int rc;
            std::string log = run_np(np, t / "r.yaml", &rc);
            ASSERT_EQ(rc, 0) << s.dir << " on " << np << ": " << log;
        }
        Ckpt a(one), b(three);
        ASSERT_TRUE(a.r && b.r);
        expect_same_tensors(a.r, b.r);
        EXPECT_GE(ckpt_find(a.r, "optimizer.state.layers.1.attention.wk.weight.exp_avg_sq"), 0) << s.dir;
    }
}

TEST(TrainerCkpts, WeightsAfterTheNextStepAreTheTrainersOwn) {
    Dir t;
    for (const Sys &s : kSystems) {
        std::string saved = t / (std::string(s.dir) + "_s"), native = saved + "_n", out;
        write_file(t / "r.yaml", recipe(s, ckpt_of(s, 1), 1, t / "m.jsonl", saved));
        int rc;
        std::string log = run_np(1, t / "r.yaml", &rc);
        ASSERT_EQ(rc, 0) << log;
        ASSERT_EQ(ckpt_cmd("convert " + saved + " " + native + " --to " + s.layout + " --n-heads 4 --n-kv-heads 2", &out), 0)
            << out;
        std::map<std::string, st_test::Tensor> want;
        std::string why;
        ASSERT_TRUE(st_test::load(data(s, "ws1_after_resume_step.safetensors"), &want, &why)) << why;
        Ckpt got(dcps(s, native)[0]);
        ASSERT_TRUE(got.r);
        double worst = 0;
        std::string where;
        for (auto &kv : want) {
            std::vector<unsigned char> b = tensor_bytes(got.r, s.model + kv.first, FSDP_DT_F32);
            std::vector<float> g(b.size() / 4);
            memcpy(g.data(), b.data(), b.size());
            const std::vector<float> &w = kv.second.f32;
            ASSERT_EQ(g.size(), w.size()) << kv.first;
            for (size_t i = 0; i < g.size(); i++)
                if (std::fabs(g[i] - w[i]) > worst) worst = std::fabs(g[i] - w[i]), where = kv.first;
        }
        // one AdamW step of lr 1e-3 from the same state: a few float32 ulps of the weights (1.2e-7 at 1.0)
        EXPECT_LT(worst, 5e-7) << s.dir << ": " << where;
        printf("%s: weights after the next step within %.3g of the trainer's (worst %s)\n", s.dir, worst, where.c_str());
    }
}

} // namespace

namespace {

// DeepSpeed ZeRO-3's model_states.pt holds [0]-shaped placeholders for every weight (the values are in the
// *_optim_states.pt partitions): convert and load refuse it naming the tensor, and write nothing.
TEST(TrainerCkpts, DeepSpeedZero3PlaceholdersAreNeverTakenForTheWeights) {
    Dir t;
    std::string z3 = "tests/data/trainers/deepspeed-0.19/zero3/ws1/global_step3/zero_pp_rank_0_mp_rank_00_model_states.pt", out;
    ASSERT_TRUE(exists(z3));
    for (const char *dst : {"z.safetensors", "z_dcp", "hf"}) {
        std::string extra = !strcmp(dst, "hf") ? " --to hf --strip-prefix module. --model tiny" : "";
        EXPECT_EQ(ckpt_cmd("convert " + z3 + " " + (t / dst) + extra, &out), 1) << out;
        EXPECT_NE(out.find("tensor module.model.embed_tokens.weight has no elements where "
                           "param_shapes.0.model.embed_tokens.weight gives"), std::string::npos) << out;
        EXPECT_FALSE(exists(t / dst)) << dst;
    }
    write_file(t / "l.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + z3 +
                                 ", names: hf, strip_prefix: module.}}\n");
    int rc;
    std::string log = run_np(1, t / "l.yaml", &rc);
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find("DeepSpeed ZeRO-3 model_states.pt keeps placeholders"), std::string::npos) << log;
}

// Every file of a ZeRO checkpoint opens: the optimizer files' DeepSpeed objects (LossScaler, ZeroStageEnum,
// fragment_address) are data; a ZeRO-2 model_states.pt's weights (views into one flat storage) are the fp32
// weights zero_to_fp32.py merges, bit for bit.
TEST(TrainerCkpts, DeepSpeedFilesOpenAndZero2WeightsAreZeroToFp32s) {
    Dir t;
    const std::string z = "tests/data/trainers/deepspeed-0.19/";
    std::string out;
    for (const char *f : {"zero2/ws2/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt",
                          "zero3/ws2/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt"}) {
        ASSERT_EQ(ckpt_cmd("inspect " + z + f, &out), 0) << out;
        EXPECT_NE(out.find("optimizer_state_dict.loss_scaler"), std::string::npos) << out;
        EXPECT_NE(out.find("ZeroStageEnum("), std::string::npos) << out;
    }
    for (int ws : {1, 2}) {
        std::string w = t / ("z2_" + std::to_string(ws) + ".safetensors");
        ASSERT_EQ(ckpt_cmd("convert " + z + "zero2/ws" + std::to_string(ws) + "/global_step3/mp_rank_00_model_states.pt " + w +
                               " --keys module. --strip-prefix module.", &out), 0) << out;
        ASSERT_EQ(ckpt_cmd("diff " + w + " " + z + "zero2/ws" + std::to_string(ws) + "_fp32.safetensors", &out), 0) << out;
    }
}

} // namespace

namespace {

// DeepSpeed ZeRO-2 and ZeRO-3 checkpoint directories (DeepSpeed 0.19.8's save_checkpoint, 1 and 2 ranks): the
// weights are what zero_to_fp32.py merges, bit for bit; loaded with their moments on 1, 2 and 3 ranks, the next
// two steps are DeepSpeed's own, and the weights after the next step its own.
struct Zero {
    int stage, ws;
};
const Zero kZero[] = {{2, 1}, {2, 2}, {3, 1}, {3, 2}};
std::string zdir(const Zero &z, const std::string &f = "") {
    return "tests/data/trainers/deepspeed-0.19/zero" + std::to_string(z.stage) + (f.empty() ? "" : "/" + f);
}
std::string zckpt(const Zero &z) { return zdir(z, "ws" + std::to_string(z.ws)); }

TEST(DeepSpeedCkpts, WeightsAreZeroToFp32sBitForBit) {
    Dir t;
    for (const Zero &z : kZero) {
        std::string out, hf = t / ("hf" + std::to_string(z.stage) + std::to_string(z.ws));
        ASSERT_EQ(ckpt_cmd("convert " + zckpt(z) + " " + hf + " --to hf --n-heads 4 --n-kv-heads 2", &out), 0) << out;
        EXPECT_NE(out.find("layout: deepspeed-zero -> "), std::string::npos) << out;
        ASSERT_EQ(ckpt_cmd("diff " + hf + "/model.safetensors " + zdir(z, "ws" + std::to_string(z.ws) + "_fp32.safetensors"),
                           &out), 0) << out;
    }
    // the q/k rows need the head counts: without them an error naming the tensor, nothing written
    std::string out;
    EXPECT_EQ(ckpt_cmd("convert " + zckpt(kZero[1]) + " " + (t / "nohead"), &out), 1) << out;
    EXPECT_NE(out.find("model.layers.0.self_attn.q_proj.weight needs the model's head counts"), std::string::npos) << out;
    EXPECT_FALSE(exists(t / "nohead"));
}

TEST(DeepSpeedCkpts, TheNextStepsAreDeepSpeedsOwnOnOneAndTwoRanks) {
    Dir t;
    for (const Zero &z : kZero) {
        const std::string dir = "deepspeed-0.19/zero" + std::to_string(z.stage);
        Sys s = {dir.c_str(), "", "", "", 3, ""}; // global_steps 3
        for (int np : {1, 2}) expect_next_steps(t.d, s, zckpt(z), np, "ws1");
    }
}

TEST(DeepSpeedCkpts, ThreeRanksLoadWhatOneRankLoadsAndTheStepAfterIsDeepSpeeds) {
    Dir t;
    for (const Zero &z : kZero) {
        if (z.ws != 2) continue;
        std::string one = t / ("one" + std::to_string(z.stage)), three = t / ("three" + std::to_string(z.stage));
        for (auto [np, out] : {std::pair<int, std::string>{1, one}, {3, three}}) {
            write_file(t / "r.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + zckpt(z) +
                                         ", load_optimizer: true}}\n  - {id: s, uses: save-dcp, with: {path: " + out + "}}\n");
            int rc;
            std::string log = run_np(np, t / "r.yaml", &rc);
            ASSERT_EQ(rc, 0) << log;
        }
        Ckpt a(one), b(three);
        expect_same_tensors(a.r, b.r);
        int64_t step = 0;
        ASSERT_EQ(ckpt_value_int(a.r, (size_t)ckpt_find(a.r, "train_state.step"), &step), 0);
        EXPECT_EQ(step, 3);
    }
    // one step from ZeRO-3 ws1, exported under HF names: DeepSpeed's weights after its first resumed step
    const Zero &z = kZero[2];
    std::string saved = t / "after", hf = t / "after_hf", out;
    write_file(t / "r.yaml", "model: {preset: tiny}\ndata: {kind: safetensors, path: " + zdir(z, "batch.safetensors") +
                                 ", batch_size: 4, seq_len: 32}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 zckpt(z) + "}}\n  - {id: t, uses: train-steps, with: {steps: 4, lr: 1e-3, decay: none, "
                                 "betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0}}\n"
                                 "  - {id: s, uses: save-dcp, with: {path: " + saved + "}}\n");
    int rc;
    std::string log = run_np(1, t / "r.yaml", &rc);
    ASSERT_EQ(rc, 0) << log;
    ASSERT_EQ(ckpt_cmd("convert " + saved + " " + hf + " --to hf --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    ASSERT_EQ(ckpt_cmd("diff " + hf + "/model.safetensors " + zdir(z, "ws1_after_resume_step.safetensors") + " --atol 5e-7",
                       &out), 0) << out;
}

// A DeepSpeed directory's files as one reader ("ms." the model states, "r<R>." rank R's optimizer state).
struct DsFiles {
    ckpt_reader *r = nullptr;
    explicit DsFiles(const std::string &dir) {
        int ranks;
        fsdp_err err;
        EXPECT_EQ(lay_ds_open_files(dir.c_str(), &r, &ranks, &err), 0) << err.msg;
    }
    ~DsFiles() {
        if (r) ckpt_close(r);
    }
};

// DeepSpeed's own ZeRO-2 and ZeRO-3 checkpoints, read into fsdp-run's layout and written back with --to
// deepspeed-zero2|3: in their own stage every tensor of every file DeepSpeed wrote, under its own key, bit for bit (the
// module weights or ZeRO-3's [0] placeholders, param_shapes, each rank's flat fp32 partition and AdamW moments), and
// the values its loader reads (partition_count, group_paddings, zero_stage, clip_grad, global_steps, dp_world_size,
// param_slice_mappings, the AdamW hyper-parameters); in the other stage, the same checkpoint when read again.
// ds_config is the job's dict, informational: not compared; nor global_samples, which fsdp-run leaves out so that
// DeepSpeed takes its own (global_steps x train_batch_size); nor ZeRO-3's ds_id attribute of its flat groups, which
// DeepSpeed's loader ignores. (tools/check_trainer_layouts.sh: DeepSpeed's load_checkpoint resumes what fsdp-run writes.)
TEST(DeepSpeedCkpts, WrittenBackAsDeepSpeedWritesItBitForBit) {
    Dir t;
    for (const Zero &z : kZero) {
        std::string ws = std::to_string(z.ws), canon = t / ("c" + std::to_string(z.stage) + ws), out;
        ASSERT_EQ(ckpt_cmd("convert " + zckpt(z) + " " + canon + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
        for (int stage : {2, 3}) {
            std::string back = canon + "_ds" + std::to_string(stage), again = back + "_canon";
            ASSERT_EQ(ckpt_cmd("convert " + canon + " " + back + " --to deepspeed-zero" + std::to_string(stage) +
                               " --world " + ws + " --n-heads 4 --n-kv-heads 2 --option gradient_clipping=1.0", &out), 0)
                << out;
            EXPECT_NE(out.find("(DeepSpeed ZeRO)"), std::string::npos) << out;
            EXPECT_TRUE(exists(back + "/latest") && exists(back + "/global_step3")) << back;
            ASSERT_EQ(ckpt_cmd("convert " + back + " " + again + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
            Ckpt x(canon), y(again);
            expect_same_tensors(y.r, x.r);
            expect_same_tensors(x.r, y.r);
            if (stage != z.stage) continue;
            DsFiles a(zckpt(z)), b(back);
            ASSERT_TRUE(a.r && b.r);
            expect_same_tensors(b.r, a.r);
            expect_same_tensors(a.r, b.r);
            size_t values = 0;
            for (size_t i = 0; i < ckpt_count(a.r); i++) {
                const ckpt_entry *e = ckpt_entry_at(a.r, i);
                if (e->is_tensor || strstr(e->name, "ds_config") || strstr(e->name, "global_samples")) continue;
                long j = ckpt_find(b.r, e->name);
                EXPECT_GE(j, 0) << e->name << " not written";
                if (j < 0) continue;
                const char *vx = ckpt_value_text(a.r, i), *vy = ckpt_value_text(b.r, (size_t)j);
                EXPECT_STREQ(vx ? vx : "?", vy ? vy : "-") << e->name;
                values++;
            }
            EXPECT_GT(values, stage == 2 ? 40u : 20u) << back;
        }
    }
}

// Every trainer's checkpoint through DeepSpeed ZeRO-2 and ZeRO-3 (2 ranks) and back into its own layout: bit for bit.
TEST(DeepSpeedCkpts, EveryLayoutRoundTripsThroughDeepSpeedBitForBit) {
    Dir t;
    for (const Sys &a : round_trip_systems()) {
        for (int stage : {2, 3}) {
            std::string src = ckpt_of(a, 2), mid = t / (std::string(a.dir) + "_z" + std::to_string(stage)),
                        back = mid + "_back", out;
            ASSERT_EQ(ckpt_cmd("convert " + src + " " + mid + " --from " + a.layout + " --to deepspeed-zero" +
                               std::to_string(stage) + " --world 2 --n-heads 4 --n-kv-heads 2 --option gradient_clipping=1.0",
                               &out), 0) << out;
            ASSERT_EQ(ckpt_cmd("convert " + mid + " " + back + " --to " + a.layout + " --n-heads 4 --n-kv-heads 2 --world 2" +
                               (a.parts[0] == 'm' ? " --option max_grad_norm=1.0" : ""), &out), 0) << out;
            expect_same_parts(a, src, back);
        }
    }
}

// A partition with DeepSpeed's padding: 3 ranks (the 131392 elements padded to a multiple of 2 x 3 = 131394, P =
// 43798, the last rank's fp32 partition 2 short, its moments whole with zeros): read back bit for bit; loaded on 1
// and 2 ranks the next steps are DeepSpeed's own, on 3 ranks the state loaded is 1 rank's.
TEST(DeepSpeedCkpts, ThreeRanksPartitionsArePaddedAsDeepSpeedPadsThem) {
    Dir t;
    std::string canon = t / "c", ds = t / "ds3", again = t / "again", out;
    ASSERT_EQ(ckpt_cmd("convert " + zckpt(kZero[1]) + " " + canon + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    ASSERT_EQ(ckpt_cmd("convert " + canon + " " + ds + " --to deepspeed-zero2 --world 3 --n-heads 4 --n-kv-heads 2 "
                       "--option gradient_clipping=1.0", &out), 0) << out;
    DsFiles f(ds);
    ASSERT_TRUE(f.r);
    const char *want[][2] = {
        {"r0.optimizer_state_dict.group_paddings", "[0]"},
        {"r2.optimizer_state_dict.group_paddings", "[2]"},
        {"r2.optimizer_state_dict.partition_count", "[3]"},
        {"ms.dp_world_size", "3"},
    };
    for (auto &w : want) {
        long i = ckpt_find(f.r, w[0]);
        ASSERT_GE(i, 0) << w[0];
        EXPECT_STREQ(ckpt_value_text(f.r, (size_t)i), w[1]) << w[0];
    }
    for (const char *k : {"r2.optimizer_state_dict.single_partition_of_fp32_groups.0",
                          "r2.optimizer_state_dict.base_optimizer_state.state.0.exp_avg"}) {
        long i = ckpt_find(f.r, k);
        ASSERT_GE(i, 0) << k;
        EXPECT_EQ(ckpt_entry_at(f.r, (size_t)i)->shape[0], strstr(k, "exp_avg") ? 43798 : 43796) << k;
    }
    ASSERT_EQ(ckpt_cmd("convert " + ds + " " + again + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    Ckpt x(canon), y(again);
    expect_same_tensors(y.r, x.r);
    Sys s = {"deepspeed-0.19/zero2", "", "", "", 3, ""};
    for (int np : {1, 2}) expect_next_steps(t.d, s, ds, np, "ws1");
    std::string one = t / "one", three = t / "three";
    for (auto [np, dst] : {std::pair<int, std::string>{1, one}, {3, three}}) {
        write_file(t / "r.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + ds +
                                     ", load_optimizer: true}}\n  - {id: s, uses: save-dcp, with: {path: " + dst + "}}\n");
        int rc;
        std::string log = run_np(np, t / "r.yaml", &rc);
        ASSERT_EQ(rc, 0) << log;
    }
    Ckpt a(one), b(three);
    expect_same_tensors(a.r, b.r);
    expect_same_tensors(b.r, x.r, "", "", "");
}

// What DeepSpeed's writer refuses, naming why, with nothing written: no gradient_clipping (its ZeRO-1/2 load takes
// clip_grad from the checkpoint), an unknown option, a frozen parameter (no moments), an existing tag without
// --overwrite; ZeRO-3's sub groups follow --option sub_group_size.
TEST(DeepSpeedCkpts, WritingRefusesWhatItCannotWriteAndLeavesNothing) {
    Dir t;
    std::string canon = t / "c", out, ds = t / "ds";
    ASSERT_EQ(ckpt_cmd("convert " + zckpt(kZero[0]) + " " + canon + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    const std::string base = "convert " + canon + " " + ds + " --n-heads 4 --n-kv-heads 2 ";
    EXPECT_EQ(ckpt_cmd(base + "--to deepspeed-zero2", &out), 2) << out;
    EXPECT_NE(out.find("pass --option gradient_clipping=VALUE"), std::string::npos) << out;
    EXPECT_EQ(ckpt_cmd(base + "--to deepspeed-zero2 --option max_grad_norm=1.0", &out), 2) << out;
    EXPECT_NE(out.find("keeps no such setting (gradient_clipping)"), std::string::npos) << out;
    EXPECT_FALSE(exists(ds));
    std::string frozen = t / "frozen";
    ASSERT_EQ(ckpt_cmd("convert " + canon + " " + frozen + " --exclude 'optimizer.state.norm.weight.**'", &out), 0) << out;
    EXPECT_EQ(ckpt_cmd("convert " + frozen + " " + ds + " --to deepspeed-zero2 --n-heads 4 --n-kv-heads 2 --option "
                       "gradient_clipping=1.0", &out), 2) << out;
    EXPECT_NE(out.find("model.norm.weight has no AdamW exp_avg"), std::string::npos) << out;
    EXPECT_FALSE(exists(ds + "/global_step3")) << "nothing left";
    EXPECT_FALSE(exists(ds + "/global_step3.partial"));
    ASSERT_EQ(ckpt_cmd(base + "--to deepspeed-zero1 --option gradient_clipping=0.5", &out), 0) << out;
    DsFiles f(ds);
    ASSERT_TRUE(f.r);
    long i = ckpt_find(f.r, "r0.optimizer_state_dict.clip_grad");
    ASSERT_GE(i, 0);
    EXPECT_STREQ(ckpt_value_text(f.r, (size_t)i), "0.5");
    EXPECT_EQ(ckpt_cmd(base + "--to deepspeed-zero2 --option gradient_clipping=1.0", &out), 2) << out;
    EXPECT_NE(out.find("exists (pass --overwrite"), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd(base + "--to deepspeed-zero2 --option gradient_clipping=1.0 --overwrite", &out), 0) << out;
    EXPECT_FALSE(exists(ds + "/global_step3.old"));
    // ZeRO-3 keeps no clip_grad (nothing required) but the sub_group_size its partitions are cut by
    std::string z3 = t / "z3";
    EXPECT_EQ(ckpt_cmd("convert " + canon + " " + z3 + " --n-heads 4 --n-kv-heads 2 --to deepspeed-zero3 --option "
                       "sub_group_size=0", &out), 2) << out;
    EXPECT_EQ(ckpt_cmd("convert " + canon + " " + ds + " --n-heads 4 --n-kv-heads 2 --to deepspeed-zero2 --option "
                       "sub_group_size=5 --option gradient_clipping=1.0", &out), 2) << out;
    EXPECT_FALSE(exists(z3));
    ASSERT_EQ(ckpt_cmd("convert " + canon + " " + z3 + " --n-heads 4 --n-kv-heads 2 --to deepspeed-zero3 --option "
                       "sub_group_size=20000", &out), 0) << out;
    DsFiles g(z3); // sub groups closed once they reach 20000 elements: the embedding alone, then whole layers' parts
    ASSERT_TRUE(g.r);
    EXPECT_GE(ckpt_find(g.r, "r0.optimizer_state_dict.fp32_flat_groups.1"), 0);
    EXPECT_GE(ckpt_find(g.r, "r0.optimizer_state_dict.optimizer_state_dict.state.1.exp_avg_sq"), 0);
    std::string again = t / "z3_canon";
    ASSERT_EQ(ckpt_cmd("convert " + z3 + " " + again + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    Ckpt x(canon), y(again);
    expect_same_tensors(y.r, x.r);
}

TEST(DeepSpeedCkpts, AMissingRankFileIsAnErrorNamingIt) {
    Dir t;
    for (int stage : {2, 3}) {
        std::string out, z = t / ("z" + std::to_string(stage)), o = z + "_out";
        ASSERT_EQ(run_cmd("cp -r " + zckpt(kZero[stage == 2 ? 1 : 3]) + " " + z + " && rm " + z +
                              "/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt", &out), 0) << out;
        EXPECT_EQ(ckpt_cmd("convert " + z + " " + o + " --n-heads 4 --n-kv-heads 2", &out), 1) << out;
        EXPECT_NE(out.find("its partitions are those of 2 ranks, and 1 rank's optimizer file is there"), std::string::npos)
            << out;
        EXPECT_FALSE(exists(o));
        write_file(t / "l.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + z + "}}\n");
        int rc;
        std::string log = run_np(1, t / "l.yaml", &rc);
        EXPECT_EQ(rc, 1) << log;
        EXPECT_NE(log.find("rank's optimizer file is there"), std::string::npos) << log;
    }
}

} // namespace

namespace {

// OLMo 0.6's unsharded step directory (model.pt, optim.pt of FullCheckpointer; 1 and 2 ranks, different inits):
// read in fsdp-run's layout (fused att_proj and ff_proj split, rotate-half rows), loaded with its moments on 1, 2
// and 3 ranks, the next two steps OLMo's own.
TEST(OlmoCkpts, TheNextStepsAreOlmosOwn) {
    Dir t;
    Sys s = kOlmo;
    for (int ws : {1, 2})
        for (int np : {1, 2}) expect_next_steps(t.d, s, ckpt_of(s, ws), np, ws == 1 ? "ws1" : "ws2");
    std::string one = t / "one", three = t / "three", out;
    for (auto [np, dst] : {std::pair<int, std::string>{1, one}, {3, three}}) {
        write_file(t / "r.yaml", recipe(s, ckpt_of(s, 2), 0, "", dst));
        int rc;
        std::string log = run_np(np, t / "r.yaml", &rc);
        ASSERT_EQ(rc, 0) << log;
    }
    Ckpt a(one), b(three);
    expect_same_tensors(a.r, b.r);
}

// OLMo's safetensors twins (model.safetensors, optim.safetensors: what OLMo's scripts/unshard.py --safe-tensors writes
// with olmo.safetensors_util, its loader preferring them to the .pt files; ws1_safetensors/ made by OLMo's own code from
// ws1): read as layout olmo-0.6-st, the checkpoint its .pt files hold bit for bit; written back, model.safetensors is
// OLMo's own file byte for byte and optim.safetensors holds its tensors under its names (its pickled param_groups
// are OLMo's values: param_names the plain names, pickled as protocol 2); loaded, the next steps are OLMo's own.
TEST(OlmoCkpts, SafetensorsTwinsAreReadAndWrittenAsOlmosOwn) {
    Dir t;
    std::string twin = data(kOlmo, "ws1_safetensors/step3-unsharded"), pt = ckpt_of(kOlmo, 1), out;
    ASSERT_EQ(ckpt_cmd("inspect " + twin, &out), 0) << out;
    EXPECT_NE(out.find("layout: olmo-0.6-st ("), std::string::npos) << out;
    std::string a = t / "from_twin", b = t / "from_pt", back = t / "back/step3-unsharded";
    ASSERT_EQ(ckpt_cmd("convert " + twin + " " + a + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_NE(out.find("layout: olmo-0.6-st -> torchtitan-0.2"), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("convert " + pt + " " + b + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    {
        Ckpt x(a), y(b);
        expect_same_tensors(x.r, y.r);
        expect_same_tensors(y.r, x.r);
        EXPECT_GT(expect_same_values(y.r, x.r, "twin"), 10u);
    }
    ASSERT_EQ(ckpt_cmd("convert " + b + " " + back + " --to olmo-0.6-st --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    for (const char *f : {"model.safetensors", "optim.safetensors", "train.pt"}) EXPECT_TRUE(exists(back + "/" + f)) << f;
    EXPECT_EQ(run_cmd("cmp " + back + "/model.safetensors " + twin + "/model.safetensors", &out), 0) << out;
    {
        Ckpt x(back + "/optim.safetensors"), y(twin + "/optim.safetensors"); // under the encoded names
        ASSERT_TRUE(x.r && y.r);
        EXPECT_EQ(ckpt_count(x.r), ckpt_count(y.r));
        size_t same = 0;
        for (size_t i = 0; i < ckpt_count(y.r); i++) {
            const ckpt_entry *e = ckpt_entry_at(y.r, i);
            long j = ckpt_find(x.r, e->name);
            ASSERT_GE(j, 0) << e->name;
            if (e->dtype == FSDP_DT_U8) continue; /* the pickled param_groups */
            EXPECT_TRUE(tensor_bytes(x.r, e->name) == tensor_bytes(y.r, e->name)) << e->name;
            same++;
        }
        EXPECT_EQ(same, 45u); // step, exp_avg, exp_avg_sq of 15 parameters
    }
    // and through the .pt files and back: the same twin
    std::string via = t / "via_pt/step3-unsharded", again = t / "again/step3-unsharded";
    ASSERT_EQ(ckpt_cmd("convert " + twin + " " + via + " --to olmo-0.6 --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    ASSERT_EQ(ckpt_cmd("convert " + via + " " + again + " --to olmo-0.6-st --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_EQ(run_cmd("cmp " + again + "/optim.safetensors " + back + "/optim.safetensors", &out), 0) << out;
    Sys s = kOlmo;
    std::vector<double> loss = expected(s, "ws1_safetensors", "resumed_losses");
    ASSERT_EQ(loss.size(), 2u);
    expect_next_steps(t.d, s, twin, 1, "ws1_safetensors");
}

// A value of a .pt file as text ("" when absent).
std::string pt_value(const std::string &file, const std::string &key) {
    Ckpt c(file);
    long i = c.r ? ckpt_find(c.r, key.c_str()) : -1;
    const char *v = i >= 0 ? ckpt_value_text(c.r, (size_t)i) : nullptr;
    return v ? v : "";
}

// fsdp-run's own checkpoint written as OLMo's step directory: model.pt / optim.pt as OLMo's torch.save nests them
// (a state dict; {state: {fqn: {step, exp_avg, exp_avg_sq}}, param_groups: [...]}), train.pt with the step and
// tokens OLMo's Trainer.load_trainer_state_dict reads. OLMo's clipping reads max_grad_norm from the loaded groups,
// which fsdp-run's checkpoint lacks: refused without --option (nothing written), set with it. Read back:
// every tensor fsdp-run wrote. (tools/check_trainer_layouts.sh: OLMo's own loader resumes it, its next steps equal
// fsdp-run's.)
TEST(OlmoCkpts, FsdpRunsCheckpointIsWrittenAsOlmosStepDirectory) {
    Dir t;
    std::string ours = t / "ours", dst = t / "run/step3-unsharded", back = t / "back", out;
    write_file(t / "r.yaml", recipe(kOlmo, ckpt_of(kOlmo, 1), 0, "", ours));
    int rc;
    std::string log = run_np(1, t / "r.yaml", &rc);
    ASSERT_EQ(rc, 0) << log;
    std::string plain = t / "plain"; // without any option OLMo's groups had (fsdp-run's own options only)
    ASSERT_EQ(ckpt_cmd("convert " + ours + " " + plain + " --exclude '**.max_grad_norm,**.max_grad_norm_ratio,**.sharded,"
                       "**.param_names'", &out), 0) << out;
    EXPECT_EQ(ckpt_cmd("convert " + plain + " " + dst + " --to olmo-0.6 --n-heads 4 --n-kv-heads 2", &out), 2) << out;
    EXPECT_NE(out.find("needs param-group option max_grad_norm"), std::string::npos) << out;
    EXPECT_NE(out.find("--option max_grad_norm=VALUE"), std::string::npos) << out;
    EXPECT_FALSE(exists(dst));
    EXPECT_FALSE(exists(dst + ".partial"));
    EXPECT_EQ(ckpt_cmd("convert " + plain + " " + dst + " --to olmo-0.6 --n-heads 4 --n-kv-heads 2 --option "
                       "max_grad_norm=one", &out), 2) << out;
    EXPECT_EQ(ckpt_cmd("convert " + plain + " " + dst + " --to olmo-core-3 --n-heads 4 --n-kv-heads 2 --option "
                       "max_grad_norm=1.0", &out), 2) << out; // a setting the layout does not keep
    EXPECT_NE(out.find("olmo-core-3 keeps no such setting"), std::string::npos) << out;
    EXPECT_FALSE(exists(dst));
    ASSERT_EQ(ckpt_cmd("convert " + plain + " " + dst + " --to olmo-0.6 --n-heads 4 --n-kv-heads 2 --option "
                       "max_grad_norm=0.5", &out), 0) << out;
    EXPECT_NE(out.find("(torch.save files)"), std::string::npos) << out;
    for (const char *f : {"model.pt", "optim.pt", "train.pt"}) EXPECT_TRUE(exists(dst + "/" + f)) << f;
    EXPECT_EQ(pt_value(dst + "/optim.pt", "param_groups.0.max_grad_norm"), "0.5");
    EXPECT_EQ(pt_value(dst + "/optim.pt", "param_groups.0.sharded"), "True");
    EXPECT_EQ(pt_value(dst + "/optim.pt", "param_groups.0.max_grad_norm_ratio"), "None");
    EXPECT_EQ(pt_value(dst + "/optim.pt", "param_groups.0.param_names"), pt_value(dst + "/optim.pt", "param_groups.0.params"));
    EXPECT_NE(pt_value(dst + "/optim.pt", "param_groups.0.params").find("'transformer.blocks.1.att_proj.weight'"),
              std::string::npos);
    EXPECT_EQ(pt_value(dst + "/train.pt", "global_step"), "0"); // loaded at step 0 (OLMo's train.pt is not read)
    EXPECT_EQ(pt_value(dst + "/train.pt", "unsharded_checkpoints"), "[]");
    Ckpt m(dst + "/model.pt"), o(dst + "/optim.pt");
    ASSERT_TRUE(m.r && o.r);
    EXPECT_GE(ckpt_find(m.r, "transformer.blocks.0.att_proj.weight"), 0);
    EXPECT_GE(ckpt_find(o.r, "state.transformer.blocks.0.att_proj.weight.exp_avg_sq"), 0);
    // read back in fsdp-run's layout: every tensor of fsdp-run's checkpoint, bit for bit
    ASSERT_EQ(ckpt_cmd("convert " + dst + " " + back + " --from auto --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    Ckpt a(plain), b(back);
    expect_same_tensors(b.r, a.r);
    // an existing step directory is kept unless --overwrite, which replaces each file
    EXPECT_EQ(ckpt_cmd("convert " + plain + " " + dst + " --to olmo-0.6 --n-heads 4 --n-kv-heads 2 --option "
                       "max_grad_norm=0.5", &out), 2) << out;
    ASSERT_EQ(ckpt_cmd("convert " + plain + " " + dst + " --to olmo-0.6 --n-heads 4 --n-kv-heads 2 --option "
                       "max_grad_norm=None --overwrite", &out), 0) << out;
    EXPECT_EQ(pt_value(dst + "/optim.pt", "param_groups.0.max_grad_norm"), "None");
}

} // namespace

namespace {

// accelerate's scheduler.bin (torch's LambdaLR state_dict of its scheduler) is fsdp-run's lr_scheduler.*: read with the
// checkpoint, written beside it, value for value (the file accelerate's load_state gives its scheduler).
TEST(TrainerCkpts, AcceleratesSchedulerFileIsReadAndWritten) {
    Dir t;
    const Sys &acc = kSystems[5];
    std::string canon = t / "c", back = t / "back", out;
    ASSERT_EQ(ckpt_cmd("convert " + ckpt_of(acc, 2) + " " + canon + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    Ckpt c(canon), f(ckpt_of(acc, 2) + "/scheduler.bin");
    ASSERT_TRUE(c.r && f.r);
    size_t n = 0;
    for (size_t i = 0; i < ckpt_count(f.r); i++, n++) {
        std::string key = std::string("lr_scheduler.") + ckpt_entry_at(f.r, i)->name;
        long j = ckpt_find(c.r, key.c_str());
        ASSERT_GE(j, 0) << key;
        EXPECT_STREQ(ckpt_value_text(c.r, (size_t)j), ckpt_value_text(f.r, i)) << key;
    }
    EXPECT_EQ(n, 7u);
    ASSERT_EQ(ckpt_cmd("convert " + canon + " " + back + " --to accelerate-1.15 --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_NE(out.find("lr_scheduler.* in its scheduler.bin"), std::string::npos) << out;
    Ckpt b(back + "/scheduler.bin");
    ASSERT_TRUE(b.r);
    EXPECT_EQ(expect_same_values(f.r, b.r, "scheduler.bin"), 7u);
    // a checkpoint without a scheduler writes none
    std::string plain = t / "plain", none = t / "none";
    ASSERT_EQ(ckpt_cmd("convert " + canon + " " + plain + " --exclude 'lr_scheduler.**'", &out), 0) << out;
    ASSERT_EQ(ckpt_cmd("convert " + plain + " " + none + " --to accelerate-1.15 --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_FALSE(exists(none + "/scheduler.bin"));
}

// inspect and diff take a checkpoint of several files as its trainer saves it: accelerate's directory of two DCPs,
// OLMo's step directory, a DeepSpeed ZeRO directory (its files as they are; with diff --layout in fsdp-run's).
TEST(TrainerCkpts, InspectAndDiffTakeCheckpointsOfSeveralFiles) {
    Dir t;
    std::string out;
    ASSERT_EQ(ckpt_cmd("inspect tests/data/trainers/accelerate-1.15/ws2", &out), 0) << out;
    EXPECT_NE(out.find("layout: accelerate-1.15 ("), std::string::npos) << out;
    EXPECT_NE(out.find("optimizer.state.model.layers.1.self_attn.k_proj.weight.exp_avg_sq"), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("inspect tests/data/trainers/olmo-0.6/ws2/step3-unsharded", &out), 0) << out;
    EXPECT_NE(out.find("layout: olmo-0.6 ("), std::string::npos) << out;
    ASSERT_EQ(ckpt_cmd("inspect tests/data/trainers/deepspeed-0.19/zero3/ws2", &out), 0) << out;
    EXPECT_NE(out.find("layout: a DeepSpeed ZeRO checkpoint of 2 ranks"), std::string::npos) << out;
    EXPECT_NE(out.find("r1.optimizer_state_dict.fp32_flat_groups.0"), std::string::npos) << out;
    std::string z = "tests/data/trainers/deepspeed-0.19/zero3/ws2", c = t / "z";
    ASSERT_EQ(ckpt_cmd("convert " + z + " " + c + " --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_EQ(ckpt_cmd("diff " + z + " " + c + " --layout auto --n-heads 4 --n-kv-heads 2", &out), 0) << out;
    EXPECT_NE(out.find("equal: "), std::string::npos) << out;
}

} // namespace
