// Training the mixture-of-experts fixtures (tests/data/moe-5.24) on the GPU path: 4 AdamW steps of
// Qwen3-MoE (a dense layer beside a MoE one), OLMoE (q/k norms over the whole projection) and Mixtral
// in float32 against transformers' float64 run (loss, its two terms, gradient norm, weights), the same
// steps as the CPU path, activation checkpointing, bf16 mixed precision within its rounding, and the
// expert load. Skips without a GPU; `make test` runs it on the emulated device (EMU_QUICK).
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "decoder/decoder_blocks.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "train/train_fsdp.h"
#include "train/train_fsdp_cuda.h"
}
#include "gpu_util.h"
#include "hf_batch_util.h"
#include "jsonl_util.h"
#include "moe_state_util.h"

using namespace fsdp_test;

namespace {

const char *const MODELS[] = {"qwen3_moe_tiny", "olmoe_tiny", "mixtral_tiny"};

class MoeCuda : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        ASSERT_EQ(comm_create_single(&c_, &err_), 0) << err_.msg;
        d_ = dev_ctx_create(nullptr, &err_);
        ASSERT_NE(d_, nullptr) << err_.msg;
    }
    void TearDown() override {
        for (fsdp_state *s : states_) state_free(s);
        if (c_) comm_destroy(c_);
        if (d_) dev_ctx_free(d_);
    }
    fsdp_state *state(const std::string &m, bool device) {
        decoder_config cfg = moe_cfg(m);
        fsdp_state *s = moe_state(m, cfg);
        states_.push_back(s);
        if (device) {
            EXPECT_EQ(state_to_device(s, d_, &err_), 0) << err_.msg;
        }
        return s;
    }
    std::vector<train_fsdp_result> run(fsdp_state *s, bool gpu, const train_fsdp_cuda_options &o,
                                       const std::vector<double> &lr, const MoeTensors &batch) {
        std::vector<train_fsdp_result> out;
        train_fsdp_cuda *g = nullptr;
        train_fsdp *f = nullptr;
        if (gpu) {
            EXPECT_EQ(train_fsdp_cuda_create(s, decoder_blocks_cuda(decoder_state_config(s)), c_, d_, 2, 32, &o, &g, &err_), 0)
                << err_.msg;
        } else {
            EXPECT_EQ(train_fsdp_create(s, decoder_blocks_cpu(decoder_state_config(s)), c_, 2, 32, &f, &err_), 0) << err_.msg;
        }
        if (!g && !f) return out;
        for (size_t k = 0; k < lr.size(); k++) {
            train_fsdp_hparams hp = {lr[k], 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
            train_fsdp_result r;
            int rc = gpu ? train_fsdp_cuda_step(g, batch.at("input_ids").i32.data(), batch.at("labels").i32.data(), &hp,
                                                &r, &err_)
                         : train_fsdp_step(f, batch.at("input_ids").i32.data(), batch.at("labels").i32.data(), &hp, &r,
                                           &err_);
            EXPECT_EQ(rc, 0) << err_.msg;
            std::vector<int64_t> load;
            if (r.expert_load) load.assign(r.expert_load, r.expert_load + (size_t)r.load_blocks * r.load_experts);
            loads_.push_back(load);
            out.push_back(r);
        }
        if (g) train_fsdp_cuda_free(g);
        if (f) train_fsdp_free(f);
        return out;
    }
    std::vector<float> pull(fsdp_state *s) {
        std::vector<float> out;
        for (size_t k = 0; k < s->n; k++) {
            std::vector<float> v(state_param_local_numel(&s->p[k]));
            EXPECT_EQ(state_param_get(s, &s->p[k], STATE_DATA, v.data(), &err_), 0) << err_.msg;
            out.insert(out.end(), v.begin(), v.end());
        }
        return out;
    }
    comm *c_ = nullptr;
    dev_ctx *d_ = nullptr;
    fsdp_err err_;
    std::vector<fsdp_state *> states_;
    std::vector<std::vector<int64_t>> loads_;
};

