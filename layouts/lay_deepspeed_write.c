/* DeepSpeed ZeRO-1/2/3 checkpoints written from fsdp-run's layout (layouts/lay_deepspeed.h, lay_ds_write): the files
 * DeepSpeedEngine.save_checkpoint writes for fp32 training of a transformers Llama, which its load_checkpoint resumes
 * on the same data-parallel world size (tests/data/trainers/deepspeed-0.19/zero2/README.md has the format). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/pt_write.h"
#include "layouts/lay_deepspeed.h"
#include "layouts/lay_deepspeed_w.h"
#include "layouts/lay_rows.h"
#include "runtime/fileio.h"

static const char *const no_options[] = {"initial_lr", NULL}; /* torch AdamW without a scheduler */

/* fsdp-run's checkpoint seen as DeepSpeed's module and torch optimizer see it: HF names (q/k rows rotate-half), the
 * optimizer state by parameter id in module order, the groups by index with their lists of ids */
static const lay_layout ds_row = {
    .name = "deepspeed-zero",
    .system = "DeepSpeed 0.19.8 ZeRO-1/2/3 (DeepSpeedEngine.save_checkpoint, fp32) of a transformers Llama",
    .covers = "weights, optimizer, global_steps",
    .model = "",
    .optim = "optimizer.",
    .rope = LAY_ROPE_HALF,
    .names = lay_hf_llama_names,
    .n_names = LAY_HF_LLAMA_N_NAMES,
    .groups = LAY_GROUPS_INDEXED,
    .ids = LAY_IDS_MODULE_ORDER,
    .no_options = no_options,
};

static int collect_params(lay_dsw *d, fsdp_err *err) {
    size_t n = ckpt_count(d->v), k = 0;
    const char **names = calloc(n ? n : 1, sizeof *names);
    size_t *idx = calloc(n ? n : 1, sizeof *idx), *order = calloc(n ? n : 1, sizeof *order);
    d->p = calloc(n ? n : 1, sizeof *d->p);
    int rc = names && idx && order && d->p ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_entry *e = ckpt_entry_at(d->v, i);
        if (!e->is_tensor || !strncmp(e->name, "optimizer.", 10)) continue;
        names[k] = e->name, idx[k++] = i;
    }
    if (!rc) rc = lay_module_order(&ds_row, names, k, order, err);
    for (size_t j = 0; j < k && !rc; j++) {
        lay_dsw_param *p = &d->p[j];
        p->w = idx[order[j]];
        const ckpt_entry *e = ckpt_entry_at(d->v, p->w);
        p->numel = 1;
        for (int a = 0; a < e->ndim; a++) p->numel *= e->shape[a];
        const char *kind[3] = {"exp_avg", "exp_avg_sq", "step"};
        long *at[3] = {&p->m1, &p->m2, &p->st};
        for (int q = 0; q < 3 && !rc; q++) {
            char key[160];
            snprintf(key, sizeof key, "optimizer.state.%zu.%s", j, kind[q]);
            if ((*at[q] = ckpt_find(d->v, key)) < 0)
                rc = fsdp_err_set(err, FSDP_E_INVALID, "%s has no AdamW %s in the checkpoint: DeepSpeed's frozen parameters "
                                  "(frozen_param_shapes) are not written; load its optimizer state or train it first",
                                  e->name, kind[q]);
        }
    }
    d->np = k;
    free(names), free(idx), free(order);
    return rc;
}

/* The ints of list value i (the group's params): *ids malloc'd. */
static int int_list(ckpt_reader *r, size_t i, long **ids, size_t *n, fsdp_err *err) {
    const char *name = ckpt_entry_at(r, i)->name;
    pkl_doc *doc;
    const pkl_obj *root;
    int rc = ptw_value_parse(r, i, &doc, &root, err);
    if (rc) return rc;
    *n = 0;
    if (root->kind != PKL_LIST) rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: expected a list of parameter ids", name);
    else if (!(*ids = malloc((root->n ? root->n : 1) * sizeof **ids))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t k = 0; !rc && k < root->n; k++) {
        if (root->items[k]->kind != PKL_INT) rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: item %zu is not an id", name, k);
        else (*ids)[(*n)++] = (long)root->items[k]->i;
    }
    pkl_free(doc);
    return rc;
}

