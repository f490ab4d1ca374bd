// Training Hugging Face checkpoints of Qwen2, Qwen3 and Llama 3.2 against real transformers
// (../shared/fixtures/hf-5.24, written by transformers 5.24 on PyTorch 2.11): from_hf +
// load-ckpt names: hf + 5 train-steps match reference.json, model_step5 / adam_step5 and the
// step-0 gradients, on 1 rank (in process and through the binary) and on 3 ranks; activation
// checkpointing and the chunked head agree; the export (safetensors + config.json) reads back as the
// fixture; HF -> fsdp-run -> HF is bit-exact; tied embeddings load strictly.
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ckpt_compare.h"
#include "hf_batch_util.h"
#include "hf_state_util.h"
#include "st_test_reader.h"
#include "jsonl_util.h"
#include "test_util.h"

extern "C" {
#include "ckpt/namemap.h"
#include "ckpt/safetensors.h"
#include "ckpt/state_io.h"
#include "decoder/decoder_table.h"
#include "decoder/hf_config.h"
#include "train/train_fsdp.h"
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_model.h"
#include "decoder/decoder_params.h"
#include "runtime/comm.h"
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {

const char *const MODELS[] = {"qwen2_tiny", "qwen3_tiny", "llama32_tiny"};


struct Dir {
    std::string d = make_tmpdir("fsdp-hftrain");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

typedef std::map<std::string, st_test::Tensor> Tensors;

Tensors load_st(const std::string &path) {
    Tensors t;
    std::string why;
    EXPECT_TRUE(st_test::load(path, &t, &why)) << why;
    return t;
}

// reference.json of a fixture: per-step lr, loss, grad_norm and PyTorch's own float32 drift.
struct Ref {
    std::vector<double> lr, loss, gn;
    double f32diff = 0;
    explicit Ref(const std::string &model) {
        json_error_t je;
        json_t *r = json_load_file(hf_fixture(model, "reference.json").c_str(), 0, &je);
        EXPECT_TRUE(r) << je.text;
        if (!r) return;
        json_t *steps = json_object_get(r, "steps");
        for (size_t i = 0; i < json_array_size(steps); i++) {
            json_t *s = json_array_get(steps, i);
            lr.push_back(json_number_value(json_object_get(s, "lr")));
            loss.push_back(json_number_value(json_object_get(s, "loss")));
            gn.push_back(json_number_value(json_object_get(s, "grad_norm")));
        }
        f32diff = json_number_value(json_object_get(r, "f32_run_max_abs_weight_diff"));
        json_decref(r);
    }
};

decoder_config read_cfg(const std::string &model) {
    decoder_config c;
    fsdp_err err;
    EXPECT_EQ(hf_config_read(hf_fixture(model).c_str(), &c, &err), 0) << err.msg;
    return c;
}

// The model of a fixture as load-ckpt makes it on one rank: the table's parameters, sharded over a
// world of 1, restored strictly from the HF directory under HF names.

// A torchtitan-layout tensor [rows, cols] as Hugging Face has it: its HF name and rows (q/k rows,
// biases and norms permuted back to rotate_half's layout).
std::vector<float> tt_to_hf(const decoder_config &c, const std::string &tt, const float *v, int64_t rows, int64_t cols,
                            std::string *name) {
    char out[NMAP_NAME_MAX];
    nmap_info info;
    fsdp_err err;
    EXPECT_EQ(nmap_map(NMAP_TT_TO_HF, tt.c_str(), c.n_heads, c.n_kv_heads, out, sizeof out, &info, &err), 0) << err.msg;
    *name = out;
    std::vector<float> r(v, v + rows * cols);
    if (info.qk != NMAP_QK_NONE) {
        EXPECT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, r.data(), v, rows, cols, sizeof(float), info.heads, &err), 0)
            << err.msg;
    }
    return r;
}

double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) d = std::max(d, (double)std::fabs(a[i] - b[i]));
    return d;
}

