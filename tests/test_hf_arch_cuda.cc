// The GPU path of every Hugging Face architecture (Qwen2's q/k/v biases, Qwen3's q/k norms and wide
// head_dim, tied embeddings) on the hf-5.24 fixtures: the bias kernels against the CPU's, 5 FSDP
// steps in float32 against the CPU path and in bf16 mixed precision against float32, activation
// checkpointing, the chunked head and the offloaded optimizer. The GPU tests skip without a GPU;
// `make test` runs the quick ones under the emulated device (EMU_QUICK).
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/safetensors.h"
#include "ckpt/state_io.h"
#include "kernels/cpu/kc.h"
#include "kernels/cuda/kcu.h"
#include "decoder/hf_config.h"
#include "train/train_fsdp.h"
#include "train/train_fsdp_cuda.h"
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_table.h"
#include "decoder/decoder_params.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/state.h"
}
#include "ckpt_compare.h"
#include "gpu_util.h"
#include "hf_state_util.h"
#include "st_test_reader.h"
#include "jsonl_util.h"
#include "test_util.h"

using namespace fsdp_test;

namespace {

const char *const MODELS[] = {"qwen2_tiny", "qwen3_tiny", "llama32_tiny"};


typedef std::map<std::string, st_test::Tensor> Tensors;

float max_abs(const std::vector<float> &a) {
    float m = 0;
    for (float x : a) m = std::max(m, std::fabs(x));
    return m;
}

float max_diff(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

struct Dir {
    std::string d = make_tmpdir("fsdp-hfcuda");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};


// The fixture's batch twice along the batch: 2 rows per rank on 2 ranks, the same mean loss.
void write_batch_twice(const std::string &model, const std::string &path) {
    Tensors b;
    std::string why;
    ASSERT_TRUE(st_test::load(hf_fixture(model, "batch.safetensors"), &b, &why)) << why;
    st_writer *w;
    fsdp_err err;
    ASSERT_EQ(st_writer_new(&w, path.c_str(), &err), 0) << err.msg;
    const char *names[2] = {"input_ids", "labels"};
    size_t idx[2];
    int64_t shape[2] = {2 * b.at("input_ids").shape[0], b.at("input_ids").shape[1]};
    for (int k = 0; k < 2; k++) ASSERT_EQ(st_writer_declare(w, names[k], FSDP_DT_I32, 2, shape, &idx[k], &err), 0);
    ASSERT_EQ(st_writer_begin(w, &err), 0) << err.msg;
    for (int k = 0; k < 2; k++) {
        std::vector<int32_t> v(b.at(names[k]).i32);
        v.insert(v.end(), b.at(names[k]).i32.begin(), b.at(names[k]).i32.end());
        ASSERT_EQ(st_writer_write(w, idx[k], v.data(), v.size() * 4, &err), 0) << err.msg;
    }
    ASSERT_EQ(st_writer_finish(w, &err), 0) << err.msg;
    st_writer_free(w);
}

class HfArchCuda : public ::testing::Test {
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
        if (ref_) json_decref(ref_);
    }

    // The fixture loaded strictly under HF names (one rank), on the device unless host.
    fsdp_state *make_state(const std::string &model, bool host = false, bool offloaded = false) {
        decoder_config cfg;
        EXPECT_EQ(hf_config_read(hf_fixture(model).c_str(), &cfg, &err_), 0) << err_.msg;
        fsdp_state *s = hf_state(model, cfg);
        states_.push_back(s);
        s->offloaded = offloaded;
        if (!host) {
            EXPECT_EQ(state_to_device(s, d_, &err_), 0) << err_.msg;
        }
        return s;
    }

    void load_fixture(const std::string &model) {
        std::string why;
        batch_.clear();
        ASSERT_TRUE(st_test::load(hf_fixture(model, "batch.safetensors"), &batch_, &why)) << why;
        in_ = batch_.at("input_ids").i32;
        lab_ = batch_.at("labels").i32;
        if (ref_) json_decref(ref_);
        json_error_t je;
        ref_ = json_load_file(hf_fixture(model, "reference.json").c_str(), 0, &je);
        ASSERT_TRUE(ref_) << je.text;
    }
    train_fsdp_hparams hparams(int k) {
        json_t *st = json_array_get(json_object_get(ref_, "steps"), (size_t)k);
        return {json_number_value(json_object_get(st, "lr")), 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
    }
    double ref_value(int k, const char *key) {
        return json_number_value(json_object_get(json_array_get(json_object_get(ref_, "steps"), (size_t)k), key));
    }

    std::vector<train_fsdp_result> run_gpu(fsdp_state *s, const train_fsdp_cuda_options &o, int n) {
        std::vector<train_fsdp_result> out;
        train_fsdp_cuda *f = nullptr;
        EXPECT_EQ(train_fsdp_cuda_create(s, decoder_blocks_cuda(decoder_state_config(s)), c_, d_, 2, 32, &o, &f, &err_), 0) << err_.msg;
        if (!f) return out;
        for (int k = 0; k < n; k++) {
            train_fsdp_hparams hp = hparams(k);
            train_fsdp_result r;
            EXPECT_EQ(train_fsdp_cuda_step(f, in_.data(), lab_.data(), &hp, &r, &err_), 0) << err_.msg;
            out.push_back(r);
        }
        train_fsdp_cuda_free(f);
        return out;
    }
    std::vector<train_fsdp_result> run_cpu(fsdp_state *s, int n) {
        std::vector<train_fsdp_result> out;
        train_fsdp *f = nullptr;
        EXPECT_EQ(train_fsdp_create(s, decoder_blocks_cpu(decoder_state_config(s)), c_, 2, 32, &f, &err_), 0) << err_.msg;
        if (!f) return out;
        for (int k = 0; k < n; k++) {
            train_fsdp_hparams hp = hparams(k);
            train_fsdp_result r;
            EXPECT_EQ(train_fsdp_step(f, in_.data(), lab_.data(), &hp, &r, &err_), 0) << err_.msg;
            out.push_back(r);
        }
        train_fsdp_free(f);
        return out;
    }
    // Array `which` (0 data, 1 grad, 2 exp_avg, 3 exp_avg_sq) of every parameter, in state order.
    std::vector<float> pull(fsdp_state *s, int which) {
        std::vector<float> out;
        for (size_t k = 0; k < s->n; k++) {
            state_param *p = &s->p[k];
            std::vector<float> v(state_param_local_numel(p));
            EXPECT_EQ(state_param_get(s, p, (state_array)which, v.data(), &err_), 0) << err_.msg;
            out.insert(out.end(), v.begin(), v.end());
        }
        return out;
    }

    comm *c_ = nullptr;
    dev_ctx *d_ = nullptr;
    fsdp_err err_;
    json_t *ref_ = nullptr;
    Tensors batch_;
    std::vector<int32_t> in_, lab_;
    std::vector<fsdp_state *> states_;
};

const train_fsdp_cuda_options F32 = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};
const train_fsdp_cuda_options BF16 = {TRAIN_FSDP_MIXED_BF16, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};

}  // namespace

