/* bench/convert_moe: converts a mixture-of-experts Hugging Face checkpoint (generated here: bf16,
 * Qwen3-MoE names, per-expert mlp.experts.E.{gate,up,down}_proj tensors) to torchtitan's DCP with its
 * experts stacked (layers.L.moe.experts.w1|w2|w3 [E, ...]) and back to HF safetensors with
 * `fsdp-run ckpt convert`, and prints GB/s next to `cp` of the same input measured beside it in the same
 * round (`cp` of the HF file, `cp -r` of the DCP), with the median of the per-round ratios, plus the
 * converter's peak RSS; the round trip is checked identical (fsdp-run ckpt diff).
 *
 *   build/bench/convert_moe [--mb N (about 300)] [--world M (1)] [--reps R (7)] [--dir DIR] [--bin build/fsdp-run] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ckpt/safetensors.h"

#define MOE_MAX_REPS 32

typedef struct tensor {
    char name[128];
    int64_t shape[2];
} tensor;

/* The model's tensors: d = 1024, 16 heads (8 kv) of 64, 32 experts of 256, vocab 16384; layers to
 * reach about mb MB of bf16. */
static tensor *model(double mb, size_t *n) {
    const int64_t d = 1024, hd = 64, nh = 16, nkv = 8, E = 32, F = 256, V = 16384;
    double per_layer = 2.0 * (double)(3 * E * F * d + 2 * nh * hd * d + 2 * nkv * hd * d + E * d + 2 * d + 2 * hd);
    int layers = (int)((mb * 1e6 - 2.0 * 2 * (double)(V * d)) / per_layer + 0.5);
    if (layers < 1) layers = 1;
    tensor *t = calloc((size_t)layers * (E * 3 + 16) + 8, sizeof *t);
    size_t k = 0;
#define ADD(r, c, ...) (snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__), t[k].shape[0] = (r), t[k].shape[1] = (c), k++)
    ADD(V, d, "model.embed_tokens.weight");
    for (int l = 0; l < layers; l++) {
        ADD(d, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(d, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(nh * hd, d, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(nkv * hd, d, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(nkv * hd, d, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(d, nh * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(hd, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(hd, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        ADD(E, d, "model.layers.%d.mlp.gate.weight", l);
        for (int e = 0; e < E; e++) {
            ADD(F, d, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            ADD(F, d, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            ADD(d, F, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
        }
    }
    ADD(d, 0, "model.norm.weight");
    ADD(V, d, "lm_head.weight");
#undef ADD
    *n = k;
    return t;
}

int main(int argc, char **argv) {
    double mb = 300;
    int world = 1, reps = 7;
    const char *dir = "/tmp/fsdp-convert-moe", *bin = "build/fsdp-run";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb")) mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--world")) world = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (reps < 1 || reps > MOE_MAX_REPS) return fprintf(stderr, "convert_moe: --reps 1..%d\n", MOE_MAX_REPS), 2;
    char cmd[8192], src[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    bench_timed(cmd, NULL);
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    size_t n;
    tensor *t = model(mb, &n);
    st_writer *w;
    fsdp_err err;
    if (st_writer_new(&w, src, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    size_t *idx = calloc(n, sizeof *idx), largest = 0;
    double bytes = 0;
    for (size_t i = 0; i < n; i++) {
        int nd = t[i].shape[1] ? 2 : 1;
        if (st_writer_declare(w, t[i].name, FSDP_DT_BF16, nd, t[i].shape, &idx[i], &err))
            return fprintf(stderr, "%s\n", err.msg), 1;
        size_t b = (size_t)(t[i].shape[0] * (nd == 2 ? t[i].shape[1] : 1)) * 2;
        if (b > largest) largest = b;
        bytes += (double)b;
    }
    if (st_writer_begin(w, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    uint16_t *buf = malloc(largest);
    for (size_t i = 0; i < n; i++) {
        size_t b = (size_t)(t[i].shape[0] * (t[i].shape[1] ? t[i].shape[1] : 1)) * 2;
        for (size_t k = 0; k < b / 2; k++) buf[k] = (uint16_t)(0x3c00 + (k * 2654435761u + i) % 2048);
        if (st_writer_write(w, idx[i], buf, b, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    if (st_writer_finish(w, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    st_writer_free(w);
    free(buf);
    free(idx);
    free(t);
    printf("convert_moe: %zu HF tensors (32 experts per layer), %.1f MB bf16, --world %d\n", n, bytes / 1e6, world);
    /* the disk of a shared machine swings by 3x within a minute: each conversion is paired with the cp of its own
     * input timed beside it (before it in even rounds, after it in odd ones), both finding the input in the page
     * cache (read once first: a DCP just written with O_DIRECT is not), each write synced; the table shows the
     * medians of the times and of the per-round ratios */
    double cp_s[MOE_MAX_REPS], to_s[MOE_MAX_REPS], cpd_s[MOE_MAX_REPS], back_s[MOE_MAX_REPS], q_to[MOE_MAX_REPS],
        q_back[MOE_MAX_REPS], rss1 = 0, rss2 = 0;
    char cmds[4][8192], warm[2][8192];
    snprintf(cmds[0], sizeof cmds[0], "cp '%s' '%s/copy.safetensors' && sync", src, dir);
    snprintf(cmds[1], sizeof cmds[1],
             "%s ckpt convert '%s' '%s/dcp' --names torchtitan --n-heads 16 --n-kv-heads 8 --world %d >/dev/null && sync",
             bin, src, dir, world);
    snprintf(cmds[2], sizeof cmds[2], "cp -r '%s/dcp' '%s/copy_dcp' && sync", dir, dir);
    snprintf(cmds[3], sizeof cmds[3],
             "%s ckpt convert '%s/dcp' '%s/back.safetensors' --names hf --n-heads 16 --n-kv-heads 8 >/dev/null && sync",
             bin, dir, dir);
    snprintf(warm[0], sizeof warm[0], "cat '%s' > /dev/null", src);
    snprintf(warm[1], sizeof warm[1], "cat '%s'/dcp/* '%s'/dcp/.metadata > /dev/null", dir, dir);
    /* before each timed command, as bench/ckpt_vs_torch does: a file of the checkpoint's size written and removed,
     * so that each starts with the same warm memory on a VM that hands idle memory back to its host */
    char settle[8400];
    snprintf(settle, sizeof settle, "head -c %.0f /dev/zero > '%s/settle' && rm -f '%s/settle'", bytes, dir, dir);
#define TIMED(cmd, rss) (bench_timed(settle, NULL), bench_timed((cmd), (rss)))
    for (int r = 0; r < reps; r++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s/copy.safetensors' '%s/dcp' '%s/copy_dcp' '%s/back.safetensors' && sync",
                 dir, dir, dir, dir);
        bench_timed(cmd, NULL);
        bench_timed(warm[0], NULL);
        int first = r % 2 == 0;
        if (first) cp_s[r] = TIMED(cmds[0], NULL);
        to_s[r] = TIMED(cmds[1], &rss1);
        if (!first) cp_s[r] = TIMED(cmds[0], NULL);
        bench_timed(warm[1], NULL);
        if (first) cpd_s[r] = TIMED(cmds[2], NULL);
        back_s[r] = TIMED(cmds[3], &rss2);
        if (!first) cpd_s[r] = TIMED(cmds[2], NULL);
        q_to[r] = cp_s[r] / to_s[r];
        q_back[r] = cpd_s[r] / back_s[r];
    }
#undef TIMED
    snprintf(cmd, sizeof cmd, "%s ckpt diff '%s' '%s/back.safetensors' >/dev/null", bin, src, dir);
    bench_timed(cmd, NULL);
    double gb = bytes / 1e9;
    printf("%d rounds, medians (each conversion against the cp of its own input timed beside it, inputs cached; each "
           "write synced)\n", reps);
    const char *names[2] = {"HF -> DCP (experts stacked)", "DCP -> HF (per expert)"};
    const char *cps[2] = {"cp of the HF file", "cp -r of the DCP"};
    double *ts[2] = {to_s, back_s}, *cs[2] = {cp_s, cpd_s}, *qs[2] = {q_to, q_back}, rss[2] = {rss1, rss2};
    for (int k = 0; k < 2; k++) {
        double tc = bench_median(ts[k], reps), tcp = bench_median(cs[k], reps), q = bench_median(qs[k], reps);
        double lo = qs[k][0], hi = qs[k][0];
        for (int r = 1; r < reps; r++) lo = qs[k][r] < lo ? qs[k][r] : lo, hi = qs[k][r] > hi ? qs[k][r] : hi;
        printf("%-28s %6.2f s %6.2f GB/s | %-18s %6.2f s %6.2f GB/s | ratio to cp %.2f (rounds %.2f - %.2f)  peak RSS "
               "%.0f MiB\n", names[k], tc, gb / tc, cps[k], tcp, gb / tcp, q, lo, hi, rss[k]);
    }
    printf("round trip identical (fsdp-run ckpt diff)\n");
    if (getenv("CONVERT_MOE_KEEP")) return 0;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_timed(cmd, NULL);
    return 0;
}
