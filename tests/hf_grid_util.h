// The grid of small Hugging Face models (tests/data/hf-grid-5.24, written by tools/gen/gen_hf_grid.py
// with transformers 5.24 and torch 2.11): its configs, each one's float64 reference run, PyTorch's own
// float32 and bf16-autocast runs of the same steps, and the tolerance rules every grid test applies.
//
// Tolerances (one place, never widened per config):
// "PyTorch's own float32 error" is the largest deviation from the float64 run of 6 float32 runs of the
// same steps (plain, and with the initial weights perturbed by one ulp and the batch rows permuted: the
// generator's F32_RUNS), recorded per config, per step and per checkpoint tensor.
//   loss, ce_loss      |got - ref| <= 1e-7 * ref                  (every step; PyTorch's own float32 runs miss
//                      this on 39 of the 72 configs, by up to 2.2e-7: their loss is a float32 scalar whose
//                      ulp is 1.1e-7 of it near 4, and torch's float32 AdamW biases every weight toward a
//                      shorter step, which moves the next loss by up to 1.3e-7; fsdp-run sums the loss in
//                      double and rounds the AdamW step once (kernels/cpu/kc_adamw.c))
//   aux_loss           |got - ref| <= 1e-6 * ref                  (transformers computes it in float32)
//   grad_norm          |got - ref| <= 1e-5 * ref                  (every step)
//   step-0 gradient    per parameter, max |got - ref| <= 4 * max(e, r * max|ref|), e = PyTorch's own
//                      float32 error on that parameter (its checkpoint tensors' largest), r = the median
//                      over the config's parameters of PyTorch's relative float32 error (so a parameter
//                      PyTorch happened to get exactly is held to the config's typical float32 error, not
//                      to exactness)
//   final weights      max |got - ref| <= 3 * W, W = the largest distance of PyTorch's float32 runs' final
//                      weights from the float64 run's. 3 is no wider than PyTorch's own spread: one of its
//                      float32 runs is 2.8 times as far as the farthest of the other five (3.2 with a MoE's
//                      2 micro-batches; grid.json's f32_spread, HfGrid.WeightFactorIsNoWiderThanPyTorchsOwnSpread
//                      checks it), the max being set by the few elements whose gradient is at float32's
//                      noise (a k bias the softmax nearly ignores) and whose AdamW step hangs on that noise
//   bf16 (GPU)         per step |x - ref| <= 2 * B for the loss, ce_loss, aux_loss and grad_norm, B the largest
//                      deviation over the steps of PyTorch's own bf16 runs (the generator's bf16_envelope:
//                      transformers' autocast, FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
//                      reduce_dtype=float32) that fsdp-run's bf16 implements, and 4 runs of that policy
//                      from weights perturbed by half a bf16 ulp; a MoE's routing flips between bf16
//                      computations, so one run is no measure). The weights are not compared: after 3
//                      steps in bf16 every implementation is up to the AdamW step size off in some elements.
#ifndef FSDP_TESTS_HF_GRID_UTIL_H
#define FSDP_TESTS_HF_GRID_UTIL_H

#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/namemap.h"
#include "decoder/decoder_params.h"
#include "decoder/hf_config.h"
}
#include "jsonl_util.h"
#include "moe_state_util.h"

namespace hf_grid {

inline std::string dir(const std::string &name = "", const std::string &file = "") {
    std::string d = "tests/data/hf-grid-5.24";
    if (!name.empty()) d += "/" + name;
    if (!file.empty()) d += "/" + file;
    return d;
}

// The configs of grid.json, in order.
inline std::vector<std::string> names() {
    std::vector<std::string> out;
    json_error_t je;
    json_t *g = json_load_file(dir("", "grid.json").c_str(), 0, &je);
    EXPECT_TRUE(g) << dir("", "grid.json") << ": " << je.text;
    if (!g) return out;
    json_t *cs = json_object_get(g, "configs");
    for (size_t i = 0; i < json_array_size(cs); i++)
        out.push_back(json_string_value(json_object_get(json_array_get(cs, i), "name")));
    json_decref(g);
    return out;
}

struct Step {
    double lr = 0, loss = 0, ce = 0, aux = 0, gn = 0;
};

inline std::vector<Step> read_steps(json_t *arr) {
    std::vector<Step> v;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *s = json_array_get(arr, i);
        Step x;
        x.lr = json_number_value(json_object_get(s, "lr"));
        x.loss = json_number_value(json_object_get(s, "loss"));
        x.ce = json_number_value(json_object_get(s, "ce_loss"));
        x.aux = json_number_value(json_object_get(s, "aux_loss"));
        x.gn = json_number_value(json_object_get(s, "grad_norm"));
        v.push_back(x);
    }
    return v;
}

