/* Deferred init values (see init_defer.h). */
#include "model/init_defer.h"

#include <stdlib.h>

typedef struct init_src {
    state_src base; /* first */
    init_job job;   /* e0: the first local element's index in the whole parameter */
    uint64_t seed;
} init_src;

static void init_src_destroy(state_src *src) { free(src); }

static int init_src_fill(const state_src *src, int64_t e0, size_t n, float *dst, fsdp_err *err) {
    const init_src *s = (const init_src *)src;
    init_job j = s->job;
    j.e0 = s->job.e0 + e0;
    j.n = (int64_t)n;
    j.f32 = dst;
    j.half = NULL;
    return init_fill_one(&j, s->seed, "init", err);
}

int init_defer_param(fsdp_state *s, state_param *p, const init_job *job, uint64_t seed, fsdp_err *err) {
    init_src *src = calloc(1, sizeof *src);
    if (!src) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int64_t n = (int64_t)state_param_local_numel(p);
    state_src_init(&src->base, init_src_fill, init_src_destroy, n);
    src->job = *job;
    src->job.e0 = p->row0 * p->row_numel;
    src->job.n = n;
    src->seed = seed;
    int rc = state_param_defer(s, p, &src->base, FSDP_DT_INVALID, err);
    state_src_unref(&src->base);
    return rc;
}
