/* bench/bagel_bootstrap: recipes/bagel_bootstrap.yaml (Bagel's step-0 checkpoint from an HF Qwen2 LLM
 * and an HF SigLIP ViT) against the machine's floor for the same bytes, in one run, with ratios.
 *
 *   build/bench/bagel_bootstrap [--llm-layers 2] [--vit-layers 2] [--ranks 1,2] [--reps 3]
 *                               [--layout pr240] [--plain-layers 4] [--no-plain] [--threads T]
 *                               [--work DIR] [--bin build/fsdp-run] [--keep]
 *
 * 1. Sources, written once by fsdp-run itself (an inline model table, init-meta, save-safetensors), at
 *    real shapes with fewer layers: a Qwen2.5-7B-shaped HF directory (bf16, untied, q/k/v biases) of
 *    --llm-layers layers and a SigLIP-so400m-shaped HF vision directory (980 px, patch 14, the pooling
 *    head, `vision_model.` keys) of --vit-layers + 1 encoder layers (Bagel drops the last one).
 * 2. Each repetition, for each rank count: the whole bootstrap process (+ sync) after settle(); its
 *    peak RSS (the report's peak_rss_bytes, max over ranks) against its shard of the float32 state;
 *    then the floor of the same run: `cat` of every source file to /dev/null plus `cp -r` + sync of
 *    the output, each after settle(); and the same copy with O_DIRECT writes (dd oflag=direct, 4 MiB
 *    blocks), the device's own write speed, which the saves' direct payload writes aim at
 *    (ckpt/ckpt_pwrite.h): on a VM that returns idle memory to its host, a buffered cp is often several
 *    times slower than the device.
 *    The same bootstrap again with runtime.stream=false (every value materialised where it is made, the
 *    path before the streamed bootstrap): its time and peak RSS beside the streamed run's, and the
 *    streamed run against max(cat of the sources, the O_DIRECT copy of the output), issue 40's bar.
 * 3. The plain bootstrap (--no-plain skips it): init-meta + save-dcp of Llama-3 1B with --plain-layers
 *    layers, against a memset of fresh pages of its state (the run's threads) plus `cp -r` + sync.
 * The tables show medians; a ratio column is the median of the per-repetition ratios. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "decoder/decoder_config.h"
#include "decoder/decoder_spec.h"
#include "decoder/decoder_table.h"
#include "model/mt_spec.h"
#include "pipeline/recipe.h"

#define BB_MAX_REPS 32
#define BB_MAX_NP 4
#define BB_RECIPE "recipes/bagel_bootstrap.yaml"

/* Qwen2.5-7B and SigLIP so400m (patch 14, 980 px) */
enum { Q_HIDDEN = 3584, Q_FFN = 18944, Q_HEADS = 28, Q_KV_HEADS = 4, Q_HEAD_DIM = 128, Q_VOCAB = 152064 };
enum { S_HIDDEN = 1152, S_FFN = 4304, S_HEADS = 16, S_PATCH = 14, S_IMAGE = 980 };

static const char *const STAGES[] = {"init", "load_llm", "load_vit", "experts", "save"};
#define BB_N_STAGES 5

typedef struct bb_opts {
    int llm_layers, vit_layers, reps, plain_layers, plain, threads, keep, n_np, np[BB_MAX_NP];
    const char *layout, *work, *bin;
} bb_opts;

typedef struct series {
    double v[BB_MAX_REPS];
    int n;
} series;

/* one kind of run (Bagel or plain) on one rank count, over the repetitions */
typedef struct bb_cell {
    series ours, base, cp, dcp, floor, floor_ratio, dfloor_ratio, rss, stage[BB_N_STAGES];
    /* the same bootstrap with runtime.stream=false (every value materialised where it is made), and
     * max(read the sources, write the output with O_DIRECT) / ours: issue 40's bar for the streamed path */
    series held, held_rss, max_ratio;
    double out_bytes, params;
} bb_cell;

typedef struct bb_run {
    bb_opts o;
    char root[32], llm[1100], vit[1100], out[1100], report[1100];
    double src_bytes, state_bytes, plain_state_bytes;
    bb_cell bagel[BB_MAX_NP], plain[BB_MAX_NP];
    series memset; /* reference for init: a memset of fresh pages of the Bagel state, every thread */
} bb_run;

