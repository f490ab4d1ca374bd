// The GPU Llama (model/llama_cuda.h) on the tiny fixture against the CPU model and PyTorch's
// step-0 loss and gradients; the weight binding against the CPU layout (runs without a GPU).
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/llama_cuda.h"
#include "model/llama_train.h"
#include "runtime/device.h"
#include "st_test_reader.h"
#include "test_util.h"

namespace {

llama_config tiny_config() {
    llama_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.preset, sizeof c.preset, "tiny");
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 256;
    c.multiple_of = 32;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.max_seq_len = 64;
    c.depth_init = 1;
    c.rope_scaling = LLAMA_ROPE_NONE;
    c.head_dim = 16;
    c.ffn_hidden = 192;
    return c;
}

typedef std::map<std::string, st_test::Tensor> TensorMap;

TensorMap load_st(const std::string &name) {
    TensorMap m;
    std::string why;
    EXPECT_TRUE(st_test::load(fsdp_test::tiny(name), &m, &why)) << why;
    return m;
}

TEST(CudaModel, BindingFollowsTheCpuLayout) {
    llama_config c = tiny_config();
    fsdp_err err;
    const int64_t numel = llama_model_numel(&c);
    ASSERT_GT(numel, 0);
    std::vector<float> flat(numel);
    llama_model_weights w;
    ASSERT_EQ(llama_model_weights_bind(&c, flat.data(), &w, &err), 0) << err.msg;
    for (fsdp_dtype dt : {FSDP_DT_F32, FSDP_DT_BF16}) {
        const size_t es = fsdp_dtype_size(dt);
        llama_cuda_weights cw;
        ASSERT_EQ(llama_cuda_weights_bind(&c, flat.data(), dt, &cw, &err), 0) << err.msg;
        const char *base = (const char *)flat.data();
        auto off = [&](const float *p) { return (size_t)((const char *)p - base) / 4 * es; };
        auto at = [&](const void *p) { return (size_t)((const char *)p - base); };
        EXPECT_EQ(at(cw.tok_embeddings), off(w.tok_embeddings));
        EXPECT_EQ(at(cw.norm), off(w.norm));
        EXPECT_EQ(at(cw.output), off(w.output));
        ASSERT_EQ(cw.n_layers, 2);
        for (int l = 0; l < 2; l++) {
            const llama_model_layer &a = w.layers[l];
            const llama_cuda_layer &b = cw.layers[l];
            EXPECT_EQ(at(b.wq), off(a.wq));
            EXPECT_EQ(at(b.wk), off(a.wk));
            EXPECT_EQ(at(b.wv), off(a.wv));
            EXPECT_EQ(at(b.wo), off(a.wo));
            EXPECT_EQ(at(b.w1), off(a.w1));
            EXPECT_EQ(at(b.w2), off(a.w2));
            EXPECT_EQ(at(b.w3), off(a.w3));
            EXPECT_EQ(at(b.attention_norm), off(a.attention_norm));
            EXPECT_EQ(at(b.ffn_norm), off(a.ffn_norm));
        }
        llama_cuda_weights_unbind(&cw);
    }
    llama_model_weights_unbind(&w);
    llama_cuda_weights cw;
    EXPECT_EQ(llama_cuda_weights_bind(&c, flat.data(), FSDP_DT_F16, &cw, &err), FSDP_E_INVALID);
    EXPECT_EQ(llama_cuda_ws_create(nullptr, &c, 2, 32, FSDP_DT_F32, &err), nullptr);
    EXPECT_EQ(err.code, FSDP_E_INVALID);
}