double max_abs(const std::vector<float> &a) {
    double m = 0;
    for (float x : a) m = std::max(m, (double)std::fabs(x));
    return m;
}

// Every parameter's array `which` (0 data, 1 grad, 2 exp_avg, 3 exp_avg_sq) of a one-rank state
// against want[hf name + suffix]: the largest absolute difference over all of them; every tensor of
// want (with that suffix) must be compared.
double state_vs(const fsdp_state *s, int which, const Tensors &want, const std::string &suffix) {
    double worst = 0;
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        const state_param *p = &s->p[i];
        const float *a[] = {p->data, p->grad, p->exp_avg, p->exp_avg_sq};
        std::string name;
        std::vector<float> v = tt_to_hf(*decoder_state_config(s), p->name, a[which], p->shape[0], p->row_numel, &name);
        auto it = want.find(name + suffix);
        if (it == want.end()) {
            ADD_FAILURE() << "no " << name + suffix << " in the fixture";
            continue;
        }
        worst = std::max(worst, max_abs_diff(v, it->second.f32));
        n++;
    }
    size_t expected = 0;
    for (const auto &kv : want)
        if (kv.first.size() >= suffix.size() && kv.first.compare(kv.first.size() - suffix.size(), suffix.size(), suffix) == 0)
            expected++;
    EXPECT_EQ(n, suffix.empty() ? want.size() : expected);
    return worst;
}



// The recipe of the Done-when: from_hf, strict load under HF names, 5 AdamW steps of the fixture's
// optimizer, a DCP checkpoint with the optimizer state and an HF export.
std::string fixture_recipe(const std::string &model, const std::string &batch, int global_batch) {
    return "model: {from_hf: " + hf_fixture(model) + "}\n"
           "data: {kind: safetensors, path: " + batch + ", batch_size: " + std::to_string(global_batch) +
           ", seq_len: 32}\n"
           "vars: {m: x, out: y}\n"
           "stages:\n"
           "  - {id: l, uses: load-ckpt, with: {path: " + hf_fixture(model) + ", names: hf}}\n"
           "  - {id: t, uses: train-steps, with: {steps: 5, lr: 1e-3, warmup_steps: 2, decay: linear, min_lr_ratio: 0.1,"
           " betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0, metrics: \"${m}\"}}\n"
           "  - {id: s, uses: save-dcp, with: {path: \"${out}/dcp\"}}\n"
           "  - {id: e, uses: save-safetensors, with: {path: \"${out}/hf\", names: hf, shard_mb: 1}}\n";
}

}  // namespace

// In process, one rank: 5 steps of each fixture against the float64 reference: loss (1e-5
// relative), grad norm (1e-4), the final weights and AdamW moments within 3x PyTorch's own float32
// drift.
TEST(HfTrain, FixturesFiveStepsOnOneRank) {
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        decoder_config cfg = read_cfg(m);
        Ref ref(m);
        ASSERT_EQ(ref.loss.size(), 5u);
        Tensors batch = load_st(hf_fixture(m, "batch.safetensors"));
        fsdp_state *s = hf_state(m, cfg);
        train_fsdp *f;
        ASSERT_EQ(train_fsdp_create(s, decoder_blocks_cpu(decoder_state_config(s)), c, 2, 32, &f, &err), 0) << err.msg;
        for (int k = 0; k < 5; k++) {
            train_fsdp_hparams hp = {ref.lr[k], 0.9, 0.95, 1e-8, 0.1, 1.0, nullptr, nullptr, nullptr};
            train_fsdp_result r;
            ASSERT_EQ(train_fsdp_step(f, batch.at("input_ids").i32.data(), batch.at("labels").i32.data(), &hp, &r, &err),
                      0)
                << err.msg;
            EXPECT_NEAR(r.loss, ref.loss[k], 1e-5 * ref.loss[k]) << "step " << k + 1;
            EXPECT_NEAR(r.grad_norm, ref.gn[k], 1e-4 * ref.gn[k]) << "step " << k + 1;
        }
        double w = state_vs(s, 0, load_st(hf_fixture(m, "model_step5.safetensors")), "");
        Tensors adam = load_st(hf_fixture(m, "adam_step5.safetensors"));
        double m1 = state_vs(s, 2, adam, ".exp_avg"), m2 = state_vs(s, 3, adam, ".exp_avg_sq");
        EXPECT_LE(w, 3 * ref.f32diff) << "weights";
        EXPECT_LE(m1, 3 * ref.f32diff) << "exp_avg";
        EXPECT_LE(m2, 3 * ref.f32diff) << "exp_avg_sq";
        printf("[ %s ] max |w - w_ref| %.3g, exp_avg %.3g, exp_avg_sq %.3g (PyTorch float32: %.3g)\n", m, w, m1, m2,
               ref.f32diff);
        train_fsdp_free(f);
        state_free(s);
    }
    comm_destroy(c);
}

