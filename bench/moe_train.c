/* CPU training of a small Qwen3-MoE (dim 256, 4 layers, 8 experts of width 256, top-2, vocab 2048; layer 3
 * dense through mlp_only_layers) for a few AdamW steps on random tokens: fsdp-run's train-steps (the
 * binary, a recipe with model {from_hf: DIR}) against transformers' eager Qwen3MoeForCausalLM with
 * output_router_logits on the same config, batch and thread count, in the same run (machines are
 * noisy: only the ratio means something).
 *
 *   build/bench/moe_train [--steps N] [--batch B] [--seq T] [--threads K] [--python PY] [--no-torch]
 *                         (defaults 4 steps after 2 warm-up steps, 4 x 128, 2 threads; PY: --python,
 *                          else FSDP_TORCH_PYTHON, else python3)
 *
 * Prints one JSON line: fsdp-run's and PyTorch's tokens/s and their ratio. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

static const char *CONFIG =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": 256,\n"
    " \"intermediate_size\": 768, \"moe_intermediate_size\": 256, \"num_hidden_layers\": 4,\n"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 32, \"vocab_size\": 2048,\n"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,\n"
    " \"mlp_only_layers\": [3], \"router_aux_loss_coef\": 0.01, \"output_router_logits\": true,\n"
    " \"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0,\n"
    " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"dtype\": \"float32\"}\n";

typedef struct opts {
    int steps, batch, seq, threads, torch;
    const char *python, *bin, *dir;
} opts;

static double run_fsdp(const opts *o) {
    char recipe[4096], report[4096], text[4096], cmd[12288];
    snprintf(recipe, sizeof recipe, "%s/moe.yaml", o->dir);
    snprintf(report, sizeof report, "%s/moe.json", o->dir);
    snprintf(text, sizeof text,
             "runtime: {device: cpu, seed: 0, threads: %d}\n"
             "model: {from_hf: %s}\n"
             "data: {kind: synthetic, batch_size: %d, seq_len: %d}\n"
             "stages:\n  - {id: i, uses: init-meta}\n"
             "  - {id: w, uses: train-steps, with: {steps: 2}}\n"
             "  - {id: t, uses: train-steps, with: {steps: %d}}\n",
             o->threads, o->dir, o->batch, o->seq, o->steps + 2);
    if (bench_write_text(recipe, text)) return -1;
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d %s -q %s --report %s", o->threads, o->bin, recipe, report);
    if (bench_sh(cmd)) return -1;
    return bench_stage_field(report, "t", "tokens_per_s");
}

/* transformers' eager model on the same config: tokens/s of `steps` AdamW steps after 2 warm-up ones. */
static double run_torch(const opts *o) {
    char cmd[8192], out[4096];
    snprintf(out, sizeof out, "%s/torch.txt", o->dir);
    snprintf(cmd, sizeof cmd, "%s bench/moe_train_torch.py --config %s/config.json --steps %d --batch %d --seq %d "
             "--threads %d > %s", o->python, o->dir, o->steps, o->batch, o->seq, o->threads, out);
    if (bench_sh(cmd)) return -1;
    FILE *f = fopen(out, "r");
    double tps = -1;
    if (f && fscanf(f, "%lf", &tps) != 1) tps = -1;
    if (f) fclose(f);
    return tps;
}

int main(int argc, char **argv) {
    opts o = {4, 4, 128, 2, 1, "python3", FSDP_BUILD_DIR "/fsdp-run", "/tmp/fsdp-bench-moe"};
    const char *env_py = getenv("FSDP_TORCH_PYTHON");
    if (env_py && *env_py) o.python = env_py;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-torch")) { o.torch = 0; continue; }
        if (!v) { fprintf(stderr, "%s: %s needs a value\n", argv[0], a); return 2; }
        if (!strcmp(a, "--steps")) o.steps = atoi(v);
        else if (!strcmp(a, "--batch")) o.batch = atoi(v);
        else if (!strcmp(a, "--seq")) o.seq = atoi(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--python")) o.python = v;
        else { fprintf(stderr, "usage: %s [--steps N] [--batch B] [--seq T] [--threads K] [--python PY] [--no-torch]\n", argv[0]); return 2; }
        i++;
    }
    if (o.steps < 1 || o.batch < 1 || o.seq < 2 || o.threads < 1) {
        fprintf(stderr, "%s: steps, batch, threads >= 1 and seq >= 2\n", argv[0]);
        return 2;
    }
    char cmd[4096], cfg[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", o.dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", o.dir);
    if (bench_sh(cmd) || bench_write_text(cfg, CONFIG)) return 1;
    double ours = run_fsdp(&o);
    if (ours <= 0) {
        fprintf(stderr, "%s: the fsdp-run run failed\n", argv[0]);
        return 1;
    }
    double theirs = -1;
    if (o.torch) {
        snprintf(cmd, sizeof cmd, "%s -c 'import torch, transformers' >/dev/null 2>&1", o.python);
        if (system(cmd) == 0) theirs = run_torch(&o);
        else fprintf(stderr, "%s: %s has no torch/transformers: no PyTorch baseline\n", argv[0], o.python);
    }
    printf("{\"bench\": \"moe_train\", \"model\": \"qwen3_moe dim 256, 4 layers, 8 experts top-2\", \"batch\": %d, "
           "\"seq\": %d, \"threads\": %d, \"fsdp_tokens_per_s\": %.1f", o.batch, o.seq, o.threads, ours);
    if (theirs > 0) printf(", \"torch_tokens_per_s\": %.1f, \"ratio_vs_torch\": %.3f", theirs, ours / theirs);
    printf("}\n");
    return 0;
}
