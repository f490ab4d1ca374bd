// Collectives per transformer block (train/flat_group.h, train-steps flat_collectives): one
// all-gather and one reduce-scatter of each layer's parameters on a rank-major flat buffer instead of
// one per parameter. The layout on uneven and empty shards; the message count per step (O(layers));
// and the same losses and weights as the per-parameter path: bit for bit on 2 ranks (each summed
// element is a + b either way), within float32 summation order on 3 (uneven shards), for Llama and
// the HF archs with biases (qwen2) and q/k norms (qwen3, tied embeddings), with and without gradient
// accumulation and activation checkpointing; on the CPU and on the (emulated) GPU with bf16 gathers,
// kept gathered layers and the offloaded optimizer.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "train/flat_group.h"
#include "runtime/state.h"
}
#include "gpu_util.h"
#include "test_util.h"
#include "train_run_util.h"

using namespace fsdp_test;
using train_test::Dir;

namespace {

// A sharded parameter of `shape` as rank `rank` of `world` holds it (no data: the layout only).
state_param param(const char *name, std::vector<int64_t> shape, int world, int rank) {
    state_param p;
    memset(&p, 0, sizeof p);
    p.name = const_cast<char *>(name);
    p.ndim = (int)shape.size();
    for (size_t d = 0; d < shape.size(); d++) p.shape[d] = shape[d];
    p.row_numel = 1;
    for (size_t d = 1; d < shape.size(); d++) p.row_numel *= shape[d];
    int64_t d0 = shape.empty() ? 1 : shape[0], chunk = (d0 + world - 1) / world;
    p.row0 = std::min<int64_t>(d0, rank * chunk);
    p.rows = std::min<int64_t>(d0, p.row0 + chunk) - p.row0;
    return p;
}

// Models of the end-to-end runs: Llama with its own output, qwen2 (q/k/v biases), qwen3 (q/k norms
// of head_dim 2: on 3 ranks the last rank holds 0 rows of them; tied embeddings).
const char *const LLAMA = "{preset: tiny, n_layers: 2, tie_embeddings: false}";
const char *const QWEN2 =
    "{arch: qwen2, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 256, ffn_hidden: 160, max_seq_len: 64}";
const char *const QWEN3 = "{arch: qwen3, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 2, vocab_size: 256, "
                          "ffn_hidden: 160, max_seq_len: 64, tie_embeddings: true}";

// 3 steps on the quickstart text: global batch `batch` rows of 32 tokens, train-steps keys `extra`,
// weights in OUT.safetensors, metrics in OUT.jsonl.
std::string recipe(const std::string &model, int batch, bool flat, const std::string &extra, const std::string &out,
                   const char *device = "cpu") {
    return "runtime: {device: " + std::string(device) + "}\nmodel: " + model +
           "\ndata: {kind: text, path: data/quickstart.txt, batch_size: " + std::to_string(batch) + ", seq_len: 32}\n"
           "stages:\n  - {id: i, uses: init-meta}\n"
           "  - {id: t, uses: train-steps, with: {steps: 3, lr: 1e-3, warmup_steps: 1, metrics: " + out + ".jsonl" +
           ", flat_collectives: " + (flat ? "true" : "false") + (extra.empty() ? "" : ", " + extra) + "}}\n"
           "  - {id: s, uses: save-safetensors, with: {path: " + out + ".safetensors}}\n";
}

// The runs' losses and gradient norms per step and their weights: identical (tol 0) or within tol
// (relative; the weights |a - b| / (1 + |b|)).
void expect_same(const std::string &a, const std::string &b, double tol) {
    std::vector<double> la = train_test::column(a + ".jsonl", "loss"), lb = train_test::column(b + ".jsonl", "loss");
    std::vector<double> ga = train_test::column(a + ".jsonl", "grad_norm"),
                        gb = train_test::column(b + ".jsonl", "grad_norm");
    ASSERT_EQ(la.size(), 3u);
    ASSERT_EQ(lb.size(), 3u);
    ASSERT_EQ(ga.size(), 3u);
    ASSERT_EQ(gb.size(), 3u);
    for (size_t k = 0; k < 3; k++) {
        if (tol == 0) {
            EXPECT_EQ(la[k], lb[k]) << "step " << k + 1;
            EXPECT_EQ(ga[k], gb[k]) << "step " << k + 1;
        } else {
            EXPECT_NEAR(la[k], lb[k], tol * lb[k]) << "step " << k + 1;
            EXPECT_NEAR(ga[k], gb[k], tol * gb[k]) << "step " << k + 1;
        }
    }
    if (tol == 0) {
        std::string fa = read_file(a + ".safetensors"), fb = read_file(b + ".safetensors");
        EXPECT_FALSE(fa.empty());
        EXPECT_TRUE(fa == fb) << a << ".safetensors and " << b << ".safetensors differ";
    } else {
        std::string worst;
        EXPECT_LT(train_test::max_rel_diff(a + ".safetensors", b + ".safetensors", &worst), tol) << worst;
    }
}

// Runs the recipe flat and per parameter (prefix: mpirun ...), then compares them.
void flat_vs_per_param(const Dir &t, const std::string &name, const std::string &model, int batch,
                       const std::string &extra, const std::string &prefix, double tol, const char *device = "cpu") {
    SCOPED_TRACE(name + " " + model + " " + extra + " " + prefix);
    std::string o;
    write_file(t / (name + "_f.yaml"), recipe(model, batch, true, extra, t / (name + "_f"), device));
    write_file(t / (name + "_p.yaml"), recipe(model, batch, false, extra, t / (name + "_p"), device));
    ASSERT_EQ(train_test::run("-q " + (t / (name + "_f.yaml")), &o, prefix), 0) << o;
    ASSERT_EQ(train_test::run("-q " + (t / (name + "_p.yaml")), &o, prefix), 0) << o;
    expect_same(t / (name + "_f"), t / (name + "_p"), tol);
}

// The train stage's collectives per step (the report's metric) of a run on np ranks.
double collectives(const Dir &t, const std::string &model, bool flat, const std::string &prefix, const char *key,
                   const char *device = "cpu", const std::string &extra = "") {
    std::string o, name = std::string(flat ? "cf" : "cp");
    write_file(t / (name + ".yaml"), recipe(model, 8, flat, extra, t / name, device));
    int rc = train_test::run("-q --report " + (t / (name + ".json")) + " " + (t / (name + ".yaml")), &o, prefix);
    EXPECT_EQ(rc, 0) << o;
    return train_test::report_metric(t / (name + ".json"), "train-steps", key);
}

// 3 ranks on the GPU: the emulator given 3 devices, or 3 real GPUs; "" when neither.
std::string gpu3_prefix() {
    return getenv("FSDP_EMU_DEVICES") ? "env FSDP_EMU_DEVICES=3 " + mpirun_prefix(3)
           : gpu_count() >= 3         ? mpirun_prefix(3)
                                      : "";
}

}  // namespace

