// Llama forward/backward/training against the PyTorch fixture (torch-2.11/tiny).
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "decoder/decoder_model.h"
#include "decoder/decoder_single.h"
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
    c.ffn_dim_multiplier = 0.0;
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

struct Reference {
    json_t *root = nullptr;
    ~Reference() {
        if (root) json_decref(root);
    }
    double num(const char *key) const { return json_number_value(json_object_get(root, key)); }
    double step(int i, const char *key) const {
        return json_number_value(json_object_get(json_array_get(json_object_get(root, "steps"), i), key));
    }
};

void load_reference(Reference *r) {
    json_error_t e;
    r->root = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &e);
    ASSERT_TRUE(r->root != nullptr) << e.text;
}

// Copies every fixture tensor into the weights, checking names and shapes.
void fill_weights(const decoder_config &c, decoder_model_weights *w, const TensorMap &m, const char *suffix = "") {
    int n = decoder_model_param_count(&c);
    ASSERT_EQ(n, 21);
    for (int i = 0; i < n; i++) {
        decoder_model_param p;
        fsdp_err err;
        ASSERT_EQ(decoder_model_param_at(&c, w, i, &p, &err), 0) << err.msg;
        auto it = m.find(std::string(p.name) + suffix);
        ASSERT_NE(it, m.end()) << p.name;
        ASSERT_EQ((int)it->second.shape.size(), p.ndim) << p.name;
        for (int d = 0; d < p.ndim; d++) ASSERT_EQ(it->second.shape[d], p.shape[d]) << p.name;
        ASSERT_EQ((int64_t)it->second.f32.size(), p.numel);
        memcpy(p.data, it->second.f32.data(), p.numel * sizeof(float));
    }
}

// max |a - ref| / max |ref| for every parameter; returns the worst and its name.
double worst_rel(const decoder_config &c, const decoder_model_weights *w, const TensorMap &m, std::string *worst_name,
                 const char *suffix = "") {
    double worst = 0.0;
    for (int i = 0; i < decoder_model_param_count(&c); i++) {
        decoder_model_param p;
        fsdp_err err;
        EXPECT_EQ(decoder_model_param_at(&c, w, i, &p, &err), 0);
        const st_test::Tensor &ref = m.at(std::string(p.name) + suffix);
        double mx = 0.0, diff = 0.0;
        for (int64_t k = 0; k < p.numel; k++) {
            mx = std::max(mx, (double)std::fabs(ref.f32[k]));
            diff = std::max(diff, (double)std::fabs(p.data[k] - ref.f32[k]));
        }
        double rel = mx > 0 ? diff / mx : diff;
        if (rel > worst) {
            worst = rel;
            *worst_name = p.name;
        }
    }
    return worst;
}

class LlamaModelTest : public ::testing::Test {
protected:
    void SetUp() override {
        cfg = tiny_config();
        TensorMap batch = load_st("batch.safetensors");
        ASSERT_EQ(batch.count("input_ids"), 1u);
        tokens = batch["input_ids"].i32;
        labels = batch["labels"].i32;
        ASSERT_EQ(tokens.size(), 64u);
        ASSERT_EQ(labels.size(), 64u);
        fsdp_err err;
        ASSERT_EQ(decoder_single_init(&st, &cfg, 2, 32, &err), 0) << err.msg;
        init = load_st("model_init.safetensors");
        fill_weights(cfg, &st.w, init);
        load_reference(&ref);
    }
    void TearDown() override { decoder_single_free(&st); }

    decoder_config cfg;
    std::vector<int32_t> tokens, labels;
    decoder_single_state st;
    TensorMap init;
    Reference ref;
};

TEST_F(LlamaModelTest, Step0LossLogitsAndGradients) {
    fsdp_err err;
    decoder_model_loss loss;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &loss, &err), 0) << err.msg;
    EXPECT_EQ(loss.n_valid, 64);
    double ref_loss = ref.step(0, "loss");
    EXPECT_LT(std::fabs(loss.loss - ref_loss) / ref_loss, 1e-5) << loss.loss << " vs " << ref_loss;
    const float *logits = decoder_model_ws_logits(st.ws);
    ASSERT_NE(logits, nullptr);
    double sum = 0.0;
    for (int i = 0; i < 64 * 256; i++) sum += logits[i];
    double ref_sum = ref.num("logits_step0_sum");
    // 16384 logits of size ~1 rounded to float32 (observed difference ~5e-6).
    EXPECT_NEAR(sum, ref_sum, 1e-4) << "logits sum";

    memset(st.grads, 0, st.numel * sizeof(float));
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0) << err.msg;
    EXPECT_EQ(decoder_model_ws_logits(st.ws), nullptr);
    TensorMap grads = load_st("grads_step0.safetensors");
    std::string name;
    double worst = worst_rel(cfg, &st.g, grads, &name);
    EXPECT_LT(worst, 1e-4) << "worst gradient " << name;
    double gn = std::sqrt(kc_sumsq(st.grads, st.numel));
    EXPECT_LT(std::fabs(gn - ref.step(0, "grad_norm")) / ref.step(0, "grad_norm"), 1e-4);
}

