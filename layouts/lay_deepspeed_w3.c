/* ZeRO-3's optimizer files (layouts/lay_deepspeed_w.h): each parameter of n elements cut into world parts of
 * pn = ceil(n / world), the last padded with zeros; rank r's flat partition is its part of every parameter one after
 * another, in sub groups of whole parameters closed once they reach sub_group_size elements (DeepSpeed's
 * zero_optimization.sub_group_size, default 1e9); AdamW's state one entry per sub group
 * (tests/data/trainers/deepspeed-0.19/zero3/README.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/lay_deepspeed_w.h"

static int64_t part_of(const lay_dsw *d, const lay_dsw_param *p) {
    return (p->numel + d->o->world - 1) / d->o->world;
}

/* The sub groups of group G: [first[k], first[k + 1]) of its parameters; *n of them (first has n + 1 entries). */
static size_t sub_groups(const lay_dsw *d, const lay_dsw_group *G, size_t *first) {
    size_t n = 0;
    int64_t sum = 0;
    first[0] = 0;
    for (size_t k = 0; k < G->n; k++) {
        sum += part_of(d, &d->p[G->ids[k]]);
        if (sum >= d->o->sub_group_size || k + 1 == G->n) first[++n] = k + 1, sum = 0;
    }
    return n;
}

/* Rank r's part of sub group [a, b) of G: weights (which 0) or a moment (1, 2), each parameter's pn elements. */
static int sub_tensor(lay_dsw *d, ptw_file *t, const lay_dsw_group *G, size_t a, size_t b, int which, int r,
                      fsdp_err *err) {
    int64_t len = 0;
    for (size_t k = a; k < b; k++) len += part_of(d, &d->p[G->ids[k]]);
    int rc = ptw_tensor_begin(t, FSDP_DT_F32, 1, &len, err);
    for (size_t k = a; k < b && !rc; k++) {
        const lay_dsw_param *p = &d->p[G->ids[k]];
        int64_t pn = part_of(d, p), lo = r * pn, hi = lo + pn < p->numel ? lo + pn : p->numel;
        size_t i = which == 0 ? p->w : (size_t)(which == 1 ? p->m1 : p->m2);
        if (lo < hi) rc = lay_dsw_put_elems(d, t, i, lo, hi, err);
        if (!rc) rc = lay_dsw_put_zeros(t, pn - (lo < hi ? hi - lo : 0), err);
    }
    if (!rc) rc = ptw_tensor_end(t, err);
    d->written++;
    d->bytes += (uint64_t)len * 4;
    return rc;
}

/* optimizer_state_dict (torch AdamW over the sub groups) and fp32_flat_groups of rank r */
static int w_state(lay_dsw *d, ptw_file *t, const size_t *first, size_t ns, int r, fsdp_err *err) {
    pkl_w *w = ptw_pickle(t);
    const lay_dsw_group *G = &d->g[0];
    int rc = 0;
    pkl_w_str(w, "optimizer_state_dict");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "state");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    for (size_t k = 0; k < ns && !rc; k++) {
        pkl_w_int(w, (int64_t)k);
        pkl_w_empty_dict(w);
        pkl_w_mark(w);
        pkl_w_str(w, "step");
        rc = ptw_tensor_from(t, d->v, (size_t)d->p[G->ids[first[k]]].st, FSDP_DT_F32, err);
        d->written++, d->bytes += 4;
        pkl_w_str(w, "exp_avg");
        if (!rc) rc = sub_tensor(d, t, G, first[k], first[k + 1], 1, r, err);
        pkl_w_str(w, "exp_avg_sq");
        if (!rc) rc = sub_tensor(d, t, G, first[k], first[k + 1], 2, r, err);
        pkl_w_setitems(w);
    }
    pkl_w_setitems(w);
    pkl_w_str(w, "param_groups");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    int64_t *subs = malloc((ns ? ns : 1) * sizeof *subs); /* the group's "parameters": its sub groups */
    if (!subs) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; k < ns; k++) subs[k] = (int64_t)k;
    if (!rc) rc = lay_dsw_group_write(d, t, 0, subs, ns, err);
    free(subs);
    pkl_w_appends(w);
    pkl_w_setitems(w);
    pkl_w_str(w, "fp32_flat_groups");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t k = 0; k < ns && !rc; k++) rc = sub_tensor(d, t, G, first[k], first[k + 1], 0, r, err);
    pkl_w_appends(w);
    return rc;
}

int lay_dsw_optim_file3(lay_dsw *d, const char *dir, int r, fsdp_err *err) {
    if (d->ng != 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "the optimizer has %zu param groups: DeepSpeed ZeRO-3 is written for one "
                            "(how ZeRO-3 numbers the sub groups of several was not checked against DeepSpeed)", d->ng);
    size_t *first = malloc((d->g[0].n + 1) * sizeof *first);
    if (!first) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t ns = sub_groups(d, &d->g[0], first);
    char path[4600], arch[128];
    snprintf(arch, sizeof arch, "zero_pp_rank_%d_mp_rank_00_optim_states", r);
    snprintf(path, sizeof path, "%s/%s.pt", dir, arch);
    ptw_file *t;
    int rc = ptw_begin(path, arch, &t, err);
    if (rc) return free(first), rc;
    pkl_w *w = ptw_pickle(t);
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "optimizer_state_dict");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "zero_stage");
    pkl_w_global(w, "deepspeed.runtime.zero.config", "ZeroStageEnum");
    pkl_w_int(w, 3);
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    lay_dsw_scaler(w);
    pkl_w_str(w, "partition_count");
    pkl_w_int(w, d->o->world);
    rc = w_state(d, t, first, ns, r, err);
    free(first);
    pkl_w_setitems(w);
    return lay_dsw_end(d, t, rc, err);
}