inline double max_of(json_t *arr) {
    double m = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) m = std::max(m, json_number_value(json_array_get(arr, i)));
    return m;
}

// reference.json of one config: the whole batch's run (variant "") or, for a MoE, that of the two
// accumulated micro-batches (variant "_accum", its files named with that suffix).
struct Ref {
    std::string name, model_type, variant;
    int rows = 0, seq = 0;
    bool moe = false, aux_in_loss = false, pad_in_batch = false;
    int pad = -1; // pad_token_id, -1 when unset
    std::vector<Step> steps, f32_steps, bf16_steps;
    std::vector<std::vector<int>> micro_batches; // the variant's groups of batch rows
    double loss_after = 0, ce_after = 0, f32_weight_diff = 0, bf16_weight_diff = 0;
    std::vector<double> f32_weight_runs; // each float32 run's final-weight distance (f32_weight_diff: their max)
    double bf16_loss_err = 0, bf16_ce_err = 0, bf16_aux_err = 0, bf16_gn_err = 0; // PyTorch's bf16 runs, likewise
    std::map<std::string, double> f32_grad_err; // checkpoint name -> PyTorch's float32 error
    double f32_rel_median = 0;                   // median over parameters of f32 error / max |grad|
    std::string traits;                          // the traits, for messages
    bool ok = false;
    explicit Ref(const std::string &n, const std::string &v = "") : name(n), variant(v) {
        json_error_t je;
        json_t *r = json_load_file(dir(n, "reference.json").c_str(), 0, &je);
        EXPECT_TRUE(r) << dir(n, "reference.json") << ": " << je.text;
        if (!r) return;
        model_type = json_string_value(json_object_get(r, "model_type"));
        json_t *b = json_object_get(r, "batch");
        rows = (int)json_integer_value(json_array_get(b, 0));
        seq = (int)json_integer_value(json_array_get(b, 1));
        json_t *t = json_object_get(r, "traits");
        moe = json_object_get(t, "experts") != nullptr;
        aux_in_loss = json_is_true(json_object_get(t, "aux_in_loss"));
        json_t *pv = json_object_get(t, "pad_token_id");
        pad = json_is_integer(pv) ? (int)json_integer_value(pv) : -1;
        pad_in_batch = json_integer_value(json_object_get(t, "pad_in_batch")) > 0;
        char *tx = json_dumps(t, JSON_COMPACT | JSON_SORT_KEYS);
        traits = tx ? tx : "";
        free(tx);
        json_t *bf = json_object_get(r, "bf16_autocast_run");
        bf16_steps = read_steps(json_object_get(bf, "steps"));
        bf16_weight_diff = json_number_value(json_object_get(bf, "max_abs_weight_diff"));
        json_t *be = json_object_get(r, "bf16_envelope");
        bf16_loss_err = max_of(json_object_get(be, "loss_err"));
        bf16_ce_err = max_of(json_object_get(be, "ce_err"));
        bf16_aux_err = max_of(json_object_get(be, "aux_err"));
        bf16_gn_err = max_of(json_object_get(be, "gn_err"));
        json_t *var = v.empty() ? r : json_object_get(r, "accum");
        EXPECT_TRUE(var) << n << ": no reference of variant '" << v << "'";
        if (var) read_variant(var);
        json_decref(r);
    }
    void read_variant(json_t *var) {
        steps = read_steps(json_object_get(var, "steps"));
        loss_after = json_number_value(json_object_get(var, "loss_after"));
        ce_after = json_number_value(json_object_get(var, "ce_loss_after"));
        json_t *mb = json_object_get(var, "micro_batches");
        for (size_t i = 0; i < json_array_size(mb); i++) {
            std::vector<int> g;
            for (size_t j = 0; j < json_array_size(json_array_get(mb, i)); j++)
                g.push_back((int)json_integer_value(json_array_get(json_array_get(mb, i), j)));
            micro_batches.push_back(g);
        }
        json_t *f = json_object_get(var, "f32_run");
        f32_steps = read_steps(json_object_get(f, "steps"));
        f32_weight_diff = json_number_value(json_object_get(f, "max_abs_weight_diff"));
        json_t *wr = json_object_get(f, "max_abs_weight_diff_per_run");
        for (size_t i = 0; i < json_array_size(wr); i++) f32_weight_runs.push_back(json_number_value(json_array_get(wr, i)));
        const char *k;
        json_t *x;
        json_object_foreach(json_object_get(f, "step0_grad_max_abs_err"), k, x) f32_grad_err[k] = json_number_value(x);
        ok = !steps.empty();
    }
};