std::vector<double> ref_steps(const std::string &m, const char *key) {
    json_error_t je;
    json_t *r = json_load_file(moe_fixture(m, "reference.json").c_str(), 0, &je);
    std::vector<double> v;
    json_t *steps = json_object_get(r, "steps");
    for (size_t i = 0; i < json_array_size(steps); i++)
        v.push_back(json_number_value(json_object_get(json_array_get(steps, i), key)));
    json_decref(r);
    return v;
}

}  // namespace

// float32 on the GPU: the float64 run's objective and terms per step, the CPU path's weights, and the
// same expert load as the CPU (the routing is the same).
TEST_F(MoeCuda, FourStepsMatchTransformersAndTheCpu) {
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        MoeTensors batch = moe_load_st(moe_fixture(m, "batch.safetensors"));
        std::vector<double> lr = ref_steps(m, "lr"), loss = ref_steps(m, "loss"), ce = ref_steps(m, "ce_loss"),
                            aux = ref_steps(m, "aux_loss"), gn = ref_steps(m, "grad_norm");
        ASSERT_EQ(lr.size(), 4u);
        const train_fsdp_cuda_options f32 = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};
        loads_.clear();
        fsdp_state *sg = state(m, true), *sc = state(m, false);
        std::vector<train_fsdp_result> g = run(sg, true, f32, lr, batch);
        std::vector<train_fsdp_result> c = run(sc, false, f32, lr, batch);
        ASSERT_EQ(g.size(), 4u);
        ASSERT_EQ(c.size(), 4u);
        for (int k = 0; k < 4; k++) {
            EXPECT_TRUE(g[k].has_aux);
            EXPECT_NEAR(g[k].loss, loss[k], 1e-6 * loss[k]) << "step " << k + 1;
            EXPECT_NEAR(g[k].ce_loss, ce[k], 1e-6 * ce[k]) << "step " << k + 1;
            EXPECT_NEAR(g[k].aux_loss, aux[k], 1e-6 * aux[k]) << "step " << k + 1;
            EXPECT_NEAR(g[k].grad_norm, gn[k], 1e-5 * gn[k]) << "step " << k + 1;
            EXPECT_EQ(loads_[k], loads_[4 + k]) << "step " << k + 1 << ": the GPU routes as the CPU";
        }
        std::vector<float> wg = pull(sg), wc = pull(sc);
        ASSERT_EQ(wg.size(), wc.size());
        double wd = 0;
        for (size_t i = 0; i < wg.size(); i++) wd = std::max(wd, (double)std::fabs(wg[i] - wc[i]));
        EXPECT_LE(wd, 1e-5) << "weights after 4 steps, GPU vs CPU";
    }
}

// Full and selective activation checkpointing give the same steps (the recomputed forward routes the
// same tokens and counts no statistics twice); bf16 mixed precision stays within its rounding of the
// float32 losses. Qwen3-MoE: a dense layer beside a MoE one.
TEST_F(MoeCuda, CheckpointingAndBf16) {
    const std::string m = "qwen3_moe_tiny";
    MoeTensors batch = moe_load_st(moe_fixture(m, "batch.safetensors"));
    std::vector<double> lr = ref_steps(m, "lr");
    const train_fsdp_cuda_options f32 = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};
    std::vector<train_fsdp_result> g = run(state(m, true), true, f32, lr, batch);
    ASSERT_EQ(g.size(), 4u);
    for (train_fsdp_ac ac : {TRAIN_FSDP_AC_FULL, TRAIN_FSDP_AC_SELECTIVE}) {
        const train_fsdp_cuda_options o = {TRAIN_FSDP_MIXED_NONE, ac, 0, 0, 0, 0};
        std::vector<train_fsdp_result> a = run(state(m, true), true, o, lr, batch);
        ASSERT_EQ(a.size(), 4u);
        for (int k = 0; k < 4; k++) EXPECT_NEAR(a[k].loss, g[k].loss, 1e-9 * g[k].loss) << "ac " << ac;
    }
    const train_fsdp_cuda_options bf16 = {TRAIN_FSDP_MIXED_BF16, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};
    std::vector<train_fsdp_result> b = run(state(m, true), true, bf16, lr, batch);
    ASSERT_EQ(b.size(), 4u);
    for (int k = 0; k < 4; k++) EXPECT_NEAR(b[k].loss, g[k].loss, 2e-2 * g[k].loss) << "bf16 step " << k + 1;
}

