/* checks_outputs (checks.h): outputs a stage would refuse to replace, found before anything runs. */
#include <stdio.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/safetensors.h"
#include "pipeline/checks.h"

static int flag(const recipe_stage *s, const char *key, int dflt) {
    int v;
    return fsdp_value_bool(fsdp_value_get(s->with, key), &v) == 0 ? v : dflt;
}

static void check_save_dcp(const recipe_stage *s, errlist *el) {
    const fsdp_value *pv = fsdp_value_get(s->with, "path");
    const char *path = fsdp_value_text(pv);
    if (!path || !*path || flag(s, "overwrite", 0) || !dcp_dir_has_checkpoint(path)) return;
    errlist_add_at(el, pv,
                   "stage '%s' (save-dcp): path %s already holds a checkpoint: set overwrite: true "
                   "to replace it (atomically: the old checkpoint stays whole until the new one is committed), "
                   "remove it, or give another path",
                   s->id, path);
}

static void refuse_st(const recipe_stage *s, const fsdp_value *v, const char *what, errlist *el) {
    errlist_add_at(el, v,
                   "stage '%s' (save-safetensors): %s %s already exists and overwrite is false: set overwrite: true "
                   "to replace it (by rename, atomically), remove it, or give another path",
                   s->id, what, fsdp_value_text(v));
}

static void check_save_safetensors(const recipe_stage *s, errlist *el) {
    if (flag(s, "overwrite", 1)) return;
    const fsdp_value *pv = fsdp_value_get(s->with, "path"), *cp = fsdp_value_get(s->with, "copies");
    const char *path = fsdp_value_text(pv);
    int64_t shard_mb = 0;
    fsdp_value_int(fsdp_value_get(s->with, "shard_mb"), &shard_mb);
    if (path && *path && st_output_exists(path, shard_mb > 0 ? "model" : NULL))
        refuse_st(s, pv, shard_mb > 0 ? "path (its model.safetensors.index.json)" : "path", el);
    for (size_t i = 0; i < fsdp_value_size(cp); i++) {
        const char *c = fsdp_value_text(fsdp_value_item(cp, i));
        if (c && *c && st_output_exists(c, NULL)) refuse_st(s, fsdp_value_item(cp, i), "copy", el);
    }
}

void checks_outputs(const recipe *r, errlist *el) {
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        if (!s->with) continue;
        if (!strcmp(s->uses, "save-dcp")) check_save_dcp(s, el);
        else if (!strcmp(s->uses, "save-safetensors")) check_save_safetensors(s, el);
    }
}
