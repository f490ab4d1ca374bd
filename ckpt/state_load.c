/* Loading checkpoints into the sharded state: each rank reads only its rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_pread.h"
#include "ckpt/key_layout.h"
#include "ckpt/namemap.h"
#include "ckpt/pickle.h"
#include "ckpt/state_load_hint.h"
#include "ckpt/state_load_defer.h"
#include "ckpt/state_load_parts.h"
#include "ckpt/state_io.h"
#include "ckpt/tensor_permute.h"

#define NAME_CAP 1024

static int any_glob(const char *const *globs, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (globs[i] && nmap_glob_match(globs[i], key, NULL) >= 0) return 1;
    return 0;
}

/* A key (its prefix removed) the options drop on purpose. */
static int dropped_on_purpose(const sio_load_opts *o, const char *k) {
    if (any_glob(o->drop, o->n_drop, k)) return 1;
    return o->keep_given && !any_glob(o->keep, o->n_keep, k);
}

/* The state name a checkpoint key stands for under the options, or "" when it maps to none. */
static int map_key(const fsdp_state *s, const sio_load_opts *o, nmap_rules *rules, const char *key, char *out,
                   nmap_info *info, fsdp_err *err) {
    char a[NAME_CAP], b[NAME_CAP];
    const char *k = key;
    memset(info, 0, sizeof *info);
    if (o->n_strip) {
        const char *r = NULL;
        for (size_t i = 0; i < o->n_strip && !r; i++) r = nmap_strip_prefix(k, o->strip[i] ? o->strip[i] : "");
        if (!r) {
            out[0] = '\0';
            return 0;
        }
        k = r;
    } else if (o->strip_prefix && *o->strip_prefix) {
        const char *r = nmap_strip_prefix(k, o->strip_prefix);
        if (!r) {
            out[0] = '\0';
            return 0;
        }
        k = r;
    }
    if (dropped_on_purpose(o, k)) {
        info->dropped = 1;
        out[0] = '\0';
        return 0;
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
        nmap_hf hf;
        sio_hf_facts(s, &hf);
        if (nmap_map_hf(NMAP_HF_TO_TT, k, &hf, out, NAME_CAP, info, &e2)) {
            out[0] = '\0'; /* not a model parameter name */
            return 0;
        }
        if (info->dropped) out[0] = '\0';
        /* tied embeddings: transformers ties lm_head to embed_tokens after loading, so a stored
         * lm_head.weight is not a parameter of its own (save_pretrained leaves it out) */
        if (s->hf.has && s->hf.tied && !strcmp(out, "output.weight")) {
            info->dropped = 1;
            out[0] = '\0';
        }
        return 0;
    }
    snprintf(out, NAME_CAP, "%s", k);
    return 0;
}

/* name matches one of o->only's globs */
static int glob_any(const sio_load_opts *o, const char *name) {
    for (size_t i = 0; i < o->n_only; i++)
        if (nmap_glob_match(o->only[i], name, NULL) >= 0) return 1;
    return 0;
}

static int matches_only(const sio_load_opts *o, const fsdp_state *s, const state_param *p) {
    if (o->select && !o->select[p - s->p]) return 0;
    return !o->only || glob_any(o, p->name);
}

/* Rows [row0, row0+rows) of checkpoint tensor ci into dst (f32), un-permuting HF q/k rows; *nan
 * (may be NULL): 1 when a value read is NaN, checked by the reader while the data is in cache. */
static int read_local(ckpt_reader *r, size_t ci, const state_param *p, const nmap_info *info, float *dst,
                      uint64_t *bytes, int *nan, fsdp_err *err) {
    if (p->rows == 0) return 0;
    const ckpt_entry *e = ckpt_entry_at(r, ci);
    if (!info || info->qk == NMAP_QK_NONE)
        return *bytes += (uint64_t)p->rows * (uint64_t)p->row_numel * fsdp_dtype_size(e->dtype),
               ckpt_read_rows_nan(r, ci, p->row0, p->row0 + p->rows, dst, FSDP_DT_F32, nan, err);
    int64_t total = p->shape[0], lo, hi;
    int rc = nmap_perm_src_range(NMAP_HF_TO_TT, total, info->heads, p->row0, p->row0 + p->rows, &lo, &hi, err);
    if (rc) return rc;
    float *tmp = malloc((size_t)((hi - lo) * p->row_numel) * sizeof(float));
    if (!tmp) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    rc = ckpt_read_rows_nan(r, ci, lo, hi, tmp, FSDP_DT_F32, nan, err);
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

/* ---- staged loading of device arrays (o->sink) ------------------------------------------------ */

typedef struct loader {
    fsdp_state *s;
    const sio_load_opts *o;
    ckpt_up up;
    int nan_fused; /* host arrays: the readers tell NaN while reading (no pass after; ckpt_pread.h) */
} loader;

/* per staged chunk of a parameter's data: NaN check (strict) and rounding to bf16 / f16 */
typedef struct chunk_xf {
    int check_nan;
    fsdp_dtype round; /* FSDP_DT_BF16, FSDP_DT_F16, or 0: none */
    int nan;
} chunk_xf;

static void round_bf16(float *d, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_NUMEL)
    for (size_t k = 0; k < n; k++) d[k] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(d[k]));
}

static void round_f16(float *d, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_NUMEL)
    for (size_t k = 0; k < n; k++) d[k] = fsdp_f16_to_f32(fsdp_f32_to_f16(d[k]));
}

static void round_to(float *d, size_t n, fsdp_dtype dt) {
    if (dt == FSDP_DT_BF16) round_bf16(d, n);
    else if (dt == FSDP_DT_F16) round_f16(d, n);
}

/* What the loaded values of p are rounded to: every parameter to bf16 (round_bf16), else each to its
 * own dtype, so that a bf16 / f16 parameter keeps values of its dtype. */
static fsdp_dtype round_of(const sio_load_opts *o, const state_param *p) {
    if (o->round_bf16) return FSDP_DT_BF16;
    return p->dtype == FSDP_DT_BF16 || p->dtype == FSDP_DT_F16 ? p->dtype : FSDP_DT_INVALID;
}

static int chunk_fn(void *user, float *c, size_t n, size_t first, fsdp_err *err) {
    (void)first, (void)err;
    chunk_xf *x = user;
    if (x->check_nan && !x->nan && has_nan(c, n)) x->nan = 1;
    round_to(c, n, x->round);
    return 0;
}

/* Where array a of p is loaded: with a sink, a host array bound for the device (or pinned memory)
 * gets its new storage there first (its values are about to be replaced). */
