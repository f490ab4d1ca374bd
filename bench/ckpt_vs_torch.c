/* bench/ckpt_vs_torch (issue 18): save, load, convert and init of ONE model state by fsdp-run, by
 * the machine's ceilings and by PyTorch, in one run, with ratios.
 *
 *   build/bench/ckpt_vs_torch [--preset llama3_1b] [--layers N (0: the preset's)] [--reps 3]
 *                             [--threads 2] [--python python3] [--no-torch] [--dir DIR]
 *                             [--only io,convert,init] [--bin FSDP_RUN]
 *
 * --only runs some groups of measurements (a comma list): io (save and load on 1 and 2 ranks, their
 * ceilings, PyTorch's dcp), convert (both directions; it saves the 1-rank DCP it converts), init
 * (init-cpu, init-meta, PyTorch's init, memset). The other rows print "-". --bin times another
 * fsdp-run binary (e.g. the base build, for a before/after comparison; default: this build's).
 *
 * Each repetition runs every measurement once, in the same order (repetitions alternate the
 * tools, so a burst of other load on the shared machine hits all of them); the table shows medians.
 *   fsdp-run (the real stages through build/fsdp-run --report; 2 ranks: mpirun, threads split):
 *     save-dcp (after init-meta) and load-ckpt of the same checkpoint (page cache warm: just
 *     written) on 1 and 2 ranks; `ckpt convert` DCP -> safetensors and safetensors -> DCP, and the
 *     1-rank DCP resharded to 2 ranks (`--world 2`) (wall time including a sync; peak RSS from
 *     wait4); init-cpu (1 rank) and init-meta (1 and 2 ranks, rank 0's seconds_init).
 *   ceilings: `cp -r` + `sync` of the checkpoint just saved (save); for each convert, `cp (-r)` + `sync`
 *     and `dd bs=4M oflag=direct` + `sync` of its input as it finds it, timed beside it in the same
 *     repetition (before it in odd repetitions, after it in even ones), and each repetition's own
 *     ratio kept: this VM's disk drifts 2-3x within minutes, so only adjacent pairs compare; for load, three reads of it from the page cache, one reader per rank file at once:
 *     `dd bs=4M` to /dev/null (the load rows' ceiling: every byte copied out of the page cache into
 *     a 4 MiB user buffer), `cat` to /dev/null (coreutils 9.1 does read(128 KiB) + write to
 *     /dev/null: a copy into one cache-resident buffer, faster than any load can be, printed below
 *     the table) and a read into fresh memory of each file's size (a child per file timing its own
 *     malloc + pread of 4 MiB pieces: the first-touch page faults a load into a new state pays,
 *     printed below the table, timed just before the load in each repetition, and each repetition's own
 *     ratio fresh / load kept and printed there too).
 *     For init, a memset of fresh pages of the whole state by all threads, timed just before each init
 *     row in each repetition, and each repetition's own ratio memset / init kept (printed below the table).
 *   PyTorch (when `PYTHON -c "import torch"` works; --python, else FSDP_TORCH_PYTHON, else python3):
 *     bench/ckpt_vs_torch.py with the same names and shapes: dcp.save / dcp.load on 1 and 2
 *     processes (gloo, DTensor Shard(0) halves like FSDP2), and meta-init + to_empty + init. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "decoder/decoder_params.h"

#define CVT_MAX_REPS 64

enum fig {
    F_SAVE1, F_SAVE2, F_LOAD1, F_LOAD2, F_CP1, F_CP2, F_CAT1, F_CAT2, F_DD1, F_DD2, F_FRESH1, F_FRESH2,
    F_TSAVE1, F_TSAVE2, F_TLOAD1, F_TLOAD2,
    F_TO_ST, F_TO_DCP, F_CP_ST, F_RESHARD, F_CP1W, F_DD1W, F_DD_ST,
    /* per repetition: the convert's rate over its ceiling measured beside it (cp + sync, dd oflag=direct + sync) */
    F_Q_TO_ST_CP, F_Q_TO_ST_DD, F_Q_TO_DCP_CP, F_Q_TO_DCP_DD, F_Q_RESHARD_CP, F_Q_RESHARD_DD,
    F_INIT_CPU, F_INIT_META1, F_INIT_META2, F_TINIT, F_MEMSET,
    /* per repetition: the memset of fresh pages timed just before an init row over that row's seconds */
    F_Q_INIT_CPU, F_Q_INIT_META1, F_Q_INIT_META2,
    /* per repetition: the read into fresh memory timed just before a load over the load's seconds */
    F_Q_LOAD1, F_Q_LOAD2,
    F_COUNT
};

