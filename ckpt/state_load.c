/* Loading checkpoints into the sharded state: each rank reads only its rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "ckpt/state_io.h"

#define NAME_CAP 1024

/* The state name a checkpoint key stands for under the options, or "" when it maps to none. */
static int map_key(const fsdp_state *s, const sio_load_opts *o, nmap_rules *rules, const char *key, char *out,
                   nmap_info *info, fsdp_err *err) {
    char a[NAME_CAP], b[NAME_CAP];
    const char *k = key;
    memset(info, 0, sizeof *info);
    if (o->strip_prefix && *o->strip_prefix) {
        const char *r = nmap_strip_prefix(k, o->strip_prefix);
        if (!r) {
            out[0] = '\0';
            return 0;
        }
        k = r;
    }
    if (o->add_prefix && *o->add_prefix) {
        int rc = nmap_add_prefix(o->add_prefix, k, a, sizeof a, err);
        if (rc) return rc;
        k = a;
    }
    if (rules) {
        nmap_status st;
        int rule;
        int rc = nmap_rules_apply(rules, k, b, sizeof b, &st, &rule, err);
        if (rc) return rc;
        if (st == NMAP_DROPPED) {
            out[0] = '\0';
            return 0;
        }
        snprintf(a, sizeof a, "%s", b);
        k = a;
    }
    if (o->names == SIO_NAMES_HF) {
        fsdp_err e2;
        if (nmap_map(NMAP_HF_TO_TT, k, s->cfg.n_heads, s->cfg.n_kv_heads, out, NAME_CAP, info, &e2)) {
            out[0] = '\0'; /* not a model parameter name */
            return 0;
        }
        if (info->dropped) out[0] = '\0';
        return 0;
    }
    snprintf(out, NAME_CAP, "%s", k);
    return 0;
}

static int matches_only(const sio_load_opts *o, const char *name) {
    if (!o->only) return 1;
    for (size_t i = 0; i < o->n_only; i++)
        if (nmap_glob_match(o->only[i], name, NULL) >= 0) return 1;
    return 0;
}

/* Rows [row0, row0+rows) of checkpoint tensor ci into dst (f32), un-permuting HF q/k rows. */
static int read_local(ckpt_reader *r, size_t ci, const state_param *p, const nmap_info *info, float *dst,
                      uint64_t *bytes, fsdp_err *err) {
    if (p->rows == 0) return 0;
    const ckpt_entry *e = ckpt_entry_at(r, ci);
    if (!info || info->qk == NMAP_QK_NONE)
        return *bytes += (uint64_t)p->rows * (uint64_t)p->row_numel * fsdp_dtype_size(e->dtype),
               ckpt_read_rows(r, ci, p->row0, p->row0 + p->rows, dst, FSDP_DT_F32, err);
    int64_t total = p->shape[0], lo, hi;
    int rc = nmap_perm_src_range(NMAP_HF_TO_TT, total, info->heads, p->row0, p->row0 + p->rows, &lo, &hi, err);
    if (rc) return rc;
    float *tmp = malloc((size_t)((hi - lo) * p->row_numel) * sizeof(float));
    if (!tmp) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    rc = ckpt_read_rows(r, ci, lo, hi, tmp, FSDP_DT_F32, err);
    if (!rc)
        rc = nmap_permute_rows_part(NMAP_HF_TO_TT, dst, p->row0, p->row0 + p->rows, tmp, lo, hi, total, p->row_numel,
                                    sizeof(float), info->heads, err);
    *bytes += (uint64_t)(hi - lo) * (uint64_t)p->row_numel * fsdp_dtype_size(e->dtype);
    free(tmp);
    return rc;
}

/* the strict load's passes over whole parameters, on every thread for large ones */
#define PAR_NUMEL ((size_t)1 << 20)

static void fill_nan(float *d, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_NUMEL)
    for (size_t k = 0; k < n; k++) d[k] = NAN;
}

static int has_nan(const float *d, size_t n) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= PAR_NUMEL)
    for (size_t k = 0; k < n; k++) bad |= isnan(d[k]) != 0;
    return bad;
}

static int shape_eq(const ckpt_entry *e, const state_param *p) {
    if (e->ndim != p->ndim) return 0;
    for (int d = 0; d < p->ndim; d++)
        if (e->shape[d] != p->shape[d]) return 0;
    return 1;
}

