// The GPU Llama (decoder/decoder_cuda.h) on the tiny fixture against the CPU model and PyTorch's
// step-0 loss and gradients; the weight binding against the CPU layout (runs without a GPU).
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "decoder/decoder_cuda.h"
#include "decoder/decoder_single.h"
#include "runtime/device.h"
#include "st_test_reader.h"
#include "test_util.h"

namespace {

decoder_config tiny_config() {
    decoder_config c;
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
    c.rope_scaling = DECODER_ROPE_NONE;
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
    decoder_config c = tiny_config();
    fsdp_err err;
    const int64_t numel = decoder_model_numel(&c);
    ASSERT_GT(numel, 0);
    std::vector<float> flat(numel);
    decoder_model_weights w;
    ASSERT_EQ(decoder_model_weights_bind(&c, flat.data(), &w, &err), 0) << err.msg;
    for (fsdp_dtype dt : {FSDP_DT_F32, FSDP_DT_BF16}) {
        const size_t es = fsdp_dtype_size(dt);
        decoder_cuda_weights cw;
        ASSERT_EQ(decoder_cuda_weights_bind(&c, flat.data(), dt, &cw, &err), 0) << err.msg;
        const char *base = (const char *)flat.data();
        auto off = [&](const float *p) { return (size_t)((const char *)p - base) / 4 * es; };
        auto at = [&](const void *p) { return (size_t)((const char *)p - base); };
        EXPECT_EQ(at(cw.tok_embeddings), off(w.tok_embeddings));
        EXPECT_EQ(at(cw.norm), off(w.norm));
        EXPECT_EQ(at(cw.output), off(w.output));
        ASSERT_EQ(cw.n_layers, 2);
        for (int l = 0; l < 2; l++) {
            const decoder_model_layer &a = w.layers[l];
            const decoder_cuda_layer &b = cw.layers[l];
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
        decoder_cuda_weights_unbind(&cw);
    }
    decoder_model_weights_unbind(&w);
    decoder_cuda_weights cw;
    EXPECT_EQ(decoder_cuda_weights_bind(&c, flat.data(), FSDP_DT_F16, &cw, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_cuda_ws_create(nullptr, &c, 2, 32, FSDP_DT_F32, &err), nullptr);
    EXPECT_EQ(err.code, FSDP_E_INVALID);
}

// The workspace holds one chunk of output-head logits: for llama3_1b at B=4, T=2048 in bf16 the
// whole batch's logits would be 2.1 GB; the automatic chunk keeps at most 256 MiB of them. Sizes
// from the layout itself (decoder_cuda_ws_plan_bytes, no device needed).
TEST(CudaModel, WorkspaceHoldsOneHeadChunkOfLogits) {
    fsdp_err err;
    decoder_config c;
    ASSERT_EQ(decoder_config_preset(&c, "llama3_1b", &err), 0) << err.msg;
    const int B = 4, T = 2048, V = c.vocab_size;
    const size_t es = 2, whole = (size_t)B * T * V * es;
    EXPECT_GT(whole, (size_t)2000 << 20);
    size_t full = 0, chunked = 0, ac_chunked = 0;
    int rows_full = 0, rows = 0;
    decoder_model_ws_opts one = {0, B * T}, aut = {0, 0}, ac = {1, 0};
    ASSERT_EQ(decoder_cuda_ws_plan_bytes(&c, B, T, FSDP_DT_BF16, &one, &full, &rows_full, &err), 0) << err.msg;
    ASSERT_EQ(decoder_cuda_ws_plan_bytes(&c, B, T, FSDP_DT_BF16, &aut, &chunked, &rows, &err), 0) << err.msg;
    ASSERT_EQ(decoder_cuda_ws_plan_bytes(&c, B, T, FSDP_DT_BF16, &ac, &ac_chunked, nullptr, &err), 0) << err.msg;
    EXPECT_EQ(rows_full, B * T);
    EXPECT_EQ(rows, (int)(DECODER_HEAD_CHUNK_BYTES / ((size_t)V * es)));  // 1046 rows
    EXPECT_LE((size_t)rows * V * es, DECODER_HEAD_CHUNK_BYTES);
    EXPECT_GT((size_t)(rows + 1) * V * es, DECODER_HEAD_CHUNK_BYTES);
    // the difference is exactly the logits rows that are no longer held (each carve rounds to 256)
    auto r256 = [](size_t b) { return (b + 255) & ~(size_t)255; };
    EXPECT_EQ(full - chunked, r256(whole) - r256((size_t)rows * V * es));
    EXPECT_LT(ac_chunked, chunked);
    // the tiny model: 5 rows instead of 64, in f32 and bf16
    decoder_config t = tiny_config();
    for (fsdp_dtype dt : {FSDP_DT_F32, FSDP_DT_BF16}) {
        const size_t e = fsdp_dtype_size(dt);
        size_t a = 0, b = 0;
        decoder_model_ws_opts five = {0, 5};
        ASSERT_EQ(decoder_cuda_ws_plan_bytes(&t, 2, 32, dt, nullptr, &a, &rows, &err), 0) << err.msg;
        EXPECT_EQ(rows, 64);
        ASSERT_EQ(decoder_cuda_ws_plan_bytes(&t, 2, 32, dt, &five, &b, &rows, &err), 0) << err.msg;
        EXPECT_EQ(rows, 5);
        EXPECT_EQ(a - b, r256((size_t)64 * t.vocab_size * e) - r256((size_t)5 * t.vocab_size * e));
    }
    decoder_model_ws_opts bad = {0, -3};
    EXPECT_EQ(decoder_cuda_ws_plan_bytes(&t, 2, 32, FSDP_DT_F32, &bad, nullptr, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("head_chunk_rows is -3"), std::string::npos) << err.msg;
    EXPECT_EQ(decoder_cuda_ws_plan_bytes(&t, 2, 32, FSDP_DT_F16, nullptr, nullptr, nullptr, &err), FSDP_E_INVALID);
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
        ASSERT_EQ(decoder_single_init(&st, &cfg, 2, 32, &err), 0) << err.msg;
        inited = true;
        TensorMap init = load_st("model_init.safetensors");
        for (int i = 0; i < decoder_model_param_count(&cfg); i++) {
            decoder_model_param p;
            ASSERT_EQ(decoder_model_param_at(&cfg, &st.w, i, &p, &err), 0) << err.msg;
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
        if (inited) decoder_single_free(&st);
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
        decoder_model_weights wa, wb;
        fsdp_err err;
        std::vector<float> ca(a);
        EXPECT_EQ(decoder_model_weights_bind(&cfg, ca.data(), &wa, &err), 0);
        EXPECT_EQ(decoder_model_weights_bind(&cfg, const_cast<float *>(b), &wb, &err), 0);
        double worst = 0;
        for (int i = 0; i < decoder_model_param_count(&cfg); i++) {
            decoder_model_param pa, pb;
            EXPECT_EQ(decoder_model_param_at(&cfg, &wa, i, &pa, &err), 0);
            EXPECT_EQ(decoder_model_param_at(&cfg, &wb, i, &pb, &err), 0);
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
        decoder_model_weights_unbind(&wa);
        decoder_model_weights_unbind(&wb);
        return worst;
    }

    dev_ctx *d = nullptr;
    decoder_config cfg;
    std::vector<int32_t> tokens, labels;
    decoder_single_state st;
    bool inited = false;
    json_t *ref = nullptr;
    std::vector<void *> bufs;
};

TEST_F(CudaModelGpu, Float32MatchesTheCpuModelAndPyTorch) {
    fsdp_err err;
    const size_t n = (size_t)st.numel;
    // CPU model
    decoder_model_loss cpu_loss;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &cpu_loss, &err), 0) << err.msg;
    std::vector<float> cpu_logits(decoder_model_ws_logits(st.ws), decoder_model_ws_logits(st.ws) + 64 * 256);
    memset(st.grads, 0, n * sizeof(float));
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0) << err.msg;
    // GPU model
    void *dparams = upload_params(FSDP_DT_F32);
    float *dgrads = (float *)alloc(n * sizeof(float));
    ASSERT_EQ(dev_memset0(d, dgrads, n * sizeof(float), DEV_STREAM_COMPUTE, &err), 0) << err.msg;
    decoder_cuda_weights w;
    decoder_model_weights g;
    ASSERT_EQ(decoder_cuda_weights_bind(&cfg, dparams, FSDP_DT_F32, &w, &err), 0) << err.msg;
    ASSERT_EQ(decoder_model_weights_bind(&cfg, dgrads, &g, &err), 0) << err.msg;
    decoder_cuda_ws *ws = decoder_cuda_ws_create(d, &cfg, 2, 32, FSDP_DT_F32, &err);
    ASSERT_NE(ws, nullptr) << err.msg;
    EXPECT_GT(decoder_cuda_ws_bytes(ws), 0u);
    // out of order is an error
    EXPECT_EQ(decoder_cuda_fwd_layer(&cfg, &w.layers[1], 1, ws, &err), FSDP_E_INVALID);
    decoder_model_loss loss;
    ASSERT_EQ(decoder_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, &loss, &err), 0) << err.msg;
    EXPECT_EQ(loss.n_valid, cpu_loss.n_valid);
    EXPECT_LT(std::fabs(loss.loss - cpu_loss.loss) / cpu_loss.loss, 1e-5) << loss.loss << " vs " << cpu_loss.loss;
    const double ref_loss = ref_step0("loss");
    EXPECT_LT(std::fabs(loss.loss - ref_loss) / ref_loss, 1e-5) << loss.loss << " vs PyTorch " << ref_loss;
    const void *dlogits = decoder_cuda_ws_logits(ws);
    ASSERT_NE(dlogits, nullptr);
    auto logits = download_f32(dlogits, 64 * 256, FSDP_DT_F32);
    double mx = 0, diff = 0;
    for (size_t i = 0; i < logits.size(); i++) {
        mx = std::max(mx, (double)std::fabs(cpu_logits[i]));
        diff = std::max(diff, (double)std::fabs(logits[i] - cpu_logits[i]));
    }
    EXPECT_LT(diff / mx, 1e-5);
    ASSERT_EQ(decoder_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
    EXPECT_EQ(decoder_cuda_ws_logits(ws), nullptr);
    auto grads = download_f32(dgrads, n, FSDP_DT_F32);
    std::string name;
    EXPECT_LT(worst_rel(grads, st.grads, &name), 1e-4) << "worst gradient vs the CPU model: " << name;
    TensorMap pt = load_st("grads_step0.safetensors");
    std::vector<float> pt_flat(n);
    decoder_model_weights pw;
    ASSERT_EQ(decoder_model_weights_bind(&cfg, pt_flat.data(), &pw, &err), 0);
    for (int i = 0; i < decoder_model_param_count(&cfg); i++) {
        decoder_model_param p;
        ASSERT_EQ(decoder_model_param_at(&cfg, &pw, i, &p, &err), 0);
        memcpy(p.data, pt.at(p.name).f32.data(), p.numel * sizeof(float));
    }
    decoder_model_weights_unbind(&pw);
    EXPECT_LT(worst_rel(grads, pt_flat.data(), &name), 1e-4) << "worst gradient vs PyTorch: " << name;
    // a second micro-batch accumulates: the gradients double
    ASSERT_EQ(decoder_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, nullptr, &err), 0) << err.msg;
    ASSERT_EQ(decoder_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
    auto twice = download_f32(dgrads, n, FSDP_DT_F32);
    for (auto &x : grads) x *= 2.0f;
    EXPECT_LT(worst_rel(twice, grads.data(), &name), 1e-5) << name;
    // bad ids are errors before anything runs
    std::vector<int32_t> bad(tokens);
    bad[3] = 256;
    EXPECT_EQ(decoder_cuda_model_forward(&cfg, &w, bad.data(), labels.data(), 2, 32, ws, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "input_ids: token 3 is 256"), nullptr) << err.msg;
    decoder_cuda_ws_free(ws);
    decoder_cuda_weights_unbind(&w);
    decoder_model_weights_unbind(&g);
}

// The output head in chunks of 5 rows (the last of the 64 rows partial): the whole-model forward
// (loss only, no logits kept) and backward (logits again per chunk), and the one-pass training head
// (decoder_cuda_head_train), both against the CPU model's unchunked gradients.
TEST_F(CudaModelGpu, ChunkedHeadMatchesTheCpuModel) {
    fsdp_err err;
    const size_t n = (size_t)st.numel;
    decoder_model_loss cpu_loss;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &cpu_loss, &err), 0) << err.msg;
    memset(st.grads, 0, n * sizeof(float));
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0) << err.msg;
    void *dparams = upload_params(FSDP_DT_F32);
    float *dgrads = (float *)alloc(n * sizeof(float));
    decoder_cuda_weights w;
    decoder_model_weights g;
    ASSERT_EQ(decoder_cuda_weights_bind(&cfg, dparams, FSDP_DT_F32, &w, &err), 0) << err.msg;
    ASSERT_EQ(decoder_model_weights_bind(&cfg, dgrads, &g, &err), 0) << err.msg;
    decoder_model_ws_opts five = {0, 5};
    decoder_cuda_ws *ws = decoder_cuda_ws_create_opts(d, &cfg, 2, 32, FSDP_DT_F32, &five, &err);
    ASSERT_NE(ws, nullptr) << err.msg;
    EXPECT_EQ(decoder_cuda_ws_head_chunk(ws), 5);
    size_t planned = 0;
    ASSERT_EQ(decoder_cuda_ws_plan_bytes(&cfg, 2, 32, FSDP_DT_F32, &five, &planned, nullptr, &err), 0);
    EXPECT_EQ(decoder_cuda_ws_bytes(ws), planned);
    std::string name;
    for (bool one_pass : {false, true}) {
        ASSERT_EQ(dev_memset0(d, dgrads, n * sizeof(float), DEV_STREAM_COMPUTE, &err), 0) << err.msg;
        double loss = 0;
        if (!one_pass) {
            decoder_model_loss l;
            ASSERT_EQ(decoder_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, &l, &err), 0)
                << err.msg;
            EXPECT_EQ(decoder_cuda_ws_logits(ws), nullptr); // 64 rows > one chunk: never held
            loss = l.loss;
            ASSERT_EQ(decoder_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
        } else {
            ASSERT_EQ(decoder_cuda_fwd_embed(&cfg, w.tok_embeddings, tokens.data(), labels.data(), 2, 32, ws, &err), 0);
            for (int l = 0; l < cfg.n_layers; l++) ASSERT_EQ(decoder_cuda_fwd_layer(&cfg, &w.layers[l], l, ws, &err), 0);
            ASSERT_EQ(decoder_cuda_head_train(&cfg, w.norm, w.output, g.norm, g.output, 0.0, ws, &err), 0) << err.msg;
            for (int l = cfg.n_layers - 1; l >= 0; l--)
                ASSERT_EQ(decoder_cuda_bwd_layer(&cfg, &w.layers[l], &g.layers[l], l, ws, &err), 0) << err.msg;
            ASSERT_EQ(decoder_cuda_bwd_embed(&cfg, g.tok_embeddings, ws, &err), 0) << err.msg;
            double sums[2];
            ASSERT_EQ(dev_download(d, sums, decoder_cuda_ws_loss_sums(ws), sizeof sums, &err), 0) << err.msg;
            EXPECT_EQ(sums[1], (double)cpu_loss.n_valid);
            loss = sums[0] / sums[1];
        }
        EXPECT_LT(std::fabs(loss - cpu_loss.loss) / cpu_loss.loss, 1e-5) << "one pass " << one_pass;
        auto grads = download_f32(dgrads, n, FSDP_DT_F32);
        EXPECT_LT(worst_rel(grads, st.grads, &name), 1e-4) << "one pass " << one_pass << ": " << name;
    }
    decoder_cuda_ws_free(ws);
    decoder_cuda_weights_unbind(&w);
    decoder_model_weights_unbind(&g);
}

