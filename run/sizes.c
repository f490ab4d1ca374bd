/* Sizes from recipes: bounds of the numeric keys and the memory of the stages, before anything runs. */
#include "run/sizes.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "decoder/decoder_model.h"
#include "decoder/decoder_spec.h"
#include "decoder/decoder_table.h"
#include "model/mt_spec.h"
#include "train/data.h"
#include "runtime/device.h"

void sizes_host_probe(sizes_host *h, int world, int probe_device) {
    memset(h, 0, sizeof *h);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t mem;
    if (pages > 0 && page > 0 && !__builtin_mul_overflow((uint64_t)pages, (uint64_t)page, &mem)) h->mem_bytes = mem;
    h->cores = sysconf(_SC_NPROCESSORS_ONLN);
    h->world = world > 0 ? world : 1;
    h->shard_world = h->world;
    h->probe_device = probe_device;
}

/* "24.0 GB" (decimal units). */
static void fmt_bytes(uint64_t b, char *buf, size_t cap) {
    static const char *const units[] = {"bytes", "KB", "MB", "GB", "TB", "PB", "EB"};
    double x = (double)b;
    int u = 0;
    while (x >= 1000.0 && u < 6) {
        x /= 1000.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%llu bytes", (unsigned long long)b);
    else snprintf(buf, cap, "%.1f %s", x, units[u]);
}

/* ---- runtime.threads ---------------------------------------------------------------------------- */

static void check_threads(const recipe *r, const sizes_host *h, errlist *el) {
    const fsdp_value *v = fsdp_value_path(r->root, "runtime.threads");
    int64_t x;
    if (!v || fsdp_value_int(v, &x)) return; /* absent, or a type error the schema reports */
    if (x < 0)
        errlist_add_at(el, v, "runtime.threads: %lld is negative (OpenMP threads per rank; 0 = OpenMP's default)", (long long)x);
    else if (x > SIZES_MAX_THREADS)
        errlist_add_at(el, v, "runtime.threads: %lld OpenMP threads per rank is more than %d (this host has %ld cores)",
               (long long)x, SIZES_MAX_THREADS, h->cores);
}

/* ---- model ------------------------------------------------------------------------------------- */

/* Bounds of the model's size keys as written; 0 when they hold. */
static int check_model_bounds(const fsdp_value *model, errlist *el) {
    const struct {
        const char *key;
        int64_t max;
        const char *why;
    } bounds[] = {{"dim", SIZES_MAX_DIM, "2^20; the largest released Llama has 16384"},
                  {"n_layers", SIZES_MAX_LAYERS, "2^16; the largest released Llama has 126"}};
    int bad = 0;
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++) {
        const fsdp_value *v = fsdp_value_get(model, bounds[i].key);
        int64_t x;
        if (!v || fsdp_value_int(v, &x) || x <= bounds[i].max) continue;
        errlist_add_at(el, v, "model.%s: %lld is more than %lld (%s)", bounds[i].key, (long long)x, (long long)bounds[i].max,
               bounds[i].why);
        bad = 1;
    }
    return bad;
}

/* The chain's model from a table (counts over `world` ranks). */
static void chain_from_table(sizes_chain *chain, const mt_table *t, int world) {
    chain->trainable = mt_can_train(t);
    chain->has_llama = t->trainer == MT_TRAIN_DECODER;
    if (chain->has_llama) chain->model = *decoder_table_config(t);
    chain->full = t->incomplete ? -1 : mt_total(t);
    chain->shard = t->incomplete ? -1 : mt_shard_numel(t, world);
    snprintf(chain->kind, sizeof chain->kind, "%s", mt_kind(t));
}

/* A recipe without a model (and no earlier recipe's): the first stage that declares the model from
 * the recipe's `model:` (init-meta, init-cpu or load-ckpt, in file order) is an error. */
