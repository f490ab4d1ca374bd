// Name maps: torchtitan <-> HF names, the q/k RoPE row permutation, globs and rename rules.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "ckpt/namemap.h"
#include "ckpt/safetensors.h"
#include "test_util.h"

namespace {

std::string map(nmap_dir dir, const std::string &name, nmap_info *info = nullptr, int *rc_out = nullptr,
                int nh = 4, int nkv = 2) {
    char out[NMAP_NAME_MAX];
    fsdp_err err{};
    int rc = nmap_map(dir, name.c_str(), nh, nkv, out, sizeof out, info, &err);
    if (rc_out) *rc_out = rc;
    return rc ? std::string("ERR:") + err.msg : std::string(out);
}

std::vector<std::string> tiny_names() {
    std::vector<std::string> v;
    st_reader *r = nullptr;
    fsdp_err err{};
    if (st_open(&r, fsdp_test::tiny("model_init.safetensors").c_str(), &err)) return v;
    for (size_t i = 0; i < st_count(r); i++) v.push_back(st_tensor(r, i)->name);
    st_close(r);
    return v;
}

}  // namespace

TEST(NmapNames, EveryTinyNameMapsBothWaysAndBack) {
    std::vector<std::string> names = tiny_names();
    ASSERT_EQ(names.size(), 21u);
    std::set<std::string> hf_names;
    for (const std::string &tt : names) {
        nmap_info info{};
        int rc;
        std::string hf = map(NMAP_TT_TO_HF, tt, &info, &rc);
        ASSERT_EQ(rc, 0) << hf;
        EXPECT_FALSE(info.dropped);
        EXPECT_TRUE(hf.rfind("model.", 0) == 0 || hf == "lm_head.weight") << hf;
        hf_names.insert(hf);
        nmap_info back{};
        std::string tt2 = map(NMAP_HF_TO_TT, hf, &back, &rc);
        ASSERT_EQ(rc, 0) << tt2;
        EXPECT_EQ(tt2, tt);
        EXPECT_EQ(back.qk, info.qk);
        EXPECT_EQ(back.heads, info.heads);
        EXPECT_EQ(back.layer, info.layer);
        bool is_q = tt.find("attention.wq") != std::string::npos, is_k = tt.find("attention.wk") != std::string::npos;
        EXPECT_EQ(info.qk, is_q ? NMAP_QK_Q : is_k ? NMAP_QK_K : NMAP_QK_NONE) << tt;
        EXPECT_EQ(info.heads, is_q ? 4 : is_k ? 2 : 0) << tt;
        EXPECT_EQ(info.layer, tt.rfind("layers.", 0) == 0 ? tt[7] - '0' : -1) << tt;
    }
    EXPECT_EQ(hf_names.size(), names.size());  // injective
    // spot checks against the HF Llama naming
    EXPECT_EQ(map(NMAP_TT_TO_HF, "tok_embeddings.weight"), "model.embed_tokens.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.1.attention.wq.weight"), "model.layers.1.self_attn.q_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.0.attention.wk.weight"), "model.layers.0.self_attn.k_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.0.attention.wv.weight"), "model.layers.0.self_attn.v_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.0.attention.wo.weight"), "model.layers.0.self_attn.o_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.1.feed_forward.w1.weight"), "model.layers.1.mlp.gate_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.1.feed_forward.w2.weight"), "model.layers.1.mlp.down_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.1.feed_forward.w3.weight"), "model.layers.1.mlp.up_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.0.attention_norm.weight"), "model.layers.0.input_layernorm.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.0.ffn_norm.weight"), "model.layers.0.post_attention_layernorm.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "norm.weight"), "model.norm.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "output.weight"), "lm_head.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.117.ffn_norm.weight"), "model.layers.117.post_attention_layernorm.weight");
}

