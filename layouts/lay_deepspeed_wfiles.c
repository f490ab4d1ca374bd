/* The files of a DeepSpeed ZeRO-1/2 checkpoint (layouts/lay_deepspeed_w.h): the ranks' optimizer states, cut from
 * each param group's flat vector as DeepSpeed partitions it, and the model states. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/pt_write.h"
#include "layouts/lay_deepspeed_w.h"


#define DSW_PIECE ((size_t)4 << 20) /* elements read at a time */

int lay_dsw_step(lay_dsw *d, fsdp_err *err) {
    double first = 0;
    for (size_t k = 0; k < d->np; k++) {
        double s;
        int rc = ckpt_read_rows(d->v, (size_t)d->p[k].st, 0, 1, &s, FSDP_DT_F64, err);
        if (rc) return rc;
        if (k == 0) first = s;
        else if (s != first)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: AdamW step %g where the other parameters' is %g: DeepSpeed keeps one "
                                "step per param group", ckpt_entry_at(d->v, d->p[k].st)->name, s, first);
    }
    long i = ckpt_find(d->canon, "train_state.step");
    int64_t v;
    d->step = i >= 0 && !ckpt_value_int(d->canon, (size_t)i, &v) ? v : (int64_t)llround(first);
    return 0;
}

int lay_dsw_put_elems(lay_dsw *d, ptw_file *t, size_t i, int64_t e0, int64_t e1, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(d->v, i);
    int64_t rows = e->ndim ? e->shape[0] : 1, numel = 1;
    for (int a = 0; a < e->ndim; a++) numel *= e->shape[a];
    int64_t rl = rows ? numel / rows : 1, step = rl ? (int64_t)(DSW_PIECE / (size_t)rl) : 1;
    if (step < 1) step = 1;
    size_t need = (size_t)(step * rl);
    if (need > d->buf_cap) {
        float *b = realloc(d->buf, need * sizeof *b);
        if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        d->buf = b, d->buf_cap = need;
    }
    int rc = 0;
    for (int64_t r0 = e0 / rl; !rc && r0 * rl < e1; r0 += step) {
        int64_t r1 = r0 + step < rows ? r0 + step : rows;
        if ((rc = ckpt_read_rows(d->v, i, r0, r1, d->buf, FSDP_DT_F32, err))) break;
        int64_t a = e0 > r0 * rl ? e0 : r0 * rl, b = e1 < r1 * rl ? e1 : r1 * rl;
        rc = ptw_tensor_data(t, d->buf + (a - r0 * rl), (size_t)(b - a) * sizeof(float), err);
    }
    return rc;
}

int lay_dsw_put_zeros(ptw_file *t, int64_t n, fsdp_err *err) {
    static const float zero[1024];
    int rc = 0;
    for (int64_t k = 0; k < n && !rc; k += 1024) rc = ptw_tensor_data(t, zero, (size_t)(n - k < 1024 ? n - k : 1024) * 4, err);
    return rc;
}

/* A 1-d float32 tensor of flat elements [a, b) of group G (which = 0 the weights, 1 exp_avg, 2 exp_avg_sq), then
 * zeros to `len` elements. */
static int flat_tensor(lay_dsw *d, ptw_file *t, const lay_dsw_group *G, int which, int64_t a, int64_t b, int64_t len,
                       fsdp_err *err) {
    int rc = ptw_tensor_begin(t, FSDP_DT_F32, 1, &len, err);
    for (size_t k = 0; k < G->n && !rc; k++) {
        const lay_dsw_param *p = &d->p[G->ids[k]];
        int64_t lo = a > p->off ? a : p->off, hi = b < p->off + p->numel ? b : p->off + p->numel;
        if (lo >= hi) continue;
        size_t i = which == 0 ? p->w : (size_t)(which == 1 ? p->m1 : p->m2);
        rc = lay_dsw_put_elems(d, t, i, lo - p->off, hi - p->off, err);
    }
    if (!rc) rc = lay_dsw_put_zeros(t, len - (b > a ? b - a : 0), err);
    if (!rc) rc = ptw_tensor_end(t, err);
    d->written++;
    d->bytes += (uint64_t)len * 4;
    return rc;
}

