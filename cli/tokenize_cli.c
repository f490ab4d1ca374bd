/* fsdp-run tokenize --tokenizer DIR [--field text] [--special] [--threads N] FILE...
 * fsdp-run tokenize --tokenizer DIR --decode [--field text] [--skip-special] FILE...
 *
 * Encoding prints one JSON array of ids per document (a line of a JSONL file, or a whole text file), in
 * order; documents are encoded on N threads a batch at a time. Decoding reads lines of JSON arrays of ids
 * and prints one JSON object {FIELD: text} per line, which `tokenize --field FIELD` reads back. */
#include <jansson.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/tokenize_cli.h"
#include "tokenizer/tok.h"
#include "tokenizer/tok_batch.h"
#include "tokenizer/tok_docs.h"

typedef struct tk_opts {
    const char *tok, *field;
    int special, decode, skip_special, threads, quiet;
    const char **files;
    size_t nf;
} tk_opts;

static void tk_usage(FILE *f) {
    fputs("usage: fsdp-run tokenize --tokenizer DIR|tokenizer.json [--field text] [--special] [--threads N] FILE...\n"
          "       fsdp-run tokenize --tokenizer DIR --decode [--field text] [--skip-special] FILE...\n"
          "  prints one JSON array of ids per document: each line of a .jsonl/.ndjson file (its string field,\n"
          "  \"text\" by default), or a whole text file; special tokens in the text are matched as Hugging Face's\n"
          "  tokenizer matches them; --special adds the post-processor's template (BOS/EOS) as add_special_tokens\n"
          "  does. --decode reads lines of JSON arrays of ids and prints {\"FIELD\": text} per line.\n"
          "  -q: no summary on stderr\n",
          f);
}

static int tk_parse(int argc, char **argv, tk_opts *o, FILE *out, FILE *log) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tk_usage(out);
            return 0;
        } else if (!strcmp(a, "--tokenizer") && has) o->tok = argv[++i];
        else if (!strcmp(a, "--field") && has) o->field = argv[++i];
        else if (!strcmp(a, "--threads") && has) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 1024) {
                fprintf(log, "fsdp-run: error: tokenize: --threads expects 1..1024, got '%s'\n", argv[i]);
                return 2;
            }
            o->threads = (int)n;
        } else if (!strcmp(a, "--special")) o->special = 1;
        else if (!strcmp(a, "--decode")) o->decode = 1;
        else if (!strcmp(a, "--skip-special")) o->skip_special = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-' && a[1]) {
            fprintf(log, "fsdp-run: error: tokenize: unknown option '%s'%s\n", a,
                    (!strcmp(a, "--tokenizer") || !strcmp(a, "--field") || !strcmp(a, "--threads")) ? " (needs a value)" : "");
            return 2;
        } else o->files[o->nf++] = a;
    }
    if (!o->tok || !o->nf) {
        fprintf(log, "fsdp-run: error: tokenize: %s\n", !o->tok ? "--tokenizer DIR is required" : "no input file given");
        tk_usage(log);
        return 2;
    }
    return -1;
}

#define TK_BATCH 4096

/* "[id,id,...]\n" into *out (grown as needed). */
static int tk_format(const tok_ids *ids, char **out, size_t *on, size_t *cap) {
    size_t need = ids->n * 12 + 4;
    if (need > *cap) {
        char *p = realloc(*out, need);
        if (!p) return -1;
        *out = p;
        *cap = need;
    }
    char *o = *out;
    *o++ = '[';
    for (size_t k = 0; k < ids->n; k++) {
        if (k) *o++ = ',';
        uint32_t v = (uint32_t)ids->v[k];
        char tmp[12];
        int m = 0;
        do tmp[m++] = (char)('0' + v % 10);
        while ((v /= 10));
        while (m) *o++ = tmp[--m];
    }
    *o++ = ']';
    *o++ = '\n';
    *on = (size_t)(o - *out);
    return 0;
}

typedef struct tk_text_out {
    char **s;
    size_t *n, *cap;
} tk_text_out;

/* What tk_flush needs beside the batch. */
typedef struct tk_sink {
    const tk_opts *o;
    tok_workers *w;
    tk_text_out *fo;
    FILE *out;
    size_t tokens;
} tk_sink;

/* Encodes the batch, formats its documents on the threads, writes them in order. */
static int tk_flush(void *user, tok_batch *b, fsdp_err *err) {
    tk_sink *k = user;
    int rc = tok_batch_encode(b, k->w, k->o->field ? k->o->field : "text", k->o->special, err);
    if (rc) return rc;
    int oom = 0;
    tk_text_out *fo = k->fo;
#pragma omp parallel for num_threads(k->w->n) schedule(dynamic, 16) reduction(| : oom)
    for (size_t i = 0; i < b->n; i++) oom |= tk_format(&b->ids[i], &fo->s[i], &fo->n[i], &fo->cap[i]);
    if (oom) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < b->n; i++) {
        if (fwrite(fo->s[i], 1, fo->n[i], k->out) != fo->n[i]) return fsdp_err_set(err, FSDP_E_IO, "writing the ids failed");
        k->tokens += b->ids[i].n;
    }
    return 0;
}

