// The GPU FSDP training step (train/train_fsdp_cuda.h) on the tiny fixture: PyTorch's reference
// run and the CPU path in f32, bf16 mixed precision, the offloaded optimizer, activation
// checkpointing, kept gathered layers, the numeric failure, and the train-steps backend. The GPU
// tests skip without a GPU; the option parsing runs everywhere.
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "train/train_fsdp.h"
#include "train/train_fsdp_cuda.h"
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_table.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/state.h"
#include "stages/train_backend.h"
}
#include "st_test_reader.h"
#include "gpu_util.h"
#include "decoder_state_util.h"
#include "test_util.h"

using fsdp_test::gpu_count;
using fsdp_test::gpu_present;

namespace {

decoder_config tiny() {
    decoder_config c;
    memset(&c, 0, sizeof c);
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 256, c.multiple_of = 32;
    c.norm_eps = 1e-5, c.rope_theta = 10000.0, c.max_seq_len = 64, c.depth_init = 1;
    c.head_dim = 16, c.ffn_hidden = 192;
    return c;
}

typedef std::map<std::string, st_test::Tensor> Tensors;

class LlamaFsdpCuda : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
        ASSERT_TRUE(st_test::load(fsdp_test::tiny("model_init.safetensors"), &init_, &why)) << why;
        ASSERT_TRUE(st_test::load(fsdp_test::tiny("batch.safetensors"), &batch_, &why)) << why;
        json_error_t je;
        ref_ = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
        ASSERT_TRUE(ref_) << je.text;
        json_t *names = json_object_get(ref_, "param_names");
        for (size_t i = 0; i < json_array_size(names); i++) names_.push_back(json_string_value(json_array_get(names, i)));
        ASSERT_EQ(comm_create_single(&c_, &err_), 0) << err_.msg;
        d_ = dev_ctx_create(nullptr, &err_);
        ASSERT_NE(d_, nullptr) << err_.msg;
        in_ = batch_.at("input_ids").i32;
        lab_ = batch_.at("labels").i32;
    }
    void TearDown() override {
        for (fsdp_state *s : states_) free_state(s);
        if (c_) comm_destroy(c_);  // the NCCL communicator while its device is still set up
        if (d_) dev_ctx_free(d_);
        if (ref_) json_decref(ref_);
    }

    // The fixture's initial weights, sharded over a world of 1; on the device unless host is set.
    fsdp_state *make_state(bool host = false, bool offloaded = false) {
        fsdp_state *s = decoder_test_state(tiny());
        states_.push_back(s);
        for (const std::string &n : names_) {
            auto &t = init_.at(n);
            std::vector<int64_t> shp(t.shape.begin(), t.shape.end());
            EXPECT_EQ(state_add_param(s, n.c_str(), (int)shp.size(), shp.data(), -1, &err_), 0) << err_.msg;
            state_param *p = state_find(s, n.c_str());
            memcpy(p->data, t.f32.data(), t.f32.size() * sizeof(float));
            if (host) continue;
            void *dp = nullptr;
            size_t bytes = t.f32.size() * sizeof(float);
            EXPECT_EQ(dev_alloc(d_, bytes, &dp, &err_), 0) << err_.msg;
            EXPECT_EQ(dev_upload(d_, dp, p->data, bytes, &err_), 0) << err_.msg;
            p->d_data = (float *)dp;
            free(p->data);
            p->data = nullptr;
        }
        if (!host) s->dev = d_;
        s->offloaded = offloaded;
        return s;
    }
    void free_state(fsdp_state *s) {
        for (size_t k = 0; k < s->n; k++) {
            state_param *p = &s->p[k];
            for (float **a : {&p->d_data, &p->d_grad, &p->d_exp_avg, &p->d_exp_avg_sq}) {
                if (*a) {
                    EXPECT_EQ(dev_free(d_, *a, &err_), 0) << err_.msg;
                }
                *a = nullptr;
            }
        }
        state_free(s);
    }

    // One device or host array of every parameter, concatenated in state order.
    std::vector<float> pull(fsdp_state *s, int which) {
        std::vector<float> out;
        for (size_t k = 0; k < s->n; k++) {
            state_param *p = &s->p[k];
            size_t n = state_param_local_numel(p);
            float *h[] = {p->data, p->grad, p->exp_avg, p->exp_avg_sq};
            float *dv[] = {p->d_data, p->d_grad, p->d_exp_avg, p->d_exp_avg_sq};
            std::vector<float> v(n);
            if (dv[which]) EXPECT_EQ(dev_download(d_, v.data(), dv[which], n * sizeof(float), &err_), 0) << err_.msg;
            else if (h[which]) memcpy(v.data(), h[which], n * sizeof(float));
            else ADD_FAILURE() << "parameter " << p->name << " has no array " << which;
            out.insert(out.end(), v.begin(), v.end());
        }
        return out;
    }
    std::vector<float> tensor(fsdp_state *s, const std::string &name) {
        state_param *p = state_find(s, name.c_str());
        size_t n = state_param_local_numel(p);
        std::vector<float> v(n);
        if (p->d_data) EXPECT_EQ(dev_download(d_, v.data(), p->d_data, n * sizeof(float), &err_), 0) << err_.msg;
        else memcpy(v.data(), p->data, n * sizeof(float));
        return v;
    }

    train_fsdp_hparams hparams(int k) {
        json_t *st = json_array_get(json_object_get(ref_, "steps"), (size_t)k);
        return {json_number_value(json_object_get(st, "lr")), 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
    }
    double ref_value(int k, const char *key) {
        return json_number_value(json_object_get(json_array_get(json_object_get(ref_, "steps"), (size_t)k), key));
    }

    // n GPU steps with the given options; the results per step.
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

    static float max_abs(const std::vector<float> &a) {
        float m = 0;
        for (float x : a) m = std::max(m, std::fabs(x));
        return m;
    }
    static float max_diff(const std::vector<float> &a, const std::vector<float> &b) {
        EXPECT_EQ(a.size(), b.size());
        float m = 0;
        for (size_t i = 0; i < a.size() && i < b.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
        return m;
    }

    Tensors init_, batch_;
    json_t *ref_ = nullptr;
    std::vector<std::string> names_;
    comm *c_ = nullptr;
    dev_ctx *d_ = nullptr;
    fsdp_err err_;
    std::vector<int32_t> in_, lab_;
    std::vector<fsdp_state *> states_;
};

const train_fsdp_cuda_options F32 = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};

}  // namespace