// Expert parallelism on the GPU (tokens by NCCL all-to-all, experts gathered over their edp group): the
// recipe on 1, 2 and 4 ranks with expert_parallel 1, 2 and 4 gives the float64 run's losses and the
// same expert load (the one-rank counts times the ranks). Needs one GPU per rank (or the emulator).
TEST(MoeCudaRanks, ExpertParallelEqualsTheFloat64Run) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
    const bool emu = getenv("FSDP_EMU_DEVICES") != nullptr;
    const std::string m = "mixtral_tiny", dir = make_tmpdir("fsdp-moe-cuda-ep");
    std::vector<double> loss = ref_steps(m, "loss");
    const int runs[][2] = {{1, 1}, {2, 2}, {4, 2}, {4, 4}};
    std::vector<json_t *> one;
    for (const auto &run : runs) {
        const int np = run[0], ep = run[1];
        SCOPED_TRACE(std::to_string(np) + " ranks, expert_parallel " + std::to_string(ep));
        if (!emu && gpu_count() < np) {
            printf("[ skip ] %d ranks need %d GPUs\n", np, np);
            continue;
        }
        std::string batch = dir + "/batch" + std::to_string(np) + ".safetensors",
                    met = dir + "/m" + std::to_string(np) + "_" + std::to_string(ep) + ".jsonl";
        hf_batch::write_tiled_batch_of(moe_fixture(m, "batch.safetensors"), np, batch);
        write_file(dir + "/r.yaml", "runtime: {device: cuda}\nmodel: {from_hf: " + moe_fixture(m) + "}\n"
                                    "data: {kind: safetensors, path: " + batch + ", batch_size: " + std::to_string(2 * np) +
                                    ", seq_len: 32}\nstages:\n"
                                    "  - {id: l, uses: load-ckpt, with: {path: " + moe_fixture(m) + ", names: hf}}\n"
                                    "  - {id: t, uses: train-steps, with: {steps: 4, lr: 1e-3, warmup_steps: 2, decay: "
                                    "linear, min_lr_ratio: 0.1, betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, "
                                    "max_grad_norm: 1.0, expert_parallel: " + std::to_string(ep) + ", metrics: " + met +
                                    "}}\n");
        std::string prefix = (emu ? "env FSDP_EMU_DEVICES=" + std::to_string(np) + " " : std::string()) +
                             (np > 1 ? mpirun_prefix(np) : std::string());
        std::string out;
        int rc = run_cmd("timeout -k 10 300 " + prefix + " " + fsdp_run_bin() + " -q " + dir + "/r.yaml", &out);
        ASSERT_EQ(rc, 0) << out;
        std::vector<json_t *> lines = jsonl_objects(met);
        ASSERT_EQ(lines.size(), 4u);
        for (int k = 0; k < 4; k++) {
            EXPECT_NEAR(json_number_value(json_object_get(lines[k], "loss")), loss[k], 1e-6 * loss[k]) << "step " << k + 1;
            if (!one.empty()) {
                const char *layer;
                json_t *counts;
                json_object_foreach(json_object_get(lines[k], "expert_load"), layer, counts) {
                    json_t *c1 = json_object_get(json_object_get(one[k], "expert_load"), layer);
                    for (size_t e = 0; e < json_array_size(counts); e++)
                        EXPECT_EQ(json_integer_value(json_array_get(counts, e)),
                                  np * json_integer_value(json_array_get(c1, e)))
                            << "step " << k + 1 << ", layer " << layer << ", expert " << e;
                }
            }
        }
        if (one.empty()) {
            one = lines;
        } else {
            for (json_t *l : lines) json_decref(l);
        }
    }
    for (json_t *l : one) json_decref(l);
    rm_rf(dir);
}