typedef struct cvt_opts {
    const char *preset, *python, *dir, *bin;
    int layers, reps, threads, torch;
    int io, convert, init; /* --only: which groups run (all by default) */
} cvt_opts;

typedef struct cvt_run {
    cvt_opts o;
    double v[F_COUNT][CVT_MAX_REPS]; /* seconds; < 0: not measured */
    int n[F_COUNT];
    double ck_bytes[3], torch_bytes[3], st_bytes, state_bytes, largest_bytes;
    long rss_to_st_kb, rss_to_dcp_kb, rss_reshard_kb;
    int64_t params;
    int torch_equal;
    char root[32];
} cvt_run;

static void put(cvt_run *r, enum fig f, double s) {
    if (s > 0 && r->n[f] < CVT_MAX_REPS) r->v[f][r->n[f]++] = s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(cvt_run *r, enum fig f) {
    int n = r->n[f];
    if (!n) return -1;
    qsort(r->v[f], (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? r->v[f][n / 2] : (r->v[f][n / 2 - 1] + r->v[f][n / 2]) / 2;
}

/* the recipes (model preset, layers) and the JSON list of names and shapes for PyTorch */
static int write_inputs(cvt_run *r) {
    fsdp_err err;
    decoder_config cfg;
    decoder_params t;
    if (decoder_config_preset(&cfg, r->o.preset, &err) ||
        (r->o.layers > 0 && (cfg.n_layers = r->o.layers, decoder_config_finalize(&cfg, &err))) ||
        decoder_params_build(&cfg, &t, &err)) {
        fprintf(stderr, "ckpt_vs_torch: %s\n", err.msg);
        return -1;
    }
    r->o.layers = cfg.n_layers;
    json_t *list = json_array();
    for (int i = 0; i < t.n; i++) {
        int64_t n = t.p[i].shape[0] * (t.p[i].ndim == 2 ? t.p[i].shape[1] : 1);
        r->params += n;
        if ((double)n * 4 > r->largest_bytes) r->largest_bytes = (double)n * 4;
        json_t *shape = t.p[i].ndim == 2 ? json_pack("[II]", (json_int_t)t.p[i].shape[0], (json_int_t)t.p[i].shape[1])
                                         : json_pack("[I]", (json_int_t)t.p[i].shape[0]);
        json_array_append_new(list, json_pack("[so]", t.p[i].name, shape));
    }
    decoder_params_free(&t);
    r->state_bytes = (double)r->params * 4;
    char path[1200], text[1024];
    snprintf(path, sizeof path, "%s/shapes.json", r->o.dir);
    int rc = json_dump_file(list, path, JSON_COMPACT);
    json_decref(list);
    /* runtime.stream false: the init rows time the fill and the save row the save of a held state, as torch's */
    const char *model = "model: {preset: %s, n_layers: %d}\nvars: {ck: x}\nruntime: {stream: false}\nstages:\n";
    const char *recipes[][2] = {
        {"save", "  - {id: init, uses: init-meta}\n  - {id: save, uses: save-dcp, with: {path: \"${ck}\", overwrite: true}}\n"},
        {"load", "  - {id: load, uses: load-ckpt, with: {path: \"${ck}\"}}\n"},
        {"init_cpu", "  - {id: init, uses: init-cpu}\n"},
        {"init_meta", "  - {id: init, uses: init-meta}\n"}};
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0] && !rc; i++) {
        int k = snprintf(text, sizeof text, model, r->o.preset, r->o.layers);
        snprintf(text + k, sizeof text - (size_t)k, "%s", recipes[i][1]);
        snprintf(path, sizeof path, "%s/%s.yaml", r->o.dir, recipes[i][0]);
        rc = bench_write_text(path, text);
    }
    return rc ? -1 : 0;
}

/* fsdp-run on np ranks: a stage's seconds (metric NULL) or metric from its report; -1 on failure */
static double fsdp_stage(cvt_run *r, int np, const char *recipe, const char *ck, const char *id, const char *metric) {
    char cmd[8192], rep[1200];
    snprintf(rep, sizeof rep, "%s/report.json", r->o.dir);
    char launch[256] = "";
    if (np > 1) snprintf(launch, sizeof launch, "mpirun --oversubscribe%s -np %d ", r->root, np);
    snprintf(cmd, sizeof cmd, "%s%s -q --report %s %s/%s.yaml --set runtime.threads=%d --set vars.ck=%s", launch,
             r->o.bin, rep, r->o.dir, recipe, r->o.threads / np > 0 ? r->o.threads / np : 1, ck ? ck : "none");
    if (bench_run(cmd, NULL) < 0) return -1;
    double s = bench_stage_field(rep, id, metric);
    return s > 0 || !metric ? s : bench_stage_field(rep, id, NULL);
}

static void on_torch_line(json_t *j, void *user) {
    cvt_run *r = user;
    const char *what = json_string_value(json_object_get(j, "what"));
    double s = json_number_value(json_object_get(j, "s"));
    int np = (int)json_integer_value(json_object_get(j, "nproc"));
    if (!what) return;
    if (!strcmp(what, "init")) {
        if (json_integer_value(json_object_get(j, "params")) != r->params) {
            fprintf(stderr, "ckpt_vs_torch: PyTorch built %lld parameters, fsdp-run's state has %lld\n",
                    (long long)json_integer_value(json_object_get(j, "params")), (long long)r->params);
            return;
        }
        put(r, F_TINIT, s);
        return;
    }
    if (np < 1 || np > 2) return;
    r->torch_bytes[np] = json_number_value(json_object_get(j, "bytes"));
    if (!strcmp(what, "save")) put(r, np == 1 ? F_TSAVE1 : F_TSAVE2, s);
    if (!strcmp(what, "load")) {
        if (!json_is_true(json_object_get(j, "equal"))) r->torch_equal = 0;
        put(r, np == 1 ? F_TLOAD1 : F_TLOAD2, s);
    }
}

static void torch_run(cvt_run *r, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s bench/ckpt_vs_torch.py --shapes %s/shapes.json --threads %d %s", r->o.python,
             r->o.dir, r->o.threads, args);
    if (bench_json_lines(cmd, on_torch_line, r)) fprintf(stderr, "ckpt_vs_torch: '%s' failed\n", cmd);
}