// The bias kernels: the forward add and the column sums of the gradient, bit for bit the CPU's in
// float32 (same operations, the column sums in double in row order); in bf16 within its rounding.
TEST(HfArchCudaKernels, BiasMatchesTheCpuKernels) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
    fsdp_err err;
    dev_ctx *d = dev_ctx_create(nullptr, &err);
    ASSERT_NE(d, nullptr) << err.msg;
    kcu_stream s = (kcu_stream)dev_ctx_stream(d, DEV_STREAM_COMPUTE);
    const int64_t n = 67;
    const int out = 130;
    std::vector<float> y(n * out), b(out), dy(n * out), db(out);
    for (size_t i = 0; i < y.size(); i++) {
        y[i] = std::sin(0.37f * i) * 3.0f;
        dy[i] = std::cos(0.11f * i) / (1.0f + i % 7);
    }
    for (int j = 0; j < out; j++) b[j] = 0.25f * std::sin(1.3f * j), db[j] = 0.5f * j;
    void *dy_d, *y_d, *b_d, *db_d;
    ASSERT_EQ(dev_alloc(d, y.size() * 4, &y_d, &err), 0);
    ASSERT_EQ(dev_alloc(d, dy.size() * 4, &dy_d, &err), 0);
    ASSERT_EQ(dev_alloc(d, b.size() * 4, &b_d, &err), 0);
    ASSERT_EQ(dev_alloc(d, db.size() * 4, &db_d, &err), 0);
    ASSERT_EQ(dev_upload(d, y_d, y.data(), y.size() * 4, &err), 0);
    ASSERT_EQ(dev_upload(d, dy_d, dy.data(), dy.size() * 4, &err), 0);
    ASSERT_EQ(dev_upload(d, b_d, b.data(), b.size() * 4, &err), 0);
    ASSERT_EQ(dev_upload(d, db_d, db.data(), db.size() * 4, &err), 0);
    ASSERT_EQ(kcu_bias_forward(FSDP_DT_F32, y_d, b_d, n, out, s, &err), 0) << err.msg;
    ASSERT_EQ(kcu_bias_backward(FSDP_DT_F32, dy_d, (float *)db_d, n, out, s, &err), 0) << err.msg;
    std::vector<float> gy(y.size()), gdb(out);
    ASSERT_EQ(dev_download(d, gy.data(), y_d, gy.size() * 4, &err), 0) << err.msg;
    ASSERT_EQ(dev_download(d, gdb.data(), db_d, gdb.size() * 4, &err), 0) << err.msg;
    kc_bias_forward(y.data(), b.data(), n, out);
    kc_bias_backward(dy.data(), db.data(), n, out);
    EXPECT_TRUE(gy == y);
    EXPECT_TRUE(gdb == db);
    // bf16 storage: the sum rounded once to bf16, the gradient's columns from bf16 values
    std::vector<uint16_t> yb(y.size()), bb(out), dyb(dy.size());
    for (size_t i = 0; i < y.size(); i++) yb[i] = fsdp_f32_to_bf16(std::sin(0.37f * i)), dyb[i] = fsdp_f32_to_bf16(dy[i]);
    for (int j = 0; j < out; j++) bb[j] = fsdp_f32_to_bf16(b[j]);
    ASSERT_EQ(dev_upload(d, y_d, yb.data(), yb.size() * 2, &err), 0);
    ASSERT_EQ(dev_upload(d, dy_d, dyb.data(), dyb.size() * 2, &err), 0);
    ASSERT_EQ(dev_upload(d, b_d, bb.data(), bb.size() * 2, &err), 0);
    ASSERT_EQ(dev_memset0(d, db_d, out * 4, DEV_STREAM_COMPUTE, &err), 0);
    ASSERT_EQ(kcu_bias_forward(FSDP_DT_BF16, y_d, b_d, n, out, s, &err), 0) << err.msg;
    ASSERT_EQ(kcu_bias_backward(FSDP_DT_BF16, dy_d, (float *)db_d, n, out, s, &err), 0) << err.msg;
    std::vector<uint16_t> gyb(yb.size());
    ASSERT_EQ(dev_download(d, gyb.data(), y_d, gyb.size() * 2, &err), 0) << err.msg;
    ASSERT_EQ(dev_download(d, gdb.data(), db_d, gdb.size() * 4, &err), 0) << err.msg;
    for (size_t i = 0; i < yb.size(); i++) {
        float want = fsdp_bf16_to_f32(yb[i]) + fsdp_bf16_to_f32(bb[i % out]);
        EXPECT_EQ(gyb[i], fsdp_f32_to_bf16(want)) << i;
    }
    for (int j = 0; j < out; j++) {
        double s2 = 0;
        for (int64_t i = 0; i < n; i++) s2 += fsdp_bf16_to_f32(dyb[i * out + j]);
        EXPECT_EQ(gdb[j], (float)s2) << j;
    }
    EXPECT_EQ(kcu_bias_forward(FSDP_DT_F32, y_d, b_d, -1, out, s, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("kcu_bias_forward: bad sizes"), std::string::npos) << err.msg;
    for (void *p : {y_d, dy_d, b_d, db_d}) dev_free(d, p, &err);
    dev_ctx_free(d);
}