TEST(NmapNames, DroppedUnknownAndAliases) {
    nmap_info info{};
    int rc;
    EXPECT_EQ(map(NMAP_HF_TO_TT, "model.layers.3.self_attn.rotary_emb.inv_freq", &info, &rc), "");
    EXPECT_EQ(rc, 0);
    EXPECT_TRUE(info.dropped);
    EXPECT_EQ(info.layer, 3);
    EXPECT_EQ(map(NMAP_HF_TO_TT, "model.rotary_emb.inv_freq", &info, &rc), "");
    EXPECT_TRUE(info.dropped);
    EXPECT_EQ(map(NMAP_TT_TO_HF, "freqs_cis", &info, &rc), "");
    EXPECT_TRUE(info.dropped);

    // (wq.bias is Qwen2's q bias now; no architecture has a bias on wo)
    for (const char *bad : {"layers.x.attention.wq.weight", "layers.0.attention.wo.bias", "layers..attention.wq.weight",
                            "model.layers.0.self_attn.q_proj.weight", "embed", ""}) {
        std::string m = map(NMAP_TT_TO_HF, bad, nullptr, &rc);
        EXPECT_EQ(rc, FSDP_E_INVALID) << bad;
        EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
    }
    for (const char *bad : {"layers.0.attention.wq.weight", "model.layers.0.mlp.foo.weight", "model.embed_tokens"}) {
        map(NMAP_HF_TO_TT, bad, nullptr, &rc);
        EXPECT_EQ(rc, FSDP_E_INVALID) << bad;
    }
    // torchtitan 2026 names are accepted on the way to HF
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.3.attention.qkv_linear.wk.weight", &info, &rc),
              "model.layers.3.self_attn.k_proj.weight");
    EXPECT_EQ(info.qk, NMAP_QK_K);
    EXPECT_EQ(info.heads, 2);
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.3.attention.qkv_linear.wq.weight"), "model.layers.3.self_attn.q_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "layers.3.attention.qkv_linear.wv.weight"), "model.layers.3.self_attn.v_proj.weight");
    EXPECT_EQ(map(NMAP_TT_TO_HF, "lm_head.weight"), "lm_head.weight");
    // n_kv_heads <= 0 means n_heads
    map(NMAP_TT_TO_HF, "layers.0.attention.wk.weight", &info, &rc, 8, 0);
    EXPECT_EQ(info.heads, 8);
    // a too small output buffer is an error, not a truncation
    char small[10];
    fsdp_err err{};
    EXPECT_EQ(nmap_map(NMAP_TT_TO_HF, "norm.weight", 4, 2, small, sizeof small, nullptr, &err), FSDP_E_INVALID);
}

TEST(NmapNames, RestyleClassicAnd2026) {
    char out[NMAP_NAME_MAX];
    fsdp_err err{};
    int changed = -1;
    for (const std::string &n : tiny_names()) {
        ASSERT_EQ(nmap_tt_restyle(n.c_str(), NMAP_TT_2026, out, sizeof out, &changed, &err), 0);
        std::string s26 = out;
        bool qkv = n.find("attention.wq") != std::string::npos || n.find("attention.wk") != std::string::npos ||
                   n.find("attention.wv") != std::string::npos;
        EXPECT_EQ(changed, qkv || n == "output.weight") << n;
        if (qkv) { EXPECT_NE(s26.find(".attention.qkv_linear.w"), std::string::npos) << s26; }
        ASSERT_EQ(nmap_tt_restyle(s26.c_str(), NMAP_TT_CLASSIC, out, sizeof out, &changed, &err), 0);
        EXPECT_EQ(std::string(out), n);
    }
    ASSERT_EQ(nmap_tt_restyle("output.weight", NMAP_TT_2026, out, sizeof out, &changed, &err), 0);
    EXPECT_STREQ(out, "lm_head.weight");
    ASSERT_EQ(nmap_tt_restyle("layers.0.attention.wo.weight", NMAP_TT_2026, out, sizeof out, &changed, &err), 0);
    EXPECT_STREQ(out, "layers.0.attention.wo.weight");  // wo is not part of qkv_linear
    EXPECT_EQ(changed, 0);
}