TEST_F(LlamaFsdpCuda, F32FiveStepsMatchReferenceAndCpuPath) {
    fsdp_state *g = make_state(), *h = make_state(true);
    std::vector<train_fsdp_result> gr = run_gpu(g, F32, 5);
    ASSERT_EQ(gr.size(), 5u);
    train_fsdp *f;
    ASSERT_EQ(train_fsdp_create(h, decoder_blocks_cpu(decoder_state_config(h)), c_, 2, 32, &f, &err_), 0) << err_.msg;
    for (int k = 0; k < 5; k++) {
        train_fsdp_hparams hp = hparams(k);
        train_fsdp_result r;
        ASSERT_EQ(train_fsdp_step(f, in_.data(), lab_.data(), &hp, &r, &err_), 0) << err_.msg;
        double want = ref_value(k, "loss"), gn = ref_value(k, "grad_norm");
        EXPECT_NEAR(gr[k].loss, want, 1e-5 * want) << "step " << k;
        EXPECT_NEAR(gr[k].grad_norm, gn, 1e-4 * gn) << "step " << k;
        EXPECT_NEAR(gr[k].loss, r.loss, 1e-5 * r.loss) << "step " << k;
        EXPECT_NEAR(gr[k].grad_norm, r.grad_norm, 1e-5 * r.grad_norm) << "step " << k;
        EXPECT_EQ(gr[k].tokens, 64);
    }
    train_fsdp_free(f);
    EXPECT_EQ(g->opt_step, 5);
    EXPECT_TRUE(g->has_optimizer);
    // the placement rule: gradients and moments on the device, no host twins
    for (size_t k = 0; k < g->n; k++) {
        EXPECT_TRUE(g->p[k].d_grad && g->p[k].d_exp_avg && g->p[k].d_exp_avg_sq) << g->p[k].name;
        EXPECT_FALSE(g->p[k].data || g->p[k].grad || g->p[k].exp_avg || g->p[k].exp_avg_sq) << g->p[k].name;
    }
    // the step-5 weights: PyTorch's (float64 reference run: 1e-4) and the CPU path's
    Tensors step5;
    std::string why;
    ASSERT_TRUE(st_test::load(fsdp_test::tiny("model_step5.safetensors"), &step5, &why)) << why;
    for (const std::string &n : names_) {
        std::vector<float> got = tensor(g, n), cpu = tensor(h, n), &want = step5.at(n).f32;
        EXPECT_LE(max_diff(got, want), 1e-4 * max_abs(want)) << n;
        EXPECT_LE(max_diff(got, cpu), 2e-4 * max_abs(cpu)) << n;  // each within 1e-4 of the float64 run
    }
    // the moments too
    std::vector<float> gm = pull(g, 2), hm = pull(h, 2), gv = pull(g, 3), hv = pull(h, 3);
    EXPECT_LE(max_diff(gm, hm), 1e-4 * max_abs(hm));
    EXPECT_LE(max_diff(gv, hv), 1e-3 * max_abs(hv));
}

