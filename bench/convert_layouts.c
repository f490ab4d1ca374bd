/* bench/convert_layouts: one Llama checkpoint of about 1 GB (weights and AdamW moments, float32; generated here in
 * fsdp-run's layout) written in each trainer's layout (torchtitan 0.3, OLMo-core 3, fms-fsdp), then converted
 * (and Megatron-FSDP, accelerate) from each into fsdp-run's own with `fsdp-run ckpt convert --from LAYOUT` -- q/k/v split out of fused tensors,
 * rotate-half rows permuted, weights and moments -- next to `cp -r` + sync of the same directory, measured in the
 * same run (medians of 5 rounds after a warm-up; the ratio to cp is the median of each round's), with each
 * converter's peak RSS. With --python (a Python with torch and the systems, as
 * ../shared/seed-systems/install.sh installs them) each system's own converter runs on the same checkpoint:
 * OLMo-core's unshard_checkpoint (weights and optimizer to model.pt / optim.pt; it writes no safetensors with the
 * optimizer), accelerate's merge_fsdp_weights (the weights only), and torch's dcp_to_torch_save (the route
 * torchtitan, fms-fsdp and Megatron-FSDP document for a DCP checkpoint).
 *
 *   build/bench/convert_layouts [--mb N (about 1000)] [--dir DIR] [--bin build/fsdp-run]
 *                               [--python PY --seedpkgs DIR --stubs DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ckpt/safetensors.h"

typedef struct tensor {
    char name[160];
    int64_t shape[2];
} tensor;

/* d = 1024, 16 heads (4 kv) of 64, SwiGLU 2816, vocab 16000: layers to reach about mb MB of weights + 2 moments */
static tensor *model(double mb, size_t *n, int *layers_out) {
    const int64_t d = 1024, hd = 64, nh = 16, nkv = 4, F = 2816, V = 16000;
    double per_layer = 3 * 4.0 * (double)(2 * nh * hd * d + 2 * nkv * hd * d + 3 * F * d + 2 * d);
    int layers = (int)((mb * 1e6 - 3 * 4.0 * (double)(2 * V * d + d)) / per_layer + 0.5);
    if (layers < 1) layers = 1;
    tensor *t = calloc((size_t)layers * 9 * 3 + 16, sizeof *t);
    size_t k = 0;
    const char *kinds[3] = {"", ".exp_avg", ".exp_avg_sq"};
    for (int m = 0; m < 3; m++) {
        const char *pre = m ? "optimizer.state." : "";
#define ADD(r, c, ...)                                                                                                 \
    do {                                                                                                               \
        char base[128];                                                                                                \
        snprintf(base, sizeof base, __VA_ARGS__);                                                                      \
        snprintf(t[k].name, sizeof t[k].name, "%s%s%s", pre, base, kinds[m]);                                          \
        t[k].shape[0] = (r), t[k].shape[1] = (c), k++;                                                                 \
    } while (0)
        ADD(V, d, "tok_embeddings.weight");
        for (int l = 0; l < layers; l++) {
            ADD(nh * hd, d, "layers.%d.attention.wq.weight", l);
            ADD(nkv * hd, d, "layers.%d.attention.wk.weight", l);
            ADD(nkv * hd, d, "layers.%d.attention.wv.weight", l);
            ADD(d, nh * hd, "layers.%d.attention.wo.weight", l);
            ADD(F, d, "layers.%d.feed_forward.w1.weight", l);
            ADD(d, F, "layers.%d.feed_forward.w2.weight", l);
            ADD(F, d, "layers.%d.feed_forward.w3.weight", l);
            ADD(d, 0, "layers.%d.attention_norm.weight", l);
            ADD(d, 0, "layers.%d.ffn_norm.weight", l);
        }
        ADD(d, 0, "norm.weight");
        ADD(V, d, "output.weight");
#undef ADD
    }
    *n = k;
    *layers_out = layers;
    return t;
}

