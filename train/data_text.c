/* The tokenized data kinds (train/data_text.h). */
#include "train/data_text.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok.h"
#include "tokenizer/tok_batch.h"
#include "tokenizer/tok_docs.h"

/* The threads that tokenize (1 in a build without OpenMP: the fuzz harnesses). */
static int data_omp_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int data_tokenized(const data_config *cfg) {
    return cfg->kind == DATA_JSONL || (cfg->kind == DATA_TEXT && cfg->tokenizer[0]);
}

static int text_key(const fsdp_value *sec, const char *key, char *dst, size_t cap, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(sec, key);
    if (!v || fsdp_value_type(v) == FSDP_V_NULL) return 0;
    const char *t = fsdp_value_text(v);
    if (!t || !*t) return fsdp_err_at(err, FSDP_E_INVALID, v, "data.%s: expected a non-empty string", key);
    if (strlen(t) >= cap) return fsdp_err_at(err, FSDP_E_INVALID, v, "data.%s: longer than %zu characters", key, cap - 1);
    snprintf(dst, cap, "%s", t);
    return 0;
}

int data_config_text_keys(const fsdp_value *sec, data_config *cfg, fsdp_err *err) {
    int rc = text_key(sec, "tokenizer", cfg->tokenizer, sizeof cfg->tokenizer, err);
    if (!rc) rc = text_key(sec, "field", cfg->field, sizeof cfg->field, err);
    if (!rc) rc = text_key(sec, "eos", cfg->eos, sizeof cfg->eos, err);
    if (rc) return rc;
    const fsdp_value *v = fsdp_value_get(sec, "template");
    int b;
    if (v && fsdp_value_type(v) != FSDP_V_NULL) {
        if (fsdp_value_bool(v, &b)) return fsdp_err_at(err, FSDP_E_INVALID, v, "data.template: expected true or false");
        cfg->template_ = b;
    }
    if ((v = fsdp_value_get(sec, "pack")) && fsdp_value_type(v) != FSDP_V_NULL) {
        if (fsdp_value_bool(v, &b)) return fsdp_err_at(err, FSDP_E_INVALID, v, "data.pack: expected true or false");
        if (!b)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "data.pack: false is not supported: documents are packed into "
                               "windows of seq_len + 1 tokens with EOS between them");
    }
    int tokenized = cfg->kind == DATA_JSONL || (cfg->kind == DATA_TEXT && cfg->tokenizer[0]);
    static const char *const only[] = {"field", "eos", "template", "pack"};
    for (int k = 0; k < 4 && !tokenized; k++)
        if ((v = fsdp_value_get(sec, only[k])) && fsdp_value_type(v) != FSDP_V_NULL)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "data.%s applies to tokenized data only (kind jsonl, or kind text "
                               "with a tokenizer)", only[k]);
    return 0;
}

int data_config_model(data_config *cfg, const fsdp_value *model, fsdp_err *err) {
    int wants = cfg->kind == DATA_JSONL || !strcmp(cfg->tokenizer, "model");
    if (!wants || (cfg->tokenizer[0] && strcmp(cfg->tokenizer, "model"))) return 0;
    const fsdp_value *hf = model ? fsdp_value_get(model, "from_hf") : NULL;
    const char *dir = hf ? fsdp_value_text(hf) : NULL;
    if (!dir || !*dir)
        return fsdp_err_set(err, FSDP_E_INVALID, "data: kind %s needs a tokenizer: data.tokenizer (a directory with "
                            "tokenizer.json, or the file) or a model with from_hf (its tokenizer.json)",
                            cfg->kind == DATA_JSONL ? "jsonl" : "text");
    snprintf(cfg->tokenizer, sizeof cfg->tokenizer, "%s", dir);
    return 0;
}

static int load(const data_config *cfg, tok_tokenizer **t, int32_t *eos, fsdp_err *err) {
    int rc = tok_load(cfg->tokenizer, t, err);
    if (rc) return fsdp_err_prefix(err, "data.tokenizer: ");
    rc = tok_eos_id(*t, cfg->tokenizer, cfg->eos, eos, err);
    if (rc) {
        tok_free(*t);
        *t = NULL;
        return fsdp_err_prefix(err, "data: ");
    }
    return 0;
}

