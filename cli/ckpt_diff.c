/* fsdp-run ckpt diff A B: every key of two checkpoints compared, values by their text, tensors by
 * shape and element values within --rtol/--atol.
 *   --ignore GLOBS      keys left out on both sides (cli/ckpt_keys.h)
 *   --names hf|torchtitan
 *                       A's names are mapped into that layout (as `ckpt convert --names` does,
 *                       q/k rows permuted with --n-heads/--n-kv-heads) and compared with B's;
 *                       the training entries (optimizer.*, train_state.*, lr_scheduler.*,
 *                       dataloader.*) of both are left out and counted
 *   --round             tensors of different float dtypes are compared after rounding both to
 *                       the less precise one (bf16 < f16 < f32 < f64), then within --rtol/--atol;
 *                       without it they are compared as stored. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_stale.h"
#include "cli/ckpt_keys.h"
#include "cli/ckpt_layout.h"
#include "cli/ckpt_tool.h"

typedef struct diff_opts {
    const char *a, *b, *names;
    const char *layout; /* --layout auto|LAYOUT: both sides read in fsdp-run's layout */
    double rtol, atol;
    int round, heads, kv_heads;
    ckpt_keys ignore;
} diff_opts;

typedef struct diff_key {
    char *name; /* as compared (A's mapped under --names) */
    size_t idx;
    nmap_info info;
} diff_key;

typedef struct diff_side {
    ckpt_reader *r;
    const char *path;
    diff_key *k;
    size_t n;
    size_t training; /* training entries left out under --names */
} diff_side;

static void diff_usage(FILE *log) {
    fputs("usage: fsdp-run ckpt diff A B [--rtol R] [--atol A] [--round] [--ignore GLOB[,GLOB...]]...\n"
          "                              [--names hf|torchtitan [--n-heads H --n-kv-heads K]]\n",
          log);
}

static int diff_args(int argc, char **argv, diff_opts *o, FILE *log) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--rtol") && v) o->rtol = atof(v), i++;
        else if (!strcmp(a, "--atol") && v) o->atol = atof(v), i++;
        else if (!strcmp(a, "--round")) o->round = 1;
        else if (!strcmp(a, "--names") && v) o->names = v, i++;
        else if (!strcmp(a, "--layout") && v) o->layout = v, i++;
        else if (!strcmp(a, "--n-heads") && v) o->heads = atoi(v), i++;
        else if (!strcmp(a, "--n-kv-heads") && v) o->kv_heads = atoi(v), i++;
        else if (!strcmp(a, "--ignore") && v) {
            if (ckpt_keys_add(&o->ignore, v)) {
                fprintf(log, "fsdp-run ckpt diff: --ignore %s: empty pattern or more than %d patterns\n", v,
                        CKPT_KEYS_MAX);
                return 2;
            }
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(log, "fsdp-run ckpt diff: unknown option %s\n", a);
            diff_usage(log);
            return 2;
        } else if (!o->a) o->a = a;
        else if (!o->b) o->b = a;
        else {
            diff_usage(log);
            return 2;
        }
    }
    if (!o->a || !o->b || (o->names && strcmp(o->names, "hf") && strcmp(o->names, "torchtitan"))) {
        diff_usage(log);
        return 2;
    }
    if (o->kv_heads <= 0) o->kv_heads = o->heads;
    return 0;
}

static int key_cmp(const void *x, const void *y) {
    return strcmp(((const diff_key *)x)->name, ((const diff_key *)y)->name);
}

static nmap_dir diff_dir(const diff_opts *o) { return !strcmp(o->names, "hf") ? NMAP_TT_TO_HF : NMAP_HF_TO_TT; }

/* The compared keys of one side, sorted by name; map: A's names go through --names. */
static int side_keys(const diff_opts *o, diff_side *s, int map, fsdp_err *err) {
    size_t n = ckpt_count(s->r);
    s->k = calloc(n ? n : 1, sizeof *s->k);
    if (!s->k) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *name = ckpt_entry_at(s->r, i)->name;
        char mapped[NMAP_NAME_MAX];
        diff_key *k = &s->k[s->n];
        if (ckpt_keys_match(&o->ignore, name)) continue;
        if (o->names && ckpt_key_is_training(name)) {
            s->training++;
            continue;
        }
        if (map && o->names) {
            int rc = nmap_map(diff_dir(o), name, o->heads, o->kv_heads, mapped, sizeof mapped, &k->info, err);
            if (rc) return fsdp_err_prefix(err, "%s", s->path);
            if (k->info.dropped || ckpt_keys_match(&o->ignore, mapped)) continue;
            if (k->info.qk != NMAP_QK_NONE && o->heads <= 0)
                return fsdp_err_set(err, FSDP_E_INVALID,
                                    "%s: %s needs the q/k row permutation: pass --n-heads and --n-kv-heads", s->path,
                                    name);
            name = mapped;
        }
        if (!(k->name = strdup(name))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        k->idx = i;
        s->n++;
    }
    qsort(s->k, s->n, sizeof *s->k, key_cmp);
    return 0;
}

