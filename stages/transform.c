/* Stage `transform`: the post-init weight operations that make the FSDP1 path necessary
 * today, made explicit and ordered. Works on full parameters (after init-cpu) and on shards
 * (after init-meta / load-ckpt): parameters of equal shape are sharded identically, so every
 * operation is row-aligned and local to each rank.
 *
 * with: ops: a list, each one of
 *   {copy: {from: GLOB, to: GLOB}}   every parameter matching `to` gets the values of `from`
 *                                    with its wildcards filled by the last captures of the
 *                                    target (so `from: output.weight, to: tok_embeddings.weight`
 *                                    ties, and `from: layers.0.**, to: layers.*.**` copies layer 0
 *                                    into every layer)
 *   {copy: {to: GLOB, replace: {TEXT: NEW, ...}}}
 *                                    every parameter matching `to` gets the values of the parameter
 *                                    whose name is its own with each TEXT replaced by NEW (every
 *                                    occurrence, in order): Bagel's init_moe is
 *                                    `{copy: {to: "**_moe_gen**", replace: {_moe_gen: ""}}}`
 *   {scale: {keys: GLOB|[GLOB...], by: FLOAT}}
 *   {fill: {keys: GLOB|[GLOB...], value: FLOAT}}
 *   {cast: {keys: GLOB|[GLOB...], dtype: f32|bf16|f16}}  rounds the values, saved in that dtype
 *   {load: {path: CKPT, keys: GLOB|[GLOB...], map: {GLOB: NAME}}}  take these parameters from
 *                                    another checkpoint (map renames its keys)
 * Globs: `*` matches one dotted component, `**` one or more. A pattern that matches nothing
 * or a copy between different shapes is an error, and so is a source (of a copy or a scale) that holds
 * no value yet (declared with init none, not loaded). A copy, fill or load gives its targets a value;
 * every parameter keeps its dtype (values written into a bf16 / f16 parameter are rounded to it).
 * Shards on the GPU are changed by download, change, upload per parameter (copy between two device
 * shards of the same dtype stays on the device). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_agree.h"
#include "ckpt/namemap.h"
#include "ckpt/state_io.h"
#include "stages/stages.h"
#include "runtime/nearest.h"

static const fsdp_param_spec PARAMS[] = {
    {"ops", FSDP_T_LIST, 1, NULL, NULL, "ordered operations: copy, scale, fill, cast, load"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params|full_params", NULL};

static const char *op_name(const fsdp_value *op, const fsdp_value **body) {
    if (fsdp_value_type(op) != FSDP_V_MAP || fsdp_value_size(op) != 1) return NULL;
    *body = fsdp_value_item(op, 0);
    return fsdp_value_key(op, 0);
}

/* keys: a glob or a list of globs */
static int key_matches(const fsdp_value *keys, const char *name) {
    if (fsdp_value_type(keys) == FSDP_V_SCALAR) return nmap_glob_match(fsdp_value_text(keys), name, NULL) >= 0;
    for (size_t i = 0; i < fsdp_value_size(keys); i++) {
        const char *t = fsdp_value_text(fsdp_value_item(keys, i));
        if (t && nmap_glob_match(t, name, NULL) >= 0) return 1;
    }
    return 0;
}

/* copy: {from, to} or {to, replace: {TEXT: NEW, ...}}. */
static int check_copy(const fsdp_value *b, fsdp_err *err) {
    const fsdp_value *from = fsdp_value_get(b, "from"), *rep = fsdp_value_get(b, "replace");
    for (size_t i = 0; i < fsdp_value_size(b); i++) {
        const char *k = fsdp_value_key(b, i);
        char hint[300];
        if (strcmp(k, "from") && strcmp(k, "to") && strcmp(k, "replace"))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(b, i),
                               "transform: copy: unknown key '%s'%s (from, to, replace)", k,
                               nearest_hint(k, "from, to, replace", hint, sizeof hint));
    }
    if (from && rep)
        return fsdp_err_at(err, FSDP_E_INVALID, rep, "transform: copy takes either 'from' or 'replace', not both");
    if (!fsdp_value_text(fsdp_value_get(b, "to")) || (from && !fsdp_value_text(from)))
        return fsdp_err_at(err, FSDP_E_INVALID, b, "transform: copy.from and copy.to are names or globs");
    if (rep && (fsdp_value_type(rep) != FSDP_V_MAP || !fsdp_value_size(rep)))
        return fsdp_err_at(err, FSDP_E_INVALID, rep, "transform: copy.replace is a map {TEXT: NEW, ...}");
    for (size_t i = 0; rep && i < fsdp_value_size(rep); i++) {
        const fsdp_value *v = fsdp_value_item(rep, i);
        if (!*fsdp_value_key(rep, i))
            return fsdp_err_at(err, FSDP_E_INVALID, rep, "transform: copy.replace: the text to replace is empty");
        if (fsdp_value_type(v) != FSDP_V_SCALAR && fsdp_value_type(v) != FSDP_V_NULL)
            return fsdp_err_at(err, FSDP_E_INVALID, v, "transform: copy.replace: '%s' must be replaced by text",
                               fsdp_value_key(rep, i));
    }
    return 0;
}

