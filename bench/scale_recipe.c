/* Growth of recipe loading and validation with the recipe's size: each case is loaded and validated
 * (run_plan_build, as `fsdp-run validate` does, plus the --dry-run printing for maps) at n, 2n, 4n
 * and 8n, and the ratio of each time to the one before is printed: about 2 per doubling for linear
 * work, 4 for quadratic. CPU seconds of this process (getrusage, the least of three runs), so other
 * load on the machine does not disturb the ratios much; the wall clock of that run is printed too.
 *
 *   build/bench/scale_recipe [--n N]      (default N 125000: the largest case is 1M)
 *
 * Cases:
 *   map       a `vars:` map of n keys (key lookups, duplicate-key detection), printed as --dry-run does
 *   list      a `vars:` list of n scalars
 *   stages    n stages, each after the previous (stage ids, the DAG, schema checks and defaults)
 *   vars      n `${var}` references to one variable
 *   include   a file of n keys included by one that overrides every key (the merge of includes)
 * The last line is JSON: every time and ratio. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_util.h"
#include "pipeline/registry.h"
#include "run/run.h"

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec * 1e-6 + (double)r.ru_stime.tv_sec +
           (double)r.ru_stime.tv_usec * 1e-6;
}

/* Writes the recipe of `kind` with n entries under dir; returns the path to load (static buffer). */
static const char *write_case(const char *dir, const char *kind, long n) {
    static char top[4096];
    char path[4096];
    snprintf(top, sizeof top, "%s/%s-%ld.yaml", dir, kind, n);
    snprintf(path, sizeof path, "%s/%s-%ld-base.yaml", dir, kind, n);
    FILE *f = fopen(!strcmp(kind, "include") ? path : top, "w");
    if (!f) return NULL;
    if (!strcmp(kind, "map")) {
        fputs("vars:\n", f);
        for (long i = 0; i < n; i++) fprintf(f, "  k%ld: %ld\n", i, i);
        fputs("stages:\n  - {id: a, uses: init-meta}\n", f);
    } else if (!strcmp(kind, "list")) {
        fputs("vars:\n  items:\n", f);
        for (long i = 0; i < n; i++) fprintf(f, "    - %ld\n", i);
        fputs("stages:\n  - {id: a, uses: init-meta}\n", f);
    } else if (!strcmp(kind, "stages")) {
        fputs("stages:\n  - {id: s0, uses: init-meta}\n", f);
        for (long i = 1; i < n; i++) fprintf(f, "  - {id: s%ld, uses: verify}\n", i);
    } else if (!strcmp(kind, "vars")) {
        fputs("vars:\n  v: /data/run\n  uses:\n", f);
        for (long i = 0; i < n; i++) fprintf(f, "    - \"${v}/%ld\"\n", i);
        fputs("stages:\n  - {id: a, uses: init-meta}\n", f);
    } else { /* include */
        fputs("vars:\n", f);
        for (long i = 0; i < n; i++) fprintf(f, "  k%ld: %ld\n", i, i);
        fputs("stages:\n  - {id: a, uses: init-meta}\n", f);
        fclose(f);
        if (!(f = fopen(top, "w"))) return NULL;
        fprintf(f, "include: [%s]\nvars:\n", path);
        for (long i = 0; i < n; i++) fprintf(f, "  k%ld: %ld\n", i, -i);
    }
    return fclose(f) ? NULL : top;
}

/* Load + validate (+ print for maps) of one recipe; CPU seconds, or -1 on an error. */
static double time_case(fsdp_registry *reg, const char *kind, const char *path, double *wall) {
    run_opts o;
    memset(&o, 0, sizeof o);
    o.validate_only = 1;
    run_plan plan;
    fsdp_err err;
    fsdp_err_clear(&err);
    double c0 = cpu_seconds(), w0 = bench_now();
    if (run_plan_build(reg, &path, 1, &o, &plan, &err)) {
        fprintf(stderr, "scale_recipe: %s: %s\n", kind, err.msg);
        return -1;
    }
    if (!strcmp(kind, "map")) {
        FILE *null = fopen("/dev/null", "w");
        if (null) {
            run_plan_print(&plan, null);
            fclose(null);
        }
    }
    run_plan_free(&plan);
    *wall = bench_now() - w0;
    return cpu_seconds() - c0;
}

int main(int argc, char **argv) {
    long n0 = 125000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n0 = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--n N]\n", argv[0]);
            return 2;
        }
    }
    if (n0 < 1) n0 = 1;
    char dir[] = "/tmp/fsdp-scale-recipe-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    fsdp_registry *reg = registry_new();
    fsdp_err err;
    if (!reg || registry_add_builtins(reg, &err)) {
        fprintf(stderr, "scale_recipe: cannot register the stages\n");
        return 1;
    }
    static const char *const kinds[] = {"map", "list", "stages", "vars", "include"};
    enum { NK = 5, NS = 4 };
    double t[NK][NS];
    int rc = 0;
    printf("%-8s %10s %10s %10s %8s\n", "case", "n", "cpu s", "wall s", "ratio");
    for (int k = 0; k < NK && !rc; k++) {
        for (int s = 0; s < NS && !rc; s++) {
            long n = n0 << s;
            const char *path = write_case(dir, kinds[k], n);
            /* the least of three runs: the machine's other load only ever adds */
            double wall = 0, best_wall = 0;
            t[k][s] = -1;
            for (int rep = 0; rep < 3 && path; rep++) {
                double c = time_case(reg, kinds[k], path, &wall);
                if (c < 0) {
                    t[k][s] = -1;
                    break;
                }
                if (t[k][s] < 0 || c < t[k][s]) {
                    t[k][s] = c;
                    best_wall = wall;
                }
            }
            wall = best_wall;
            if (t[k][s] < 0) {
                rc = 1;
                break;
            }
            if (s) printf("%-8s %10ld %10.3f %10.3f %8.2f\n", kinds[k], n, t[k][s], wall, t[k][s] / t[k][s - 1]);
            else printf("%-8s %10ld %10.3f %10.3f %8s\n", kinds[k], n, t[k][s], wall, "-");
            fflush(stdout);
        }
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_sh(cmd);
    registry_free(reg);
    if (rc) return rc;
    printf("{\"bench\": \"scale_recipe\", \"n\": %ld", n0);
    for (int k = 0; k < NK; k++) {
        printf(", \"%s\": {\"cpu_s\": [", kinds[k]);
        for (int s = 0; s < NS; s++) printf("%s%.4f", s ? ", " : "", t[k][s]);
        printf("], \"ratio_per_doubling\": [");
        for (int s = 1; s < NS; s++) printf("%s%.3f", s > 1 ? ", " : "", t[k][s] / t[k][s - 1]);
        printf("]}");
    }
    printf("}\n");
    return 0;
}
