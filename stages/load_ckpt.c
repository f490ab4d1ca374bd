/* Stage `load-ckpt`: loads model weights (and, when present, optimizer state, step and data
 * position) from a DCP checkpoint saved by any number of ranks, a safetensors file or HF
 * sharded directory, or a torch.save file. Each rank reads only its own rows. Without a
 * model in the context it declares one from the recipe's `model:` section (like init-meta,
 * without drawing weights). Strict loading fails naming every parameter not restored (those
 * are left NaN; restored ones are written in full, their chunks checked to cover them), every
 * tensor of the wrong shape and every unexpected key, and checks that no NaN was loaded. On
 * runtime.device cuda (sharded state) every array is read chunk by chunk into a ring of pinned
 * staging buffers and uploaded from there on the COPY stream while the next chunk is read
 * (ckpt/ckpt_pipe.h): no host copy of the state is made; the arrays the checkpoint does not hold
 * (a fresh model's gradients, parameters absent from a non-strict load) are placed afterwards, and
 * a state already on the GPU is overwritten in place (absent parameters keep their values).
 *
 * Any model (model/mt_spec.h): several loads can fill different parts of one model, each strict over
 * what it is responsible for: `parts: [NAME...]` (the checkpoint's keys are then relative to the parts'
 * prefix unless add_prefix / strip_prefix say otherwise) and/or `keys: [GLOB...]` (on the model's
 * names). Every parameter a load restores gets a value (state_param.no_value cleared) in its own
 * dtype: a bf16 / f16 parameter's loaded values are rounded to it. A checkpoint whose parameters are
 * all under `model.` (torchtitan's checkpointer, dcp.save({"model": ...})) is read with that prefix
 * removed when no key names a parameter as it is.
 *
 * with: path (required), format (auto|dcp|safetensors|pt), names (torchtitan|hf),
 *       strip_prefix, add_prefix, rename (map of glob -> replacement on checkpoint keys),
 *       strict (bool, true), load_optimizer (auto|true|false), dtype (auto|f32|bf16),
 *       parts (list of part names), keys (list of globs), if_missing (error|init), seed (for init)
 *
 * Resume: `path: DIR/latest` (when DIR/latest itself does not exist) is the newest committed
 * DIR/step-<N> (ckpt/ckpt_steps.h; directories without .metadata, interrupted saves, are skipped).
 * `if_missing: init` makes "load if there is a checkpoint, else initialise" one stage: with no
 * committed checkpoint to load it declares the model and draws its weights as init-meta does. It is a
 * parameter of load-ckpt rather than a condition on stages because the DAG is checked whole before
 * anything runs (pipeline/dag.c): a stage that may or may not run would make what later stages need
 * unknowable; this stage provides params either way. Any async save of the run is committed first.
 * strict: false reports (as `not_restored`) every parameter it did not restore and what it holds
 * instead, and logs the first 16 of them and how many more there are. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "ckpt/ckpt_agree.h"
#include "ckpt/ckpt_steps.h"
#include "ckpt/dcp.h"
#include "ckpt/key_layout.h"
#include "ckpt/namemap.h"
#include "ckpt/state_io.h"
#include "pipeline/value_impl.h"
#include "stages/stages.h"
#include "stages/train_hooks.h"
#include "runtime/nearest.h"

static const char *const FORMATS[] = {"auto", "dcp", "safetensors", "pt", NULL};
static const char *const NAMES[] = {"torchtitan", "hf", NULL};
static const char *const OPTS[] = {"auto", "true", "false", NULL};
static const char *const DTYPES[] = {"auto", "f32", "bf16", NULL};
static const char *const IF_MISSING[] = {"error", "init", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"path", FSDP_T_STRING, 0, NULL, NULL,
     "checkpoint: DCP directory, .safetensors / HF directory / index, .pt (without it: `parts` from their own sources)"},
    {"format", FSDP_T_STRING, 0, "auto", FORMATS, "checkpoint format (auto detects it)"},
    {"layout", FSDP_T_STRING, 0, "auto", NULL,
     "the trainer's checkpoint layout (layouts/layout.h: torchtitan-0.2, torchtitan-0.3, ...; hf as names: hf; "
     "auto detects it from the keys)"},
    {"names", FSDP_T_STRING, 0, "torchtitan", NAMES, "key names in the checkpoint (hf: Hugging Face Llama)"},
    {"strip_prefix", FSDP_T_STRING, 0, NULL, NULL, "remove this prefix from checkpoint keys (e.g. 'model.')"},
    {"add_prefix", FSDP_T_STRING, 0, NULL, NULL, "add this prefix to checkpoint keys"},
    {"rename", FSDP_T_MAP, 0, NULL, NULL, "rename rules on checkpoint keys: {glob: replacement}, * = one component"},
    {"drop", FSDP_T_LIST, 0, NULL, NULL,
     "globs of checkpoint keys (after strip_prefix) dropped on purpose: neither loaded nor unexpected"},
    {"exclude", FSDP_T_LIST, 0, NULL, NULL,
     "globs of the checkpoint's own keys (before any prefix is removed) excluded on purpose: neither loaded, "
     "unexpected nor listed as ignored (`rng`, `scaler.**`)"},
    {"strict", FSDP_T_BOOL, 0, "true", NULL,
     "every parameter restored, no unexpected keys (under the model prefix when there is one: the entries "
     "outside it are ignored and listed)"},
    {"load_optimizer", FSDP_T_STRING, 0, "auto", OPTS, "restore optimizer state (auto: when present)"},
    {"dtype", FSDP_T_STRING, 0, "auto", DTYPES,
     "dtype the parameters are kept in (auto: each its own, loaded values rounded to it)"},
    {"parts", FSDP_T_LIST, 0, NULL, NULL,
     "load only these parts of the model (strict over them); keys are relative to their prefix"},
    {"keys", FSDP_T_LIST, 0, NULL, NULL, "load only the parameters matching these globs (strict over them)"},
    {"if_missing", FSDP_T_STRING, 0, "error", IF_MISSING,
     "when path holds no committed checkpoint: error, or init (declare the model and draw its weights as "
     "init-meta does: one recipe for the first run and every restart)"},
    {"seed", FSDP_T_INT, 0, NULL, NULL, "if_missing: init: the init seed (default runtime.seed)"},
    {"prefixes", FSDP_T_MAP, 0, NULL, NULL,
     "key layout: {model: P, optim: P} prefixes of the parameters and of the optimizer's state./param_groups. "
     "(detected when not given; ckpt/key_layout.h)"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const PROVIDES[] = {"params", NULL};

/* `parts`: a mask of the state's parameters in those parts of its model, and the parts' common
 * prefix (the checkpoint's keys are relative to it); nothing selected without `parts`. */