static int transform_check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *ops = fsdp_value_get(with, "ops");
    for (size_t i = 0; i < fsdp_value_size(ops); i++) {
        const fsdp_value *op = fsdp_value_item(ops, i), *b;
        const char *n = op_name(op, &b);
        if (!n)
            return fsdp_err_at(err, FSDP_E_INVALID, op, "transform: each op is a map with one key: copy, scale, fill, cast or load");
        const char *need[3] = {NULL, NULL, NULL};
        if (!strcmp(n, "copy")) need[0] = "to", need[1] = fsdp_value_get(b, "replace") ? "replace" : "from";
        else if (!strcmp(n, "scale")) need[0] = "keys", need[1] = "by";
        else if (!strcmp(n, "fill")) need[0] = "keys", need[1] = "value";
        else if (!strcmp(n, "cast")) need[0] = "keys", need[1] = "dtype";
        else if (!strcmp(n, "load")) need[0] = "path", need[1] = "keys";
        else return fsdp_err_at(err, FSDP_E_INVALID, op, "transform: unknown op '%s' (copy, scale, fill, cast, load)", n);
        if (fsdp_value_type(b) != FSDP_V_MAP) return fsdp_err_at(err, FSDP_E_INVALID, b, "transform: %s needs a map", n);
        for (int k = 0; k < 2; k++)
            if (!fsdp_value_get(b, need[k]))
                return fsdp_err_at(err, FSDP_E_INVALID, b, "transform: %s needs '%s'", n, need[k]);
        double x;
        if (!strcmp(n, "scale") && fsdp_value_float(fsdp_value_get(b, "by"), &x))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(b, "by"), "transform: scale.by must be a number");
        if (!strcmp(n, "fill") && fsdp_value_float(fsdp_value_get(b, "value"), &x))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(b, "value"), "transform: fill.value must be a number");
        const char *dt = fsdp_value_text(fsdp_value_get(b, "dtype"));
        if (!strcmp(n, "cast") && (!dt || (strcmp(dt, "f32") && strcmp(dt, "bf16") && strcmp(dt, "f16"))))
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(b, "dtype"),
                               "transform: cast.dtype must be f32, bf16 or f16");
        if (!strcmp(n, "copy")) {
            int rc = check_copy(b, err);
            if (rc) return rc;
        }
    }
    return 0;
}

static int same_shape(const state_param *a, const state_param *b) {
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape);
}

/* fill the wildcards of `from` with the last captures of `name` under `to` */
static int source_name(const char *from, const char *to, const char *name, char *out, size_t cap) {
    nmap_span caps[NMAP_MAX_CAPTURES];
    int nc = nmap_glob_match(to, name, caps);
    if (nc < 0) return -1;
    int nf = 0;
    for (const char *p = from; *p; p++)
        if (*p == '*') {
            nf++;
            if (p[1] == '*') p++;
        }
    if (nf > nc) return -2;
    size_t o = 0;
    int k = nc - nf;
    for (const char *p = from; *p && o + 1 < cap; p++) {
        if (*p != '*') {
            out[o++] = *p;
            continue;
        }
        if (p[1] == '*') p++;
        for (size_t q = 0; q < caps[k].len && o + 1 < cap; q++) out[o++] = name[caps[k].off + q];
        k++;
    }
    out[o] = '\0';
    return 0;
}

/* The source of `name` under copy.replace: every occurrence of each key replaced by its value, the
 * keys in order. -1 when the result does not fit. */
