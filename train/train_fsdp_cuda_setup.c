/* The GPU trainer's setup and teardown (train/train_fsdp_cuda.h): parameter lookup, placement of
 * gradients and optimizer moments, gather/gradient buffers, events, workspace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_fsdp_cuda_internal.h"
#include "runtime/shard.h"

int train_fsdp_mixed_from_name(const char *name, train_fsdp_mixed *out, fsdp_err *err) {
    if (name && !strcmp(name, "none")) *out = TRAIN_FSDP_MIXED_NONE;
    else if (name && !strcmp(name, "bf16")) *out = TRAIN_FSDP_MIXED_BF16;
    else return fsdp_err_set(err, FSDP_E_INVALID, "mixed: '%s' is not none or bf16", name ? name : "(null)");
    return 0;
}

int train_fsdp_ac_from_name(const char *name, train_fsdp_ac *out, fsdp_err *err) {
    if (name && !strcmp(name, "none")) *out = TRAIN_FSDP_AC_NONE;
    else if (name && !strcmp(name, "full")) *out = TRAIN_FSDP_AC_FULL;
    else if (name && !strcmp(name, "selective")) *out = TRAIN_FSDP_AC_SELECTIVE;
    else
        return fsdp_err_set(err, FSDP_E_INVALID, "ac: '%s' is not none, full or selective", name ? name : "(null)");
    return 0;
}

size_t train_fsdp_cuda_bytes(const train_fsdp_cuda *f) {
    return f ? f->dev_bytes + (f->ws ? f->m.ws_bytes(f->ws) : 0) : 0;
}

static void dfree(train_fsdp_cuda *f, void *p) {
    fsdp_err e;
    if (p) dev_free(f->d, p, &e);
}

void train_fsdp_cuda_free(train_fsdp_cuda *f) {
    if (!f) return;
    if (f->d) {
        fsdp_err e;
        dev_sync(f->d, &e); /* queued work may still use the buffers */
        for (int b = 0; f->wbuf && b < f->nbuf; b++) dfree(f, f->wbuf[b]);
        for (int b = 0; b < 2; b++) dfree(f, f->gbuf[b]);
        dfree(f, f->full_embed);
        dfree(f, f->full_norm);
        if (f->full_output != f->full_embed) dfree(f, f->full_output);
        if (f->grad_output != f->grad_embed) dfree(f, f->grad_output);
        dfree(f, f->grad_embed);
        dfree(f, f->grad_norm);
        dfree(f, f->d_stats);
        dfree(f, f->gacc);
        dfree(f, f->d_clip);
        train_fsdp_cuda_flat_free(f);
        if (f->h_stats) dev_host_free(f->d, f->h_stats, &e);
        if (f->h_stage) dev_host_free(f->d, f->h_stage, &e);
    }
    for (int b = 0; b < f->nbuf; b++) {
        if (f->g_done) train_fsdp_cuda_event_destroy(f->g_done[b]);
        if (f->use_done) train_fsdp_cuda_event_destroy(f->use_done[b]);
    }
    for (int b = 0; b < 2; b++) {
        train_fsdp_cuda_event_destroy(f->gl_ready[b]);
        train_fsdp_cuda_event_destroy(f->rs_done[b]);
    }
    for (int k = 0; k < TRAIN_FSDP_CUDA_EV_COUNT; k++) train_fsdp_cuda_event_destroy(f->ev[k]);
    for (int g = 0; f->ev_dl && g < f->lay.n_blocks + 2; g++) train_fsdp_cuda_event_destroy(f->ev_dl[g]);
    kcu_tensor_list_free(f->list);
    kcu_tensor_list_free(f->list_wd);
    kcu_tensor_list_free(f->list_nowd);
    free(f->split_mask);
    if (f->ws) f->m.ws_free(f->ws);
    free(f->wbuf);
    free(f->buf_layer);
    free(f->g_done);
    free(f->use_done);
    free(f->ev_dl);
    free(f->layer);
    free(f->expert);
    free(f->fmap);
    if (f->ep_c) comm_destroy(f->ep_c);
    if (f->edp_c) comm_destroy(f->edp_c);
    free(f->aux_buf);
    free(f->load);
    free(f->first);
    free(f->off);
    free(f->bnumel);
    free(f->acc_at);
    free(f->blocks);
    free(f->own_off);
    free(f->bytes);
    free(f->h_off);
    free(f);
}