static int select_parts(const fsdp_state *s, const fsdp_value *parts, unsigned char **mask, const char **prefix,
                        fsdp_err *err) {
    *mask = NULL;
    *prefix = NULL;
    if (!parts) return 0;
    const mt_table *t = s->model;
    if (!t) return fsdp_err_at(err, FSDP_E_INVALID, parts, "load-ckpt: parts: the model in the context has no parts");
    unsigned char *want = calloc(t->n_parts + 1, 1);
    if (!want) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0;
    for (size_t k = 0; k < fsdp_value_size(parts) && !rc; k++) {
        const fsdp_value *v = fsdp_value_item(parts, k);
        const char *name = fsdp_value_text(v);
        size_t i = 0;
        while (name && i < t->n_parts && strcmp(t->parts[i].name, name)) i++;
        if (!name || i == t->n_parts) {
            char known[1024] = "";
            size_t o = 0;
            for (size_t j = 0; j < t->n_parts && o < sizeof known; j++)
                o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", j ? ", " : "", t->parts[j].name);
            rc = fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: the model has no part '%s' (parts: %s)",
                             name ? name : "(not a name)", known);
            break;
        }
        if (*prefix && strcmp(*prefix, t->parts[i].prefix))
            rc = fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: parts '%s' and earlier ones have different prefixes "
                             "('%s', '%s'): load them separately, or give add_prefix / strip_prefix",
                             name, t->parts[i].prefix, *prefix);
        *prefix = t->parts[i].prefix;
        want[i] = 1;
    }
    if (!rc && !(*mask = calloc(s->n + 1, 1))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < s->n; i++) {
        long m = mt_find(t, s->p[i].name);
        (*mask)[i] = m >= 0 && want[t->p[m].part];
    }
    free(want);
    return rc;
}