TEST_F(LlamaModelTest, FiveAdamWStepsMatchPyTorch) {
    decoder_single_hparams hp = {0.9, 0.95, 1e-8, 0.1, 1.0};
    fsdp_err err;
    for (int s = 0; s < 5; s++) {
        decoder_single_result r;
        ASSERT_EQ(decoder_single_step(&st, tokens.data(), labels.data(), 2, 32, ref.step(s, "lr"), &hp, &r, &err), 0)
            << err.msg;
        double rl = ref.step(s, "loss"), rg = ref.step(s, "grad_norm");
        EXPECT_LT(std::fabs(r.loss - rl) / rl, 1e-5) << "step " << s << ": " << r.loss << " vs " << rl;
        EXPECT_LT(std::fabs(r.grad_norm - rg) / rg, 1e-4) << "step " << s << ": " << r.grad_norm << " vs " << rg;
        EXPECT_NEAR(r.clip_coef, 1.0 / (rg + 1e-6), 1e-4);  // every reference norm is > 1: clipped
    }
    EXPECT_EQ(st.step, 5);
    std::string name;
    TensorMap final_w = load_st("model_step5.safetensors");
    EXPECT_LT(worst_rel(cfg, &st.w, final_w, &name), 1e-4) << "worst weight " << name;
    TensorMap adam = load_st("adam_step5.safetensors");
    EXPECT_LT(worst_rel(cfg, &st.m, adam, &name, ".exp_avg"), 1e-4) << "worst exp_avg " << name;
    EXPECT_LT(worst_rel(cfg, &st.v, adam, &name, ".exp_avg_sq"), 1e-4) << "worst exp_avg_sq " << name;
    decoder_model_loss after;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &after, &err), 0);
    double ra = ref.num("loss_after");
    EXPECT_LT(std::fabs(after.loss - ra) / ra, 1e-5) << after.loss << " vs " << ra;
}

// FSDP-style use: each layer's weights copied into a temporary buffer right before its forward and
// backward, gradients into per-layer buffers; the result must equal the whole-model call bit for bit.
TEST_F(LlamaModelTest, LayerByLayerMatchesWholeModel) {
    fsdp_err err;
    memset(st.grads, 0, st.numel * sizeof(float));
    decoder_model_loss whole;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &whole, &err), 0);
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0);
    std::vector<float> expect(st.grads, st.grads + st.numel);

    decoder_model_ws *ws = decoder_model_ws_create(&cfg, 2, 32, &err);
    ASSERT_NE(ws, nullptr) << err.msg;
    int64_t ln = decoder_model_layer_numel(&cfg, 0);
    std::vector<float> gathered(ln), lgrad(ln * cfg.n_layers, 0.0f);
    std::vector<float> dtok((size_t)cfg.vocab_size * cfg.dim, 0.0f), dnorm(cfg.dim, 0.0f),
        dout((size_t)cfg.vocab_size * cfg.dim, 0.0f);
    decoder_model_layer lw, lg;
    ASSERT_EQ(decoder_fwd_embed(&cfg, st.w.tok_embeddings, tokens.data(), labels.data(), 2, 32, ws, &err), 0);
    for (int l = 0; l < cfg.n_layers; l++) {
        memcpy(gathered.data(), st.w.layers[l].wq, ln * sizeof(float));
        decoder_model_layer_bind(&cfg, l, gathered.data(), &lw);
        ASSERT_EQ(decoder_fwd_layer(&cfg, &lw, l, ws, &err), 0) << err.msg;
        std::fill(gathered.begin(), gathered.end(), NAN);  // "resharded"
    }
    decoder_model_loss piecewise;
    ASSERT_EQ(decoder_fwd_head(&cfg, st.w.norm, st.w.output, ws, &piecewise, &err), 0);
    EXPECT_EQ(piecewise.loss, whole.loss);
    ASSERT_EQ(decoder_bwd_head(&cfg, st.w.norm, st.w.output, dnorm.data(), dout.data(), 0.0, ws, &err), 0);
    for (int l = cfg.n_layers - 1; l >= 0; l--) {
        memcpy(gathered.data(), st.w.layers[l].wq, ln * sizeof(float));
        decoder_model_layer_bind(&cfg, l, gathered.data(), &lw);
        decoder_model_layer_bind(&cfg, l, lgrad.data() + l * ln, &lg);
        ASSERT_EQ(decoder_bwd_layer(&cfg, &lw, &lg, l, ws, &err), 0) << err.msg;
    }
    ASSERT_EQ(decoder_bwd_embed(&cfg, dtok.data(), ws, &err), 0);
    decoder_model_ws_free(ws);

    std::vector<float> got;
    got.insert(got.end(), dtok.begin(), dtok.end());
    got.insert(got.end(), lgrad.begin(), lgrad.end());
    got.insert(got.end(), dnorm.begin(), dnorm.end());
    got.insert(got.end(), dout.begin(), dout.end());
    ASSERT_EQ((int64_t)got.size(), st.numel);
    EXPECT_EQ(0, memcmp(got.data(), expect.data(), got.size() * sizeof(float)));
}

