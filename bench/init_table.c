/* The generic model table (issue 14) at scale: ratios measured in one run.
 *
 *   build/bench/init_table [--layers 16] [--dim 2048] [--ffn 8192] [--vocab 128256] [--threads 2] [--ranks 2]
 *                          [--python python3] [--no-torch] [--mot-hidden 1024] [--mot-layers 8] [--no-mot]
 *                          [--work DIR]
 *
 * 1. init-cpu of a table of nn.Embedding / nn.Linear shapes (default: embedding and output head
 *    [vocab, dim], 16 layers of q/k/v/o [dim, dim] + bias and gate/up/down [ffn, dim] / [dim, ffn]:
 *    1.6 B parameters), the real stage (fsdp-run --report: its seconds_init), against
 *      - a memset of the same bytes by the same number of threads in this process (fresh pages), and
 *      - PyTorch building the same modules on the CPU (torch.nn.Embedding / torch.nn.Linear, whose
 *        constructors run their init: kaiming_uniform / normal), when `python -c "import torch"` works;
 * 2. init-meta on --ranks ranks (mpirun): rank 0's seconds_init against a memset of its shard's bytes
 *    by its share of the threads;
 * 3. a table from a checkpoint header: the time to build the table of the bootstrap's LLM directory
 *    against a `cat` of its data (and the bytes read by read(2), /proc/self/io rchar);
 * 4. the composed bootstrap (recipes/mot_bootstrap.yaml on a generated Qwen2-style LLM and SigLIP-style
 *    ViT): the peak resident memory of fsdp-run (wait4's ru_maxrss) against the size of its float32
 *    state (the table's parameters x 4 bytes).
 * Every figure is a ratio of two times or sizes measured here; seconds are printed for reference. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include "bench/bench_util.h"
#include "ckpt/safetensors.h"
#include "decoder/decoder_table.h"
#include "model/mt_spec.h"
#include "pipeline/yaml_load.h"

typedef struct opts {
    int layers, threads, ranks, mot_hidden, mot_layers, torch, mot, reps;
    int64_t dim, ffn, vocab;
    const char *python, *work;
} opts;

/* Runs cmd through /bin/sh; *maxrss_kb (may be NULL) gets the child's peak resident set. */
static int run_child(const char *cmd, long *maxrss_kb) {
    return bench_run(cmd, maxrss_kb) < 0 ? -1 : 0;
}

static void table_recipe(const opts *o, const char *path, const char *stage) {
    char text[2048];
    snprintf(text, sizeof text,
             "version: 1\nruntime: {device: cpu, threads: %d, stream: false}\n"
             "model:\n  dims: {dim: %lld, ffn: %lld, vocab: %lld, L: %d}\n  params:\n"
             "    - {name: embed.weight, shape: [vocab, dim], init: default_embedding}\n"
             "    - {name: \"layers.{0..L-1}.{q,k,v,o}.weight\", shape: [dim, dim], init: default_linear}\n"
             "    - {name: \"layers.{0..L-1}.{q,k,v,o}.bias\", shape: [dim], init: default_linear}\n"
             "    - {name: \"layers.{0..L-1}.{gate,up}.weight\", shape: [ffn, dim], init: default_linear}\n"
             "    - {name: \"layers.{0..L-1}.down.weight\", shape: [dim, ffn], init: default_linear}\n"
             "    - {name: head.weight, shape: [vocab, dim], init: default_linear}\n"
             "stages:\n  - {id: init, uses: %s}\n",
             !strcmp(stage, "init-meta") ? (o->threads / o->ranks > 0 ? o->threads / o->ranks : 1) : o->threads,
             (long long)o->dim, (long long)o->ffn, (long long)o->vocab, o->layers, stage);
    bench_write_text(path, text);
}

static int64_t table_params(const opts *o) {
    return 2 * o->vocab * o->dim + (int64_t)o->layers * (4 * o->dim * o->dim + 4 * o->dim + 3 * o->ffn * o->dim);
}