static void put(series *s, double v) {
    if (v >= 0 && s->n < BB_MAX_REPS) s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const series *s) {
    if (!s->n) return -1;
    double v[BB_MAX_REPS];
    memcpy(v, s->v, sizeof(double) * (size_t)s->n);
    qsort(v, (size_t)s->n, sizeof(double), cmp_double);
    return s->n % 2 ? v[s->n / 2] : (v[s->n / 2 - 1] + v[s->n / 2]) / 2;
}

/* ---------------------------------------------------------------- sources */

static int write_llm_config(const bb_run *r) {
    char path[1200], text[2048];
    snprintf(path, sizeof path, "%s/config.json", r->llm);
    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"Qwen2ForCausalLM\"],\n  \"attention_dropout\": 0.0,\n"
             "  \"bos_token_id\": 151643,\n  \"eos_token_id\": 151645,\n  \"hidden_act\": \"silu\",\n"
             "  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
             "  \"max_position_embeddings\": 32768,\n  \"max_window_layers\": %d,\n  \"model_type\": \"qwen2\",\n"
             "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
             "  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n  \"rope_theta\": 1000000.0,\n"
             "  \"sliding_window\": 131072,\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
             "  \"use_cache\": true,\n  \"use_sliding_window\": false,\n  \"vocab_size\": %d\n}\n",
             Q_HIDDEN, Q_FFN, r->o.llm_layers, Q_HEADS, r->o.llm_layers, Q_KV_HEADS, Q_VOCAB);
    return bench_write_text(path, text);
}

/* Qwen2ForCausalLM's state_dict() names and shapes (untied: lm_head.weight stored) */
static int write_llm_recipe(const bb_run *r, const char *path) {
    char text[4096];
    snprintf(text, sizeof text,
             "version: 1\nruntime: {device: cpu, threads: %d, seed: 1}\n"
             "model:\n  dims: {H: %d, I: %d, heads: %d, kv_heads: %d, head_dim: %d, V: %d, L: %d}\n"
             "  dtype: bf16\n  init: \"normal(0, 0.02)\"\n  params:\n"
             "    - {name: model.embed_tokens.weight, shape: [V, H]}\n"
             "    - {name: \"model.layers.{0..L-1}.self_attn.q_proj.weight\", shape: [heads * head_dim, H]}\n"
             "    - {name: \"model.layers.{0..L-1}.self_attn.q_proj.bias\", shape: [heads * head_dim]}\n"
             "    - {name: \"model.layers.{0..L-1}.self_attn.{k,v}_proj.weight\", shape: [kv_heads * head_dim, H]}\n"
             "    - {name: \"model.layers.{0..L-1}.self_attn.{k,v}_proj.bias\", shape: [kv_heads * head_dim]}\n"
             "    - {name: \"model.layers.{0..L-1}.self_attn.o_proj.weight\", shape: [H, heads * head_dim]}\n"
             "    - {name: \"model.layers.{0..L-1}.mlp.{gate,up}_proj.weight\", shape: [I, H]}\n"
             "    - {name: \"model.layers.{0..L-1}.mlp.down_proj.weight\", shape: [H, I]}\n"
             "    - {name: \"model.layers.{0..L-1}.{input,post_attention}_layernorm.weight\", shape: [H], init: ones}\n"
             "    - {name: model.norm.weight, shape: [H], init: ones}\n"
             "    - {name: lm_head.weight, shape: [V, H]}\n"
             "stages:\n  - {id: init, uses: init-meta}\n"
             "  - {id: save, uses: save-safetensors, with: {path: \"%s\", shard_mb: 4000}}\n",
             r->o.threads, Q_HIDDEN, Q_FFN, Q_HEADS, Q_KV_HEADS, Q_HEAD_DIM, Q_VOCAB, r->o.llm_layers, r->llm);
    return bench_write_text(path, text);
}

static int write_vit_config(const bb_run *r) {
    char path[1200], text[1024];
    snprintf(path, sizeof path, "%s/config.json", r->vit);
    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"SiglipVisionModel\"],\n  \"attention_dropout\": 0.0,\n"
             "  \"hidden_act\": \"gelu_pytorch_tanh\",\n  \"hidden_size\": %d,\n  \"image_size\": %d,\n"
             "  \"intermediate_size\": %d,\n  \"layer_norm_eps\": 1e-06,\n  \"model_type\": \"siglip_vision_model\",\n"
             "  \"num_attention_heads\": %d,\n  \"num_channels\": 3,\n  \"num_hidden_layers\": %d,\n"
             "  \"patch_size\": %d,\n  \"torch_dtype\": \"bfloat16\"\n}\n",
             S_HIDDEN, S_IMAGE, S_FFN, S_HEADS, r->o.vit_layers + 1, S_PATCH);
    return bench_write_text(path, text);
}

