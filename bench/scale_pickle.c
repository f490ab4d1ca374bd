/* bench/scale_pickle: growth of the pickle reader and of name lookups in .pt files. For n, 2n,
 * 4n, 8n items it prints the seconds of
 *   dicts   pkl_parse of a dict of n small dicts (an optimizer state's shape),
 *   lists   pkl_parse of a list of n small lists,
 *   flat    pkl_parse of one dict of n string keys,
 *   late    pkl_parse of n lists made first and grown later (memo gets + APPEND),
 *   pt      ckpt_open of a .pt of n tensors plus ckpt_find of every name,
 * and the ratio to the previous size (~2 per doubling = linear, ~4 = quadratic). The pickles are
 * laid out the way Python's pickler writes them (memo puts after every string and container,
 * APPENDS/SETITEMS batches of 1000).
 *
 *   build/bench/scale_pickle [--n N] [--dir DIR] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/zip.h"

typedef struct {
    unsigned char *b;
    size_t len, cap;
    uint32_t memo;
} buf;

static void put(buf *p, const void *s, size_t n) {
    if (p->len + n > p->cap) {
        while (p->len + n > p->cap) p->cap = p->cap ? p->cap * 2 : 4096;
        p->b = realloc(p->b, p->cap);
        if (!p->b) {
            fprintf(stderr, "scale_pickle: out of memory\n");
            exit(1);
        }
    }
    memcpy(p->b + p->len, s, n);
    p->len += n;
}
static void op(buf *p, unsigned char c) { put(p, &c, 1); }
static void u32(buf *p, uint32_t x) {
    unsigned char b[4] = {(unsigned char)x, (unsigned char)(x >> 8), (unsigned char)(x >> 16), (unsigned char)(x >> 24)};
    put(p, b, 4);
}
/* memo put of the top of the stack (BINPUT / LONG_BINPUT) */
static void memo(buf *p) {
    if (p->memo < 256) {
        op(p, 'q');
        op(p, (unsigned char)p->memo);
    } else {
        op(p, 'r');
        u32(p, p->memo);
    }
    p->memo++;
}
static void str(buf *p, const char *s) {
    op(p, 'X');
    u32(p, (uint32_t)strlen(s));
    put(p, s, strlen(s));
    memo(p);
}
static void small_int(buf *p, int v) {
    op(p, 'K');
    op(p, (unsigned char)v);
}
static void flt(buf *p, double v) {
    uint64_t x;
    memcpy(&x, &v, 8);
    op(p, 'G');
    for (int i = 7; i >= 0; i--) op(p, (unsigned char)(x >> (8 * i)));
}

/* a dict of n dicts {'step': 1, 'lr': .., 'beta': .., 'eps': .., 'wd': ..} under keys 'p<i>' */
static void make_dicts(buf *p, size_t n) {
    static const char *const K[] = {"step", "lr", "beta", "eps", "wd"};
    char key[32];
    op(p, 0x80), op(p, 2), op(p, '}'), memo(p), op(p, '(');
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "p%zu", i);
        str(p, key);
        op(p, '}'), memo(p), op(p, '(');
        for (int k = 0; k < 5; k++) str(p, K[k]), k ? flt(p, 0.5 * k) : small_int(p, 1);
        op(p, 'u');
        if (i % 1000 == 999) op(p, 'u'), op(p, '(');
    }
    op(p, 'u'), op(p, '.');
}

/* a list of n lists [1, 2, 3, 4, 5] */
static void make_lists(buf *p, size_t n) {
    op(p, 0x80), op(p, 2), op(p, ']'), memo(p), op(p, '(');
    for (size_t i = 0; i < n; i++) {
        op(p, ']'), memo(p), op(p, '(');
        for (int k = 1; k <= 5; k++) small_int(p, k);
        op(p, 'e');
        if (i % 1000 == 999) op(p, 'e'), op(p, '(');
    }
    op(p, 'e'), op(p, '.');
}

/* n lists of 4 items made first, then each grown by one APPEND (a memo get per list): every
 * list's items array is reallocated long after it was made */
static void make_late(buf *p, size_t n) {
    op(p, 0x80), op(p, 2), op(p, ']'), memo(p), op(p, '(');
    uint32_t first = p->memo;
    for (size_t i = 0; i < n; i++) {
        op(p, ']'), memo(p), op(p, '(');
        for (int k = 1; k <= 4; k++) small_int(p, k);
        op(p, 'e');
        if (i % 1000 == 999) op(p, 'e'), op(p, '(');
    }
    op(p, 'e');
    for (size_t i = 0; i < n; i++) {
        op(p, 'j'), u32(p, first + (uint32_t)i); /* LONG_BINGET the list */
        small_int(p, 5), op(p, 'a'), op(p, '0');  /* APPEND 5, POP */
    }
    op(p, '.');
}

