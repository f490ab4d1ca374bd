/* The run report (run/report.h). */
#include "run/report.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fsdp/stage.h"
#include "runtime/tmpfile.h"

int report_add_record(run_result *r, const char *recipe, const char *id, const char *stage) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        run_record *nr = realloc(r->recs, cap * sizeof *nr);
        if (!nr) return FSDP_E_NOMEM;
        r->recs = nr;
        r->cap = cap;
    }
    run_record *rec = &r->recs[r->n];
    memset(rec, 0, sizeof *rec);
    rec->recipe = strdup(recipe);
    rec->id = strdup(id);
    rec->stage = strdup(stage);
    rec->status = "pending";
    if (!rec->recipe || !rec->id || !rec->stage) {
        free(rec->recipe);
        free(rec->id);
        free(rec->stage);
        return FSDP_E_NOMEM;
    }
    r->n++;
    return 0;
}

int report_add_recipe(run_result *r, const char *name, const char *path) {
    char **nn = realloc(r->recipes, (r->n_recipes + 1) * sizeof *nn);
    if (!nn) return FSDP_E_NOMEM;
    r->recipes = nn;
    char **np = realloc(r->recipe_paths, (r->n_recipes + 1) * sizeof *np);
    if (!np) return FSDP_E_NOMEM;
    r->recipe_paths = np;
    r->recipes[r->n_recipes] = strdup(name);
    r->recipe_paths[r->n_recipes] = strdup(path);
    r->n_recipes++;
    return 0;
}

int report_add_not_run(run_result *r, const char *recipe, const char *id, const char *stage, const char *when) {
    run_not_run *nn = realloc(r->not_run, (r->n_not_run + 1) * sizeof *nn);
    if (!nn) return FSDP_E_NOMEM;
    r->not_run = nn;
    run_not_run *k = &nn[r->n_not_run];
    k->recipe = strdup(recipe);
    k->id = strdup(id);
    k->stage = strdup(stage);
    k->when = strdup(when);
    r->n_not_run++;
    return k->recipe && k->id && k->stage && k->when ? 0 : FSDP_E_NOMEM;
}

void report_free(run_result *r) {
    for (int i = 0; i < r->n_hosts; i++) free(r->hosts[i]);
    free(r->hosts);
    for (size_t i = 0; i < r->n; i++) {
        free(r->recs[i].recipe);
        free(r->recs[i].id);
        free(r->recs[i].stage);
        free(r->recs[i].error);
        ctx_metrics_free(&r->recs[i].metrics);
        for (size_t k = 0; k < r->recs[i].n_ranks; k++) free(r->recs[i].ranks[k].name);
        free(r->recs[i].ranks);
    }
    free(r->recs);
    for (size_t i = 0; i < r->n_recipes; i++) {
        free(r->recipes[i]);
        free(r->recipe_paths[i]);
    }
    free(r->recipes);
    free(r->recipe_paths);
    for (size_t i = 0; i < r->n_not_run; i++) {
        free(r->not_run[i].recipe);
        free(r->not_run[i].id);
        free(r->not_run[i].stage);
        free(r->not_run[i].when);
    }
    free(r->not_run);
    free(r->error);
    memset(r, 0, sizeof *r);
}

static json_t *iso_time(double t) {
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    char buf[64];
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)((t - (double)s) * 1000));
    return json_string(buf);
}

/* The stages a false `when:` removed: [{recipe, id, stage, when}]. */
static json_t *not_run_json(const run_result *r) {
    json_t *nr = json_array();
    for (size_t i = 0; nr && i < r->n_not_run; i++) {
        const run_not_run *k = &r->not_run[i];
        json_array_append_new(nr, json_pack("{s:s, s:s, s:s, s:s}", "recipe", k->recipe, "id", k->id, "stage", k->stage,
                                            "when", k->when));
    }
    return nr;
}