// The output head in chunks (the CPU path proves the chunked math the GPU path runs): the
// whole-model forward (loss only) + backward (logits again per chunk) and the one-pass training head
// equal the unchunked head to rounding (only the order of the d_output and loss sums changes), one
// chunk of the whole batch exactly, and still match PyTorch; the workspace holds one chunk of logits.
TEST_F(LlamaModelTest, ChunkedHeadMatchesTheWholeBatchHead) {
    fsdp_err err;
    memset(st.grads, 0, st.numel * sizeof(float));
    decoder_model_loss whole;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, &whole, &err), 0);
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0);
    const std::vector<float> expect(st.grads, st.grads + st.numel);
    double gmax = 0;
    for (float x : expect) gmax = std::max(gmax, (double)std::fabs(x));
    const size_t full_bytes = decoder_model_ws_bytes(st.ws);
    const TensorMap pt = load_st("grads_step0.safetensors");
    for (int chunk : {5, 1000}) {
        decoder_model_ws_opts o = {chunk % 2, chunk}; // with (5 rows: 13 chunks) and without checkpointing
        decoder_model_ws *ws = decoder_model_ws_create_opts(&cfg, 2, 32, &o, &err);
        ASSERT_NE(ws, nullptr) << err.msg;
        const int rows = std::min(chunk, 64);
        EXPECT_EQ(decoder_model_ws_head_chunk(ws), rows);
        if (!o.ac) {
            EXPECT_EQ(full_bytes - decoder_model_ws_bytes(ws), (size_t)(64 - rows) * 256 * sizeof(float)) << chunk;
        }
        for (int one_pass : {0, 1, 2}) {
            memset(st.grads, 0, st.numel * sizeof(float));
            decoder_model_loss loss;
            if (one_pass == 2) {
                ASSERT_EQ(decoder_model_forward_backward(&cfg, &st.w, &st.g, tokens.data(), labels.data(), 2, 32, 0.0, ws,
                                                       &loss, &err),
                          0)
                    << err.msg;
            } else if (!one_pass) {
                ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, ws, &loss, &err), 0);
                EXPECT_EQ(decoder_model_ws_logits(ws) != nullptr, rows == 64) << chunk;
                ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, ws, &err), 0);
            } else {
                ASSERT_EQ(decoder_fwd_embed(&cfg, st.w.tok_embeddings, tokens.data(), labels.data(), 2, 32, ws, &err), 0);
                for (int l = 0; l < cfg.n_layers; l++) ASSERT_EQ(decoder_fwd_layer(&cfg, &st.w.layers[l], l, ws, &err), 0);
                ASSERT_EQ(decoder_head_train(&cfg, st.w.norm, st.w.output, st.g.norm, st.g.output, 0.0, ws, &loss, &err),
                          0)
                    << err.msg;
                EXPECT_EQ(decoder_model_ws_logits(ws), nullptr);
                for (int l = cfg.n_layers - 1; l >= 0; l--)
                    ASSERT_EQ(decoder_bwd_layer(&cfg, &st.w.layers[l], &st.g.layers[l], l, ws, &err), 0) << err.msg;
                ASSERT_EQ(decoder_bwd_embed(&cfg, st.g.tok_embeddings, ws, &err), 0);
            }
            EXPECT_EQ(loss.n_valid, whole.n_valid);
            // a GEMM over fewer rows may round the logits differently (about 1e-9 here)
            EXPECT_LE(std::fabs(loss.loss - whole.loss), 1e-7 * whole.loss) << chunk << " one pass " << one_pass;
            if (rows == 64) {
                EXPECT_EQ(loss.loss, whole.loss);
                EXPECT_EQ(0, memcmp(st.grads, expect.data(), expect.size() * sizeof(float))) << chunk;
            }
            double worst = 0;
            for (int64_t i = 0; i < st.numel; i++) worst = std::max(worst, (double)std::fabs(st.grads[i] - expect[i]));
            EXPECT_LE(worst, 1e-6 * gmax) << chunk << " one pass " << one_pass;
            EXPECT_LT(std::fabs(loss.loss - ref.step(0, "loss")) / ref.step(0, "loss"), 1e-5);
            std::string name;
            EXPECT_LT(worst_rel(cfg, &st.g, pt, &name), 1e-4) << "worst gradient " << name;
        }
        // a bad label names its row in the batch, not in its chunk
        std::vector<int32_t> bad(labels);
        bad[37] = 256;
        EXPECT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), bad.data(), 2, 32, ws, nullptr, &err), FSDP_E_INVALID);
        EXPECT_NE(std::string(err.msg).find("label 37 is 256"), std::string::npos) << err.msg;
        decoder_model_ws_free(ws);
    }
    decoder_model_ws_opts neg = {0, -1};
    EXPECT_EQ(decoder_model_ws_create_opts(&cfg, 2, 32, &neg, &err), nullptr);
    EXPECT_NE(std::string(err.msg).find("head_chunk_rows is -1"), std::string::npos) << err.msg;
    // automatic: 256 MiB of logits (llama3_1b's vocabulary: 523 f32 rows, 1046 bf16 rows), at most the batch
    decoder_config big = cfg;
    big.vocab_size = 128256;
    EXPECT_EQ(decoder_head_chunk_resolve(&big, 8192, 0, 4), 523);
    EXPECT_EQ(decoder_head_chunk_resolve(&big, 8192, 0, 2), 1046);
    EXPECT_EQ(decoder_head_chunk_resolve(&big, 100, 0, 2), 100);
    EXPECT_EQ(decoder_head_chunk_resolve(&big, 100, 7, 2), 7);
}