// Rank-major: rank r's block holds rank r's rows of every parameter in order; torch.chunk rows (3
// ranks: 5 rows are 2 + 2 + 1, 2 rows are 1 + 1 + 0).
TEST(FsdpFlat, LayoutIsRankMajorWithUnevenAndEmptyShards) {
    const int W = 3;
    for (int rank = 0; rank < W; rank++) {
        state_param a = param("a", {5, 4}, W, rank), b = param("b", {2}, W, rank), c = param("c", {3, 2}, W, rank);
        state_param *ps[3] = {&a, &b, &c};
        flat_group *g = nullptr;
        fsdp_err err;
        fsdp_err_clear(&err);
        ASSERT_EQ(flat_group_create(ps, 3, W, rank, &g, &err), 0) << err.msg;
        // blocks: rank 0 {a 2x4, b 1, c 1x2} = 11, rank 1 the same, rank 2 {a 1x4, b 0, c 1x2} = 6
        EXPECT_EQ(g->counts[0], 11u);
        EXPECT_EQ(g->counts[1], 11u);
        EXPECT_EQ(g->counts[2], 6u);
        EXPECT_EQ(g->displs[1], 11u);
        EXPECT_EQ(g->displs[2], 22u);
        EXPECT_EQ(g->total, 28u);
        EXPECT_EQ(g->bytes[2], 6 * sizeof(float));
        EXPECT_EQ(flat_group_scratch_numel(g), 28u + g->counts[rank]);
        const flat_group_seg *s = g->segs;
        // rank 1's rows: a rows 2..3 at flat 11, b row 1 at 19, c row 1 at 20
        EXPECT_EQ(s[1 * 3 + 0].flat_off, 11u);
        EXPECT_EQ(s[1 * 3 + 0].full_off, 8u);
        EXPECT_EQ(s[1 * 3 + 0].n, 8u);
        EXPECT_EQ(s[1 * 3 + 1].flat_off, 19u);
        EXPECT_EQ(s[1 * 3 + 1].full_off, 1u);
        EXPECT_EQ(s[1 * 3 + 1].n, 1u);
        EXPECT_EQ(s[1 * 3 + 2].flat_off, 20u);
        EXPECT_EQ(s[1 * 3 + 2].full_off, 2u);
        // rank 2 holds nothing of b
        EXPECT_EQ(s[2 * 3 + 1].n, 0u);
        EXPECT_EQ(s[2 * 3 + 2].flat_off, 26u);
        EXPECT_EQ(s[2 * 3 + 2].full_off, 4u);
        // every element of every parameter is in exactly one segment
        for (int k = 0; k < 3; k++) {
            size_t n = 0;
            for (int r = 0; r < W; r++) n += s[r * 3 + k].n;
            EXPECT_EQ((int64_t)n, state_param_numel(ps[k])) << k;
        }
        flat_group_free(g);
    }
}