void lay_dsw_ds_config(lay_dsw *d, pkl_w *w) {
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "zero_optimization");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "stage");
    pkl_w_int(w, d->o->stage);
    pkl_w_setitems(w);
    if (d->o->clip_grad >= 0) {
        pkl_w_str(w, "gradient_clipping");
        pkl_w_float(w, d->o->clip_grad);
    }
    pkl_w_setitems(w);
}

void lay_dsw_object(pkl_w *w, const char *module, const char *cls, const char *const *keys, const double *vals,
                     const int *kind, int n) {
    pkl_w_global(w, module, cls);
    pkl_w_empty_tuple(w);
    pkl_w_newobj(w);
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    for (int k = 0; k < n; k++) {
        pkl_w_str(w, keys[k]);
        if (kind[k] == 2) pkl_w_bool(w, vals[k] != 0);
        else if (kind[k]) pkl_w_int(w, (int64_t)vals[k]);
        else pkl_w_float(w, vals[k]);
    }
    pkl_w_setitems(w);
    pkl_w_build(w);
}

/* base_optimizer_state: torch AdamW's state_dict() of the rank's partitions, one "parameter" per group */
static int w_base_state(lay_dsw *d, ptw_file *t, int r, fsdp_err *err) {
    pkl_w *w = ptw_pickle(t);
    pkl_w_str(w, "base_optimizer_state");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "state");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    int rc = 0;
    for (size_t g = 0; g < d->ng && !rc; g++) {
        const lay_dsw_group *G = &d->g[g];
        int64_t a = r * G->part, b = a + G->part;
        pkl_w_int(w, (int64_t)g);
        pkl_w_empty_dict(w);
        pkl_w_mark(w);
        pkl_w_str(w, "step");
        rc = ptw_tensor_from(t, d->v, (size_t)d->p[G->ids[0]].st, FSDP_DT_F32, err);
        d->written++, d->bytes += 4;
        pkl_w_str(w, "exp_avg");
        if (!rc) rc = flat_tensor(d, t, G, 1, a, b < G->total ? b : G->total, G->part, err);
        pkl_w_str(w, "exp_avg_sq");
        if (!rc) rc = flat_tensor(d, t, G, 2, a, b < G->total ? b : G->total, G->part, err);
        pkl_w_setitems(w);
    }
    pkl_w_setitems(w);
    pkl_w_str(w, "param_groups");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t g = 0; g < d->ng && !rc; g++) {
        int64_t me = (int64_t)g;
        rc = lay_dsw_group_write(d, t, g, &me, 1, err);
    }
    pkl_w_appends(w);
    pkl_w_setitems(w);
    return rc;
}

int lay_dsw_group_write(lay_dsw *d, ptw_file *t, size_t g, const int64_t *params, size_t n, fsdp_err *err) {
    pkl_w *w = ptw_pickle(t);
    char pre[64];
    size_t pl = (size_t)snprintf(pre, sizeof pre, "optimizer.param_groups.%zu.", g);
    int rc = 0;
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    for (size_t i = 0; i < ckpt_count(d->v) && !rc; i++) {
        const char *name = ckpt_entry_at(d->v, i)->name;
        if (strncmp(name, pre, pl) || !strcmp(name + pl, "params")) continue;
        pkl_w_str(w, name + pl);
        rc = ptw_value_from(t, d->v, i, err);
    }
    pkl_w_str(w, "params");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t k = 0; k < n; k++) pkl_w_int(w, params[k]);
    pkl_w_appends(w);
    pkl_w_setitems(w);
    return rc;
}

void lay_dsw_scaler(pkl_w *w) {
    static const char *const keys[] = {"cur_scale", "dynamic"};
    static const double vals[] = {1.0, 0};
    static const int kind[] = {0, 2};
    pkl_w_str(w, "loss_scaler"); /* a static scaler of 1: fp32 training */
    lay_dsw_object(w, "deepspeed.runtime.fp16.loss_scaler", "LossScaler", keys, vals, kind, 2);
    pkl_w_str(w, "dynamic_loss_scale");
    pkl_w_bool(w, 0);
    pkl_w_str(w, "overflow");
    pkl_w_bool(w, 0);
}