TEST_F(LlamaModelTest, GradientsAccumulateAndLossDenominatorScales) {
    fsdp_err err;
    memset(st.grads, 0, st.numel * sizeof(float));
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, nullptr, &err), 0);
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0);
    std::vector<float> once(st.grads, st.grads + st.numel);
    // A second micro-batch with the global denominator 128 (= 2 x 64 tokens) adds half a gradient.
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, st.ws, nullptr, &err), 0);
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 128.0, st.ws, &err), 0);
    double worst = 0.0, mx = 0.0;
    for (int64_t i = 0; i < st.numel; i++) {
        mx = std::max(mx, (double)std::fabs(once[i]));
        worst = std::max(worst, (double)std::fabs(st.grads[i] - 1.5f * once[i]));
    }
    EXPECT_LT(worst / mx, 1e-6);
}

// Tokens labelled -100 leave the mean; the loss equals the mean of the kept tokens' cross-entropy
// computed in double from the logits.
TEST_F(LlamaModelTest, IgnoreIndexExcludesTokens) {
    fsdp_err err;
    std::vector<int32_t> lab = labels;
    for (int i = 0; i < 64; i += 3) lab[i] = -100;
    decoder_model_loss loss;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), lab.data(), 2, 32, st.ws, &loss, &err), 0);
    const float *logits = decoder_model_ws_logits(st.ws);
    double sum = 0.0;
    int kept = 0;
    for (int i = 0; i < 64; i++) {
        if (lab[i] == -100) continue;
        const float *x = logits + i * 256;
        double mx = x[0], s = 0.0;
        for (int j = 1; j < 256; j++) mx = std::max(mx, (double)x[j]);
        for (int j = 0; j < 256; j++) s += std::exp(x[j] - mx);
        sum += mx + std::log(s) - x[lab[i]];
        kept++;
    }
    EXPECT_EQ(loss.n_valid, kept);
    EXPECT_NEAR(loss.loss, sum / kept, 1e-6);
    // The ignored tokens contribute nothing: changing their label (to another ignored one) changes nothing,
    // and the gradients through the output layer rows are those of the kept tokens only.
    memset(st.grads, 0, st.numel * sizeof(float));
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, st.ws, &err), 0);
    double gsum = kc_sumsq(st.grads, st.numel);
    EXPECT_TRUE(std::isfinite(gsum));
    EXPECT_GT(gsum, 0.0);
}

