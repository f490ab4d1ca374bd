/* Static checks of a recipe: schedule, metrics directory, precision and device, chained models. */
#include "run/checks.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline/value_impl.h"
#include "runtime/device.h"

/* A key's integer value as written (1 when present and an integer). */
static int int_key(const fsdp_value *with, const char *key, const fsdp_value **at, int64_t *x) {
    *at = fsdp_value_get(with, key);
    return *at && fsdp_value_type(*at) == FSDP_V_SCALAR && fsdp_value_int(*at, x) == 0;
}

static void check_warmup(const recipe_stage *s, errlist *el) {
    const fsdp_value *wv, *sv, *schv;
    int64_t w, steps, sch;
    if (!int_key(s->with, "warmup_steps", &wv, &w)) return;
    if (int_key(s->with, "schedule_steps", &schv, &sch) && w > sch)
        errlist_add_at(el, wv, "stage '%s' (train-steps): warmup_steps %lld is more than schedule_steps %lld", s->id,
               (long long)w, (long long)sch);
    else if (!schv && int_key(s->with, "steps", &sv, &steps) && w > steps)
        errlist_add_at(el, wv,
               "stage '%s' (train-steps): warmup_steps %lld is more than steps %lld (the schedule would never leave "
               "its warmup)",
               s->id, (long long)w, (long long)steps);
}

/* The nearest existing ancestor of dir is a directory this process may create entries in. */
static int can_create(const char *dir, char *blame, size_t cap) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (;;) {
        struct stat st;
        if (stat(buf, &st) == 0) {
            snprintf(blame, cap, "%s", buf);
            if (!S_ISDIR(st.st_mode)) return ENOTDIR;
            return access(buf, W_OK | X_OK) == 0 ? 0 : errno;
        }
        if (errno != ENOENT) {
            snprintf(blame, cap, "%s", buf);
            return errno;
        }
        char *slash = strrchr(buf, '/');
        if (!slash) {
            snprintf(buf, sizeof buf, ".");
        } else if (slash == buf) {
            buf[1] = '\0';
        } else {
            *slash = '\0';
        }
    }
}

static void check_metrics(const recipe_stage *s, const sizes_host *h, errlist *el) {
    const fsdp_value *mv = fsdp_value_get(s->with, "metrics");
    const char *path = fsdp_value_text(mv);
    if (!path || !*path) return;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        errlist_add_at(el, mv, "stage '%s' (train-steps): metrics: %s is a directory, expected a JSONL file path", s->id, path);
        return;
    }
    char *dup = strdup(path);
    if (!dup) return;
    const char *dir = dirname(dup);
    char blame[PATH_MAX] = "";
    (void)h; /* checked, not created: a run validation refuses creates nothing (train-steps makes it) */
    int e = can_create(dir, blame, sizeof blame);
    if (e)
        errlist_add_at(el, mv, "stage '%s' (train-steps): metrics: cannot create the directory %s of %s%s%s: %s", s->id, dir,
               path, blame[0] ? " at " : "", blame, strerror(e));
    free(dup);
}

/* Whether the recipe trains on the CPU: 1 yes, 0 no or unknown. */
static int on_cpu(const recipe *r, const sizes_host *h) {
    const char *dev = fsdp_value_text(fsdp_value_path(r->root, "runtime.device"));
    if (dev && !strcmp(dev, "cpu")) return 1;
    if (dev && !strcmp(dev, "cuda")) return 0;
    if (!dev_built_with_cuda()) return 1;
    if (!h->probe_device) return 0; /* auto under validate: the run's host decides */
    int n = 0;
    fsdp_err e;
    return dev_count(&n, &e) != 0 || n == 0;
}

static void check_mixed(const recipe *r, const recipe_stage *s, const sizes_host *h, errlist *el) {
    const fsdp_value *mv = fsdp_value_get(s->with, "mixed");
    const char *m = fsdp_value_text(mv);
    if (!m || strcmp(m, "bf16") || !on_cpu(r, h)) return;
    const char *dev = fsdp_value_text(fsdp_value_path(r->root, "runtime.device"));
    errlist_add_at(el, mv,
           "stage '%s' (train-steps): mixed: bf16 is the GPU path's precision, but this run trains on the CPU (%s): "
           "use runtime.device: cuda on a host with a GPU, or remove mixed (the CPU path trains in float32)",
           s->id,
           dev && !strcmp(dev, "cpu") ? "runtime.device: cpu"
           : !dev_built_with_cuda()   ? "this fsdp-run was built without CUDA"
                                      : "no GPU on this host");
}

/* Whether the recipe trains on a GPU: 1 yes (runtime.device: cuda, or auto on a run whose host has one),
 * 0 no or unknown (auto under validate). */
static int on_gpu(const recipe *r, const sizes_host *h) {
    const char *dev = fsdp_value_text(fsdp_value_path(r->root, "runtime.device"));
    if (dev && strcmp(dev, "auto")) return !strcmp(dev, "cuda");
    return dev_built_with_cuda() && h->probe_device && !on_cpu(r, h);
}

/* offload {params: true} keeps the master weights in host memory, and the GPU trainer computes from
 * weights on the device: a train-steps or eval after it on a GPU would silently train on the CPU. */
static void check_offload_params(const recipe *r, const sizes_host *h, errlist *el) {
    const recipe_stage *off = NULL;
    int gpu = -1; /* probed once, and only for a recipe that has the pair */
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        int params = 0;
        if (!strcmp(s->uses, "offload") && s->with && !fsdp_value_bool(fsdp_value_get(s->with, "params"), &params) &&
            params && !off)
            off = s;
        if (!off || (strcmp(s->uses, "train-steps") && strcmp(s->uses, "eval"))) continue;
        if (gpu < 0) gpu = on_gpu(r, h);
        if (gpu)
            errlist_add_at(el, fsdp_value_get(off->with, "params"),
                           "stage '%s' (%s) comes after stage '%s' (offload) with params: true on the GPU: the GPU "
                           "trainer computes from weights on the device, so it cannot run with the master weights in "
                           "host memory (it would fall back to the CPU). Use offload without params (the optimizer "
                           "state still goes to host memory), or runtime.device: cpu",
                           s->id, s->uses, off->id);
    }
}

static void check_chained_model(const recipe *r, const fsdp_value *prev, errlist *el) {
    const fsdp_value *model = fsdp_value_get(r->root, "model");
    if (!prev || !model || fsdp_value_type(model) == FSDP_V_NULL) return;
    for (size_t i = 0; i < r->n_stages; i++)
        if (!strcmp(r->stages[i].uses, "init-meta") || !strcmp(r->stages[i].uses, "init-cpu")) return;
    char *a = val_to_flow(prev), *b = val_to_flow(model);
    if (a && b && strcmp(a, b)) {
        const char *file;
        int line, col;
        fsdp_value_where(prev, &file, &line, &col);
        errlist_add_at(el, model,
               "model: %s differs from the model %s of %s:%d:%d, whose state this recipe continues (it has no init-meta "
               "or init-cpu stage): remove this model: section, or make it the same",
               b, a, file, line, col);
    }
    free(a);
    free(b);
}

void checks_recipe(const recipe *r, const sizes_host *h, const fsdp_value *prev_model, errlist *el) {
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        if (strcmp(s->uses, "train-steps") || !s->with) continue;
        check_warmup(s, el);
        check_metrics(s, h, el);
        check_mixed(r, s, h, el);
    }
    check_offload_params(r, h, el);
    check_chained_model(r, prev_model, el);
    checks_outputs(r, prev_model != NULL, el);
}