// 5 steps in float32 on the GPU against the CPU path (1e-5) and PyTorch's reference, for each
// architecture; the tied embedding is one parameter with one gradient and one set of moments.
TEST_F(HfArchCuda, F32FiveStepsMatchTheCpuPath) {
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        load_fixture(m);
        fsdp_state *g = make_state(m), *h = make_state(m, true);
        std::vector<train_fsdp_result> gr = run_gpu(g, F32, 5), hr = run_cpu(h, 5);
        ASSERT_EQ(gr.size(), 5u);
        ASSERT_EQ(hr.size(), 5u);
        for (int k = 0; k < 5; k++) {
            EXPECT_NEAR(gr[k].loss, hr[k].loss, 1e-5 * hr[k].loss) << "step " << k + 1;
            EXPECT_NEAR(gr[k].grad_norm, hr[k].grad_norm, 1e-5 * hr[k].grad_norm) << "step " << k + 1;
            double want = ref_value(k, "loss");
            EXPECT_NEAR(gr[k].loss, want, 1e-5 * want) << "step " << k + 1;
        }
        EXPECT_EQ(state_find(g, "output.weight"), nullptr);
        std::vector<float> gw = pull(g, 0), hw = pull(h, 0), gm = pull(g, 2), hm = pull(h, 2);
        float dw = max_diff(gw, hw), dm = max_diff(gm, hm);
        EXPECT_LE(dw, 1e-5f) << "weights";
        EXPECT_LE(dm, 1e-5f * std::max(1.0f, max_abs(hm))) << "exp_avg";
        printf("[ %s ] GPU f32 vs CPU: max |w| diff %.3g, exp_avg %.3g, losses %.9g / %.9g\n", m, dw, dm, gr[4].loss,
               hr[4].loss);
    }
}