// The timing hook sees every GEMM of a step: at least the 6 * (non-embedding params) * tokens of the
// linear layers' forward and backward, and nothing once it is turned off.
TEST_F(LlamaModelTest, GemmTimingHookCountsTheStep) {
    kc_stats stats;
    kc_stats_reset(&stats);
    decoder_single_set_stats(&st, &stats);
    decoder_single_hparams hp = {0.9, 0.95, 1e-8, 0.1, 1.0};
    fsdp_err err;
    ASSERT_EQ(decoder_single_step(&st, tokens.data(), labels.data(), 2, 32, 1e-3, &hp, nullptr, &err), 0) << err.msg;
    double linear = 6.0 * (double)(st.numel - 256 * 64) * 64;
    EXPECT_GE(stats.gemm_flops, linear);
    EXPECT_LT(stats.gemm_flops, 1.5 * linear);  // + attention scores, small at T = 32
    EXPECT_GT(stats.gemm_calls, 0u);
    EXPECT_GT(stats.gemm_seconds, 0.0);
    uint64_t calls = stats.gemm_calls;
    decoder_single_set_stats(&st, nullptr);
    ASSERT_EQ(decoder_single_step(&st, tokens.data(), labels.data(), 2, 32, 1e-3, &hp, nullptr, &err), 0);
    EXPECT_EQ(stats.gemm_calls, calls);
}

// A smaller batch in a larger workspace gives the same result as in a workspace of its own size.
TEST_F(LlamaModelTest, SmallerBatchInLargerWorkspace) {
    fsdp_err err;
    decoder_model_loss a, b;
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 1, 16, st.ws, &a, &err), 0);
    std::vector<int32_t> t16(tokens.begin(), tokens.begin() + 16), l16(labels.begin(), labels.begin() + 16);
    decoder_model_ws *ws = decoder_model_ws_create(&cfg, 1, 16, &err);
    ASSERT_NE(ws, nullptr);
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, t16.data(), l16.data(), 1, 16, ws, &b, &err), 0);
    EXPECT_EQ(a.n_valid, 16);
    EXPECT_EQ(a.loss, b.loss);
    decoder_model_ws_free(ws);
}

TEST_F(LlamaModelTest, BadInputsAreErrors) {
    fsdp_err err;
    std::vector<int32_t> bad = tokens;
    bad[5] = 256;
    EXPECT_EQ(decoder_model_forward(&cfg, &st.w, bad.data(), labels.data(), 2, 32, st.ws, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("token 5 is 256"), std::string::npos) << err.msg;
    bad = labels;
    bad[7] = -1;
    EXPECT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), bad.data(), 2, 32, st.ws, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("label 7 is -1"), std::string::npos) << err.msg;
    EXPECT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 3, 32, st.ws, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 33, st.ws, nullptr, &err),
              FSDP_E_INVALID);
    // Out of order: backward with no forward, a layer before the embedding, backward twice.
    decoder_model_ws *ws = decoder_model_ws_create(&cfg, 2, 32, &err);
    ASSERT_NE(ws, nullptr);
    EXPECT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, ws, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_fwd_layer(&cfg, &st.w.layers[0], 0, ws, &err), FSDP_E_INVALID);
    ASSERT_EQ(decoder_fwd_embed(&cfg, st.w.tok_embeddings, tokens.data(), labels.data(), 2, 32, ws, &err), 0);
    EXPECT_EQ(decoder_fwd_layer(&cfg, &st.w.layers[1], 1, ws, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("out of order"), std::string::npos) << err.msg;
    EXPECT_EQ(decoder_fwd_head(&cfg, st.w.norm, st.w.output, ws, nullptr, &err), FSDP_E_INVALID);
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), labels.data(), 2, 32, ws, nullptr, &err), 0);
    ASSERT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, ws, &err), 0);
    EXPECT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, ws, &err), FSDP_E_INVALID);
    // Forward without labels: logits only, no backward.
    ASSERT_EQ(decoder_model_forward(&cfg, &st.w, tokens.data(), nullptr, 2, 32, ws, nullptr, &err), 0);
    EXPECT_NE(decoder_model_ws_logits(ws), nullptr);
    EXPECT_EQ(decoder_model_backward(&cfg, &st.w, &st.g, 0.0, ws, &err), FSDP_E_INVALID);
    // A workspace made for another config is refused.
    decoder_config other = cfg;
    other.ffn_hidden = 128;
    EXPECT_EQ(decoder_model_forward(&other, &st.w, tokens.data(), labels.data(), 2, 32, ws, nullptr, &err),
              FSDP_E_INVALID);
    decoder_model_ws_free(ws);
    // Non-finite weights stop the training step before any update.
    std::vector<float> before(st.params, st.params + st.numel);
    st.w.layers[0].wq[3] = NAN;
    before[st.w.layers[0].wq + 3 - st.params] = NAN;
    decoder_single_hparams hp = {0.9, 0.95, 1e-8, 0.1, 1.0};
    EXPECT_EQ(decoder_single_step(&st, tokens.data(), labels.data(), 2, 32, 1e-3, &hp, nullptr, &err), FSDP_E_NUMERIC);
    EXPECT_EQ(st.step, 0);
    EXPECT_EQ(0, memcmp(before.data(), st.params, st.numel * sizeof(float)));
}