static void require_model(const recipe *r, errlist *el) {
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        if (strcmp(s->uses, "init-meta") && strcmp(s->uses, "init-cpu") && strcmp(s->uses, "load-ckpt")) continue;
        errlist_add_at(el, s->uses_node,
               "stage '%s' (%s) declares the model from the recipe's `model:` section, and the recipe has none: "
               "add one, e.g. `model: {arch: llama3, preset: debugmodel}`, a table (`model: {params: [...]}`) or "
               "`model: {from: CHECKPOINT}` (its names and shapes)",
               s->id, s->uses);
        return;
    }
}

/* The recipe's model into chain (0), or the chain's earlier model; -1 when there is none or it is invalid. */
static int model_of(const recipe *r, const sizes_host *h, sizes_chain *chain, errlist *el) {
    const fsdp_value *model = fsdp_value_get(r->root, "model");
    if (!model || fsdp_value_type(model) == FSDP_V_NULL) {
        if (chain->model_node) return 0;
        require_model(r, el);
        return -1;
    }
    if (check_model_bounds(model, el)) return -1;
    fsdp_err e;
    fsdp_err_clear(&e);
    mt_table t;
    mt_init(&t);
    int rc;
    if (!mt_spec_is_table(model)) {
        /* the built-in arch form: the trainer's config, and its table */
        decoder_config cfg;
        rc = mt_spec_check_arch_keys(model, &e);
        if (!rc) rc = decoder_spec_from_value(&cfg, model, &e);
        if (!rc) rc = decoder_table_build(&cfg, NULL, &t, &e);
    } else {
        /* any table: built as the run will. A source that does not exist yet is skipped by `validate`
         * and --dry-run (recipes checked for another machine) and in a recipe that continues an earlier
         * one's model (that recipe may write it); the first model of a run reads its sources now, so a
         * missing one stops the run before any stage */
        mt_spec_opts o = {!h->probe_device || chain->model_node != NULL, &decoder_table_arch};
        rc = mt_spec_build(model, &o, &t, &e);
    }
    if (rc) {
        errlist_add(el, &e);
        mt_free(&t);
        return -1;
    }
    memset(chain, 0, sizeof *chain);
    chain_from_table(chain, &t, h->shard_world);
    chain->model_node = model;
    sizes_check_transform(r, &t, el); /* transform globs against the model's names */
    mt_free(&t);
    return 0;
}

/* train-steps only for a model it can train (the built-in archs). */
static void check_trainer(const recipe *r, const sizes_chain *chain, errlist *el) {
    if (!chain->model_node || chain->trainable) return;
    for (size_t i = 0; i < r->n_stages; i++)
        if (!strcmp(r->stages[i].uses, "train-steps"))
            errlist_add_at(el, r->stages[i].uses_node,
                   "stage '%s' (train-steps): cannot train the model: it is a %s; train-steps trains the built-in "
                   "architectures (model: {arch: llama3, ...}); every other stage works on any model",
                   r->stages[i].id, chain->kind);
}

/* ---- data ---------------------------------------------------------------------------------------- */

static const recipe_stage *first_stage(const recipe *r, const char *uses) {
    for (size_t i = 0; i < r->n_stages; i++)
        if (!strcmp(r->stages[i].uses, uses)) return &r->stages[i];
    return NULL;
}

/* Where a data key's error points: the key, else the data section, else the stage that reads it. */
static const fsdp_value *data_at(const fsdp_value *data, const char *key, const recipe_stage *train) {
    const fsdp_value *v = fsdp_value_get(data, key);
    if (v) return v;
    if (data && fsdp_value_type(data) != FSDP_V_NULL) return data;
    return train ? train->uses_node : NULL;
}