/* a DCP checkpoint (committed), safetensors files or Hugging Face torch.save files in dir */
static int dir_holds_checkpoint(const char *dir) {
    if (dcp_dir_has_checkpoint(dir)) return 1;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        found = (n > 12 && !strcmp(de->d_name + n - 12, ".safetensors")) ||
                (n > 23 && !strcmp(de->d_name + n - 23, ".safetensors.index.json")) ||
                (!strncmp(de->d_name, "pytorch_model", 13) && n >= 17 && !strcmp(de->d_name + n - 4, ".bin"));
    }
    closedir(d);
    return found;
}

/* path, or for DIR/latest the newest committed DIR/step-<N> (rank 0 looks, every rank gets its
 * answer); *missing when there is no committed checkpoint to load (none under DIR, or nothing at
 * path). */
static int resolve_path(fsdp_ctx *ctx, const char *path, char *out, size_t cap, int *missing, fsdp_err *err) {
    comm *c = stage_comm(ctx);
    char base[4200];
    int latest = ckpt_steps_is_latest(path, base, sizeof base);
    int64_t step = -1, have = 1;
    int rc = 0;
    if (comm_rank(c) == 0) {
        struct stat st;
        if (latest) rc = ckpt_steps_latest(base, &step, err);
        else have = stat(path, &st) == 0 && (!S_ISDIR(st.st_mode) || dir_holds_checkpoint(path));
    }
    int who;
    fsdp_err e2;
    int agreed = comm_agree(c, rc, &who, &e2);
    if (!rc && agreed) return fsdp_err_set(err, agreed, "load-ckpt: rank %d could not list %s", who, base);
    if (rc) return rc;
    int64_t msg[2] = {step, have};
    if ((rc = comm_bcast(c, msg, sizeof msg, 0, err))) return rc;
    if (latest) {
        *missing = msg[0] < 0;
        if (!*missing) {
            ckpt_steps_dir(out, cap, base, msg[0]);
            fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: %s is %s (the newest committed step)", path, out);
        }
        return 0;
    }
    *missing = !msg[1];
    snprintf(out, cap, "%s", path);
    return 0;
}

/* if_missing: init (no checkpoint to load): the model drawn as init-meta draws it, unless the context
 * already holds one (kept as it is). */
static int init_instead(fsdp_ctx *ctx, const fsdp_value *with, const char *path, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (s) {
        fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: no checkpoint at %s; keeping the model in the context (if_missing: init)",
                 path);
        return 0;
    }
    int rc = stage_init_model(ctx, with, STATE_SHARDED, &s, err);
    if (rc) return rc;
    fsdp_ctx_metric_str(ctx, "loaded", "none (initialised)");
    fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: no checkpoint at %s; initialised %s, %zu tensors (if_missing: init)", path,
             mt_kind(s->model), s->n);
    return 0;
}

/* What to load: the run's async save committed first (it may be the one to load), DIR/latest resolved;
 * with nothing to load, if_missing: init initialises instead (*done set). */
static int load_target(fsdp_ctx *ctx, const fsdp_value *with, char *path, size_t cap, int *done, fsdp_err *err) {
    *done = 0;
    int rc = stage_wait_saves(ctx, err);
    if (rc) return rc;
    const char *given = fsdp_arg_str(with, "path", "");
    int missing = 0;
    if ((rc = resolve_path(ctx, given, path, cap, &missing, err)) || !missing) return rc;
    if (!strcmp(fsdp_arg_str(with, "if_missing", "error"), "init")) {
        *done = 1;
        return init_instead(ctx, with, given, err);
    }
    char base[4200];
    if (ckpt_steps_is_latest(given, base, sizeof base))
        return fsdp_err_set(err, FSDP_E_IO, "load-ckpt: %s holds no committed step-<N> checkpoint (a directory "
                            "without .metadata is an interrupted save); set if_missing: init to initialise instead",
                            base);
    return 0; /* the load names what is wrong with path */
}