static void side_free(diff_side *s) {
    for (size_t i = 0; i < s->n; i++) free(s->k[i].name);
    free(s->k);
    ckpt_close(s->r);
}

static int precision_rank(fsdp_dtype d) {
    return d == FSDP_DT_BF16 ? 1 : d == FSDP_DT_F16 ? 2 : d == FSDP_DT_F32 ? 3 : d == FSDP_DT_F64 ? 4 : 0;
}

/* The dtype both tensors are rounded to before comparing: the less precise float one under
 * --round, f64 (values as stored) otherwise. */
static fsdp_dtype compare_dtype(const diff_opts *o, fsdp_dtype a, fsdp_dtype b) {
    int ra = precision_rank(a), rb = precision_rank(b);
    if (!o->round || a == b || !ra || !rb) return FSDP_DT_F64;
    return ra < rb ? a : b;
}

/* Tensor of one side as f64 after rounding to dt. */
static int read_f64(const diff_opts *o, ckpt_reader *r, const diff_key *k, fsdp_dtype dt, double **out,
                    fsdp_err *err) {
    nmap_dir dir = o->names ? diff_dir(o) : NMAP_TT_TO_HF;
    void *buf;
    int rc = ckpt_tool_read(r, k->idx, dt, dir, &k->info, &buf, err);
    if (rc || dt == FSDP_DT_F64) {
        *out = rc ? NULL : buf;
        return rc;
    }
    const ckpt_entry *e = ckpt_entry_at(r, k->idx);
    size_t n = (size_t)fsdp_numel(e->ndim, e->shape), bytes;
    if (!(rc = ckpt_tool_bytes(e, sizeof(double), &bytes, err))) {
        *out = malloc(bytes);
        rc = *out ? fsdp_convert(*out, FSDP_DT_F64, buf, dt, n, err)
                  : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (%zu bytes for tensor %s)", bytes, e->name);
        if (rc) free(*out), *out = NULL;
    }
    free(buf);
    return rc;
}

/* 1 when the values differ beyond the tolerance (reported), 0 when equal, -1 on a read error. */
static int diff_values(const diff_opts *o, const double *xa, const double *xb, int64_t n, const char *name,
                       FILE *out) {
    double mabs = 0, mrel = 0;
    int bad = 0;
    for (int64_t k = 0; k < n; k++) {
        double d = fabs(xa[k] - xb[k]);
        if (isnan(xa[k]) != isnan(xb[k])) bad = 1, d = INFINITY;
        if (isnan(xa[k]) && isnan(xb[k])) d = 0;
        double rel = xb[k] != 0 ? d / fabs(xb[k]) : (d > 0 ? INFINITY : 0);
        if (d > mabs) mabs = d;
        if (rel > mrel) mrel = rel;
        if (d > o->atol + o->rtol * fabs(xb[k])) bad = 1;
    }
    if (bad) fprintf(out, "%s: max abs diff %.6g, max rel diff %.6g\n", name, mabs, mrel);
    return bad;
}

/* One key present on both sides: 1 if it differs, 0 if not, -1 on an error (reported). */
static int diff_one(const diff_opts *o, diff_side *A, const diff_key *ka, diff_side *B, const diff_key *kb,
                    FILE *out, FILE *log) {
    const ckpt_entry *ea = ckpt_entry_at(A->r, ka->idx), *eb = ckpt_entry_at(B->r, kb->idx);
    if (ea->is_tensor != eb->is_tensor) {
        fprintf(out, "%s: a tensor in one, a value in the other\n", ka->name);
        return 1;
    }
    fsdp_err err;
    if (!ea->is_tensor) {
        const char *va, *vb;
        if (ckpt_value(A->r, ka->idx, &va, &err) || ckpt_value(B->r, kb->idx, &vb, &err)) {
            fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
            return -1;
        }
        if (!strcmp(va, vb)) return 0;
        fprintf(out, "%s: %s != %s\n", ka->name, va, vb);
        return 1;
    }
    char sa[128], sb[128];
    if (ea->ndim != eb->ndim || memcmp(ea->shape, eb->shape, (size_t)ea->ndim * sizeof *ea->shape)) {
        fprintf(out, "%s: shape %s vs %s\n", ka->name, fsdp_shape_str(ea->ndim, ea->shape, sa, sizeof sa),
                fsdp_shape_str(eb->ndim, eb->shape, sb, sizeof sb));
        return 1;
    }
    fsdp_dtype dt = compare_dtype(o, ea->dtype, eb->dtype);
    if (ea->dtype != eb->dtype)
        fprintf(out, "%s: dtype %s vs %s%s%s\n", ka->name, fsdp_dtype_name(ea->dtype), fsdp_dtype_name(eb->dtype),
                dt != FSDP_DT_F64 ? ", compared rounded to " : "", dt != FSDP_DT_F64 ? fsdp_dtype_name(dt) : "");
    double *xa = NULL, *xb = NULL;
    int rc = read_f64(o, A->r, ka, dt, &xa, &err);
    if (!rc) rc = read_f64(o, B->r, kb, dt, &xb, &err);
    int d = rc ? -1 : diff_values(o, xa, xb, fsdp_numel(ea->ndim, ea->shape), ka->name, out);
    if (rc) fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
    free(xa);
    free(xb);
    return d;
}

