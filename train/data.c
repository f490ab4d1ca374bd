/* The training data loader (train/data.h): text, token files and safetensors batches, synthetic data. */
#include "train/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "train/data_files.h"
#include "train/data_text.h"
#include "runtime/nearest.h"

struct data_source {
    data_config cfg;
    int vocab;
    int world, rank;
    int64_t local_batch;
    data_files files;   /* text / tokens / llmc: the mapped files */
    uint64_t span;      /* random windows: sum over files of n_tokens - seq_len (files long enough) */
    uint64_t blocks;    /* sequential: sum over files of n_tokens / (seq_len + 1) */
    int32_t *fixed_in, *fixed_lab; /* safetensors: the whole global batch */
};

#define N_KINDS 6
static const char *const KIND_NAMES[N_KINDS] = {"text", "tokens", "safetensors", "synthetic", "llmc", "jsonl"};

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) { return mix64(mix64(mix64(seed) ^ a) ^ b); }

int data_config_from_value(const fsdp_value *sec, uint64_t default_seed, data_config *cfg, fsdp_err *err) {
    if (!sec || fsdp_value_type(sec) == FSDP_V_NULL) {
        memset(cfg, 0, sizeof *cfg);
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "no `data:` section: train-steps needs one (kind: text, tokens, llmc or safetensors with a "
                            "path; kind: synthetic for seeded random tokens)");
    }
    const fsdp_value *kind = fsdp_value_type(sec) == FSDP_V_MAP ? fsdp_value_get(sec, "kind") : NULL;
    if (fsdp_value_type(sec) == FSDP_V_MAP && (!kind || fsdp_value_type(kind) == FSDP_V_NULL)) {
        memset(cfg, 0, sizeof *cfg);
        return fsdp_err_at(err, FSDP_E_INVALID, sec,
                           "data: no `kind` (text, tokens, llmc or safetensors with a path; kind: synthetic for seeded "
                           "random tokens: synthetic data is used only when asked)");
    }
    data_config base;
    memset(&base, 0, sizeof base);
    base.kind = DATA_SYNTHETIC;
    base.batch_size = 8;
    base.seq_len = 64;
    base.token_bytes = 2;
    base.seed = default_seed;
    base.template_ = 1;
    snprintf(base.field, sizeof base.field, "text");
    return data_config_over(sec, &base, cfg, err);
}

int data_config_over(const fsdp_value *sec, const data_config *base, data_config *cfg, fsdp_err *err) {
    *cfg = *base;
    if (!sec || fsdp_value_type(sec) != FSDP_V_MAP)
        return fsdp_err_at(err, FSDP_E_INVALID, sec, "data: expected a map (kind, path, batch_size, seq_len, ...)");
    const char *keys[] = {"kind", "path", "batch_size", "seq_len", "dtype", "seed", "order", "tokenizer", "field",
                          "eos", "template", "pack", NULL};
    for (size_t i = 0; i < fsdp_value_size(sec); i++) {
        const char *k = fsdp_value_key(sec, i);
        int known = 0;
        for (const char **q = keys; *q; q++) known |= !strcmp(*q, k);
        static const char KNOWN[] = "kind, path, batch_size, seq_len, dtype, seed, order, tokenizer, field, eos, "
                                    "template, pack";
        char hint[300];
        if (!known)
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(sec, i), "data: unknown key '%s'%s (expected %s)", k,
                               nearest_hint(k, KNOWN, hint, sizeof hint), KNOWN);
    }
    const fsdp_value *v;
    if ((v = fsdp_value_get(sec, "kind")) && fsdp_value_type(v) != FSDP_V_NULL) {
        const char *t = fsdp_value_text(v);
        int found = 0;
        for (int k = 0; k < N_KINDS && t; k++)
            if (!strcmp(t, KIND_NAMES[k])) {
                cfg->kind = (data_kind)k;
                found = 1;
            }
        if (!found)
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "data.kind must be one of: text, jsonl, tokens, llmc, safetensors, synthetic");
    }
    if ((v = fsdp_value_get(sec, "path")) && fsdp_value_type(v) != FSDP_V_NULL) {
        if (!fsdp_value_text(v)) return fsdp_err_at(err, FSDP_E_INVALID, v, "data.path: expected a file path");
        snprintf(cfg->path, sizeof cfg->path, "%s", fsdp_value_text(v));
    }
    struct {
        const char *k;
        int64_t *dst;
    } ints[] = {{"batch_size", &cfg->batch_size}, {"seq_len", &cfg->seq_len}};
    for (int i = 0; i < 2; i++) {
        if ((v = fsdp_value_get(sec, ints[i].k)) && fsdp_value_type(v) != FSDP_V_NULL) {
            if (fsdp_value_int(v, ints[i].dst) || *ints[i].dst <= 0)
                return fsdp_err_at(err, FSDP_E_INVALID, v, "data.%s: expected a positive integer", ints[i].k);
        }
    }
    if ((v = fsdp_value_get(sec, "seed")) && fsdp_value_type(v) != FSDP_V_NULL) {
        int64_t s;
        if (fsdp_value_int(v, &s)) return fsdp_err_at(err, FSDP_E_INVALID, v, "data.seed: expected an integer");
        cfg->seed = (uint64_t)s;
    }
    if ((v = fsdp_value_get(sec, "dtype")) && fsdp_value_type(v) != FSDP_V_NULL) {
        const char *t = fsdp_value_text(v);
        if (t && (!strcmp(t, "uint16") || !strcmp(t, "u16"))) cfg->token_bytes = 2;
        else if (t && (!strcmp(t, "uint32") || !strcmp(t, "u32"))) cfg->token_bytes = 4;
        else return fsdp_err_at(err, FSDP_E_INVALID, v, "data.dtype must be uint16 or uint32 (token file element type)");
    }
    if ((v = fsdp_value_get(sec, "order")) && fsdp_value_type(v) != FSDP_V_NULL) {
        const char *t = fsdp_value_text(v);
        if (t && !strcmp(t, "random")) cfg->sequential = 0;
        else if (t && !strcmp(t, "sequential")) cfg->sequential = 1;
        else return fsdp_err_at(err, FSDP_E_INVALID, v, "data.order must be random or sequential");
        if (cfg->sequential && cfg->kind != DATA_TEXT && cfg->kind != DATA_TOKENS && cfg->kind != DATA_LLMC &&
            cfg->kind != DATA_JSONL)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "data.order: sequential applies to kind text, jsonl, tokens or llmc only");
    }
    int rc = data_config_text_keys(sec, cfg, err);
    if (rc) return rc;
    if (cfg->kind != DATA_SYNTHETIC && !cfg->path[0])
        return fsdp_err_at(err, FSDP_E_INVALID, sec, "data: kind %s needs a `path`", KIND_NAMES[cfg->kind]);
    return 0;
}