class CudaModelGpu : public ::testing::Test {
protected:
    void SetUp() override {
        fsdp_err err;
        fsdp_err_clear(&err);
        int n = 0;
        if (!dev_built_with_cuda() || dev_count(&n, &err) != FSDP_OK || n == 0) GTEST_SKIP() << "no GPU: " << err.msg;
        d = dev_ctx_create(nullptr, &err);
        ASSERT_NE(d, nullptr) << err.msg;
        cfg = tiny_config();
        TensorMap batch = load_st("batch.safetensors");
        tokens = batch["input_ids"].i32;
        labels = batch["labels"].i32;
        ASSERT_EQ(tokens.size(), 64u);
        ASSERT_EQ(llama_train_init(&st, &cfg, 2, 32, &err), 0) << err.msg;
        inited = true;
        TensorMap init = load_st("model_init.safetensors");
        for (int i = 0; i < llama_model_param_count(&cfg); i++) {
            llama_model_param p;
            ASSERT_EQ(llama_model_param_at(&cfg, &st.w, i, &p, &err), 0) << err.msg;
            ASSERT_EQ((int64_t)init.at(p.name).f32.size(), p.numel) << p.name;
            memcpy(p.data, init.at(p.name).f32.data(), p.numel * sizeof(float));
        }
        json_error_t je;
        ref = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
        ASSERT_NE(ref, nullptr) << je.text;
    }
    void TearDown() override {
        fsdp_err err;
        if (d) {
            for (void *p : bufs) dev_free(d, p, &err);
            dev_ctx_free(d);
        }
        if (inited) llama_train_free(&st);
        if (ref) json_decref(ref);
    }
    void *alloc(size_t bytes) {
        void *p = nullptr;
        fsdp_err err;
        EXPECT_EQ(dev_alloc(d, bytes, &p, &err), 0) << err.msg;
        bufs.push_back(p);
        return p;
    }
    // The weights on the device in dtype dt.
    void *upload_params(fsdp_dtype dt) {
        const size_t n = (size_t)st.numel, es = fsdp_dtype_size(dt);
        std::vector<unsigned char> host(n * es);
        fsdp_err err;
        EXPECT_EQ(fsdp_convert(host.data(), dt, st.params, FSDP_DT_F32, n, &err), 0);
        void *p = alloc(host.size());
        EXPECT_EQ(dev_upload(d, p, host.data(), host.size(), &err), 0) << err.msg;
        return p;
    }
    std::vector<float> download_f32(const void *p, size_t n, fsdp_dtype dt) {
        std::vector<unsigned char> host(n * fsdp_dtype_size(dt));
        std::vector<float> out(n);
        fsdp_err err;
        EXPECT_EQ(dev_download(d, host.data(), p, host.size(), &err), 0) << err.msg;
        EXPECT_EQ(fsdp_convert(out.data(), FSDP_DT_F32, host.data(), dt, n, &err), 0);
        return out;
    }
    double ref_step0(const char *key) {
        return json_number_value(json_object_get(json_array_get(json_object_get(ref, "steps"), 0), key));
    }
    // Worst per-parameter max|a - b| / max|b| between gradient layouts a (GPU) and b.
    double worst_rel(const std::vector<float> &a, const float *b, std::string *name) {
        llama_model_weights wa, wb;
        fsdp_err err;
        std::vector<float> ca(a);
        EXPECT_EQ(llama_model_weights_bind(&cfg, ca.data(), &wa, &err), 0);
        EXPECT_EQ(llama_model_weights_bind(&cfg, const_cast<float *>(b), &wb, &err), 0);
        double worst = 0;
        for (int i = 0; i < llama_model_param_count(&cfg); i++) {
            llama_model_param pa, pb;
            EXPECT_EQ(llama_model_param_at(&cfg, &wa, i, &pa, &err), 0);
            EXPECT_EQ(llama_model_param_at(&cfg, &wb, i, &pb, &err), 0);
            double mx = 0, diff = 0;
            for (int64_t k = 0; k < pa.numel; k++) {
                mx = std::max(mx, (double)std::fabs(pb.data[k]));
                diff = std::max(diff, (double)std::fabs(pa.data[k] - pb.data[k]));
            }
            double rel = mx > 0 ? diff / mx : diff;
            if (rel > worst) {
                worst = rel;
                *name = pa.name;
            }
        }
        llama_model_weights_unbind(&wa);
        llama_model_weights_unbind(&wb);
        return worst;
    }

    dev_ctx *d = nullptr;
    llama_config cfg;
    std::vector<int32_t> tokens, labels;
    llama_train_state st;
    bool inited = false;
    json_t *ref = nullptr;
    std::vector<void *> bufs;
};