static void note_log(void *log, const char *msg) { fprintf(log, "fsdp-run ckpt: %s\n", msg); }

/* As ckpt inspect: the temporaries of saves are reported, never removed. */
static int open_side(const diff_opts *o, const char *path, diff_side *s, FILE *log) {
    fsdp_err err;
    memset(s, 0, sizeof *s);
    s->path = path;
    char said[512];
    int special = ckcl_open_inspect(path, &s->r, said, sizeof said, log); /* a container's or ZeRO's files as one */
    if (special == 1) return 1;
    if (special == 2 && o->layout) { /* --layout: a ZeRO checkpoint in fsdp-run's layout */
        ckpt_close(s->r);
        s->r = NULL;
        return ckcl_open_deepspeed(path, o->heads, o->kv_heads > 0 ? o->kv_heads : o->heads, &s->r, log);
    }
    int rc = special ? 0 : ckpt_open(path, CKPT_AUTO, &s->r, &err);
    if (rc) fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
    else if (ckpt_restarts(s->r))
        fprintf(log, "fsdp-run ckpt: %s changed while it was being opened (a save replaced it); reading the new save "
                "(%d restart%s)\n", path, ckpt_restarts(s->r), ckpt_restarts(s->r) == 1 ? "" : "s");
    ckpt_stale_report(path, note_log, log);
    return rc ? 1 : 0;
}

/* --layout: the side seen in fsdp-run's layout (auto: its own detected), named in the output. */
static int layout_side(const diff_opts *o, diff_side *s, FILE *log) {
    ckcl_req q = {o->layout, NULL, o->heads, o->kv_heads > 0 ? o->kv_heads : o->heads, NULL, 0};
    ckpt_reader *canon;
    char said[256];
    fsdp_err err;
    if (ckcl_wrap(&s->r, &q, &canon, said, sizeof said, &err)) {
        fprintf(log, "fsdp-run ckpt: error: %s: %s\n", s->path, err.msg);
        return 1;
    }
    fprintf(log, "fsdp-run ckpt: %s: layout %s\n", s->path, said);
    return 0;
}

/* Walks both sorted key lists; returns 1 if they differ, 0 if not, -1 on an error. */
static int diff_walk(const diff_opts *o, diff_side *A, diff_side *B, FILE *out, FILE *log) {
    int differ = 0;
    size_t i = 0, j = 0;
    while (i < A->n || j < B->n) {
        int c = i == A->n ? 1 : j == B->n ? -1 : strcmp(A->k[i].name, B->k[j].name);
        if (c) {
            const diff_side *s = c < 0 ? A : B;
            fprintf(out, "only in %s: %s\n", s->path, s->k[c < 0 ? i++ : j++].name);
            differ = 1;
            continue;
        }
        int d = diff_one(o, A, &A->k[i++], B, &B->k[j++], out, log);
        if (d < 0) return -1;
        differ |= d;
    }
    return differ;
}

int ckpt_cli_diff(int argc, char **argv, FILE *out, FILE *log) {
    diff_opts o;
    memset(&o, 0, sizeof o);
    int rc = diff_args(argc, argv, &o, log);
    diff_side A, B;
    if (!rc && open_side(&o, o.a, &A, log)) rc = 1;
    if (!rc && open_side(&o, o.b, &B, log)) {
        ckpt_close(A.r);
        rc = 1;
    }
    if (!rc && o.layout && (layout_side(&o, &A, log) || layout_side(&o, &B, log))) {
        if (A.r) ckpt_close(A.r);
        if (B.r) ckpt_close(B.r);
        rc = 1;
    }
    if (rc) {
        ckpt_keys_free(&o.ignore);
        return rc;
    }
    fsdp_err err;
    int differ = side_keys(&o, &A, 1, &err) || side_keys(&o, &B, 0, &err) ? -1 : 0;
    if (differ) fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
    else differ = diff_walk(&o, &A, &B, out, log);
    if (differ >= 0 && o.names)
        fprintf(out, "left out the training entries (optimizer.*, train_state.*, lr_scheduler.*, dataloader.*): "
                     "%zu of %s, %zu of %s\n", A.training, o.a, B.training, o.b);
    if (!differ)
        fprintf(out, "equal: %s and %s (rtol %g, atol %g%s)\n", o.a, o.b, o.rtol, o.atol,
                o.round ? ", dtypes rounded" : "");
    side_free(&A);
    side_free(&B);
    ckpt_keys_free(&o.ignore);
    return differ < 0 ? 1 : differ;
}