TEST(NmapNames, Prefixes) {
    EXPECT_STREQ(nmap_strip_prefix("model.layers.0.x", "model."), "layers.0.x");
    EXPECT_STREQ(nmap_strip_prefix("_orig_mod.norm.weight", "_orig_mod."), "norm.weight");
    EXPECT_EQ(nmap_strip_prefix("norm.weight", "model."), nullptr);
    EXPECT_STREQ(nmap_strip_prefix("norm.weight", ""), "norm.weight");
    char out[18];
    fsdp_err err{};
    ASSERT_EQ(nmap_add_prefix("model.", "norm.weight", out, sizeof out, &err), 0);
    EXPECT_STREQ(out, "model.norm.weight");
    EXPECT_EQ(nmap_add_prefix("model.", "tok_embeddings.weight", out, sizeof out, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("tok_embeddings"), std::string::npos);
}

// ------------------------------------------------------------------ permutation

namespace {

// torch semantics written out literally: to_hf = w.view(nh, hd/2, 2, d).transpose(1, 2),
// from_hf = w.view(nh, 2, hd/2, d).transpose(1, 2). Returns the source row of each destination row.
std::vector<int64_t> torch_perm(nmap_dir dir, int nh, int hd) {
    std::vector<int64_t> src(nh * hd);
    int half = hd / 2;
    for (int h = 0; h < nh; h++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < half; b++) {
                if (dir == NMAP_TT_TO_HF)  // out[h][a][b] = in[h][b][a], in viewed [nh][half][2]
                    src[h * hd + a * half + b] = h * hd + b * 2 + a;
                else  // out[h][b][a] = in[h][a][b], in viewed [nh][2][half]
                    src[h * hd + b * 2 + a] = h * hd + a * half + b;
            }
    return src;
}

std::vector<float> permuted(nmap_dir dir, const std::vector<float> &w, int64_t rows, int64_t cols, int heads) {
    std::vector<float> out(w.size());
    fsdp_err err{};
    EXPECT_EQ(nmap_permute_rows(dir, out.data(), w.data(), rows, cols, sizeof(float), heads, &err), 0) << err.msg;
    return out;
}

}  // namespace

TEST(NmapPerm, HandComputedSmallExample) {
    // nh = 2, hd = 4, d = 3; row r holds r*10 + c.
    std::vector<float> w(8 * 3);
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) w[r * 3 + c] = (float)(r * 10 + c);
    std::vector<float> hf = permuted(NMAP_TT_TO_HF, w, 8, 3, 2);
    const int want_hf[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) EXPECT_EQ(hf[r * 3 + c], want_hf[r] * 10 + c) << r;
    std::vector<float> back = permuted(NMAP_HF_TO_TT, hf, 8, 3, 2);
    EXPECT_EQ(back, w);

    // hd = 8 tells the two directions apart: to_hf takes even rows then odd rows of each head.
    const int64_t to_hf8[8] = {0, 2, 4, 6, 1, 3, 5, 7}, from_hf8[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int r = 0; r < 16; r++) {
        EXPECT_EQ(nmap_perm_src_row(NMAP_TT_TO_HF, 16, 2, r), (r / 8) * 8 + to_hf8[r % 8]);
        EXPECT_EQ(nmap_perm_src_row(NMAP_HF_TO_TT, 16, 2, r), (r / 8) * 8 + from_hf8[r % 8]);
    }
}

TEST(NmapPerm, MatchesTorchViewTransposeAndRoundTrips) {
    for (int nh : {1, 2, 4, 8})
        for (int hd : {2, 4, 6, 16, 128}) {
            for (nmap_dir dir : {NMAP_TT_TO_HF, NMAP_HF_TO_TT}) {
                std::vector<int64_t> want = torch_perm(dir, nh, hd);
                for (int r = 0; r < nh * hd; r++) ASSERT_EQ(nmap_perm_src_row(dir, nh * hd, nh, r), want[r]);
            }
        }
    // tiny wq [64, 64] (4 heads) and wk [32, 64] (2 kv heads): round trip and not the identity
    for (auto [rows, heads] : {std::pair<int64_t, int>{64, 4}, {32, 2}}) {
        std::vector<float> w(rows * 64);
        for (size_t i = 0; i < w.size(); i++) w[i] = std::sin((float)i);
        std::vector<float> hf = permuted(NMAP_TT_TO_HF, w, rows, 64, heads);
        EXPECT_NE(hf, w);
        EXPECT_EQ(permuted(NMAP_HF_TO_TT, hf, rows, 64, heads), w);
    }
    // any element size
    std::vector<uint16_t> b16(8 * 5), o16(8 * 5), r16(8 * 5);
    for (size_t i = 0; i < b16.size(); i++) b16[i] = (uint16_t)i;
    fsdp_err err{};
    ASSERT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, o16.data(), b16.data(), 8, 5, 2, 2, &err), 0);
    ASSERT_EQ(nmap_permute_rows(NMAP_HF_TO_TT, r16.data(), o16.data(), 8, 5, 2, 2, &err), 0);
    EXPECT_EQ(r16, b16);
    EXPECT_EQ(o16[1 * 5], b16[2 * 5]);
}