/* SiglipVisionModel's state_dict() names and shapes: embeddings, encoder, post_layernorm, the pooling head */
static int write_vit_recipe(const bb_run *r, const char *path) {
    char text[4096];
    snprintf(text, sizeof text,
             "version: 1\nruntime: {device: cpu, threads: %d, seed: 2}\n"
             "model:\n  dims: {W: %d, I: %d, P: %d, side: %d, L: %d}\n"
             "  dtype: bf16\n  init: \"normal(0, 0.02)\"\n  params:\n"
             "    - {name: vision_model.embeddings.patch_embedding.weight, shape: [W, 3, P, P]}\n"
             "    - {name: vision_model.embeddings.patch_embedding.bias, shape: [W]}\n"
             "    - {name: vision_model.embeddings.position_embedding.weight, shape: [side * side, W]}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.self_attn.{k,v,q,out}_proj.weight\", shape: [W, W]}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.self_attn.{k,v,q,out}_proj.bias\", shape: [W]}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.layer_norm{1,2}.weight\", shape: [W], init: ones}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.layer_norm{1,2}.bias\", shape: [W], init: zeros}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.mlp.fc1.weight\", shape: [I, W]}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.mlp.fc1.bias\", shape: [I]}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.mlp.fc2.weight\", shape: [W, I]}\n"
             "    - {name: \"vision_model.encoder.layers.{0..L-1}.mlp.fc2.bias\", shape: [W]}\n"
             "    - {name: vision_model.post_layernorm.weight, shape: [W], init: ones}\n"
             "    - {name: vision_model.post_layernorm.bias, shape: [W], init: zeros}\n"
             "    - {name: vision_model.head.probe, shape: [1, 1, W]}\n"
             "    - {name: vision_model.head.attention.in_proj_weight, shape: [3 * W, W]}\n"
             "    - {name: vision_model.head.attention.in_proj_bias, shape: [3 * W]}\n"
             "    - {name: vision_model.head.attention.out_proj.weight, shape: [W, W]}\n"
             "    - {name: vision_model.head.attention.out_proj.bias, shape: [W]}\n"
             "    - {name: vision_model.head.layernorm.weight, shape: [W], init: ones}\n"
             "    - {name: vision_model.head.layernorm.bias, shape: [W], init: zeros}\n"
             "    - {name: vision_model.head.mlp.fc1.weight, shape: [I, W]}\n"
             "    - {name: vision_model.head.mlp.fc1.bias, shape: [I]}\n"
             "    - {name: vision_model.head.mlp.fc2.weight, shape: [W, I]}\n"
             "    - {name: vision_model.head.mlp.fc2.bias, shape: [W]}\n"
             "stages:\n  - {id: init, uses: init-meta}\n"
             "  - {id: save, uses: save-safetensors, with: {path: \"%s/model.safetensors\"}}\n",
             r->o.threads, S_HIDDEN, S_FFN, S_PATCH, S_IMAGE / S_PATCH, r->o.vit_layers + 1, r->vit);
    return bench_write_text(path, text);
}