/* The data section parsed (defaults when absent) and its sizes checked; 0 when valid. */
static int check_data(const recipe *r, const sizes_host *h, const sizes_chain *chain, int has_model,
                      data_config *dc, errlist *el) {
    const fsdp_value *data = fsdp_value_get(r->root, "data");
    const recipe_stage *train = first_stage(r, "train-steps");
    int has_data = data && fsdp_value_type(data) != FSDP_V_NULL;
    fsdp_err e;
    fsdp_err_clear(&e);
    /* its files are checked (and opened) only when a stage reads them: an export that includes a data
     * section does not; the section's own values are checked whatever reads it */
    int reads = train || first_stage(r, "eval");
    if (!has_data && !train) return -1; /* nothing reads data, or eval reads eval_data */
    if (!has_data) {
        errlist_add_at(el, train->uses_node,
               "stage '%s' (train-steps): the recipe has no `data:` section (kind: text, tokens, llmc or safetensors "
               "with a path; kind: synthetic for seeded random tokens)",
               train->id);
        return -1;
    }
    if (data_config_from_value(data, 0, dc, &e) || data_config_model(dc, fsdp_value_get(r->root, "model"), &e)) {
        errlist_add(el, &e);
        return -1;
    }
    int n0 = el->n;
    /* the files exist, are readable and have valid headers (their tokens are scanned when opened) */
    /* tokenized data: the tokenizer loaded once, its ids against the model's vocabulary too (another model's
     * tokenizer is refused before the run) */
    int vocab = chain->has_llama ? chain->model.vocab_size : 0;
    int files_bad = reads && (data_tokenized(dc) ? data_check_vocab(dc, vocab, &e) : data_check_files(dc, &e)) != 0;
    if (files_bad) errlist_add_at(el, data_at(data, "path", train), "%s", e.msg);
    n0 = el->n; /* the sizes below are checked whatever the files */
    const fsdp_value *at_t = data_at(data, "seq_len", train), *at_b = data_at(data, "batch_size", train);
    if (dc->seq_len > INT32_MAX)
        errlist_add_at(el, at_t, "data.seq_len: %lld is more than %d (2^31 - 1)", (long long)dc->seq_len, INT32_MAX);
    if (dc->batch_size > INT32_MAX)
        errlist_add_at(el, at_b, "data.batch_size: %lld is more than %d (2^31 - 1)", (long long)dc->batch_size, INT32_MAX);
    if (!train || el->n > n0) return el->n > n0 || files_bad ? -1 : 0;
    if (has_model && chain->has_llama && dc->seq_len > chain->model.max_seq_len)
        errlist_add_at(el, at_t,
               "data.seq_len: %lld is more than model.max_seq_len %d (the longest sequence the model is configured "
               "for: shorten data.seq_len or raise model.max_seq_len)",
               (long long)dc->seq_len, chain->model.max_seq_len);
    if (dc->batch_size % h->world && h->mesh_r)
        errlist_add_at(el, at_b,
               "data.batch_size: the global batch of %lld does not divide evenly over the %d ranks of "
               "runtime.mesh (replicate %d x shard %d)",
               (long long)dc->batch_size, h->world, h->mesh_r, h->mesh_s);
    else if (dc->batch_size % h->world)
        errlist_add_at(el, at_b, "data.batch_size: the global batch of %lld does not divide evenly over %d ranks",
               (long long)dc->batch_size, h->world);
    else if (dc->batch_size / h->world * dc->seq_len > INT_MAX)
        errlist_add_at(el, at_t,
               "data: batch_size %lld over %d ranks x seq_len %lld is %lld tokens per rank, more than %d (2^31 - 1)",
               (long long)dc->batch_size, h->world, (long long)dc->seq_len,
               (long long)(dc->batch_size / h->world * dc->seq_len), INT_MAX);
    return el->n > n0 || files_bad ? -1 : 0;
}

/* ---- memory ---------------------------------------------------------------------------------------- */