TEST_F(CudaModelGpu, Float32MatchesTheCpuModelAndPyTorch) {
    fsdp_err err;
    const size_t n = (size_t)st.numel;
    // CPU model
    llama_model_loss cpu_loss;
    ASSERT_EQ(llama_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &cpu_loss, &err), 0) << err.msg;
    std::vector<float> cpu_logits(llama_model_ws_logits(st.ws), llama_model_ws_logits(st.ws) + 64 * 256);
    memset(st.grads, 0, n * sizeof(float));
    ASSERT_EQ(llama_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0) << err.msg;
    // GPU model
    void *dparams = upload_params(FSDP_DT_F32);
    float *dgrads = (float *)alloc(n * sizeof(float));
    ASSERT_EQ(dev_memset0(d, dgrads, n * sizeof(float), DEV_STREAM_COMPUTE, &err), 0) << err.msg;
    llama_cuda_weights w;
    llama_model_weights g;
    ASSERT_EQ(llama_cuda_weights_bind(&cfg, dparams, FSDP_DT_F32, &w, &err), 0) << err.msg;
    ASSERT_EQ(llama_model_weights_bind(&cfg, dgrads, &g, &err), 0) << err.msg;
    llama_cuda_ws *ws = llama_cuda_ws_create(d, &cfg, 2, 32, FSDP_DT_F32, &err);
    ASSERT_NE(ws, nullptr) << err.msg;
    EXPECT_GT(llama_cuda_ws_bytes(ws), 0u);
    // out of order is an error
    EXPECT_EQ(llama_cuda_fwd_layer(&cfg, &w.layers[1], 1, ws, &err), FSDP_E_INVALID);
    llama_model_loss loss;
    ASSERT_EQ(llama_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, &loss, &err), 0) << err.msg;
    EXPECT_EQ(loss.n_valid, cpu_loss.n_valid);
    EXPECT_LT(std::fabs(loss.loss - cpu_loss.loss) / cpu_loss.loss, 1e-5) << loss.loss << " vs " << cpu_loss.loss;
    const double ref_loss = ref_step0("loss");
    EXPECT_LT(std::fabs(loss.loss - ref_loss) / ref_loss, 1e-5) << loss.loss << " vs PyTorch " << ref_loss;
    const void *dlogits = llama_cuda_ws_logits(ws);
    ASSERT_NE(dlogits, nullptr);
    auto logits = download_f32(dlogits, 64 * 256, FSDP_DT_F32);
    double mx = 0, diff = 0;
    for (size_t i = 0; i < logits.size(); i++) {
        mx = std::max(mx, (double)std::fabs(cpu_logits[i]));
        diff = std::max(diff, (double)std::fabs(logits[i] - cpu_logits[i]));
    }
    EXPECT_LT(diff / mx, 1e-5);
    ASSERT_EQ(llama_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
    EXPECT_EQ(llama_cuda_ws_logits(ws), nullptr);
    auto grads = download_f32(dgrads, n, FSDP_DT_F32);
    std::string name;
    EXPECT_LT(worst_rel(grads, st.grads, &name), 1e-4) << "worst gradient vs the CPU model: " << name;
    TensorMap pt = load_st("grads_step0.safetensors");
    std::vector<float> pt_flat(n);
    llama_model_weights pw;
    ASSERT_EQ(llama_model_weights_bind(&cfg, pt_flat.data(), &pw, &err), 0);
    for (int i = 0; i < llama_model_param_count(&cfg); i++) {
        llama_model_param p;
        ASSERT_EQ(llama_model_param_at(&cfg, &pw, i, &p, &err), 0);
        memcpy(p.data, pt.at(p.name).f32.data(), p.numel * sizeof(float));
    }
    llama_model_weights_unbind(&pw);
    EXPECT_LT(worst_rel(grads, pt_flat.data(), &name), 1e-4) << "worst gradient vs PyTorch: " << name;
    // a second micro-batch accumulates: the gradients double
    ASSERT_EQ(llama_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, nullptr, &err), 0) << err.msg;
    ASSERT_EQ(llama_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
    auto twice = download_f32(dgrads, n, FSDP_DT_F32);
    for (auto &x : grads) x *= 2.0f;
    EXPECT_LT(worst_rel(twice, grads.data(), &name), 1e-5) << name;
    // bad ids are errors before anything runs
    std::vector<int32_t> bad(tokens);
    bad[3] = 256;
    EXPECT_EQ(llama_cuda_model_forward(&cfg, &w, bad.data(), labels.data(), 2, 32, ws, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "input_ids: token 3 is 256"), nullptr) << err.msg;
    llama_cuda_ws_free(ws);
    llama_cuda_weights_unbind(&w);
    llama_model_weights_unbind(&g);
}

TEST_F(CudaModelGpu, Bfloat16IsCloseToFloat32) {
    fsdp_err err;
    const size_t n = (size_t)st.numel;
    llama_model_loss cpu_loss;
    ASSERT_EQ(llama_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &cpu_loss, &err), 0) << err.msg;
    memset(st.grads, 0, n * sizeof(float));
    ASSERT_EQ(llama_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0) << err.msg;
    void *dparams = upload_params(FSDP_DT_BF16);
    float *dgrads = (float *)alloc(n * sizeof(float));
    ASSERT_EQ(dev_memset0(d, dgrads, n * sizeof(float), DEV_STREAM_COMPUTE, &err), 0) << err.msg;
    llama_cuda_weights w;
    llama_model_weights g;
    ASSERT_EQ(llama_cuda_weights_bind(&cfg, dparams, FSDP_DT_BF16, &w, &err), 0) << err.msg;
    ASSERT_EQ(llama_model_weights_bind(&cfg, dgrads, &g, &err), 0) << err.msg;
    llama_cuda_ws *ws = llama_cuda_ws_create(d, &cfg, 2, 32, FSDP_DT_BF16, &err);
    ASSERT_NE(ws, nullptr) << err.msg;
    EXPECT_EQ(llama_cuda_ws_dtype(ws), FSDP_DT_BF16);
    llama_model_loss loss;
    ASSERT_EQ(llama_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, &loss, &err), 0) << err.msg;
    EXPECT_LT(std::fabs(loss.loss - cpu_loss.loss) / cpu_loss.loss, 2e-2) << loss.loss << " vs " << cpu_loss.loss;
    ASSERT_EQ(llama_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
    auto grads = download_f32(dgrads, n, FSDP_DT_F32);
    std::string name;
    EXPECT_LT(worst_rel(grads, st.grads, &name), 1e-1) << "worst bf16 gradient: " << name;
    llama_cuda_ws_free(ws);
    llama_cuda_weights_unbind(&w);
    llama_model_weights_unbind(&g);
}

} // namespace