// The step-0 gradients of every parameter, the tied embedding's summing both of its uses.
TEST(HfTrain, StepZeroGradientsMatchPyTorch) {
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        decoder_config cfg = read_cfg(m);
        Ref ref(m);
        Tensors batch = load_st(hf_fixture(m, "batch.safetensors")), want = load_st(hf_fixture(m, "grads_step0.safetensors"));
        fsdp_state *s = hf_state(m, cfg);
        train_fsdp *f;
        ASSERT_EQ(train_fsdp_create(s, decoder_blocks_cpu(decoder_state_config(s)), c, 2, 32, &f, &err), 0) << err.msg;
        train_fsdp_result r;
        ASSERT_EQ(train_fsdp_grads(f, batch.at("input_ids").i32.data(), batch.at("labels").i32.data(), &r, &err), 0)
            << err.msg;
        EXPECT_NEAR(r.loss, ref.loss[0], 1e-5 * ref.loss[0]);
        EXPECT_NEAR(r.grad_norm, ref.gn[0], 1e-4 * ref.gn[0]);
        size_t n = 0;
        for (size_t i = 0; i < s->n; i++) {
            const state_param *p = &s->p[i];
            std::string name;
            std::vector<float> g = tt_to_hf(cfg, p->name, p->grad, p->shape[0], p->row_numel, &name);
            ASSERT_TRUE(want.count(name)) << name;
            const std::vector<float> &w = want.at(name).f32;
            EXPECT_LE(max_abs_diff(g, w), 1e-4 * max_abs(w)) << name;
            n++;
        }
        EXPECT_EQ(n, want.size());
        train_fsdp_free(f);
        state_free(s);
    }
    comm_destroy(c);
}

// Full and selective activation checkpointing give every architecture's gradients bit for bit; the
// output head in chunks of 7 rows changes only the order of sums.
TEST(HfTrain, CheckpointingAndChunkedHeadAgreeForEveryArchitecture) {
    comm *c;
    fsdp_err err;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        decoder_config cfg = read_cfg(m);
        Tensors batch = load_st(hf_fixture(m, "batch.safetensors"));
        // ac none, full, selective with automatic chunks; then none with 7-row chunks
        const int ac[4] = {0, 1, 2, 0}, chunk[4] = {0, 0, 0, 7};
        fsdp_state *s[4];
        train_fsdp_result r[4];
        for (int k = 0; k < 4; k++) {
            s[k] = hf_state(m, cfg);
            train_fsdp *f;
            ASSERT_EQ(train_fsdp_create_opts(s[k], decoder_blocks_cpu(decoder_state_config(s[k])), c, 2, 32, ac[k], chunk[k], &f, &err), 0) << err.msg;
            ASSERT_EQ(train_fsdp_grads(f, batch.at("input_ids").i32.data(), batch.at("labels").i32.data(), &r[k], &err),
                      0)
                << err.msg;
            train_fsdp_free(f);
        }
        for (int k = 1; k < 4; k++) {
            if (k < 3) {
                EXPECT_EQ(r[k].loss, r[0].loss) << "ac " << ac[k];
            } else {
                EXPECT_NEAR(r[k].loss, r[0].loss, 1e-6 * r[0].loss);
            }
            for (size_t i = 0; i < s[0]->n; i++) {
                size_t n = state_param_local_numel(&s[0]->p[i]);
                std::vector<float> a(s[0]->p[i].grad, s[0]->p[i].grad + n), b(s[k]->p[i].grad, s[k]->p[i].grad + n);
                if (k < 3) {
                    EXPECT_TRUE(a == b) << "ac " << ac[k] << ": " << s[0]->p[i].name;
                } else {
                    EXPECT_LE(max_abs_diff(a, b), 1e-6 * std::max(1e-3, max_abs(a))) << s[0]->p[i].name;
                }
            }
        }
        for (fsdp_state *x : s) state_free(x);
    }
    comm_destroy(c);
}