/* Saturating arithmetic: a size past 2^64 stays "more than any host". */
static uint64_t sat_mul(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static uint64_t sat_add(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

typedef struct {
    uint64_t bytes;      /* the stage's peak on rank 0 */
    uint64_t act_bytes;  /* of which activations and training buffers */
    const char *what;    /* "parameters" or "parameters, gradients and optimizer state" */
    char detail[512];
} stage_need;

/* Whether train-steps keeps the state in host memory: device cpu, or auto resolved to it (always in a
 * build without CUDA; else by the device probe of a real run). -1: unknown (auto under validate). */
static int trains_on_host(const recipe *r, const sizes_host *h) {
    const char *dev = fsdp_value_text(fsdp_value_path(r->root, "runtime.device"));
    if (!dev || !strcmp(dev, "cpu")) return 1;
    if (!strcmp(dev, "cuda")) return 0; /* the device's memory is checked when the device is known */
    if (!dev_built_with_cuda()) return 1;
    if (!h->probe_device) return -1;
    int n = 0;
    fsdp_err e;
    return !(dev_built_with_cuda() && dev_count(&n, &e) == 0 && n > 0);
}

static int ac_of(const fsdp_value *with) {
    const char *ac = fsdp_arg_str(with, "ac", "none");
    return !strcmp(ac, "full") ? DECODER_AC_FULL : !strcmp(ac, "selective") ? DECODER_AC_SELECTIVE : DECODER_AC_NONE;
}

static void train_need(const recipe_stage *s, const decoder_config *c, const sizes_host *h, const data_config *dc,
                       int64_t shard, stage_need *n) {
    /* per rank: float32 parameters, gradients and two AdamW moments; the gathered weights and gradients
     * of one layer, of the embeddings and of the output head (train/train_fsdp.c); the workspace */
    int64_t layer = 0; /* the largest layer's (a MoE layer's experts are larger than a dense MLP) */
    for (int l = 0; l < c->n_layers; l++) {
        int64_t k = decoder_model_layer_numel(c, l);
        if (k > layer) layer = k;
    }
    uint64_t vd = sat_mul((uint64_t)c->vocab_size, (uint64_t)c->dim);
    uint64_t bufs = sat_add(sat_mul(2, (uint64_t)(layer > 0 ? layer : 0)), sat_add(sat_mul(4, vd), 2 * (uint64_t)c->dim));
    int64_t B = dc->batch_size / h->world, T = dc->seq_len;
    int n_micro = sizes_micro_count(s->with, B);
    B /= n_micro; /* one micro-batch's activations at a time, and every layer's gradient accumulated */
    if (n_micro > 1) bufs = sat_add(bufs, sat_mul((uint64_t)c->n_layers, (uint64_t)(layer > 0 ? layer : 0)));
    int64_t hc = fsdp_arg_int(s->with, "head_chunk_rows", 0); /* its own errors come with the stage's schema */
    decoder_model_ws_opts o = {ac_of(s->with), hc > 0 && hc <= INT_MAX ? (int)hc : 0};
    size_t ws = 0;
    if (decoder_model_ws_size(c, (int)B, (int)T, &o, &ws)) ws = SIZE_MAX;
    n->act_bytes = sat_add(sat_mul(bufs, 4), (uint64_t)ws);
    n->bytes = sat_add(sat_mul((uint64_t)shard, 16), n->act_bytes);
    n->what = "parameters, gradients and optimizer state";
    char act[32];
    fmt_bytes(n->act_bytes, act, sizeof act);
    snprintf(n->detail, sizeof n->detail,
             "stage '%s' (train-steps): 16 bytes for each of the %lld parameters of rank 0 (float32 parameters, "
             "gradients and two AdamW moments) and %s of gathered weights, activations and scratch for %lld x %lld "
             "tokens",
             s->id, (long long)shard, act, (long long)B, (long long)T);
}

/* What stage s holds on rank 0 at its peak in host memory (bytes 0: nothing the check knows of). */
static void stage_need_of(const recipe_stage *s, const sizes_chain *chain, const sizes_host *h, const data_config *dc,
                          int on_host, stage_need *n) {
    memset(n, 0, sizeof *n);
    const decoder_config *c = &chain->model;
    int64_t full = chain->full, shard = chain->shard;
    if (full < 0 || shard < 0) return;
    n->what = "parameters";
    if (!strcmp(s->uses, "init-cpu")) {
        n->bytes = sat_mul((uint64_t)full, 4);
        snprintf(n->detail, sizeof n->detail, "stage '%s' (init-cpu) holds all %lld parameters whole, as float32",
                 s->id, (long long)full);
    } else if (!strcmp(s->uses, "init-meta") || !strcmp(s->uses, "load-ckpt")) {
        n->bytes = sat_mul((uint64_t)shard, 4);
        snprintf(n->detail, sizeof n->detail, "stage '%s' (%s) holds %lld of the %lld parameters as float32, %d rank%s",
                 s->id, s->uses, (long long)shard, (long long)full, h->shard_world, h->shard_world > 1 ? "s" : "");
    } else if (!strcmp(s->uses, "shard")) {
        n->bytes = sat_mul(sat_add((uint64_t)full, (uint64_t)shard), 4);
        snprintf(n->detail, sizeof n->detail,
                 "stage '%s' (shard) holds the whole model and rank 0's shard of it while it scatters: %lld + %lld "
                 "parameters as float32",
                 s->id, (long long)full, (long long)shard);
    } else if (!strcmp(s->uses, "train-steps") && on_host == 1 && dc && chain->has_llama) {
        train_need(s, c, h, dc, shard, n);
    }
}

/* The key the message blames: the first size key written in the model section, else its preset. */
static void model_blame(const fsdp_value *model, const char **key, const fsdp_value **at) {
    static const char *const keys[] = {"dim", "n_layers", "vocab_size", "ffn_dim_multiplier", "multiple_of",
                                       "n_heads", "preset", NULL};
    for (const char *const *k = keys; *k; k++) {
        const fsdp_value *v = fsdp_value_get(model, *k);
        if (v) {
            *key = *k;
            *at = v;
            return;
        }
    }
    *key = NULL;
    *at = model;
}

static void check_memory(const recipe *r, const sizes_host *h, const sizes_chain *chain, const data_config *dc,
                         errlist *el) {
    if (!h->mem_bytes) return;
    int on_host = trains_on_host(r, h);
    stage_need worst = {0}, n;
    const recipe_stage *ws = NULL;
    for (size_t i = 0; i < r->n_stages; i++) {
        stage_need_of(&r->stages[i], chain, h, dc, on_host, &n);
        if (n.bytes > worst.bytes) {
            worst = n;
            ws = &r->stages[i];
        }
    }
    if (!ws || worst.bytes <= h->mem_bytes) return;
    const char *key;
    const fsdp_value *at;
    char path[64];
    model_blame(chain->model_node, &key, &at);
    snprintf(path, sizeof path, "model%s%s", key ? "." : "", key ? key : "");
    if (worst.act_bytes > worst.bytes / 2) {
        /* the activations dominate: the batch is the size to change */
        const fsdp_value *data = fsdp_value_get(r->root, "data");
        at = data_at(data, fsdp_value_get(data, "seq_len") ? "seq_len" : "batch_size", ws);
        snprintf(path, sizeof path, "data.%s", fsdp_value_get(data, "seq_len") ? "seq_len" : "batch_size");
    }
    char need[32], have[32];
    fmt_bytes(worst.bytes, need, sizeof need);
    fmt_bytes(h->mem_bytes, have, sizeof have);
    errlist_add_at(el, at, "%s: the model needs %s for %s on rank 0 (%s), this host has %s", path, need, worst.what,
           worst.detail, have);
}

void sizes_check(const recipe *r, const sizes_host *h, sizes_chain *chain, errlist *el) {
    check_threads(r, h, el);
    int has_model = model_of(r, h, chain, el) == 0;
    if (has_model) check_trainer(r, chain, el);
    if (has_model) sizes_check_expert_parallel(r, h, chain, el);
    data_config dc;
    int data_ok = check_data(r, h, chain, has_model, &dc, el) == 0;
    if (data_ok) sizes_check_micro(r, h, &dc, el);
    /* the memory of a model whose own keys are valid; train-steps only with a valid data section */
    if (has_model) check_memory(r, h, chain, data_ok ? &dc : NULL, el);
}

/* ---- --dry-run --------------------------------------------------------------------------------------- */

static size_t put(char *out, size_t cap, size_t off, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t put(char *out, size_t cap, size_t off, const char *fmt, ...) {
    if (off >= cap) return off;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out + off, cap - off, fmt, ap);
    va_end(ap);
    return k > 0 ? off + (size_t)k : off;
}

static size_t describe_train(const recipe_stage *s, const sizes_chain *chain, const sizes_host *h,
                             const data_config *dc, char *out, size_t cap, size_t off) {
    stage_need n;
    memset(&n, 0, sizeof n);
    train_need(s, &chain->model, h, dc, chain->shard, &n);
    char p[32], o[32], a[32], t[32];
    fmt_bytes(sat_mul((uint64_t)chain->shard, 4), p, sizeof p);
    fmt_bytes(sat_mul((uint64_t)chain->shard, 8), o, sizeof o);
    fmt_bytes(n.act_bytes, a, sizeof a);
    fmt_bytes(n.bytes, t, sizeof t);
    int64_t B = dc->batch_size / h->world;
    return put(out, cap, off,
               "  memory of rank 0, stage '%s' (train-steps): parameters %s, gradients %s, optimizer %s (AdamW, 2 "
               "moments), activations and buffers %s (%lld x %lld tokens, %d micro-batch%s): %s\n",
               s->id, p, p, o, a, (long long)B, (long long)dc->seq_len, sizes_micro_count(s->with, B),
               sizes_micro_count(s->with, B) > 1 ? "es" : "", t);
}

void sizes_describe(const recipe *r, const sizes_host *h, const sizes_chain *chain, char *out, size_t cap) {
    size_t off = 0;
    out[0] = '\0';
    if (!chain->model_node || chain->full < 0) return;
    const decoder_config *c = &chain->model;
    if (chain->has_llama)
        off = put(out, cap, off,
                  "  model (resolved): %s: dim %d, %d layers, %d heads (%d kv, head_dim %d), ffn %d, vocab %d, "
                  "max_seq_len %d\n",
                  chain->kind, c->dim, c->n_layers, c->n_heads,
                  c->n_kv_heads, c->head_dim, c->ffn_hidden, c->vocab_size, c->max_seq_len);
    else
        off = put(out, cap, off, "  model (resolved): %s\n", chain->kind);
    off = put(out, cap, off, "  parameters: %lld (%lld on rank 0 of %d)\n", (long long)chain->full,
              (long long)chain->shard, h->shard_world);
    if (h->mesh_r)
        off = put(out, cap, off, "  mesh: replicate %d x shard %d (%d ranks)\n", h->mesh_r, h->mesh_s, h->world);
    data_config dc;
    fsdp_err e;
    int have_dc = data_config_from_value(fsdp_value_get(r->root, "data"), 0, &dc, &e) == 0 && dc.batch_size > 0 &&
                  dc.batch_size % h->world == 0;
    int trained = 0;
    for (size_t i = 0; i < r->n_stages; i++) {
        if (strcmp(r->stages[i].uses, "train-steps") || !have_dc || !chain->has_llama) continue;
        off = describe_train(&r->stages[i], chain, h, &dc, out, cap, off);
        trained = 1;
    }
    stage_need n, worst = {0};
    for (size_t i = 0; i < r->n_stages && !trained; i++) {
        stage_need_of(&r->stages[i], chain, h, NULL, 1, &n);
        if (n.bytes > worst.bytes) worst = n;
    }
    char b[32];
    fmt_bytes(worst.bytes, b, sizeof b);
    if (worst.bytes) put(out, cap, off, "  memory of rank 0: %s at most (%s)\n", b, worst.detail);
}