/* one dict of n keys 'layers.<i>.w' -> float */
static void make_flat(buf *p, size_t n) {
    char key[48];
    op(p, 0x80), op(p, 2), op(p, '}'), memo(p), op(p, '(');
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "layers.%zu.w", i);
        str(p, key);
        flt(p, (double)i);
        if (i % 1000 == 999) op(p, 'u'), op(p, '(');
    }
    op(p, 'u'), op(p, '.');
}

static double time_parse(void (*make)(buf *, size_t), size_t n) {
    buf p = {0};
    make(&p, n);
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    double t0 = bench_now();
    if (pkl_parse(p.b, p.len, "bench", &doc, &root, &err)) {
        fprintf(stderr, "scale_pickle: %s\n", err.msg);
        exit(1);
    }
    double t = bench_now() - t0;
    pkl_free(doc);
    free(p.b);
    return t;
}

/* a .pt of n one-element f32 tensors 'layers.<i>.w' (data/<i>) */
static void write_pt(const char *path, size_t n) {
    buf p = {0};
    char key[48];
    op(&p, 0x80), op(&p, 2), op(&p, '}'), memo(&p), op(&p, '(');
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "layers.%zu.w", i);
        str(&p, key);
        static const char rebuild[] = "ctorch._utils\n_rebuild_tensor_v2\n";
        put(&p, rebuild, sizeof rebuild - 1);
        op(&p, '('), op(&p, '('), str(&p, "storage");
        static const char cls[] = "ctorch\nFloatStorage\n";
        put(&p, cls, sizeof cls - 1);
        snprintf(key, sizeof key, "%zu", i);
        str(&p, key), str(&p, "cpu"), small_int(&p, 1), op(&p, 't'), op(&p, 'Q');
        small_int(&p, 0), op(&p, '('), small_int(&p, 1), op(&p, 't'), op(&p, '('), small_int(&p, 1), op(&p, 't');
        op(&p, 0x89);
        static const char od[] = "ccollections\nOrderedDict\n)R";
        put(&p, od, sizeof od - 1);
        op(&p, 't'), op(&p, 'R');
        if (i % 1000 == 999) op(&p, 'u'), op(&p, '(');
    }
    op(&p, 'u'), op(&p, '.');
    FILE *f = fopen(path, "wb");
    zip_writer w;
    fsdp_err err;
    uint64_t len;
    int rc = !f || zip_writer_begin(&w, f, &err);
    if (!rc) rc = zip_writer_add(&w, "archive/data.pkl", p.b, p.len, &err);
    for (size_t i = 0; i < n && !rc; i++) {
        char rec[64];
        float v = (float)i;
        snprintf(rec, sizeof rec, "archive/data/%zu", i);
        rc = zip_writer_add(&w, rec, &v, sizeof v, &err);
    }
    if (!rc) rc = zip_writer_add(&w, "archive/version", "3\n", 2, &err);
    if (!rc) rc = zip_writer_finish(&w, &len, &err);
    if (f) zip_writer_free(&w);
    if (rc || !f || fclose(f)) {
        fprintf(stderr, "scale_pickle: cannot write %s\n", path);
        exit(1);
    }
    free(p.b);
}

static const char *g_dir = "/tmp/fsdp-scale-pickle";

static double time_pt(size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/n%zu.pt", g_dir, n);
    write_pt(path, n);
    ckpt_reader *r;
    fsdp_err err;
    double t0 = bench_now();
    if (ckpt_open(path, CKPT_PT, &r, &err)) {
        fprintf(stderr, "scale_pickle: %s\n", err.msg);
        exit(1);
    }
    char key[48];
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "layers.%zu.w", i);
        if (ckpt_find(r, key) != (long)i) {
            fprintf(stderr, "scale_pickle: ckpt_find(%s) is wrong\n", key);
            exit(1);
        }
    }
    double t = bench_now() - t0;
    ckpt_close(r);
    unlink(path);
    return t;
}

static double run_parse_dicts(size_t n) { return time_parse(make_dicts, n); }
static double run_parse_lists(size_t n) { return time_parse(make_lists, n); }
static double run_parse_flat(size_t n) { return time_parse(make_flat, n); }
static double run_parse_late(size_t n) { return time_parse(make_late, n); }

int main(int argc, char **argv) {
    size_t n = 50000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) n = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) g_dir = argv[i + 1];
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", g_dir);
    if (bench_sh(cmd)) return 1;
    struct {
        const char *name;
        double (*run)(size_t);
    } cases[] = {{"dicts", run_parse_dicts}, {"lists", run_parse_lists}, {"flat", run_parse_flat}, {"late", run_parse_late}, {"pt", time_pt}};
    printf("%-6s %10s %10s %14s\n", "case", "items", "seconds", "ratio/doubling");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double prev = 0;
        for (size_t k = 1; k <= 8; k *= 2) {
            double t = cases[c].run(n * k);
            if (prev > 0) printf("%-6s %10zu %10.4f %14.2f\n", cases[c].name, n * k, t, t / prev);
            else printf("%-6s %10zu %10.4f %14s\n", cases[c].name, n * k, t, "-");
            prev = t;
            fflush(stdout);
        }
    }
    return 0;
}