static int replaced_name(const fsdp_value *rep, const char *name, char *out, size_t cap) {
    char cur[1024], next[1024];
    snprintf(cur, sizeof cur, "%s", name);
    for (size_t i = 0; i < fsdp_value_size(rep); i++) {
        const char *from = fsdp_value_key(rep, i), *to = fsdp_value_text(fsdp_value_item(rep, i));
        size_t lf = strlen(from), o = 0;
        if (!to) to = "";
        for (const char *p = cur; *p;) {
            const char *hit = strstr(p, from);
            size_t keep = hit ? (size_t)(hit - p) : strlen(p);
            int w = snprintf(next + o, sizeof next - o, "%.*s%s", (int)keep, p, hit ? to : "");
            if (w < 0 || (size_t)w >= sizeof next - o) return -1;
            o += (size_t)w;
            p += keep + (hit ? lf : 0);
        }
        next[o] = '\0';
        memcpy(cur, next, o + 1);
    }
    if (strlen(cur) >= cap) return -1;
    memcpy(out, cur, strlen(cur) + 1);
    return 0;
}

static void round_values(float *v, size_t n, fsdp_dtype dt) {
    if (dt == FSDP_DT_BF16)
        for (size_t k = 0; k < n; k++) v[k] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(v[k]));
    else if (dt == FSDP_DT_F16)
        for (size_t k = 0; k < n; k++) v[k] = fsdp_f16_to_f32(fsdp_f32_to_f16(v[k]));
}

/* dst's rows = src's rows (same shape, so the same local rows), wherever each lives, rounded to dst's
 * dtype when it is narrower than src's */
static int copy_values(fsdp_state *s, const state_param *src, state_param *dst, int defer, fsdp_err *err) {
    size_t bytes = state_param_local_numel(dst) * sizeof(float);
    int narrow = (dst->dtype == FSDP_DT_BF16 || dst->dtype == FSDP_DT_F16) && src->dtype != dst->dtype;
    fsdp_dtype round = narrow ? dst->dtype : src->src_round;
    if (defer && src->deferred && src->src && (!narrow || !src->src_round || src->src_round == dst->dtype) &&
        state_place_of(dst, STATE_DATA) == STATE_HOST && !dst->grad && !state_param_has_moments(dst))
        return state_param_defer(s, dst, src->src, round, err); /* dst's rows: src's producer's, when needed */
    if (!narrow && state_place_of(src, STATE_DATA) == STATE_DEVICE && state_place_of(dst, STATE_DATA) == STATE_DEVICE) {
        int rc = dev_copy_d2d(s->dev, dst->d_data, src->d_data, bytes, DEV_STREAM_COMPUTE, err);
        if (!rc) rc = dev_stream_sync(s->dev, DEV_STREAM_COMPUTE, err);
        return rc ? fsdp_err_prefix(err, "transform copy %s -> %s", src->name, dst->name) : 0;
    }
    float *from, *to;
    int rc = state_param_map(s, src, STATE_DATA, &from, err);
    if (rc) return rc;
    if ((rc = state_param_map(s, dst, STATE_DATA, &to, err))) {
        state_param_unmap(s, (state_param *)src, STATE_DATA, from, 0, err);
        return rc;
    }
    memcpy(to, from, bytes);
    if (narrow) round_values(to, state_param_local_numel(dst), dst->dtype);
    rc = state_param_unmap(s, dst, STATE_DATA, to, 1, err);
    fsdp_err e2;
    state_param_unmap(s, (state_param *)src, STATE_DATA, from, 0, &e2);
    return rc;
}

/* The source parameter of copy target dst (NULL with *skip when dst is not a target). */
static int copy_source(fsdp_state *s, const fsdp_value *b, const state_param *dst, state_param **src, fsdp_err *err) {
    const char *from = fsdp_value_text(fsdp_value_get(b, "from")), *to = fsdp_value_text(fsdp_value_get(b, "to"));
    const fsdp_value *rep = fsdp_value_get(b, "replace");
    char src_name[1024];
    *src = NULL;
    if (rep) {
        if (nmap_glob_match(to, dst->name, NULL) < 0) return 0;
        if (replaced_name(rep, dst->name, src_name, sizeof src_name))
            return fsdp_err_at(err, FSDP_E_INVALID, rep, "transform copy: the source name of %s is too long", dst->name);
    } else {
        int m = source_name(from, to, dst->name, src_name, sizeof src_name);
        if (m == -1) return 0;
        if (m == -2)
            return fsdp_err_at(err, FSDP_E_INVALID, b, "transform copy: '%s' has more wildcards than '%s'", from, to);
    }
    *src = state_find(s, src_name);
    if (!*src)
        return fsdp_err_at(err, FSDP_E_INVALID, b, "transform copy: no parameter %s (source of %s)", src_name, dst->name);
    return 0;
}

