// train-steps' metrics (tokens/s, MFU, peak memory) and its GPU options' validation, on the CPU
// path through the fsdp-run binary; the FLOP count of MFU against hand computations.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "decoder/decoder_config.h"
#include "stages/train_backend.h"
}
#include "test_util.h"
#include "jsonl_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-trainm");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

decoder_config preset(const char *name) {
    decoder_config c;
    fsdp_err err;
    EXPECT_EQ(decoder_config_preset(&c, name, &err), 0) << err.msg;
    EXPECT_EQ(decoder_config_finalize(&c, &err), 0) << err.msg;
    return c;
}

std::string recipe(const std::string &train_with) {
    return "model: {preset: tiny}\n"
           "data: {kind: text, path: data/quickstart.txt, batch_size: 4, seq_len: 32}\n"
           "stages:\n  - {id: i, uses: init-meta}\n"
           "  - {id: t, uses: train-steps, with: {steps: 3, " +
           train_with + "}}\n";
}

int run(const std::string &args, std::string *out) {
    return run_cmd("timeout -k 10 120 " + fsdp_run_bin() + " -q " + args, out);
}

std::vector<json_t *> lines(const std::string &path) { return jsonl_objects(path); }

json_t *train_metrics(json_t *report) {
    json_t *stages = json_object_get(report, "stages");
    for (size_t i = 0; i < json_array_size(stages); i++) {
        json_t *s = json_array_get(stages, i);
        if (!strcmp(json_string_value(json_object_get(s, "stage")), "train-steps"))
            return json_object_get(s, "metrics");
    }
    return nullptr;
}

}  // namespace

TEST(TrainFlops, Llama3_1bAndTinyByHand) {
    // llama3_1b: dim 2048, 16 layers, 32 heads (head_dim 64), 8 kv heads, ffn 8192, vocab 128256.
    // per layer: wq 2048*2048 + wk,wv 512*2048 each + wo 2048*2048 + w1,w2,w3 8192*2048 each
    //            + two norms 2048 = 60821504; non-embedding N = 16*60821504 + 2048 (norm)
    //            + 128256*2048 (output) = 1235814400
    decoder_config c = preset("llama3_1b");
    ASSERT_EQ(c.ffn_hidden, 8192);
    const double n = 16.0 * 60821504 + 2048 + 128256.0 * 2048;
    EXPECT_EQ(n, 1235814400.0);
    EXPECT_EQ(decoder_flops_per_token(&c, 2048), 6 * n + 12.0 * 16 * 32 * 64 * 2048);
    EXPECT_EQ(decoder_flops_per_token(&c, 2048), 8220192768.0);
    EXPECT_EQ(decoder_flops_per_token(&c, 8192), 10636111872.0);
    // tiny: 131392 parameters, 256*64 of them the embedding
    c = preset("tiny");
    EXPECT_EQ(decoder_flops_per_token(&c, 32), 739200.0);
}

TEST(TrainFlops, MfuPercent) {
    // 1e9 FLOPs/token at 1000 tokens/s on a 1 TFLOP/s device: 100 %
    EXPECT_DOUBLE_EQ(train_mfu_percent(1e9, 1000, 1.0), 100.0);
    EXPECT_DOUBLE_EQ(train_mfu_percent(8220192768.0, 10000, 989), 100.0 * 8220192768.0 * 1e4 / 989e12);
    EXPECT_EQ(train_mfu_percent(1e9, 1000, 0), 0.0);
    EXPECT_EQ(train_mfu_percent(1e9, 0, 989), 0.0);
    EXPECT_EQ(train_mfu_percent(1e9, 1000, NAN), 0.0);
}