/* both source directories, by fsdp-run on one rank; their bytes in r->src_bytes */
static int write_sources(bb_run *r) {
    char cmd[4096], recipe[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' '%s'", r->llm, r->vit);
    if (bench_sh(cmd) || write_llm_config(r) || write_vit_config(r)) return -1;
    double t0 = bench_now();
    snprintf(recipe, sizeof recipe, "%s/src_llm.yaml", r->o.work);
    if (write_llm_recipe(r, recipe)) return -1;
    snprintf(cmd, sizeof cmd, "%s -q %s", r->o.bin, recipe);
    if (bench_sh(cmd)) return -1;
    snprintf(recipe, sizeof recipe, "%s/src_vit.yaml", r->o.work);
    if (write_vit_recipe(r, recipe)) return -1;
    snprintf(cmd, sizeof cmd, "%s -q %s && sync", r->o.bin, recipe);
    if (bench_sh(cmd)) return -1;
    double el = bench_now() - t0;
    double a = bench_path_bytes(r->llm), b = bench_path_bytes(r->vit);
    if (a <= 0 || b <= 0) return -1;
    r->src_bytes = a + b;
    printf("sources (written once by fsdp-run in %.1f s): LLM %.3f GB (%d layers), ViT %.3f GB (%d + 1 layers), "
           "%.3f GB in all\n", el, a / 1e9, r->o.llm_layers, b / 1e9, r->o.vit_layers, r->src_bytes / 1e9);
    fflush(stdout);
    return 0;
}

/* ---------------------------------------------------------------- state sizes */

static double table_bytes(const mt_table *t) {
    double n = 0;
    for (size_t i = 0; i < t->n; i++) {
        double e = 1;
        for (int d = 0; d < t->p[i].ndim; d++) e *= (double)t->p[i].shape[d];
        n += e;
    }
    return n * 4;
}

/* float32 bytes of a recipe's model (its table built as the run builds it, the sources' headers
 * read), with --set overrides; -1 on error */
static double recipe_state_bytes(const char *path, const char **sets, size_t n_sets) {
    recipe_override ovr[8];
    for (size_t i = 0; i < n_sets && i < 8; i++) ovr[i] = (recipe_override){sets[i], 0};
    recipe *rc = NULL;
    fsdp_err err;
    fsdp_err_clear(&err);
    mt_table t;
    mt_init(&t);
    int bad = recipe_load(path, ovr, n_sets < 8 ? n_sets : 8, &rc, &err);
    const fsdp_value *m = bad ? NULL : fsdp_value_get(rc->root, "model");
    mt_spec_opts so = {0, &decoder_table_arch};
    if (m && mt_spec_is_table(m)) bad = mt_spec_build(m, &so, &t, &err);
    else if (m) {
        decoder_config cfg;
        bad = decoder_spec_from_value(&cfg, m, &err) || decoder_table_build(&cfg, NULL, &t, &err);
    }
    if (bad || !m) fprintf(stderr, "bagel_bootstrap: %s: %s\n", path, bad ? err.msg : "no model");
    double bytes = bad || !m ? -1 : table_bytes(&t);
    mt_free(&t);
    recipe_free(rc);
    return bytes;
}

/* ---------------------------------------------------------------- measurements */

/* Before each timed write or fill of new memory: a scratch file of the state's size written and removed,
 * untimed. This VM returns memory the guest has not used for a few seconds to the host (free page
 * reporting), and the first large write into it pays host page faults; every timed command starts with
 * the same warm memory (bench/ckpt_vs_torch.c measured 5.0-6.1 s against 1.3 s for one convert). */
static void settle(const bb_run *r, double bytes) {
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "head -c %.0f /dev/zero > '%s/settle' && rm -f '%s/settle'", bytes, r->o.work,
             r->o.work);
    bench_run(cmd, NULL);
}

static double settled_run(const bb_run *r, double settle_bytes, const char *cmd) {
    settle(r, settle_bytes);
    return bench_run(cmd, NULL);
}

/* a metric of a report's stage: rank 0's (metrics), or the max over ranks (ranks.<m>.max) when present */
static double stage_metric_max(json_t *stage, const char *m) {
    json_t *x = json_object_get(json_object_get(json_object_get(stage, "ranks"), m), "max");
    if (!json_is_number(x)) x = json_object_get(json_object_get(stage, "metrics"), m);
    return json_is_number(x) ? json_number_value(x) : -1;
}

/* from the run report: the peak RSS of the largest rank, each stage's seconds and the model's params */
static int read_report(const bb_run *r, bb_cell *c, series *rss_to, int split) {
    json_error_t je;
    json_t *j = json_load_file(r->report, 0, &je);
    if (!j) {
        fprintf(stderr, "bagel_bootstrap: cannot read the run report %s: %s\n", r->report, je.text);
        return -1;
    }
    double rss = -1;
    json_t *st = json_object_get(j, "stages");
    for (size_t i = 0; i < json_array_size(st); i++) {
        json_t *s = json_array_get(st, i);
        double v = stage_metric_max(s, "peak_rss_bytes");
        if (v > rss) rss = v;
        const char *id = json_string_value(json_object_get(s, "id"));
        if (id && !strcmp(id, "init")) c->params = stage_metric_max(s, "params");
        for (int k = 0; split && id && k < BB_N_STAGES; k++)
            if (!strcmp(id, STAGES[k])) put(&c->stage[k], json_number_value(json_object_get(s, "seconds")));
    }
    put(rss_to, rss);
    json_decref(j);
    return 0;
}

static void launch_prefix(const bb_run *r, int np, char *buf, size_t n) {
    if (np > 1) snprintf(buf, n, "mpirun --oversubscribe -np %d%s ", np, r->root);
    else buf[0] = '\0';
}

static int threads_per_rank(const bb_run *r, int np) {
    return r->o.threads / np > 0 ? r->o.threads / np : 1;
}

