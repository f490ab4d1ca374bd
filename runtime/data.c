#include "runtime/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "runtime/fileio.h"

struct data_source {
    data_config cfg;
    int vocab;
    int world, rank;
    int64_t local_batch;
    const unsigned char *map; /* text / tokens file */
    size_t map_len;
    size_t n_tokens;
    int32_t *fixed_in, *fixed_lab; /* safetensors: the whole global batch */
};

static const char *const KIND_NAMES[] = {"text", "tokens", "safetensors", "synthetic"};

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) { return mix64(mix64(mix64(seed) ^ a) ^ b); }

int data_config_from_value(const fsdp_value *sec, uint64_t default_seed, data_config *cfg, fsdp_err *err) {
    data_config base;
    memset(&base, 0, sizeof base);
    base.kind = DATA_SYNTHETIC;
    base.batch_size = 8;
    base.seq_len = 64;
    base.token_bytes = 2;
    base.seed = default_seed;
    return data_config_over(sec, &base, cfg, err);
}

int data_config_over(const fsdp_value *sec, const data_config *base, data_config *cfg, fsdp_err *err) {
    *cfg = *base;
    const char *keys[] = {"kind", "path", "batch_size", "seq_len", "dtype", "seed", "order", NULL};
    for (size_t i = 0; i < fsdp_value_size(sec); i++) {
        const char *k = fsdp_value_key(sec, i);
        int known = 0;
        for (const char **q = keys; *q; q++) known |= !strcmp(*q, k);
        if (!known)
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(sec, i),
                               "data: unknown key '%s' (expected kind, path, batch_size, seq_len, dtype, seed, order)", k);
    }
    const fsdp_value *v;
    if ((v = fsdp_value_get(sec, "kind")) && fsdp_value_type(v) != FSDP_V_NULL) {
        const char *t = fsdp_value_text(v);
        int found = 0;
        for (int k = 0; k < 4 && t; k++)
            if (!strcmp(t, KIND_NAMES[k])) {
                cfg->kind = (data_kind)k;
                found = 1;
            }
        if (!found)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "data.kind must be one of: text, tokens, safetensors, synthetic");
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
        if (cfg->sequential && cfg->kind != DATA_TEXT && cfg->kind != DATA_TOKENS)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "data.order: sequential applies to kind text or tokens only");
    }
    if (cfg->kind != DATA_SYNTHETIC && !cfg->path[0])
        return fsdp_err_at(err, FSDP_E_INVALID, sec, "data: kind %s needs a `path`", KIND_NAMES[cfg->kind]);
    return 0;
}

static int map_file(data_source *d, fsdp_err *err) {
    int fd;
    char label[4200];
    snprintf(label, sizeof label, "data %s", d->cfg.path);
    int rc = fio_open_read(d->cfg.path, label, &fd, err); /* never blocks on a FIFO */
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_IO, "data %s: %s", d->cfg.path, strerror(errno));
    }
    d->map_len = (size_t)st.st_size;
    if (d->map_len == 0) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_FORMAT, "data %s: the file is empty", d->cfg.path);
    }
    void *m = mmap(NULL, d->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return fsdp_err_set(err, FSDP_E_IO, "data %s: mmap: %s", d->cfg.path, strerror(errno));
    d->map = m;
    return 0;
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
    if (cfg->kind == DATA_TEXT || cfg->kind == DATA_TOKENS) {
        if ((rc = map_file(d, err))) goto fail;
        size_t esz = cfg->kind == DATA_TEXT ? 1 : (size_t)cfg->token_bytes;
        if (d->map_len % esz) {
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "data %s: %zu bytes is not a whole number of uint%d tokens",
                              cfg->path, d->map_len, (int)esz * 8);
            goto fail;
        }
        d->n_tokens = d->map_len / esz;
        if (cfg->kind == DATA_TEXT && vocab < 256) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "data %s: text data has 256 byte values but the model's vocab_size is %d",
                              cfg->path, vocab);
            goto fail;
        }
        if ((int64_t)d->n_tokens < cfg->seq_len + 1) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "data %s: %zu tokens is fewer than seq_len + 1 = %lld", cfg->path,
                              d->n_tokens, (long long)cfg->seq_len + 1);
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
    if (d->map) munmap((void *)d->map, d->map_len);
    free(d->fixed_in);
    free(d->fixed_lab);
    free(d);
}

int64_t data_local_batch(const data_source *d) { return d->local_batch; }

static uint32_t token_at(const data_source *d, size_t i) {
    if (d->cfg.kind == DATA_TEXT) return d->map[i];
    if (d->cfg.token_bytes == 2) {
        uint16_t v;
        memcpy(&v, d->map + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, d->map + 4 * i, 4);
    return v;
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
        size_t start;
        if (d->cfg.sequential) {
            /* consecutive blocks of T+1 tokens, sample b of batch pos is block pos*B + b (wrapping) */
            uint64_t nblocks = d->n_tokens / (uint64_t)(T + 1);
            uint64_t blk = (uint64_t)(((unsigned __int128)pos * (uint64_t)d->cfg.batch_size + b) % nblocks);
            start = (size_t)(blk * (uint64_t)(T + 1));
        } else {
            size_t span = d->n_tokens - (size_t)T; /* valid window starts: [0, span) */
            start = (size_t)(hash3(d->cfg.seed, pos, b) % span);
        }
        for (int64_t t = 0; t <= T; t++) {
            size_t idx = start + (size_t)t;
            uint32_t tok = token_at(d, idx);
            if (tok >= (uint32_t)d->vocab)
                return fsdp_err_set(err, FSDP_E_FORMAT,
                                    "data %s: token id %u at byte offset %zu is >= the model's vocab_size %d", d->cfg.path,
                                    tok, idx * (d->cfg.kind == DATA_TEXT ? 1 : (size_t)d->cfg.token_bytes), d->vocab);
            if (t < T) in[t] = (int32_t)tok;
            if (t > 0) lab[t - 1] = (int32_t)tok;
        }
    }
    return 0;
}