static int load_place(loader *L, state_param *p, state_array a, state_place *where, fsdp_err *err) {
    state_place cur = state_place_of(p, a);
    *where = cur;
    if (!L->o->sink || cur == STATE_DEVICE || cur == STATE_ABSENT || !L->s->dev) return 0;
    state_place tgt = state_device_target(L->s, a);
    if (tgt == cur) return 0;
    int rc = state_param_alloc(L->s, p, a, tgt, 0, err);
    if (!rc) *where = tgt;
    return rc;
}

/* Rows of checkpoint tensor ci into the device array dev of p, chunk by chunk through the staging
 * buffers: reading chunk k+1 overlaps the upload of chunk k. */
static int read_staged(loader *L, ckpt_reader *r, size_t ci, const state_param *p, const nmap_info *info,
                       float *dev, chunk_xf *x, fsdp_err *err) {
    if (p->rows == 0) return 0;
    size_t row_bytes = (size_t)p->row_numel * sizeof(float), n = state_param_local_numel(p);
    int rc = 0;
    if ((info && info->qk != NMAP_QK_NONE) || row_bytes > L->o->sink->buf_bytes) {
        /* permuted rows, or rows larger than a buffer: this parameter's rows in host memory first */
        float *tmp = malloc(n * sizeof(float));
        if (!tmp) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory: %zu values of %s", n, p->name);
        uint64_t ignored = 0;
        rc = info ? read_local(r, ci, p, info, tmp, &ignored, NULL, err)
                  : ckpt_read_rows(r, ci, p->row0, p->row0 + p->rows, tmp, FSDP_DT_F32, err);
        if (!rc) rc = ckpt_up_host(&L->up, dev, tmp, n, chunk_fn, x, err);
        free(tmp);
        return rc;
    }
    int64_t per = (int64_t)(L->o->sink->buf_bytes / row_bytes);
    for (int64_t a0 = 0; a0 < p->rows && !rc; a0 += per) {
        int64_t k = p->rows - a0 < per ? p->rows - a0 : per;
        void *buf;
        if ((rc = ckpt_up_get(&L->up, &buf, err))) break;
        rc = ckpt_read_rows(r, ci, p->row0 + a0, p->row0 + a0 + k, buf, FSDP_DT_F32, err);
        if (!rc) rc = chunk_fn(x, buf, (size_t)(k * p->row_numel), (size_t)(a0 * p->row_numel), err);
        if (rc) {
            ckpt_up_release(&L->up);
            break;
        }
        rc = ckpt_up_put(&L->up, dev + a0 * p->row_numel, (size_t)k * row_bytes, err);
    }
    return rc;
}

/* Checkpoint tensor ci into array a of p, wherever it lives; *nan: NaN seen in staged data, or in
 * the data read into a host array when the readers check it (L->nan_fused). */
static int load_array(loader *L, ckpt_reader *r, size_t ci, state_param *p, state_array a, const nmap_info *info,
                      uint64_t *bytes, int *nan, fsdp_err *err) {
    state_place where;
    int rc = load_place(L, p, a, &where, err);
    if (rc) return rc;
    /* bytes: the parameter's stored dtype (HF q/k: every source row read); optimizer moments: f32 */
    if (where == STATE_DEVICE) {
        if (a == STATE_DATA) {
            const ckpt_entry *e = ckpt_entry_at(r, ci);
            if (p->rows > 0 && info && info->qk != NMAP_QK_NONE) {
                int64_t lo, hi;
                if ((rc = nmap_perm_src_range(NMAP_HF_TO_TT, p->shape[0], info->heads, p->row0, p->row0 + p->rows, &lo,
                                              &hi, err)))
                    return rc;
                *bytes += (uint64_t)(hi - lo) * (uint64_t)p->row_numel * fsdp_dtype_size(e->dtype);
            } else if (p->rows > 0) {
                *bytes += (uint64_t)p->rows * (uint64_t)p->row_numel * fsdp_dtype_size(e->dtype);
            }
        } else {
            *bytes += (uint64_t)p->rows * (uint64_t)p->row_numel * 4;
        }
        chunk_xf x = {a == STATE_DATA && L->o->strict, a == STATE_DATA ? round_of(L->o, p) : FSDP_DT_INVALID, 0};
        rc = read_staged(L, r, ci, p, a == STATE_DATA ? info : NULL, *state_param_dev_slot(p, a), &x, err);
        if (x.nan) *nan = 1;
        return rc;
    }
    float *dst = *state_param_host_slot(p, a);
    if (a == STATE_DATA) {
        int seen = 0;
        rc = read_local(r, ci, p, info, dst, bytes, L->nan_fused && L->o->strict ? &seen : NULL, err);
        if (seen) *nan = 1;
        if (!rc) round_to(dst, state_param_local_numel(p), round_of(L->o, p));
        return rc;
    }
    rc = ckpt_read_rows(r, ci, p->row0, p->row0 + p->rows, dst, FSDP_DT_F32, err);
    *bytes += (uint64_t)p->rows * (uint64_t)p->row_numel * 4;
    return rc;
}

/* Rows of parameter p from checkpoint tensor ci, which stores it as xf says (stored.permute(perm)
 * reshaped to p's shape): a permutation that keeps dim 0 with as many rows reads only p's rows,
 * any other reads the whole tensor; the result goes to p's array wherever it lives. */
static int load_xformed(loader *L, ckpt_reader *r, size_t ci, state_param *p, const sio_xform *xf, uint64_t *bytes,
                        int *nan, fsdp_err *err) {
    state_place where;
    int rc = load_place(L, p, STATE_DATA, &where, err);
    if (rc || p->rows == 0) return rc;
    int local = tperm_keeps_rows(xf->perm, xf->ndim) && p->ndim >= 1 && xf->shape[0] == p->shape[0];
    int64_t src_row = fsdp_numel(xf->ndim - 1, xf->shape + 1), r0 = local ? p->row0 : 0;
    int64_t r1 = local ? p->row0 + p->rows : xf->shape[0];
    size_t n = state_param_local_numel(p), nsrc = (size_t)((r1 - r0) * src_row);
    float *src = malloc((nsrc ? nsrc : 1) * sizeof *src), *full = local ? NULL : malloc((nsrc ? nsrc : 1) * sizeof *full);
    float *dst = where == STATE_DEVICE ? malloc(n * sizeof *dst) : *state_param_host_slot(p, STATE_DATA);
    if (!src || (!local && !full) || !dst) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", p->name);
    if (!rc) rc = ckpt_read_rows(r, ci, r0, r1, src, FSDP_DT_F32, err);
    if (!rc && local) {
        int perm1[FSDP_MAX_DIMS];
        for (int k = 1; k < xf->ndim; k++) perm1[k - 1] = xf->perm[k] - 1;
        for (int64_t k = 0; k < p->rows; k++)
            tperm_f32(src + k * src_row, xf->shape + 1, perm1, xf->ndim - 1, dst + k * p->row_numel);
    } else if (!rc) {
        tperm_f32(src, xf->shape, xf->perm, xf->ndim, full);
        memcpy(dst, full + p->row0 * p->row_numel, n * sizeof *dst);
    }
    *bytes += nsrc * fsdp_dtype_size(ckpt_entry_at(r, ci)->dtype);
    chunk_xf x = {L->o->strict, round_of(L->o, p), 0};
    if (!rc && where == STATE_DEVICE) rc = ckpt_up_host(&L->up, *state_param_dev_slot(p, STATE_DATA), dst, n, chunk_fn, &x, err);
    else if (!rc) rc = chunk_fn(&x, dst, n, 0, err);
    if (x.nan) *nan = 1;
    free(src);
    free(full);
    if (where == STATE_DEVICE) free(dst);
    return rc;
}