/* settle; t_cp of `cp -r` + sync of the output, then (settled again) *dcp of the same copy with O_DIRECT
 * writes (dd oflag=direct, 4 MiB blocks: the device's write speed without the page cache, which the
 * saves use); the copies and the output removed */
static double cp_floor(const bb_run *r, double settle_bytes, double *dcp) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s.copy' && sync", r->out, r->out);
    double t = settled_run(r, settle_bytes, cmd);
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s.copy' && mkdir '%s.copy' && for f in '%s'/* '%s'/.metadata; do dd if=\"$f\" "
             "of='%s.copy'/\"$(basename \"$f\")\" bs=4M oflag=direct status=none || exit 1; done && sync",
             r->out, r->out, r->out, r->out, r->out);
    *dcp = settled_run(r, settle_bytes, cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.copy'", r->out, r->out);
    bench_run(cmd, NULL);
    return t;
}

static void put_floor(bb_cell *c, double ours, double base, double cp, double dcp) {
    put(&c->ours, ours);
    put(&c->base, base);
    put(&c->cp, cp);
    put(&c->dcp, dcp);
    if (base < 0 || cp < 0) return;
    put(&c->floor, base + cp);
    put(&c->floor_ratio, (base + cp) / ours);
    if (dcp >= 0) put(&c->dfloor_ratio, (base + dcp) / ours);
}

/* one repetition of the Bagel bootstrap on np ranks, then its floor (cat of the sources, cp of the output) */
static int rep_bagel(bb_run *r, int np, bb_cell *c) {
    char cmd[8192], launch[128];
    launch_prefix(r, np, launch, sizeof launch);
    snprintf(cmd, sizeof cmd,
             "%s%s -q --report '%s' " BB_RECIPE " --set runtime.threads=%d --set vars.llm='%s' --set vars.vit='%s' "
             "--set vars.out='%s' --set vars.layout=%s --set vars.overwrite=true && sync",
             launch, r->o.bin, r->report, threads_per_rank(r, np), r->llm, r->vit, r->out, r->o.layout);
    double ours = settled_run(r, r->state_bytes, cmd);
    if (ours < 0 || read_report(r, c, &c->rss, 1)) return -1;
    char held_cmd[8300];
    size_t n = strlen(cmd) - strlen(" && sync");
    snprintf(held_cmd, sizeof held_cmd, "%.*s --set runtime.stream=false && sync", (int)n, cmd);
    double held = settled_run(r, r->state_bytes, held_cmd);
    if (held < 0 || read_report(r, c, &c->held_rss, 0)) return -1;
    put(&c->held, held);
    c->out_bytes = bench_path_bytes(r->out);
    snprintf(cmd, sizeof cmd, "find '%s' '%s' -type f -exec cat {} + > /dev/null", r->llm, r->vit);
    double cat = settled_run(r, r->state_bytes, cmd);
    double dcp = -1, cp = cp_floor(r, r->state_bytes, &dcp);
    put_floor(c, ours, cat, cp, dcp);
    if (cat >= 0 && dcp >= 0) put(&c->max_ratio, (cat > dcp ? cat : dcp) / ours);
    return 0;
}

static int write_plain_recipe(const bb_run *r, const char *path) {
    char text[1024];
    snprintf(text, sizeof text,
             "version: 1\nvars: {out: x}\nmodel: {arch: llama3, preset: llama3_1b, n_layers: %d}\n"
             "stages:\n  - {id: init, uses: init-meta}\n"
             "  - {id: save, uses: save-dcp, with: {path: \"${out}\", overwrite: true}}\n",
             r->o.plain_layers);
    return bench_write_text(path, text);
}

/* one repetition of the plain bootstrap (init-meta + save-dcp) on np ranks, then memset + cp */
static int rep_plain(bb_run *r, int np, bb_cell *c) {
    char cmd[8192], launch[128];
    launch_prefix(r, np, launch, sizeof launch);
    snprintf(cmd, sizeof cmd, "%s%s -q --report '%s' '%s/plain.yaml' --set runtime.threads=%d --set vars.out='%s' && sync",
             launch, r->o.bin, r->report, r->o.work, threads_per_rank(r, np), r->out);
    double ours = settled_run(r, r->plain_state_bytes, cmd);
    if (ours < 0 || read_report(r, c, &c->rss, 0)) return -1;
    c->out_bytes = bench_path_bytes(r->out);
    settle(r, r->plain_state_bytes);
    double ms = bench_memset_seconds((size_t)r->plain_state_bytes, r->o.threads);
    double dcp = -1, cp = cp_floor(r, r->plain_state_bytes, &dcp);
    put_floor(c, ours, ms, cp, dcp);
    return 0;
}

