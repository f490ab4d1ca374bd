/* What the Hugging Face architectures' differences cost on the CPU path: one training step (forward,
 * backward, clipping, AdamW on the C reference kernels) of a Llama-3 shape against the same shape
 * with Qwen2's q/k/v biases, with Qwen3's per-head q/k norms, with Qwen3's q/k norms and a head_dim
 * twice dim / n_heads (a q projection twice as wide as the model), and with tied embeddings. Every
 * variant runs in the same process on the same tokens; the output is ratios of the median step time
 * to Llama's, at two sequence lengths (and time(2T)/time(T) per variant), never bare seconds.
 *
 *   build/bench/hf_arch_cpu [--steps N] [--batch B] [--seq T]     (defaults 5 steps, 4 x 128) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "decoder/decoder_model.h"
#include "decoder/decoder_single.h"

typedef struct variant {
    const char *name;
    int qkv_bias, qk_norm, tie, head_dim_x2;
} variant;

static const variant VARIANTS[] = {
    {"llama3", 0, 0, 0, 0},         {"qwen2 (q/k/v bias)", 1, 0, 0, 0}, {"qwen3 (q/k norm)", 0, 1, 0, 0},
    {"qwen3 (q/k norm, 2x head_dim)", 0, 1, 0, 1}, {"tied embeddings", 0, 0, 1, 0},
};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof *VARIANTS))

static decoder_config config_of(const variant *v) {
    decoder_config c;
    decoder_config_defaults(&c);
    c.dim = 256, c.n_layers = 4, c.n_heads = 8, c.n_kv_heads = 4, c.vocab_size = 2048, c.multiple_of = 256;
    c.rope_theta = 1e6, c.rope_scaling = DECODER_ROPE_NONE, c.norm_eps = 1e-6;
    c.qkv_bias = v->qkv_bias, c.qk_norm = v->qk_norm, c.tie_embeddings = v->tie;
    c.head_dim_set = v->head_dim_x2 ? 2 * 256 / 8 : 0;
    c.ffn_hidden_set = 768;
    return c;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per step of variant v at B x T (one warm-up step first); < 0 on failure. */
static double median_step(const variant *v, int B, int T, int steps, const int32_t *tok, const int32_t *lab) {
    decoder_config c = config_of(v);
    fsdp_err err;
    if (decoder_config_finalize(&c, &err)) {
        fprintf(stderr, "hf_arch_cpu: %s: %s\n", v->name, err.msg);
        return -1;
    }
    decoder_single_state st;
    if (decoder_single_init(&st, &c, B, T, &err)) {
        fprintf(stderr, "hf_arch_cpu: %s: %s\n", v->name, err.msg);
        return -1;
    }
    uint64_t s = 12345;
    for (int64_t i = 0; i < st.numel; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        st.params[i] = (float)((double)(s >> 40) / (double)(1ULL << 24) - 0.5) * 0.04f;
    }
    decoder_single_hparams hp = {0.9, 0.95, 1e-8, 0.1, 1.0};
    double *t = calloc((size_t)steps, sizeof *t);
    decoder_single_result r;
    int ok = t && !decoder_single_step(&st, tok, lab, B, T, 1e-4, &hp, &r, &err);
    for (int k = 0; ok && k < steps; k++) {
        double t0 = bench_now();
        ok = !decoder_single_step(&st, tok, lab, B, T, 1e-4, &hp, &r, &err);
        t[k] = bench_now() - t0;
    }
    double med = -1;
    if (ok) {
        qsort(t, (size_t)steps, sizeof *t, cmp_double);
        med = t[steps / 2];
    } else {
        fprintf(stderr, "hf_arch_cpu: %s: %s\n", v->name, err.msg);
    }
    free(t);
    decoder_single_free(&st);
    return med;
}

int main(int argc, char **argv) {
    /* passive OpenMP waiting, as bench/cpu_train.c does (OpenBLAS needs the cores between regions) */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 0) == 0) execv("/proc/self/exe", argv);
    int steps = 5, B = 4, T = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (v <= 0) {
            fprintf(stderr, "usage: hf_arch_cpu [--steps N] [--batch B] [--seq T]\n");
            return 2;
        }
        if (!strcmp(argv[i], "--steps")) steps = v;
        else if (!strcmp(argv[i], "--batch")) B = v;
        else if (!strcmp(argv[i], "--seq")) T = v;
    }
    const int n = B * 2 * T;
    int32_t *tok = malloc((size_t)n * sizeof *tok), *lab = malloc((size_t)n * sizeof *lab);
    if (!tok || !lab) return 1;
    for (int i = 0; i < n; i++) tok[i] = (i * 7919) % 2048, lab[i] = (i * 104729 + 3) % 2048;
    double med[2][N_VARIANTS];
    for (int s = 0; s < 2; s++)
        for (int v = 0; v < N_VARIANTS; v++)
            if ((med[s][v] = median_step(&VARIANTS[v], B, T << s, steps, tok, lab)) < 0) return 1;
    printf("hf_arch_cpu: dim 256, 4 layers, 8/4 heads, ffn 768, vocab 2048, batch %d; median of %d steps\n", B, steps);
    printf("%-32s %14s %14s %16s\n", "variant", "step / llama3", "(seq x2)", "time(2T)/time(T)");
    for (int v = 0; v < N_VARIANTS; v++)
        printf("%-32s %14.3f %14.3f %16.3f\n", VARIANTS[v].name, med[0][v] / med[0][0], med[1][v] / med[1][0],
               med[1][v] / med[0][v]);
    free(tok);
    free(lab);
    return 0;
}