// The Done-when through the binary: the recipe on 1 rank (the fixture's batch) and on 3 ranks (the
// batch tiled 3 times: 2 rows per rank, the same mean loss and gradients; every parameter sharded
// 3 ways): losses, grad norms, the exported weights vs model_step5 and the DCP's AdamW moments vs
// adam_step5; the exported config.json reads back as the fixture's own, field by field, and the
// export holds the fixture's keys and shapes (no lm_head).
TEST(HfTrain, FixturesOnOneAndThreeRanks) {
    Dir t;
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        Ref ref(m);
        decoder_config cfg = read_cfg(m);
        for (int np : {1, 3}) {
            std::string batch = hf_fixture(m, "batch.safetensors");
            if (np > 1) {
                batch = t / (std::string(m) + "_batch3.safetensors");
                hf_batch::write_tiled_batch(m, np, batch);
            }
            std::string r = t / (std::string(m) + ".yaml"), out = t / (std::string(m) + std::to_string(np)),
                        met = out + ".jsonl";
            write_file(r, fixture_recipe(m, batch, 2 * np));
            int rc;
            std::string o = run_np(np, r + " --set vars.m=" + met + " --set vars.out=" + out, &rc);
            ASSERT_EQ(rc, 0) << o;
            std::vector<double> loss = jsonl_field(met, "loss"), gn = jsonl_field(met, "grad_norm");
            ASSERT_EQ(loss.size(), 5u);
            for (int k = 0; k < 5; k++) {
                EXPECT_NEAR(loss[k], ref.loss[k], 1e-5 * ref.loss[k]) << np << " ranks, step " << k + 1;
                EXPECT_NEAR(gn[k], ref.gn[k], 1e-4 * ref.gn[k]) << np << " ranks, step " << k + 1;
            }
            // the export: weights, keys and shapes
            Ckpt ex(out + "/hf"), want(hf_fixture(m, "model_step5.safetensors")), init(hf_fixture(m, "model.safetensors"));
            ASSERT_TRUE(ex.r && want.r && init.r);
            ASSERT_EQ(ckpt_count(ex.r), ckpt_count(init.r));
            double wd = 0;
            for (size_t i = 0; i < ckpt_count(init.r); i++) {
                const ckpt_entry *e = ckpt_entry_at(init.r, i);
                long gi = ckpt_find(ex.r, e->name);
                ASSERT_GE(gi, 0) << e->name;
                const ckpt_entry *g = ckpt_entry_at(ex.r, (size_t)gi);
                ASSERT_EQ(g->ndim, e->ndim) << e->name;
                for (int d = 0; d < e->ndim; d++) EXPECT_EQ(g->shape[d], e->shape[d]) << e->name;
                auto a = tensor_bytes(ex.r, e->name, FSDP_DT_F32), b = tensor_bytes(want.r, e->name, FSDP_DT_F32);
                std::vector<float> fa(a.size() / 4), fb(b.size() / 4);
                memcpy(fa.data(), a.data(), a.size());
                memcpy(fb.data(), b.data(), b.size());
                wd = std::max(wd, max_abs_diff(fa, fb));
            }
            EXPECT_LT(ckpt_find(ex.r, "lm_head.weight"), 0);
            EXPECT_LE(wd, 3 * ref.f32diff) << np << " ranks: weights";
            // the DCP's AdamW moments (torchtitan names and layout) vs PyTorch's
            Ckpt dcp(out + "/dcp");
            ASSERT_TRUE(dcp.r);
            Tensors adam = load_st(hf_fixture(m, "adam_step5.safetensors"));
            double md = 0;
            size_t nm = 0;
            for (size_t i = 0; i < ckpt_count(dcp.r); i++) {
                std::string key = ckpt_entry_at(dcp.r, i)->name;
                const std::string pre = "optimizer.state.";
                for (const char *suf : {".exp_avg", ".exp_avg_sq"}) {
                    std::string sf = suf;
                    if (key.compare(0, pre.size(), pre) || key.size() < sf.size() ||
                        key.compare(key.size() - sf.size(), sf.size(), sf))
                        continue;
                    std::string tt = key.substr(pre.size(), key.size() - pre.size() - sf.size());
                    const ckpt_entry *e = ckpt_entry_at(dcp.r, i);
                    auto bytes = tensor_bytes(dcp.r, key, FSDP_DT_F32);
                    std::vector<float> v(bytes.size() / 4);
                    memcpy(v.data(), bytes.data(), bytes.size());
                    std::string name;
                    int64_t rows = e->shape[0], cols = e->ndim > 1 ? e->shape[1] : 1;
                    std::vector<float> h = tt_to_hf(cfg, tt, v.data(), rows, cols, &name);
                    ASSERT_TRUE(adam.count(name + sf)) << name + sf;
                    md = std::max(md, max_abs_diff(h, adam.at(name + sf).f32));
                    nm++;
                }
            }
            EXPECT_EQ(nm, adam.size()) << np << " ranks";
            EXPECT_LE(md, 3 * ref.f32diff) << np << " ranks: AdamW moments";
            printf("[ %s on %d rank%s ] max |w - w_ref| %.3g, moments %.3g (PyTorch float32: %.3g)\n", m, np,
                   np > 1 ? "s" : "", wd, md, ref.f32diff);
            // the exported config.json, read back through fsdp-run, is the fixture's own
            decoder_config back;
            fsdp_err err;
            ASSERT_EQ(hf_config_read((out + "/hf").c_str(), &back, &err), 0) << err.msg;
            EXPECT_EQ(back.arch, cfg.arch);
            EXPECT_EQ(back.dim, cfg.dim);
            EXPECT_EQ(back.n_layers, cfg.n_layers);
            EXPECT_EQ(back.n_heads, cfg.n_heads);
            EXPECT_EQ(back.n_kv_heads, cfg.n_kv_heads);
            EXPECT_EQ(back.head_dim, cfg.head_dim);
            EXPECT_EQ(back.ffn_hidden, cfg.ffn_hidden);
            EXPECT_EQ(back.vocab_size, cfg.vocab_size);
            EXPECT_EQ(back.max_seq_len, cfg.max_seq_len);
            EXPECT_EQ(back.norm_eps, cfg.norm_eps);
            EXPECT_EQ(back.rope_theta, cfg.rope_theta);
            EXPECT_EQ(back.rope_scaling, cfg.rope_scaling);
            EXPECT_EQ(back.rope_factor, cfg.rope_factor);
            EXPECT_EQ(back.rope_low_freq_factor, cfg.rope_low_freq_factor);
            EXPECT_EQ(back.rope_high_freq_factor, cfg.rope_high_freq_factor);
            EXPECT_EQ(back.rope_original_max_pos, cfg.rope_original_max_pos);
            EXPECT_EQ(back.qkv_bias, cfg.qkv_bias);
            EXPECT_EQ(back.qk_norm, cfg.qk_norm);
            EXPECT_EQ(back.tie_embeddings, cfg.tie_embeddings);
            EXPECT_EQ(back.init_std, cfg.init_std);
            std::string text = read_file(out + "/hf/config.json");
            EXPECT_NE(text.find("\"torch_dtype\": \"float32\""), std::string::npos) << text;
        }
    }
}