// World 1: the gather and the reduce-scatter are copies between the parameters and the full buffers.
TEST(FsdpFlat, OneRankGathersAndReducesByCopying) {
    state_param a = param("a", {3, 2}, 1, 0), b = param("b", {4}, 1, 0);
    float ad[6] = {1, 2, 3, 4, 5, 6}, bd[4] = {7, 8, 9, 10}, ag[6], bg[4];
    a.data = ad;
    b.data = bd;
    a.grad = ag;
    b.grad = bg;
    state_param *ps[2] = {&a, &b};
    flat_group *g = nullptr;
    comm *c = nullptr;
    fsdp_err err;
    fsdp_err_clear(&err);
    ASSERT_EQ(comm_create_single(&c, &err), 0) << err.msg;
    ASSERT_EQ(flat_group_create(ps, 2, 1, 0, &g, &err), 0) << err.msg;
    float fa[6] = {0}, fb[4] = {0};
    float *full[2] = {fa, fb};
    ASSERT_EQ(flat_group_gather(g, c, nullptr, full, &err), 0) << err.msg;
    EXPECT_EQ(memcmp(fa, ad, sizeof fa), 0);
    EXPECT_EQ(memcmp(fb, bd, sizeof fb), 0);
    for (float &x : fa) x *= -1;
    const float *cfull[2] = {fa, fb};
    ASSERT_EQ(flat_group_reduce_scatter(g, c, nullptr, cfull, nullptr, &err), 0) << err.msg;
    EXPECT_EQ(ag[5], -6.0f);
    EXPECT_EQ(bg[3], 10.0f);
    flat_group_free(g);
    comm_destroy(c);
}

