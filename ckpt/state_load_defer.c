/* Deferred checkpoint rows (see state_load_defer.h). */
#include "ckpt/state_load_defer.h"

#include <stdlib.h>
#include <string.h>

typedef struct ld_src {
    state_src base; /* first */
    ckpt_reader *r; /* a reference */
    size_t ci;
    int64_t row0, rows, row_numel, total_rows;
    int heads;      /* > 0: HF q/k rows, un-permuted on the way */
    int check_nan;
} ld_src;

static void ld_destroy(state_src *src) {
    ld_src *s = (ld_src *)src;
    ckpt_close(s->r);
    free(s);
}

/* Local rows [a, b) into dst (b - a whole rows). */
static int ld_rows(const ld_src *s, int64_t a, int64_t b, float *dst, fsdp_err *err) {
    int nan = 0, rc;
    const ckpt_entry *e = ckpt_entry_at(s->r, s->ci);
    if (s->heads <= 0) {
        rc = ckpt_read_rows_shared(s->r, s->ci, s->row0 + a, s->row0 + b, dst, FSDP_DT_F32, s->check_nan ? &nan : NULL,
                                   err);
    } else {
        int64_t lo, hi;
        rc = nmap_perm_src_range(NMAP_HF_TO_TT, s->total_rows, s->heads, s->row0 + a, s->row0 + b, &lo, &hi, err);
        float *tmp = rc ? NULL : malloc((size_t)((hi - lo) * s->row_numel) * sizeof *tmp);
        if (!rc && !tmp) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", e->name);
        if (!rc) rc = ckpt_read_rows_shared(s->r, s->ci, lo, hi, tmp, FSDP_DT_F32, s->check_nan ? &nan : NULL, err);
        if (!rc)
            rc = nmap_permute_rows_part(NMAP_HF_TO_TT, dst, s->row0 + a, s->row0 + b, tmp, lo, hi, s->total_rows,
                                        s->row_numel, sizeof(float), s->heads, err);
        free(tmp);
    }
    if (!rc && nan)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "%s of checkpoint %s holds NaN (load-ckpt strict; read when its rows "
                          "were needed)", e->name, ckpt_reader_path(s->r));
    return rc;
}

/* Part [from, from + n) of local row `row` into dst, through a buffer of one row. */
static int ld_partial(const ld_src *s, int64_t row, int64_t from, int64_t n, float *dst, fsdp_err *err) {
    float *tmp = malloc((size_t)s->row_numel * sizeof *tmp);
    if (!tmp) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading a row");
    int rc = ld_rows(s, row, row + 1, tmp, err);
    if (!rc) memcpy(dst, tmp + from, (size_t)n * sizeof *dst);
    free(tmp);
    return rc;
}

/* Elements [e0, e0 + n): a partial first row, whole rows straight into dst, a partial last row. */
static int ld_fill(const state_src *src, int64_t e0, size_t n, float *dst, fsdp_err *err) {
    const ld_src *s = (const ld_src *)src;
    const int64_t R = s->row_numel;
    int64_t e = e0, end = e0 + (int64_t)n;
    int rc = 0;
    if (e % R && e < end) {
        int64_t k = R - e % R < end - e ? R - e % R : end - e;
        rc = ld_partial(s, e / R, e % R, k, dst, err);
        e += k;
    }
    int64_t whole = (end - e) / R;
    if (!rc && whole > 0) {
        rc = ld_rows(s, e / R, e / R + whole, dst + (e - e0), err);
        e += whole * R;
    }
    if (!rc && e < end) rc = ld_partial(s, e / R, 0, end - e, dst + (e - e0), err);
    return rc;
}

int sio_defer_rows(fsdp_state *s, state_param *p, ckpt_reader *r, size_t ci, const nmap_info *info, fsdp_dtype round,
                   int check_nan, fsdp_err *err) {
    ld_src *src = calloc(1, sizeof *src);
    if (!src) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    state_src_init(&src->base, ld_fill, ld_destroy, (int64_t)state_param_local_numel(p));
    src->r = ckpt_reader_ref(r);
    src->ci = ci;
    src->row0 = p->row0;
    src->rows = p->rows;
    src->row_numel = p->row_numel > 0 ? p->row_numel : 1;
    src->total_rows = p->ndim ? p->shape[0] : 1;
    src->heads = info && info->qk != NMAP_QK_NONE ? info->heads : 0;
    src->check_nan = check_nan;
    int rc = state_param_defer(s, p, &src->base, round, err);
    state_src_unref(&src->base); /* p holds it now (or nobody: freed) */
    return rc;
}