/* child of fresh_read: file into a new buffer of its size in 4 MiB preads; its seconds on fd out */
static void fresh_child(const char *path, int out) {
    double el = -1;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        double t0 = bench_now();
        size_t n = (size_t)st.st_size, piece = (size_t)4 << 20, a = 0;
        char *p = malloc(n ? n : 1);
        while (p && a < n) {
            ssize_t k = pread(fd, p + a, n - a < piece ? n - a : piece, (off_t)a);
            if (k <= 0) break;
            a += (size_t)k;
        }
        if (p && a == n) el = bench_now() - t0;
        volatile char sink = p && n ? p[n / 2] : 0;
        (void)sink;
    }
    if (write(out, &el, sizeof el) != (ssize_t)sizeof el) _exit(1);
    _exit(0);
}

/* Seconds to read every data file of ck into fresh memory, one child per file at once (like one
 * rank per file): the slowest child's own time (its exit's unmapping not counted); -1 on failure. */
static double fresh_read(const char *ck) {
    DIR *d = opendir(ck);
    if (!d) return -1;
    int fds[2];
    if (pipe(fds)) {
        closedir(d);
        return -1;
    }
    int kids = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue; /* . .. .metadata */
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", ck, de->d_name);
        pid_t pid = fork();
        if (pid == 0) fresh_child(path, fds[1]);
        if (pid > 0) kids++;
    }
    closedir(d);
    close(fds[1]);
    double worst = kids ? 0 : -1, el;
    for (int k = 0; k < kids; k++) {
        if (read(fds[0], &el, sizeof el) != (ssize_t)sizeof el || el < 0) worst = -1;
        else if (worst >= 0 && el > worst) worst = el;
    }
    close(fds[0]);
    while (wait(NULL) > 0) {
    }
    return worst;
}

/* Before each timed write or fill of new memory (ours, cp's, PyTorch's and the memset's alike): a scratch
 * file of the state's size written and removed, untimed. On this VM, memory the guest has not used for a
 * few seconds goes back to the host (free page reporting), and the first large write into it pays host
 * page faults: a safetensors -> DCP convert measured 5.0-6.1 s against 1.3 s alone, and each row depended
 * on which command happened to write first after other work. Every timed command now starts with the same
 * warm memory, as on a machine without memory ballooning. */
static void settle(cvt_run *r) {
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "head -c %.0f /dev/zero > '%s/settle' && rm -f '%s/settle'", r->state_bytes, r->o.dir,
             r->o.dir);
    bench_run(cmd, NULL);
}

