/* Helpers shared by the benchmark programs in bench/ (header-only: each benchmark is one
 * program): shell commands, wall clock, run reports and JSON-line output of other programs. */
#ifndef FSDP_BENCH_UTIL_H
#define FSDP_BENCH_UTIL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* system(cmd); prints the command when it fails */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (n <= 64; v is left as it is). */
static inline double bench_median(const double *v, int n) {
    double t[64];
    if (n < 1 || n > 64) return 0;
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static inline int bench_sh(const char *cmd) {
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "bench: '%s' failed (%d)\n", cmd, rc);
    return rc;
}

/* Seconds of a parallel memset of `bytes` fresh pages (malloc'd here) on `threads` OpenMP threads:
 * what filling a new state costs at memory bandwidth, first touch included; -1 when out of memory. */
static inline double bench_memset_seconds(size_t bytes, int threads) {
    char *p = malloc(bytes ? bytes : 1);
    if (!p) return -1;
    const size_t piece = (size_t)1 << 20;
    const int64_t pieces = (int64_t)((bytes + piece - 1) / piece);
    double t0 = bench_now();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < pieces; q++) {
        size_t a = (size_t)q * piece, n = bytes - a < piece ? bytes - a : piece;
        memset(p + a, 0, n);
    }
    double el = bench_now() - t0;
    volatile char sink = p[bytes / 2];
    (void)sink;
    free(p);
    return el;
}

/* Runs cmd through /bin/sh (fork + wait4): its wall seconds, or -1 (printed) when it fails;
 * *maxrss_kb (may be NULL) gets the child's peak resident set in KiB. */
static inline double bench_run(const char *cmd, long *maxrss_kb) {
    double t0 = bench_now();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) < 0) return -1;
    double el = bench_now() - t0;
    if (maxrss_kb) *maxrss_kb = ru.ru_maxrss;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "bench: '%s' failed\n", cmd);
        return -1;
    }
    return el;
}

/* bench_run that exits the benchmark when cmd fails: its wall seconds; *rss_mib (may be NULL) its peak RSS in MiB. */
static inline double bench_timed(const char *cmd, double *rss_mib) {
    long kb = 0;
    double el = bench_run(cmd, &kb);
    if (el < 0) exit(1);
    if (rss_mib) *rss_mib = (double)kb / 1024.0;
    return el;
}

/* The whole file at path, malloc'd (*len its size); NULL (said on stderr) when it cannot be read. */
static inline char *bench_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc(n ? (size_t)n : 1)) && fread(b, 1, (size_t)n, f) != (size_t)n) {
            free(b);
            b = NULL;
        }
        *len = n >= 0 ? (size_t)n : 0;
    }
    if (f) fclose(f);
    if (!b) fprintf(stderr, "bench: cannot read %s\n", path);
    return b;
}

/* Apparent size in bytes of a file or a directory tree (du -sb); -1 when unknown. */
static inline double bench_path_bytes(const char *path) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "du -sb --apparent-size '%s'", path);
    FILE *p = popen(cmd, "r");
    double v = -1;
    if (!p) return -1;
    if (fscanf(p, "%lf", &v) != 1) v = -1;
    if (pclose(p)) v = -1;
    return v;
}

static inline int bench_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return -1;
    }
    fputs(text, f);
    return fclose(f);
}

/* Seconds (metric NULL) or a metric of stage `id` in an fsdp-run report (--report); -1 when absent. */
static inline double bench_stage_field(const char *report, const char *id, const char *metric) {
    json_error_t je;
    json_t *j = json_load_file(report, 0, &je);
    if (!j) {
        fprintf(stderr, "bench: cannot read the run report %s: %s\n", report, je.text);
        return -1;
    }
    double v = -1;
    json_t *st = json_object_get(j, "stages");
    for (size_t i = 0; i < json_array_size(st); i++) {
        json_t *s = json_array_get(st, i);
        const char *sid = json_string_value(json_object_get(s, "id"));
        if (!sid || strcmp(sid, id)) continue;
        json_t *x = metric ? json_object_get(json_object_get(s, "metrics"), metric) : json_object_get(s, "seconds");
        if (json_is_number(x)) v = json_number_value(x);
    }
    json_decref(j);
    return v;
}

/* Calls on_line(obj, user) for every line of f that is a JSON object (other lines, e.g. warnings, go
 * to stderr). */
static inline void bench_json_stream(FILE *f, void (*on_line)(json_t *obj, void *user), void *user) {
    char line[16384];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j || !json_is_object(j)) {
            fputs(line, stderr);
            json_decref(j);
            continue;
        }
        on_line(j, user);
        json_decref(j);
    }
}

/* A benchmark's time budget (--budget SECONDS): the phases that would start after the deadline are
 * skipped, and a command still running at it is stopped (its process group: SIGTERM, then SIGKILL 5 s
 * later), so that the benchmark prints what it measured so far before an outer time limit. deadline 0:
 * none. */
typedef struct bench_budget {
    double deadline;
} bench_budget;

static inline void bench_budget_start(bench_budget *b, double seconds) {
    b->deadline = seconds > 0 ? bench_now() + seconds : 0;
}

/* 1 when the budget is spent (the next phase is not started: said on stdout, naming it) */
static inline int bench_budget_spent(const bench_budget *b, const char *phase) {
    if (!b->deadline || bench_now() < b->deadline) return 0;
    printf("bench: budget spent: %s not run\n", phase);
    fflush(stdout);
    return 1;
}

/* bench_sh within the budget: the exit status, or -1 (printed) when it failed or was stopped at the
 * deadline. */
static inline int bench_sh_budget(const bench_budget *b, const char *cmd) {
    if (!b->deadline) return bench_sh(cmd);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    int st = 0, stopped = 0;
    double killed_at = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0) return -1;
        double now = bench_now();
        if (!stopped && now >= b->deadline) {
            kill(-pid, SIGTERM);
            stopped = 1;
            killed_at = now;
        } else if (stopped && now - killed_at > 5) {
            kill(-pid, SIGKILL);
        }
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL);
    }
    if (stopped) {
        fprintf(stderr, "bench: '%s' stopped at the end of the budget\n", cmd);
        printf("bench: budget spent while running a phase: stopped\n");
        fflush(stdout);
        return -1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "bench: '%s' failed (%d)\n", cmd, st);
        return -1;
    }
    return 0;
}

/* Runs cmd and calls on_line(obj, user) for every line of its output that is a JSON object
 * (other lines, e.g. warnings, go to stderr). Returns the command's exit status (0 ok). */
static inline int bench_json_lines(const char *cmd, void (*on_line)(json_t *obj, void *user), void *user) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    bench_json_stream(p, on_line, user);
    return pclose(p);
}

#endif