TEST(TrainMetrics, CpuJsonlAndReportCarryThroughputMfuAndPeakRss) {
    Dir t;
    write_file(t / "a.yaml", recipe("peak_tflops: 0.5, metrics: " + (t / "a.jsonl")));
    write_file(t / "b.yaml", recipe("metrics: " + (t / "b.jsonl")));
    std::string out;
    ASSERT_EQ(run("--report " + (t / "rep.json") + " " + (t / "a.yaml"), &out), 0) << out;
    ASSERT_EQ(run(t / "b.yaml", &out), 0) << out;
    const double fpt = 739200.0;  // tiny at seq 32
    auto a = lines(t / "a.jsonl");
    ASSERT_EQ(a.size(), 3u);
    for (json_t *j : a) {
        double tps = json_number_value(json_object_get(j, "tokens_per_s"));
        EXPECT_GT(tps, 0);
        ASSERT_TRUE(json_is_number(json_object_get(j, "mfu")));
        EXPECT_NEAR(json_number_value(json_object_get(j, "mfu")), 100.0 * fpt * tps / 0.5e12, 1e-4 * 100.0 * fpt * tps / 0.5e12);
        EXPECT_GT(json_number_value(json_object_get(j, "peak_rss_mib")), 1.0);
        EXPECT_FALSE(json_object_get(j, "peak_device_mem_mib"));
        json_decref(j);
    }
    // without peak_tflops the CPU reports no mfu
    auto b = lines(t / "b.jsonl");
    ASSERT_EQ(b.size(), 3u);
    for (json_t *j : b) {
        EXPECT_GT(json_number_value(json_object_get(j, "tokens_per_s")), 0);
        EXPECT_FALSE(json_object_get(j, "mfu"));
        EXPECT_TRUE(json_is_number(json_object_get(j, "peak_rss_mib")));
        json_decref(j);
    }
    json_error_t je;
    json_t *rep = json_load_file((t / "rep.json").c_str(), 0, &je);
    ASSERT_TRUE(rep) << je.text;
    json_t *m = train_metrics(rep);
    ASSERT_TRUE(m);
    double tps = json_number_value(json_object_get(m, "tokens_per_s"));
    EXPECT_GT(tps, 0);
    EXPECT_EQ(json_number_value(json_object_get(m, "flops_per_token")), fpt);
    EXPECT_EQ(json_number_value(json_object_get(m, "peak_tflops")), 0.5);
    EXPECT_NEAR(json_number_value(json_object_get(m, "mfu")), 100.0 * fpt * tps / 0.5e12, 1e-6 * 100.0 * fpt * tps / 0.5e12);
    EXPECT_GT(json_number_value(json_object_get(m, "peak_rss_mib")), 1.0);
    json_decref(rep);
}

TEST(TrainMetrics, GpuOptionsAreValidatedAndRejectedOnTheCpuPath) {
    Dir t;
    struct Case {
        const char *with, *want;
        int rc;
    } cases[] = {
        {"ac: partial", "'ac' must be one of: none, full, selective (got 'partial')", 2},
        {"mixed: fp16", "'mixed' must be one of: none, bf16 (got 'fp16')", 2},
        {"peak_tflops: 0", "peak_tflops must be > 0", 2},
        {"reshard_after_forward: maybe", "reshard_after_forward", 2},
        {"head_chunk_rows: -4", "head_chunk_rows is -4, expected 0 (automatic", 2},
        {"head_chunk_rows: many", "head_chunk_rows", 2},
        // a valid value the CPU path does not do: a validation error naming the key (issue 16: static)
        {"mixed: bf16", "mixed: bf16 is the GPU path's precision, but this run trains on the CPU", 2},
    };
    int i = 0;
    for (const Case &c : cases) {
        std::string r = t / ("r" + std::to_string(i++) + ".yaml");
        write_file(r, recipe(c.with));
        std::string out;
        EXPECT_EQ(run(r, &out), c.rc) << c.with << ": " << out;
        EXPECT_NE(out.find(c.want), std::string::npos) << c.with << ": " << out;
    }
}