TEST_F(LlamaFsdpCuda, Bf16MixedPrecisionWithinOnePercentOfF32) {
    fsdp_state *a = make_state(), *b = make_state();
    std::vector<train_fsdp_result> fr = run_gpu(a, F32, 5);
    train_fsdp_cuda_options o = {TRAIN_FSDP_MIXED_BF16, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};
    std::vector<train_fsdp_result> br = run_gpu(b, o, 5);
    ASSERT_EQ(fr.size(), 5u);
    ASSERT_EQ(br.size(), 5u);
    for (int k = 0; k < 5; k++) {
        EXPECT_NEAR(br[k].loss, fr[k].loss, 1e-2 * fr[k].loss) << "step " << k;
        EXPECT_NEAR(br[k].grad_norm, fr[k].grad_norm, 5e-2 * fr[k].grad_norm) << "step " << k;
        EXPECT_NE(br[k].loss, fr[k].loss) << "bf16 compute gives a different rounding than f32";
    }
    // fp32 master weights: not bf16-rounded, and close to the f32 run's
    std::vector<float> pa = pull(a, 0), pb = pull(b, 0);
    size_t not_bf16 = 0;
    for (float x : pb) {
        uint32_t u;
        memcpy(&u, &x, 4);
        not_bf16 += (u & 0xFFFFu) != 0;
    }
    EXPECT_GT(not_bf16, pb.size() / 2);
    // AdamW moves a weight by about lr per step whatever the gradient's size: the two runs' weights
    // differ by less than twice the summed learning rates
    double lr_sum = 0;
    for (int k = 0; k < 5; k++) lr_sum += hparams(k).lr;
    EXPECT_LE(max_diff(pa, pb), 2 * lr_sum);
    EXPECT_GT(max_diff(pa, pb), 0.0f);
}

