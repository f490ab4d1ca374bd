/* The items of one rank's DCP data file (see save_plan.h). */
#include "ckpt/save_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/key_layout.h"
#include "ckpt/state_resume.h"

static save_item *plan_add(save_plan *p, fsdp_err *err) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        save_item *ni = realloc(p->items, cap * sizeof *ni);
        if (!ni) {
            fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            return NULL;
        }
        p->items = ni;
        p->cap = cap;
    }
    save_item *it = &p->items[p->n++];
    memset(it, 0, sizeof *it);
    it->alias_of = -1;
    it->param = -1;
    it->alias = -1;
    return it;
}

static int key_fits(const char *fqn, fsdp_err *err) {
    if (strlen(fqn) < sizeof ((save_item *)0)->fqn) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID, "save-dcp: key %.64s... is %zu bytes long (a DCP key holds at most %zu)",
                        fqn, strlen(fqn), sizeof ((save_item *)0)->fqn - 1);
}

static int add_value_at(save_plan *p, const char *fqn, int nest, unsigned int_mask, pkl_w *w, fsdp_err *err) {
    if (w->oom) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = key_fits(fqn, err);
    save_item *it = rc ? NULL : plan_add(p, err);
    if (!it) return err->code;
    snprintf(it->fqn, sizeof it->fqn, "%s", fqn);
    it->nest = nest;
    it->int_mask = int_mask;
    it->value = malloc(w->len ? w->len : 1);
    if (!it->value) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    memcpy(it->value, w->buf, w->len);
    it->value_len = w->len;
    w->len = 0;
    return 0;
}

static int add_entry(void *user, const char *key, pkl_w *w, fsdp_err *err) {
    return add_value_at(user, key, 0, 0, w, err);
}

static int add_fresh(void *user, const char *key, int nest, unsigned int_mask, pkl_w *w, fsdp_err *err) {
    save_plan *p = user;
    int rc = add_value_at(p, key, nest, int_mask, w, err);
    if (!rc) p->items[p->n - 1].fresh = 1;
    return rc;
}

/* planner_data nesting of a parameter key under prefix: (<prefix components>..., name) */
static int prefix_nest(const char *prefix) { return prefix && *prefix ? fopt_prefix_depth(prefix) : 0; }

static int add_chunk(save_plan *p, const state_param *sp, const char *fqn, state_array a, fsdp_dtype dt,
                     int world, fsdp_err *err) {
    int rc = key_fits(fqn, err);
    save_item *it = rc ? NULL : plan_add(p, err);
    if (!it) return err->code;
    snprintf(it->fqn, sizeof it->fqn, "%s", fqn);
    it->is_tensor = 1;
    it->dtype = dt;
    it->ndim = sp->ndim;
    memcpy(it->shape, sp->shape, sizeof it->shape);
    memcpy(it->sizes, sp->shape, sizeof it->sizes);
    if (sp->ndim > 0) {
        it->sizes[0] = sp->rows;
        /* an empty shard records the dimension size as its offset (PyTorch >= 2.8) */
        it->offsets[0] = sp->rows == 0 && world > 1 ? sp->shape[0] : sp->row0;
    }
    if (a == STATE_DATA && sp->deferred) {
        it->deferred = sp;
        return 0;
    }
    it->on_dev = state_place_of(sp, a) == STATE_DEVICE;
    it->data = it->on_dev ? *state_param_dev_slot((state_param *)sp, a) : *state_param_host_slot((state_param *)sp, a);
    return 0;
}

void splan_free(save_plan *p) {
    for (size_t i = 0; i < p->n; i++) free(p->items[i].value);
    free(p->items);
    free(p->snapshot);
    memset(p, 0, sizeof *p);
}

int splan_prefix_ok(const char *p) {
    fsdp_err e; /* the key-layout rule of every prefix (ckpt/key_layout.h) */
    return p && ckl_prefix_check("prefix", p, &e) == 0;
}

/* rank 0's values: what AdamW + set_state_dict and torchtitan's checkpointer need
 * (ckpt/state_resume.c), and train_state */
static int rank0_values(fsdp_state *s, const sio_save_opts *o, int with_opt, save_plan *p, fsdp_err *err) {
    int rc = 0;
    /* a parameter outside the optimizer (a buffer, or frozen and never trained: no moments) has no
     * group entry, as PyTorch's optimizer of the requires_grad parameters holds none for it */
    for (size_t i = 0; with_opt && i < s->n && !rc; i++)
        if (state_param_has_moments(&s->p[i])) rc = sres_param_group(s, s->p[i].name, add_entry, p, err);
    if (!rc && with_opt) rc = sres_lr_scheduler(s, add_entry, p, err);
    struct {
        const char *k;
        int64_t v;
    } ts[] = {{"train_state.step", s->train_step},
              {"train_state.ntokens_seen", s->tokens_seen},
              {"train_state.data_pos", (int64_t)s->data_pos}};
    pkl_w w;
    pkl_w_init(&w);
    /* plugins' named bytes (include/fsdp/ckpt.h), rank 0's */
    char key[1200];
    for (size_t b = 0; b < s->n_blobs && !rc; b++) {
        snprintf(key, sizeof key, "plugin_state.%s", s->blobs[b].key);
        pkl_w_bytes(&w, s->blobs[b].data, s->blobs[b].n);
        rc = add_entry(p, key, &w, err);
    }
    for (int t = 0; t < 3 && !rc && !o->no_train_state; t++) {
        pkl_w_int(&w, ts[t].v);
        rc = add_entry(p, ts[t].k, &w, err);
    }
    pkl_w_free(&w);
    return rc;
}

