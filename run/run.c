/* Planner and scheduler: validate the whole chain of recipes, then run the stages in
 * topological order in one context; a failing stage stops the run (later ones skipped). */
#include "run/run.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/time.h>
#include <unistd.h>

#include "decoder/decoder_config.h"
#include "run/checks.h"
#include "pipeline/dag.h"
#include "runtime/launch.h"
#include "run/run_mesh.h"
#include "train/data.h"
#include "runtime/device.h"
#include "pipeline/registry.h"
#include "run/report.h"
#include "runtime/memstat.h"
#include "run/report_ranks.h"
#include "pipeline/schema.h"
#include "run/sizes.h"
#include "runtime/ctx_impl.h"
#include "runtime/nearest.h"
#include "runtime/state_defer.h"

static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};
static const fsdp_param_spec RUNTIME_SPEC[] = {
    {"device", FSDP_T_STRING, 0, "auto", DEVICES, "auto = cuda when every rank has a GPU of its own, else cpu"},
    {"seed", FSDP_T_INT, 0, "0", NULL, "seed of every random stream (init, data)"},
    {"threads", FSDP_T_INT, 0, "0", NULL, "OpenMP threads per rank (0 = OpenMP's default)"},
    {"collective_timeout", FSDP_T_FLOAT, 0, "300", NULL,
     "seconds a plugin's collective call waits for every rank to make it before it fails the run, naming the "
     "call and the ranks that did"},
    {"stream", FSDP_T_BOOL, 0, "true", NULL,
     "parameter values that no stage before a save needs are not held: init-meta's draws and load-ckpt's rows are "
     "produced into the save's write buffers (false: every value is materialised where it is made)"},
    {"mesh", FSDP_T_MAP, 0, NULL, NULL,
     "HSDP device mesh {replicate: R, shard: S} (each a number of ranks or auto; R x S = the world): parameters "
     "sharded over S ranks (shard: auto = the ranks of one node), replicated over R; default: 1-D, shard over all"},
    {NULL, 0, 0, NULL, NULL, NULL}};

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

void run_plan_free(run_plan *plan) {
    for (size_t i = 0; i < plan->n; i++) {
        recipe_free(plan->recipes[i]);
        free(plan->orders[i]);
        if (plan->notes) free(plan->notes[i]);
    }
    free(plan->recipes);
    free(plan->orders);
    free(plan->notes);
    memset(plan, 0, sizeof *plan);
}

/* runtime.device: cuda needs a CUDA build and a visible GPU: known before any stage runs. (Whether
 * every rank has a GPU of its own is found collectively when the first stage asks, stages/device.c.) */
static int check_device(const fsdp_value *rt, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(rt, "device");
    const char *dev = fsdp_value_text(v);
    if (!dev || strcmp(dev, "cuda")) return 0;
    if (!dev_built_with_cuda())
        return fsdp_err_at(err, FSDP_E_INVALID, v,
                           "runtime.device is cuda, but this fsdp-run was built without CUDA (rebuild with the CUDA "
                           "toolkit, or use device: cpu or auto)");
    int n = 0;
    fsdp_err e2;
    fsdp_err_clear(&e2);
    if (dev_count(&n, &e2))
        return fsdp_err_at(err, FSDP_E_INVALID, v, "runtime.device is cuda, but no GPU is usable here: %s (use device: "
                           "cpu or auto)", e2.msg);
    return 0;
}

/* The runtime section (schema, device), then the sizes of the runtime, model and data sections
 * against their bounds and the host (run/sizes.h): every error found, one per line. */