static void append(char *buf, size_t cap, const char *fmt, const char *a, const char *b) {
    size_t l = strlen(buf);
    if (l + 8 >= cap) return;
    snprintf(buf + l, cap - l, fmt, a, b);
}

int sio_load(fsdp_state *s, const char *path, const sio_load_opts *o, sio_load_result *res, fsdp_err *err) {
    memset(res, 0, sizeof *res);
    ckpt_reader *r;
    int rc = ckpt_open(path, o->format, &r, err);
    if (rc) return rc;
    nmap_rules *rules = NULL;
    if (o->n_rename) {
        if ((rc = nmap_rules_new(&rules, err))) goto out;
        for (size_t i = 0; i < o->n_rename && !rc; i++) rc = nmap_rules_add(rules, o->rename_from[i], o->rename_to[i], err);
        if (rc) goto out;
    }
    size_t nck = ckpt_count(r);
    int *loaded = calloc(s->n ? s->n : 1, sizeof *loaded);
    int *used = calloc(nck ? nck : 1, sizeof *used);
    char *problems = calloc(1, 8192);
    if (!loaded || !used || !problems) {
        free(loaded);
        free(used);
        free(problems);
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        goto out;
    }
    int want_opt = o->load_optimizer;
    int has_opt = 0;
    for (size_t ci = 0; ci < nck; ci++)
        if (!strncmp(ckpt_entry_at(r, ci)->name, "optimizer.state.", 16)) has_opt = 1;
    if (want_opt == 1 && !has_opt) {
        rc = fsdp_err_set(err, FSDP_E_INVALID, "load-ckpt %s: load_optimizer is true but the checkpoint has no "
                                               "optimizer.state.* keys", path);
        goto done;
    }
    int do_opt = want_opt == 1 || (want_opt == -1 && has_opt);
    if (do_opt && (rc = state_alloc_optimizer(s, err))) goto done;
    for (size_t ci = 0; ci < nck && !rc; ci++) {
        const ckpt_entry *e = ckpt_entry_at(r, ci);
        const char *key = e->name;
        if (!strncmp(key, "optimizer.", 10) || !strncmp(key, "train_state.", 12) || !strncmp(key, "lr_scheduler.", 13) ||
            !strncmp(key, "dataloader.", 11)) {
            used[ci] = 1; /* handled below */
            continue;
        }
        char name[NAME_CAP];
        nmap_info info;
        if ((rc = map_key(s, o, rules, key, name, &info, err))) break;
        if (info.dropped) {
            used[ci] = 1;
            continue;
        }
        state_param *p = name[0] ? state_find(s, name) : NULL;
        if (!p || !e->is_tensor) continue;
        if (!matches_only(o, p->name)) {
            used[ci] = 1;
            continue;
        }
        used[ci] = 1;
        if (!shape_eq(e, p)) {
            char a[128], b[128];
            char msg[600];
            snprintf(msg, sizeof msg, "%s has shape %s in the checkpoint, the model needs %s",
                     key, fsdp_shape_str(e->ndim, e->shape, a, sizeof a), fsdp_shape_str(p->ndim, p->shape, b, sizeof b));
            append(problems, 8192, "\n  %s%s", msg, "");
            continue;
        }
        if ((rc = read_local(r, ci, p, &info, p->data, &res->bytes_read, err))) break;
        loaded[p - s->p] = 1;
        res->params_loaded++;
    }
    if (!rc && do_opt) {
        for (size_t i = 0; i < s->n && !rc; i++) {
            state_param *p = &s->p[i];
            if (!loaded[i] && o->only) continue;
            const char *kinds[2] = {"exp_avg", "exp_avg_sq"};
            float *dst[2] = {p->exp_avg, p->exp_avg_sq};
            for (int k = 0; k < 2 && !rc; k++) {
                char key[NAME_CAP + 64];
                snprintf(key, sizeof key, "optimizer.state.%s.%s", p->name, kinds[k]);
                long ci = ckpt_find(r, key);
                if (ci < 0) {
                    append(problems, 8192, "\n  optimizer state %s%s missing", key, "");
                    continue;
                }
                const ckpt_entry *e = ckpt_entry_at(r, (size_t)ci);
                if (!shape_eq(e, p)) {
                    append(problems, 8192, "\n  %s has the wrong shape%s", key, "");
                    continue;
                }
                rc = ckpt_read_rows(r, (size_t)ci, p->row0, p->row0 + p->rows, dst[k], FSDP_DT_F32, err);
                res->bytes_read += (uint64_t)p->rows * (uint64_t)p->row_numel * 4;
            }
            if (rc) break;
            char key[NAME_CAP + 64];
            snprintf(key, sizeof key, "optimizer.state.%s.step", p->name);
            long ci = ckpt_find(r, key);
            if (ci >= 0) {
                double st = 0;
                if ((rc = ckpt_read_rows(r, (size_t)ci, 0, 1, &st, FSDP_DT_F64, err))) break;
                s->opt_step = (int64_t)llround(st);
            }
            struct {
                const char *k;
                double *dst;
            } hyper[] = {{"lr", &s->lr}, {"eps", &s->eps}, {"weight_decay", &s->weight_decay}};
            for (int h = 0; h < 3; h++) {
                snprintf(key, sizeof key, "optimizer.param_groups.%s.%s", p->name, hyper[h].k);
                long hi = ckpt_find(r, key);
                const char *t = hi >= 0 ? ckpt_value_text(r, (size_t)hi) : NULL;
                if (t) *hyper[h].dst = strtod(t, NULL);
            }
            snprintf(key, sizeof key, "optimizer.param_groups.%s.betas", p->name);
            long bi = ckpt_find(r, key);
            const char *bt = bi >= 0 ? ckpt_value_text(r, (size_t)bi) : NULL;
            if (bt) sscanf(bt, "(%lf, %lf)", &s->beta1, &s->beta2);
            res->optimizer_loaded++;
        }
        if (!rc) s->has_optimizer = 1;
    }
    if (!rc) {
        const char *keys[3] = {"train_state.step", "train_state.ntokens_seen", "train_state.data_pos"};
        int64_t vals[3] = {-1, -1, -1};
        for (int k = 0; k < 3; k++) {
            long ci = ckpt_find(r, keys[k]);
            if (ci >= 0 && ckpt_value_int(r, (size_t)ci, &vals[k]) == 0 && k == 0) res->has_train_state = 1;
        }
        if (vals[0] >= 0) {
            s->train_step = vals[0];
            s->data_pos = (uint64_t)(vals[2] >= 0 ? vals[2] : vals[0]);
            if (vals[1] >= 0) s->tokens_seen = vals[1];
        }
    }
    if (!rc && o->strict) {
        for (size_t i = 0; i < s->n; i++) {
            if (loaded[i] || !matches_only(o, s->p[i].name)) continue;
            append(problems, 8192, "\n  %s not restored (no such key in the checkpoint%s)", s->p[i].name,
                   o->names == SIO_NAMES_HF ? " under its Hugging Face name" : "");
        }
        for (size_t ci = 0; ci < nck; ci++)
            if (!used[ci] && ckpt_entry_at(r, ci)->is_tensor)
                append(problems, 8192, "\n  unexpected key %s in the checkpoint%s", ckpt_entry_at(r, ci)->name, "");
        /* NaN left over in a restored parameter means the checkpoint itself holds NaN */
        for (size_t i = 0; i < s->n; i++) {
            if (!loaded[i]) continue;
            if (has_nan(s->p[i].data, state_param_local_numel(&s->p[i])))
                append(problems, 8192, "\n  %s holds NaN after loading%s", s->p[i].name, "");
        }
    }
    if (!rc && problems[0]) {
        if (o->strict || strstr(problems, "shape"))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "load-ckpt %s (strict) failed:%s", path, problems);
    }
done:
    /* strict: every parameter not restored (or whose read failed) ends as NaN, so that a
     * missed one cannot pass unnoticed; a restored one was written whole by its reader (the
     * readers check that the stored chunks tile each tensor), so it needs no NaN pass first */
    if (o->strict)
        for (size_t i = 0; i < s->n; i++)
            if (!loaded[i] && matches_only(o, s->p[i].name))
                fill_nan(s->p[i].data, state_param_local_numel(&s->p[i]));
    free(loaded);
    free(used);
    free(problems);
out:
    nmap_rules_free(rules);
    ckpt_close(r);
    return rc;
}