// A 0-d (replicated) parameter, or rows other than torch.chunk's for the rank: a clear error.
TEST(FsdpFlat, GroupRejectsReplicatedOrMisShardedParameters) {
    state_param a = param("layers.0.w", {4, 2}, 2, 1), z = param("layers.0.scale", {}, 2, 1);
    z.rows = 1;
    state_param *ps[2] = {&a, &z};
    flat_group *g = nullptr;
    fsdp_err err;
    fsdp_err_clear(&err);
    EXPECT_EQ(flat_group_create(ps, 2, 2, 1, &g, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("layers.0.scale is 0-d"), std::string::npos) << err.msg;
    EXPECT_EQ(g, nullptr);
    a.rows = 1;
    fsdp_err_clear(&err);
    EXPECT_EQ(flat_group_create(ps, 1, 2, 1, &g, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("layers.0.w holds rows 2+1, rank 1 of 2 should hold 2+2"), std::string::npos)
        << err.msg;
}

// The message count per step on 2 ranks is O(layers): per block, 2 all-gathers (forward, backward)
// and 1 reduce-scatter, plus the embedding / norm / output (3 gathers, 3 reduce-scatters) and 3
// all-reduces (token count, loss, gradient norm): 3 L + 9. Per parameter: 27 L + 9 (9 per layer).
TEST(FsdpFlat, CollectivesPerStepAreThreePerBlock) {
    Dir t;
    for (int L : {2, 4}) {
        SCOPED_TRACE(L);
        std::string model = "{preset: tiny, n_layers: " + std::to_string(L) + ", tie_embeddings: false}";
        EXPECT_EQ(collectives(t, model, true, mpirun_prefix(2), "collectives_per_step"), 3 * L + 9);
        EXPECT_EQ(train_test::report_metric(t / "cf.json", "train-steps", "all_gathers_per_step"), 2 * L + 3);
        EXPECT_EQ(train_test::report_metric(t / "cf.json", "train-steps", "reduce_scatters_per_step"), L + 3);
        EXPECT_EQ(train_test::report_metric(t / "cf.json", "train-steps", "all_reduces_per_step"), 3);
        EXPECT_EQ(collectives(t, model, false, mpirun_prefix(2), "collectives_per_step"), 27 * L + 9);
    }
    // gradient accumulation: the gathers per micro-batch, the reduce-scatters once per step
    std::string model = "{preset: tiny, n_layers: 2, tie_embeddings: false}";
    EXPECT_EQ(collectives(t, model, true, mpirun_prefix(2), "reduce_scatters_per_step", "cpu", "grad_accum: 2"), 2 + 3);
    EXPECT_EQ(train_test::report_metric(t / "cf.json", "train-steps", "all_gathers_per_step"), 2 * (2 * 2 + 3));
}

// 2 ranks: the flat path's losses, gradient norms and saved weights are the per-parameter path's, bit
// for bit (every reduced element is the sum of two numbers, whatever the message), for Llama, qwen2
// (biases) and qwen3 (q/k norms, tied embeddings), with and without accumulation and checkpointing.
TEST(FsdpFlat, TwoRanksAreBitIdenticalToPerParameter) {
    Dir t;
    int n = 0;
    for (const char *model : {LLAMA, QWEN2, QWEN3})
        for (const char *extra : {"", "grad_accum: 2", "ac: full"})
            flat_vs_per_param(t, "r" + std::to_string(n++), model, 8, extra, mpirun_prefix(2), 0);
}

// 3 ranks: uneven row shards (5 of 7 ... rows; qwen3's q/k norms of 2 rows leave the last rank none).
// Tolerance 1e-5 relative, the bound the other multi-rank training tests use: with 3 ranks the sum
// (a + b) + c may associate differently when MPI's reduce-scatter picks another algorithm for one
// block's message size than for each parameter's; the gathers are exact copies.
TEST(FsdpFlat, ThreeRanksWithUnevenShardsMatchPerParameter) {
    Dir t;
    int n = 0;
    for (const char *model : {LLAMA, QWEN2, QWEN3})
        for (const char *extra : {"", "grad_accum: 2"})
            flat_vs_per_param(t, "r" + std::to_string(n++), model, 12, extra, mpirun_prefix(3), 1e-5);
}

// The GPU path (the emulated device in build-emu; real GPUs when present): the same counts and values
// with f32 and bf16 gathers, kept gathered layers, accumulation and the offloaded optimizer.
TEST(FsdpFlatGpu, FlatMatchesPerParameterOnTheGpu) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    Dir t;
    int n = 0;
    const std::string two = gpu_count() >= 2 || getenv("FSDP_EMU_DEVICES") ? mpirun_prefix(2) : "";
    // (the emulated device is slow: the cases are few; activation checkpointing does not touch the
    // collectives, the CPU test covers it)
    for (const char *extra : {"", "mixed: bf16", "grad_accum: 2, reshard_after_forward: false"})
        flat_vs_per_param(t, "g" + std::to_string(n++), LLAMA, 8, extra, two, 0, "cuda");
    flat_vs_per_param(t, "g" + std::to_string(n++), QWEN3, 8, "mixed: bf16, grad_accum: 2", two, 0, "cuda");
    // the offloaded optimizer (moments in host memory, downloads after each block's reduce-scatter)
    {
        std::string o;
        for (bool flat : {true, false}) {
            std::string name = flat ? "off_f" : "off_p";
            std::string r = recipe(LLAMA, 8, flat, "grad_accum: 2", t / name, "cuda");
            r.replace(r.find("  - {id: t,"), 0, "  - {id: o, uses: offload}\n");
            write_file(t / (name + ".yaml"), r);
            ASSERT_EQ(train_test::run("-q " + (t / (name + ".yaml")), &o, two), 0) << o;
        }
        expect_same(t / "off_f", t / "off_p", 0);
    }
    std::string three = gpu3_prefix();
    if (three.empty()) {
        printf("[ FsdpFlatGpu ] 3 ranks not run: %d GPU(s)\n", gpu_count());
        return;
    }
    flat_vs_per_param(t, "g3_" + std::to_string(n++), LLAMA, 12, "", three, 1e-5, "cuda");
    flat_vs_per_param(t, "g3_" + std::to_string(n++), QWEN3, 12, "mixed: bf16, grad_accum: 2", three, 1e-5, "cuda");
}

// The GPU path's message count: per block one all-gather in the forward, one in the backward for the
// layers no longer resident (all but the last two; none with reshard_after_forward: false) and one
// reduce-scatter; embedding, norm and output 3 + 3; the token count (host) and the loss / norm
// (device) all-reduces.
TEST(FsdpFlatGpu, CollectivesPerStepAreLinearInLayers) {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    if (!(gpu_count() >= 2 || getenv("FSDP_EMU_DEVICES"))) GTEST_SKIP() << "needs 2 GPUs";
    Dir t;
    for (int L : {2, 4}) {
        SCOPED_TRACE(L);
        std::string model = "{preset: tiny, n_layers: " + std::to_string(L) + ", tie_embeddings: false}";
        EXPECT_EQ(collectives(t, model, true, mpirun_prefix(2), "collectives_per_step", "cuda"),
                  3 + L + (L - 2) + L + 3 + 2);
        if (L == 4)
            EXPECT_EQ(collectives(t, model, true, mpirun_prefix(2), "collectives_per_step", "cuda",
                                  "reshard_after_forward: false"),
                      3 + L + L + 3 + 2);
        else
            EXPECT_EQ(collectives(t, model, false, mpirun_prefix(2), "collectives_per_step", "cuda"),
                      3 + 9 * L + 9 * (L - 2) + 9 * L + 3 + 2);
    }
}