// HF -> fsdp-run -> HF is bit-exact for every architecture: loaded under HF names on 3 ranks (q/k
// rows, biases and q/k norms un-permuted from each rank's rows), saved as DCP, loaded on 2 ranks,
// exported with HF names; and `ckpt convert` of the DCP with --model writes the same tensors and the
// config.json.
TEST(HfTrain, RoundTripThroughDcpIsBitExact) {
    Dir t;
    for (const char *m : MODELS) {
        SCOPED_TRACE(m);
        std::string a = t / (std::string(m) + "_a.yaml"), b = t / (std::string(m) + "_b.yaml");
        std::string dcp = t / (std::string(m) + "_dcp"), out = t / (std::string(m) + "_hf");
        write_file(a, "model: {from_hf: " + hf_fixture(m) + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + hf_fixture(m) +
                          ", names: hf}}\n  - {id: s, uses: save-dcp, with: {path: " + dcp + "}}\n");
        write_file(b, "model: {from_hf: " + hf_fixture(m) + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + dcp +
                          "}}\n  - {id: e, uses: save-safetensors, with: {path: " + out +
                          "/model.safetensors, names: hf}}\n");
        int rc;
        std::string o;
        ASSERT_EQ(run_cmd("mkdir -p " + out, &o), 0);
        o = run_np(3, a, &rc);
        ASSERT_EQ(rc, 0) << o;
        o = run_np(2, b, &rc);
        ASSERT_EQ(rc, 0) << o;
        {
            Ckpt got(out + "/model.safetensors"), want(hf_fixture(m, "model.safetensors"));
            ASSERT_TRUE(got.r && want.r);
            EXPECT_EQ(ckpt_count(got.r), ckpt_count(want.r));
            expect_same_tensors(got.r, want.r);
            // one tensor for the tied embedding, in DCP too
            Ckpt d(dcp);
            EXPECT_GE(ckpt_find(d.r, "tok_embeddings.weight"), 0);
            EXPECT_LT(ckpt_find(d.r, "output.weight"), 0);
        }
        // the DCP converted by the CLI, checked against the model and given its config.json
        std::string conv = t / (std::string(m) + "_conv");
        o = "";
        ASSERT_EQ(run_cmd("mkdir -p " + conv, &o), 0);
        rc = run_cmd(fsdp_run_bin() + " ckpt convert " + dcp + " " + conv + "/model.safetensors --to safetensors "
                     "--names hf --model " + hf_fixture(m), &o);
        ASSERT_EQ(rc, 0) << o;
        Ckpt got(conv + "/model.safetensors"), want(hf_fixture(m, "model.safetensors"));
        ASSERT_TRUE(got.r && want.r);
        EXPECT_EQ(ckpt_count(got.r), ckpt_count(want.r));
        expect_same_tensors(got.r, want.r);
        decoder_config x = read_cfg(m), y;
        fsdp_err err;
        ASSERT_EQ(hf_config_read(conv.c_str(), &y, &err), 0) << err.msg;
        EXPECT_EQ(x.arch, y.arch);
        EXPECT_EQ(x.head_dim, y.head_dim);
        EXPECT_EQ(x.tie_embeddings, y.tie_embeddings);
        EXPECT_EQ(x.rope_factor, y.rope_factor);
    }
}