static int check_runtime(recipe *r, int probe_device, sizes_host *host, sizes_chain *chain, fsdp_err *err) {
    fsdp_value *rt = val_get_mut(r->root, "runtime");
    if (!rt || fsdp_value_type(rt) == FSDP_V_NULL) {
        fsdp_value *m = val_new(FSDP_V_MAP, r->path, 1, 1);
        if (!m || val_map_set(r->root, "runtime", m, 1, 1)) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        rt = val_get_mut(r->root, "runtime");
    }
    errlist el;
    errlist_init(&el);
    fsdp_err e;
    fsdp_err_clear(&e);
    if (schema_check_map("runtime", RUNTIME_SPEC, rt, rt, &e)) {
        errlist_add(&el, &e);
    } else {
        if (probe_device && check_device(rt, &e)) errlist_add(&el, &e);
        const fsdp_value *ct = fsdp_value_get(rt, "collective_timeout");
        double cts = fsdp_arg_float(rt, "collective_timeout", CTX_API_TIMEOUT_DEFAULT);
        if (ct && !(cts > 0 && cts <= 86400)) {
            fsdp_err_at(&e, FSDP_E_INVALID, ct, "runtime.collective_timeout: expected seconds in (0, 86400], got %g", cts);
            errlist_add(&el, &e);
        }
    }
    fsdp_err_clear(&e);
    if (run_mesh_check(rt, host, &e)) errlist_add(&el, &e);
    sizes_check(r, host, chain, &el);
    return errlist_finish(&el, err);
}

/* Every stage's kind and schema; 0 when every stage is known (so the recipe can be planned). */
static int check_stages(fsdp_registry *reg, recipe *r, errlist *el) {
    int unknown = 0;
    fsdp_err e;
    for (size_t s = 0; s < r->n_stages; s++) {
        recipe_stage *st = &r->stages[s];
        fsdp_err_clear(&e);
        st->desc = registry_find(reg, st->uses);
        if (!st->desc) {
            char known[2048] = "";
            size_t off = 0;
            for (size_t k = 0; k < registry_count(reg) && off < sizeof known; k++)
                off += (size_t)snprintf(known + off, sizeof known - off, "%s%s", k ? ", " : "", registry_at(reg, k)->name);
            char hint[300];
            fsdp_err_at(&e, FSDP_E_INVALID, st->uses_node,
                        "stage '%s': unknown stage '%s'%s (registered stages: %s; plugins add more)", st->id, st->uses,
                        nearest_hint(st->uses, known, hint, sizeof hint), off ? known : "none");
            errlist_add(el, &e);
            unknown = 1;
            continue;
        }
        if (schema_check(st->desc, st->id, st->node, st->with, &e)) errlist_add(el, &e);
    }
    return unknown;
}

