/* fsdp-run data prepare --tokenizer DIR -o OUT [--format llmc|tokens] [--dtype auto|uint16|uint32] [--field text]
 *                       [--eos TOKEN] [--no-template] [--shard-tokens N] [--threads N] FILE...
 *
 * The tokenized data kinds' pipeline once, written to token files for runs that train many times on the same
 * data: the documents (JSONL lines by their field, or whole text files) through the tokenizer on N threads,
 * each in the tokenizer's template with EOS between documents, exactly the stream `kind: jsonl` packs; as
 * llm.c shards (OUT_000000.bin, ...: a 1024-byte header, magic 20240520 v1 with uint16 tokens or 20240801 v7
 * with uint32) that `kind: llmc` reads, or one flat token file OUT that `kind: tokens` reads. Each file is
 * written beside its name and renamed into place when whole; a failure leaves none. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/data_prepare_cli.h"
#include "tokenizer/tok.h"
#include "tokenizer/tok_batch.h"
#include "tokenizer/tok_docs.h"

typedef struct dp_opts {
    const char *tok, *out, *field, *eos, *format, *dtype;
    int template_, threads, quiet;
    long long shard_tokens;
    const char **files;
    size_t nf;
} dp_opts;

static void dp_usage(FILE *f) {
    fputs("usage: fsdp-run data prepare --tokenizer DIR -o OUT [--format llmc|tokens] [--dtype auto|uint16|uint32]\n"
          "                             [--field text] [--eos TOKEN] [--no-template] [--shard-tokens N] [--threads N]\n"
          "                             FILE...\n"
          "  tokenizes documents (each line of a .jsonl file by its field, or each whole text file) as `data: {kind:\n"
          "  jsonl}` packs them (the tokenizer's template, EOS between documents) and writes llm.c shards\n"
          "  OUT_000000.bin ... (--format llmc, the default: uint16 magic 20240520 v1, or uint32 magic 20240801 v7;\n"
          "  train with data: {kind: llmc, path: \"OUT_*.bin\"}) or one flat token file OUT (--format tokens; train\n"
          "  with data: {kind: tokens, path: OUT, dtype: ...}). --dtype auto: uint16 when the vocabulary fits.\n"
          "  --shard-tokens: tokens per shard (100000000; at most 2^31 - 1)\n",
          f);
}

static int dp_parse(int argc, char **argv, dp_opts *o, FILE *out, FILE *log) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            dp_usage(out);
            return 0;
        } else if (!strcmp(a, "--tokenizer") && has) o->tok = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) o->out = argv[++i];
        else if (!strcmp(a, "--field") && has) o->field = argv[++i];
        else if (!strcmp(a, "--eos") && has) o->eos = argv[++i];
        else if (!strcmp(a, "--format") && has) o->format = argv[++i];
        else if (!strcmp(a, "--dtype") && has) o->dtype = argv[++i];
        else if (!strcmp(a, "--no-template")) o->template_ = 0;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if ((!strcmp(a, "--threads") || !strcmp(a, "--shard-tokens")) && has) {
            char *end;
            long long n = strtoll(argv[++i], &end, 10);
            long long max = !strcmp(a, "--threads") ? 1024 : 2147483647LL;
            if (*end || n < 1 || n > max) {
                fprintf(log, "fsdp-run: error: data prepare: %s expects 1..%lld, got '%s'\n", a, max, argv[i]);
                return 2;
            }
            if (!strcmp(a, "--threads")) o->threads = (int)n;
            else o->shard_tokens = n;
        } else if (a[0] == '-' && a[1]) {
            fprintf(log, "fsdp-run: error: data prepare: unknown option '%s' (or it needs a value)\n", a);
            return 2;
        } else o->files[o->nf++] = a;
    }
    const char *bad = !o->tok ? "--tokenizer DIR is required" : !o->out ? "-o OUT is required"
                      : !o->nf ? "no input file given" : NULL;
    if (!bad && strcmp(o->format, "llmc") && strcmp(o->format, "tokens")) bad = "--format must be llmc or tokens";
    if (!bad && strcmp(o->dtype, "auto") && strcmp(o->dtype, "uint16") && strcmp(o->dtype, "uint32"))
        bad = "--dtype must be auto, uint16 or uint32";
    if (bad) {
        fprintf(log, "fsdp-run: error: data prepare: %s\n", bad);
        dp_usage(log);
        return 2;
    }
    return -1;
}

/* The writer: the current file (a shard, or the flat file) under its temporary name. */
typedef struct dp_writer {
    const dp_opts *o;
    int esz, llmc;
    FILE *f;
    char tmp[4200], final[4200];
    long long in_file; /* tokens in the current file */
    size_t shard;
    unsigned char *buf;
    size_t nbuf, cap;
    long long tokens;
    char **done; /* the files renamed into place, removed again on a later failure */
    size_t n_done;
} dp_writer;

