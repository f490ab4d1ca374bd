// Issue 41 item 2 end to end: recipes/finetune_hf.yaml trains a Hugging Face directory on a JSONL file
// through the directory's own tokenizer.json (its tokenizer_config.json's EOS between documents), and a run
// resumed from its step-2 checkpoint on 2 ranks sees exactly the tokens the uninterrupted 1-rank run saw:
// its losses at steps 3 and 4 are the uninterrupted run's (the same packed windows at the same data_pos;
// other windows would give other losses at the 1e-3 level, not 1e-6).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "jsonl_util.h"
#include "test_util.h"
#include "tokenizer_util.h"

using namespace fsdp_test;

namespace {

// A Qwen2-shaped HF directory with the llama3-style test tokenizer (6008 ids) and a vocabulary of 6016.
std::string make_hf(const std::string &dir) {
    std::string hf = dir + "/hf";
    write_file(dir + "/mk.yaml",
               "runtime: {device: cpu, seed: 3, threads: 2}\n"
               "model: {arch: qwen2, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 6016, ffn_hidden: 128,"
               " max_seq_len: 128, tie_embeddings: false}\n"
               "stages:\n  - {id: i, uses: init-cpu}\n  - {id: s, uses: save-safetensors, with: {path: " + hf +
                   ", names: hf}}\n");
    int rc;
    std::string o = run_np(1, dir + "/mk.yaml", &rc);
    EXPECT_EQ(rc, 0) << o;
    write_file(hf + "/tokenizer.json", read_file("tests/data/tokenizers/llama3/tokenizer.json"));
    write_file(hf + "/tokenizer_config.json", "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}\n");
    return hf;
}

std::string jsonl_of_corpus(const std::string &dir) { return write_corpus_jsonl(dir + "/train.jsonl"); }

std::string finetune(const std::string &hf, const std::string &data, const std::string &out, const std::string &metrics) {
    return "recipes/finetune_hf.yaml --set vars.hf=" + hf + " --set vars.data=" + data + " --set vars.out=" + out +
           " --set vars.steps=4 --set vars.save_every=2 --set vars.batch_size=4 --set vars.seq_len=32"
           " --set vars.warmup_steps=1 --set vars.lr=3e-3 --set runtime.device=cpu --set runtime.threads=1"
           " --set stages.train.with.metrics=" + metrics;
}

} // namespace

TEST(FinetuneText, JsonlThroughTheModelsTokenizerResumesOnAnotherWorldSize) {
    std::string dir = make_tmpdir("ftext");
    std::string hf = make_hf(dir), data = jsonl_of_corpus(dir);
    int rc;
    std::string o = run_np(1, finetune(hf, data, dir + "/run", dir + "/full.jsonl"), &rc);
    ASSERT_EQ(rc, 0) << o;
    ASSERT_TRUE(exists(dir + "/run/dcp/step-2/.metadata"));
    std::vector<double> full = jsonl_field(dir + "/full.jsonl", "loss"), tokens = jsonl_field(dir + "/full.jsonl", "tokens");
    ASSERT_EQ(full.size(), 4u);
    EXPECT_EQ(tokens[0], 4.0 * 32);
    // resumed from step 2 on 2 ranks: the same windows at data_pos 2 and 3
    o = run_np(2, finetune(hf, data, dir + "/run2", dir + "/resumed.jsonl") + " --set stages.load.with.path=" + dir +
                      "/run/dcp/step-2 --set stages.load.with.names=torchtitan --set stages.load.with.load_optimizer=true",
               &rc);
    ASSERT_EQ(rc, 0) << o;
    std::vector<double> res = jsonl_field(dir + "/resumed.jsonl", "loss"), steps = jsonl_field(dir + "/resumed.jsonl", "step");
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(steps[0], 3);
    for (int k = 0; k < 2; k++) EXPECT_NEAR(res[k], full[2 + k], 1e-6 * full[2 + k]) << "step " << 3 + k;
    // another data order (sequential blocks instead of seeded windows) is another loss: the check above can fail
    o = run_np(1, finetune(hf, data, dir + "/run3", dir + "/seq.jsonl") + " --set data.order=sequential", &rc);
    ASSERT_EQ(rc, 0) << o;
    std::vector<double> seq = jsonl_field(dir + "/seq.jsonl", "loss");
    ASSERT_EQ(seq.size(), 4u);
    EXPECT_GT(std::abs(seq[0] - full[0]), 1e-4);
    // a tokenizer of another model (the Qwen vocabulary, 151851 ids) is refused, naming both sizes
    ASSERT_EQ(run_cmd("gzip -dc tests/data/tokenizers/qwen/tokenizer.json.gz > " + hf + "/tokenizer.json", nullptr), 0);
    write_file(hf + "/tokenizer_config.json", "{\"eos_token\": {\"content\": \"<|endoftext|>\"}}\n");
    o = run_np(1, finetune(hf, data, dir + "/run4", dir + "/m4.jsonl"), &rc);
    EXPECT_NE(rc, 0) << o;
    EXPECT_NE(o.find("has 151851 ids, more than the model's vocab_size 6016"), std::string::npos) << o;
    rm_rf(dir);
}

// eval_data takes the tokenized kinds too: JSON lines through the model's tokenizer, its own order.
TEST(FinetuneText, EvalDataThroughTheModelsTokenizer) {
    std::string dir = make_tmpdir("ftext");
    std::string hf = make_hf(dir), data = jsonl_of_corpus(dir);
    write_file(dir + "/ev.yaml", "runtime: {device: cpu, seed: 0, threads: 1}\nmodel: {from_hf: " + hf + "}\n"
               "data: {kind: jsonl, path: " + data + ", batch_size: 4, seq_len: 32}\nstages:\n"
               "  - {id: load, uses: load-ckpt, with: {path: " + hf + ", names: hf, load_optimizer: \"false\"}}\n"
               "  - {id: t, uses: train-steps, after: [load], with: {steps: 2, lr: 1e-3, eval_every: 1, eval_batches: 2,"
               " metrics: " + dir + "/m.jsonl, eval_data: {kind: jsonl, path: " + data + ", order: sequential}}}\n");
    int rc;
    std::string o = run_np(1, dir + "/ev.yaml", &rc);
    ASSERT_EQ(rc, 0) << o;
    std::vector<double> ev = jsonl_field(dir + "/m.jsonl", "eval_loss");
    ASSERT_GE(ev.size(), 2u);
    EXPECT_GT(ev[0], 1.0);
    EXPECT_LT(ev[0], 20.0);
    rm_rf(dir);
}