static int vocab_fits(const data_config *cfg, const tok_tokenizer *t, int vocab, fsdp_err *err) {
    if (vocab <= 0 || tok_vocab_size(t) <= vocab) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID, "data: the tokenizer %s has %d ids, more than the model's vocab_size %d "
                        "(a tokenizer of another model?)", cfg->tokenizer, (int)tok_vocab_size(t), vocab);
}

static int check(const data_config *cfg, int vocab, fsdp_err *err) {
    glob_t g;
    int rc = data_glob(cfg, &g, err);
    if (rc) return rc;
    globfree(&g);
    tok_tokenizer *t = NULL;
    int32_t eos;
    rc = load(cfg, &t, &eos, err);
    if (!rc) rc = vocab_fits(cfg, t, vocab, err);
    tok_free(t);
    return rc;
}

int data_check_vocab(const data_config *cfg, int vocab, fsdp_err *err) {
    return data_tokenized(cfg) ? check(cfg, vocab, err) : 0;
}

int data_text_check(const data_config *cfg, fsdp_err *err) { return check(cfg, 0, err); }

typedef struct packer {
    uint32_t *v;
    size_t n, cap;
    size_t docs;
} packer;

static int pack_ids(packer *p, const tok_ids *ids, int32_t eos) {
    size_t need = p->n + ids->n + 1;
    if (need > p->cap) {
        size_t cap = p->cap ? p->cap : 1 << 16;
        while (cap < need) cap *= 2;
        uint32_t *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    for (size_t k = 0; k < ids->n; k++) p->v[p->n++] = (uint32_t)ids->v[k];
    if (!ids->n || ids->v[ids->n - 1] != eos) p->v[p->n++] = (uint32_t)eos;
    p->docs++;
    return 0;
}

typedef struct pack_run {
    const data_config *cfg;
    tok_workers *w;
    int32_t eos;
    packer *p;
} pack_run;

static int flush(void *user, tok_batch *b, fsdp_err *err) {
    pack_run *k = user;
    int rc = b->n ? tok_batch_encode(b, k->w, k->cfg->field, k->cfg->template_, err) : 0;
    for (size_t i = 0; !rc && i < b->n; i++)
        if (pack_ids(k->p, &b->ids[i], k->eos)) rc = fsdp_err_set(err, FSDP_E_NOMEM, "data: out of memory");
    return rc;
}

/* Every document of the matched files, encoded a batch at a time and packed in order (kind jsonl: every file
 * is JSON lines, whatever its name; kind text: every file one document). */
static int pack_files(const data_config *cfg, char **paths, size_t np, tok_workers *w, int32_t eos, packer *p,
                      fsdp_err *err) {
    tok_batch b = {0};
    pack_run k = {cfg, w, eos, p};
    int rc = tok_batch_files(&b, (const char *const *)paths, np, cfg->field, cfg->kind == DATA_JSONL, 4096, flush, &k,
                             NULL, NULL, err);
    tok_batch_free(&b);
    return rc;
}

int data_text_open(const data_config *cfg, int vocab, data_files *f, fsdp_err *err) {
    memset(f, 0, sizeof *f);
    glob_t g;
    int rc = data_glob(cfg, &g, err);
    if (rc) return rc;
    tok_tokenizer *t = NULL;
    int32_t eos = -1;
    rc = load(cfg, &t, &eos, err);
    if (!rc) rc = vocab_fits(cfg, t, vocab, err);
    tok_workers w = {0};
    if (!rc) rc = tok_workers_new(t, data_omp_max_threads(), &w, err);
    packer p = {0};
    if (!rc) rc = pack_files(cfg, g.gl_pathv, g.gl_pathc, &w, eos, &p, err);
    if (!rc && !p.docs)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "data.path '%s': no documents (%s empty)", cfg->path,
                          g.gl_pathc == 1 ? "the file is" : "the files are");
    if (!rc) {
        f->seg = calloc(1, sizeof *f->seg);
        char *label = malloc(strlen(cfg->path) + 64);
        if (!f->seg || !label) rc = fsdp_err_set(err, FSDP_E_NOMEM, "data: out of memory");
        else {
            sprintf(label, "%s (%zu documents, tokenized)", cfg->path, p.docs);
            f->seg[0] = (data_seg){label, (const unsigned char *)p.v, p.n * sizeof *p.v, 0, p.n, 1};
            f->n = 1;
            f->token_bytes = 4;
            p.v = NULL;
        }
        if (rc) free(label);
    }
    free(p.v);
    tok_workers_free(&w);
    tok_free(t);
    globfree(&g);
    return rc;
}