TEST(NmapPerm, RopeScoresAgreeBetweenLayouts) {
    // q.k scores with interleaved RoPE on torchtitan weights equal those with rotate_half RoPE on the
    // permuted (HF) weights: the permutation is exactly the change of RoPE convention.
    const int nh = 2, nkv = 1, hd = 8, d = 6, half = hd / 2;
    std::vector<float> wq(nh * hd * d), wk(nkv * hd * d), x1(d), x2(d);
    for (size_t i = 0; i < wq.size(); i++) wq[i] = std::cos(0.7f * i + 0.1f);
    for (size_t i = 0; i < wk.size(); i++) wk[i] = std::sin(1.3f * i + 0.2f);
    for (int i = 0; i < d; i++) x1[i] = 0.3f * i - 0.5f, x2[i] = 1.0f - 0.2f * i;
    std::vector<float> wq_hf = permuted(NMAP_TT_TO_HF, wq, nh * hd, d, nh);
    std::vector<float> wk_hf = permuted(NMAP_TT_TO_HF, wk, nkv * hd, d, nkv);
    auto matvec = [&](const std::vector<float> &w, const std::vector<float> &x, int rows) {
        std::vector<double> y(rows, 0.0);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < d; c++) y[r] += (double)w[r * d + c] * x[c];
        return y;
    };
    auto rope = [&](std::vector<double> v, int heads, int pos, bool interleaved) {
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < half; j++) {
                double th = pos * std::pow(10000.0, -2.0 * j / hd), c = std::cos(th), s = std::sin(th);
                int a = interleaved ? h * hd + 2 * j : h * hd + j, b = interleaved ? a + 1 : a + half;
                double x = v[a], y = v[b];
                v[a] = x * c - y * s;
                v[b] = x * s + y * c;
            }
        return v;
    };
    for (int p1 : {0, 3, 17})
        for (int p2 : {1, 5}) {
            auto q_tt = rope(matvec(wq, x1, nh * hd), nh, p1, true), k_tt = rope(matvec(wk, x2, nkv * hd), nkv, p2, true);
            auto q_hf = rope(matvec(wq_hf, x1, nh * hd), nh, p1, false),
                 k_hf = rope(matvec(wk_hf, x2, nkv * hd), nkv, p2, false);
            for (int h = 0; h < nh; h++) {
                double s_tt = 0, s_hf = 0;
                for (int i = 0; i < hd; i++) {
                    s_tt += q_tt[h * hd + i] * k_tt[i];  // GQA: both q heads use kv head 0
                    s_hf += q_hf[h * hd + i] * k_hf[i];
                }
                EXPECT_NEAR(s_tt, s_hf, 1e-9) << p1 << " " << p2 << " " << h;
            }
            // and without the permutation the scores differ (the test can fail)
            auto q_bad = rope(matvec(wq, x1, nh * hd), nh, p1, false), k_bad = rope(matvec(wk, x2, nkv * hd), nkv, p2, false);
            double s_tt = 0, s_bad = 0;
            for (int i = 0; i < hd; i++) s_tt += q_tt[i] * k_tt[i], s_bad += q_bad[i] * k_bad[i];
            if (p1 != p2) { EXPECT_GT(std::fabs(s_tt - s_bad), 1e-6); }
        }
}

