/* Deferred parameter values (see state_defer.h). */
#include "runtime/state_defer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ctx_impl.h"
#include "runtime/rng.h"

/* materialisation runs on every thread in pieces of this many elements (4 MiB of float32) */
#define DEFER_PIECE ((int64_t)1 << 20)

void state_src_init(state_src *src, state_src_fill_fn fill, void (*destroy)(state_src *), int64_t numel) {
    src->fill = fill;
    src->destroy = destroy;
    src->refs = 1;
    src->numel = numel;
}

state_src *state_src_ref(state_src *src) {
    if (src) __atomic_add_fetch(&src->refs, 1, __ATOMIC_RELAXED);
    return src;
}

void state_src_unref(state_src *src) {
    if (src && __atomic_sub_fetch(&src->refs, 1, __ATOMIC_ACQ_REL) == 0 && src->destroy) src->destroy(src);
}

int state_defer_allowed(const fsdp_ctx *ctx) { return ctx && ctx->defer_ok; }

int state_param_defer(fsdp_state *s, state_param *p, state_src *src, fsdp_dtype round, fsdp_err *err) {
    if (s->layout != STATE_SHARDED || p->d_data || (p->pinned & 1u) || p->grad || p->d_grad || p->exp_avg ||
        p->d_exp_avg || p->exp_avg_sq || p->d_exp_avg_sq)
        return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: only the host rows of a sharded parameter without "
                            "gradient or moments can be deferred", p->name);
    if (src && src->numel != (int64_t)state_param_local_numel(p))
        return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: a producer of %lld values for %zu local values",
                            p->name, (long long)src->numel, state_param_local_numel(p));
    state_src *old = p->src;
    free(p->data);
    p->data = NULL;
    p->src = state_src_ref(src);
    p->src_round = round == FSDP_DT_BF16 || round == FSDP_DT_F16 ? round : FSDP_DT_INVALID;
    p->deferred = 1;
    p->no_value = src == NULL;
    state_src_unref(old);
    return 0;
}

void state_param_undefer(state_param *p) {
    if (!p->deferred) return;
    state_src *old = p->src;
    p->src = NULL;
    p->deferred = 0;
    p->src_round = FSDP_DT_INVALID;
    state_src_unref(old);
}

int state_param_fill(const state_param *p, int64_t e0, size_t n, float *dst, fsdp_err *err) {
    size_t local = state_param_local_numel(p);
    if (e0 < 0 || (size_t)e0 > local || n > local - (size_t)e0)
        return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: elements [%lld, +%zu) outside its %zu local values",
                            p->name, (long long)e0, n, local);
    if (!n) return 0;
    if (!p->deferred) {
        if (!p->data) return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: its values are not in host memory", p->name);
        memcpy(dst, p->data + e0, n * sizeof *dst);
        return 0;
    }
    if (!p->src) {
        for (size_t k = 0; k < n; k++) dst[k] = NAN;
        return 0;
    }
    int rc = p->src->fill(p->src, e0, n, dst, err);
    if (rc) return fsdp_err_prefix(err, "%s", p->name);
    /* the vectorised rounding of the init fills (runtime/rng.h): fsdp_f32_to_bf16 / _f16's bits */
    if (p->src_round == FSDP_DT_BF16 || p->src_round == FSDP_DT_F16)
        rng_round_half_path(rng_path_default(), dst, n, p->src_round == FSDP_DT_BF16);
    return 0;
}

int state_param_materialize(fsdp_state *s, state_param *p, fsdp_err *err) {
    (void)s;
    if (!p->deferred) return 0;
    size_t n = state_param_local_numel(p);
    float *data = malloc((n ? n : 1) * sizeof *data);
    if (!data) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory: %zu values of %s", n, p->name);
    int64_t pieces = ((int64_t)n + DEFER_PIECE - 1) / DEFER_PIECE;
    int failed = 0;
    fsdp_err first;
    fsdp_err_clear(&first);
#pragma omp parallel for schedule(dynamic, 1) if (pieces > 1)
    for (int64_t q = 0; q < pieces; q++) {
        int stop;
#pragma omp atomic read
        stop = failed;
        if (stop) continue;
        int64_t a = q * DEFER_PIECE, b = a + DEFER_PIECE < (int64_t)n ? a + DEFER_PIECE : (int64_t)n;
        fsdp_err e;
        fsdp_err_clear(&e);
        if (state_param_fill(p, a, (size_t)(b - a), data + a, &e)) {
#pragma omp critical(state_defer_err)
            if (!failed) first = e, failed = 1;
        }
    }
    if (failed) {
        free(data);
        *err = first;
        return first.code ? first.code : FSDP_E_IO;
    }
    state_param_undefer(p);
    p->data = data;
    return 0;
}

int state_materialize(fsdp_state *s, size_t *count, fsdp_err *err) {
    size_t k = 0;
    for (size_t i = 0; s && i < s->n; i++) {
        if (!s->p[i].deferred) continue;
        int rc = state_param_materialize(s, &s->p[i], err);
        if (rc) return rc;
        k++;
    }
    if (count) *count = k;
    return 0;
}

size_t state_deferred_count(const fsdp_state *s) {
    size_t k = 0;
    for (size_t i = 0; s && i < s->n; i++) k += s->p[i].deferred != 0;
    return k;
}