/* Device memory counted in f->dev_bytes. */
static int dalloc(train_fsdp_cuda *f, size_t n, size_t es, void **p, const char *what, fsdp_err *err) {
    size_t bytes;
    if (__builtin_mul_overflow(n ? n : 1, es, &bytes))
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): size of %s overflows", what);
    int rc = dev_alloc(f->d, bytes, p, err);
    if (rc) return fsdp_err_prefix(err, "training (cuda): %zu bytes for %s", bytes, what);
    f->dev_bytes += bytes;
    return 0;
}

static state_param *need(fsdp_state *s, const char *name, int64_t numel, fsdp_err *err) {
    state_param *p = state_find(s, name);
    if (!p) {
        fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): the model state has no parameter %s", name);
        return NULL;
    }
    if (state_param_numel(p) != numel) {
        fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): parameter %s has %lld elements, the model config needs %lld",
                     name, (long long)state_param_numel(p), (long long)numel);
        return NULL;
    }
    return p;
}

/* The name of a tied embedding without its last component ("tok_embeddings.weight" -> "tok_embeddings"). */
static int stem_len(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? (int)(dot - name) : (int)strlen(name);
}

static int find_params(train_fsdp_cuda *f, fsdp_err *err) {
    fsdp_state *s = f->s;
    const model_blocks_layout *lay = &f->lay;
    const model_blocks *m = &f->m.host;
    const int tied = lay->tied;
    const int L = lay->n_blocks;
    if (lay->per_block < 0 || lay->per_block > TRAIN_FSDP_CUDA_LAYER_PARAMS)
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): a block of %d parameters (at most %d)",
                            lay->per_block, TRAIN_FSDP_CUDA_LAYER_PARAMS);
    if (lay->n_aux && (!f->m.aux_stats || !f->m.aux_apply))
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): the model declares an auxiliary loss but no way to "
                            "compute it on the GPU");
    if (lay->n_aux && !(f->aux_buf = calloc((size_t)lay->n_aux, sizeof *f->aux_buf)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    if (lay->n_experts && f->m.expert_load &&
        !(f->load = calloc((size_t)L * (size_t)lay->n_experts, sizeof *f->load)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    f->layer_numel = lay->block_numel;
    if (!(f->first = calloc((size_t)L + 1, sizeof *f->first)) || !(f->bnumel = calloc((size_t)L + 1, sizeof *f->bnumel)) ||
        !(f->acc_at = calloc((size_t)L + 1, sizeof *f->acc_at)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    for (int i = 0; i < L; i++) {
        int per = lay->per_block;
        int64_t numel = lay->block_numel;
        if (m->block_shape) m->block_shape(m->impl, i, &per, &numel);
        if (per < 0 || per > lay->per_block || numel > lay->block_numel)
            return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): block %d of %d parameters and %lld elements (at "
                                "most %d and %lld)", i, per, (long long)numel, lay->per_block,
                                (long long)lay->block_numel);
        f->first[i + 1] = f->first[i] + per;
        f->bnumel[i] = numel;
        f->acc_at[i + 1] = f->acc_at[i] + numel;
    }
    if (!(f->embed = need(s, lay->embed.name, lay->embed.numel, err)) ||
        !(f->norm = need(s, lay->norm.name, lay->norm.numel, err)) ||
        (!tied && !(f->output = need(s, lay->output.name, lay->output.numel, err))))
        return err->code;
    if (!(f->layer = calloc((size_t)f->first[L] + 1, sizeof *f->layer)) ||
        !(f->off = calloc((size_t)f->first[L] + 1, sizeof *f->off)) ||
        !(f->expert = calloc((size_t)f->first[L] + 1, sizeof *f->expert)) ||
        !(f->fmap = calloc((size_t)f->first[L] + 1, sizeof *f->fmap)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    for (int i = 0; i < L; i++) {
        for (int k = f->first[i]; k < f->first[i + 1]; k++) {
            model_blocks_tensor p;
            m->block_param(m->impl, i, k - f->first[i], &p);
            if (!(f->layer[k] = need(s, p.name, p.numel, err))) return err->code;
            f->off[k] = p.offset;
            f->expert[k] = (unsigned char)p.expert;
        }
    }
    size_t want = (size_t)lay->n_params;
    if (s->n == want) return 0;
    char note[MODEL_BLOCKS_NAME_MAX + 32] = "";
    if (tied && state_find(s, lay->output.name))
        snprintf(note, sizeof note, " (it ties output to %.*s)", stem_len(lay->embed.name), lay->embed.name);
    return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): the state has %zu parameters, the model config %zu%s",
                        s->n, want, note);
}

/* Shard blocks of every parameter, checked against the rows this rank holds. */
static int shard_blocks(train_fsdp_cuda *f, fsdp_err *err) {
    fsdp_state *s = f->s;
    const size_t W = (size_t)f->world;
    if (!(f->blocks = calloc(s->n * W, sizeof *f->blocks)) || !(f->own_off = calloc(s->n, sizeof *f->own_off)) ||
        !(f->bytes = calloc(W, sizeof *f->bytes)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    for (size_t k = 0; k < s->n; k++) {
        const state_param *p = &s->p[k];
        if (p->ndim < 1)
            return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): parameter %s is a scalar (not a model weight)",
                                p->name);
        for (int r = 0; r < f->world; r++) {
            int64_t r0, rows;
            shard_rows(p->shape[0], f->world, r, &r0, &rows);
            f->blocks[k * W + (size_t)r] = (size_t)(rows * p->row_numel);
            if (r == f->rank) {
                if (r0 != p->row0 || rows != p->rows)
                    return fsdp_err_set(err, FSDP_E_INVALID,
                                        "training (cuda): parameter %s holds rows %lld+%lld, rank %d of %d should hold "
                                        "%lld+%lld",
                                        p->name, (long long)p->row0, (long long)p->rows, r, f->world, (long long)r0,
                                        (long long)rows);
                f->own_off[k] = r0 * p->row_numel;
            }
        }
        if (!p->d_data)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "training (cuda): parameter %s is not on the device (place the state on the GPU first)",
                                p->name);
    }
    return 0;
}

/* Gradients and moments on the device (moments in pinned host memory when the state is offloaded),
 * through the state's placement functions (runtime/state.h), which know how each array was
 * allocated (malloc, pinned or device). */
static int place_state(train_fsdp_cuda *f, fsdp_err *err) {
    fsdp_state *s = f->s;
    int rc;
    if ((rc = state_attach_device(s, f->d, err))) return fsdp_err_prefix(err, "training (cuda)");
    for (size_t k = 0; k < s->n; k++) {
        state_param *p = &s->p[k];
        /* gradients carry nothing between steps: fresh zeros on the device */
        if (!p->d_grad && (rc = state_param_alloc(s, p, STATE_GRAD, STATE_DEVICE, 1, err)))
            return fsdp_err_prefix(err, "training (cuda): gradient of %s", p->name);
        for (state_array a = STATE_EXP_AVG; a <= STATE_EXP_AVG_SQ && state_param_trained(p); a++) {
            state_place want = f->offload ? STATE_PINNED : STATE_DEVICE;
            state_place at = state_place_of(p, a);
            if (at == STATE_ABSENT) rc = state_param_alloc(s, p, a, want, 1, err);
            else if (at != want && !(f->offload && at == STATE_HOST)) rc = state_param_move(s, p, a, want, err);
            if (rc) return fsdp_err_prefix(err, "training (cuda): optimizer state of %s", p->name);
        }
    }
    /* the trained parameters (a buffer or a frozen one: no update, not in the norm or the clipping) */
    kcu_tensor *t = calloc(s->n ? s->n : 1, sizeof *t);
    if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    int nt = 0;
    for (size_t k = 0; k < s->n; k++) {
        state_param *p = &s->p[k];
        if (!state_param_trained(p)) continue;
        t[nt++] = (kcu_tensor){p->d_data, p->d_grad, f->offload ? NULL : p->d_exp_avg,
                               f->offload ? NULL : p->d_exp_avg_sq, (int64_t)state_param_local_numel(p)};
    }
    rc = kcu_tensor_list_create(t, nt, &f->list, err);
    free(t);
    return rc ? fsdp_err_prefix(err, "training (cuda): optimizer tensor list") : 0;
}

static int make_buffers(train_fsdp_cuda *f, fsdp_err *err) {
    const model_blocks_layout *lay = &f->lay;
    const size_t E = (size_t)lay->embed.numel, N = (size_t)lay->norm.numel, O = (size_t)lay->output.numel;
    const size_t es = f->es, Ln = (size_t)f->layer_numel;
    const int L = lay->n_blocks;
    int rc;
    f->nbuf = f->opt.keep_gathered ? L : 2;
    if (!(f->wbuf = calloc((size_t)f->nbuf, sizeof *f->wbuf)) ||
        !(f->buf_layer = calloc((size_t)f->nbuf, sizeof *f->buf_layer)) ||
        !(f->g_done = calloc((size_t)f->nbuf, sizeof *f->g_done)) ||
        !(f->use_done = calloc((size_t)f->nbuf, sizeof *f->use_done)) ||
        !(f->ev_dl = calloc((size_t)L + 2, sizeof *f->ev_dl)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    for (int b = 0; b < f->nbuf; b++) {
        f->buf_layer[b] = -1;
        if ((rc = dalloc(f, Ln, es, &f->wbuf[b], "a gathered layer", err))) return rc;
        if ((rc = train_fsdp_cuda_event_create(&f->g_done[b], err)) ||
            (rc = train_fsdp_cuda_event_create(&f->use_done[b], err)))
            return rc;
    }
    for (int b = 0; b < 2; b++) {
        if ((rc = dalloc(f, Ln, sizeof(float), (void **)&f->gbuf[b], "a layer's gradients", err))) return rc;
        if ((rc = train_fsdp_cuda_event_create(&f->gl_ready[b], err)) ||
            (rc = train_fsdp_cuda_event_create(&f->rs_done[b], err)))
            return rc;
    }
    for (int k = 0; k < TRAIN_FSDP_CUDA_EV_COUNT; k++)
        if ((rc = train_fsdp_cuda_event_create(&f->ev[k], err))) return rc;
    if ((rc = dalloc(f, E, es, &f->full_embed, "the gathered embedding", err)) ||

        (rc = dalloc(f, N, es, &f->full_norm, "the gathered norm", err)) ||
        (rc = dalloc(f, E, sizeof(float), (void **)&f->grad_embed, "the embedding gradient", err)) ||

        (rc = dalloc(f, N, sizeof(float), (void **)&f->grad_norm, "the norm gradient", err)) ||
        (rc = dalloc(f, 2, sizeof(double), (void **)&f->d_stats, "the step statistics", err)) ||
        (rc = dalloc(f, 2, sizeof(float), (void **)&f->d_clip, "the clip coefficient", err)))
        return rc;
    if (lay->tied) {
        f->full_output = f->full_embed;
        f->grad_output = f->grad_embed;
    } else if ((rc = dalloc(f, O, es, &f->full_output, "the gathered output weight", err)) ||
               (rc = dalloc(f, O, sizeof(float), (void **)&f->grad_output, "the output gradient", err))) {
        return rc;
    }
    if ((rc = dev_host_alloc(f->d, 2 * sizeof(double), (void **)&f->h_stats, err)))
        return fsdp_err_prefix(err, "training (cuda): pinned statistics");
    if (f->offload) {
        fsdp_state *s = f->s;
        if (!(f->h_off = calloc(s->n, sizeof *f->h_off)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
        size_t total = 0;
        for (size_t k = 0; k < s->n; k++) {
            f->h_off[k] = total;
            if (__builtin_add_overflow(total, state_param_local_numel(&s->p[k]), &total))
                return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): parameter sizes overflow");
        }
        f->stage_total = total;
        size_t bytes;
        if (__builtin_mul_overflow(total ? total : 1, 2 * sizeof(float), &bytes))
            return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): staging size overflows");
        if ((rc = dev_host_alloc(f->d, bytes, (void **)&f->h_stage, err)))
            return fsdp_err_prefix(err, "training (cuda): %zu bytes of pinned staging for the offloaded optimizer",
                                   bytes);
        for (int g = 0; g < L + 2; g++)
            if ((rc = train_fsdp_cuda_event_create(&f->ev_dl[g], err))) return rc;
    }
    return 0;
}

int train_fsdp_cuda_set_replicas(train_fsdp_cuda *f, comm *world, comm *replicate, fsdp_err *err) {
    f->wc = world ? world : f->c;
    f->rep = replicate;
    int rc = replicate ? comm_dev_init(replicate, err) : 0;
    return rc ? fsdp_err_prefix(err, "training (cuda): the replicate group's NCCL communicator") : 0;
}

int train_fsdp_cuda_create(fsdp_state *s, model_blocks_cuda m, comm *c, dev_ctx *d, int B, int T,
                           const train_fsdp_cuda_options *opt, train_fsdp_cuda **out, fsdp_err *err) {
    *out = NULL;
    if (!s || !c || !d) return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): no state, communicator or device");
    if (s->layout != STATE_SHARDED)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "training (cuda): parameters are not sharded (run `shard` after init-cpu)");
    if (B <= 0 || T <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): batch %d x %d must be positive", B, T);
    int rc = m.host.check(m.host.impl, err);
    if (rc) return rc;
    train_fsdp_cuda_options o = {TRAIN_FSDP_MIXED_NONE, TRAIN_FSDP_AC_NONE, 0, 0, 0, 0};
    if (opt) o = *opt;
    model_blocks_ws_opts wo = {(int)o.ac, o.head_chunk_rows};
    if ((rc = m.host.check_opts(m.host.impl, &wo, "training (cuda)", err))) return rc;
    if ((o.mixed != TRAIN_FSDP_MIXED_NONE && o.mixed != TRAIN_FSDP_MIXED_BF16) ||
        (o.ac != TRAIN_FSDP_AC_NONE && o.ac != TRAIN_FSDP_AC_FULL && o.ac != TRAIN_FSDP_AC_SELECTIVE))
        return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): unknown mixed (%d) or ac (%d) option", (int)o.mixed,
                            (int)o.ac);
    train_fsdp_cuda *f = calloc(1, sizeof *f);
    if (!f) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    f->s = s;
    f->c = c;
    f->wc = c;
    f->d = d;
    f->m = m;
    m.host.layout(m.host.impl, &f->lay);
    f->B = B;
    f->T = T;
    f->opt = o;
    f->world = comm_size(c);
    f->rank = comm_rank(c);
    f->dt = o.mixed == TRAIN_FSDP_MIXED_BF16 ? FSDP_DT_BF16 : FSDP_DT_F32;
    f->es = fsdp_dtype_size(f->dt);
    f->offload = s->offloaded != 0;
    if ((rc = find_params(f, err)) || (rc = shard_blocks(f, err)) || (rc = comm_dev_init(c, err)) ||
        (rc = place_state(f, err)) || (rc = make_buffers(f, err)) ||
        (!o.per_param && (rc = train_fsdp_cuda_flat_setup(f, err)))) {
        train_fsdp_cuda_free(f);
        return rc;
    }
    f->ws = m.ws_create(m.host.impl, d, B, T, f->dt, &wo, err);
    if (!f->ws) {
        train_fsdp_cuda_free(f);
        return err->code ? err->code : FSDP_E_DEVICE;
    }
    *out = f;
    return 0;
}

int train_fsdp_cuda_alloc_acc(train_fsdp_cuda *f, fsdp_err *err) {
    if (f->gacc) return 0;
    return dalloc(f, (size_t)f->acc_at[f->lay.n_blocks], sizeof(float), (void **)&f->gacc,
                  "the accumulated gradients of every layer (grad_accum)", err);
}

/* The optimizer descriptors of the parameters whose no_decay flag is `want`; *out NULL when none. */
static int subset_list(train_fsdp_cuda *f, const unsigned char *no_decay, int want, kcu_tensor_list **out,
                       fsdp_err *err) {
    fsdp_state *s = f->s;
    kcu_tensor *t = calloc(s->n ? s->n : 1, sizeof *t);
    if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    int n = 0;
    for (size_t k = 0; k < s->n; k++) {
        state_param *p = &s->p[k];
        if (!no_decay[k] != !want || !state_param_trained(p)) continue;
        t[n++] = (kcu_tensor){p->d_data, p->d_grad, p->d_exp_avg, p->d_exp_avg_sq, (int64_t)state_param_local_numel(p)};
    }
    int rc = n ? kcu_tensor_list_create(t, n, out, err) : 0;
    free(t);
    return rc ? fsdp_err_prefix(err, "training (cuda): optimizer tensor list (no_decay)") : 0;
}

int train_fsdp_cuda_split_lists(train_fsdp_cuda *f, const unsigned char *no_decay, fsdp_err *err) {
    size_t n = f->s->n;
    if (f->split_mask && !memcmp(f->split_mask, no_decay, n)) return 0;
    kcu_tensor_list_free(f->list_wd);
    kcu_tensor_list_free(f->list_nowd);
    f->list_wd = f->list_nowd = NULL;
    free(f->split_mask);
    f->split_mask = malloc(n ? n : 1);
    if (!f->split_mask) return fsdp_err_set(err, FSDP_E_NOMEM, "training (cuda): out of memory");
    memcpy(f->split_mask, no_decay, n);
    int rc = subset_list(f, no_decay, 0, &f->list_wd, err);
    if (!rc) rc = subset_list(f, no_decay, 1, &f->list_nowd, err);
    if (rc) {
        free(f->split_mask);
        f->split_mask = NULL;
    }
    return rc;
}