static int xform_shape_eq(const ckpt_entry *e, const sio_xform *xf) {
    return e->ndim == xf->ndim && !memcmp(e->shape, xf->shape, (size_t)xf->ndim * sizeof *xf->shape);
}

/* bf16 rounding of a device array in place (read-modify-write through the staging buffers) */
static int round_dev(loader *L, float *dev, size_t n, fsdp_err *err) {
    size_t per = L->o->sink->buf_bytes / sizeof(float);
    for (size_t off = 0; off < n; off += per) {
        size_t k = n - off < per ? n - off : per;
        void *buf;
        int rc = ckpt_up_get_from(&L->up, dev + off, k * sizeof(float), &buf, err);
        if (rc) return rc;
        round_bf16(buf, k);
        if ((rc = ckpt_up_put(&L->up, dev + off, k * sizeof(float), err))) return rc;
    }
    return 0;
}

/* A train_state counter: an int value, or a one-element tensor (older torchtitan saves the step
 * as a 0-d tensor); *got 0 when it is neither. A value that does not decode (e.g. its pickle names
 * a forbidden global) is an error. */
static int train_state_int(ckpt_reader *r, size_t ci, int64_t *out, int *got, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, ci);
    *got = 0;
    if (e->is_tensor) {
        if (fsdp_numel(e->ndim, e->shape) != 1) return 0;
        double v = 0;
        int rc = ckpt_read_rows(r, ci, 0, 1, &v, FSDP_DT_F64, err);
        if (rc) return rc;
        *out = (int64_t)llround(v);
        *got = 1;
        return 0;
    }
    const char *t;
    int rc = ckpt_value(r, ci, &t, err);
    if (rc) return rc;
    *got = ckpt_value_int(r, ci, out) == 0;
    return 0;
}

/* The checkpoint's model keys under o->detect_prefix ("model.", as a torchtitan-style checkpointer
 * saves {"model": model.state_dict()}): *strip becomes that prefix when no model key of the checkpoint
 * names a parameter as it is and some do once it is stripped; else it stays o->strip_prefix. Reads
 * only the header. */