/* save's figure, the cat and cp ceilings and load of np ranks' checkpoint ck (just saved in s seconds) */
static void rep_io_ceilings(cvt_run *r, int np, const char *ck, double s) {
    char cmd[4096];
    put(r, np == 1 ? F_SAVE1 : F_SAVE2, s);
    /* one cat per rank's file at once (each rank reads its own), then the metadata */
    snprintf(cmd, sizeof cmd, "for f in '%s'/*; do cat \"$f\" > /dev/null & done; wait; cat '%s'/.metadata > /dev/null",
             ck, ck);
    put(r, np == 1 ? F_CAT1 : F_CAT2, bench_run(cmd, NULL));
    snprintf(cmd, sizeof cmd,
             "for f in '%s'/*; do dd if=\"$f\" of=/dev/null bs=4M status=none & done; wait; "
             "dd if='%s'/.metadata of=/dev/null bs=4M status=none",
             ck, ck);
    put(r, np == 1 ? F_DD1 : F_DD2, bench_run(cmd, NULL));
    settle(r);
    double fresh = fresh_read(ck);
    put(r, np == 1 ? F_FRESH1 : F_FRESH2, fresh);
    settle(r); /* the loads fill new memory, as PyTorch's dcp.load fills its torch.empty state */
    double load = fsdp_stage(r, np, "load", ck, "load", NULL);
    put(r, np == 1 ? F_LOAD1 : F_LOAD2, load);
    /* this VM's fresh memory drifts 1.5-2x between minutes: the pair timed one after the other compares */
    if (fresh > 0 && load > 0) put(r, np == 1 ? F_Q_LOAD1 : F_Q_LOAD2, fresh / load);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s.copy' && sync", ck, ck);
    settle(r);
    put(r, np == 1 ? F_CP1 : F_CP2, bench_run(cmd, NULL));
    snprintf(cmd, sizeof cmd, "rm -rf '%s.copy'", ck);
    bench_run(cmd, NULL);
}

/* the ceilings of writing src's bytes again, src as the convert finds it (in the page cache): cp (-r) + sync, and
 * dd bs=4M oflag=direct + sync of each file (past the page cache, as the convert writes); seconds in *cp, *dd */
static void rep_ceilings(cvt_run *r, const char *src, int is_dir, double *cp, double *dd) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s.copy' && sync", src, src);
    settle(r);
    *cp = bench_run(cmd, NULL);
    if (is_dir)
        snprintf(cmd, sizeof cmd, "rm -rf '%s.copy' && mkdir '%s.copy' && for f in '%s'/* '%s'/.metadata; do "
                 "dd if=\"$f\" of='%s.copy'/\"$(basename \"$f\")\" bs=4M oflag=direct status=none || exit 1; done && sync",
                 src, src, src, src, src);
    else
        snprintf(cmd, sizeof cmd, "rm -f '%s.copy' && dd if='%s' of='%s.copy' bs=4M oflag=direct status=none && sync",
                 src, src, src);
    settle(r);
    *dd = bench_run(cmd, NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s.copy'", src);
    bench_run(cmd, NULL);
}

/* the convert's rate over each ceiling of the same repetition (the disk's speed drifts within a minute) */
static void put_ratios(cvt_run *r, enum fig fcp, enum fig fdd, double conv, double cp, double dd) {
    if (conv > 0 && cp > 0) put(r, fcp, cp / conv);
    if (conv > 0 && dd > 0) put(r, fdd, dd / conv);
}

/* one timed `ckpt convert ARGS` after removing out; its seconds, its peak RSS kept in *rss_max */
static double timed_convert(cvt_run *r, const char *args, const char *out, long *rss_max) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && sync && %s ckpt convert %s >/dev/null && sync", out, r->o.bin, args);
    long rss = 0;
    settle(r);
    double s = bench_run(cmd, &rss);
    if (rss > *rss_max) *rss_max = rss;
    return s;
}

/* ckpt convert of the 1-rank checkpoint ck to safetensors and back and to 2 ranks, each with the ceilings of
 * its own input measured beside it; odd repetitions time the ceilings first, even ones the convert first */