/* strict: false: every parameter this load did not restore, and what it holds instead */
static void report_not_restored(fsdp_ctx *ctx, const fsdp_state *s, const unsigned char *restored, const char *path) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += !restored[i];
    fsdp_ctx_metric(ctx, "params_not_restored", (double)n);
    if (!n) return;
    size_t cap = 64 + n * 96, o = 0, logged = 0;
    enum { LOG_MAX = 16 }; /* lines in the log; the report's not_restored names every one */
    char *list = malloc(cap);
    for (size_t i = 0; list && i < s->n; i++) {
        if (restored[i]) continue;
        const char *holds = s->p[i].no_value ? "no value (declared only: initialise or load it before it is used)"
                                             : "its value from before this load";
        if (logged++ < LOG_MAX)
            fsdp_log(ctx, FSDP_LOG_WARN, "load-ckpt (strict: false): %s not restored from %s; it holds %s",
                     s->p[i].name, path, holds);
        int k = snprintf(list + o, cap - o, "%s%s: %s", o ? "; " : "", s->p[i].name,
                         s->p[i].no_value ? "no value" : "value from before this load");
        if (k > 0 && (size_t)k < cap - o) o += (size_t)k;
    }
    if (n > LOG_MAX)
        fsdp_log(ctx, FSDP_LOG_WARN, "load-ckpt (strict: false): %zu more parameters not restored from %s (%zu in all; "
                 "the run report's not_restored names each)", n - LOG_MAX, path, n);
    if (list) fsdp_ctx_metric_str(ctx, "not_restored", list);
    free(list);
}

/* The state to load into (declared from the recipe's model when the context has none) and where
 * its arrays are filled: staged straight into device arrays on the GPU (*staged, with the sink), else
 * in host arrays. */
static int load_prepare(fsdp_ctx *ctx, fsdp_state **out, int *on_gpu, int *staged, stage_ckpt_sink *sink,
                        fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    memset(sink, 0, sizeof *sink);
    *on_gpu = *staged = 0;
    /* the device choice first: it is collective, and reading may fail on one rank only */
    int rc = stage_on_gpu(ctx, on_gpu, err);
    if (!rc && !s) {
        mt_table t;
        if ((rc = stage_model_table(ctx, &t, err))) return rc;
        rc = stage_state_from_table(ctx, &t, STATE_SHARDED, &s, err);
    }
    if (rc) return rc;
    *out = s;
    *staged = *on_gpu && s->layout == STATE_SHARDED;
    if (!*staged) return state_to_host(s, err);
    dev_ctx *d;
    if ((rc = stage_device(ctx, &d, err)) || (rc = state_attach_device(s, d, err))) return rc;
    return stage_ckpt_sink_create(d, sink, err);
}

/* What the load's options point at (freed by load_args_free). */
typedef struct load_args {
    const char **from, **to, **only, **exclude;
    unsigned char *select;
    sio_xform *xforms;
} load_args;

static void load_args_free(load_args *a) {
    free(a->from);
    free(a->to);
    free(a->only);
    free(a->exclude);
    free(a->select);
    free(a->xforms);
    memset(a, 0, sizeof *a);
}

/* The options every load of the stage shares: strictness, optimizer, dtype, `keys`, the sink. */
static int common_opts(const fsdp_value *with, fsdp_state *s, const stage_ckpt_sink *sink, int staged,
                       sio_load_opts *o, load_args *a, fsdp_err *err) {
    memset(o, 0, sizeof *o);
    o->strict = fsdp_arg_bool(with, "strict", 1);
    const char *lo = fsdp_arg_str(with, "load_optimizer", "auto");
    o->load_optimizer = !strcmp(lo, "auto") ? -1 : !strcmp(lo, "true");
    const fsdp_value *keys = fsdp_value_get(with, "keys");
    size_t nk = fsdp_value_size(keys);
    if (!(a->only = calloc(nk ? nk : 1, sizeof *a->only))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < nk; i++) a->only[i] = fsdp_value_text(fsdp_value_item(keys, i));
    if (keys) {
        o->only = a->only;
        o->n_only = nk;
    }
    const fsdp_value *ex = fsdp_value_get(with, "exclude");
    size_t ne = fsdp_value_size(ex);
    if (!(a->exclude = calloc(ne ? ne : 1, sizeof *a->exclude))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ne; i++) a->exclude[i] = fsdp_value_text(fsdp_value_item(ex, i));
    o->exclude = a->exclude;
    o->n_exclude = ne;
    o->sink = staged ? &sink->sink : NULL;
    const char *dts = fsdp_arg_str(with, "dtype", "auto");
    o->round_bf16 = !strcmp(dts, "bf16");
    if (!strcmp(dts, "f32"))
        for (size_t i = 0; i < s->n; i++) s->p[i].dtype = FSDP_DT_F32;
    return 0;
}

