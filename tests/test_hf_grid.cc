// Training numerics over a grid of configs, not a point: every config of tests/data/hf-grid-5.24 (72
// small Llama, Qwen2, Qwen3, Qwen3-MoE, OLMoE and Mixtral models drawn by tools/gen/gen_hf_grid.py:
// MHA and GQA, head_dim apart from hidden / heads, odd sizes, 1-3 layers, pad_token_id unset / in the
// batch / not in it, ignored labels, tied and untied, RoPE variants, 2-8 experts with top-k 1..E,
// experts without tokens, norm_topk_prob both ways, dense layers among the MoE ones, the aux loss in the
// objective or not) against transformers' float64 run, at PyTorch's own float32 error for that config
// (hf_grid_util.h has the rules). Each test reports every config that failed and what.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "hf_grid_util.h"
#include "train_run_util.h"

extern "C" {
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_params.h"
#include "decoder/hf_config.h"
#include "runtime/comm.h"
#include "train/train_fsdp.h"
}

using namespace fsdp_test;

namespace {

double max_abs(const std::vector<float> &a) {
    double m = 0;
    for (float x : a) m = std::max(m, (double)std::fabs(x));
    return m;
}

double max_diff(const float *a, const std::vector<float> &b) {
    double m = 0;
    for (size_t i = 0; i < b.size(); i++) m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace

// The weights' tolerance factor is no wider than PyTorch's own float32 error: some float32 run of
// PyTorch is at least kWeightFactor times as far from the float64 weights as the farthest of the other
// runs of its config (the whole batch's runs, or a MoE's 2 micro-batches'), so PyTorch itself would not
// pass a smaller factor; and each envelope the tests use is the farthest of its runs. (Data, not code:
// where a grid regenerated on another CPU shows a smaller spread, the factor is to come down to it.)
TEST(HfGrid, WeightFactorIsNoWiderThanPyTorchsOwnSpread) {
    hf_grid::Report rep("HfGrid.WeightFactor");
    double worst[2] = {0, 0};
    for (const std::string &n : hf_grid::names()) {
        for (int accum = 0; accum < 2; accum++) {
            hf_grid::Ref whole(n);
            if (accum && !whole.moe) continue;
            hf_grid::Ref ref(n, accum ? "_accum" : "");
            rep.checked++;
            const std::vector<double> &w = ref.f32_weight_runs;
            if (w.size() < 2) {
                rep.fail(n, "reference.json has no max_abs_weight_diff_per_run of several float32 runs");
                continue;
            }
            rep.check(ref, std::string(accum ? "2 micro-batches: " : "") + "the envelope (the farthest run)",
                      ref.f32_weight_diff, *std::max_element(w.begin(), w.end()), 0.0);
            for (size_t k = 0; k < w.size(); k++) {
                double others = 0;
                for (size_t j = 0; j < w.size(); j++)
                    if (j != k) others = std::max(others, w[j]);
                worst[accum] = std::max(worst[accum], w[k] / others);
            }
        }
    }
    printf("[ HfGrid.WeightFactor ] the largest ratio of one PyTorch float32 run to the farthest other: %.3f (whole "
           "batch), %.3f (2 micro-batches); the tolerance factor %.3g\n", worst[0], worst[1], hf_grid::kWeightFactor);
    EXPECT_LE(hf_grid::kWeightFactor, std::max(worst[0], worst[1]))
        << "the final weights' tolerance factor is wider than PyTorch's own float32 spread on this grid";
    rep.finish();
}

// One rank on the CPU, in process: every parameter's step-0 gradient, the loss (and its cross-entropy
// and aux terms) and gradient norm of each of the 3 AdamW steps, and the weights after them.
TEST(HfGrid, CpuOneRankMatchesTransformers) {
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    std::vector<std::string> all = hf_grid::names();
    ASSERT_GE(all.size(), 60u) << "the grid has at least 60 configs";
    hf_grid::Report rep("HfGrid.CpuOneRank");
    for (const std::string &n : all) {
        hf_grid::Ref ref(n);
        decoder_config cfg;
        if (hf_config_read(hf_grid::dir(n).c_str(), &cfg, &err)) {
            rep.fail(n, std::string("config.json: ") + err.msg);
            continue;
        }
        rep.checked++;
        MoeTensors batch = moe_load_st(hf_grid::dir(n, "batch.safetensors")),
                   want = moe_load_st(hf_grid::dir(n, "grads_step0.safetensors")),
                   fin = moe_load_st(hf_grid::dir(n, "model_step3.safetensors"));
        hf_grid::set_rel_median(ref, want);
        fsdp_state *s = moe_state_dir(hf_grid::dir(n), cfg, "model.safetensors");
        train_fsdp *f;
        if (train_fsdp_create(s, decoder_blocks_cpu(&cfg), c, ref.rows, ref.seq, &f, &err)) {
            rep.fail(n, std::string("train_fsdp_create: ") + err.msg);
            state_free(s);
            continue;
        }
        const int32_t *in = batch.at("input_ids").i32.data(), *lab = batch.at("labels").i32.data();
        train_fsdp_result r;
        if (train_fsdp_grads(f, in, lab, &r, &err)) {
            rep.fail(n, std::string("step 0 gradients: ") + err.msg);
        } else {
            decoder_params t;
            EXPECT_EQ(decoder_params_build(&cfg, &t, &err), 0) << err.msg;
            for (int i = 0; i < t.n; i++) {
                std::vector<float> w = moe_tt_tensor(cfg, t.p[i], want);
                const state_param *p = state_find(s, t.p[i].name);
                if (!p || (int64_t)w.size() != t.p[i].numel) continue;
                rep.check_grad(ref, t.p[i].name, hf_grid::hf_parts(cfg, t.p[i]), max_diff(p->grad, w), max_abs(w), "");
            }
            decoder_params_free(&t);
        }
        std::vector<hf_grid::Step> got;
        for (size_t k = 0; k < ref.steps.size(); k++) {
            train_fsdp_hparams hp = {ref.steps[k].lr, 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
            if (train_fsdp_step(f, in, lab, &hp, &r, &err)) {
                rep.fail(n, "step " + std::to_string(k + 1) + ": " + err.msg);
                break;
            }
            got.push_back({hp.lr, r.loss, r.ce_loss, r.aux_loss, r.grad_norm});
        }
        rep.check_steps(ref, got, "");
        decoder_params t;
        EXPECT_EQ(decoder_params_build(&cfg, &t, &err), 0) << err.msg;
        double wd = 0;
        for (int i = 0; i < t.n; i++) {
            std::vector<float> w = moe_tt_tensor(cfg, t.p[i], fin);
            const state_param *p = state_find(s, t.p[i].name);
            if (p && (int64_t)w.size() == t.p[i].numel) wd = std::max(wd, max_diff(p->data, w));
        }
        decoder_params_free(&t);
        rep.check_weights(ref, wd, "");
        train_fsdp_free(f);
        state_free(s);
    }
    rep.finish();
    comm_destroy(c);
}

namespace {

// tests/mpi/hf_grid_run on np ranks with `args` (its selection of the grid); the measurements per config.
std::map<std::string, hf_grid::Measured> run_harness(int np, const std::string &args, std::string *log,
                                                     const std::string &env = "") {
    std::string dir = make_tmpdir("fsdp-grid");
    std::string out = dir + "/m.jsonl";
    std::string cmd = "timeout -k 10 900 " + env + (env.empty() ? "" : " ") + mpirun_prefix(np) + " -x OMP_NUM_THREADS=1 " +
                      std::string(FSDP_BUILD_DIR) +
                      "/tests/mpi/hf_grid_run --data " + hf_grid::dir() + " --out " + out + " " + args;
    int rc = run_cmd(cmd, log);
    EXPECT_EQ(rc, 0) << cmd << "\n" << *log;
    std::map<std::string, hf_grid::Measured> m = hf_grid::read_measured(out);
    rm_rf(dir);
    return m;
}

// Every config the harness ran, judged; returns their names.
std::vector<std::string> judge_all(hf_grid::Report &rep, const std::map<std::string, hf_grid::Measured> &m,
                                   const std::string &tag) {
    std::vector<std::string> ran;
    for (const auto &kv : m) {
        hf_grid::judge(rep, kv.first, kv.second, tag);
        ran.push_back(kv.first);
    }
    return ran;
}

}  // namespace

namespace {

// The configs whose batch holds their pad token (those whose padding row took a gradient before), as an
// --only list.
std::string pad_configs() {
    std::string only;
    for (const std::string &n : hf_grid::names())
        if (hf_grid::Ref(n).pad_in_batch) only += (only.empty() ? "" : ",") + n;
    return only;
}

// One harness run judged as test `what`: `want` configs ran (0: at least one), each against the float32
// rules (bf16: the bf16 rules).
void grid_variant(const std::string &what, int np, const std::string &args, const std::string &tag, size_t want,
                  const std::string &env = "", bool bf16 = false) {
    std::string log;
    auto m = run_harness(np, args, &log, env);
    if (want) {
        EXPECT_EQ(m.size(), want) << log;
    } else {
        EXPECT_FALSE(m.empty()) << log;
    }
    hf_grid::Report rep(what);
    for (const auto &kv : m) {
        if (bf16)
            hf_grid::judge_bf16(rep, kv.first, kv.second, tag);
        else
            hf_grid::judge(rep, kv.first, kv.second, tag);
    }
    rep.finish();
}

}  // namespace

#define SKIP_WITHOUT_GPU()                              \
    do {                                                \
        std::string why_;                               \
        if (!gpu_present(&why_)) GTEST_SKIP() << why_;  \
    } while (0)

// Three ranks (2 rows each), every config, through the loader (load-ckpt names: hf's sio_load) with the
// training paths varied by config: activation checkpointing none / full / selective (config i % 3) and
// one or two accumulated micro-batches (i % 2).
TEST(HfGrid, ThreeRanksWithCheckpointingAndAccumulation) {
    grid_variant("HfGrid.ThreeRanks", 3, "--ac cycle --accum cycle", "3 ranks: ", hf_grid::names().size());
}

// Expert parallelism on every expert count of the grid: the whole shard group as the EP degree on 2
// ranks (2, 4, 6, 8 experts), 3 (3, 6), 5 (5) and 7 (7) ranks (the batch tiled so that it splits), and
// EP 2 inside a shard group of 4 (4, 8 experts); every MoE config runs with experts on several ranks.
TEST(HfGrid, ExpertParallelOnEveryExpertCount) {
    hf_grid::Report rep("HfGrid.ExpertParallel");
    std::set<std::string> covered;
    const struct {
        int np;
        const char *args;
    } runs[] = {{2, "--ep world --select ep"},
                {3, "--ep world --select ep"},
                {5, "--ep world --select ep --tile 5"},
                {7, "--ep world --select ep --tile 7"},
                {4, "--ep 2 --select ep --tile 2"}};
    for (const auto &r : runs) {
        std::string log;
        auto m = run_harness(r.np, r.args, &log);
        EXPECT_FALSE(m.empty()) << r.np << " ranks: " << log;
        for (const std::string &n : judge_all(rep, m, std::to_string(r.np) + " ranks, " + r.args + ": "))
            covered.insert(n);
    }
    for (const std::string &n : hf_grid::names()) {
        hf_grid::Ref ref(n);
        if (ref.moe) {
            EXPECT_TRUE(covered.count(n)) << n << " ran with no expert parallelism";
        }
    }
    rep.finish();
}

// HSDP: 2 replicas of 2 shards (runtime.mesh), every config, the batch tiled to 3 rows per rank; the MoE
// configs with an even expert count with expert parallelism 2 inside each replica.
TEST(HfGrid, HsdpTwoReplicasOfTwoShards) {
    grid_variant("HfGrid.Hsdp", 4, "--replicas 2 --tile 2 --ep world", "HSDP 2 x 2: ", hf_grid::names().size());
}

namespace {

// The eval stage (load-ckpt names: hf, then eval over the config's one batch) on np ranks: its
// eval_loss from the report, NAN when the run failed (*log says why).
double eval_stage_loss(const std::string &name, int np, std::string *log, const std::string &device = "cpu") {
    hf_grid::Ref ref(name);
    std::string dir = make_tmpdir("fsdp-grid-eval");
    std::string recipe = dir + "/r.yaml", report = dir + "/report.json";
    write_file(recipe, "model: {from_hf: " + hf_grid::dir(name) + "}\n"
                       "data: {kind: safetensors, path: " + hf_grid::dir(name, "batch.safetensors") +
                       ", batch_size: " + std::to_string(ref.rows) + ", seq_len: " + std::to_string(ref.seq) + "}\n"
                       "stages:\n"
                       "  - {id: l, uses: load-ckpt, with: {path: " + hf_grid::dir(name) + ", names: hf}}\n"
                       "  - {id: e, uses: eval, with: {eval_batches: 1}}\n");
    int rc;
    *log = run_np(np, recipe + " --report " + report + " --set runtime.device=" + device, &rc);
    double v = rc ? NAN : train_test::report_metric(report, "eval", "eval_loss");
    rm_rf(dir);
    return v;
}

}  // namespace

// The forward-only evaluation people run (the `eval` stage's loss) on every config: transformers' mean
// cross-entropy of the batch (step 1's ce_loss) on one rank, and on three ranks for a config of each
// model type whose batch holds its pad token.
TEST(HfGrid, EvalStageLossOnEveryConfig) {
    hf_grid::Report rep("HfGrid.Eval");
    for (const std::string &n : hf_grid::names()) {
        hf_grid::Ref ref(n);
        std::string log;
        std::vector<int> worlds = {1};
        if (ref.pad_in_batch && (n.size() > 3 && n.compare(n.size() - 3, 3, "_04") == 0)) worlds.push_back(3);
        for (int np : worlds) {
            rep.checked++;
            double got = eval_stage_loss(n, np, &log);
            if (std::isnan(got)) {
                rep.fail(n, std::to_string(np) + " ranks: the eval run failed: " + log);
                continue;
            }
            rep.check(ref, std::to_string(np) + " ranks: eval_loss", got, ref.steps[0].ce, hf_grid::loss_tol(ref.steps[0].ce));
        }
    }
    rep.finish();
}

// ---- the GPU path (the emulated device in build-emu; skipped without a GPU) ----------------------------

// Every config in float32 on one GPU: the same checks and tolerances as the CPU path.
TEST(HfGridGpu, F32OneRankEveryConfig) {
    SKIP_WITHOUT_GPU();
    grid_variant("HfGridGpu.F32", 1, "--device cuda", "GPU f32: ", hf_grid::names().size());
}

// Every config in bf16 mixed precision on one GPU (FSDP2's param_dtype=bf16, reduce_dtype=float32): each
// step's loss and grad norm within twice PyTorch's own bf16 error for that config.
TEST(HfGridGpu, Bf16OneRankEveryConfig) {
    SKIP_WITHOUT_GPU();
    grid_variant("HfGridGpu.Bf16", 1, "--device cuda --mixed bf16", "GPU bf16: ", hf_grid::names().size(), "", true);
}

// The configs whose batch holds their pad token in float32 on one GPU, and the eval stage's loss on the
// GPU for one of each model type: the quick part of the GPU grid that `make test` runs.
TEST(HfGridGpu, PadConfigsAndEvalOnOneGpu) {
    SKIP_WITHOUT_GPU();
    grid_variant("HfGridGpu.PadConfigs", 1, "--device cuda --only " + pad_configs(), "GPU f32: ", 0);
    hf_grid::Report rep("HfGridGpu.Eval");
    for (const char *n : {"llama_04", "qwen2_04", "qwen3_04", "qwen3_moe_04", "olmoe_04", "mixtral_04"}) {
        hf_grid::Ref ref(n);
        std::string log;
        rep.checked++;
        double got = eval_stage_loss(n, 1, &log, "cuda");
        if (std::isnan(got))
            rep.fail(n, "GPU: the eval run failed: " + log);
        else
            rep.check(ref, "GPU: eval_loss", got, ref.steps[0].ce, hf_grid::loss_tol(ref.steps[0].ce));
    }
    rep.finish();
}

// Three GPUs with activation checkpointing and two accumulated micro-batches varied by config (as the
// CPU's ThreeRanks test), every config.
TEST(HfGridGpu, ThreeGpusWithCheckpointingAndAccumulation) {
    SKIP_WITHOUT_GPU();
    grid_variant("HfGridGpu.ThreeGpus", 3, "--device cuda --ac cycle --accum cycle", "3 GPUs: ", hf_grid::names().size(),
                 "env FSDP_EMU_DEVICES=3");
}

// HSDP on four GPUs (2 replicas of 2 shards) for the configs whose batch holds their pad token, the MoE
// ones of an even expert count with expert parallelism 2 inside each replica.
TEST(HfGridGpu, HsdpOnFourGpusPadConfigs) {
    SKIP_WITHOUT_GPU();
    grid_variant("HfGridGpu.Hsdp", 4, "--device cuda --replicas 2 --tile 2 --ep world --only " + pad_configs(),
                 "HSDP 2 x 2 GPUs: ", 0, "env FSDP_EMU_DEVICES=4");
}

// Two GPUs with expert parallelism 2 on the MoE configs of an even expert count, activation checkpointing
// varied by config.
TEST(HfGridGpu, TwoRanksWithExpertParallel) {
    SKIP_WITHOUT_GPU();
    grid_variant("HfGridGpu.ExpertParallel", 2, "--device cuda --ep world --select ep --ac cycle", "2 GPUs, EP 2: ", 0);
}

// The user's recipe, through fsdp-run itself on 3 ranks (model: {from_hf}, load-ckpt names: hf,
// train-steps with the reference's optimizer and schedule): a config of each model type whose batch holds
// its pad token trains as transformers does, step by step.
TEST(HfGrid, RecipeOnThreeRanksForEachModelType) {
    hf_grid::Report rep("HfGrid.Recipe");
    for (const char *n : {"llama_04", "qwen2_00", "qwen3_10", "qwen3_moe_00", "olmoe_04", "mixtral_06"}) {
        hf_grid::Ref ref(n);
        EXPECT_TRUE(ref.pad_in_batch) << n;
        std::string dir = make_tmpdir("fsdp-grid-recipe"), met = dir + "/m.jsonl";
        write_file(dir + "/r.yaml",
                   "model: {from_hf: " + hf_grid::dir(n) + "}\n"
                   "data: {kind: safetensors, path: " + hf_grid::dir(n, "batch.safetensors") +
                   ", batch_size: " + std::to_string(ref.rows) + ", seq_len: " + std::to_string(ref.seq) + "}\n"
                   "stages:\n"
                   "  - {id: l, uses: load-ckpt, with: {path: " + hf_grid::dir(n) + ", names: hf}}\n"
                   "  - {id: t, uses: train-steps, with: {steps: 3, lr: 1e-3, warmup_steps: 2, decay: linear,"
                   " min_lr_ratio: 0.1, betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0,"
                   " metrics: " + met + "}}\n");
        int rc;
        std::string o = run_np(3, dir + "/r.yaml", &rc);
        rep.checked++;
        if (rc) {
            rep.fail(n, "the run failed: " + o);
        } else {
            std::vector<hf_grid::Step> got;
            for (json_t *j : jsonl_objects(met)) {
                if (json_object_get(j, "loss"))
                    got.push_back({json_number_value(json_object_get(j, "lr")),
                                   json_number_value(json_object_get(j, "loss")),
                                   json_number_value(json_object_get(j, json_object_get(j, "ce_loss") ? "ce_loss" : "loss")),
                                   json_number_value(json_object_get(j, "aux_loss")),
                                   json_number_value(json_object_get(j, "grad_norm"))});
                json_decref(j);
            }
            rep.check_steps(ref, got, "fsdp-run on 3 ranks: ");
        }
        rm_rf(dir);
    }
    rep.finish();
}