static void rep_convert(cvt_run *r, const char *ck, int rep) {
    char st[1300], dcp[1300], ws2[1300], args[4096], cmd[4096];
    snprintf(st, sizeof st, "%s/conv.safetensors", r->o.dir);
    snprintf(dcp, sizeof dcp, "%s/conv_dcp", r->o.dir);
    snprintf(ws2, sizeof ws2, "%s/conv_ws2", r->o.dir);
    double cp = -1, dd = -1, cps = -1, dds = -1, a, b, c;
    int first = rep % 2 == 0;
    if (first) rep_ceilings(r, ck, 1, &cp, &dd);
    snprintf(args, sizeof args, "'%s' '%s'", ck, st);
    a = timed_convert(r, args, st, &r->rss_to_st_kb);
    r->st_bytes = bench_path_bytes(st);
    if (!first) rep_ceilings(r, ck, 1, &cp, &dd);
    if (first) rep_ceilings(r, st, 0, &cps, &dds);
    snprintf(args, sizeof args, "'%s' '%s' --to dcp", st, dcp);
    b = timed_convert(r, args, dcp, &r->rss_to_dcp_kb);
    /* every output is removed once measured (the page cache stays near two states: see settle) */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dcp);
    bench_run(cmd, NULL);
    if (!first) rep_ceilings(r, st, 0, &cps, &dds);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", st);
    bench_run(cmd, NULL);
    /* the 1-rank DCP resharded to 2 ranks' files (what reshard-dcp does), against the DCP's ceilings */
    snprintf(args, sizeof args, "'%s' '%s' --to dcp --world 2", ck, ws2);
    c = timed_convert(r, args, ws2, &r->rss_reshard_kb);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ws2);
    bench_run(cmd, NULL);
    put(r, F_TO_ST, a), put(r, F_TO_DCP, b), put(r, F_RESHARD, c);
    put(r, F_CP1W, cp), put(r, F_DD1W, dd), put(r, F_CP_ST, cps), put(r, F_DD_ST, dds);
    if (!r->o.io) put(r, F_CP1, cp); /* the save row's ceiling is the io group's; convert alone fills it here */
    put_ratios(r, F_Q_TO_ST_CP, F_Q_TO_ST_DD, a, cp, dd);
    put_ratios(r, F_Q_TO_DCP_CP, F_Q_TO_DCP_DD, b, cps, dds);
    put_ratios(r, F_Q_RESHARD_CP, F_Q_RESHARD_DD, c, cp, dd);
}

/* save of np ranks' checkpoint, then the groups asked for (io: ceilings, load, PyTorch's dcp; convert) */
static int rep_io(cvt_run *r, int np, int rep) {
    char ck[1200], cmd[4096];
    snprintf(ck, sizeof ck, "%s/ck%d", r->o.dir, np);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.copy' && sync", ck, ck);
    bench_run(cmd, NULL);
    settle(r);
    double s = fsdp_stage(r, np, "save", ck, "save", NULL);
    if (s < 0) return -1;
    r->ck_bytes[np] = bench_path_bytes(ck);
    if (r->o.io) rep_io_ceilings(r, np, ck, s);
    if (np == 1 && r->o.convert) rep_convert(r, ck, rep);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck);
    bench_run(cmd, NULL);
    if (r->o.torch && r->o.io) {
        snprintf(cmd, sizeof cmd, "--part dcp --nproc %d --dir %s/torch%d", np, r->o.dir, np);
        settle(r); /* PyTorch's dcp.save is its first write, like our save */
        torch_run(r, cmd);
        snprintf(cmd, sizeof cmd, "rm -rf '%s/torch%d'", r->o.dir, np);
        bench_run(cmd, NULL);
    }
    return 0;
}

/* The memset of fresh pages (the whole state by all threads: the ceiling of 1 rank, and of 2 ranks filling their
 * halves at once), then init row f, each after a settle; q gets the memset's seconds over the row's (this VM's
 * memory drifts 1.5-2x between minutes: only adjacent pairs compare). */
static void init_beside_memset(cvt_run *r, enum fig f, enum fig q, int np, const char *recipe) {
    settle(r);
    const double ms = bench_memset_seconds((size_t)r->state_bytes, r->o.threads);
    put(r, F_MEMSET, ms);
    settle(r);
    const double s = fsdp_stage(r, np, recipe, NULL, "init", "seconds_init");
    put(r, f, s);
    if (ms > 0 && s > 0) put(r, q, ms / s);
}

static void rep_init(cvt_run *r) {
    init_beside_memset(r, F_INIT_CPU, F_Q_INIT_CPU, 1, "init_cpu");
    init_beside_memset(r, F_INIT_META1, F_Q_INIT_META1, 1, "init_meta");
    init_beside_memset(r, F_INIT_META2, F_Q_INIT_META2, 2, "init_meta");
    if (r->o.torch) {
        settle(r);
        torch_run(r, "--part init");
    }
}