/* PyTorch's CPU construction of the same modules (seconds; < 0 when unavailable). */
static double torch_seconds(const opts *o) {
    char py[4096], cmd[8192], out[256];
    snprintf(py, sizeof py,
             "import time, torch\n"
             "torch.set_num_threads(%d)\n"
             "t0 = time.perf_counter()\n"
             "m = [torch.nn.Embedding(%lld, %lld)]\n"
             "for i in range(%d):\n"
             "    m += [torch.nn.Linear(%lld, %lld) for _ in range(4)]\n"
             "    m += [torch.nn.Linear(%lld, %lld, bias=False) for _ in range(2)]\n"
             "    m += [torch.nn.Linear(%lld, %lld, bias=False)]\n"
             "m += [torch.nn.Linear(%lld, %lld, bias=False)]\n"
             "print(time.perf_counter() - t0, sum(p.numel() for x in m for p in x.parameters()))\n",
             o->threads, (long long)o->vocab, (long long)o->dim, o->layers, (long long)o->dim, (long long)o->dim,
             (long long)o->dim, (long long)o->ffn, (long long)o->ffn, (long long)o->dim, (long long)o->dim,
             (long long)o->vocab);
    snprintf(cmd, sizeof cmd, "%s/torch_init.py", o->work);
    bench_write_text(cmd, py);
    snprintf(cmd, sizeof cmd, "%s %s/torch_init.py 2>/dev/null", o->python, o->work);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    double s = -1;
    long long n = 0;
    if (fgets(out, sizeof out, p) && sscanf(out, "%lf %lld", &s, &n) == 2 && n != table_params(o)) {
        fprintf(stderr, "init_table: PyTorch built %lld parameters, the table has %lld\n", n,
                (long long)table_params(o));
        s = -1;
    }
    if (pclose(p)) s = -1;
    return s;
}

/* The fastest of o->reps runs of cmd: the stage's seconds_init from its report (the machine is shared:
 * the minimum is the figure least disturbed by other work); *rss: the peak resident set of the last. */
static double best_stage(const opts *o, const char *cmd, const char *rep, long *rss, double *local) {
    double best = -1;
    for (int r = 0; r < o->reps; r++) {
        if (run_child(cmd, rss)) return -1;
        double s = bench_stage_field(rep, "init", "seconds_init");
        if (best < 0 || s < best) best = s;
        if (local) *local = bench_stage_field(rep, "init", "local_params");
    }
    return best;
}

static double best_memset(const opts *o, size_t bytes, int threads) {
    double best = -1;
    for (int r = 0; r < o->reps; r++) {
        double s = bench_memset_seconds(bytes, threads);
        if (best < 0 || s < best) best = s;
    }
    return best;
}

static void part_one_two(const opts *o, const char *bin) {
    char path[1024], rep[1024], cmd[4096];
    int64_t n = table_params(o);
    size_t bytes = (size_t)n * 4;
    snprintf(path, sizeof path, "%s/table_cpu.yaml", o->work);
    snprintf(rep, sizeof rep, "%s/rep_cpu.json", o->work);
    table_recipe(o, path, "init-cpu");
    snprintf(cmd, sizeof cmd, "%s -q --report %s %s", bin, rep, path);
    long rss = 0;
    double ours = best_stage(o, cmd, rep, &rss, NULL);
    if (ours < 0) return;
    double ms = best_memset(o, bytes, o->threads);
    printf("init-cpu: %lld parameters (%.2f GB of float32) on %d threads, best of %d\n", (long long)n,
           (double)bytes / 1e9, o->threads, o->reps);
    printf("  init-cpu stage        %8.3f s  (%.2f GB/s)\n", ours, (double)bytes / ours / 1e9);
    printf("  memset of the bytes   %8.3f s  (%.2f GB/s, fresh pages)\n", ms, (double)bytes / ms / 1e9);
    printf("  ratio init-cpu / memset: %.2f   (peak RSS %.2f GB = %.2f x the state)\n", ours / ms,
           (double)rss * 1024 / 1e9, (double)rss * 1024 / (double)bytes);
    double ts = o->torch ? torch_seconds(o) : -1;
    if (ts > 0)
        printf("  PyTorch nn.Embedding/nn.Linear on the CPU %8.3f s: ratio PyTorch / init-cpu = %.2f\n", ts, ts / ours);
    else
        printf("  PyTorch: not measured (%s)\n", o->torch ? "no usable torch for that python" : "--no-torch");
    /* init-meta: every rank at once, each its shard; against all the ranks' bytes set at once */
    snprintf(path, sizeof path, "%s/table_meta.yaml", o->work);
    snprintf(rep, sizeof rep, "%s/rep_meta.json", o->work);
    table_recipe(o, path, "init-meta");
    snprintf(cmd, sizeof cmd, "mpirun --oversubscribe %s -np %d %s -q --report %s %s",
             geteuid() == 0 ? "--allow-run-as-root" : "", o->ranks, bin, rep, path);
    double local = 0, meta = best_stage(o, cmd, rep, NULL, &local);
    if (meta < 0) return;
    int per = o->threads / o->ranks > 0 ? o->threads / o->ranks : 1;
    double ms_all = best_memset(o, (size_t)local * 4 * (size_t)o->ranks, per * o->ranks);
    printf("init-meta on %d ranks (%d thread%s each): rank 0 holds %.0f parameters (%.2f GB)\n", o->ranks, per,
           per > 1 ? "s" : "", local, local * 4 / 1e9);
    printf("  init-meta stage (rank 0) %8.3f s, memset of every rank's bytes at once %8.3f s: ratio %.2f\n", meta,
           ms_all, meta / ms_all);
}