static void check_plugins(fsdp_registry *reg, const recipe *r, errlist *el) {
    fsdp_err e;
    for (size_t p = 0; p < r->n_plugins; p++) {
        fsdp_err_clear(&e);
        if (registry_load_plugin(reg, r->plugins[p], &e)) {
            char msg[FSDP_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", e.msg);
            fsdp_err_at(&e, FSDP_E_INVALID, r->plugin_vals[p], "%s", msg);
            errlist_add(el, &e);
        }
    }
}

/* Validates every recipe of the chain and plans it: every error found is reported (one per line),
 * not only the first; the chain stops at a recipe that cannot be loaded or planned (the recipes after
 * it continue a state that is not known). */
int run_plan_build(fsdp_registry *reg, const char *const *paths, size_t n, const run_opts *o, run_plan *plan,
                   fsdp_err *err) {
    memset(plan, 0, sizeof *plan);
    recipe_override *ovr = calloc(o->n_sets ? o->n_sets : 1, sizeof *ovr);
    plan->recipes = calloc(n ? n : 1, sizeof *plan->recipes);
    plan->orders = calloc(n ? n : 1, sizeof *plan->orders);
    plan->notes = calloc(n ? n : 1, sizeof *plan->notes);
    if (!ovr || !plan->recipes || !plan->orders || !plan->notes) {
        free(ovr);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < o->n_sets; i++) ovr[i].arg = o->sets[i];
    dag_state state = {0};
    errlist el;
    errlist_init(&el);
    fsdp_err e;
    int stop = 0;
    /* `validate` and --dry-run check recipes meant for another machine: no device probe */
    int probe = !o->validate_only && !o->dry_run;
    sizes_host host;
    sizes_host_probe(&host, launch_world(o->comm ? comm_size(o->comm) : 1), probe);
    host.ranks_per_node = run_ranks_per_node(o->comm, host.world);
    sizes_chain chain = {0};
    for (size_t i = 0; i < n && !stop; i++) {
        recipe *r;
        fsdp_err_clear(&e);
        if (recipe_load(paths[i], ovr, o->n_sets, &r, &e)) {
            errlist_add(&el, &e);
            break;
        }
        plan->recipes[plan->n] = r;
        plan->n++;
        for (size_t k = 0; k < r->n_defects; k++) errlist_add(&el, &r->defects[k]);
        check_plugins(reg, r, &el);
        const fsdp_value *prev_model = chain.model_node;
        fsdp_err_clear(&e);
        sizes_host rh = host; /* with this recipe's mesh */
        if (check_runtime(r, probe, &rh, &chain, &e)) errlist_add(&el, &e);
        else if (o->dry_run && (plan->notes[i] = malloc(2048)))
            sizes_describe(r, &rh, &chain, plan->notes[i], 2048);
        stop = check_stages(reg, r, &el);
        stop |= dag_check_graph(r, &el); /* unknown after: ids and cycles, beside unknown kinds */
        checks_recipe(r, &rh, prev_model, &el);
        checks_inputs((const recipe *const *)plan->recipes, i, r, &rh, &el);
        stop |= r->n_defects > 0; /* a duplicate id: reported with the rest; nothing is planned */
        if (stop) break;
        plan->orders[i] = calloc(r->n_stages ? r->n_stages : 1, sizeof(size_t));
        if (!plan->orders[i]) {
            fsdp_err_set(&e, FSDP_E_NOMEM, "out of memory");
            errlist_add(&el, &e);
            break;
        }
        dag_state next = {0};
        for (size_t k = 0; k < state.n; k++) dag_state_add(&next, state.names[k]);
        fsdp_err_clear(&e);
        if (dag_plan(r, reg, &state, plan->orders[i], &next, &e)) {
            errlist_add(&el, &e);
            stop = 1;
        }
        dag_state_free(&state);
        state = next;
    }
    for (size_t i = 0; plan->n == n && i < o->n_sets; i++) {
        if (!ovr[i].applied) {
            const char *eq = strchr(ovr[i].arg, '=');
            fsdp_err_set(&e, FSDP_E_INVALID, "--set %s: no recipe has a stage with the id in '%.*s'", ovr[i].arg,
                         eq ? (int)(eq - ovr[i].arg) : (int)strlen(ovr[i].arg), ovr[i].arg);
            errlist_add(&el, &e);
        }
    }
    dag_state_free(&state);
    free(ovr);
    int rc = errlist_finish(&el, err);
    if (rc) {
        if (err->code != FSDP_E_NOMEM) err->code = FSDP_E_INVALID;
        rc = err->code;
        run_plan_free(plan);
    }
    return rc;
}

void run_plan_print(const run_plan *plan, FILE *out) {
    for (size_t i = 0; i < plan->n; i++) {
        const recipe *r = plan->recipes[i];
        fprintf(out, "recipe %s (%s)\n", r->name, r->path);
        const char *sections[] = {"runtime", "model", "data", "vars"};
        for (size_t k = 0; k < 4; k++) {
            const fsdp_value *v = fsdp_value_get(r->root, sections[k]);
            if (!v || fsdp_value_size(v) == 0) continue;
            char *t = val_to_flow(v);
            fprintf(out, "  %s: %s\n", sections[k], t ? t : "?");
            free(t);
        }
        if (plan->notes && plan->notes[i]) fputs(plan->notes[i], out);
        for (size_t k = 0; k < r->n_stages; k++) {
            const recipe_stage *s = &r->stages[plan->orders[i][k]];
            fprintf(out, "  %zu. %s (%s)", k + 1, s->id, s->uses);
            if (s->n_after) {
                fprintf(out, " after ");
                for (size_t a = 0; a < s->n_after; a++) fprintf(out, "%s%s", a ? ", " : "", s->after[a]);
            }
            char *t = val_to_flow(s->with);
            fprintf(out, "\n     with: %s\n", t ? t : "?");
            free(t);
        }
        for (size_t k = 0; k < r->n_skipped; k++)
            fprintf(out, "  (not run: %s (%s): when: %s is false)\n", r->skipped[k].id, r->skipped[k].uses,
                    r->skipped[k].when);
    }
}

/* The run's id and start time, rank 0's on every rank. */
static void set_run_id(fsdp_ctx *ctx, comm *cm, double start) {
    struct {
        double start;
        uint32_t random;
    } id = {start, 0};
    if (getrandom(&id.random, sizeof id.random, GRND_NONBLOCK) != (ssize_t)sizeof id.random)
        id.random = (uint32_t)getpid() ^ (uint32_t)((start - (double)(long)start) * 4294967296.0);
    fsdp_err e;
    if (cm && comm_size(cm) > 1) comm_bcast(cm, &id, sizeof id, 0, &e); /* on failure: this rank's own */
    ctx_set_run(ctx, id.start, id.random);
}

/* One record per stage, in execution order, so a failure can mark the rest skipped; then the stages a
 * false `when:` removed. */
static int add_records(const run_plan *plan, run_result *res) {
    for (size_t i = 0; i < plan->n; i++) {
        const recipe *r = plan->recipes[i];
        report_add_recipe(res, r->name, r->path);
        for (size_t k = 0; k < r->n_stages; k++) {
            const recipe_stage *s = &r->stages[plan->orders[i][k]];
            if (report_add_record(res, r->name, s->id, s->uses)) return FSDP_E_NOMEM;
        }
        for (size_t k = 0; k < r->n_skipped; k++) {
            const recipe_skipped *sk = &r->skipped[k];
            if (report_add_not_run(res, r->name, sk->id, sk->uses, sk->when)) return FSDP_E_NOMEM;
        }
    }
    return 0;
}

/* What execute carries from stage to stage: the run's record index and whether a stage failed. */
typedef struct exec_state {
    fsdp_ctx *ctx;
    run_result *res;
    const run_opts *o;
    size_t rec; /* the record of the stage at hand (res->recs[rec]) */
    int failed;
    int stream;          /* the recipe's runtime.stream */
    size_t streams_from; /* the first record from which every stage to the end reads deferred values */
} exec_state;

/* The built-in stages that read deferred parameter values (runtime/state_defer.h) or never read values:
 * before any other stage every deferred value is materialised. */
static const char *const DEFERRED_OK[] = {"init-meta", "init-cpu", "load-ckpt", "transform", "save-dcp",
                                          "save-safetensors", NULL};

static int reads_deferred(const recipe_stage *s) {
    for (const char *const *k = DEFERRED_OK; *k; k++)
        if (!strcmp(s->uses, *k)) return 1;
    return 0;
}

/* The record index from which every stage of the plan, to the end, reads deferred values. */
static size_t streams_from(const run_plan *plan) {
    size_t total = 0, from = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const recipe *r = plan->recipes[i];
        for (size_t k = 0; k < r->n_stages; k++, total++)
            if (!reads_deferred(&r->stages[plan->orders[i][k]])) from = total + 1;
    }
    return from;
}