static int dp_open(dp_writer *w, fsdp_err *err) {
    if (w->llmc) snprintf(w->final, sizeof w->final, "%s_%06zu.bin", w->o->out, w->shard);
    else snprintf(w->final, sizeof w->final, "%s", w->o->out);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", w->final, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    w->in_file = 0;
    if (w->llmc) {
        unsigned char hdr[1024] = {0};
        if (fwrite(hdr, 1, sizeof hdr, w->f) != sizeof hdr) return fsdp_err_set(err, FSDP_E_IO, "%s: write failed", w->tmp);
    }
    return 0;
}

static void le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* The llm.c header's magic, version and token count written over the zeros dp_open reserved for them, the
 * file synced, closed and renamed into place. */
static int dp_close(dp_writer *w, fsdp_err *err) {
    if (!w->f) return 0;
    int rc = 0;
    if (w->llmc) {
        unsigned char hdr[12];
        le32(hdr, w->esz == 2 ? 20240520u : 20240801u);
        le32(hdr + 4, w->esz == 2 ? 1u : 7u);
        le32(hdr + 8, (uint32_t)w->in_file);
        if (fseek(w->f, 0, SEEK_SET) || fwrite(hdr, 1, sizeof hdr, w->f) != sizeof hdr) rc = -1;
    }
    if (fflush(w->f) || fsync(fileno(w->f))) rc = -1;
    if (fclose(w->f)) rc = -1;
    w->f = NULL;
    if (rc) return fsdp_err_set(err, FSDP_E_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    if (rename(w->tmp, w->final)) return fsdp_err_set(err, FSDP_E_IO, "%s: rename failed: %s", w->final, strerror(errno));
    char **d = realloc(w->done, (w->n_done + 1) * sizeof *d);
    if (!d) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    w->done = d;
    w->done[w->n_done++] = strdup(w->final);
    w->shard++;
    return 0;
}

/* Appends ids, starting a new shard whenever one is full. */
static int dp_put(dp_writer *w, const int32_t *ids, size_t n, fsdp_err *err) {
    while (n) {
        if (!w->f) {
            int rc = dp_open(w, err);
            if (rc) return rc;
        }
        size_t m = n;
        if (w->llmc && (long long)m > w->o->shard_tokens - w->in_file) m = (size_t)(w->o->shard_tokens - w->in_file);
        if (m * (size_t)w->esz > w->cap) {
            unsigned char *b = realloc(w->buf, m * (size_t)w->esz);
            if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            w->buf = b;
            w->cap = m * (size_t)w->esz;
        }
        for (size_t k = 0; k < m; k++) {
            uint32_t v = (uint32_t)ids[k];
            unsigned char *p = w->buf + k * (size_t)w->esz;
            p[0] = (unsigned char)v;
            p[1] = (unsigned char)(v >> 8);
            if (w->esz == 4) {
                p[2] = (unsigned char)(v >> 16);
                p[3] = (unsigned char)(v >> 24);
            }
        }
        if (fwrite(w->buf, (size_t)w->esz, m, w->f) != m) return fsdp_err_set(err, FSDP_E_IO, "%s: write failed: %s", w->tmp, strerror(errno));
        w->in_file += (long long)m;
        w->tokens += (long long)m;
        ids += m;
        n -= m;
        if (w->llmc && w->in_file == w->o->shard_tokens) {
            int rc = dp_close(w, err);
            if (rc) return rc;
        }
    }
    return 0;
}

static void dp_abandon(dp_writer *w) {
    if (w->f) {
        fclose(w->f);
        unlink(w->tmp);
        w->f = NULL;
    }
    for (size_t i = 0; i < w->n_done; i++) unlink(w->done[i]);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct dp_run {
    const dp_opts *o;
    tok_workers w;
    tok_batch b;
    dp_writer out;
    int32_t eos;
    size_t docs;
    double bytes, total, t0, last;
} dp_run;

static void dp_progress(dp_run *r, int final) {
    double t = now_s();
    if (r->o->quiet || (!final && t - r->last < (isatty(2) ? 0.5 : 10.0))) return;
    r->last = t;
    double el = t - r->t0 > 1e-9 ? t - r->t0 : 1e-9;
    fprintf(stderr, "%sdata prepare: %.1f of %.1f MB (%.0f%%), %zu documents, %lld tokens, %.1f MB/s, %.0f tokens/s%s",
            isatty(2) ? "\r" : "", r->bytes / 1e6, r->total / 1e6, r->total > 0 ? 100.0 * r->bytes / r->total : 100.0,
            r->docs, r->out.tokens, r->bytes / 1e6 / el, (double)r->out.tokens / el, isatty(2) && !final ? "" : "\n");
}

static int dp_flush(void *user, tok_batch *b, fsdp_err *err) {
    dp_run *r = user;
    int rc = b->n ? tok_batch_encode(b, &r->w, r->o->field, r->o->template_, err) : 0;
    for (size_t i = 0; !rc && i < b->n; i++) {
        tok_ids *ids = &b->ids[i];
        rc = dp_put(&r->out, ids->v, ids->n, err);
        if (!rc && (!ids->n || ids->v[ids->n - 1] != r->eos)) rc = dp_put(&r->out, &r->eos, 1, err);
        r->docs++;
        r->bytes += (double)b->len[i] + 1; /* its line's newline too: the progress is against the files' sizes */
    }
    dp_progress(r, 0);
    return rc;
}

static int dp_files(dp_run *r, fsdp_err *err) {
    int rc = tok_batch_files(&r->b, r->o->files, r->o->nf, r->o->field, -1, 4096, dp_flush, r, NULL, NULL, err);
    if (!rc && !r->docs) rc = fsdp_err_set(err, FSDP_E_INVALID, "no documents in the input (empty files)");
    if (!rc) rc = dp_close(&r->out, err);
    return rc;
}

/* The output's directory exists and is writable: checked before any work. */
static int dp_out_dir(const char *out, fsdp_err *err) {
    char dir[4096];
    const char *slash = strrchr(out, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) : 1, slash ? (slash == out ? "/" : out) : ".");
    if (access(dir, W_OK))
        return fsdp_err_set(err, FSDP_E_IO, "-o %s: the directory %s %s", out, dir,
                            errno == ENOENT ? "does not exist" : "is not writable");
    return 0;
}

static int dp_main(const dp_opts *o, fsdp_err *err, FILE *log) {
    dp_run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    tok_tokenizer *t = NULL;
    int rc = dp_out_dir(o->out, err);
    if (!rc) rc = tok_load(o->tok, &t, err);
    if (!rc) rc = tok_eos_id(t, o->tok, o->eos, &r.eos, err);
    int esz = !strcmp(o->dtype, "uint32") ? 4 : !strcmp(o->dtype, "uint16") ? 2 : 0;
    if (!rc && !esz) esz = tok_vocab_size(t) <= 65536 ? 2 : 4;
    if (!rc && esz == 2 && tok_vocab_size(t) > 65536)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "--dtype uint16 cannot hold the tokenizer's %d ids (use uint32)",
                          (int)tok_vocab_size(t));
    if (!rc) rc = tok_workers_new(t, o->threads ? o->threads : 1, &r.w, err);
    for (size_t f = 0; !rc && f < o->nf; f++) {
        struct stat sb;
        if (!stat(o->files[f], &sb)) r.total += (double)sb.st_size;
    }
    r.out = (dp_writer){.o = o, .esz = esz, .llmc = !strcmp(o->format, "llmc")};
    r.t0 = r.last = now_s();
    if (!rc) rc = dp_files(&r, err);
    if (rc) dp_abandon(&r.out);
    else {
        dp_progress(&r, 1);
        if (!o->quiet)
            fprintf(log, "data prepare: wrote %zu file%s (%s, uint%d) of %lld tokens from %zu documents; %zu invalid UTF-8 "
                    "sequences replaced by U+FFFD\n", r.out.n_done, r.out.n_done == 1 ? "" : "s",
                    r.out.llmc ? "llm.c shards" : "a flat token file", 8 * esz, r.out.tokens, r.docs,
                    tok_workers_invalid(&r.w));
    }
    for (size_t i = 0; i < r.out.n_done; i++) free(r.out.done[i]);
    free(r.out.done);
    free(r.out.buf);
    tok_batch_free(&r.b);
    tok_workers_free(&r.w);
    tok_free(t);
    return rc;
}

int data_cli_main(int argc, char **argv, FILE *out, FILE *log) {
    if (argc < 1 || strcmp(argv[0], "prepare")) {
        if (argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) {
            dp_usage(out);
            return 0;
        }
        fprintf(log, "fsdp-run: error: data: expected `data prepare` (got %s)\n", argc ? argv[0] : "nothing");
        dp_usage(log);
        return 2;
    }
    dp_opts o = {.format = "llmc", .dtype = "auto", .field = "text", .template_ = 1, .shard_tokens = 100000000};
    o.files = calloc((size_t)argc, sizeof *o.files);
    if (!o.files) return 1;
    int rc = dp_parse(argc - 1, argv + 1, &o, out, log);
    if (rc < 0) {
        fsdp_err err;
        fsdp_err_clear(&err);
        rc = dp_main(&o, &err, log);
        if (rc) fprintf(log, "fsdp-run: error: data prepare: %s\n", err.msg);
        rc = rc ? fsdp_err_exit_code(rc) : 0;
    }
    free(o.files);
    return rc;
}