/* The options of a load from `path`: names, prefixes, renames, drops and the `parts` selection. */
static int path_opts(const fsdp_value *with, fsdp_state *s, sio_load_opts *o, load_args *a, fsdp_err *err) {
    const char *part_prefix = NULL;
    int rc = select_parts(s, fsdp_value_get(with, "parts"), &a->select, &part_prefix, err);
    if (rc) return rc;
    o->select = a->select;
    o->detect_prefix = "model.";
    o->model_prefix = fsdp_value_text(fsdp_value_get(fsdp_value_get(with, "prefixes"), "model"));
    o->optim_prefix = fsdp_value_text(fsdp_value_get(fsdp_value_get(with, "prefixes"), "optim"));
    ckpt_format_from_name(fsdp_arg_str(with, "format", "auto"), &o->format);
    o->names = !strcmp(fsdp_arg_str(with, "names", "torchtitan"), "hf") ? SIO_NAMES_HF : SIO_NAMES_TORCHTITAN;
    o->strip_prefix = fsdp_arg_str(with, "strip_prefix", NULL);
    o->add_prefix = fsdp_arg_str(with, "add_prefix", NULL);
    if (!o->add_prefix && !o->strip_prefix && part_prefix && *part_prefix) o->add_prefix = part_prefix;
    const fsdp_value *ren = fsdp_value_get(with, "rename"), *drop = fsdp_value_get(with, "drop");
    size_t nr = fsdp_value_size(ren), nd = fsdp_value_size(drop);
    a->from = calloc(nr + nd + 1, sizeof *a->from);
    a->to = calloc(nr + 1, sizeof *a->to);
    if (!a->from || !a->to) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < nr; i++) {
        a->from[i] = fsdp_value_key(ren, i);
        a->to[i] = fsdp_value_text(fsdp_value_item(ren, i));
        if (!a->to[i]) a->to[i] = "";
    }
    o->rename_from = a->from;
    o->rename_to = a->to;
    o->n_rename = nr;
    for (size_t i = 0; i < nd; i++) a->from[nr + i] = fsdp_value_text(fsdp_value_item(drop, i));
    o->drop = a->from + nr;
    o->n_drop = nd;
    return 0;
}

/* The options of a load of part `pi` from its own source (model/model_table.h mt_part.from): its
 * prefix alternatives, the keys it takes (the others dropped on purpose), its transforms. */
static int part_opts(fsdp_state *s, size_t pi, sio_load_opts *o, load_args *a, fsdp_err *err) {
    const mt_table *t = s->model;
    const mt_part *pt = &t->parts[pi];
    a->select = calloc(s->n + 1, 1);
    a->xforms = calloc(s->n + 1, sizeof *a->xforms);
    if (!a->select || !a->xforms) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        long m = mt_find(t, s->p[i].name);
        if (m < 0 || t->p[m].part != (int)pi) continue;
        a->select[i] = 1;
        const mt_param *mp = &t->p[m];
        if (!mp->src_ndim) continue;
        a->xforms[i].ndim = mp->src_ndim;
        memcpy(a->xforms[i].shape, mp->src_shape, sizeof a->xforms[i].shape);
        memcpy(a->xforms[i].perm, mp->src_perm, sizeof a->xforms[i].perm);
    }
    o->select = a->select;
    o->xforms = a->xforms;
    o->format = (ckpt_format)pt->format;
    o->strip = (const char *const *)pt->strip;
    o->n_strip = pt->n_strip;
    o->keep = (const char *const *)pt->keys;
    o->n_keep = pt->n_keys;
    o->keep_given = pt->keys_given;
    o->drop = (const char *const *)pt->exclude;
    o->n_drop = pt->n_exclude;
    o->add_prefix = pt->prefix;
    o->model_prefix = ""; /* a source's keys are the part's, under no training layout */
    o->load_optimizer = 0;
    return 0;
}

/* ckpt_open_agreed's resolve for DIR/latest: the first try opens the step load_target found; a
 * later one (a step pruned or overwritten meanwhile) looks again */
typedef struct relatest {
    fsdp_ctx *ctx;
    const char *given;
    int tries;
} relatest;