/* Before a stage that reads values as they are held: every deferred value materialised. */
static int materialise_for(exec_state *x, const recipe_stage *s, fsdp_err *err) {
    fsdp_state *st = state_get(x->ctx);
    if (reads_deferred(s) || !state_deferred_count(st)) return 0;
    size_t n = 0;
    int rc = state_materialize(st, &n, err);
    if (rc) return fsdp_err_prefix(err, "materialising the deferred parameter values for %s", s->uses);
    fsdp_log(x->ctx, FSDP_LOG_DEBUG, "stage %s (%s): %zu deferred parameter values materialised", s->id, s->uses, n);
    return 0;
}

/* A recipe starts: the context points at it, its thread count applies, and (unless a stage failed)
 * its stages and those a false `when:` removed are logged. */
static void begin_recipe(exec_state *x, const recipe *r) {
    fsdp_ctx *ctx = x->ctx;
    ctx->root = r->root;
    ctx->recipe_name = r->name;
    ctx->recipe_path = r->path;
    const fsdp_value *rt = fsdp_value_get(r->root, "runtime");
    int64_t threads = fsdp_arg_int(rt, "threads", 0);
    if (threads > 0) omp_set_num_threads((int)threads);
    ctx->api_timeout_s = fsdp_arg_float(rt, "collective_timeout", CTX_API_TIMEOUT_DEFAULT);
    x->stream = fsdp_arg_bool(rt, "stream", 1);
    if (!x->failed) fsdp_log(ctx, FSDP_LOG_INFO, "recipe %s (%s): %zu stages", r->name, r->path, r->n_stages);
    /* the recipe's mesh (collective: every rank reaches here, failed or not, in the same order) */
    fsdp_err merr;
    fsdp_err_clear(&merr);
    if (run_mesh_setup(ctx, rt, &merr)) {
        if (!x->failed) fsdp_log(ctx, FSDP_LOG_ERROR, "recipe %s: %s", r->name, merr.msg);
        x->failed = 1;
        if (x->res->n > x->rec && !x->res->recs[x->rec].error) x->res->recs[x->rec].error = strdup(merr.msg);
    }
    if (ctx->mesh) x->res->mesh_r = ctx->mesh->R, x->res->mesh_s = ctx->mesh->S;
    else x->res->mesh_r = 0, x->res->mesh_s = 0;
    for (size_t k = 0; k < r->n_skipped && !x->failed; k++)
        fsdp_log(ctx, FSDP_LOG_INFO, "stage %s (%s) not run: when: %s is false", r->skipped[k].id, r->skipped[k].uses,
                 r->skipped[k].when);
}