static int write_source(const char *path, double mb, double *bytes, int *layers) {
    size_t n;
    tensor *t = model(mb, &n, layers);
    st_writer *w;
    fsdp_err err;
    if (st_writer_new(&w, path, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    size_t *idx = calloc(n, sizeof *idx), largest = 0;
    *bytes = 0;
    for (size_t i = 0; i < n; i++) {
        int nd = t[i].shape[1] ? 2 : 1;
        if (st_writer_declare(w, t[i].name, FSDP_DT_F32, nd, t[i].shape, &idx[i], &err))
            return fprintf(stderr, "%s\n", err.msg), 1;
        size_t b = (size_t)(t[i].shape[0] * (nd == 2 ? t[i].shape[1] : 1)) * 4;
        if (b > largest) largest = b;
        *bytes += (double)b;
    }
    if (st_writer_begin(w, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    float *buf = malloc(largest);
    for (size_t i = 0; i < n; i++) {
        size_t b = (size_t)(t[i].shape[0] * (t[i].shape[1] ? t[i].shape[1] : 1)) * 4;
        for (size_t k = 0; k < b / 4; k++) buf[k] = (float)((k * 2654435761u + i) % 4096) * (1.0f / 65536.0f) + 1e-3f;
        if (st_writer_write(w, idx[i], buf, b, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    if (st_writer_finish(w, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    st_writer_free(w);
    free(buf);
    free(idx);
    free(t);
    return 0;
}

typedef struct sysconv {
    const char *layout, *dirname;
    const char *own_label; /* the system's own converter, or NULL */
    const char *own_py;    /* its Python (format: checkpoint dir, output) */
    int needs_stubs; /* 1: OLMo-core (its stubs first on PYTHONPATH); 2: accelerate's package */
} sysconv;

static const sysconv kSys[] = {
    {"torchtitan-0.3", "tt03", "torch dcp_to_torch_save (torchtitan's route)",
     "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(sys.argv[1], sys.argv[2])",
     0},
    {"olmo-core-3", "olmocore", "OLMo-core unshard_checkpoint (model.pt + optim.pt)",
     "import sys; from olmo_core.distributed.checkpoint import unshard_checkpoint as u; "
     "u(sys.argv[1], sys.argv[2], optim=True, save_overwrite=True)",
     1},
    {"fms-1.13", "fms", "torch dcp_to_torch_save (fms-fsdp's route)",
     "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(sys.argv[1], sys.argv[2])",
     0},
    {"megatron-fsdp-0.6", "megatron", "torch dcp_to_torch_save (Megatron-FSDP's route)",
     "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(sys.argv[1], sys.argv[2])",
     0},
    {"accelerate-1.15", "accelerate", "accelerate merge_fsdp_weights (weights only)",
     "import sys; from accelerate.utils import merge_fsdp_weights as m; "
     "m(sys.argv[1] + '/pytorch_model_fsdp_0', sys.argv[2], safe_serialization=True)",
     2},
};

int main(int argc, char **argv) {
    double mb = 1000;
    const char *dir = "/tmp/fsdp-convert-layouts", *bin = "build/fsdp-run", *py = NULL, *seed = "/work/seedpkgs",
               *stubs = "../shared/seed-systems/stubs";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb")) mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--python")) py = argv[i + 1];
        else if (!strcmp(argv[i], "--seedpkgs")) seed = argv[i + 1];
        else if (!strcmp(argv[i], "--stubs")) stubs = argv[i + 1];
    }
    char cmd[16384], src[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    bench_timed(cmd, NULL);
    snprintf(src, sizeof src, "%s/canon.safetensors", dir);
    double bytes;
    int layers;
    if (write_source(src, mb, &bytes, &layers)) return 1;
    snprintf(cmd, sizeof cmd, "%s ckpt convert '%s' '%s/canon' >/dev/null", bin, src, dir);
    bench_timed(cmd, NULL);
    printf("convert_layouts: Llama d 1024, %d layers, 16 heads / 4 kv, weights + exp_avg + exp_avg_sq, %.1f MB f32\n",
           layers, bytes / 1e6);
    for (size_t s = 0; s < sizeof kSys / sizeof *kSys; s++) {
        const sysconv *S = &kSys[s];
        char ck[4200];
        snprintf(ck, sizeof ck, "%s/%s", dir, S->dirname);
        snprintf(cmd, sizeof cmd, "%s ckpt convert '%s/canon' '%s' --to %s --n-heads 16 --n-kv-heads 4 >/dev/null && sync",
                 bin, dir, ck, S->layout);
        bench_timed(cmd, NULL);
        enum { REPS = 5 }; /* after a warm-up round; the ratio is the median of each round's (the machine drifts) */
        double cp_s[REPS + 1], fr_s[REPS + 1], own_s[REPS + 1], ratio[REPS], rss_fr = 0, rss_own = 0;
        int own = py != NULL;
        char cmds[3][8192];
        snprintf(cmds[0], sizeof cmds[0], "cp -r '%s' '%s/copy' && sync", ck, dir);
        snprintf(cmds[1], sizeof cmds[1],
                 "%s ckpt convert '%s' '%s/out' --from %s --n-heads 16 --n-kv-heads 4 >/dev/null && sync", bin, ck, dir,
                 S->layout);
        snprintf(cmds[2], sizeof cmds[2], "OMP_NUM_THREADS=2 PYTHONPATH='%s%s%s/%s' '%s' -c \"%s\" '%s' '%s/own' >/dev/null 2>&1 && sync",
                 S->needs_stubs == 1 ? stubs : "", S->needs_stubs == 1 ? ":" : "", seed,
                 S->needs_stubs == 1 ? "olmocore" : S->needs_stubs == 2 ? "accelerate" : "torchtitan", py ? py : "python3",
                 S->own_py, ck, dir);
        double *out[3] = {cp_s, fr_s, own_s};
        for (int r = 0; r <= REPS; r++) { /* round 0: the warm-up */
            const int order[3][3] = {{0, 1, 2}, {1, 2, 0}, {2, 0, 1}};
            for (int k = 0; k < 3; k++) {
                int which = order[r % 3][k];
                if (which == 2 && !own) continue;
                snprintf(cmd, sizeof cmd, "rm -rf '%s/copy' '%s/out' '%s/own' && sync", dir, dir, dir);
                bench_timed(cmd, NULL);
                out[which][r] = bench_timed(cmds[which], which == 1 ? &rss_fr : which == 2 ? &rss_own : NULL);
            }
            if (r) ratio[r - 1] = cp_s[r] / fr_s[r];
        }
        double t_cp = bench_median(cp_s + 1, REPS), t_fr = bench_median(fr_s + 1, REPS);
        double gb = bench_path_bytes(ck) / 1e9;
        printf("%-15s cp -r + sync   %6.2f s  %6.2f GB/s\n", S->layout, t_cp, gb / t_cp);
        printf("%-15s fsdp-run       %6.2f s  %6.2f GB/s  ratio to cp %.2f  peak RSS %.0f MiB\n", S->layout, t_fr,
               gb / t_fr, bench_median(ratio, REPS), rss_fr);
        if (own) {
            double t_own = bench_median(own_s + 1, REPS);
            printf("%-15s %s  %6.2f s  %6.2f GB/s  ratio to cp %.2f  peak RSS %.0f MiB  (fsdp-run %.1fx faster)\n",
                   S->layout, S->own_label, t_own, gb / t_own, t_cp / t_own, rss_own, t_own / t_fr);
        }
        /* what came back is the checkpoint it started from, bit for bit (fms-fsdp's metadata.pth gives a train state) */
        snprintf(cmd, sizeof cmd, "%s ckpt diff '%s/canon' '%s/out' --ignore 'train_state.**' >/dev/null", bin, dir, dir);
        bench_timed(cmd, NULL);
    }
    printf("each layout converted back is fsdp-run's checkpoint bit for bit (fsdp-run ckpt diff)\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_timed(cmd, NULL);
    return 0;
}