// bf16 mixed precision (bf16 weights, biases, norms and activations; float32 master weights,
// gradients and optimizer) stays within 1% of float32 on every step.
TEST_F(HfArchCuda, Bf16WithinOnePercentOfF32) {
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        load_fixture(m);
        fsdp_state *a = make_state(m), *b = make_state(m);
        std::vector<train_fsdp_result> fr = run_gpu(a, F32, 5), br = run_gpu(b, BF16, 5);
        ASSERT_EQ(fr.size(), 5u);
        ASSERT_EQ(br.size(), 5u);
        for (int k = 0; k < 5; k++) {
            EXPECT_NEAR(br[k].loss, fr[k].loss, 1e-2 * fr[k].loss) << "step " << k + 1;
            EXPECT_NE(br[k].loss, fr[k].loss) << "bf16 compute rounds differently from f32";
        }
        printf("[ %s ] bf16 loss after 5 steps %.6g, f32 %.6g\n", m, br[4].loss, fr[4].loss);
    }
}

// Full and selective activation checkpointing, the head in chunks of 7 rows and the offloaded
// optimizer on the GPU for the two Qwen architectures (q/k/v biases; q/k norms with their saved
// pre-norm q and k): the same step as the default.
TEST_F(HfArchCuda, CheckpointingChunkedHeadAndOffloadMatchTheDefault) {
    for (const char *m : {"qwen2_tiny", "qwen3_tiny"}) {
        SCOPED_TRACE(m);
        load_fixture(m);
        fsdp_state *base = make_state(m);
        std::vector<train_fsdp_result> r0 = run_gpu(base, F32, 2);
        std::vector<float> w0 = pull(base, 0);
        struct {
            train_fsdp_cuda_options o;
            bool offload, exact;
        } runs[] = {{{TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_FULL, 0, 0, 0, 0}, false, true},
                    {{TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_SELECTIVE, 0, 0, 0, 0}, false, true},
                    {{TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 7, 0, 0}, false, false},
                    {F32, true, true}};
        for (const auto &r : runs) {
            fsdp_state *s = make_state(m, false, r.offload);
            std::vector<train_fsdp_result> rr = run_gpu(s, r.o, 2);
            ASSERT_EQ(rr.size(), 2u);
            std::vector<float> w = pull(s, 0);
            if (r.exact) {
                EXPECT_EQ(rr[1].loss, r0[1].loss) << "ac " << r.o.ac << " offload " << r.offload;
                EXPECT_TRUE(w == w0) << "ac " << r.o.ac << " offload " << r.offload;
            } else {
                EXPECT_NEAR(rr[1].loss, r0[1].loss, 1e-6 * r0[1].loss);
                EXPECT_LE(max_diff(w, w0), 1e-5f);
            }
        }
    }
}