/* A stage failed: its record says why; with several ranks the report is written and the whole
 * job ends (the others may wait in one of its collectives). */
static void stage_failed(exec_state *x, const recipe_stage *s, run_record *rr, int rc, fsdp_err *err) {
    fsdp_ctx *ctx = x->ctx;
    run_result *res = x->res;
    if (!err->msg[0]) snprintf(err->msg, sizeof err->msg, "failed (%s)", fsdp_err_code_name(rc));
    rr->status = "failed";
    rr->error = strdup(err->msg);
    fsdp_log(ctx, FSDP_LOG_ERROR, "stage %s (%s) failed: %s", s->id, s->uses, err->msg);
    x->failed = 1;
    if (ctx->world > 1) {
        /* The other ranks may be waiting in a collective of this stage: write what
         * this rank knows, then end the whole job rather than let it hang. */
        for (size_t q = x->rec + 1; q < res->n; q++) res->recs[q].status = "skipped";
        res->end_wall = wall_now();
        res->exit_code = 1;
        if (x->o->report) {
            fsdp_err e2;
            report_write(res, x->o->report, &e2);
        }
        fsdp_log(ctx, FSDP_LOG_ERROR, "rank %d failed: ending the job (%d ranks)", ctx->rank, ctx->world);
        comm_abort(ctx->comm, 1);
    }
}

/* A stage succeeded: every rank's metrics to the report, async saves committed, what it provides
 * set in the context. */