TEST_F(LlamaFsdpCuda, OffloadedOptimizerEqualsDeviceOptimizer) {
    fsdp_state *dv = make_state(), *off = make_state(false, true);
    std::vector<train_fsdp_result> a = run_gpu(dv, F32, 4), b = run_gpu(off, F32, 4);
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    // the moments stay in host memory, the parameters on the device
    for (size_t k = 0; k < off->n; k++) {
        const state_param *p = &off->p[k];
        EXPECT_TRUE(p->exp_avg && p->exp_avg_sq && !p->d_exp_avg && !p->d_exp_avg_sq && p->d_data && !p->data)
            << p->name;
    }
    // same float operations: equal up to the forward's atomics-order noise (embedding backward)
    for (int k = 0; k < 4; k++) {
        EXPECT_NEAR(a[k].loss, b[k].loss, 1e-6 * a[k].loss) << "step " << k;
        EXPECT_NEAR(a[k].grad_norm, b[k].grad_norm, 1e-6 * a[k].grad_norm) << "step " << k;
    }
    for (int which : {0, 1, 2, 3}) {
        std::vector<float> x = pull(dv, which), y = pull(off, which);
        EXPECT_LE(max_diff(x, y), 1e-5 * max_abs(x)) << "array " << which;
    }
    EXPECT_EQ(off->opt_step, 4);
    EXPECT_TRUE(off->has_optimizer);
}

TEST_F(LlamaFsdpCuda, OffloadedOptimizerBitIdenticalOnOneStepFromTheSameGradients) {
    // one step from the same state: the forward and backward are the same launches, so the
    // AdamW results must agree bit for bit whenever the gradients do
    fsdp_state *dv = make_state(), *off = make_state(false, true);
    run_gpu(dv, F32, 1);
    run_gpu(off, F32, 1);
    std::vector<float> gx = pull(dv, 1), gy = pull(off, 1);
    // the embedding backward's atomics may order a sum differently between two runs; when they
    // did, the results can only agree to rounding, otherwise they must agree exactly
    const bool same_grads = gx == gy;
    for (int which : {0, 2, 3}) {
        std::vector<float> x = pull(dv, which), y = pull(off, which);
        if (same_grads) EXPECT_EQ(x, y) << "array " << which;
        else EXPECT_LE(max_diff(x, y), 1e-6 * max_abs(x)) << "array " << which << " (gradients differed)";
    }
}