static int tk_encode_files(const tk_opts *o, const tok_tokenizer *tk, FILE *out, FILE *log, fsdp_err *err) {
    int threads = o->threads ? o->threads : 1;
    tok_workers w;
    tok_batch b = {0};
    tk_text_out fo = {calloc(TK_BATCH, sizeof(char *)), calloc(TK_BATCH, sizeof(size_t)), calloc(TK_BATCH, sizeof(size_t))};
    int rc = tok_workers_new(tk, threads, &w, err);
    if (!rc && (!fo.s || !fo.n || !fo.cap)) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t docs = 0, bytes = 0;
    tk_sink sink = {o, &w, &fo, out, 0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!rc)
        rc = tok_batch_files(&b, o->files, o->nf, o->field, -1, TK_BATCH, tk_flush, &sink, &docs, &bytes, err);
    size_t tokens = sink.tokens;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!rc && !o->quiet)
        fprintf(log, "tokenize: %zu documents, %zu bytes, %zu tokens in %.3f s (%.0f tokens/s, %d thread%s); %zu invalid "
                "UTF-8 sequences replaced by U+FFFD\n", docs, bytes, tokens, s, s > 0 ? (double)tokens / s : 0.0, threads,
                threads == 1 ? "" : "s", tok_workers_invalid(&w));
    if (!rc && w.n && tok_workers_dropped(&w))
        fprintf(log, "tokenize: warning: %zu characters have no token in the vocabulary (no byte_fallback, no unk_token) "
                "and were left out, as Hugging Face's tokenizer leaves them out\n", tok_workers_dropped(&w));
    for (size_t i = 0; fo.s && i < TK_BATCH; i++) free(fo.s[i]);
    free(fo.s);
    free(fo.n);
    free(fo.cap);
    tok_batch_free(&b);
    tok_workers_free(&w);
    return rc;
}

/* One line of ids: a JSON array of integers. */
static int tk_decode_line(const tok_tokenizer *tk, const char *path, size_t line, const char *s, size_t n,
                          const tk_opts *o, FILE *out, fsdp_err *err) {
    json_error_t je;
    json_t *j = json_loadb(s, n, 0, &je);
    if (!json_is_array(j)) {
        json_decref(j);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: expected a JSON array of ids", path, line);
    }
    tok_ids ids = {0};
    int rc = 0;
    for (size_t k = 0; k < json_array_size(j) && !rc; k++) {
        json_t *v = json_array_get(j, k);
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s:%zu: element %zu is not an integer id", path, line, k);
        else if (tok_ids_push(&ids, (int32_t)json_integer_value(v))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    json_decref(j);
    char *text = NULL;
    size_t tn = 0;
    if (!rc) rc = tok_decode(tk, ids.v, ids.n, o->skip_special, &text, &tn, err);
    if (rc) fsdp_err_prefix(err, "%s:%zu: ", path, line);
    tok_ids_free(&ids);
    if (!rc) {
        json_t *obj = json_object();
        json_object_set_new(obj, o->field ? o->field : "text", json_stringn(text, tn));
        char *dump = json_dumps(obj, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (dump) fprintf(out, "%s\n", dump);
        else rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        free(dump);
        json_decref(obj);
    }
    free(text);
    return rc;
}

static int tk_decode_files(const tk_opts *o, const tok_tokenizer *tk, FILE *out, fsdp_err *err) {
    int rc = 0;
    for (size_t f = 0; f < o->nf && !rc; f++) {
        char *buf = NULL;
        size_t n = 0;
        rc = tok_read_file(o->files[f], &buf, &n, err);
        size_t line = 0;
        for (size_t a = 0; !rc && a < n;) {
            size_t e = a;
            while (e < n && buf[e] != '\n') e++;
            line++;
            size_t s = a;
            while (s < e && (buf[s] == ' ' || buf[s] == '\r' || buf[s] == '\t')) s++;
            if (s < e) rc = tk_decode_line(tk, o->files[f], line, buf + a, e - a, o, out, err);
            a = e + 1;
        }
        free(buf);
    }
    return rc;
}

int tokenize_cli_main(int argc, char **argv, FILE *out, FILE *log) {
    tk_opts o = {0};
    o.files = calloc((size_t)(argc > 0 ? argc : 1), sizeof *o.files);
    if (!o.files) {
        fputs("fsdp-run: error: out of memory\n", log);
        return 1;
    }
    int rc = tk_parse(argc, argv, &o, out, log);
    if (rc >= 0) {
        free(o.files);
        return rc;
    }
    fsdp_err err;
    fsdp_err_clear(&err);
    tok_tokenizer *tk = NULL;
    rc = tok_load(o.tok, &tk, &err);
    if (!rc) rc = o.decode ? tk_decode_files(&o, tk, out, &err) : tk_encode_files(&o, tk, out, log, &err);
    if (rc) fprintf(log, "fsdp-run: error: tokenize: %s\n", err.msg);
    tok_free(tk);
    free(o.files);
    fflush(out);
    return rc ? fsdp_err_exit_code(rc) : 0;
}
