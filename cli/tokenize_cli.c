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

/* A batch of raw documents, parsed, encoded and formatted on the threads, written in order. */
typedef struct tk_doc {
    char *raw;
    size_t len, line, file;
    char *out; /* "[id,id,...]\n" */
    size_t on, ocap;
    size_t tokens;
} tk_doc;

typedef struct tk_worker {
    tok_state *st;
    tok_text text;
    tok_ids ids;
    size_t invalid;
    fsdp_err err;
    int failed;
} tk_worker;

static int tk_format(tk_doc *d, const tok_ids *ids) {
    size_t need = ids->n * 12 + 4;
    if (need > d->ocap) {
        char *p = realloc(d->out, need);
        if (!p) return -1;
        d->out = p;
        d->ocap = need;
    }
    char *o = d->out;
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
    d->on = (size_t)(o - d->out);
    d->tokens = ids->n;
    return 0;
}

static void tk_one(const tk_opts *o, tk_doc *d, tk_worker *w) {
    const char *path = o->files[d->file];
    if (tok_doc_text(path, d->line, o->field ? o->field : "text", tok_docs_is_jsonl(path), d->raw, d->len, &w->text,
                     &w->invalid, &w->err)) {
        w->failed = 1;
        return;
    }
    w->ids.n = 0;
    if (tok_encode(w->st, w->text.p, w->text.n, o->special, &w->ids, &w->err)) {
        fsdp_err_prefix(&w->err, "%s:%zu: ", path, d->line);
        w->failed = 1;
        return;
    }
    if (tk_format(d, &w->ids)) {
        fsdp_err_set(&w->err, FSDP_E_NOMEM, "out of memory");
        w->failed = 1;
    }
}

/* Encodes docs[0..n) on the workers and writes them in order; the first failure (in document order) wins. */
static int tk_flush(const tk_opts *o, tk_doc *docs, size_t n, tk_worker *w, int threads, FILE *out, size_t *tokens,
                    fsdp_err *err) {
    size_t first_bad = n;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
    for (size_t i = 0; i < n; i++) {
        tk_worker *me = &w[omp_get_thread_num()];
        if (me->failed) continue;
        tk_one(o, &docs[i], me);
        if (me->failed) {
#pragma omp critical(tk_fail)
            if (i < first_bad) {
                first_bad = i;
                *err = me->err;
            }
        }
    }
    if (first_bad < n) return err->code;
    for (size_t i = 0; i < n; i++) {
        if (fwrite(docs[i].out, 1, docs[i].on, out) != docs[i].on) return fsdp_err_set(err, FSDP_E_IO, "writing the ids failed");
        *tokens += docs[i].tokens;
    }
    return 0;
}

static int tk_encode_files(const tk_opts *o, const tok_tokenizer *tk, FILE *out, FILE *log, fsdp_err *err) {
    int threads = o->threads ? o->threads : 1;
    tk_worker *w = calloc((size_t)threads, sizeof *w);
    tk_doc *docs = calloc(TK_BATCH, sizeof *docs);
    int rc = w && docs ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (int t = 0; t < threads && !rc; t++)
        if (!(w[t].st = tok_state_new(tk))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t ndocs = 0, tokens = 0, invalid = 0, bytes = 0, dropped = 0, nb = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t f = 0; f < o->nf && !rc; f++) {
        tok_docs d;
        rc = tok_docs_open(&d, o->files[f], o->field, err);
        const char *raw;
        size_t len;
        int r = 0;
        while (!rc && (r = tok_docs_next_raw(&d, &raw, &len, err)) == 1) {
            tk_doc *x = &docs[nb];
            free(x->raw);
            x->raw = malloc(len + 1);
            if (!x->raw) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                break;
            }
            memcpy(x->raw, raw, len);
            x->len = len;
            x->line = d.line;
            x->file = f;
            nb++;
            ndocs++;
            bytes += len;
            if (nb == TK_BATCH) {
                rc = tk_flush(o, docs, nb, w, threads, out, &tokens, err);
                nb = 0;
            }
        }
        if (!rc && r < 0) rc = r;
        if (!rc && r > 1) rc = r;
        tok_docs_close(&d);
    }
    if (!rc) rc = tk_flush(o, docs, nb, w, threads, out, &tokens, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int t = 0; w && t < threads; t++) {
        if (w[t].st) dropped += tok_state_dropped(w[t].st);
        invalid += w[t].invalid;
        tok_state_free(w[t].st);
        tok_text_free(&w[t].text);
        tok_ids_free(&w[t].ids);
    }
    for (size_t i = 0; docs && i < TK_BATCH; i++) {
        free(docs[i].raw);
        free(docs[i].out);
    }
    free(docs);
    free(w);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!rc && !o->quiet)
        fprintf(log, "tokenize: %zu documents, %zu bytes, %zu tokens in %.3f s (%.0f tokens/s, %d thread%s); %zu invalid "
                "UTF-8 sequences replaced by U+FFFD\n", ndocs, bytes, tokens, s, s > 0 ? (double)tokens / s : 0.0, threads,
                threads == 1 ? "" : "s", invalid);
    if (!rc && dropped)
        fprintf(log, "tokenize: warning: %zu characters have no token in the vocabulary (no byte_fallback, no unk_token) "
                "and were left out, as Hugging Face's tokenizer leaves them out\n", dropped);
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