// `ckpt convert --model` refuses a model the tensors do not fit, before writing; without --model an
// HF export says that it wrote no config.json.
TEST(HfTrain, ConvertChecksTheModel) {
    Dir t;
    std::string o;
    int rc = run_cmd(fsdp_run_bin() + " ckpt convert " + hf_fixture("qwen3_tiny") + " " + (t / "x.safetensors") +
                         " --names torchtitan --model qwen3_tiny",
                     &o);
    EXPECT_EQ(rc, 1) << o;  // neither a preset nor a directory with a config.json
    EXPECT_NE(o.find("--model qwen3_tiny (neither a preset nor a Hugging Face model directory)"), std::string::npos)
        << o;
    // torchtitan names of the Qwen3 fixture, exported again with HF names against the Qwen2 fixture's model
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + hf_fixture("qwen3_tiny") + " " + (t / "tt.safetensors") +
                          " --names torchtitan --model " + hf_fixture("qwen3_tiny"),
                      &o),
              0)
        << o;
    rc = run_cmd(fsdp_run_bin() + " ckpt convert " + (t / "tt.safetensors") + " " + (t / "bad.safetensors") +
                     " --names hf --model " + hf_fixture("qwen2_tiny"),
                 &o);
    EXPECT_EQ(rc, 2) << o;
    EXPECT_NE(o.find("is not a parameter of the --model"), std::string::npos) << o;
    EXPECT_FALSE(exists(t / "bad.safetensors"));
    EXPECT_FALSE(exists(t / "config.json"));
    rc = run_cmd(fsdp_run_bin() + " ckpt convert " + (t / "tt.safetensors") + " " + (t / "ok.safetensors") +
                     " --names hf --n-heads 4 --n-kv-heads 2",
                 &o);
    EXPECT_EQ(rc, 0) << o;
    EXPECT_NE(o.find("no config.json written (pass --model PRESET|HF_DIR to write one)"), std::string::npos) << o;
    Ckpt a(t / "ok.safetensors"), b(hf_fixture("qwen3_tiny", "model.safetensors"));
    expect_same_tensors(a.r, b.r);
}