/* ---------------------------------------------------------------- output */

static void fmt_s(char *buf, size_t n, double v, const char *f) {
    if (v < 0) snprintf(buf, n, "-");
    else snprintf(buf, n, f, v);
}

/* the columns both tables share: ours, base (cat or memset), cp, floor, floor/ours, GB/s, RSS/shard */
static void print_common(const bb_cell *c, int np, double state) {
    char a[32], b[32], d[32], e[32], f[32], g[32], h[32];
    double ours = median(&c->ours), rss = median(&c->rss), shard = state / np;
    fmt_s(a, sizeof a, ours, "%.2f");
    fmt_s(b, sizeof b, median(&c->base), "%.2f");
    fmt_s(d, sizeof d, median(&c->cp), "%.2f");
    fmt_s(e, sizeof e, median(&c->floor), "%.2f");
    fmt_s(f, sizeof f, median(&c->floor_ratio), "%.2f");
    fmt_s(g, sizeof g, median(&c->dcp), "%.2f");
    fmt_s(h, sizeof h, median(&c->dfloor_ratio), "%.2f");
    printf("| %d | %s | %s | %s | %s | **%s** | %s | %s | %.2f | %.2f GB / %.2f GB = %.2f |", np, a, b, d, e, f, g, h,
           ours > 0 ? c->out_bytes / ours / 1e9 : 0, rss / 1e9, shard / 1e9, rss / shard);
}

static void print_bagel_table(const bb_run *r) {
    printf("\nBagel bootstrap (layout %s), medians of %d repetitions:\n\n", r->o.layout, r->o.reps);
    printf("| ranks | ours s | t_cat s | t_cp s | floor s | floor/ours | t_cp direct s | (cat + cp direct)/ours | GB/s "
           "of output | peak RSS per rank / shard (ratio) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < r->o.n_np; i++) {
        print_common(&r->bagel[i], r->o.np[i], r->state_bytes);
        printf("\n");
    }
}

static void print_plain_table(const bb_run *r) {
    if (!r->o.plain) return;
    printf("\nPlain bootstrap (llama3_1b, %d layers: init-meta + save-dcp), medians of %d repetitions:\n\n",
           r->o.plain_layers, r->o.reps);
    printf("| ranks | ours s | memset s | t_cp s | floor s | floor/ours | t_cp direct s | (memset + cp direct)/ours | "
           "GB/s of output | peak RSS per rank / shard (ratio) | ours/(memset+cp) | max(memset,cp)/ours |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < r->o.n_np; i++) {
        const bb_cell *c = &r->plain[i];
        double ours = median(&c->ours), ms = median(&c->base), cp = median(&c->cp);
        print_common(c, r->o.np[i], r->plain_state_bytes);
        printf(" %.2f | %.2f |\n", ours / (ms + cp), (ms > cp ? ms : cp) / ours);
    }
}

/* the streamed bootstrap against the materialised one and against max(read, direct write) */
static void print_stream_table(const bb_run *r) {
    printf("\nStreamed (default) against runtime.stream=false (every value held), same run, medians:\n\n"
           "| ranks | streamed s | held s | held / streamed | max(t_cat, t_cp direct) / streamed | peak RSS per rank "
           "streamed / shard | held / shard |\n|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < r->o.n_np; i++) {
        const bb_cell *c = &r->bagel[i];
        double shard = r->state_bytes / r->o.np[i], ours = median(&c->ours), held = median(&c->held);
        printf("| %d | %.2f | %.2f | %.2f | **%.2f** | %.3f | %.3f |\n", r->o.np[i], ours, held,
               ours > 0 ? held / ours : 0, median(&c->max_ratio), median(&c->rss) / shard,
               median(&c->held_rss) / shard);
    }
}