TEST_F(LlamaFsdpCuda, ActivationCheckpointingAndKeptLayersMatchTheDefault) {
    fsdp_state *base = make_state(), *ac = make_state(), *keep = make_state(), *both = make_state(),
               *sel = make_state();
    train_fsdp_cuda_options oac = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_FULL, 0, 0, 0, 0};
    train_fsdp_cuda_options osel = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_SELECTIVE, 0, 0, 0, 0};
    train_fsdp_cuda_options okeep = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 1, 0, 0, 0};
    train_fsdp_cuda_options oboth = {TRAIN_FSDP_MIXED_BF16, TRAIN_FSDP_AC_FULL, 1, 0, 0, 0};
    std::vector<train_fsdp_result> r0 = run_gpu(base, F32, 3), r1 = run_gpu(ac, oac, 3), r2 = run_gpu(keep, okeep, 3);
    std::vector<train_fsdp_result> r3 = run_gpu(both, oboth, 3), r4 = run_gpu(sel, osel, 3);
    ASSERT_EQ(r4.size(), 3u);
    ASSERT_EQ(r0.size(), 3u);
    ASSERT_EQ(r1.size(), 3u);
    ASSERT_EQ(r2.size(), 3u);
    ASSERT_EQ(r3.size(), 3u);
    for (int k = 0; k < 3; k++) {
        EXPECT_NEAR(r1[k].loss, r0[k].loss, 1e-6 * r0[k].loss) << "ac full, step " << k;
        EXPECT_NEAR(r1[k].grad_norm, r0[k].grad_norm, 1e-6 * r0[k].grad_norm) << "ac full, step " << k;
        EXPECT_NEAR(r2[k].loss, r0[k].loss, 1e-6 * r0[k].loss) << "keep_gathered, step " << k;
        EXPECT_NEAR(r2[k].grad_norm, r0[k].grad_norm, 1e-6 * r0[k].grad_norm) << "keep_gathered, step " << k;
        EXPECT_NEAR(r3[k].loss, r0[k].loss, 1e-2 * r0[k].loss) << "bf16 + ac + keep, step " << k;
        EXPECT_NEAR(r4[k].loss, r0[k].loss, 1e-6 * r0[k].loss) << "ac selective, step " << k;
        EXPECT_NEAR(r4[k].grad_norm, r0[k].grad_norm, 1e-6 * r0[k].grad_norm) << "ac selective, step " << k;
    }
    std::vector<float> p0 = pull(base, 0), g0 = pull(base, 1);
    EXPECT_LE(max_diff(p0, pull(ac, 0)), 1e-5 * max_abs(p0));
    EXPECT_LE(max_diff(p0, pull(keep, 0)), 1e-5 * max_abs(p0));
    // the last step's (clipped) gradients: recomputation reproduces the saved activations
    EXPECT_LE(max_diff(g0, pull(ac, 1)), 1e-5 * max_abs(g0));
    EXPECT_LE(max_diff(g0, pull(keep, 1)), 1e-5 * max_abs(g0));
    EXPECT_LE(max_diff(p0, pull(sel, 0)), 1e-5 * max_abs(p0));
    EXPECT_LE(max_diff(g0, pull(sel, 1)), 1e-5 * max_abs(g0));
    // checkpointing holds less activation memory, keeping the layers more gather memory
    train_fsdp_cuda *fa = nullptr, *fb = nullptr, *fk = nullptr, *fs = nullptr;
    ASSERT_EQ(train_fsdp_cuda_create(base, decoder_blocks_cuda(decoder_state_config(base)), c_, d_, 2, 32, &F32, &fa, &err_), 0) << err_.msg;
    ASSERT_EQ(train_fsdp_cuda_create(ac, decoder_blocks_cuda(decoder_state_config(ac)), c_, d_, 2, 32, &oac, &fb, &err_), 0) << err_.msg;
    ASSERT_EQ(train_fsdp_cuda_create(keep, decoder_blocks_cuda(decoder_state_config(keep)), c_, d_, 2, 32, &okeep, &fk, &err_), 0) << err_.msg;
    ASSERT_EQ(train_fsdp_cuda_create(sel, decoder_blocks_cuda(decoder_state_config(sel)), c_, d_, 2, 32, &osel, &fs, &err_), 0) << err_.msg;
    EXPECT_LT(train_fsdp_cuda_bytes(fb), train_fsdp_cuda_bytes(fs)); // full < selective < none
    EXPECT_LT(train_fsdp_cuda_bytes(fs), train_fsdp_cuda_bytes(fa));
    EXPECT_GE(train_fsdp_cuda_bytes(fk), train_fsdp_cuda_bytes(fa));  // 2 layers: as many buffers as reshard's 2
    train_fsdp_cuda_free(fa);
    train_fsdp_cuda_free(fb);
    train_fsdp_cuda_free(fk);
    train_fsdp_cuda_free(fs);
}