TEST(LlamaModelConfig, ChecksAndLayout) {
    decoder_config c = tiny_config();
    fsdp_err err;
    EXPECT_EQ(decoder_model_check(&c, &err), 0);
    // torchtitan's tiny model: 2*256*64 + 2*(64*64*2 + 32*64*2 + 3*192*64 + 2*64) + 64
    EXPECT_EQ(decoder_model_numel(&c), 2 * 256 * 64 + 2 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 192 * 64 + 2 * 64) + 64);
    decoder_config bad = c;
    bad.n_kv_heads = 3;
    EXPECT_EQ(decoder_model_check(&bad, &err), FSDP_E_INVALID);
    bad = c;
    bad.head_dim = 0;
    EXPECT_EQ(decoder_model_check(&bad, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("finalized"), std::string::npos);
    bad = c;
    bad.norm_eps = 0;
    EXPECT_EQ(decoder_model_check(&bad, &err), FSDP_E_INVALID);
    bad = c;
    bad.rope_scaling = DECODER_ROPE_LLAMA3;
    bad.rope_factor = 8;
    bad.rope_low_freq_factor = 1;
    bad.rope_high_freq_factor = 1;
    bad.rope_original_max_pos = 8192;
    EXPECT_EQ(decoder_model_check(&bad, &err), FSDP_E_INVALID);
    bad = c;
    bad.ffn_hidden = 2000000000;  // 3 * F * d overflows int64
    bad.dim = 2000000000;
    EXPECT_EQ(decoder_model_check(&bad, &err), FSDP_E_INVALID);
    EXPECT_EQ(decoder_model_ws_create(&c, 0, 32, &err), nullptr);
    EXPECT_EQ(decoder_model_ws_create(&c, 1 << 20, 1 << 20, &err), nullptr);

    // Layout: names in torchtitan order, contiguous, covering numel exactly.
    std::vector<float> flat(decoder_model_numel(&c));
    decoder_model_weights w;
    ASSERT_EQ(decoder_model_weights_bind(&c, flat.data(), &w, &err), 0);
    const char *expect[] = {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.attention.wk.weight",
                            "layers.0.attention.wv.weight", "layers.0.attention.wo.weight",
                            "layers.0.feed_forward.w1.weight", "layers.0.feed_forward.w2.weight",
                            "layers.0.feed_forward.w3.weight", "layers.0.attention_norm.weight",
                            "layers.0.ffn_norm.weight"};
    float *next = flat.data();
    for (int i = 0; i < decoder_model_param_count(&c); i++) {
        decoder_model_param p;
        ASSERT_EQ(decoder_model_param_at(&c, &w, i, &p, &err), 0);
        if (i < 10) {
            EXPECT_STREQ(p.name, expect[i]);
        }
        EXPECT_EQ(p.data, next) << p.name;
        next += p.numel;
    }
    EXPECT_EQ(next, flat.data() + flat.size());
    decoder_model_param p;
    ASSERT_EQ(decoder_model_param_at(&c, &w, 20, &p, &err), 0);
    EXPECT_STREQ(p.name, "output.weight");
    EXPECT_EQ(p.shape[0], 256);
    EXPECT_EQ(decoder_model_param_at(&c, &w, 21, &p, &err), FSDP_E_INVALID);
    EXPECT_EQ(w.layers[1].wq - w.layers[0].wq, decoder_model_layer_numel(&c, 0));
    decoder_model_weights_unbind(&w);
}

}  // namespace
