// The FSDP training step on sharded state (one rank here; several ranks in the recipe
// tests) reproduces the PyTorch fixture run.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <map>

extern "C" {
#include "train/train_fsdp.h"
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_table.h"
#include "decoder/decoder_model.h"
#include "runtime/comm.h"
#include "runtime/state.h"
}
#include "st_test_reader.h"
#include "decoder_state_util.h"
#include "test_util.h"

namespace {
decoder_config tiny() {
    decoder_config c;
    memset(&c, 0, sizeof c);
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 256, c.multiple_of = 32;
    c.norm_eps = 1e-5, c.rope_theta = 10000.0, c.max_seq_len = 64, c.depth_init = 1;
    c.head_dim = 16, c.ffn_hidden = 192;
    return c;
}
}  // namespace

// Five steps on the tiny fixture against PyTorch's reference.json, with the output head in chunks
// of head_chunk_rows rows (0: automatic, one chunk of the 64 rows here).
static void five_steps_match_reference(int head_chunk_rows) {
    std::map<std::string, st_test::Tensor> init, batch;
    std::string why;
    ASSERT_TRUE(st_test::load(fsdp_test::tiny("model_init.safetensors"), &init, &why)) << why;
    ASSERT_TRUE(st_test::load(fsdp_test::tiny("batch.safetensors"), &batch, &why)) << why;
    json_error_t je;
    json_t *ref = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
    ASSERT_TRUE(ref) << je.text;
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    fsdp_state *s = decoder_test_state(tiny());
    json_t *names = json_object_get(ref, "param_names");
    for (size_t i = 0; i < json_array_size(names); i++) {
        const char *n = json_string_value(json_array_get(names, i));
        auto &t = init.at(n);
        std::vector<int64_t> shp(t.shape.begin(), t.shape.end());
        ASSERT_EQ(state_add_param(s, n, (int)shp.size(), shp.data(), -1, &err), 0) << err.msg;
        memcpy(state_find(s, n)->data, t.f32.data(), t.f32.size() * sizeof(float));
    }
    train_fsdp *f;
    ASSERT_EQ(train_fsdp_create_opts(s, decoder_blocks_cpu(decoder_state_config(s)), c, 2, 32, 0, head_chunk_rows, &f, &err), 0) << err.msg;
    std::vector<int32_t> in(batch.at("input_ids").i32), lab(batch.at("labels").i32);
    json_t *steps = json_object_get(ref, "steps");
    for (int k = 0; k < 5; k++) {
        json_t *st = json_array_get(steps, k);
        train_fsdp_hparams hp = {json_number_value(json_object_get(st, "lr")), 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
        train_fsdp_result r;
        ASSERT_EQ(train_fsdp_step(f, in.data(), lab.data(), &hp, &r, &err), 0) << err.msg;
        double want = json_number_value(json_object_get(st, "loss"));
        EXPECT_NEAR(r.loss, want, 1e-5 * want) << "step " << k;
        double gn = json_number_value(json_object_get(st, "grad_norm"));
        EXPECT_NEAR(r.grad_norm, gn, 1e-4 * gn) << "step " << k;
        EXPECT_EQ(r.tokens, 64);
    }
    EXPECT_EQ(s->opt_step, 5);
    // NaN in the weights: the step fails with a numeric error and changes nothing
    float keep = s->p[0].data[0];
    s->p[0].data[in[0] * 64] = NAN;
    float w1 = s->p[1].data[0];
    train_fsdp_hparams hp = {1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
    train_fsdp_result r;
    EXPECT_EQ(train_fsdp_step(f, in.data(), lab.data(), &hp, &r, &err), FSDP_E_NUMERIC);
    EXPECT_NE(std::string(err.msg).find("non-finite loss"), std::string::npos) << err.msg;
    EXPECT_EQ(s->p[1].data[0], w1);
    EXPECT_EQ(s->opt_step, 5);
    (void)keep;
    train_fsdp_free(f);
    state_free(s);
    comm_destroy(c);
    json_decref(ref);
}

TEST(LlamaFsdp, FiveStepsMatchReferenceOnShardedState) { five_steps_match_reference(0); }

// 7 rows per chunk: 10 chunks of the 64 rows, the last one partial.
TEST(LlamaFsdp, ChunkedHeadFiveStepsMatchReference) { five_steps_match_reference(7); }

TEST(LlamaFsdp, HeadChunkRowsMustNotBeNegative) {
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    fsdp_state *s = decoder_test_state(tiny());
    train_fsdp *f = nullptr;
    EXPECT_EQ(train_fsdp_create_opts(s, decoder_blocks_cpu(decoder_state_config(s)), c, 2, 32, 0, -2, &f, &err), FSDP_E_INVALID);
    EXPECT_EQ(f, nullptr);
    EXPECT_NE(std::string(err.msg).find("head_chunk_rows is -2"), std::string::npos) << err.msg;
    state_free(s);
    comm_destroy(c);
}

TEST(LlamaFsdp, ActivationCheckpointingIsBitIdenticalAndSmaller) {
    std::map<std::string, st_test::Tensor> init, batch;
    std::string why;
    ASSERT_TRUE(st_test::load(fsdp_test::tiny("model_init.safetensors"), &init, &why)) << why;
    ASSERT_TRUE(st_test::load(fsdp_test::tiny("batch.safetensors"), &batch, &why)) << why;
    json_error_t je;
    json_t *ref = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
    ASSERT_TRUE(ref) << je.text;
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    // none, full and selective checkpointing (decoder_ac values 0, 1, 2)
    const int NAC = 3;
    fsdp_state *st[NAC];
    train_fsdp *f[NAC];
    for (int ac = 0; ac < NAC; ac++) {
        fsdp_state *s = st[ac] = decoder_test_state(tiny());
        json_t *names = json_object_get(ref, "param_names");
        for (size_t i = 0; i < json_array_size(names); i++) {
            const char *n = json_string_value(json_array_get(names, i));
            auto &t = init.at(n);
            std::vector<int64_t> shp(t.shape.begin(), t.shape.end());
            ASSERT_EQ(state_add_param(s, n, (int)shp.size(), shp.data(), -1, &err), 0) << err.msg;
            memcpy(state_find(s, n)->data, t.f32.data(), t.f32.size() * sizeof(float));
        }
        ASSERT_EQ(train_fsdp_create_ac(s, decoder_blocks_cpu(decoder_state_config(s)), c, 2, 32, ac, &f[ac], &err), 0) << err.msg;
    }
    std::vector<int32_t> in(batch.at("input_ids").i32), lab(batch.at("labels").i32);
    for (int k = 0; k < 3; k++) {
        train_fsdp_hparams hp = {1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
        train_fsdp_result r[NAC];
        for (int ac = 0; ac < NAC; ac++)
            ASSERT_EQ(train_fsdp_step(f[ac], in.data(), lab.data(), &hp, &r[ac], &err), 0);
        for (int ac = 1; ac < NAC; ac++) {
            EXPECT_EQ(r[0].loss, r[ac].loss) << "ac " << ac << " step " << k;
            EXPECT_EQ(r[0].grad_norm, r[ac].grad_norm) << "ac " << ac << " step " << k;
        }
    }
    for (int ac = 1; ac < NAC; ac++) {
        for (size_t i = 0; i < st[0]->n; i++) {
            size_t n = state_param_local_numel(&st[0]->p[i]);
            EXPECT_EQ(memcmp(st[0]->p[i].data, st[ac]->p[i].data, n * sizeof(float)), 0)
                << "ac " << ac << " " << st[0]->p[i].name;
            EXPECT_EQ(memcmp(st[0]->p[i].grad, st[ac]->p[i].grad, n * sizeof(float)), 0)
                << "ac " << ac << " " << st[0]->p[i].name;
        }
    }
    for (int ac = 0; ac < NAC; ac++) {
        train_fsdp_free(f[ac]);
        state_free(st[ac]);
    }
    // full checkpointing keeps one layer's intermediates instead of one per layer; selective keeps
    // all but the norm outputs and g: none > selective > full
    decoder_config cfg = tiny();
    cfg.n_layers = 4;
    decoder_model_ws *w0 = decoder_model_ws_create_ac(&cfg, 2, 32, DECODER_AC_NONE, &err),
                   *w1 = decoder_model_ws_create_ac(&cfg, 2, 32, DECODER_AC_FULL, &err),
                   *w2 = decoder_model_ws_create_ac(&cfg, 2, 32, DECODER_AC_SELECTIVE, &err);
    ASSERT_TRUE(w0 && w1 && w2) << err.msg;
    EXPECT_LT(decoder_model_ws_bytes(w1), decoder_model_ws_bytes(w2));
    EXPECT_LT(decoder_model_ws_bytes(w2), decoder_model_ws_bytes(w0));
    // selective saves (L-1) norm outputs for each norm plus one, and L-1 g's, of 2x32 rows
    const size_t bt = 2 * 32, fl = sizeof(float);
    EXPECT_EQ(decoder_model_ws_bytes(w0) - decoder_model_ws_bytes(w2),
              ((2 * 4 - 1) * bt * (size_t)cfg.dim + 3 * bt * (size_t)cfg.ffn_hidden) * fl);
    decoder_model_ws_free(w0);
    decoder_model_ws_free(w1);
    decoder_model_ws_free(w2);
    EXPECT_EQ(decoder_model_ws_create_ac(&cfg, 2, 32, 3, &err), nullptr);
    EXPECT_NE(std::string(err.msg).find("checkpointing mode 3"), std::string::npos) << err.msg;
    comm_destroy(c);
    json_decref(ref);
}