TEST(NmapPerm, PartialRowsReadOnlyTheNeededSourceRows) {
    const int64_t rows = 24, cols = 3;
    const int heads = 3;  // hd = 8
    std::vector<int32_t> src(rows * cols);
    for (size_t i = 0; i < src.size(); i++) src[i] = (int32_t)i;
    for (nmap_dir dir : {NMAP_TT_TO_HF, NMAP_HF_TO_TT}) {
        std::vector<int32_t> full(src.size());
        fsdp_err err{};
        ASSERT_EQ(nmap_permute_rows(dir, full.data(), src.data(), rows, cols, 4, heads, &err), 0);
        for (int64_t r0 = 0; r0 <= rows; r0++)
            for (int64_t r1 = r0; r1 <= rows; r1++) {
                int64_t lo = -1, hi = -1;
                ASSERT_EQ(nmap_perm_src_range(dir, rows, heads, r0, r1, &lo, &hi, &err), 0);
                ASSERT_LE(lo, hi);
                if (r1 > r0) {
                    // the range stays inside the heads that [r0, r1) touches
                    EXPECT_GE(lo, r0 / 8 * 8);
                    EXPECT_LE(hi, (r1 + 7) / 8 * 8);
                }
                std::vector<int32_t> part((r1 - r0) * cols + 1);
                ASSERT_EQ(nmap_permute_rows_part(dir, part.data(), r0, r1, src.data() + lo * cols, lo, hi, rows, cols, 4,
                                                 heads, &err),
                          0)
                    << err.msg;
                for (int64_t i = 0; i < (r1 - r0) * cols; i++) ASSERT_EQ(part[i], full[r0 * cols + i]);
                if (r1 - r0 >= 2 && hi - lo >= 2) {  // a source block one row short must be refused
                    EXPECT_NE(nmap_permute_rows_part(dir, part.data(), r0, r1, src.data() + (lo + 1) * cols, lo + 1, hi,
                                                     rows, cols, 4, heads, &err),
                              0);
                }
            }
    }
    // rows [2, 4) of one 8-row head (to_hf) need source rows 4 and 6 only
    int64_t lo, hi;
    fsdp_err err{};
    ASSERT_EQ(nmap_perm_src_range(NMAP_TT_TO_HF, 8, 1, 2, 4, &lo, &hi, &err), 0);
    EXPECT_EQ(lo, 4);
    EXPECT_EQ(hi, 7);
}

TEST(NmapPerm, BadShapesAreErrors) {
    fsdp_err err{};
    std::vector<float> a(30 * 2), b(30 * 2);
    EXPECT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, b.data(), a.data(), 30, 2, 4, 4, &err), FSDP_E_INVALID);  // 30 % 4
    EXPECT_NE(std::string(err.msg).find("30 rows"), std::string::npos);
    EXPECT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, b.data(), a.data(), 30, 2, 4, 2, &err), FSDP_E_INVALID);  // hd 15 odd
    EXPECT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, b.data(), a.data(), 30, 2, 4, 0, &err), FSDP_E_INVALID);
    EXPECT_EQ(nmap_permute_rows(NMAP_TT_TO_HF, b.data(), a.data(), 30, -2, 4, 3, &err), FSDP_E_INVALID);
    int64_t lo, hi;
    EXPECT_EQ(nmap_perm_src_range(NMAP_TT_TO_HF, 8, 2, 3, 9, &lo, &hi, &err), FSDP_E_INVALID);
    EXPECT_EQ(nmap_perm_check(0, 2, &err), 0);
}

// ------------------------------------------------------------------ globs and rules