static void print_split(const bb_run *r) {
    printf("\nfsdp-run stage split of the Bagel bootstrap (medians, rank 0's seconds from --report; the rest of the "
           "process: start, building the table from the sources' headers, exit, sync):\n\n| ranks |");
    for (int k = 0; k < BB_N_STAGES; k++) printf(" %s s |", STAGES[k]);
    printf(" sum of stages s | whole process + sync s |\n|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < r->o.n_np; i++) {
        double sum = 0;
        printf("| %d |", r->o.np[i]);
        for (int k = 0; k < BB_N_STAGES; k++) {
            double s = median(&r->bagel[i].stage[k]);
            printf(" %.2f |", s);
            sum += s > 0 ? s : 0;
        }
        printf(" %.2f | %.2f |\n", sum, median(&r->bagel[i].ours));
    }
    const bb_cell *c = &r->bagel[0];
    printf("\nthe stages' references (medians, beside the %d-rank runs): init: a memset of fresh pages of the whole "
           "state (%d threads) %.2f s; load_llm + load_vit: cat of the sources %.2f s; save: cp -r + sync of the "
           "output %.2f s\n", r->o.np[0], r->o.threads, median(&r->memset), median(&c->base), median(&c->cp));
}

static void print_notes(const bb_run *r) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    printf("\nMeasured: each repetition runs, for each rank count, the whole fsdp-run process (" BB_RECIPE
           ", layout %s, %d threads split over the ranks, mpirun for several) followed by sync, wall time; "
           "then its floor on this machine: `cat` of every source file to /dev/null (the read; sources in "
           "the page cache or not, as the run left them) plus `cp -r` of the output and sync (the write). Before "
           "each timed command a scratch file of the state's size is written and removed (see settle()). "
           "floor/ours is the median of the per-repetition ratios (1 = as fast as reading the sources and "
           "copying the output). Peak RSS is the largest rank's VmHWM from the report against its shard of the "
           "float32 state (state / ranks). The plain bootstrap's floor is a memset of fresh pages of its state "
           "(%d threads) plus the same cp. `t_cp direct` copies the same output with O_DIRECT writes (dd "
           "oflag=direct bs=4M, + sync): the device's write speed without the page cache, which the saves' "
           "payload writes use.\n", r->o.layout, r->o.threads, r->o.threads);
    printf("machine: %ld cores, %.1f GiB memory\n", cores, mem / (1 << 30));
    printf("sizes: sources %.3f GB (bf16), output %.3f GB, float32 state %.3f GB (%.0f parameters)", r->src_bytes / 1e9,
           r->bagel[0].out_bytes / 1e9, r->state_bytes / 1e9, r->state_bytes / 4);
    if (r->o.plain)
        printf("; plain: output %.3f GB, state %.3f GB", r->plain[0].out_bytes / 1e9, r->plain_state_bytes / 1e9);
    printf("\n");
    for (int i = 0; i < r->o.n_np; i++)
        if (r->bagel[i].params > 0 && r->bagel[i].params * 4 != r->state_bytes)
            printf("WARNING: the run's init reports %.0f parameters, the table %.0f\n", r->bagel[i].params,
                   r->state_bytes / 4);
}

/* ---------------------------------------------------------------- main */

static int parse_ranks(bb_opts *o, const char *list) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", list);
    o->n_np = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_np == BB_MAX_NP || atoi(t) < 1 || atoi(t) > 64) return -1;
        o->np[o->n_np++] = atoi(t);
    }
    return o->n_np ? 1 : -1;
}

static int parse_one(bb_opts *o, const char *a, const char *v) {
    if (!strcmp(a, "--no-plain")) return o->plain = 0, 0;
    if (!strcmp(a, "--keep")) return o->keep = 1, 0;
    if (!v) return -1;
    if (!strcmp(a, "--llm-layers")) o->llm_layers = atoi(v);
    else if (!strcmp(a, "--vit-layers")) o->vit_layers = atoi(v);
    else if (!strcmp(a, "--ranks")) return parse_ranks(o, v);
    else if (!strcmp(a, "--reps")) o->reps = atoi(v);
    else if (!strcmp(a, "--layout")) o->layout = v;
    else if (!strcmp(a, "--plain-layers")) o->plain_layers = atoi(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--work")) o->work = v;
    else if (!strcmp(a, "--bin")) o->bin = v;
    else return -1;
    return 1;
}

static int parse(bb_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int used = parse_one(o, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
        if (used < 0 || o->llm_layers < 1 || o->vit_layers < 1 || o->reps < 1 || o->reps > BB_MAX_REPS ||
            o->plain_layers < 1 || o->threads < 1) {
            fprintf(stderr, "usage: %s [--llm-layers N] [--vit-layers N] [--ranks 1,2] [--reps N (1..%d)] "
                    "[--layout pr240|dcp|head] [--plain-layers N] [--no-plain] [--threads T] [--work DIR] "
                    "[--bin FSDP_RUN] [--keep]\n", argv[0], BB_MAX_REPS);
            return 2;
        }
        i += used;
    }
    return 0;
}

static int setup(bb_run *r) {
    if (access(BB_RECIPE, R_OK)) {
        fprintf(stderr, "bagel_bootstrap: run it from the project root (%s not found)\n", BB_RECIPE);
        return -1;
    }
    if (mkdir(r->o.work, 0755) && errno != EEXIST) {
        fprintf(stderr, "bagel_bootstrap: cannot create %s: %s\n", r->o.work, strerror(errno));
        return -1;
    }
    snprintf(r->root, sizeof r->root, "%s", geteuid() == 0 ? " --allow-run-as-root" : "");
    snprintf(r->llm, sizeof r->llm, "%s/qwen2_llm", r->o.work);
    snprintf(r->vit, sizeof r->vit, "%s/siglip_vit", r->o.work);
    snprintf(r->out, sizeof r->out, "%s/out", r->o.work);
    snprintf(r->report, sizeof r->report, "%s/report.json", r->o.work);
    return 0;
}

/* everything this run wrote under the work directory, and the directory when it is left empty */
static void cleanup(const bb_run *r) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' '%s' '%s' '%s.copy' '%s' '%s/settle' '%s/src_llm.yaml' '%s/src_vit.yaml' '%s/plain.yaml'; "
             "rmdir '%s' 2>/dev/null; true",
             r->llm, r->vit, r->out, r->out, r->report, r->o.work, r->o.work, r->o.work, r->o.work, r->o.work);
    bench_run(cmd, NULL);
}