// The checkpoint tensors parameter p of the table is made of (one per expert for grouped experts).
inline std::vector<std::string> hf_parts(const decoder_config &c, const decoder_param &p) {
    std::vector<std::string> out;
    if (p.kind >= DECODER_P_EXPERTS_W1 && p.kind <= DECODER_P_EXPERTS_W3) {
        for (int e = 0; e < c.n_experts; e++)
            out.push_back(fsdp_test::moe_hf_expert(c, p.layer, e, p.kind - DECODER_P_EXPERTS_W1, ""));
        return out;
    }
    if (p.kind == DECODER_P_ROUTER) {
        out.push_back("model.layers." + std::to_string(p.layer) +
                      (c.arch == DECODER_ARCH_MIXTRAL ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight"));
        return out;
    }
    char name[NMAP_NAME_MAX];
    nmap_info info;
    fsdp_err err;
    EXPECT_EQ(nmap_map(NMAP_TT_TO_HF, p.name, c.n_heads, c.n_kv_heads, name, sizeof name, &info, &err), 0) << err.msg;
    out.push_back(name);
    return out;
}

// The final weights' tolerance in units of PyTorch's own float32 distance (see the top).
constexpr double kWeightFactor = 3.0;

// The float32 tolerance of a loss (or its cross-entropy) against the float64 run's value (see the top).
inline double loss_tol(double ref) { return 1e-7 * std::fabs(ref); }

// The per-config failures of a grid test, reported together at the end (which configs, what failed).
struct Report {
    std::string what;
    std::map<std::string, std::vector<std::string>> fails;
    int checked = 0;
    explicit Report(const std::string &w) : what(w) {}
    void fail(const std::string &cfg, const std::string &msg) { fails[cfg].push_back(msg); }
    void check(const Ref &r, const std::string &item, double got, double want, double tol) {
        if (!(std::fabs(got - want) <= tol)) {
            char b[320];
            snprintf(b, sizeof b, "%s: %.12g, reference %.12g (|diff| %.3g > tolerance %.3g)", item.c_str(), got, want,
                     std::fabs(got - want), tol);
            fail(r.name, b);
        }
    }
    // Loss (and its terms) and grad norm of each step against the float64 run, within the float32
    // tolerances or (bf16) twice PyTorch's own bf16 error (see the top).
    void check_steps(const Ref &r, const std::vector<Step> &got, const std::string &tag, bool bf16 = false) {
        if (got.size() != r.steps.size()) {
            fail(r.name, tag + ": " + std::to_string(got.size()) + " steps ran, expected " + std::to_string(r.steps.size()));
            return;
        }
        for (size_t k = 0; k < got.size(); k++) {
            const Step &w = r.steps[k];
            const double tl = bf16 ? 2 * r.bf16_loss_err : loss_tol(w.loss), tc = bf16 ? 2 * r.bf16_ce_err : loss_tol(w.ce),
                         ta = bf16 ? 2 * r.bf16_aux_err : 1e-6 * std::fabs(w.aux),
                         tg = bf16 ? 2 * r.bf16_gn_err : 1e-5 * std::fabs(w.gn);
            std::string s = tag + "step " + std::to_string(k + 1) + " ";
            check(r, s + "loss", got[k].loss, w.loss, tl);
            check(r, s + "ce_loss", got[k].ce, w.ce, tc);
            if (r.moe) check(r, s + "aux_loss", got[k].aux, w.aux, ta);
            check(r, s + "grad_norm", got[k].gn, w.gn, tg);
        }
    }
    void check_weights(const Ref &r, double max_abs_diff, const std::string &tag) {
        check(r, tag + "final weights (max |w - w_ref|)", max_abs_diff, 0.0, kWeightFactor * r.f32_weight_diff);
    }
    // One parameter's step-0 gradient: max |got - ref| against PyTorch's own float32 error (see the top).
    void check_grad(const Ref &r, const std::string &param, const std::vector<std::string> &parts, double err,
                    double ref_max_abs, const std::string &tag) {
        double e = 0;
        for (const std::string &h : parts) {
            auto it = r.f32_grad_err.find(h);
            if (it == r.f32_grad_err.end()) {
                fail(r.name, tag + param + ": no float32 error recorded for " + h);
                return;
            }
            e = std::max(e, it->second);
        }
        check(r, tag + "step-0 gradient of " + param, err, 0.0, 4 * std::max(e, r.f32_rel_median * ref_max_abs));
    }
    // Prints the summary and fails the test with every config's findings.
    void finish() {
        printf("[ %s ] %d configs checked, %zu with findings\n", what.c_str(), checked, fails.size());
        for (const auto &kv : fails) {
            std::string all;
            for (const std::string &m : kv.second) all += "\n    " + m;
            ADD_FAILURE() << what << ": " << kv.first << " (" << kv.second.size() << " findings)" << all;
        }
    }
};

// r.f32_rel_median from the reference gradients (checkpoint names) of the config.
inline void set_rel_median(Ref &r, const fsdp_test::MoeTensors &grads) {
    std::vector<double> rel;
    for (const auto &kv : grads) {
        double m = 0;
        for (float x : kv.second.f32) m = std::max(m, (double)std::fabs(x));
        auto it = r.f32_grad_err.find(kv.first);
        if (m > 0 && it != r.f32_grad_err.end()) rel.push_back(it->second / m);
    }
    if (rel.empty()) return;
    std::sort(rel.begin(), rel.end());
    r.f32_rel_median = rel[rel.size() / 2];
}

// What tests/mpi/hf_grid_run measured for one config (one JSON line of its output).
struct Measured {
    std::string error;
    std::map<std::string, std::pair<double, double>> grads; // param -> (max |g - g_ref|, max |g_ref|)
    std::vector<Step> steps;
    double weight_diff = 0;
    std::vector<std::vector<int>> micro_batches; // the global batch rows of each micro-batch
    int ac = 0, expert_parallel = 1;
};

inline std::map<std::string, Measured> read_measured(const std::string &path) {
    std::map<std::string, Measured> out;
    for (json_t *j : fsdp_test::jsonl_objects(path)) {
        Measured m;
        json_t *e = json_object_get(j, "error");
        if (e) m.error = json_string_value(e);
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(j, "grads"), k, v) m.grads[k] = {json_number_value(json_array_get(v, 0)),
                                                                             json_number_value(json_array_get(v, 1))};
        m.steps = read_steps(json_object_get(j, "steps"));
        m.weight_diff = json_number_value(json_object_get(j, "weight_diff"));
        json_t *mb = json_object_get(j, "micro_batches");
        for (size_t i = 0; i < json_array_size(mb); i++) {
            std::vector<int> g;
            for (size_t q = 0; q < json_array_size(json_array_get(mb, i)); q++)
                g.push_back((int)json_integer_value(json_array_get(json_array_get(mb, i), q)));
            std::sort(g.begin(), g.end());
            m.micro_batches.push_back(g);
        }
        m.ac = (int)json_integer_value(json_object_get(j, "ac"));
        m.expert_parallel = (int)json_integer_value(json_object_get(j, "expert_parallel"));
        out[json_string_value(json_object_get(j, "name"))] = m;
        json_decref(j);
    }
    return out;
}

// Judges one config's measurements: every parameter's step-0 gradient, the steps, the final weights,
// against the whole batch's run or, for a MoE trained in more than one micro-batch (whose aux loss is
// each micro-batch's), the run of exactly those micro-batches.
inline void judge(Report &rep, const std::string &name, const Measured &m, const std::string &tag) {
    Ref whole(name);
    const bool accum = whole.moe && m.micro_batches.size() > 1;
    Ref ref(name, accum ? "_accum" : "");
    rep.checked++;
    if (accum) {
        std::vector<std::vector<int>> want = ref.micro_batches;
        for (auto &g : want) std::sort(g.begin(), g.end());
        if (want != m.micro_batches) {
            rep.fail(name, tag + "no reference for the micro-batches this run made");
            return;
        }
    }
    if (!m.error.empty()) {
        rep.fail(ref.name, tag + "the run failed: " + m.error);
        return;
    }
    decoder_config cfg;
    fsdp_err err;
    if (hf_config_read(dir(ref.name).c_str(), &cfg, &err)) {
        rep.fail(ref.name, tag + "config.json: " + err.msg);
        return;
    }
    set_rel_median(ref, fsdp_test::moe_load_st(dir(ref.name, "grads_step0" + ref.variant + ".safetensors")));
    decoder_params t;
    EXPECT_EQ(decoder_params_build(&cfg, &t, &err), 0) << err.msg;
    for (int i = 0; i < t.n; i++) {
        auto it = m.grads.find(t.p[i].name);
        if (it == m.grads.end()) {
            rep.fail(ref.name, tag + "no step-0 gradient measured for " + t.p[i].name);
            continue;
        }
        rep.check_grad(ref, t.p[i].name, hf_parts(cfg, t.p[i]), it->second.first, it->second.second, tag);
    }
    decoder_params_free(&t);
    rep.check_steps(ref, m.steps, tag);
    rep.check_weights(ref, m.weight_diff, tag);
}

// The bf16 run of one config (the GPU's mixed precision): its steps against PyTorch's own bf16 error.
inline void judge_bf16(Report &rep, const std::string &name, const Measured &m, const std::string &tag) {
    Ref ref(name);
    rep.checked++;
    if (!m.error.empty()) {
        rep.fail(name, tag + "the run failed: " + m.error);
        return;
    }
    if (!(ref.bf16_loss_err > 0 && ref.bf16_gn_err > 0)) {
        rep.fail(name, tag + "reference.json has no bf16_envelope");
        return;
    }
    rep.check_steps(ref, m.steps, tag, true);
}

}  // namespace hf_grid

#endif