static int detect_prefix(const fsdp_state *s, const sio_load_opts *o, nmap_rules *rules, ckpt_reader *r,
                         const char **strip, fsdp_err *err) {
    *strip = o->strip_prefix;
    if (!o->detect_prefix || !*o->detect_prefix || (o->strip_prefix && *o->strip_prefix)) return 0;
    sio_load_opts as_is = *o, stripped = *o;
    stripped.strip_prefix = o->detect_prefix;
    size_t direct = 0, under = 0;
    for (size_t ci = 0; ci < ckpt_count(r) && !direct; ci++) {
        const ckpt_entry *e = ckpt_entry_at(r, ci);
        if (!e->is_tensor || !strncmp(e->name, "optimizer.", 10) || !strncmp(e->name, "train_state.", 12)) continue;
        char name[NAME_CAP];
        nmap_info info;
        int rc = map_key(s, &as_is, rules, e->name, name, &info, err);
        if (rc) return rc;
        if (name[0] && state_find((fsdp_state *)s, name)) {
            direct++;
            continue;
        }
        if ((rc = map_key(s, &stripped, rules, e->name, name, &info, err))) return rc;
        if (name[0] && state_find((fsdp_state *)s, name)) under++;
    }
    if (!direct && under) *strip = o->detect_prefix;
    return 0;
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

/* A key of an optimizer moment not restored, listed in res (non-strict loads report them). */
static void sio_list_omitted(sio_load_result *res, const char *key) {
    res->optim_omitted++;
    size_t l = strlen(res->optim_omitted_keys), cap = sizeof res->optim_omitted_keys;
    if (l + 8 >= cap) return;
    if (l + strlen(key) + 8 >= cap) snprintf(res->optim_omitted_keys + l, cap - l, "\n  ...");
    else snprintf(res->optim_omitted_keys + l, cap - l, "\n  %s", key);
}

/* An entry outside the model prefix in effect (a single strip_prefix, given or detected): not a
 * model key, so a strict load ignores it (listed in res) rather than finding it unexpected. */
static int outside_prefix(const sio_load_opts *o, const char *key) {
    return !o->n_strip && o->strip_prefix && *o->strip_prefix && !nmap_strip_prefix(key, o->strip_prefix);
}

static void sio_list_ignored(sio_load_result *res, const char *prefix, const char *key) {
    res->ignored++;
    snprintf(res->ignored_prefix, sizeof res->ignored_prefix, "%s", prefix ? prefix : "");
    size_t l = strlen(res->ignored_keys), cap = sizeof res->ignored_keys;
    if (l + 8 >= cap) return;
    if (l + strlen(key) + 8 >= cap) snprintf(res->ignored_keys + l, cap - l, "%s...", l ? ", " : "");
    else snprintf(res->ignored_keys + l, cap - l, "%s%s", l ? ", " : "", key);
}

/* What one load is doing: the parameters restored, NaN seen in staged data, the checkpoint entries
 * used, and the problems a strict load reports. */
typedef struct load_marks {
    int *loaded, *nan_dev, *used;
    char *problems;
    const ckl_layout *lay; /* where the optimizer's state is (ckpt/key_layout.h) */
    sio_load_result *res;  /* non-strict: optimizer moments not restored are listed there */
    sio_parts parts;       /* the parts of stacked parameters seen (HF experts) */
} load_marks;

/* Every model tensor of the checkpoint into the parameter it names (the first pass of sio_load). */
/* Entry ci is the block scale of an fp8 weight that was loaded (dequantised by it: ckpt/reader_st.c). */
static int scale_used(ckpt_reader *r, size_t ci, const int *used) {
    const ckpt_entry *e = ckpt_entry_at(r, ci);
    if (!e->fp8_scale) return 0;
    char base[1024];
    size_t n = strlen(e->name), suf = strlen("_scale_inv");
    if (n <= suf || n - suf >= sizeof base) return 0;
    memcpy(base, e->name, n - suf);
    base[n - suf] = '\0';
    long w = ckpt_find(r, base);
    return w >= 0 && used[w];
}

/* Checkpoint tensor ci as part info->part (an expert) of the stacked parameter p: its rows that fall
 * in p's local rows, wherever p's data lives; the part's shape checked (a problem naming both), the
 * part marked seen, p marked loaded once every part has been. */
static int load_part(loader *L, ckpt_reader *r, size_t ci, state_param *p, const nmap_info *info, load_marks *m,
                     sio_load_result *res, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, ci);
    size_t pi = (size_t)(p - L->s->p);
    char a[128], b[128], c[128], msg[NAME_CAP * 2 + 400];
    int fits = p->ndim >= 2 && e->ndim == p->ndim - 1 && !memcmp(e->shape, p->shape + 1, (size_t)e->ndim * sizeof *e->shape);
    if (!fits) {
        snprintf(msg, sizeof msg, "%s (expert %d of %s %s) has shape %s in the checkpoint, the model needs %s", e->name,
                 info->part, p->name, fsdp_shape_str(p->ndim, p->shape, a, sizeof a),
                 fsdp_shape_str(e->ndim, e->shape, b, sizeof b),
                 p->ndim >= 2 ? fsdp_shape_str(p->ndim - 1, p->shape + 1, c, sizeof c) : "a stack of experts");
        append(m->problems, 8192, "\n  %s%s", msg, "");
        return 0;
    }
    if (info->part >= p->shape[0]) {
        snprintf(msg, sizeof msg, "%s is expert %d of %s, whose shape %s holds experts 0 to %lld only", e->name,
                 info->part, p->name, fsdp_shape_str(p->ndim, p->shape, a, sizeof a), (long long)p->shape[0] - 1);
        append(m->problems, 8192, "\n  %s%s", msg, "");
        return 0;
    }
    int complete;
    int rc = sio_parts_mark(&m->parts, pi, p->shape[0], info->part, &complete, err);
    if (!rc) rc = state_param_materialize(L->s, p, err); /* the other experts' rows stay as they are */
    state_place where;
    if (!rc) rc = load_place(L, p, STATE_DATA, &where, err);
    int64_t lo, hi;
    size_t off;
    sio_part_local(p, info->part, &lo, &hi, &off);
    size_t sub = (size_t)(p->row_numel / p->shape[1]), n = (size_t)(hi - lo) * sub;
    if (!rc && hi > lo) {
        int nan = 0;
        float *dst = where == STATE_DEVICE ? malloc(n * sizeof *dst) : *state_param_host_slot(p, STATE_DATA) + off;
        if (!dst) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", e->name);
        rc = ckpt_read_rows_nan(r, ci, lo, hi, dst, FSDP_DT_F32, L->o->strict ? &nan : NULL, err);
        chunk_xf x = {0, round_of(L->o, p), nan};
        if (!rc && where == STATE_DEVICE)
            rc = ckpt_up_host(&L->up, *state_param_dev_slot(p, STATE_DATA) + off, dst, n, chunk_fn, &x, err);
        else if (!rc) rc = chunk_fn(&x, dst, n, 0, err);
        if (where == STATE_DEVICE) free(dst);
        if (x.nan) m->nan_dev[pi] = 1;
        res->bytes_read += (uint64_t)n * fsdp_dtype_size(e->dtype);
    }
    if (!rc && complete) {
        m->loaded[pi] = 1;
        res->params_loaded++;
    }
    return rc;
}

/* p can wait for its rows (sio_load_opts.defer): a sharded host array with rows, nothing beside it. */
static int deferrable(const loader *L, const state_param *p) {
    return L->s->layout == STATE_SHARDED && !L->s->dev && p->rows > 0 && !p->d_data && !(p->pinned & 1u) &&
           !p->grad && !p->d_grad && !state_param_has_moments(p);
}

/* p's data deferred to tensor ci's rows; bytes: what they will read (HF q/k: every source row). */
static int defer_array(loader *L, ckpt_reader *r, size_t ci, state_param *p, const nmap_info *info, uint64_t *bytes,
                       fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, ci);
    int64_t lo = p->row0, hi = p->row0 + p->rows;
    if (info && info->qk != NMAP_QK_NONE) {
        int rc = nmap_perm_src_range(NMAP_HF_TO_TT, p->shape[0], info->heads, p->row0, p->row0 + p->rows, &lo, &hi, err);
        if (rc) return rc;
    }
    *bytes += (uint64_t)(hi - lo) * (uint64_t)p->row_numel * fsdp_dtype_size(e->dtype);
    return sio_defer_rows(L->s, p, r, ci, info, round_of(L->o, p), L->o->strict, err);
}