/* "2.61x faster" / "2.40x SLOWER" of rate a against rate b; "-" when either is missing */
static const char *ratio(char *buf, size_t n, double a, double b, int loud) {
    if (a <= 0 || b <= 0) return snprintf(buf, n, "-"), buf;
    if (a >= b) snprintf(buf, n, "%.2fx faster", a / b);
    else snprintf(buf, n, loud ? "%.2fx SLOWER" : "%.2fx slower", b / a);
    return buf;
}

static void rate(char *buf, size_t n, double bytes, double s, const char *what) {
    if (s <= 0 || bytes <= 0) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.2f GB/s (%.2f s%s%s)", bytes / s / 1e9, s, *what ? ", " : "", what);
}

static void row(const char *work, double b_ours, double ours, double b_torch, double torch, const char *tname,
                double b_ceil, double ceil, const char *cname) {
    char a[96], t[96], c[96], r1[48], r2[48];
    rate(a, sizeof a, b_ours, ours, "");
    rate(t, sizeof t, b_torch, torch, tname);
    rate(c, sizeof c, b_ceil, ceil, cname);
    double ra = ours > 0 ? b_ours / ours : -1, rt = torch > 0 ? b_torch / torch : -1, rc = ceil > 0 ? b_ceil / ceil : -1;
    printf("| %s | %s | %s | %s | %s | %s |\n", work, a, t, c, ratio(r1, sizeof r1, ra, rt, 1), ratio(r2, sizeof r2, ra, rc, 0));
}

/* the other page-cache reads beside dd (the load rows' ceiling), with load's ratio to each */
static void print_load_ceilings(cvt_run *r) {
    if (!r->o.io) return;
    printf("\nload ceilings (page cache warm, one reader per rank file at once; the table's is dd bs=4M):\n");
    for (int np = 1; np <= 2; np++) {
        double b = r->ck_bytes[np], ld = median(r, np == 1 ? F_LOAD1 : F_LOAD2);
        const char *names[3] = {"dd bs=4M", "cat (128 KiB reads into one cache-resident buffer)",
                                "read into fresh memory (first-touch page faults included)"};
        enum fig f[3] = {np == 1 ? F_DD1 : F_DD2, np == 1 ? F_CAT1 : F_CAT2, np == 1 ? F_FRESH1 : F_FRESH2};
        for (int k = 0; k < 3; k++) {
            char c[96], q[48];
            double s = median(r, f[k]);
            rate(c, sizeof c, b, s, "");
            printf("  %d rank%s: %-58s %s; load-ckpt %s\n", np, np > 1 ? "s" : "", names[k], c,
                   ratio(q, sizeof q, ld > 0 ? b / ld : -1, s > 0 ? b / s : -1, 0));
        }
    }
    printf("load vs the read into fresh memory timed just before it in the same repetition (median of the "
           "per-repetition ratios fresh / load, min - max; >= 0.90: issue 40's bar):\n");
    for (int np = 1; np <= 2; np++) {
        enum fig f = np == 1 ? F_Q_LOAD1 : F_Q_LOAD2;
        double m = median(r, f); /* sorts: min and max are the ends */
        int n = r->n[f];
        if (n) printf("  %d rank%s %.2f (%.2f - %.2f, %d repetitions)\n", np, np > 1 ? "s" : "", m, r->v[f][0],
                      r->v[f][n - 1], n);
    }
}

/* the convert rows again as the median (min - max) of each repetition's own ratio to the ceilings beside it */
static void print_convert_ratios(cvt_run *r) {
    if (!r->o.convert) return;
    printf("\nconvert vs its ceilings measured beside it in the same repetition (median of %d per-repetition ratios, "
           "min - max; >= 1.00: at or past the ceiling):\n", r->n[F_Q_TO_ST_CP]);
    const char *names[3] = {"DCP -> safetensors", "safetensors -> DCP", "reshard 1 -> 2 ranks"};
    enum fig f[3][2] = {{F_Q_TO_ST_CP, F_Q_TO_ST_DD}, {F_Q_TO_DCP_CP, F_Q_TO_DCP_DD}, {F_Q_RESHARD_CP, F_Q_RESHARD_DD}};
    for (int k = 0; k < 3; k++) {
        printf("  %-22s", names[k]);
        for (int c = 0; c < 2; c++) {
            double m = median(r, f[k][c]); /* sorts: min and max are the ends */
            int n = r->n[f[k][c]];
            if (n) printf("  %s %.2f (%.2f - %.2f)", c ? "dd oflag=direct + sync" : "cp + sync", m, r->v[f[k][c]][0],
                          r->v[f[k][c]][n - 1]);
        }
        printf("\n");
    }
    double dd = median(r, F_DD1W), dds = median(r, F_DD_ST);
    printf("  ceilings' medians: DCP dd oflag=direct + sync %.2f s, safetensors dd oflag=direct + sync %.2f s\n", dd, dds);
}