int report_write(const run_result *r, const char *path, fsdp_err *err) {
    json_t *root = json_object();
    json_t *recipes = json_array();
    json_t *stages = json_array();
    if (!root || !recipes || !stages) {
        json_decref(root);
        json_decref(recipes);
        json_decref(stages);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    json_object_set_new(root, "fsdp_run_version", json_string(FSDP_VERSION_STRING));
    if (r->run_id[0]) json_object_set_new(root, "run_id", json_string(r->run_id));
    for (size_t i = 0; i < r->n_recipes; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(r->recipes[i]));
        json_object_set_new(o, "path", json_string(r->recipe_paths[i]));
        json_array_append_new(recipes, o);
    }
    json_object_set_new(root, "recipes", recipes);
    json_object_set_new(root, "start_time", iso_time(r->start_wall));
    json_object_set_new(root, "end_time", iso_time(r->end_wall));
    json_object_set_new(root, "seconds", json_real(r->end_wall - r->start_wall));
    json_object_set_new(root, "world_size", json_integer(r->world_size));
    if (r->n_hosts) {
        json_t *h = json_array();
        for (int i = 0; i < r->n_hosts; i++) json_array_append_new(h, json_string(r->hosts[i] ? r->hosts[i] : "?"));
        json_object_set_new(root, "hosts", h);
        json_object_set_new(root, "nodes", json_integer(r->nodes));
    }
    if (r->mesh_r) {
        json_t *m = json_object();
        json_object_set_new(m, "replicate", json_integer(r->mesh_r));
        json_object_set_new(m, "shard", json_integer(r->mesh_s));
        json_object_set_new(root, "mesh", m);
    }
    json_object_set_new(root, "exit_code", json_integer(r->exit_code));
    json_object_set_new(root, "status", json_string(r->exit_code == 0 ? "ok" : r->error ? "invalid" : "failed"));
    if (r->error) json_object_set_new(root, "error", json_string(r->error));
    for (size_t i = 0; i < r->n; i++) {
        const run_record *rec = &r->recs[i];
        json_t *o = json_object();
        json_object_set_new(o, "recipe", json_string(rec->recipe));
        json_object_set_new(o, "id", json_string(rec->id));
        json_object_set_new(o, "stage", json_string(rec->stage));
        json_object_set_new(o, "status", json_string(rec->status));
        json_object_set_new(o, "seconds", json_real(rec->seconds));
        json_t *m = json_object();
        for (size_t k = 0; k < rec->metrics.n; k++) {
            const ctx_metric *cm = &rec->metrics.items[k];
            json_object_set_new(m, cm->name, cm->is_str ? json_string(cm->str) : json_real(cm->num));
        }
        json_object_set_new(o, "metrics", m);
        if (rec->n_ranks) {
            /* every rank's metrics: min / max / mean over the ranks that reported each */
            json_t *rk = json_object();
            for (size_t k = 0; k < rec->n_ranks; k++) {
                const report_rank_stat *s = &rec->ranks[k];
                json_object_set_new(rk, s->name, json_pack("{s:f, s:f, s:f, s:i}", "min", s->min, "max", s->max, "mean",
                                                           s->sum / s->n, "ranks", s->n));
            }
            json_object_set_new(o, "ranks", rk);
        }
        if (rec->error) json_object_set_new(o, "error", json_string(rec->error));
        json_array_append_new(stages, o);
    }
    json_object_set_new(root, "stages", stages);
    if (r->n_not_run) json_object_set_new(root, "not_run", not_run_json(r));
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    if (!tmp) {
        json_decref(root);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    snprintf(tmp, plen + 8, "%s.tmp", path);
    int rc = 0;
    /* tmp + rename, never blocking on a FIFO where tmp should go (runtime/tmpfile.h) */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (!text) rc = fsdp_err_set(err, FSDP_E_NOMEM, "report %s: out of memory", path);
    else if ((rc = tmpf_write_replace(tmp, path, text, strlen(text), "report", err)))
        fsdp_err_prefix(err, "report %s", path);
    free(text);
    free(tmp);
    json_decref(root);
    return rc;
}
