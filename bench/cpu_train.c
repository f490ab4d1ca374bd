/* CPU training benchmark: torchtitan's llama3 debugmodel (dim 256, 6 layers, 16 heads, vocab 2048,
 * FFN 768, rope_theta 500000 with llama3.1 scaling) trained for a few AdamW steps on random tokens
 * with a random-normal init, on the C reference kernels.
 *
 *   build/bench/cpu_train [--steps N] [--batch B] [--seq T]     (defaults 4 steps, 4 x 256)
 *
 * Prints the loss per step, then tokens/s and the fraction of the step time spent in GEMMs
 * (counted by the kernels' timing hook), as one JSON line. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/kc.h"
#include "decoder/decoder_model.h"
#include "decoder/decoder_single.h"

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return ((splitmix(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static void fill_normal(float *x, int64_t n, double std, uint64_t *s) {
    for (int64_t i = 0; i < n; i++) {
        double u1 = uniform01(s), u2 = uniform01(s);
        x[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}

static int parse_pos(const char *flag, const char *val, int *out) {
    char *end = NULL;
    long v = val ? strtol(val, &end, 10) : 0;
    if (!val || *end != '\0' || v <= 0 || v > 1000000) {
        fprintf(stderr, "cpu_train: %s needs a positive integer (got %s)\n", flag, val ? val : "nothing");
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    /* libgomp reads OMP_WAIT_POLICY when it is loaded. Its default spin-waiting after every parallel
     * region takes the cores OpenBLAS's own threads need right after (the kernels alternate OpenMP
     * loops and GEMMs), which costs 2-3x on small machines: default to passive by re-executing once. */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 0) == 0) {
        execv("/proc/self/exe", argv);
        /* exec failed: go on with the default policy */
    }
    int steps = 4, B = 4, T = 256;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--steps") ? &steps
                   : !strcmp(argv[i], "--batch") ? &B
                   : !strcmp(argv[i], "--seq")   ? &T
                                                 : NULL;
        if (!dst) {
            fprintf(stderr, "usage: %s [--steps N] [--batch B] [--seq T]\n", argv[0]);
            return 2;
        }
        if (parse_pos(argv[i], i + 1 < argc ? argv[i + 1] : NULL, dst)) return 2;
        i++;
    }
    decoder_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.preset, sizeof c.preset, "debugmodel");
    c.dim = 256;
    c.n_layers = 6;
    c.n_heads = 16;
    c.n_kv_heads = 16;
    c.vocab_size = 2048;
    c.multiple_of = 256;
    c.norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.max_seq_len = T;
    c.depth_init = 1;
    c.rope_scaling = DECODER_ROPE_LLAMA3;
    c.rope_factor = 8.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_pos = 8192;
    c.head_dim = c.dim / c.n_heads;
    c.ffn_hidden = 768; /* 256 * ceil(int(2*4*256/3) / 256) */

    fsdp_err err;
    fsdp_err_clear(&err);
    decoder_single_state st;
    if (decoder_single_init(&st, &c, B, T, &err)) {
        fprintf(stderr, "cpu_train: %s\n", err.msg);
        return 1;
    }
    uint64_t seed = 1234;
    fill_normal(st.w.tok_embeddings, (int64_t)c.vocab_size * c.dim, 1.0, &seed);
    for (int l = 0; l < c.n_layers; l++) {
        decoder_model_layer *lw = &st.w.layers[l];
        double depth_std = 0.02 / sqrt(2.0 * (l + 1));
        int64_t qd = (int64_t)c.n_heads * c.head_dim, kvd = (int64_t)c.n_kv_heads * c.head_dim;
        fill_normal(lw->wq, qd * c.dim, 0.02, &seed);
        fill_normal(lw->wk, kvd * c.dim, 0.02, &seed);
        fill_normal(lw->wv, kvd * c.dim, 0.02, &seed);
        fill_normal(lw->wo, qd * c.dim, depth_std, &seed);
        fill_normal(lw->w1, (int64_t)c.ffn_hidden * c.dim, 0.02, &seed);
        fill_normal(lw->w2, (int64_t)c.ffn_hidden * c.dim, depth_std, &seed);
        fill_normal(lw->w3, (int64_t)c.ffn_hidden * c.dim, depth_std, &seed);
        for (int j = 0; j < c.dim; j++) lw->attention_norm[j] = lw->ffn_norm[j] = 1.0f;
    }
    for (int j = 0; j < c.dim; j++) st.w.norm[j] = 1.0f;
    fill_normal(st.w.output, (int64_t)c.vocab_size * c.dim, 1.0 / sqrt((double)c.dim), &seed);

    size_t n = (size_t)B * (size_t)T;
    int32_t *tok = malloc((n + 1) * sizeof *tok);
    if (!tok) {
        fprintf(stderr, "cpu_train: out of memory\n");
        decoder_single_free(&st);
        return 1;
    }
    for (size_t i = 0; i <= n; i++) tok[i] = (int32_t)(splitmix(&seed) % (uint64_t)c.vocab_size);

    decoder_single_hparams hp = {0.9, 0.95, 1e-8, 0.1, 1.0};
    kc_stats stats;
    kc_stats_reset(&stats);
    decoder_single_result r;
    /* Step 0 warms caches and thread pools and is not timed. */
    int rc = decoder_single_step(&st, tok, tok + 1, B, T, 8e-4, &hp, &r, &err);
    if (!rc) printf("warmup step: loss %.4f grad_norm %.4f\n", r.loss, r.grad_norm);
    decoder_single_set_stats(&st, &stats);
    double t0 = kc_now();
    for (int s = 0; !rc && s < steps; s++) {
        rc = decoder_single_step(&st, tok, tok + 1, B, T, 8e-4, &hp, &r, &err);
        if (!rc) printf("step %d: loss %.4f grad_norm %.4f\n", s + 1, r.loss, r.grad_norm);
    }
    double elapsed = kc_now() - t0;
    if (rc) {
        fprintf(stderr, "cpu_train: %s\n", err.msg);
        free(tok);
        decoder_single_free(&st);
        return 1;
    }
    double tokens = (double)n * steps;
    printf("{\"bench\":\"cpu_train\",\"model\":\"debugmodel\",\"params\":%lld,\"batch\":%d,\"seq\":%d,\"steps\":%d,"
           "\"tokens_per_s\":%.1f,\"gemm_fraction\":%.3f,\"gemm_gflops_per_s\":%.2f,\"gemm_calls_per_step\":%.0f,"
           "\"workspace_mib\":%.1f,\"omp_wait_policy\":\"%s\"}\n",
           (long long)st.numel, B, T, steps, tokens / elapsed, stats.gemm_seconds / elapsed,
           stats.gemm_flops / stats.gemm_seconds / 1e9, (double)stats.gemm_calls / steps,
           decoder_model_ws_bytes(st.ws) / (1024.0 * 1024.0), getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "default");
    free(tok);
    decoder_single_free(&st);
    return 0;
}
