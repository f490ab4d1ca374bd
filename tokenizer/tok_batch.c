#include "tok_batch.h"
#include "tok_map.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

/* OpenMP's thread number (0 in a build without OpenMP: the fuzz harnesses). */
static int tok_omp_thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

int tok_workers_new(const tok_tokenizer *t, int threads, tok_workers *w, fsdp_err *err) {
    memset(w, 0, sizeof *w);
    if (threads < 1) threads = 1;
    w->st = calloc((size_t)threads, sizeof *w->st);
    w->text = calloc((size_t)threads, sizeof *w->text);
    w->invalid = calloc((size_t)threads, sizeof *w->invalid);
    if (!w->st || !w->text || !w->invalid) {
        tok_workers_free(w);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    w->n = threads;
    for (int k = 0; k < threads; k++)
        if (!(w->st[k] = tok_state_new(t))) {
            tok_workers_free(w);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
    return 0;
}

size_t tok_workers_invalid(const tok_workers *w) {
    size_t n = 0;
    for (int k = 0; k < w->n; k++) n += w->invalid[k];
    return n;
}

size_t tok_workers_dropped(const tok_workers *w) {
    size_t n = 0;
    for (int k = 0; k < w->n; k++) n += w->st[k] ? tok_state_dropped(w->st[k]) : 0;
    return n;
}

void tok_workers_free(tok_workers *w) {
    for (int k = 0; k < w->n; k++) {
        tok_state_free(w->st[k]);
        tok_text_free(&w->text[k]);
    }
    free(w->st);
    free(w->text);
    free(w->invalid);
    memset(w, 0, sizeof *w);
}

static int grow(tok_batch *b) {
    size_t need = b->cap ? b->cap * 2 : 256, cap = b->cap, c;
    /* six arrays of one capacity */
#define GROW(f)                                                           \
    do {                                                                  \
        c = b->cap;                                                       \
        if (tok_grow(&b->f, &c, need, sizeof *b->f, 256)) return -1;       \
    } while (0)
    GROW(raw);
    GROW(len);
    GROW(line);
    GROW(path);
    GROW(jsonl);
    GROW(ids);
#undef GROW
    cap = c;
    memset(b->raw + b->cap, 0, (cap - b->cap) * sizeof *b->raw);
    memset(b->ids + b->cap, 0, (cap - b->cap) * sizeof *b->ids);
    b->cap = cap;
    return 0;
}

int tok_batch_add(tok_batch *b, const char *path, int jsonl, size_t line, const char *raw, size_t len, fsdp_err *err) {
    if (b->n == b->cap && grow(b)) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    char *p = realloc(b->raw[b->n], len + 1);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memcpy(p, raw, len);
    p[len] = 0;
    b->raw[b->n] = p;
    b->len[b->n] = len;
    b->line[b->n] = line;
    b->path[b->n] = path;
    b->jsonl[b->n] = jsonl;
    b->n++;
    return 0;
}

/* Document i on worker k: 0, or the error in e. */
static int one(tok_batch *b, size_t i, tok_workers *w, int k, const char *field, int add_special, fsdp_err *e) {
    tok_text *t = &w->text[k];
    int rc = tok_doc_text(b->path[i], b->line[i], field, b->jsonl[i], b->raw[i], b->len[i], t, &w->invalid[k], e);
    if (rc) return rc;
    b->ids[i].n = 0;
    rc = tok_encode(w->st[k], t->p, t->n, add_special, &b->ids[i], e);
    if (rc) fsdp_err_prefix(e, "%s:%zu: ", b->path[i], b->line[i]);
    return rc;
}

int tok_batch_encode(tok_batch *b, tok_workers *w, const char *field, int add_special, fsdp_err *err) {
    size_t first_bad = b->n;
    fsdp_err *errs = calloc((size_t)w->n, sizeof *errs);
    if (!errs) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0;
#pragma omp parallel for num_threads(w->n) schedule(dynamic, 8)
    for (size_t i = 0; i < b->n; i++) {
        int k = tok_omp_thread_num();
        size_t fb;
#pragma omp atomic read
        fb = first_bad;
        if (fb < i) continue; /* a document after a failed one: no need to encode it */
        if (one(b, i, w, k, field, add_special, &errs[k])) {
#pragma omp critical(tok_batch_fail)
            if (i < first_bad) {
#pragma omp atomic write
                first_bad = i;
                *err = errs[k];
                rc = err->code;
            }
        }
    }
    free(errs);
    return rc;
}

void tok_batch_clear(tok_batch *b) { b->n = 0; }

static int flush_now(tok_batch *b, tok_batch_flush flush, void *user, fsdp_err *err) {
    int rc = flush(user, b, err);
    tok_batch_clear(b);
    return rc;
}

int tok_batch_files(tok_batch *b, const char *const *paths, size_t n, const char *field, int jsonl, size_t batch,
                    tok_batch_flush flush, void *user, size_t *docs, size_t *bytes, fsdp_err *err) {
    int rc = 0;
    for (size_t f = 0; f < n && !rc; f++) {
        tok_docs d;
        rc = jsonl < 0 ? tok_docs_open(&d, paths[f], field, err) : tok_docs_open_as(&d, paths[f], field, jsonl, err);
        const char *raw;
        size_t len;
        int r = 0;
        while (!rc && (r = tok_docs_next_raw(&d, &raw, &len, err)) == 1) {
            rc = tok_batch_add(b, paths[f], d.jsonl, d.line, raw, len, err);
            if (docs) ++*docs;
            if (bytes) *bytes += len;
            if (!rc && b->n >= batch) rc = flush_now(b, flush, user, err);
        }
        if (!rc && r != 0 && r != 1) rc = r;
        tok_docs_close(&d);
    }
    if (!rc) rc = flush_now(b, flush, user, err);
    return rc;
}

void tok_batch_free(tok_batch *b) {
    for (size_t i = 0; i < b->cap; i++) {
        free(b->raw[i]);
        tok_ids_free(&b->ids[i]);
    }
    free(b->raw);
    free(b->len);
    free(b->line);
    free(b->path);
    free(b->jsonl);
    free(b->ids);
    memset(b, 0, sizeof *b);
}
