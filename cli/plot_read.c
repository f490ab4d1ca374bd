/* Metrics files (JSON lines of train-steps) into series for the plot. */
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/plot.h"
#include "runtime/fileio.h"

const char *const PLOT_KEYS[PLOT_N_VALUES] = {"loss",     "lr", "grad_norm", "tokens_per_s", "aux_loss",
                                              "expert_load_min_max", "eval_loss"};

/* A number, or the smallest number of an object's values (NaN without one). */
static double value_of(const json_t *x) {
    if (json_is_number(x)) return json_number_value(x);
    double m = NAN;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)x, key, v)
        if (json_is_number(v) && !(json_number_value(v) >= m)) m = json_number_value(v);
    return m;
}

void plot_set_free(plot_set *set) {
    for (size_t i = 0; i < set->n; i++) {
        free(set->s[i].step);
        for (int k = 0; k < PLOT_N_VALUES; k++) free(set->s[i].val[k]);
    }
    free(set->s);
    memset(set, 0, sizeof *set);
}

/* The series of (file, run id), created on first use. */
static plot_series *series_of(plot_set *set, size_t first, const char *label, const char *run_id) {
    for (size_t i = first; i < set->n; i++)
        if (!strcmp(set->s[i].run_id, run_id)) return &set->s[i];
    if (set->n == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 4;
        plot_series *ns = realloc(set->s, cap * sizeof *ns);
        if (!ns) return NULL;
        set->s = ns;
        set->cap = cap;
    }
    plot_series *s = &set->s[set->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->label, sizeof s->label, "%s", label);
    snprintf(s->run_id, sizeof s->run_id, "%s", run_id);
    return s;
}

static int series_add(plot_series *s, double step, const double *v) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        double *ns = realloc(s->step, cap * sizeof *ns);
        if (!ns) return -1;
        s->step = ns;
        for (int k = 0; k < PLOT_N_VALUES; k++) {
            double *nv = realloc(s->val[k], cap * sizeof *nv);
            if (!nv) return -1;
            s->val[k] = nv;
        }
        s->cap = cap;
    }
    s->step[s->n] = step;
    for (int k = 0; k < PLOT_N_VALUES; k++) s->val[k][s->n] = v[k];
    s->n++;
    return 0;
}

/* One line: {"step": N, "loss": ..., ...}; 0 when added (blank lines are skipped). */
static int read_line(const char *path, size_t lineno, const char *text, size_t len, plot_set *set, size_t first,
                     const char *base, fsdp_err *err) {
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return fsdp_err_set(err, FSDP_E_FORMAT, "plot: %s:%zu: not a JSON object (%s)", path, lineno,
                            j ? "another JSON value" : je.text);
    }
    json_t *st = json_object_get(j, "step");
    if (!json_is_number(st)) {
        json_decref(j);
        return fsdp_err_set(err, FSDP_E_FORMAT, "plot: %s:%zu: no numeric \"step\" (expected a train-steps metrics line)",
                            path, lineno);
    }
    double v[PLOT_N_VALUES];
    for (int k = 0; k < PLOT_N_VALUES; k++) {
        v[k] = value_of(json_object_get(j, PLOT_KEYS[k]));
    }
    const char *rid = json_string_value(json_object_get(j, "run_id"));
    plot_series *s = series_of(set, first, base, rid ? rid : "");
    int rc = !s || series_add(s, json_number_value(st), v) ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : 0;
    json_decref(j);
    return rc;
}

int plot_read(const char *path, plot_set *set, fsdp_err *err) {
    FILE *f;
    int rc = fio_fopen_read(path, NULL, &f, err);
    if (rc) return rc;
    char *dup = strdup(path);
    if (!dup) {
        fclose(f);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    const char *base = basename(dup);
    size_t first = set->n, lineno = 0, cap = 0;
    char *line = NULL;
    ssize_t got;
    while (!rc && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
        if (len) rc = read_line(path, lineno, line, len, set, first, base, err);
    }
    if (!rc && ferror(f)) rc = fsdp_err_set(err, FSDP_E_IO, "plot: %s: read error", path);
    if (!rc && set->n == first) rc = fsdp_err_set(err, FSDP_E_FORMAT, "plot: %s has no metrics lines", path);
    /* several runs in one file: each labelled with its run id */
    for (size_t i = first; !rc && set->n - first > 1 && i < set->n; i++) {
        plot_series *s = &set->s[i];
        char lab[sizeof s->label];
        snprintf(lab, sizeof lab, "%s %s", base, s->run_id[0] ? s->run_id : "(no run id)");
        memcpy(s->label, lab, sizeof lab);
    }
    free(line);
    free(dup);
    fclose(f);
    return rc;
}