static int resolve_again(void *user, char *path, size_t cap, fsdp_err *err) {
    relatest *q = user;
    if (q->tries++ == 0) return 0;
    int missing = 0;
    int rc = resolve_path(q->ctx, q->given, path, cap, &missing, err);
    if (!rc && missing)
        rc = fsdp_err_set(err, FSDP_E_IO, "load-ckpt: %s: the checkpoint it named went away while being read, and "
                          "no committed step-<N> is left", q->given);
    return rc;
}

/* One sio_load, its results added to *sum; strict: false reports what it did not restore. Every
 * rank reads one save (ckpt/ckpt_agree.h); given: the path as the recipe gives it (DIR/latest is
 * looked up again when the step it named changes while it is opened). */
static int load_one(fsdp_ctx *ctx, fsdp_state *s, const char *given, const char *path, const char *layout,
                    sio_load_opts *o, sio_load_result *sum, fsdp_err *err) {
    char base[4200], at[4400];
    snprintf(at, sizeof at, "%s", path);
    relatest q = {ctx, given, 0};
    int latest = given && ckpt_steps_is_latest(given, base, sizeof base), restarts = 0;
    ckpt_reader *r;
    int rc = stage_open_deepspeed(ctx, s, at, &r, err); /* 1: not one */
    if (rc == 1)
        rc = ckpt_open_agreed(stage_comm(ctx), o->format, latest ? resolve_again : NULL, &q, at, sizeof at, &r, &restarts,
                              err);
    if (rc) return rc;
    ckpt_reader *src = r;
    if ((rc = stage_layout_view(ctx, s, layout, &r, err))) {
        ckpt_close(src);
        return rc;
    }
    if (restarts)
        fsdp_log(ctx, FSDP_LOG_WARN, "load-ckpt: %s changed while it was being opened (a save replaced it); read the "
                 "new save (%d restart%s)", at, restarts, restarts == 1 ? "" : "s");
    unsigned char *restored = o->strict ? NULL : calloc(s->n ? s->n : 1, 1);
    if (!o->strict && !restored) {
        if (r != src) ckpt_close(r);
        ckpt_close(src);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    o->restored = restored;
    o->reader = r;
    /* values that nothing before the save needs stay in the checkpoint: safetensors files (a reader of
     * files: a deferred value keeps it open; a view's or a union's sources close with this load). DCP and
     * .pt tensors are read now, whole, which checks their records' CRC-32; the save's pieces could not. */
    o->defer = state_defer_allowed(ctx) && ckpt_reader_of_files(r) && ckpt_reader_format(r) == CKPT_SAFETENSORS;
    sio_load_result res;
    rc = sio_load(s, at, o, &res, err);
    o->reader = NULL;
    if (r != src) ckpt_close(r);
    ckpt_close(src);
    if (!rc && restored) report_not_restored(ctx, s, restored, at);
    free(restored);
    if (rc) return rc;
    sum->params_loaded += res.params_loaded;
    sum->params_deferred += res.params_deferred;
    sum->optimizer_loaded += res.optimizer_loaded;
    sum->bytes_read += res.bytes_read;
    if (res.stripped_prefix[0]) memcpy(sum->stripped_prefix, res.stripped_prefix, sizeof sum->stripped_prefix);
    if (res.ignored) {
        sum->ignored = res.ignored;
        memcpy(sum->ignored_prefix, res.ignored_prefix, sizeof sum->ignored_prefix);
        memcpy(sum->ignored_keys, res.ignored_keys, sizeof sum->ignored_keys);
    }
    if (res.optim_omitted) {
        sum->optim_omitted = res.optim_omitted;
        memcpy(sum->optim_omitted_keys, res.optim_omitted_keys, sizeof sum->optim_omitted_keys);
    }
    return 0;
}

/* `parts` without `path`: each part from its own source. */
static int load_sources(fsdp_ctx *ctx, const fsdp_value *with, fsdp_state *s, const stage_ckpt_sink *sink, int staged,
                        sio_load_result *sum, char *what, size_t cap, fsdp_err *err) {
    const fsdp_value *parts = fsdp_value_get(with, "parts");
    const mt_table *t = s->model;
    size_t o_len = 0;
    int rc = 0;
    for (size_t k = 0; k < fsdp_value_size(parts) && !rc; k++) {
        const fsdp_value *v = fsdp_value_item(parts, k);
        const char *name = fsdp_value_text(v);
        size_t pi = 0;
        while (t && name && pi < t->n_parts && strcmp(t->parts[pi].name, name)) pi++;
        if (!t || !name || pi == t->n_parts)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: the model has no part '%s'", name ? name : "?");
        if (!t->parts[pi].from)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: part '%s' (%s) has no source of its own (it is not "
                               "declared with from:): give path", name, t->parts[pi].source);
        sio_load_opts o;
        load_args a = {0};
        rc = common_opts(with, s, sink, staged, &o, &a, err);
        if (!rc) rc = part_opts(s, pi, &o, &a, err);
        if (!rc) rc = load_one(ctx, s, NULL, t->parts[pi].from, "auto", &o, sum, err);
        if (rc) fsdp_err_prefix(err, "load-ckpt part '%s'", name);
        load_args_free(&a);
        int w = snprintf(what + o_len, cap - o_len, "%s%s (part %s)", o_len ? ", " : "", t->parts[pi].from, name);
        if (w > 0 && (size_t)w < cap - o_len) o_len += (size_t)w;
    }
    return rc;
}

/* After the reads: the state placed on its device, the stage's metrics and log line. */
static int load_done(fsdp_ctx *ctx, fsdp_state *s, int on_gpu, const sio_load_result *res, const char *path, double t0,
                     fsdp_err *err) {
    double t_up = stage_now();
    int rc = stage_place_state(ctx, s, &on_gpu, err);
    if (rc) return rc;
    on_gpu = on_gpu && s->layout == STATE_SHARDED;
    fsdp_ctx_metric_str(ctx, "device", on_gpu ? "cuda" : "cpu");
    if (on_gpu) fsdp_ctx_metric(ctx, "seconds_upload", stage_now() - t_up);
    double el = stage_now() - t0;
    if (s->has_optimizer) fsdp_ctx_set_state(ctx, "optimizer", 1);
    fsdp_ctx_metric(ctx, "bytes_read", (double)res->bytes_read);
    fsdp_ctx_metric(ctx, "seconds_read", el);
    fsdp_ctx_metric(ctx, "params_loaded", (double)res->params_loaded);
    fsdp_ctx_metric(ctx, "params_deferred", (double)res->params_deferred);
    if (res->stripped_prefix[0])
        fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: the checkpoint's parameters are under the prefix '%s' (removed)",
                 res->stripped_prefix);
    if (res->ignored)
        fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: ignored %zu entr%s outside the model prefix '%s' (not model or "
                 "optimizer keys; `exclude:` silences them): %s", res->ignored, res->ignored == 1 ? "y" : "ies",
                 res->ignored_prefix, res->ignored_keys);
    if (res->optim_omitted)
        fsdp_log(ctx, FSDP_LOG_WARN, "load-ckpt %s (strict: false): %zu optimizer moment(s) not restored (they start "
                 "at zero):%s", path, res->optim_omitted, res->optim_omitted_keys);
    char later[160] = "";
    if (res->params_deferred)
        snprintf(later, sizeof later, " (%zu of them left in the checkpoint until the save reads their rows)",
                 res->params_deferred);
    fsdp_log(ctx, FSDP_LOG_INFO, "loaded %zu parameters%s from %s (step %lld) in %.2fs, %.1f MB %s by this rank%s",
             res->params_loaded, res->optimizer_loaded ? " and optimizer state" : "", path, (long long)s->train_step, el,
             (double)res->bytes_read / 1e6, res->params_deferred ? "to read" : "read", later);
    return train_hooks_event(ctx, FSDP_HOOK_AFTER_LOAD, s->train_step, path, err);
}