// A tied Llama 3.2 directory: an untied model misses output.weight under strict loading (what
// happened before); the tied one loads, and a stored lm_head.weight is ignored the way transformers
// ties it (the embedding wins).
TEST(HfTrain, TiedEmbeddingsLoadStrictly) {
    Dir t;
    std::string r = t / "u.yaml";
    write_file(r, "model: {from_hf: " + hf_fixture("llama32_tiny") + ", tie_embeddings: false}\nstages:\n  - {id: l, uses: "
                  "load-ckpt, with: {path: " + hf_fixture("llama32_tiny") + ", names: hf}}\n");
    int rc;
    std::string o = run_np(1, r, &rc);
    EXPECT_EQ(rc, 1) << o;
    EXPECT_NE(o.find("output.weight not restored (no such key in the checkpoint under its Hugging Face name)"),
              std::string::npos)
        << o;
    // the fixture with an extra lm_head.weight (zeros), as some tools save tied models
    Tensors init = load_st(hf_fixture("llama32_tiny", "model.safetensors"));
    st_writer *w;
    fsdp_err err;
    std::string dir = t / "withhead";
    ASSERT_EQ(run_cmd("mkdir -p " + dir + " && cp " + hf_fixture("llama32_tiny", "config.json") + " " + dir, &o), 0);
    ASSERT_EQ(st_writer_new(&w, (dir + "/model.safetensors").c_str(), &err), 0) << err.msg;
    std::vector<std::string> names;
    std::vector<size_t> idx;
    for (auto &kv : init) names.push_back(kv.first);
    names.push_back("lm_head.weight");
    for (auto &n : names) {
        const st_test::Tensor &x = init.at(n == "lm_head.weight" ? "model.embed_tokens.weight" : n);
        size_t i;
        ASSERT_EQ(st_writer_declare(w, n.c_str(), FSDP_DT_F32, (int)x.shape.size(), x.shape.data(), &i, &err), 0);
        idx.push_back(i);
    }
    ASSERT_EQ(st_writer_begin(w, &err), 0) << err.msg;
    for (size_t k = 0; k < names.size(); k++) {
        bool head = names[k] == "lm_head.weight";
        const st_test::Tensor &x = init.at(head ? "model.embed_tokens.weight" : names[k]);
        std::vector<float> v = head ? std::vector<float>(x.f32.size(), 0.0f) : x.f32;
        ASSERT_EQ(st_writer_write(w, idx[k], v.data(), v.size() * 4, &err), 0) << err.msg;
    }
    ASSERT_EQ(st_writer_finish(w, &err), 0) << err.msg;
    st_writer_free(w);
    write_file(r, "model: {from_hf: " + dir + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " + dir +
                      ", names: hf}}\n  - {id: e, uses: save-safetensors, with: {path: " + (t / "o.safetensors") +
                      ", names: hf}}\n");
    o = run_np(1, r, &rc);
    ASSERT_EQ(rc, 0) << o;
    Ckpt got(t / "o.safetensors"), want(hf_fixture("llama32_tiny", "model.safetensors"));
    expect_same_tensors(got.r, want.r);
    EXPECT_LT(ckpt_find(got.r, "lm_head.weight"), 0);
}