// The output head in chunks of 5 rows (13 chunks of the 64 rows, the last partial) gives the
// one-chunk results to rounding (only the order of the output-gradient and loss sums changes), and
// its workspace holds 5 rows of logits instead of 64.
TEST_F(LlamaFsdpCuda, ChunkedHeadMatchesTheWholeBatchHead) {
    fsdp_state *base = make_state(), *chunked = make_state(), *chunked16 = make_state();
    train_fsdp_cuda_options o5 = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 5, 0, 0};
    train_fsdp_cuda_options o5b = {TRAIN_FSDP_MIXED_BF16, TRAIN_FSDP_AC_NONE, 0, 5, 0, 0};
    std::vector<train_fsdp_result> r0 = run_gpu(base, F32, 3), r1 = run_gpu(chunked, o5, 3);
    std::vector<train_fsdp_result> r2 = run_gpu(chunked16, o5b, 3);
    ASSERT_EQ(r0.size(), 3u);
    ASSERT_EQ(r1.size(), 3u);
    ASSERT_EQ(r2.size(), 3u);
    for (int k = 0; k < 3; k++) {
        EXPECT_NEAR(r1[k].loss, r0[k].loss, 1e-6 * r0[k].loss) << "step " << k;
        EXPECT_NEAR(r1[k].grad_norm, r0[k].grad_norm, 1e-5 * r0[k].grad_norm) << "step " << k;
        EXPECT_NEAR(r2[k].loss, r0[k].loss, 1e-2 * r0[k].loss) << "bf16, step " << k;
    }
    std::vector<float> p0 = pull(base, 0);
    EXPECT_LE(max_diff(p0, pull(chunked, 0)), 1e-5 * max_abs(p0));
    train_fsdp_cuda *fa = nullptr, *fb = nullptr;
    ASSERT_EQ(train_fsdp_cuda_create(base, decoder_blocks_cuda(decoder_state_config(base)), c_, d_, 2, 32, &F32, &fa, &err_), 0) << err_.msg;
    ASSERT_EQ(train_fsdp_cuda_create(chunked, decoder_blocks_cuda(decoder_state_config(chunked)), c_, d_, 2, 32, &o5, &fb, &err_), 0) << err_.msg;
    EXPECT_LT(train_fsdp_cuda_bytes(fb), train_fsdp_cuda_bytes(fa));
    train_fsdp_cuda_free(fa);
    train_fsdp_cuda_free(fb);
    train_fsdp_cuda_options bad = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, -1, 0, 0};
    EXPECT_EQ(train_fsdp_cuda_create(base, decoder_blocks_cuda(decoder_state_config(base)), c_, d_, 2, 32, &bad, &fa, &err_), FSDP_E_INVALID);
    EXPECT_NE(std::string(err_.msg).find("head_chunk_rows"), std::string::npos) << err_.msg;
}

TEST_F(LlamaFsdpCuda, NonFiniteLossFailsAndChangesNothing) {
    for (bool offloaded : {false, true}) {
        fsdp_state *s = make_state(false, offloaded);
        train_fsdp_cuda *f = nullptr;
        ASSERT_EQ(train_fsdp_cuda_create(s, decoder_blocks_cuda(decoder_state_config(s)), c_, d_, 2, 32, &F32, &f, &err_), 0) << err_.msg;
        train_fsdp_hparams hp = hparams(0);
        train_fsdp_result r;
        ASSERT_EQ(train_fsdp_cuda_step(f, in_.data(), lab_.data(), &hp, &r, &err_), 0) << err_.msg;
        // NaN in the embedding row of the first token
        state_param *emb = state_find(s, "tok_embeddings.weight");
        float nan = NAN;
        ASSERT_EQ(dev_upload(d_, emb->d_data + (size_t)in_[0] * 64, &nan, sizeof nan, &err_), 0) << err_.msg;
        std::vector<float> p = pull(s, 0), m = pull(s, 2), v = pull(s, 3);
        EXPECT_EQ(train_fsdp_cuda_step(f, in_.data(), lab_.data(), &hp, &r, &err_), FSDP_E_NUMERIC);
        EXPECT_NE(std::string(err_.msg).find("non-finite loss"), std::string::npos) << err_.msg;
        std::vector<float> p2 = pull(s, 0), m2 = pull(s, 2), v2 = pull(s, 3);
        EXPECT_EQ(memcmp(p.data(), p2.data(), p.size() * 4), 0) << "offloaded " << offloaded;
        EXPECT_EQ(m, m2) << "offloaded " << offloaded;
        EXPECT_EQ(v, v2) << "offloaded " << offloaded;
        EXPECT_EQ(s->opt_step, 1);
        train_fsdp_cuda_free(f);
    }
}