TEST(NmapGlob, CapturesAndComponentRules) {
    nmap_span c[NMAP_MAX_CAPTURES];
    const char *n = "layers.12.attention.qkv_linear.wq.weight";
    ASSERT_EQ(nmap_glob_match("layers.*.attention.qkv_linear.w*.weight", n, c), 2);
    EXPECT_EQ(std::string(n + c[0].off, c[0].len), "12");
    EXPECT_EQ(std::string(n + c[1].off, c[1].len), "q");
    EXPECT_EQ(nmap_glob_match("layers.*.weight", "layers.0.attention.weight", c), -1);  // * stays in one component
    ASSERT_EQ(nmap_glob_match("layers.**.weight", "layers.0.attention.weight", c), 1);
    EXPECT_EQ(c[0].off, 7u);
    EXPECT_EQ(c[0].len, 11u);
    ASSERT_EQ(nmap_glob_match("**.**", "a.b.c", c), 2);  // earlier wildcards take the shortest match
    EXPECT_EQ(c[0].len, 1u);
    EXPECT_EQ(c[1].len, 3u);
    EXPECT_EQ(nmap_glob_match("norm.weight", "norm.weight", c), 0);
    EXPECT_EQ(nmap_glob_match("norm.weight", "norm.weights", c), -1);
    EXPECT_EQ(nmap_glob_match("*.weight", ".weight", c), -1);  // captures are non-empty
    EXPECT_EQ(nmap_glob_match("a***", "abc", c), -1);

    char out[NMAP_NAME_MAX];
    fsdp_err err{};
    ASSERT_EQ(nmap_glob_rewrite("layers.*.attention.qkv_linear.w*.weight", "layers.*.attention.w*.weight", n, out,
                                sizeof out, &err),
              0);
    EXPECT_STREQ(out, "layers.12.attention.wq.weight");
    ASSERT_EQ(nmap_glob_rewrite("**.mlp.*", "**.mlp_gen.*", "model.layers.0.mlp.gate_proj", out, sizeof out, &err), 0);
    EXPECT_STREQ(out, "model.layers.0.mlp_gen.gate_proj");
    ASSERT_EQ(nmap_glob_rewrite("model.*.*.x", "y.*", "model.a.b.x", out, sizeof out, &err), 0);  // fewer wildcards
    EXPECT_STREQ(out, "y.a");
    EXPECT_NE(nmap_glob_rewrite("a.*", "*.*", "a.b", out, sizeof out, &err), 0);
    EXPECT_NE(nmap_glob_rewrite("a.*", "b.*", "c.d", out, sizeof out, &err), 0);
    char tiny[6];
    EXPECT_NE(nmap_glob_rewrite("a.*", "bbbb.*", "a.cc", tiny, sizeof tiny, &err), 0);
}

TEST(NmapGlob, PathologicalPatternsDoNotHang) {
    std::string name(600, 'a');
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(nmap_glob_match("**a**a**a**a**a**a**a**b", name.c_str(), nullptr), -1);
    std::string dotted;
    for (int i = 0; i < 300; i++) dotted += "x.";
    dotted += "y";
    EXPECT_EQ(nmap_glob_match("**.**.**.**.**.**.**.z", dotted.c_str(), nullptr), -1);
    EXPECT_EQ(nmap_glob_match("**.**.**.**.**.**.**.y", dotted.c_str(), nullptr), 7);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0);
}