// recipes/finetune_hf.yaml on the Qwen3 fixture and a token file: periodic DCP checkpoints, an HF
// export (safetensors shards + config.json) that loads back strictly and equals the last checkpoint.
TEST(HfTrain, FinetuneRecipe) {
    Dir t;
    // a uint16 token file over the fixture's vocabulary
    std::string toks;
    for (int i = 0; i < 4096; i++) {
        uint16_t v = (uint16_t)((i * 37 + (i / 7) * 11) % 256);
        toks.append((const char *)&v, 2);
    }
    write_file(t / "train.bin", toks);
    int rc;
    std::string o = run_np(2, "recipes/finetune_hf.yaml --set vars.hf=" + hf_fixture("qwen3_tiny") + " --set vars.data_kind=tokens --set vars.data=" +
                                  (t / "train.bin") + " --set vars.out=" + (t / "run") +
                                  " --set vars.steps=4 --set vars.save_every=2 --set vars.batch_size=2"
                                  " --set vars.seq_len=32 --set vars.warmup_steps=1 --set vars.token_dtype=uint16 --set vars.lr=3e-3"
                                  " --set stages.train.with.metrics=" + (t / "metrics.jsonl"),
                          &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_TRUE(exists(t / "run/dcp/step-2/.metadata"));
    EXPECT_TRUE(exists(t / "run/dcp/step-4/.metadata"));
    EXPECT_TRUE(exists(t / "run/hf/config.json"));
    EXPECT_TRUE(exists(t / "run/hf/model.safetensors.index.json"));
    std::vector<double> loss = jsonl_field(t / "metrics.jsonl", "loss");
    ASSERT_EQ(loss.size(), 4u);
    EXPECT_LT(loss[3], loss[0]);
    // the export loads strictly as a Hugging Face model and holds the last checkpoint's weights
    std::string r = t / "back.yaml";
    write_file(r, "model: {from_hf: " + (t / "run/hf") + "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                      (t / "run/hf") + ", names: hf}}\n  - {id: s, uses: save-dcp, with: {path: " + (t / "back") +
                      "}}\n");
    o = run_np(1, r, &rc);
    ASSERT_EQ(rc, 0) << o;
    Ckpt a(t / "back"), b(t / "run/dcp/step-4");
    ASSERT_TRUE(a.r && b.r);
    size_t params = 0;
    for (size_t i = 0; i < ckpt_count(a.r); i++) {
        const ckpt_entry *e = ckpt_entry_at(a.r, i);
        if (!e->is_tensor || !strncmp(e->name, "optimizer.", 10)) continue;
        EXPECT_TRUE(tensor_bytes(a.r, e->name) == tensor_bytes(b.r, e->name)) << e->name;
        params++;
    }
    EXPECT_EQ(params, 2u + 2 * 11);
}