/* The param groups: each a run of the parameters' ids (module order), its options the view's entries. */
static int collect_groups(lay_dsw *d, fsdp_err *err) {
    int rc = 0;
    size_t covered = 0;
    for (int g = 0; !rc; g++) {
        char key[160];
        snprintf(key, sizeof key, "optimizer.param_groups.%d.params", g);
        long i = ckpt_find(d->v, key);
        if (i < 0) break;
        lay_dsw_group *G = realloc(d->g, (size_t)(g + 1) * sizeof *G);
        if (!G) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        d->g = G, G = &d->g[g];
        memset(G, 0, sizeof *G);
        d->ng = (size_t)g + 1;
        G->params_entry = (size_t)i;
        if ((rc = int_list(d->v, (size_t)i, &G->ids, &G->n, err))) break;
        for (size_t k = 0; k < G->n && !rc; k++) {
            if (G->ids[k] < 0 || (size_t)G->ids[k] >= d->np || d->p[G->ids[k]].group)
                rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: parameter id %ld is not one parameter of one group", key, G->ids[k]);
            else d->p[G->ids[k]].group = g + 1, d->p[G->ids[k]].off = G->total, G->total += d->p[G->ids[k]].numel;
        }
        covered += G->n;
        int64_t align = 2 * (int64_t)d->o->world; /* DeepSpeed's nccl_start_alignment_factor x the world */
        G->part = (G->total + align - 1) / align * align / d->o->world;
    }
    if (!rc && covered != d->np)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "the optimizer's param groups hold %zu of the %zu parameters", covered, d->np);
    return rc;
}

static void dsw_free(lay_dsw *d) {
    for (size_t g = 0; g < d->ng; g++) free(d->g[g].ids);
    free(d->g);
    free(d->p);
    free(d->buf);
    if (d->v) ckpt_close(d->v);
}

/* The tag directory staged as DIR/<tag>.partial, renamed at the end; an existing <tag> kept unless overwrite. */
static int commit_tag(const char *dir, const char *tag, const char *stage, int overwrite, fsdp_err *err) {
    char fin[4400], old[4500], latest[4400], tmp[4500];
    snprintf(fin, sizeof fin, "%s/%s", dir, tag);
    snprintf(old, sizeof old, "%s.old", fin);
    int had = access(fin, F_OK) == 0;
    if (had && (!overwrite || rename(fin, old) != 0))
        return overwrite ? fsdp_err_set(err, FSDP_E_IO, "cannot move %s aside: %s", fin, strerror(errno))
                         : fsdp_err_set(err, FSDP_E_INVALID, "%s exists (pass --overwrite to replace it)", fin);
    if (rename(stage, fin) != 0) return fsdp_err_set(err, FSDP_E_IO, "cannot rename %s: %s", stage, strerror(errno));
    if (had) fio_remove_tree(old);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(tmp, sizeof tmp, "%s/latest.tmp", dir);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fputs(tag, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, latest) != 0) {
        unlink(tmp);
        return fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", latest, strerror(errno));
    }
    fio_fsync_dir(dir);
    return 0;
}

int lay_ds_stage_of(const char *name) {
    static const char *const names[] = {"deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"};
    for (int k = 0; k < 3; k++)
        if (name && !strcmp(name, names[k])) return k + 1;
    return 0;
}