/* the init rows again as the median (min - max) of each repetition's memset / init */
static void print_init_ratios(cvt_run *r) {
    if (!r->o.init) return;
    printf("\ninit vs the memset of fresh pages timed just before it in the same repetition (median of %d per-repetition "
           "ratios memset / init, min - max; >= 0.80: issue 40's bar):\n", r->n[F_Q_INIT_CPU]);
    const char *names[3] = {"init-cpu, 1 rank", "init-meta, 1 rank", "init-meta, 2 ranks"};
    const enum fig f[3] = {F_Q_INIT_CPU, F_Q_INIT_META1, F_Q_INIT_META2};
    for (int k = 0; k < 3; k++) {
        double m = median(r, f[k]); /* sorts: min and max are the ends */
        int n = r->n[f[k]];
        if (n) printf("  %-20s %.2f (%.2f - %.2f)\n", names[k], m, r->v[f[k]][0], r->v[f[k]][n - 1]);
    }
}

static void print_table(cvt_run *r) {
    double b1 = r->ck_bytes[1], b2 = r->ck_bytes[2], tb1 = r->torch_bytes[1], tb2 = r->torch_bytes[2];
    printf("\n| work | fsdp-run | PyTorch | ceiling on this machine | fsdp-run vs PyTorch | fsdp-run vs ceiling |\n");
    printf("|---|---|---|---|---|---|\n");
    row("`load-ckpt`, 1 rank", b1, median(r, F_LOAD1), tb1, median(r, F_TLOAD1), "dcp.load", b1, median(r, F_DD1), "dd bs=4M");
    row("`load-ckpt`, 2 ranks", b2, median(r, F_LOAD2), tb2, median(r, F_TLOAD2), "dcp.load", b2, median(r, F_DD2), "dd bs=4M");
    row("`save-dcp`, 1 rank", b1, median(r, F_SAVE1), tb1, median(r, F_TSAVE1), "dcp.save", b1, median(r, F_CP1), "cp -r + sync");
    row("`save-dcp`, 2 ranks", b2, median(r, F_SAVE2), tb2, median(r, F_TSAVE2), "dcp.save", b2, median(r, F_CP2), "cp -r + sync");
    row("`ckpt convert` DCP -> safetensors", b1, median(r, F_TO_ST), 0, -1, "", b1, median(r, F_CP1W),
        "cp -r + sync of the DCP, as cached");
    row("`ckpt convert` safetensors -> DCP", r->st_bytes, median(r, F_TO_DCP), 0, -1, "", r->st_bytes, median(r, F_CP_ST),
        "cp + sync of the file");
    row("`ckpt convert --world 2` (reshard 1 -> 2 ranks)", b1, median(r, F_RESHARD), 0, -1, "", b1, median(r, F_CP1W),
        "cp -r + sync of the DCP, as cached");
    char th[64];
    snprintf(th, sizeof th, "`init-cpu`, 1 rank, %d threads", r->o.threads);
    row(th, r->state_bytes, median(r, F_INIT_CPU), r->state_bytes, median(r, F_TINIT), "meta + to_empty + init",
        r->state_bytes, median(r, F_MEMSET), "memset of fresh pages");
    snprintf(th, sizeof th, "`init-meta`, 1 rank, %d threads", r->o.threads);
    row(th, r->state_bytes, median(r, F_INIT_META1), r->state_bytes, median(r, F_TINIT), "meta + to_empty + init",
        r->state_bytes, median(r, F_MEMSET), "memset of fresh pages");
    snprintf(th, sizeof th, "`init-meta`, 2 ranks (rank 0: its half)");
    row(th, r->state_bytes / 2, median(r, F_INIT_META2), r->state_bytes, median(r, F_TINIT), "1 process",
        r->state_bytes / 2, median(r, F_MEMSET), "memset of both halves at once");
    print_load_ceilings(r);
    print_convert_ratios(r);
    print_init_ratios(r);
    printf("\nGB/s: checkpoint bytes (files' apparent sizes) / seconds; init: float32 bytes of the weights / seconds.\n");
    printf("checkpoint: fsdp-run %.3f GB (1 rank) %.3f GB (2 ranks); safetensors %.3f GB", b1 / 1e9, b2 / 1e9,
           r->st_bytes / 1e9);
    if (r->o.torch) printf("; PyTorch %.3f GB (1 process) %.3f GB (2 processes)", tb1 / 1e9, tb2 / 1e9);
    printf("\n");
    printf("peak RSS of convert: DCP -> safetensors %.0f MiB (%.2fx the largest tensor), safetensors -> DCP %.0f MiB "
           "(%.2fx); largest tensor %.0f MiB\n",
           (double)r->rss_to_st_kb / 1024, (double)r->rss_to_st_kb * 1024 / r->largest_bytes,
           (double)r->rss_to_dcp_kb / 1024, (double)r->rss_to_dcp_kb * 1024 / r->largest_bytes, r->largest_bytes / 1048576);
    printf("peak RSS of the reshard 1 -> 2 ranks: %.0f MiB (%.2fx the largest tensor)\n",
           (double)r->rss_reshard_kb / 1024, (double)r->rss_reshard_kb * 1024 / r->largest_bytes);
    if (r->o.torch && !r->torch_equal) printf("WARNING: PyTorch's dcp.load did not give back the saved tensors\n");
}