TEST_F(LlamaFsdpCuda, TrainStepsBackendPicksTheGpuAndReportsDeviceMemory) {
    fsdp_state *s = make_state(), *h = make_state(true);
    EXPECT_TRUE(train_on_gpu(nullptr, s));
    EXPECT_FALSE(train_on_gpu(nullptr, h));
    train_backend b;
    train_fsdp_cuda_options o = {TRAIN_FSDP_MIXED_BF16, TRAIN_FSDP_AC_FULL, 0, 0, 0, 0};
    ASSERT_EQ(train_backend_open(nullptr, s, c_, 2, 32, &o, &b, &err_), 0) << err_.msg;
    EXPECT_TRUE(b.on_gpu);
    train_backend_reset_peak(&b);
    train_fsdp_hparams hp = hparams(0);
    train_fsdp_result r;
    ASSERT_EQ(train_backend_step(&b, in_.data(), lab_.data(), &hp, &r, &err_), 0) << err_.msg;
    EXPECT_NEAR(r.loss, ref_value(0, "loss"), 1e-2 * ref_value(0, "loss"));
    const char *name = nullptr;
    double mib = train_backend_peak_mib(&b, &name);
    EXPECT_STREQ(name, "peak_device_mem_mib");
    EXPECT_GT(mib, 0.0);
    train_backend_close(&b);
}

TEST_F(LlamaFsdpCuda, RejectsStateNotOnTheDevice) {
    fsdp_state *h = make_state(true);
    train_fsdp_cuda *f = nullptr;
    EXPECT_EQ(train_fsdp_cuda_create(h, decoder_blocks_cuda(decoder_state_config(h)), c_, d_, 2, 32, &F32, &f, &err_), FSDP_E_INVALID);
    EXPECT_NE(std::string(err_.msg).find("is not on the device"), std::string::npos) << err_.msg;
    EXPECT_EQ(f, nullptr);
}

TEST(LlamaFsdpCudaOptions, NamesAndMissingDevice) {
    fsdp_err err;
    train_fsdp_mixed m;
    train_fsdp_ac a;
    EXPECT_EQ(train_fsdp_mixed_from_name("bf16", &m, &err), 0);
    EXPECT_EQ(m, TRAIN_FSDP_MIXED_BF16);
    EXPECT_EQ(train_fsdp_mixed_from_name("none", &m, &err), 0);
    EXPECT_EQ(m, TRAIN_FSDP_MIXED_NONE);
    EXPECT_EQ(train_fsdp_mixed_from_name("fp16", &m, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("mixed: 'fp16'"), std::string::npos) << err.msg;
    EXPECT_EQ(train_fsdp_ac_from_name("full", &a, &err), 0);
    EXPECT_EQ(a, TRAIN_FSDP_AC_FULL);
    EXPECT_EQ(train_fsdp_ac_from_name("selective", &a, &err), 0);
    EXPECT_EQ(a, TRAIN_FSDP_AC_SELECTIVE);
    EXPECT_EQ(train_fsdp_ac_from_name("none", &a, &err), 0);
    EXPECT_EQ(a, TRAIN_FSDP_AC_NONE);
    EXPECT_EQ(train_fsdp_ac_from_name("partial", &a, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("ac: 'partial' is not none, full or selective"), std::string::npos) << err.msg;
    fsdp_state s;
    memset(&s, 0, sizeof s);
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    decoder_config no_cfg;
    memset(&no_cfg, 0, sizeof no_cfg);
    train_fsdp_cuda *f = nullptr;
    EXPECT_EQ(train_fsdp_cuda_create(&s, decoder_blocks_cuda(&no_cfg), c, nullptr, 2, 32, nullptr, &f, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("no state, communicator or device"), std::string::npos) << err.msg;
    comm_destroy(c);
}