int lay_dsw_end(lay_dsw *d, ptw_file *t, int rc, fsdp_err *err) {
    pkl_w *w = ptw_pickle(t);
    pkl_w_str(w, "ds_config");
    lay_dsw_ds_config(d, w);
    pkl_w_str(w, "ds_version");
    pkl_w_str(w, LAY_DSW_VERSION);
    pkl_w_setitems(w);
    if (!rc) return ptw_finish(t, err);
    ptw_abort(t);
    return rc;
}

/* the padding inside rank r's partition of G (DeepSpeed's group_paddings) */
static int64_t padding_of(const lay_dsw_group *G, int r) {
    int64_t a = r * G->part, b = a + G->part;
    return G->total <= a ? G->part : G->total < b ? b - G->total : 0;
}

static void w_int_list(pkl_w *w, const int64_t *v, size_t n) {
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t k = 0; k < n; k++) pkl_w_int(w, v[k]);
    pkl_w_appends(w);
}

/* single_partition_of_fp32_groups .. param_slice_mappings */
static int w_partition(lay_dsw *d, ptw_file *t, int r, fsdp_err *err) {
    pkl_w *w = ptw_pickle(t);
    int rc = 0;
    pkl_w_str(w, "single_partition_of_fp32_groups");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t g = 0; g < d->ng && !rc; g++) {
        const lay_dsw_group *G = &d->g[g];
        int64_t a = r * G->part, len = G->part - padding_of(G, r);
        rc = flat_tensor(d, t, G, 0, a, a + len, len, err);
    }
    pkl_w_appends(w);
    pkl_w_str(w, "zero_stage");
    pkl_w_global(w, "deepspeed.runtime.zero.config", "ZeroStageEnum");
    pkl_w_int(w, d->o->stage);
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    int64_t *v = calloc(d->ng + d->np + 1, sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t g = 0; g < d->ng; g++) v[g] = padding_of(&d->g[g], r);
    pkl_w_str(w, "group_paddings");
    w_int_list(w, v, d->ng);
    pkl_w_str(w, "param_alignment_paddings"); /* zero after every parameter: parameter_alignment off */
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t g = 0; g < d->ng; g++) {
        memset(v, 0, (d->ng + d->np + 1) * sizeof *v);
        w_int_list(w, v, d->g[g].n);
    }
    pkl_w_appends(w);
    for (size_t g = 0; g < d->ng; g++) v[g] = d->o->world;
    pkl_w_str(w, "partition_count");
    w_int_list(w, v, d->ng);
    free(v);
    pkl_w_str(w, "ds_version");
    pkl_w_str(w, LAY_DSW_VERSION);
    return rc;
}

/* param_slice_mappings: per group, name -> fragment_address(numel, start) of the parameters in rank r's partition */
static void w_mappings(lay_dsw *d, pkl_w *w, int r) {
    static const char *const keys[] = {"numel", "start"};
    static const int ints[] = {1, 1};
    pkl_w_str(w, "param_slice_mappings");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t g = 0; g < d->ng; g++) {
        const lay_dsw_group *G = &d->g[g];
        int64_t a = r * G->part, b = a + G->part;
        pkl_w_global(w, "collections", "OrderedDict");
        pkl_w_empty_tuple(w);
        pkl_w_reduce(w);
        pkl_w_mark(w);
        for (size_t k = 0; k < G->n; k++) {
            const lay_dsw_param *p = &d->p[G->ids[k]];
            int64_t lo = a > p->off ? a : p->off, hi = b < p->off + p->numel ? b : p->off + p->numel;
            if (lo >= hi) continue;
            pkl_w_str(w, ckpt_entry_at(d->v, p->w)->name);
            double vals[2] = {(double)(hi - lo), (double)(lo - a)};
            lay_dsw_object(w, "deepspeed.utils.tensor_fragment", "fragment_address", keys, vals, ints, 2);
        }
        pkl_w_setitems(w);
    }
    pkl_w_appends(w);
}

int lay_dsw_optim_file(lay_dsw *d, const char *dir, int r, fsdp_err *err) {
    char path[4600], arch[128];
    snprintf(arch, sizeof arch, "zero_pp_rank_%d_mp_rank_00_optim_states", r);
    snprintf(path, sizeof path, "%s/%s.pt", dir, arch);
    ptw_file *t;
    int rc = ptw_begin(path, arch, &t, err);
    if (rc) return rc;
    pkl_w *w = ptw_pickle(t);
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "optimizer_state_dict");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    lay_dsw_scaler(w);
    pkl_w_str(w, "clip_grad");
    pkl_w_float(w, d->o->clip_grad);
    rc = w_base_state(d, t, r, err);
    if (!rc) rc = w_partition(d, t, r, err);
    if (!rc) w_mappings(d, w, r);
    pkl_w_setitems(w);
    return lay_dsw_end(d, t, rc, err);
}