int lay_ds_wopts_options(const char *const *opt, size_t n_opt, lay_ds_wopts *o, fsdp_err *err) {
    o->clip_grad = -1, o->sub_group_size = 1000000000;
    for (size_t k = 0; k < n_opt; k++) {
        const char *eq = strchr(opt[k], '='), *v = eq ? eq + 1 : "";
        char *end;
        int clip = !strncmp(opt[k], "gradient_clipping=", 18), sub = !strncmp(opt[k], "sub_group_size=", 15);
        if (!clip && !(sub && o->stage == 3))
            return fsdp_err_set(err, FSDP_E_INVALID, "option %s: DeepSpeed ZeRO-%d's checkpoint keeps no such setting "
                                "(gradient_clipping%s)", opt[k], o->stage, o->stage == 3 ? ", sub_group_size" : "");
        double x = strtod(v, &end);
        if (!*v || *end || x < 0 || (sub && (x < 1 || x != (double)(int64_t)x)))
            return fsdp_err_set(err, FSDP_E_INVALID, "option %s: not a %s", opt[k], sub ? "whole number >= 1" :
                                "number >= 0");
        if (clip) o->clip_grad = x;
        else o->sub_group_size = (int64_t)x;
    }
    if (o->clip_grad < 0 && o->stage != 3)
        return fsdp_err_set(err, FSDP_E_INVALID, "DeepSpeed keeps gradient_clipping in its checkpoint (clip_grad, which "
                            "replaces the engine's on load) and fsdp-run's checkpoint does not hold it: pass --option "
                            "gradient_clipping=VALUE (save-dcp: options: {gradient_clipping: VALUE}; the job's ds_config "
                            "value, 0 for none)");
    return 0;
}

int lay_ds_write(ckpt_reader *canon, const lay_facts *f, const char *dir, const lay_ds_wopts *o, fsdp_err *err) {
    if (o->stage < 1 || o->stage > 3)
        return fsdp_err_set(err, FSDP_E_INVALID, "DeepSpeed has no ZeRO stage %d to write (1, 2 or 3)", o->stage);
    if (o->stage == 3 && o->sub_group_size < 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "ZeRO-3's sub_group_size must be >= 1");
    if (o->world < 1) return fsdp_err_set(err, FSDP_E_INVALID, "DeepSpeed's data-parallel world size must be >= 1");
    lay_dsw d = {0};
    d.o = o, d.canon = canon;
    int rc = lay_view(canon, 0, &ds_row, LAY_FROM_CANON, f, &d.v, NULL, err);
    if (!rc) rc = collect_params(&d, err);
    if (!rc) rc = collect_groups(&d, err);
    if (!rc) rc = lay_dsw_step(&d, err);
    char tag[64], stage[4400];
    if (o->tag) snprintf(tag, sizeof tag, "%s", o->tag);
    else snprintf(tag, sizeof tag, "global_step%lld", (long long)d.step);
    snprintf(stage, sizeof stage, "%s/%s.partial", dir, tag);
    if (!rc && access(stage, F_OK) == 0)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "%s exists (left by an interrupted convert?): remove it first", stage);
    if (!rc && mkdir(dir, 0777) != 0 && errno != EEXIST)
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot create %s: %s", dir, strerror(errno));
    if (!rc && mkdir(stage, 0777) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot create %s: %s", stage, strerror(errno));
    int made = !rc;
    for (int r = 0; r < o->world && !rc; r++) {
        rc = o->stage == 3 ? lay_dsw_optim_file3(&d, stage, r, err) : lay_dsw_optim_file(&d, stage, r, err);
        if (!rc && (o->stage == 3 || r == 0)) rc = lay_dsw_model_file(&d, stage, r, err);
    }
    if (!rc) rc = commit_tag(dir, tag, stage, o->overwrite, err);
    if (rc && made) fio_remove_tree(stage);
    if (o->written) *o->written = rc ? 0 : d.written;
    if (o->bytes) *o->bytes = rc ? 0 : d.bytes;
    dsw_free(&d);
    return rc;
}
