/* checks_inputs (checks.h): checkpoints a load-ckpt stage reads, found (or not) before anything runs. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_steps.h"
#include "ckpt/dcp.h"
#include "run/checks.h"
#include "runtime/fileio.h"

/* A stage of r or of a recipe before it in the chain writes path. */
static int produced(const recipe *const *prev, size_t n_prev, const recipe *r, const char *path) {
    if (recipe_writes(r, path)) return 1;
    for (size_t i = 0; i < n_prev; i++)
        if (recipe_writes(prev[i], path)) return 1;
    return 0;
}

/* `validate` checks recipes for another machine: there, a path whose directory does not exist here
 * either is skipped (fio_not_there_yet); a run refuses it. */
static int missing_here_only(const sizes_host *h, const char *path) {
    return !h->probe_device && fio_not_there_yet(path);
}

static void check_latest(const recipe_stage *s, const fsdp_value *pv, const char *base, const sizes_host *h,
                         errlist *el) {
    struct stat st;
    if (stat(base, &st) != 0 || !S_ISDIR(st.st_mode)) {
        if (!missing_here_only(h, base))
            errlist_add_at(el, pv,
                           "stage '%s' (load-ckpt): path %s/latest: %s is not a directory of step-<N> checkpoints "
                           "and no stage writes it (if_missing: init starts without one)",
                           s->id, base, base);
        return;
    }
    int64_t step;
    fsdp_err e;
    if (ckpt_steps_latest(base, &step, &e) == 0 && step < 0)
        errlist_add_at(el, pv,
                       "stage '%s' (load-ckpt): path %s/latest: %s holds no committed step-<N> checkpoint and no "
                       "stage writes one (if_missing: init starts without one)",
                       s->id, base, base);
}

static void check_load(const recipe *const *prev, size_t n_prev, const recipe *r, const recipe_stage *s,
                       const sizes_host *h, errlist *el) {
    const fsdp_value *pv = fsdp_value_get(s->with, "path");
    const char *path = fsdp_value_text(pv), *miss = fsdp_value_text(fsdp_value_get(s->with, "if_missing"));
    if (!path || !*path || (miss && !strcmp(miss, "init")) || produced(prev, n_prev, r, path)) return;
    char base[4096];
    if (ckpt_steps_is_latest(path, base, sizeof base)) {
        check_latest(s, pv, base, h, el);
        return;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        if (!missing_here_only(h, path))
            errlist_add_at(el, pv,
                           "stage '%s' (load-ckpt): path %s does not exist and no stage of the recipe writes it "
                           "(a relative path is looked up beside the recipe file that names it, then in the working "
                           "directory)",
                           s->id, path);
        return;
    }
    char hint[1024];
    if (S_ISDIR(st.st_mode) && !dcp_dir_has_checkpoint(path) && ckpt_steps_hint(path, hint, sizeof hint))
        errlist_add_at(el, pv, "stage '%s' (load-ckpt): path %s is a run directory, not a checkpoint: %s", s->id,
                       path, hint);
}

void checks_inputs(const recipe *const *prev, size_t n_prev, const recipe *r, const sizes_host *h, errlist *el) {
    for (size_t i = 0; i < r->n_stages; i++)
        if (!strcmp(r->stages[i].uses, "load-ckpt") && r->stages[i].with)
            check_load(prev, n_prev, r, &r->stages[i], h, el);
}