/* 'module' (the weights in module order; ZeRO-3: [0] placeholders, the values being in the partitions) and
 * 'param_shapes' (per group) */
static int w_module(lay_dsw *d, ptw_file *t, fsdp_err *err) {
    pkl_w *w = ptw_pickle(t);
    int rc = 0;
    pkl_w_str(w, "module");
    pkl_w_global(w, "collections", "OrderedDict");
    pkl_w_empty_tuple(w);
    pkl_w_reduce(w);
    pkl_w_mark(w);
    for (size_t k = 0; k < d->np && !rc; k++) {
        pkl_w_str(w, ckpt_entry_at(d->v, d->p[k].w)->name);
        if (d->o->stage == 3) {
            int64_t zero = 0;
            rc = ptw_tensor_mem(t, FSDP_DT_F32, 1, &zero, NULL, err);
            continue;
        }
        rc = ptw_tensor_from(t, d->v, d->p[k].w, FSDP_DT_F32, err);
        d->written++;
        d->bytes += (uint64_t)d->p[k].numel * 4;
    }
    pkl_w_setitems(w);
    pkl_w_str(w, "buffer_names");
    pkl_w_empty_list(w);
    pkl_w_str(w, "optimizer");
    pkl_w_none(w);
    pkl_w_str(w, "param_shapes");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    for (size_t g = 0; g < d->ng; g++) {
        pkl_w_global(w, "collections", "OrderedDict");
        pkl_w_empty_tuple(w);
        pkl_w_reduce(w);
        pkl_w_mark(w);
        for (size_t k = 0; k < d->g[g].n; k++) {
            const ckpt_entry *e = ckpt_entry_at(d->v, d->p[d->g[g].ids[k]].w);
            pkl_w_str(w, e->name);
            pkl_w_size(w, e->shape, e->ndim);
        }
        pkl_w_setitems(w);
    }
    pkl_w_appends(w);
    return rc;
}

int lay_dsw_model_file(lay_dsw *d, const char *dir, int r, fsdp_err *err) {
    char path[4600], arch[128];
    if (d->o->stage == 3) snprintf(arch, sizeof arch, "zero_pp_rank_%d_mp_rank_00_model_states", r);
    else snprintf(arch, sizeof arch, "mp_rank_00_model_states");
    snprintf(path, sizeof path, "%s/%s.pt", dir, arch);
    ptw_file *t;
    int rc = ptw_begin(path, arch, &t, err);
    if (rc) return rc;
    pkl_w *w = ptw_pickle(t);
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    rc = w_module(d, t, err);
    static const char *const empty_od[] = {"frozen_param_shapes", "shared_params", "frozen_param_fragments"};
    for (int k = 0; k < 3; k++) {
        pkl_w_str(w, empty_od[k]);
        if (k == 1) {
            pkl_w_empty_dict(w);
            continue;
        }
        pkl_w_global(w, "collections", "OrderedDict");
        pkl_w_empty_tuple(w);
        pkl_w_reduce(w);
    }
    static const char *const nones[] = {"lr_scheduler", "data_sampler", "random_ltd"};
    for (int k = 0; k < 3; k++) pkl_w_str(w, nones[k]), pkl_w_none(w);
    /* global_samples left out: DeepSpeed then takes global_steps x its train_batch_size */
    const char *ints[] = {"skipped_steps", "global_steps", "dp_world_size", "mp_world_size"};
    int64_t vals[] = {0, d->step, d->o->world, 1};
    for (int k = 0; k < 4; k++) pkl_w_str(w, ints[k]), pkl_w_int(w, vals[k]);
    pkl_w_str(w, "checkpoint_parallel_dimensions");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "pp_degree");
    pkl_w_int(w, 1);
    pkl_w_str(w, "tp_degree");
    pkl_w_int(w, 1);
    pkl_w_setitems(w);
    return lay_dsw_end(d, t, rc, err);
}