static int is_file_kind(data_kind k) { return k == DATA_TEXT || k == DATA_TOKENS || k == DATA_LLMC || k == DATA_JSONL; }

int data_check_files(const data_config *cfg, fsdp_err *err) {
    if (!is_file_kind(cfg->kind)) return 0;
    if (data_tokenized(cfg)) return data_text_check(cfg, err);
    data_files f;
    int rc = data_files_open(cfg, 0, 0, &f, err);
    if (!rc) data_files_close(&f);
    return rc;
}

/* kind safetensors: `input_ids` and `labels`, [B, T] integer tensors, read whole. */
static int load_fixed(data_source *d, fsdp_err *err) {
    st_reader *r;
    int rc = st_open(&r, d->cfg.path, err);
    if (rc) return rc;
    const char *names[2] = {"input_ids", "labels"};
    int32_t **dst[2] = {&d->fixed_in, &d->fixed_lab};
    for (int k = 0; k < 2 && !rc; k++) {
        const st_tensor_info *t = st_find(r, names[k]);
        if (!t) {
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "data %s: no tensor '%s' (expected input_ids and labels [B, T])",
                              d->cfg.path, names[k]);
            break;
        }
        if (t->ndim != 2 || t->shape[0] != d->cfg.batch_size || t->shape[1] != d->cfg.seq_len) {
            rc = fsdp_err_set(err, FSDP_E_INVALID,
                              "data %s: tensor '%s' has %d dims [%lld, %lld], the recipe's data wants [batch_size %lld, "
                              "seq_len %lld]",
                              d->cfg.path, names[k], t->ndim, (long long)(t->ndim > 0 ? t->shape[0] : 0),
                              (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)d->cfg.batch_size,
                              (long long)d->cfg.seq_len);
            break;
        }
        if (t->dtype != FSDP_DT_I32 && t->dtype != FSDP_DT_I64 && t->dtype != FSDP_DT_U16 && t->dtype != FSDP_DT_U8) {
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "data %s: tensor '%s' has dtype %s, expected an integer type",
                              d->cfg.path, names[k], fsdp_dtype_name(t->dtype));
            break;
        }
        size_t n = (size_t)(d->cfg.batch_size * d->cfg.seq_len);
        int64_t *tmp = malloc(n * sizeof *tmp);
        *dst[k] = malloc(n * sizeof(int32_t));
        if (!tmp || !*dst[k]) {
            free(tmp);
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            break;
        }
        if (!(rc = st_read(r, t, tmp, FSDP_DT_I64, err))) {
            for (size_t i = 0; i < n; i++) {
                int64_t v = tmp[i];
                int ignore = k == 1 && v == -100;
                if (!ignore && (v < 0 || v >= d->vocab)) {
                    rc = fsdp_err_set(err, FSDP_E_FORMAT,
                                      "data %s: %s[%zu] = %lld is outside the model's vocabulary [0, %d)", d->cfg.path,
                                      names[k], i, (long long)v, d->vocab);
                    break;
                }
                (*dst[k])[i] = (int32_t)v;
            }
        }
        free(tmp);
    }
    st_close(r);
    return rc;
}