// The whole recipe on 2 ranks of the emulated GPU (NCCL all-gathers and reduce-scatters of every
// architecture's parameters, the tied embedding's gradient reduced once) against the same recipe on
// the CPU: losses, grad norms and the exported Hugging Face weights within 1e-5, and PyTorch's losses.
TEST_F(HfArchCuda, TwoRanksMatchTheCpuPath) {
    Dir t;
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        load_fixture(m);
        std::string batch = t / (std::string(m) + "_batch2.safetensors"), r = t / (std::string(m) + ".yaml");
        write_batch_twice(m, batch);
        write_file(r, "model: {from_hf: " + hf_fixture(m) + "}\n"
                      "data: {kind: safetensors, path: " + batch + ", batch_size: 4, seq_len: 32}\n"
                      "vars: {m: x, out: y}\n"
                      "stages:\n"
                      "  - {id: l, uses: load-ckpt, with: {path: " + hf_fixture(m) + ", names: hf}}\n"
                      "  - {id: t, uses: train-steps, with: {steps: 3, lr: 1e-3, warmup_steps: 2, metrics: \"${m}\"}}\n"
                      "  - {id: e, uses: save-safetensors, with: {path: \"${out}\", names: hf, shard_mb: 1}}\n");
        for (const char *dev : {"cuda", "cpu"}) {
            std::string o;
            int rc = run_cmd("timeout -k 10 300 " + mpirun_prefix(2) + " " + fsdp_run_bin() + " -q " + r +
                                 " --set runtime.device=" + dev + " --set vars.m=" + (t / (std::string(m) + dev + ".jsonl")) +
                                 " --set vars.out=" + (t / (std::string(m) + dev)),
                             &o);
            ASSERT_EQ(rc, 0) << dev << ": " << o;
        }
        const std::string gj = t / (std::string(m) + "cuda.jsonl"), cj = t / (std::string(m) + "cpu.jsonl");
        std::vector<double> gl = jsonl_field(gj, "loss"), cl = jsonl_field(cj, "loss"), gg = jsonl_field(gj, "grad_norm"),
                            cg = jsonl_field(cj, "grad_norm");
        ASSERT_EQ(gl.size(), 3u);
        ASSERT_EQ(cl.size(), 3u);
        for (int k = 0; k < 3; k++) {
            EXPECT_NEAR(gl[k], cl[k], 1e-5 * cl[k]) << "step " << k + 1;
            EXPECT_NEAR(gg[k], cg[k], 1e-5 * cg[k]) << "step " << k + 1;
            EXPECT_NEAR(gl[k], ref_value(k, "loss"), 1e-5 * ref_value(k, "loss")) << "step " << k + 1;
        }
        Ckpt a(t / (std::string(m) + "cuda")), b(t / (std::string(m) + "cpu"));
        ASSERT_TRUE(a.r && b.r);
        ASSERT_EQ(ckpt_count(a.r), ckpt_count(b.r));
        float worst = 0;
        for (size_t i = 0; i < ckpt_count(b.r); i++) {
            const char *name = ckpt_entry_at(b.r, i)->name;
            auto x = tensor_bytes(a.r, name, FSDP_DT_F32), y = tensor_bytes(b.r, name, FSDP_DT_F32);
            std::vector<float> fx(x.size() / 4), fy(y.size() / 4);
            memcpy(fx.data(), x.data(), x.size());
            memcpy(fy.data(), y.data(), y.size());
            worst = std::max(worst, max_diff(fx, fy));
        }
        EXPECT_LE(worst, 1e-5f);
        printf("[ %s on 2 ranks ] GPU vs CPU: max |w| diff %.3g\n", m, worst);
    }
}