TEST(NmapRules, OrderedFirstMatchDropAndUnusedReport) {
    nmap_rules *r = nullptr;
    fsdp_err err{};
    ASSERT_EQ(nmap_rules_new(&r, &err), 0);
    ASSERT_EQ(nmap_rules_add(r, "layers.*.attention.qkv_linear.w*.weight", "layers.*.attention.w*.weight", &err), 0);
    ASSERT_EQ(nmap_rules_add(r, "lm_head.weight", "output.weight", &err), 0);
    ASSERT_EQ(nmap_rules_add(r, "**.inv_freq", "", &err), 0);
    ASSERT_EQ(nmap_rules_add(r, "layers.*.*.weight", "blocks.*.*.w", &err), 0);
    ASSERT_EQ(nmap_rules_add(r, "layers.0.ffn_norm.weight", "never", &err), 0);  // shadowed by rule 4
    ASSERT_EQ(nmap_rules_add(r, "encoder.**", "enc.**", &err), 0);
    EXPECT_NE(nmap_rules_add(r, "a.*", "*.*", &err), 0);
    EXPECT_NE(std::string(err.msg).find("a.*"), std::string::npos);
    EXPECT_NE(nmap_rules_add(r, "a***", "b", &err), 0);
    EXPECT_NE(nmap_rules_add(r, "", "b", &err), 0);
    EXPECT_EQ(nmap_rules_count(r), 6u);

    char out[NMAP_NAME_MAX];
    nmap_status st;
    int which;
    struct {
        const char *in, *out;
        nmap_status st;
        int rule;
    } cases[] = {
        {"layers.7.attention.qkv_linear.wv.weight", "layers.7.attention.wv.weight", NMAP_RENAMED, 0},
        {"lm_head.weight", "output.weight", NMAP_RENAMED, 1},
        {"model.layers.0.self_attn.rotary_emb.inv_freq", "", NMAP_DROPPED, 2},
        {"layers.0.ffn_norm.weight", "blocks.0.ffn_norm.w", NMAP_RENAMED, 3},
        {"norm.weight", "norm.weight", NMAP_KEPT, -1},
        {"layers.0.attention.wq.weight", "layers.0.attention.wq.weight", NMAP_KEPT, -1},
    };
    for (auto &c : cases) {
        ASSERT_EQ(nmap_rules_apply(r, c.in, out, sizeof out, &st, &which, &err), 0) << err.msg;
        EXPECT_STREQ(out, c.out) << c.in;
        EXPECT_EQ(st, c.st) << c.in;
        EXPECT_EQ(which, c.rule) << c.in;
    }
    EXPECT_EQ(nmap_rules_hits(r, 0), 1u);
    EXPECT_EQ(nmap_rules_hits(r, 4), 0u);
    EXPECT_EQ(nmap_rules_check_used(r, &err), FSDP_E_INVALID);
    std::string m = err.msg;
    EXPECT_NE(m.find("2 rename rules matched no tensor"), std::string::npos) << m;
    EXPECT_NE(m.find("'layers.0.ffn_norm.weight' (rule 5)"), std::string::npos) << m;
    EXPECT_NE(m.find("'encoder.**' (rule 6)"), std::string::npos) << m;
    ASSERT_EQ(nmap_rules_apply(r, "encoder.blocks.3.attn", out, sizeof out, &st, &which, &err), 0);
    EXPECT_STREQ(out, "enc.blocks.3.attn");
    EXPECT_NE(nmap_rules_check_used(r, &err), 0);  // rule 5 still unused
    EXPECT_EQ(std::string(err.msg).find("encoder"), std::string::npos);
    nmap_rules_reset_hits(r);
    EXPECT_EQ(nmap_rules_hits(r, 0), 0u);
    nmap_rules_free(r);

    // an empty rule set keeps everything and reports nothing
    ASSERT_EQ(nmap_rules_new(&r, &err), 0);
    ASSERT_EQ(nmap_rules_apply(r, "x.y", out, sizeof out, &st, &which, &err), 0);
    EXPECT_STREQ(out, "x.y");
    EXPECT_EQ(nmap_rules_check_used(r, &err), 0);
    nmap_rules_free(r);
}

TEST(NmapRules, BuiltInTorchtitanAliases) {
    nmap_rules *r = nullptr;
    fsdp_err err{};
    ASSERT_EQ(nmap_rules_new(&r, &err), 0);
    ASSERT_EQ(nmap_rules_add_tt_aliases(r, &err), 0);
    char out[NMAP_NAME_MAX];
    nmap_status st;
    // every tiny name, restyled to 2026, comes back to the classic name through the alias rules
    for (const std::string &n : tiny_names()) {
        char s26[NMAP_NAME_MAX];
        ASSERT_EQ(nmap_tt_restyle(n.c_str(), NMAP_TT_2026, s26, sizeof s26, nullptr, &err), 0);
        ASSERT_EQ(nmap_rules_apply(r, s26, out, sizeof out, &st, nullptr, &err), 0);
        EXPECT_EQ(std::string(out), n);
        EXPECT_EQ(st, std::string(s26) == n ? NMAP_KEPT : NMAP_RENAMED);
    }
    EXPECT_EQ(nmap_rules_check_used(r, &err), 0) << err.msg;
    nmap_rules_free(r);
}