/* HSDP (runtime/mesh.h): world rank w is replica w / S of a state sharded over S ranks, and every
 * replica holds the same chunks. Each chunk is written once, by one replica: parameter i's chunk of
 * shard rank k by replica (i + k) mod R, so that every replica (every node) writes its share. 1 when
 * this rank writes parameter i's chunk. */
static int writes_chunk(const fsdp_state *s, int rank, int world, size_t i) {
    if (s->layout != STATE_SHARDED || s->world < 1 || world <= s->world || world % s->world) return 1;
    int R = world / s->world, replica = rank / s->world;
    return (int)((i + (size_t)s->rank) % (size_t)R) == replica;
}

/* The chunks of every parameter this rank writes (and its AdamW moments). */
static int param_chunks(fsdp_state *s, int rank, int world, const sio_save_opts *o, int with_opt, save_plan *p,
                        fsdp_err *err) {
    int rc = 0, full = s->layout == STATE_FULL;
    int shard_world = full ? 1 : s->world < world && s->world > 0 ? s->world : world;
    char key[1200];
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *sp = &s->p[i];
        if (full && rank != 0) break;
        if (!writes_chunk(s, rank, world, i)) continue;
        /* a 0-d value is replicated on every rank: written once, by rank 0 (as PyTorch's planner
         * dedups replicated items) */
        if (sp->ndim == 0 && rank != 0) continue;
        snprintf(key, sizeof key, "%s%s", o->key_prefix ? o->key_prefix : "", sp->name);
        rc = add_chunk(p, sp, key, STATE_DATA, sp->dtype, shard_world, err);
        if (!rc) {
            p->items[p->n - 1].param = (long)i;
            p->items[p->n - 1].nest = prefix_nest(o->key_prefix);
        }
        if (!rc && with_opt && state_param_has_moments(sp)) {
            snprintf(key, sizeof key, "optimizer.state.%s.exp_avg", sp->name);
            rc = add_chunk(p, sp, key, STATE_EXP_AVG, FSDP_DT_F32, shard_world, err);
            if (!rc) {
                snprintf(key, sizeof key, "optimizer.state.%s.exp_avg_sq", sp->name);
                rc = add_chunk(p, sp, key, STATE_EXP_AVG_SQ, FSDP_DT_F32, shard_world, err);
            }
        }
    }
    return rc;
}

/* AdamW's step: a replicated 0-d float32 tensor per parameter, written once (data filled from
 * opt_step when written) */
static int step_tensors(const fsdp_state *s, save_plan *p, fsdp_err *err) {
    for (size_t i = 0; i < s->n; i++) {
        if (!state_param_has_moments(&s->p[i])) continue;
        save_item *it = plan_add(p, err);
        if (!it) return err->code;
        snprintf(it->fqn, sizeof it->fqn, "optimizer.state.%s.step", s->p[i].name);
        it->is_tensor = 1;
        it->dtype = FSDP_DT_F32;
        it->ndim = 0;
        it->data = NULL;
    }
    return 0;
}

/* Every parameter chunk of the plan again under each alias: items that share its record. */
static int alias_items(const fsdp_state *s, const sio_save_opts *o, save_plan *p, fsdp_err *err) {
    size_t n0 = p->n;
    int rc = 0;
    for (size_t a = 0; a < o->n_aliases && !rc; a++) {
        for (size_t j = 0; j < n0 && !rc; j++) {
            if (p->items[j].param < 0) continue;
            char key[1200];
            snprintf(key, sizeof key, "%s%s", o->aliases[a], s->p[p->items[j].param].name);
            rc = key_fits(key, err);
            save_item *it = rc ? NULL : plan_add(p, err);
            if (!it) return err->code;
            save_item *src = &p->items[j];
            *it = *src;
            snprintf(it->fqn, sizeof it->fqn, "%s", key);
            it->data = NULL;
            it->deferred = NULL;
            it->on_dev = 0;
            it->alias_of = (long)j;
            it->alias = (int)a;
            it->nest = prefix_nest(o->aliases[a]);
        }
    }
    return rc;
}

int splan_build(fsdp_state *s, int rank, int world, const sio_save_opts *o, save_plan *p, fsdp_err *err) {
    int rc = 0;
    int with_opt = o->optimizer && s->has_optimizer;
    if (rank == 0) rc = rank0_values(s, o, with_opt, p, err);
    if (!rc && with_opt) rc = sres_dataloader(rank, world, add_entry, p, err);
    if (!rc) rc = param_chunks(s, rank, world, o, with_opt, p, err);
    if (!rc && with_opt && rank == 0) rc = step_tensors(s, p, err);
    if (!rc) rc = alias_items(s, o, p, err);
    /* after the parameters in .metadata, as dcp.save({"model": .., "ema_model": .., "optimizer": ..})
     * lists them (in the data file, values come first all the same) */
    if (!rc && rank == 0 && o->fresh_optim) rc = fopt_entries(o->fresh_optim, s->n, add_fresh, p, err);
    return rc;
}