static int do_copy(fsdp_state *s, const fsdp_value *b, int defer, fsdp_err *err) {
    const char *to = fsdp_value_text(fsdp_value_get(b, "to"));
    size_t hits = 0;
    for (size_t i = 0; i < s->n; i++) {
        state_param *dst = &s->p[i], *src;
        int rc = copy_source(s, b, dst, &src, err);
        if (rc) return rc;
        if (!src) continue;
        if (!same_shape(src, dst)) {
            char a[96], c[96];
            return fsdp_err_at(err, FSDP_E_INVALID, b, "transform copy: %s %s and %s %s have different shapes", src->name,
                               fsdp_shape_str(src->ndim, src->shape, a, sizeof a), dst->name,
                               fsdp_shape_str(dst->ndim, dst->shape, c, sizeof c));
        }
        if (src->no_value)
            return fsdp_err_at(err, FSDP_E_INVALID, b,
                               "transform copy: %s (source of %s) holds no value yet (init none, not loaded: load it "
                               "or give it an init rule before this copy)",
                               src->name, dst->name);
        hits++;
        if (src == dst) continue;
        if ((rc = copy_values(s, src, dst, defer, err))) return rc;
        dst->no_value = 0;
    }
    if (!hits) return fsdp_err_at(err, FSDP_E_INVALID, b, "transform copy: '%s' matches no parameter", to);
    return 0;
}

static int do_elementwise(fsdp_state *s, const char *op, const fsdp_value *b, fsdp_err *err) {
    const fsdp_value *keys = fsdp_value_get(b, "keys");
    double x = 0;
    fsdp_value_float(fsdp_value_get(b, !strcmp(op, "scale") ? "by" : "value"), &x);
    const char *dt = fsdp_value_text(fsdp_value_get(b, "dtype"));
    size_t hits = 0;
    for (size_t i = 0; i < s->n; i++) {
        state_param *p = &s->p[i];
        if (!key_matches(keys, p->name)) continue;
        hits++;
        if (p->no_value && strcmp(op, "fill")) {
            if (!strcmp(op, "cast")) {
                p->dtype = fsdp_dtype_from_name(dt); /* a value loaded later is rounded to it */
                continue;
            }
            return fsdp_err_at(err, FSDP_E_INVALID, keys, "transform %s: %s holds no value yet (init none, not loaded)",
                               op, p->name);
        }
        size_t n = state_param_local_numel(p);
        float *v; /* the rows in host memory: downloaded, changed and uploaded when on the GPU */
        int rc = state_param_map(s, p, STATE_DATA, &v, err);
        if (rc) return rc;
        if (!strcmp(op, "scale"))
            for (size_t k = 0; k < n; k++) v[k] = (float)(v[k] * x);
        else if (!strcmp(op, "fill"))
            for (size_t k = 0; k < n; k++) v[k] = (float)x;
        else
            p->dtype = fsdp_dtype_from_name(dt);
        round_values(v, n, p->dtype);
        p->no_value = 0;
        if ((rc = state_param_unmap(s, p, STATE_DATA, v, 1, err))) return rc;
    }
    if (!hits) return fsdp_err_at(err, FSDP_E_INVALID, keys, "transform %s: the keys match no parameter", op);
    return 0;
}