/* A generated Qwen2-style HF directory and a SigLIP-style ViT file; returns the LLM's bytes. */
static uint64_t write_inputs(const opts *o, const char *llm, const char *vit) {
    char path[1024];
    snprintf(path, sizeof path, "mkdir -p %s", llm);
    if (bench_sh(path)) return 0;
    const int64_t H = o->mot_hidden, I = 4 * H, V = 32000, hd = 64, kv = H / 4;
    snprintf(path, sizeof path, "%s/config.json", llm);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"qwen2\", \"hidden_size\": %lld, \"num_attention_heads\": %lld, "
             "\"num_hidden_layers\": %d}\n", (long long)H, (long long)(H / hd), o->mot_layers);
    bench_write_text(path, cfg);
    st_writer *w;
    fsdp_err err;
    snprintf(path, sizeof path, "%s/model.safetensors", llm);
    if (st_writer_new(&w, path, &err)) return 0;
    struct {
        char name[128];
        int64_t shape[2];
        int nd;
    } t[16 * 64 + 3];
    int n = 0;
#define ADD(nm, a, b, d) (snprintf(t[n].name, sizeof t[n].name, "%s", nm), t[n].shape[0] = a, t[n].shape[1] = b, t[n].nd = d, n++)
    ADD("model.embed_tokens.weight", V, H, 2);
    for (int l = 0; l < o->mot_layers && n < 16 * 64; l++) {
        char p[128];
        const char *names[] = {"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                               "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"};
        const int64_t rows[] = {H, H, kv, kv, kv, kv, H, I, I, H, H, H}, cols[] = {H, 1, H, 1, H, 1, H, H, H, I, 1, 1};
        for (int k = 0; k < 12; k++) {
            snprintf(p, sizeof p, "model.layers.%d.%s", l, names[k]);
            ADD(p, rows[k], cols[k], cols[k] == 1 ? 1 : 2);
        }
    }
    ADD("model.norm.weight", H, 1, 1);
    ADD("lm_head.weight", V, H, 2);
#undef ADD
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        if (st_writer_declare(w, t[i].name, FSDP_DT_BF16, t[i].nd, t[i].shape, NULL, &err)) return 0;
    if (st_writer_begin(w, &err)) return 0;
    uint16_t *buf = malloc(sizeof(uint16_t) << 20);
    for (int i = 0; i < n && buf; i++) {
        uint64_t left = (uint64_t)t[i].shape[0] * (t[i].nd == 2 ? (uint64_t)t[i].shape[1] : 1);
        for (uint64_t k = 0; k < ((uint64_t)1 << 20); k++) buf[k] = fsdp_f32_to_bf16((float)(k % 97) * 1e-3f);
        while (left) {
            uint64_t m = left < ((uint64_t)1 << 20) ? left : ((uint64_t)1 << 20);
            if (st_writer_write(w, (size_t)i, buf, (size_t)m * 2, &err)) return 0;
            left -= m;
            total += m * 2;
        }
    }
    free(buf);
    if (st_writer_finish(w, &err)) return 0;
    st_writer_free(w);
    /* the ViT: a few f32 tensors of width 1152 (SigLIP so400m's) */
    const int64_t W = 1152;
    float *z = calloc((size_t)(W * 4304), sizeof *z);
    int64_t s1[2] = {W, W}, s2[1] = {W}, s3[2] = {4304, W}, s4[2] = {W, 4304};
    st_entry e[] = {{"vision_model.encoder.layers.0.self_attn.q_proj.weight", FSDP_DT_F32, 2, s1, z},
                    {"vision_model.encoder.layers.0.mlp.fc1.weight", FSDP_DT_F32, 2, s3, z},
                    {"vision_model.encoder.layers.0.mlp.fc2.weight", FSDP_DT_F32, 2, s4, z},
                    {"vision_model.post_layernorm.weight", FSDP_DT_F32, 1, s2, z}};
    int rc = z ? st_save(vit, e, 4, NULL, 0, NULL, NULL, &err) : -1;
    free(z);
    return rc ? 0 : total;
}

static long long rchar(void) {
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    long long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "rchar: ", 7)) v = atoll(line + 7);
    if (f) fclose(f);
    return v;
}