static int load_params(loader *L, ckpt_reader *r, nmap_rules *rules, load_marks *m, sio_load_result *res,
                       fsdp_err *err) {
    fsdp_state *s = L->s;
    const sio_load_opts *o = L->o;
    int *loaded = m->loaded, *nan_dev = m->nan_dev, *used = m->used;
    char *problems = m->problems;
    size_t nck = ckpt_count(r);
    int rc = 0;
    for (size_t ci = 0; ci < nck && !rc; ci++) {
        const ckpt_entry *e = ckpt_entry_at(r, ci);
        const char *key = e->name;
        if (ckl_is_training(m->lay, key) || any_glob(o->exclude, o->n_exclude, key)) {
            used[ci] = 1; /* training entries: handled below; excluded ones: on purpose */
            continue;
        }
        if (outside_prefix(o, key)) {
            used[ci] = 1;
            sio_list_ignored(res, o->strip_prefix, key);
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
        if (!p && name[0] && o->only && !glob_any(o, name)) {
            used[ci] = 1; /* outside the keys this load was asked for */
            continue;
        }
        if (!p || !e->is_tensor) continue;
        if (!matches_only(o, s, p)) {
            used[ci] = 1;
            continue;
        }
        used[ci] = 1;
        if (info.stacked) {
            if ((rc = load_part(L, r, ci, p, &info, m, res, err))) break;
            used[ci] = 2;
            continue;
        }
        const sio_xform *xf = o->xforms && o->xforms[p - s->p].ndim ? &o->xforms[p - s->p] : NULL;
        if (xf ? !xform_shape_eq(e, xf) : !shape_eq(e, p)) {
            char a[128], b[128], c[160] = "";
            char msg[700];
            if (xf) snprintf(c, sizeof c, " (stored as %s, then transformed)", fsdp_shape_str(xf->ndim, xf->shape, b, sizeof b));
            snprintf(msg, sizeof msg, "%s has shape %s in the checkpoint, the model needs %s%s",
                     key, fsdp_shape_str(e->ndim, e->shape, a, sizeof a),
                     xf ? fsdp_shape_str(xf->ndim, xf->shape, b, sizeof b) : fsdp_shape_str(p->ndim, p->shape, b, sizeof b),
                     c);
            append(problems, 8192, "\n  %s%s", msg, "");
            continue;
        }
        if (!xf && o->defer && deferrable(L, p)) {
            rc = defer_array(L, r, ci, p, &info, &res->bytes_read, err);
            res->params_deferred += !rc;
        }
        else if (!(rc = p->deferred ? state_param_alloc(s, p, STATE_DATA, STATE_HOST, 0, err) : 0)) /* all rows read */
            rc = xf ? load_xformed(L, r, ci, p, xf, &res->bytes_read, &nan_dev[p - s->p], err)
                    : load_array(L, r, ci, p, STATE_DATA, &info, &res->bytes_read, &nan_dev[p - s->p], err);
        if (rc) break;
        loaded[p - s->p] = 1;
        used[ci] = 2; /* restored a parameter */
        res->params_loaded++;
    }
    return rc;
}

/* Entries that share their stored pieces (ckpt_entry.is_alias: save-dcp's aliases, e.g. model.<key>
 * and ema_model.<key>) are one tensor under several names: when one of them restored a parameter,
 * the others are not unexpected (the tensor was restored). used: 2 restored, 3 its alias did. */
static void alias_used(ckpt_reader *r, int *used) {
    size_t n = ckpt_count(r);
    for (size_t ci = 0; ci < n; ci++) {
        const ckpt_entry *e = ckpt_entry_at(r, ci);
        if (e->is_alias && used[ci] == 2 && !used[e->alias_of]) used[e->alias_of] = 3;
    }
    for (size_t ci = 0; ci < n; ci++) {
        const ckpt_entry *e = ckpt_entry_at(r, ci);
        if (e->is_alias && !used[ci] && used[e->alias_of] >= 2) used[ci] = 1;
    }
}

/* 1 when the checkpoint's optimizer knows the parameter: a state or param_groups entry under its
 * name (PyTorch's flattened optimizer state dict has param_groups.<fqn>.* for every parameter the
 * optimizer holds; a buffer such as a LayerNorm's running stats, or a frozen parameter, has none). */
static int under_optimizer(ckpt_reader *r, const ckl_layout *lay, const char *name) {
    char key[NAME_CAP + 160];
    const char *probe[] = {"state.%s.exp_avg", "state.%s.exp_avg_sq", "state.%s.step", "param_groups.%s.lr"};
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
        int n = snprintf(key, sizeof key, "%s", lay->optim);
        snprintf(key + n, sizeof key - (size_t)n, probe[i], name);
        if (ckpt_find(r, key) >= 0) return 1;
    }
    return 0;
}

/* The AdamW state of every parameter loaded (all of them when nothing is selected). */
static int load_optimizer_state(loader *L, ckpt_reader *r, load_marks *m, sio_load_result *res, fsdp_err *err) {
    fsdp_state *s = L->s;
    const sio_load_opts *o = L->o;
    int *loaded = m->loaded;
    char *problems = m->problems;
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *p = &s->p[i];
        if (!loaded[i] && (o->only || o->select)) continue;
        if (!under_optimizer(r, m->lay, p->name)) continue; /* a buffer or frozen: no state, no group */
        const char *kinds[2] = {"exp_avg", "exp_avg_sq"};
        const state_array arr[2] = {STATE_EXP_AVG, STATE_EXP_AVG_SQ};
        for (int k = 0; k < 2 && !rc; k++) {
            char key[NAME_CAP + 64];
            snprintf(key, sizeof key, "%sstate.%s.%s", m->lay->optim, p->name, kinds[k]);
            long ci = ckpt_find(r, key);
            if (ci < 0) {
                append(problems, 8192, "\n  optimizer state %s%s missing", key, "");
                sio_list_omitted(m->res, key);
                continue;
            }
            const ckpt_entry *e = ckpt_entry_at(r, (size_t)ci);
            if (!shape_eq(e, p)) {
                append(problems, 8192, "\n  %s has the wrong shape%s", key, "");
                continue;
            }
            int ignored = 0;
            rc = load_array(L, r, (size_t)ci, p, arr[k], NULL, &res->bytes_read, &ignored, err);
        }
        if (rc) break;
        char key[NAME_CAP + 64];
        snprintf(key, sizeof key, "%sstate.%s.step", m->lay->optim, p->name);
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
            snprintf(key, sizeof key, "%sparam_groups.%s.%s", m->lay->optim, p->name, hyper[h].k);
            long hi = ckpt_find(r, key);
            const char *t = hi >= 0 ? ckpt_value_text(r, (size_t)hi) : NULL;
            if (t) *hyper[h].dst = strtod(t, NULL);
        }
        /* the LR schedule as PyTorch holds it (ckpt/state_resume.c): lr is the next step's */
        snprintf(key, sizeof key, "%sparam_groups.%s.initial_lr", m->lay->optim, p->name);
        long ii = ckpt_find(r, key);
        const char *it = ii >= 0 ? ckpt_value_text(r, (size_t)ii) : NULL;
        if (it) {
            s->lr_initial = strtod(it, NULL);
            s->lr_next = s->lr;
            s->has_lr_schedule = 1;
        }
        snprintf(key, sizeof key, "%sparam_groups.%s.betas", m->lay->optim, p->name);
        long bi = ckpt_find(r, key);
        const char *bt = bi >= 0 ? ckpt_value_text(r, (size_t)bi) : NULL;
        if (bt) sscanf(bt, "(%lf, %lf)", &s->beta1, &s->beta2);
        res->optimizer_loaded++;
    }
    if (!rc) s->has_optimizer = 1;
    return rc;
}

/* A strict load's findings: every selected parameter not restored, every unexpected tensor, NaN in a
 * restored parameter. */