static int load_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    char path[4400] = "";
    int done = 0, from_sources = !fsdp_value_get(with, "path"), rc = 0;
    if (from_sources) rc = stage_wait_saves(ctx, err);
    else rc = load_target(ctx, with, path, sizeof path, &done, err);
    if (rc || done) return rc;
    fsdp_state *s;
    int on_gpu, staged;
    stage_ckpt_sink sink;
    if ((rc = load_prepare(ctx, &s, &on_gpu, &staged, &sink, err))) {
        stage_ckpt_sink_free(&sink);
        return rc;
    }
    double t0 = stage_now();
    sio_load_result sum;
    memset(&sum, 0, sizeof sum);
    if (from_sources) {
        rc = load_sources(ctx, with, s, &sink, staged, &sum, path, sizeof path, err);
    } else {
        sio_load_opts o;
        load_args a = {0};
        rc = common_opts(with, s, &sink, staged, &o, &a, err);
        if (!rc) rc = path_opts(with, s, &o, &a, err);
        if (!rc) rc = load_one(ctx, s, fsdp_arg_str(with, "path", ""), path, fsdp_arg_str(with, "layout", "auto"), &o, &sum,
                                  err);
        load_args_free(&a);
    }
    stage_ckpt_sink_free(&sink);
    return rc ? rc : load_done(ctx, s, on_gpu, &sum, path, t0, err);
}