static void part_three_four(const opts *o, const char *bin) {
    char llm[1024], vit[1024], out[1024], rep[1024], cmd[8192];
    snprintf(llm, sizeof llm, "%s/llm", o->work);
    snprintf(vit, sizeof vit, "%s/vit.safetensors", o->work);
    snprintf(out, sizeof out, "%s/mot_out", o->work);
    snprintf(rep, sizeof rep, "%s/rep_mot.json", o->work);
    uint64_t llm_bytes = write_inputs(o, llm, vit);
    if (!llm_bytes) return;
    char yaml[2048];
    snprintf(yaml, sizeof yaml, "model: {from: %s}\n", llm);
    fsdp_value *root;
    fsdp_err err;
    mt_table t;
    if (yaml_load_string(yaml, strlen(yaml), "bench", 0, 0, &root, &err)) return;
    long long r0 = rchar();
    double t0 = bench_now();
    mt_spec_opts so = {0, &decoder_table_arch};
    int rc = mt_spec_build(fsdp_value_get(root, "model"), &so, &t, &err);
    double el = bench_now() - t0;
    long long read = rchar() - r0;
    val_free(root);
    if (rc) {
        fprintf(stderr, "init_table: %s\n", err.msg);
        return;
    }
    size_t tensors = t.n;
    mt_free(&t);
    /* what reading the data would cost: the files through cat (page cache warm after the write) */
    snprintf(cmd, sizeof cmd, "cat %s/model.safetensors > /dev/null", llm);
    double c0 = bench_now();
    if (run_child(cmd, NULL)) return;
    double cat_s = bench_now() - c0;
    printf("table from the header of %s (%zu tensors, %.2f GB): %.5f s and %lld bytes read by read(2) (the safetensors "
           "header is mapped), cat of the data %.4f s: ratio table / cat = %.4f\n",
           llm, tensors, (double)llm_bytes / 1e9, el, read, cat_s, el / cat_s);
    snprintf(cmd, sizeof cmd, "%s -q --report %s --set runtime.threads=%d recipes/mot_bootstrap.yaml --set vars.llm=%s "
             "--set vars.vit=%s --set vars.out=%s", bin, rep, o->threads, llm, vit, out);
    long rss = 0;
    if (run_child(cmd, &rss)) return;
    double params = bench_stage_field(rep, "init", "params");
    double state = params * 4;
    printf("composed bootstrap (mot_bootstrap, 1 rank): %.0f parameters, float32 state %.2f GB, peak RSS %.2f GB: "
           "ratio peak / state = %.2f (a bf16 state would be %.2f GB)\n",
           params, state / 1e9, (double)rss * 1024 / 1e9, (double)rss * 1024 / state, state / 2 / 1e9);
}

int main(int argc, char **argv) {
    opts o = {16, 2, 2, 1024, 8, 1, 1, 3, 2048, 8192, 128256, "python3", NULL};
    const char *env_py = getenv("FSDP_TORCH_PYTHON");
    if (env_py && *env_py) o.python = env_py;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--no-torch")) o.torch = 0, used = 0;
        else if (!strcmp(a, "--no-mot")) o.mot = 0, used = 0;
        else if (!v) used = -1;
        else if (!strcmp(a, "--layers")) o.layers = atoi(v);
        else if (!strcmp(a, "--dim")) o.dim = atoll(v);
        else if (!strcmp(a, "--ffn")) o.ffn = atoll(v);
        else if (!strcmp(a, "--vocab")) o.vocab = atoll(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--ranks")) o.ranks = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--python")) o.python = v;
        else if (!strcmp(a, "--mot-hidden")) o.mot_hidden = atoi(v);
        else if (!strcmp(a, "--mot-layers")) o.mot_layers = atoi(v);
        else if (!strcmp(a, "--work")) o.work = v;
        else used = -1;
        if (used < 0 || o.layers < 0 || o.layers > 1024 || o.dim < 1 || o.ffn < 1 || o.vocab < 1 || o.threads < 1 ||
            o.ranks < 1 || o.reps < 1 || o.mot_hidden < 64 || o.mot_hidden % 64 || o.mot_layers < 1 || o.mot_layers > 64) {
            fprintf(stderr, "usage: %s [--layers N] [--dim D] [--ffn F] [--vocab V] [--threads T] [--ranks R] [--reps N] "
                    "[--python PY] [--no-torch] [--mot-hidden H (a multiple of 64)] [--mot-layers N] [--no-mot] "
                    "[--work DIR]\n", argv[0]);
            return 2;
        }
        i += used;
    }
    char work[] = "/tmp/init_table-XXXXXX";
    if (!o.work && !(o.work = mkdtemp(work))) return 1;
    if (mkdir(o.work, 0755) && errno != EEXIST) {
        fprintf(stderr, "init_table: cannot create --work %s: %s\n", o.work, strerror(errno));
        return 1;
    }
    const char *bin = FSDP_BUILD_DIR "/fsdp-run";
    part_one_two(&o, bin);
    if (o.mot) part_three_four(&o, bin);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", o.work);
    if (o.work == work) bench_sh(cmd);
    return 0;
}