/* The checkpoint's tensors the model does not declare: the first UNEXPECTED_SHOWN named, a count of the
 * rest, and the exclude: that leaves them out (their shared first name component's glob when they have
 * one, as an EMA's ema.*). */
#define UNEXPECTED_SHOWN 8
static void unexpected_report(ckpt_reader *r, const int *used, char *problems) {
    size_t nck = ckpt_count(r), n = 0, plen = 0;
    const char *first = NULL;
    int shared = 1;
    for (size_t ci = 0; ci < nck; ci++) {
        if (used[ci] || !ckpt_entry_at(r, ci)->is_tensor || scale_used(r, ci, used)) continue;
        const char *k = ckpt_entry_at(r, ci)->name, *dot = strchr(k, '.');
        size_t len = dot ? (size_t)(dot - k) : 0;
        if (!first) first = k, plen = len;
        else if (!len || len != plen || strncmp(k, first, len)) shared = 0;
        if (n++ < UNEXPECTED_SHOWN) append(problems, 8192, "\n  unexpected key %s in the checkpoint%s", k, "");
    }
    if (!n) return;
    char line[512];
    if (n > UNEXPECTED_SHOWN) {
        snprintf(line, sizeof line, "\n  ... and %zu more unexpected keys", n - UNEXPECTED_SHOWN);
        append(problems, 8192, "%s%s", line, "");
    }
    if (shared && plen)
        snprintf(line, sizeof line, "\n  the model does not declare these %zu tensors: leave them out with exclude: [\"%.*s.**\"]",
                 n, (int)plen, first);
    else
        snprintf(line, sizeof line, "\n  the model does not declare these %zu tensors: leave them out with exclude: [GLOB, ...]", n);
    append(problems, 8192, "%s%s", line, "");
}

static void strict_report(const loader *L, ckpt_reader *r, const load_marks *m) {
    const fsdp_state *s = L->s;
    const sio_load_opts *o = L->o;
    const int *loaded = m->loaded, *nan_dev = m->nan_dev, *used = m->used;
    char *problems = m->problems;
    if (o->names != SIO_NAMES_HF) {
        /* HF names without names: hf: one hint rather than a line for every parameter and key */
        int *sel = calloc(s->n ? s->n : 1, sizeof *sel);
        for (size_t i = 0; sel && i < s->n; i++) sel[i] = matches_only(o, s, &s->p[i]);
        char hint[1024];
        size_t n = sel ? sio_hf_names_hint(s, r, loaded, sel, hint, sizeof hint) : 0;
        free(sel);
        if (n) {
            append(problems, 8192, "%s%s", hint, "");
            return;
        }
    }
    nmap_hf hf;
    sio_hf_facts(s, &hf);
    for (size_t i = 0; i < s->n; i++) {
        if (loaded[i] || !matches_only(o, s, &s->p[i])) continue;
        if (o->names == SIO_NAMES_HF && sio_parts_report(&m->parts, i, &s->p[i], &hf, problems, 8192)) continue;
        append(problems, 8192, "\n  %s not restored (no such key in the checkpoint%s)", s->p[i].name,
               o->names == SIO_NAMES_HF ? " under its Hugging Face name" : "");
    }
    unexpected_report(r, used, problems);
    /* NaN left over in a restored parameter means the checkpoint itself holds NaN */
    for (size_t i = 0; i < s->n; i++) {
        if (!loaded[i]) continue;
        if (s->p[i].deferred ? 0 /* its reads check (sio_defer_rows) */
            : state_place_of(&s->p[i], STATE_DATA) == STATE_DEVICE || L->nan_fused
                ? nan_dev[i]
                : has_nan(s->p[i].data, state_param_local_numel(&s->p[i])))
            append(problems, 8192, "\n  %s holds NaN after loading%s", s->p[i].name, "");
    }
}

/* The checkpoint's key layout (ckpt/key_layout.h): o's explicit prefixes, the rest detected; an
 * explicit model prefix is stripped (no detection), a detected one is tried as detect_prefix. */
static int sio_layout(ckpt_reader *r, const char *path, const sio_load_opts *o, ckl_layout *lay, sio_load_opts *eff,
                      fsdp_err *err) {
    int rc = ckl_detect(r, o->model_prefix, o->optim_prefix, lay, err);
    if (rc) return fsdp_err_prefix(err, "load-ckpt %s", path);
    if (lay->model_given) {
        eff->detect_prefix = NULL;
        if (lay->model[0] && !(o->strip_prefix && *o->strip_prefix)) eff->strip_prefix = lay->model;
    } else if (o->detect_prefix && *o->detect_prefix) {
        eff->detect_prefix = lay->model;
    }
    return 0;
}

typedef struct moment_ok_ctx {
    fsdp_state *s;
    const sio_load_opts *o;
} moment_ok_ctx;

/* A moment loads when its parameter exists; one of a tensor the options exclude or drop on purpose (its key an
 * `exclude` glob's, its fqn a `drop` glob's or none of `keep`'s) is left out with it, as the weight is. */
static int moment_ok(void *user, const char *fqn, const char *key) {
    const moment_ok_ctx *m = user;
    return state_find(m->s, fqn) != NULL || any_glob(m->o->exclude, m->o->n_exclude, key) ||
           dropped_on_purpose(m->o, fqn);
}

/* Optimizer moments the layout cannot map onto a parameter: strict, an error naming them; else
 * listed in res. Never left to become zeros unnoticed. */
static int sio_check_moments(fsdp_state *s, ckpt_reader *r, const ckl_layout *lay, const char *path,
                             const sio_load_opts *o, sio_load_result *res, fsdp_err *err) {
    char bad[1024] = "", unknown[1024] = "";
    size_t nb, nu, nk;
    moment_ok_ctx m = {s, o};
    ckl_unmapped_moments(r, lay, moment_ok, &m, bad, unknown, sizeof bad, &nb, &nu, &nk);
    if (!nb && !nu) return 0;
    if (!nk) { /* no moment names a parameter (integer ids, another prefix): the key layout, not extra tensors */
        size_t k = strlen(bad);
        snprintf(bad + k, sizeof bad - k, "%s", unknown);
        nb += nu, nu = 0;
    }
    if (o->strict && nb)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "load-ckpt %s: %zu optimizer moment(s) under a key layout that does not map onto the "
                            "model's parameters (expected %sstate.<parameter>.<kind>):%s\n(give prefixes: {optim: "
                            "...}, or load_optimizer: false to start the optimizer afresh)",
                            path, nb, lay->optim, bad);
    if (o->strict)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "load-ckpt %s: %zu optimizer moment(s) of tensors the model does not declare:%s\n(leave "
                            "them out with exclude: ['TENSOR', '%sstate.TENSOR.**'], or declare the tensors)",
                            path, nu, unknown, lay->optim);
    res->optim_omitted += nb + nu;
    snprintf(res->optim_omitted_keys, sizeof res->optim_omitted_keys, "%s%s", bad, unknown);
    return 0;
}