int data_open(const data_config *cfg, int vocab, int world, int rank, data_source **out, fsdp_err *err) {
    *out = NULL;
    if (cfg->batch_size % world != 0)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "data: the global batch_size %lld does not divide evenly over %d ranks",
                            (long long)cfg->batch_size, world);
    data_source *d = calloc(1, sizeof *d);
    if (!d) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    d->cfg = *cfg;
    d->vocab = vocab;
    d->world = world;
    d->rank = rank;
    d->local_batch = cfg->batch_size / world;
    int rc = 0;
    if (cfg->kind == DATA_TEXT && !data_tokenized(cfg) && vocab < 256) {
        rc = fsdp_err_set(err, FSDP_E_INVALID, "data %s: text data has 256 byte values but the model's vocab_size is %d",
                          cfg->path, vocab);
        goto fail;
    }
    if (is_file_kind(cfg->kind)) {
        rc = data_tokenized(cfg) ? data_text_open(cfg, vocab, &d->files, err) : data_files_open(cfg, vocab, 1, &d->files, err);
        if (rc) goto fail;
        size_t longest = 0;
        for (size_t i = 0; i < d->files.n; i++) {
            size_t n = d->files.seg[i].n_tokens;
            if (n > longest) longest = n;
            if ((int64_t)n >= cfg->seq_len + 1) d->span += n - (uint64_t)cfg->seq_len;
            d->blocks += n / (uint64_t)(cfg->seq_len + 1);
        }
        if (!d->span) {
            rc = fsdp_err_set(err, FSDP_E_INVALID,
                              "data %s: %zu tokens%s is fewer than seq_len + 1 = %lld", d->files.n == 1 ? d->files.seg[0].path : cfg->path,
                              longest, d->files.n > 1 ? " in the longest matching file" : "", (long long)cfg->seq_len + 1);
            goto fail;
        }
    }
    if (cfg->kind == DATA_SAFETENSORS && (rc = load_fixed(d, err))) goto fail;
    *out = d;
    return 0;
fail:
    data_close(d);
    return rc;
}

void data_close(data_source *d) {
    if (!d) return;
    data_files_close(&d->files);
    free(d->fixed_in);
    free(d->fixed_lab);
    free(d);
}

int64_t data_local_batch(const data_source *d) { return d->local_batch; }

/* Global position x of the window stream (random: a start among the files' valid starts; sequential:
 * a block of seq_len + 1 tokens) to its file and token index. */
static const data_seg *locate(const data_source *d, uint64_t x, int blocks, size_t *start) {
    uint64_t T = (uint64_t)d->cfg.seq_len;
    for (size_t i = 0; i < d->files.n; i++) {
        const data_seg *s = &d->files.seg[i];
        uint64_t n = blocks ? s->n_tokens / (T + 1) : (s->n_tokens >= T + 1 ? s->n_tokens - T : 0);
        if (x < n) {
            *start = (size_t)(blocks ? x * (T + 1) : x);
            return s;
        }
        x -= n;
    }
    *start = 0;
    return &d->files.seg[0]; /* not reached: x < the sum */
}

int data_batch(data_source *d, uint64_t pos, int32_t *inputs, int32_t *labels, fsdp_err *err) {
    int64_t T = d->cfg.seq_len;
    for (int64_t lb = 0; lb < d->local_batch; lb++) {
        uint64_t b = (uint64_t)(d->rank * d->local_batch + lb); /* global sample index */
        int32_t *in = inputs + lb * T, *lab = labels + lb * T;
        if (d->cfg.kind == DATA_SAFETENSORS) {
            memcpy(in, d->fixed_in + b * (uint64_t)T, (size_t)T * sizeof *in);
            memcpy(lab, d->fixed_lab + b * (uint64_t)T, (size_t)T * sizeof *lab);
            continue;
        }
        if (d->cfg.kind == DATA_SYNTHETIC) {
            for (int64_t t = 0; t <= T; t++) {
                int32_t tok = (int32_t)(hash3(d->cfg.seed, pos * 1000003ull + b, (uint64_t)t) % (uint64_t)d->vocab);
                if (t < T) in[t] = tok;
                if (t > 0) lab[t - 1] = tok;
            }
            continue;
        }
        uint64_t x;
        if (d->cfg.sequential) /* consecutive blocks of T+1 tokens, sample b of batch pos is block pos*B + b (wrapping) */
            x = (uint64_t)(((unsigned __int128)pos * (uint64_t)d->cfg.batch_size + b) % d->blocks);
        else
            x = hash3(d->cfg.seed, pos, b) % d->span;
        size_t start;
        const data_seg *sg = locate(d, x, d->cfg.sequential, &start);
        for (int64_t t = 0; t <= T; t++) {
            size_t idx = start + (size_t)t;
            uint32_t tok = data_seg_token(sg, d->files.token_bytes, idx);
            if (tok >= (uint32_t)d->vocab) /* scanned at open: only a file changed under the run gets here */
                return fsdp_err_set(err, FSDP_E_FORMAT,
                                    "data %s: token id %u at byte offset %zu is >= the model's vocab_size %d", sg->path,
                                    tok, sg->hdr + idx * (size_t)d->files.token_bytes, d->vocab);
            if (t < T) in[t] = (int32_t)tok;
            if (t > 0) lab[t - 1] = (int32_t)tok;
        }
    }
    return 0;
}