// The output head in chunks of 5 rows (26 chunks of the 128, the last partial) trains like one chunk,
// to rounding.
TEST(TrainMetrics, CpuChunkedHeadTrainsLikeTheWholeBatchHead) {
    Dir t;
    write_file(t / "a.yaml", recipe("metrics: " + (t / "a.jsonl")));
    write_file(t / "b.yaml", recipe("head_chunk_rows: 5, metrics: " + (t / "b.jsonl")));
    std::string out;
    ASSERT_EQ(run(t / "a.yaml", &out), 0) << out;
    ASSERT_EQ(run(t / "b.yaml", &out), 0) << out;
    auto a = lines(t / "a.jsonl"), b = lines(t / "b.jsonl");
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (size_t i = 0; i < 3; i++) {
        for (const char *k : {"loss", "grad_norm"}) {
            const double x = json_number_value(json_object_get(a[i], k)), y = json_number_value(json_object_get(b[i], k));
            EXPECT_NEAR(y, x, 1e-6 * x) << k << " at step " << i + 1;
        }
        json_decref(a[i]);
        json_decref(b[i]);
    }
}

TEST(TrainMetrics, CpuActivationCheckpointingGivesIdenticalTraining) {
    Dir t;
    write_file(t / "a.yaml", recipe("metrics: " + (t / "a.jsonl")));
    std::string out;
    ASSERT_EQ(run(t / "a.yaml", &out), 0) << out;
    auto a = lines(t / "a.jsonl");
    ASSERT_EQ(a.size(), 3u);
    for (const char *mode : {"full", "selective"}) {
        SCOPED_TRACE(mode);
        const std::string m = mode;
        write_file(t / (m + ".yaml"), recipe("ac: " + m + ", metrics: " + (t / (m + ".jsonl"))));
        ASSERT_EQ(run("-v --report " + (t / (m + ".rep.json")) + " " + (t / (m + ".yaml")), &out), 0) << out;
        EXPECT_NE(out.find("CPU ac=" + m), std::string::npos) << out;
        auto b = lines(t / (m + ".jsonl"));
        ASSERT_EQ(b.size(), 3u);
        for (size_t i = 0; i < 3; i++) {
            // the recomputation repeats the same float operations: bit-identical losses and norms
            for (const char *k : {"loss", "grad_norm"})
                EXPECT_EQ(json_number_value(json_object_get(a[i], k)), json_number_value(json_object_get(b[i], k)))
                    << k << " at step " << i + 1;
            json_decref(b[i]);
        }
        // the run report names the mode
        json_error_t je;
        json_t *rep = json_load_file((t / (m + ".rep.json")).c_str(), 0, &je);
        ASSERT_TRUE(rep) << je.text;
        json_t *tm = train_metrics(rep);
        ASSERT_TRUE(tm);
        EXPECT_STREQ(json_string_value(json_object_get(tm, "ac")), mode);
        json_decref(rep);
    }
    for (json_t *j : a) json_decref(j);
}

namespace {

// A run that validation refuses creates nothing, not even its metrics directory; a run that goes creates it.
TEST(TrainMetrics, ARefusedRunCreatesNoMetricsDirectory) {
    std::string d = make_tmpdir("fsdp-metrics-dir"), m = d + "/new/deeper/m.jsonl", out;
    std::string body = "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\nstages:\n"
                       "  - {id: i, uses: init-meta}\n  - {id: t, uses: train-steps, with: {steps: 1, metrics: " + m;
    write_file(d + "/bad.yaml", body + ", lr: fast}}\n"); // a float that is not one
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q " + d + "/bad.yaml", &out), 2) << out;
    struct stat st;
    EXPECT_NE(stat((d + "/new").c_str(), &st), 0) << "created by a refused run";
    write_file(d + "/ok.yaml", body + "}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " -q " + d + "/ok.yaml", &out), 0) << out;
    EXPECT_EQ(stat(m.c_str(), &st), 0) << out;
    rm_rf(d);
}

} // namespace
