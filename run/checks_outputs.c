/* checks_outputs (checks.h): outputs a stage would refuse to replace, found before anything runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_steps.h"
#include "ckpt/dcp.h"
#include "ckpt/safetensors.h"
#include "pipeline/value_impl.h"
#include "run/checks.h"

/* How the user turns the stage's `overwrite` on: the recipe var that gives it, else the key. */
static const char *overwrite_knob(const recipe_stage *s, char *buf, size_t cap) {
    const char *var = val_from_var(fsdp_value_get(s->with, "overwrite"));
    if (var) snprintf(buf, cap, "pass --set vars.%s=true (the recipe's var for overwrite)", var);
    else snprintf(buf, cap, "set overwrite: true");
    return buf;
}

static int flag(const recipe_stage *s, const char *key, int dflt) {
    int v;
    return fsdp_value_bool(fsdp_value_get(s->with, key), &v) == 0 ? v : dflt;
}

static void check_save_dcp(const recipe_stage *s, errlist *el) {
    const fsdp_value *pv = fsdp_value_get(s->with, "path");
    const char *path = fsdp_value_text(pv);
    if (!path || !*path || flag(s, "overwrite", 0) || !dcp_dir_has_checkpoint(path)) return;
    char knob[256];
    errlist_add_at(el, pv,
                   "stage '%s' (save-dcp): path %s already holds a checkpoint: %s "
                   "to replace it (atomically: the old checkpoint stays whole until the new one is committed), "
                   "remove it, or give another path",
                   s->id, path, overwrite_knob(s, knob, sizeof knob));
}

static void refuse_st(const recipe_stage *s, const fsdp_value *v, const char *what, errlist *el) {
    char knob[256];
    errlist_add_at(el, v,
                   "stage '%s' (save-safetensors): %s %s already exists and overwrite is false: %s "
                   "to replace it (by rename, atomically), remove it, or give another path",
                   s->id, what, fsdp_value_text(v), overwrite_knob(s, knob, sizeof knob));
}

static void check_save_safetensors(const recipe_stage *s, errlist *el) {
    if (flag(s, "overwrite", 1)) return;
    const fsdp_value *pv = fsdp_value_get(s->with, "path"), *cp = fsdp_value_get(s->with, "copies");
    const char *path = fsdp_value_text(pv);
    int64_t shard_mb = 0;
    fsdp_value_int(fsdp_value_get(s->with, "shard_mb"), &shard_mb);
    char file[4200];
    int hf = !strcmp(fsdp_arg_str(s->with, "names", "torchtitan"), "hf");
    int dir = path && *path && shard_mb <= 0 && st_export_file(path, hf, file, sizeof file);
    if (path && *path && (shard_mb > 0 ? st_output_exists(path, "model") : st_output_exists(file, NULL)))
        refuse_st(s, pv,
                  shard_mb > 0 ? "path (its model.safetensors.index.json)" : dir ? "path (its model.safetensors)" : "path",
                  el);
    for (size_t i = 0; i < fsdp_value_size(cp); i++) {
        const char *c = fsdp_value_text(fsdp_value_item(cp, i));
        if (c && *c && st_output_exists(c, NULL)) refuse_st(s, fsdp_value_item(cp, i), "copy", el);
    }
}

/* A train-steps that starts at step 0 (the recipe's first, after no load-ckpt, in a recipe that continues
 * no earlier one): its periodic saves step-<every>, step-<2 every>, ... up to steps, none of which may
 * replace a checkpoint there without save_overwrite (the run's own check, train_steps.c, after init). */
static void check_periodic(const recipe_stage *s, errlist *el) {
    int64_t every = 0, steps = 0;
    const fsdp_value *ev = fsdp_value_get(s->with, "save_every");
    const char *base = fsdp_value_text(fsdp_value_get(s->with, "save_path"));
    if (fsdp_value_int(ev, &every) || every <= 0 || !base || !*base || flag(s, "save_overwrite", 0)) return;
    if (fsdp_value_int(fsdp_value_get(s->with, "steps"), &steps)) return;
    ckpt_step_dir *v = NULL;
    size_t n = 0;
    fsdp_err e;
    if (ckpt_steps_list(base, &v, &n, &e)) return; /* a listing error is the save's to report */
    for (size_t i = 0; i < n; i++) {
        char dir[4200];
        ckpt_steps_dir(dir, sizeof dir, base, v[i].step);
        if (v[i].step <= 0 || v[i].step > steps || v[i].step % every || !dcp_dir_has_checkpoint(dir)) continue;
        errlist_add_at(el, ev,
                       "stage '%s' (train-steps): the periodic save of step %lld would replace the checkpoint %s; "
                       "resume from it (load-ckpt path: %s/latest), choose another save_path, or set "
                       "save_overwrite: true",
                       s->id, (long long)v[i].step, dir, base);
        break;
    }
    free(v);
}

void checks_outputs(const recipe *r, int chained, errlist *el) {
    int from_zero = !chained; /* the training steps start at 0 until a load or an earlier train-steps */
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        if (!strcmp(s->uses, "load-ckpt")) from_zero = 0;
        if (!s->with) continue;
        if (!strcmp(s->uses, "save-dcp")) check_save_dcp(s, el);
        else if (!strcmp(s->uses, "save-safetensors")) check_save_safetensors(s, el);
        else if (!strcmp(s->uses, "train-steps")) {
            if (from_zero) check_periodic(s, el);
            from_zero = 0;
        }
    }
}