/* --only LIST: 1 when every item is a group's name, -1 otherwise */
static int parse_only(cvt_opts *o, const char *list) {
    o->io = o->convert = o->init = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "io")) o->io = 1;
        else if (!strcmp(t, "convert")) o->convert = 1;
        else if (!strcmp(t, "init")) o->init = 1;
        else return -1;
    }
    return o->io || o->convert || o->init ? 1 : -1;
}

static int parse(cvt_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--no-torch")) o->torch = 0, used = 0;
        else if (!v) used = -1;
        else if (!strcmp(a, "--preset")) o->preset = v;
        else if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--python")) o->python = v;
        else if (!strcmp(a, "--dir")) o->dir = v;
        else if (!strcmp(a, "--bin")) o->bin = v;
        else if (!strcmp(a, "--only")) used = parse_only(o, v);
        else used = -1;
        if (used < 0 || o->layers < 0 || o->layers > 1024 || o->reps < 1 || o->reps > CVT_MAX_REPS || o->threads < 1) {
            fprintf(stderr, "usage: %s [--preset NAME] [--layers N (0: the preset's)] [--reps N (1..%d)] [--threads T] "
                    "[--python PY] [--no-torch] [--dir DIR] [--only io,convert,init] [--bin FSDP_RUN]\n", argv[0], CVT_MAX_REPS);
            return 2;
        }
        i += used;
    }
    return 0;
}

int main(int argc, char **argv) {
    static cvt_run r;
    r.o = (cvt_opts){"llama3_1b", "python3", "/tmp/fsdp-ckpt-vs-torch", FSDP_BUILD_DIR "/fsdp-run", 0, 3, 2, 1, 1, 1, 1};
    const char *env_py = getenv("FSDP_TORCH_PYTHON");
    if (env_py && *env_py) r.o.python = env_py;
    if (parse(&r.o, argc, argv)) return 2;
    r.torch_equal = 1;
    snprintf(r.root, sizeof r.root, "%s", geteuid() == 0 ? " --allow-run-as-root" : "");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r.o.dir);
    bench_run(cmd, NULL);
    if (mkdir(r.o.dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "ckpt_vs_torch: cannot create %s: %s\n", r.o.dir, strerror(errno));
        return 1;
    }
    if (write_inputs(&r)) return 1;
    if (!r.o.torch) printf("PyTorch: not measured (--no-torch)\n");
    if (r.o.torch) {
        snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", r.o.python);
        if (system(cmd) != 0) {
            printf("PyTorch: skipped ('%s -c \"import torch\"' fails; --python PY or FSDP_TORCH_PYTHON names another)\n",
                   r.o.python);
            r.o.torch = 0;
        }
    }
    printf("ckpt_vs_torch: %s with %d layers, %lld parameters (%.2f GB of float32), %d threads, %d alternating "
           "repetitions, medians\n", r.o.preset, r.o.layers, (long long)r.params, r.state_bytes / 1e9, r.o.threads, r.o.reps);
    fflush(stdout);
    for (int k = 0; k < r.o.reps; k++) {
        if ((r.o.io || r.o.convert) && rep_io(&r, 1, k)) return 1;
        if (r.o.io && rep_io(&r, 2, k)) return 1;
        if (r.o.init) rep_init(&r);
        fprintf(stderr, "ckpt_vs_torch: repetition %d of %d done\n", k + 1, r.o.reps);
    }
    print_table(&r);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r.o.dir);
    bench_run(cmd, NULL);
    return 0;
}