static int do_load(fsdp_ctx *ctx, fsdp_state *s, const fsdp_value *b, fsdp_err *err) {
    const fsdp_value *keys = fsdp_value_get(b, "keys"), *map = fsdp_value_get(b, "map");
    size_t nk = fsdp_value_type(keys) == FSDP_V_SCALAR ? 1 : fsdp_value_size(keys);
    size_t nm = fsdp_value_size(map);
    const char **only = calloc(nk ? nk : 1, sizeof *only), **from = calloc(nm ? nm : 1, sizeof *from),
               **to = calloc(nm ? nm : 1, sizeof *to);
    int rc = 0;
    if (!only || !from || !to) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < nk; i++)
        only[i] = fsdp_value_text(fsdp_value_type(keys) == FSDP_V_SCALAR ? keys : fsdp_value_item(keys, i));
    for (size_t i = 0; !rc && i < nm; i++) {
        from[i] = fsdp_value_key(map, i);
        to[i] = fsdp_value_text(fsdp_value_item(map, i));
        if (!to[i]) to[i] = "";
    }
    if (!rc) {
        size_t hits = 0;
        for (size_t i = 0; i < s->n; i++) hits += key_matches(keys, s->p[i].name);
        if (!hits) rc = fsdp_err_at(err, FSDP_E_INVALID, keys, "transform load: the keys match no parameter");
    }
    /* every rank opens (a collective: whatever its own verdict so far) and all read one save */
    char at[4400];
    const char *path = fsdp_value_text(fsdp_value_get(b, "path"));
    snprintf(at, sizeof at, "%s", path ? path : "");
    int restarts = 0;
    ckpt_reader *r = NULL;
    fsdp_err oerr;
    int orc = ckpt_open_agreed(stage_comm(ctx), CKPT_AUTO, NULL, NULL, at, sizeof at, &r, &restarts, &oerr);
    if (!rc && orc) *err = oerr, rc = orc;
    if (!rc && restarts)
        fsdp_log(ctx, FSDP_LOG_WARN, "transform load: %s changed while it was being opened (a save replaced it); "
                 "read the new save (%d restart%s)", at, restarts, restarts == 1 ? "" : "s");
    if (!rc) {
        sio_load_opts o;
        memset(&o, 0, sizeof o);
        o.strict = 1;
        o.load_optimizer = 0;
        o.only = only;
        o.n_only = nk;
        o.rename_from = from;
        o.rename_to = to;
        o.n_rename = nm;
        sio_load_result res;
        int64_t ts = s->train_step, tok = s->tokens_seen;
        uint64_t dp = s->data_pos;
        /* the checkpoint reader fills host arrays: parameters on the GPU that the keys select come
         * to the host for the read (sio_load touches only those) and go back after it */
        unsigned char *moved = calloc(s->n ? s->n : 1, 1);
        if (!moved) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        for (size_t i = 0; !rc && i < s->n; i++) {
            if (state_place_of(&s->p[i], STATE_DATA) != STATE_DEVICE || !key_matches(keys, s->p[i].name)) continue;
            if (!(rc = state_param_move(s, &s->p[i], STATE_DATA, STATE_HOST, err))) moved[i] = 1;
        }
        o.reader = r;
        if (!rc) rc = sio_load(s, at, &o, &res, err);
        s->train_step = ts, s->tokens_seen = tok, s->data_pos = dp; /* weights only */
        for (size_t i = 0; moved && i < s->n; i++) {
            if (!moved[i]) continue;
            fsdp_err e2;
            int mrc = state_param_move(s, &s->p[i], STATE_DATA, STATE_DEVICE, rc ? &e2 : err);
            if (!rc) rc = mrc;
        }
        free(moved);
        if (rc) fsdp_err_prefix(err, "transform load");
    }
    ckpt_close(r);
    free(only);
    free(from);
    free(to);
    return rc;
}

static int transform_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "transform: no model in the context");
    const fsdp_value *ops = fsdp_value_get(with, "ops");
    for (size_t i = 0; i < fsdp_value_size(ops); i++) {
        const fsdp_value *op = fsdp_value_item(ops, i), *b;
        const char *n = op_name(op, &b);
        int rc = !strcmp(n, "copy") ? do_copy(s, b, state_defer_allowed(ctx), err)
                 : !strcmp(n, "load") ? do_load(ctx, s, b, err)
                                      : do_elementwise(s, n, b, err);
        if (rc) return rc;
        fsdp_log(ctx, FSDP_LOG_INFO, "transform: %s done", n);
    }
    fsdp_ctx_metric(ctx, "ops", (double)fsdp_value_size(ops));
    return 0;
}

const fsdp_stage_desc stage_transform = {
    FSDP_STAGE_DESC_INIT,
    "transform",
    "post-init weight ops on named parameters: copy (globs), scale, fill, cast, load",
    PARAMS,
    NEEDS,
    NULL,
    transform_run,
    transform_check,
};