/* What sio_load carries between its steps: the loader, the open reader and rename rules, the
 * effective options (with the detected prefix), the key layout and the per-entry marks. */
typedef struct sio_job {
    loader L;
    const char *path;
    ckpt_reader *r;
    nmap_rules *rules;
    sio_load_opts eff;
    ckl_layout lay;
    load_marks marks;
    sio_load_result *res;
} sio_job;

/* Checks and starts the staging sink (if any) and opens the checkpoint (unless o gives a reader). */
static int sio_open_reader(sio_job *J, const sio_load_opts *o, fsdp_err *err) {
    if (o->sink) {
        int rc = ckpt_sink_check(o->sink, err);
        if (rc) return rc;
        ckpt_up_init(&J->L.up, o->sink);
    }
    J->r = o->reader;
    return J->r ? 0 : ckpt_open(J->path, o->format, &J->r, err);
}

/* The rename rules of the options (none when there are none). */
static int sio_rename_rules(sio_job *J, const sio_load_opts *o, fsdp_err *err) {
    if (!o->n_rename) return 0;
    int rc = nmap_rules_new(&J->rules, err);
    for (size_t i = 0; i < o->n_rename && !rc; i++)
        rc = nmap_rules_add(J->rules, o->rename_from[i], o->rename_to[i], err);
    return rc;
}

/* The checkpoint's key layout and the model-key prefix it carries; the loader uses the options
 * with that prefix from here on. */
static int sio_resolve_layout(sio_job *J, const sio_load_opts *o, fsdp_err *err) {
    J->eff = *o; /* with the detected key prefix, when there is one */
    int rc;
    if ((rc = sio_layout(J->r, J->path, o, &J->lay, &J->eff, err))) return rc;
    if ((rc = detect_prefix(J->L.s, &J->eff, J->rules, J->r, &J->eff.strip_prefix, err))) return rc;
    if (J->eff.strip_prefix != o->strip_prefix)
        snprintf(J->res->stripped_prefix, sizeof J->res->stripped_prefix, "%s", J->eff.strip_prefix ? J->eff.strip_prefix : "");
    J->L.o = &J->eff;
    return 0;
}

/* The marks: parameters loaded, NaN seen on the device, checkpoint entries used, problems text. */
static int sio_alloc_marks(sio_job *J, fsdp_err *err) {
    const fsdp_state *s = J->L.s;
    size_t nck = ckpt_count(J->r);
    load_marks m = {calloc(s->n ? s->n : 1, sizeof(int)), calloc(s->n ? s->n : 1, sizeof(int)),
                    calloc(nck ? nck : 1, sizeof(int)), calloc(1, 8192), &J->lay, J->res, {NULL, 0}};
    if (!m.loaded || !m.nan_dev || !m.used || !m.problems || sio_parts_init(&m.parts, s->n, err)) {
        sio_parts_free(&m.parts);
        free(m.loaded);
        free(m.nan_dev);
        free(m.used);
        free(m.problems);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    J->marks = m;
    return 0;
}

/* Whether the optimizer's state is loaded (load_optimizer: true, or auto and the checkpoint has
 * it); its moments must map onto the parameters; allocates the state to load into. */
static int sio_plan_optimizer(sio_job *J, int *do_opt, fsdp_err *err) {
    const sio_load_opts *o = &J->eff;
    const char *optim = J->lay.optim;
    int want_opt = o->load_optimizer;
    int has_opt = 0;
    size_t nck = ckpt_count(J->r);
    for (size_t ci = 0; ci < nck; ci++)
        if (!strncmp(ckpt_entry_at(J->r, ci)->name, optim, strlen(optim)) &&
            !strncmp(ckpt_entry_at(J->r, ci)->name + strlen(optim), "state.", 6))
            has_opt = 1;
    if (want_opt == 1 && !has_opt)
        return fsdp_err_set(err, FSDP_E_INVALID, "load-ckpt %s: load_optimizer is true but the checkpoint has no "
                                                 "%sstate.* keys", J->path, optim);
    int rc;
    if (want_opt && (rc = sio_check_moments(J->L.s, J->r, &J->lay, J->path, o, J->res, err))) return rc;
    *do_opt = want_opt == 1 || (want_opt == -1 && has_opt);
    if (*do_opt && (rc = state_alloc_optimizer(J->L.s, err))) return rc;
    return 0;
}

/* The train_state entries (step, tokens seen, data position) into the state, when present. */
static int sio_read_train_state(sio_job *J, fsdp_err *err) {
    fsdp_state *s = J->L.s;
    const char *keys[3] = {"train_state.step", "train_state.ntokens_seen", "train_state.data_pos"};
    int64_t vals[3] = {-1, -1, -1};
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        long ci = ckpt_find(J->r, keys[k]);
        int got = 0;
        if (ci >= 0) rc = train_state_int(J->r, (size_t)ci, &vals[k], &got, err);
        if (got && k == 0) J->res->has_train_state = 1;
    }
    if (!rc && vals[0] >= 0) {
        s->train_step = vals[0];
        s->data_pos = (uint64_t)(vals[2] >= 0 ? vals[2] : vals[0]);
        if (vals[1] >= 0) s->tokens_seen = vals[1];
    }
    return rc;
}

/* The plugins' named bytes (plugin_state.<key> values: include/fsdp/ckpt.h) into the state. */
static int sio_read_plugin_state(sio_job *J, fsdp_err *err) {
    size_t n = ckpt_count(J->r);
    int rc = 0;
    for (size_t ci = 0; ci < n && !rc; ci++) {
        const ckpt_entry *e = ckpt_entry_at(J->r, ci);
        if (e->is_tensor || strncmp(e->name, "plugin_state.", 13)) continue;
        void *buf = NULL;
        size_t len = 0;
        pkl_doc *doc = NULL;
        const pkl_obj *root = NULL;
        unsigned char *bytes = NULL;
        size_t nb = 0;
        rc = ckpt_value_pickle(J->r, ci, &buf, &len, err);
        if (!rc) rc = pkl_parse(buf, len, e->name, &doc, &root, err);
        if (!rc && !pkl_bytes_value(root, &bytes, &nb))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: %s is not bytes (a plugin's state is saved as bytes)", J->path,
                              e->name);
        if (!rc && nb) rc = state_blob_set(J->L.s, e->name + 13, bytes, nb, err);
        free(bytes);
        pkl_free(doc);
        free(buf);
    }
    return rc;
}