/* the two states' float32 bytes, from the tables the runs build */
static int state_sizes(bb_run *r) {
    char llm[1200], vit[1200], out[1200], layout[64], path[1200];
    snprintf(llm, sizeof llm, "vars.llm=%s", r->llm);
    snprintf(vit, sizeof vit, "vars.vit=%s", r->vit);
    snprintf(out, sizeof out, "vars.out=%s", r->out);
    snprintf(layout, sizeof layout, "vars.layout=%s", r->o.layout);
    const char *sets[] = {llm, vit, out, layout};
    r->state_bytes = recipe_state_bytes(BB_RECIPE, sets, 4);
    snprintf(path, sizeof path, "%s/plain.yaml", r->o.work);
    if (r->o.plain && write_plain_recipe(r, path)) return -1;
    r->plain_state_bytes = r->o.plain ? recipe_state_bytes(path, NULL, 0) : 0;
    return r->state_bytes > 0 && r->plain_state_bytes >= 0 ? 0 : -1;
}

static int run_reps(bb_run *r) {
    for (int k = 0; k < r->o.reps; k++) {
        for (int i = 0; i < r->o.n_np; i++)
            if (rep_bagel(r, r->o.np[i], &r->bagel[i])) return -1;
        settle(r, r->state_bytes);
        put(&r->memset, bench_memset_seconds((size_t)r->state_bytes, r->o.threads));
        for (int i = 0; r->o.plain && i < r->o.n_np; i++)
            if (rep_plain(r, r->o.np[i], &r->plain[i])) return -1;
        fprintf(stderr, "bagel_bootstrap: repetition %d of %d done\n", k + 1, r->o.reps);
    }
    return 0;
}

int main(int argc, char **argv) {
    static bb_run r;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    r.o = (bb_opts){2, 2, 3, 4, 1, cores > 0 ? (int)cores : 1, 0, 2, {1, 2}, "pr240", NULL, FSDP_BUILD_DIR "/fsdp-run"};
    if (parse(&r.o, argc, argv)) return 2;
    char tmp[] = "/tmp/bagel_bootstrap-XXXXXX";
    if (!r.o.work && !(r.o.work = mkdtemp(tmp))) return 1;
    if (setup(&r)) return 1;
    printf("bagel_bootstrap: Qwen2.5-7B-shaped LLM (%d layers) + SigLIP-so400m-shaped ViT (%d + 1 layers), layout "
           "%s, ranks", r.o.llm_layers, r.o.vit_layers, r.o.layout);
    for (int i = 0; i < r.o.n_np; i++) printf("%s%d", i ? "," : " ", r.o.np[i]);
    printf(", %d threads, %d repetitions, work dir %s\n", r.o.threads, r.o.reps, r.o.work);
    fflush(stdout);
    int rc = write_sources(&r) || state_sizes(&r) || run_reps(&r) ? 1 : 0;
    if (!rc) {
        print_bagel_table(&r);
        print_stream_table(&r);
        print_plain_table(&r);
        print_split(&r);
        print_notes(&r);
    }
    if (!r.o.keep) cleanup(&r);
    return rc;
}