static void stage_succeeded(exec_state *x, const recipe_stage *s, run_record *rr, fsdp_err *err) {
    fsdp_ctx *ctx = x->ctx;
    rr->status = "ok";
    if (ctx->world > 1) {
        /* every rank's metrics of the stage, to rank 0's report (collective) */
        fsdp_err ge;
        if (report_gather_ranks(ctx->comm, &rr->metrics, rr, &ge))
            fsdp_log(ctx, FSDP_LOG_WARN, "stage %s: the other ranks' metrics are not in the report: %s", s->id, ge.msg);
    }
    /* an async save whose files are all written is committed now, before the next stage */
    if (ctx->n_fin && ctx_poll_finishers(ctx, err)) {
        rr->status = "failed";
        rr->error = strdup(err->msg);
        fsdp_log(ctx, FSDP_LOG_ERROR, "background save after stage %s failed: %s", s->id, err->msg);
        x->failed = 1;
        return;
    }
    for (const char *const *p = s->desc->provides; p && *p; p++) fsdp_ctx_set_state(ctx, *p, 1);
    fsdp_log(ctx, FSDP_LOG_INFO, "stage %s (%s) done in %.2fs", s->id, s->uses, rr->seconds);
}

/* Runs one stage into its record (timed, with the peak RSS), or marks it skipped after a failure. */
static void run_stage(exec_state *x, const recipe_stage *s) {
    fsdp_ctx *ctx = x->ctx;
    run_record *rr = &x->res->recs[x->rec];
    if (x->failed) {
        rr->status = "skipped";
        return;
    }
    ctx->stage_id = s->id;
    ctx->stage_uses = s->uses;
    ctx->metrics = &rr->metrics;
    fsdp_log(ctx, FSDP_LOG_INFO, "stage %s (%s) ...", s->id, s->uses);
    fsdp_err err;
    fsdp_err_clear(&err);
    double t0 = ctx_now();
    ctx->stage_with = s->with;
    ctx->defer_ok = x->stream && x->rec + 1 >= x->streams_from;
    int rc = materialise_for(x, s, &err);
    if (!rc) rc = s->desc->run(ctx, s->with, &err);
    ctx->stage_with = NULL;
    ctx->defer_ok = 0;
    if (!rc && err.code) rc = err.code;
    rr->seconds = ctx_now() - t0;
    double rss = memstat_peak_rss();
    if (rss >= 0) fsdp_ctx_metric(ctx, "peak_rss_bytes", rss);
    ctx_progress_close(ctx);
    ctx->metrics = NULL;
    if (rc) stage_failed(x, s, rr, rc, &err);
    else stage_succeeded(x, s, rr, &err);
}

/* Background work (async saves) completes before the run ends, failed or not; its failure fails
 * the last stage that succeeded. */
static void finish_background(exec_state *x) {
    fsdp_ctx *ctx = x->ctx;
    run_result *res = x->res;
    fsdp_err ferr;
    fsdp_err_clear(&ferr);
    if (ctx->n_fin && ctx_run_finishers(ctx, &ferr)) {
        fsdp_log(ctx, FSDP_LOG_ERROR, "background work failed: %s", ferr.msg);
        for (size_t q = res->n; q-- > 0;) {
            if (!strcmp(res->recs[q].status, "ok")) {
                res->recs[q].status = "failed";
                free(res->recs[q].error);
                res->recs[q].error = strdup(ferr.msg);
                break;
            }
        }
        x->failed = 1;
    }
}

static int execute(fsdp_ctx *ctx, const run_plan *plan, run_result *res, const run_opts *o) {
    if (add_records(plan, res)) return FSDP_E_NOMEM;
    exec_state x = {ctx, res, o, 0, 0, 1, streams_from(plan)};
    for (size_t i = 0; i < plan->n; i++) {
        const recipe *r = plan->recipes[i];
        begin_recipe(&x, r);
        for (size_t k = 0; k < r->n_stages; k++, x.rec++) run_stage(&x, &r->stages[plan->orders[i][k]]);
    }
    ctx->stage_id = NULL;
    ctx->stage_uses = NULL;
    finish_background(&x);
    return x.failed ? FSDP_E_RUNTIME : 0;
}