TEST_F(CudaModelGpu, Bfloat16IsCloseToFloat32) {
    fsdp_err err;
    const size_t n = (size_t)st.numel;
    decoder_model_loss cpu_loss;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &cpu_loss, &err), 0) << err.msg;
    memset(st.grads, 0, n * sizeof(float));
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0) << err.msg;
    void *dparams = upload_params(FSDP_DT_BF16);
    float *dgrads = (float *)alloc(n * sizeof(float));
    ASSERT_EQ(dev_memset0(d, dgrads, n * sizeof(float), DEV_STREAM_COMPUTE, &err), 0) << err.msg;
    decoder_cuda_weights w;
    decoder_model_weights g;
    ASSERT_EQ(decoder_cuda_weights_bind(&cfg, dparams, FSDP_DT_BF16, &w, &err), 0) << err.msg;
    ASSERT_EQ(decoder_model_weights_bind(&cfg, dgrads, &g, &err), 0) << err.msg;
    decoder_cuda_ws *ws = decoder_cuda_ws_create(d, &cfg, 2, 32, FSDP_DT_BF16, &err);
    ASSERT_NE(ws, nullptr) << err.msg;
    EXPECT_EQ(decoder_cuda_ws_dtype(ws), FSDP_DT_BF16);
    decoder_model_loss loss;
    ASSERT_EQ(decoder_cuda_model_forward(&cfg, &w, tokens.data(), labels.data(), 2, 32, ws, &loss, &err), 0) << err.msg;
    EXPECT_LT(std::fabs(loss.loss - cpu_loss.loss) / cpu_loss.loss, 2e-2) << loss.loss << " vs " << cpu_loss.loss;
    ASSERT_EQ(decoder_cuda_model_backward(&cfg, &w, &g, 0.0, ws, &err), 0) << err.msg;
    auto grads = download_f32(dgrads, n, FSDP_DT_F32);
    std::string name;
    EXPECT_LT(worst_rel(grads, st.grads, &name), 1e-1) << "worst bf16 gradient: " << name;
    decoder_cuda_ws_free(ws);
    decoder_cuda_weights_unbind(&w);
    decoder_model_weights_unbind(&g);
}

} // namespace