/* Parameters, then the optimizer's state, the staged uploads landed, the train state; strict
 * loads report what was missed, and a problem (any when strict, a shape one always) fails. */
static int sio_read_checkpoint(sio_job *J, int do_opt, fsdp_err *err) {
    const sio_load_opts *o = &J->eff;
    int rc = load_params(&J->L, J->r, J->rules, &J->marks, J->res, err);
    if (!rc) alias_used(J->r, J->marks.used);
    if (!rc && do_opt) rc = load_optimizer_state(&J->L, J->r, &J->marks, J->res, err);
    /* every staged upload has landed before anything is reported as loaded */
    if (!rc && o->sink) rc = ckpt_up_finish(&J->L.up, err);
    if (!rc) rc = sio_read_train_state(J, err);
    if (!rc) rc = sio_read_plugin_state(J, err);
    if (!rc && o->strict) strict_report(&J->L, J->r, &J->marks);
    if (!rc && J->marks.problems[0]) {
        if (o->strict || strstr(J->marks.problems, "shape"))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "load-ckpt %s (strict) failed:%s", J->path, J->marks.problems);
    }
    return rc;
}

/* Strict: every parameter (of the `only` selection) not restored ends as NaN; returns rc, or the
 * first fill's error when rc is 0. */
static int sio_fill_unloaded_nan(sio_job *J, int rc, fsdp_err *err) {
    const sio_load_opts *o = &J->eff;
    fsdp_state *s = J->L.s;
    for (size_t i = 0; i < s->n; i++) {
        if (J->marks.loaded[i] || !matches_only(o, s, &s->p[i])) continue;
        size_t n = state_param_local_numel(&s->p[i]);
        if (s->p[i].deferred) { /* NaN, produced when needed */
            int drc = state_param_defer(s, &s->p[i], NULL, FSDP_DT_INVALID, rc ? NULL : err);
            if (!rc) rc = drc;
            continue;
        }
        if (state_place_of(&s->p[i], STATE_DATA) != STATE_DEVICE) {
            fill_nan(s->p[i].data, n);
            continue;
        }
        fsdp_err e2;
        int frc = o->sink ? ckpt_up_fill(&J->L.up, s->p[i].d_data, NAN, n, rc ? &e2 : err)
                          : fsdp_err_set(rc ? &e2 : err, FSDP_E_INVALID,
                                         "load-ckpt: %s is on the device and no staging sink was given", s->p[i].name);
        if (!rc) rc = frc;
    }
    return rc;
}

/* round_bf16: every parameter becomes bf16 (host ones rounded here, device ones not loaded
 * rounded through the sink; loaded ones were rounded in staging). */
static int sio_round_params_bf16(sio_job *J, fsdp_err *err) {
    const sio_load_opts *o = &J->eff;
    fsdp_state *s = J->L.s;
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *p = &s->p[i];
        p->dtype = FSDP_DT_BF16;
        size_t n = state_param_local_numel(p);
        if (p->deferred && p->src_round == FSDP_DT_F16) rc = state_param_materialize(s, p, err);
        if (rc) break;
        if (p->deferred) p->src_round = FSDP_DT_BF16; /* rounded as its rows are produced */
        else if (state_place_of(p, STATE_DATA) != STATE_DEVICE) round_bf16(p->data, n);
        else if (!J->marks.loaded[i]) /* loaded ones were rounded in staging */
            rc = o->sink ? round_dev(&J->L, p->d_data, n, err)
                         : fsdp_err_set(err, FSDP_E_INVALID, "load-ckpt: %s is on the device and no staging "
                                                             "sink was given", p->name);
    }
    return rc;
}

/* After the read (rc its outcome): the NaN fill of strict loads, bf16 rounding, the last
 * uploads, then the loaded parameters are marked as having a value. */
static int sio_finish(sio_job *J, int rc, fsdp_err *err) {
    const sio_load_opts *o = &J->eff;
    fsdp_state *s = J->L.s;
    /* strict: every parameter not restored (or whose read failed) ends as NaN, so that a
     * missed one cannot pass unnoticed; a restored one was written whole by its reader (the
     * readers check that the stored chunks tile each tensor), so it needs no NaN pass first */
    if (o->sink) {
        /* after a failure: the uploads already queued land first, then the NaN fill below */
        fsdp_err e2;
        ckpt_up_release(&J->L.up);
        ckpt_up_finish(&J->L.up, &e2);
    }
    if (o->strict) rc = sio_fill_unloaded_nan(J, rc, err);
    if (!rc && o->round_bf16) rc = sio_round_params_bf16(J, err);
    if (o->sink) {
        fsdp_err e2;
        ckpt_up_release(&J->L.up);
        int frc = ckpt_up_finish(&J->L.up, rc ? &e2 : err);
        if (!rc) rc = frc;
    }
    for (size_t i = 0; !rc && i < s->n; i++)
        if (J->marks.loaded[i]) s->p[i].no_value = 0;
    for (size_t i = 0; !rc && o->restored && i < s->n; i++) o->restored[i] = J->marks.loaded[i] != 0;
    return rc;
}

/* With the marks allocated: plans the optimizer's part, reads, finishes, frees the marks. */
static int sio_load_marked(sio_job *J, fsdp_err *err) {
    int do_opt = 0;
    int rc = sio_plan_optimizer(J, &do_opt, err);
    if (!rc) rc = sio_read_checkpoint(J, do_opt, err);
    rc = sio_finish(J, rc, err);
    free(J->marks.loaded);
    free(J->marks.nan_dev);
    free(J->marks.used);
    free(J->marks.problems);
    sio_parts_free(&J->marks.parts);
    return rc;
}

int sio_load(fsdp_state *s, const char *path, const sio_load_opts *o, sio_load_result *res, fsdp_err *err) {
    memset(res, 0, sizeof *res);
    sio_job J;
    memset(&J, 0, sizeof J);
    J.L.s = s;
    J.L.o = o;
    J.L.nan_fused = ckpt_load_fast();
    J.path = path;
    J.res = res;
    int rc = sio_open_reader(&J, o, err);
    if (rc) return rc;
    if (!(rc = sio_rename_rules(&J, o, err)) && !(rc = sio_resolve_layout(&J, o, err)) &&
        !(rc = sio_alloc_marks(&J, err)))
        rc = sio_load_marked(&J, err);
    nmap_rules_free(J.rules);
    if (J.r != o->reader) ckpt_close(J.r);
    return rc;
}