/* `validate`'s line per recipe: the stages in order, then those a false `when:` removed. */
static void print_valid(const run_plan *plan, FILE *out) {
    for (size_t i = 0; i < plan->n; i++) {
        const recipe *r = plan->recipes[i];
        fprintf(out, "%s: valid (recipe %s, %zu stages:", r->path, r->name, r->n_stages);
        for (size_t k = 0; k < r->n_stages; k++)
            fprintf(out, "%s%s", k ? " -> " : " ", r->stages[plan->orders[i][k]].id);
        for (size_t k = 0; k < r->n_skipped; k++)
            fprintf(out, "%s%s", k ? ", " : "; not run (when: false): ", r->skipped[k].id);
        fprintf(out, ")\n");
    }
}

int run_main(fsdp_registry *reg, const char *const *paths, size_t n, const run_opts *o) {
    FILE *log = o->log ? o->log : stderr;
    FILE *out = o->out ? o->out : stdout;
    run_plan plan;
    fsdp_err err;
    fsdp_err_clear(&err);
    double start = wall_now();
    int plan_rc = run_plan_build(reg, paths, n, o, &plan, &err);
    int rank = o->comm ? comm_rank(o->comm) : 0, who = rank;
    if (o->comm && comm_size(o->comm) > 1) {
        /* every rank validates the same recipes; agree so that no rank runs alone */
        fsdp_err e2;
        int agreed = comm_agree(o->comm, plan_rc ? fsdp_err_exit_code(err.code) : 0, &who, &e2);
        if (agreed && !plan_rc) {
            run_plan_free(&plan);
            return agreed;
        }
    }
    if (plan_rc) {
        if (rank == 0 || who == rank) fprintf(log, "fsdp-run: error: %s\n", err.msg);
        if (o->report && !o->validate_only && rank == 0) {
            run_result res = {0};
            res.start_wall = start;
            res.end_wall = wall_now();
            res.exit_code = fsdp_err_exit_code(err.code);
            res.world_size = 1;
            res.error = strdup(err.msg);
            fsdp_err e2;
            report_write(&res, o->report, &e2);
            report_free(&res);
        }
        return fsdp_err_exit_code(err.code);
    }
    if (o->validate_only) {
        print_valid(&plan, out);
        run_plan_free(&plan);
        return 0;
    }
    if (o->dry_run) {
        run_plan_print(&plan, out);
        run_plan_free(&plan);
        return 0;
    }
    fsdp_ctx *ctx = ctx_new(o->comm, o->verbosity, log);
    if (!ctx) {
        run_plan_free(&plan);
        fprintf(log, "fsdp-run: error: out of memory\n");
        return 1;
    }
    run_result res = {0};
    res.start_wall = start;
    res.world_size = ctx->world;
    set_run_id(ctx, o->comm, start);
    snprintf(res.run_id, sizeof res.run_id, "%s", ctx->run_id);
    run_mesh_hosts(ctx, &res);
    int rc = execute(ctx, &plan, &res, o);
    res.end_wall = wall_now();
    res.exit_code = rc ? 1 : 0;
    if (rc == FSDP_E_NOMEM) fprintf(log, "fsdp-run: error: out of memory\n");
    int code = res.exit_code;
    if (o->report && ctx->rank == 0) {
        if (report_write(&res, o->report, &err)) {
            fprintf(log, "fsdp-run: error: %s\n", err.msg);
            if (!code) code = 1;
        }
    }
    /* Attachments (model state, files being written) are released before the plan. */
    ctx_free(ctx);
    report_free(&res);
    run_plan_free(&plan);
    return code;
}