/* `prefixes`: only model / optim, each a prefix ckl_prefix_check accepts. */
static int prefixes_check(const fsdp_value *pre, fsdp_err *err) {
    for (size_t i = 0; i < fsdp_value_size(pre); i++) {
        const char *k = fsdp_value_key(pre, i);
        const fsdp_value *v = fsdp_value_item(pre, i);
        char hint[300];
        if (!k || (strcmp(k, "model") && strcmp(k, "optim")))
            return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: prefixes: unknown key '%s'%s (model, optim)",
                               k ? k : "?", nearest_hint(k, "model, optim", hint, sizeof hint));
        const char *t = fsdp_value_type(v) == FSDP_V_SCALAR ? fsdp_value_text(v) : NULL;
        if (!t) return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: prefixes.%s must be a string (\"\" for none)", k);
        char what[32];
        snprintf(what, sizeof what, "load-ckpt: prefixes.%s", k);
        fsdp_err e2;
        int rc = ckl_prefix_check(what, t, &e2);
        if (rc) return fsdp_err_at(err, rc, v, "%s", e2.msg);
    }
    return 0;
}

static int load_check(const fsdp_value *with, fsdp_err *err) {
    int prc = stage_layout_check(fsdp_value_get(with, "layout"), err);
    if (!prc) prc = prefixes_check(fsdp_value_get(with, "prefixes"), err);
    if (prc) return prc;
    if (!fsdp_value_get(with, "path")) {
        /* each part from its own source: the options of a path make no sense there */
        static const char *const PATH_ONLY[] = {"format", "layout", "names", "strip_prefix", "add_prefix", "rename", "drop",
                                                "prefixes", "if_missing", "load_optimizer", NULL};
        if (!fsdp_value_get(with, "parts"))
            return fsdp_err_at(err, FSDP_E_INVALID, with, "load-ckpt: give path (a checkpoint), or parts without path "
                               "(each part loaded from the source it was declared from)");
        for (const char *const *k = PATH_ONLY; *k; k++) {
            const fsdp_value *v = fsdp_value_get(with, *k);
            if (v && !v->is_default)
                return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: '%s' applies to a load from path; parts without "
                                   "path load from each part's own source, as the part declares it", *k);
        }
    }
    static const char *const GLOB_LISTS[] = {"drop", "exclude", NULL};
    for (const char *const *k = GLOB_LISTS; *k; k++) {
        const fsdp_value *l = fsdp_value_get(with, *k);
        for (size_t i = 0; i < fsdp_value_size(l); i++) {
            const char *g = fsdp_value_text(fsdp_value_item(l, i));
            fsdp_err e2;
            if (!g || !*g || nmap_glob_check(g, NULL, &e2))
                return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(l, i), "load-ckpt: %s: %s", *k,
                                   !g || !*g ? "each entry is a non-empty glob" : e2.msg);
        }
    }
    const fsdp_value *ren = fsdp_value_get(with, "rename");
    for (size_t i = 0; i < fsdp_value_size(ren); i++) {
        const fsdp_value *v = fsdp_value_item(ren, i);
        if (fsdp_value_type(v) != FSDP_V_SCALAR && fsdp_value_type(v) != FSDP_V_NULL)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: rename values must be names (or null to drop)");
    }
    return 0;
}

const fsdp_stage_desc stage_load_ckpt = {
    FSDP_STAGE_DESC_INIT,
    "load-ckpt",
    "load weights [+ optimizer, step] from DCP (any world size), safetensors or .pt; each rank reads its rows",
    PARAMS,
    NULL,
    PROVIDES,
    load_run,
    load_check,
};
