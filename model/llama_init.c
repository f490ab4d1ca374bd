/* Llama-3 parameter init (see llama_init.h). */
#include "model/llama_init.h"

#include <math.h>
#include <stdlib.h>

#include "fsdp/tensor.h"
#include "runtime/rng.h"

/* bf16 output is produced through a float buffer of this many elements. */
#define INIT_BF16_CHUNK ((size_t)1 << 18)

uint64_t llama_init_stream(const llama_param *p) { return rng_fnv1a64(p->name); }

static int check_rows(const llama_param *p, int64_t r0, int64_t r1, const void *dst,
                      fsdp_err *err) {
    if (!p) return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no parameter given");
    if (r0 < 0 || r1 < r0 || r1 > p->shape[0])
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "llama init: rows [%lld, %lld) are outside [0, %lld) of %s",
                            (long long)r0, (long long)r1, (long long)p->shape[0], p->name);
    if (r1 > r0 && !dst)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no output buffer for %s", p->name);
    if (p->row_numel <= 0 || p->shape[0] > INT64_MAX / p->row_numel)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: bad shape of %s", p->name);
    return FSDP_OK;
}

/* Elements [start, start + n) of p into dst. */
static int fill_elems(const llama_param *p, uint64_t seed, uint64_t stream, uint64_t start,
                      size_t n, float *dst, fsdp_err *err) {
    const llama_init_rule *r = &p->init;
    switch (r->kind) {
    case LLAMA_INIT_NORMAL:
        if (!isfinite(r->mean) || !isfinite(r->std) || !(r->std > 0))
            return fsdp_err_set(err, FSDP_E_INVALID, "llama init: %s: bad normal(%g, %g)",
                                p->name, r->mean, r->std);
        rng_fill_normal(dst, seed, stream, start, n, r->mean, r->std);
        return FSDP_OK;
    case LLAMA_INIT_TRUNC_NORMAL: {
        rng_trunc_normal t;
        int rc = rng_trunc_normal_init(&t, r->mean, r->std, r->a, r->b, err);
        if (rc) return fsdp_err_prefix(err, "llama init: %s", p->name);
        rng_fill_trunc_normal(dst, &t, seed, stream, start, n);
        return FSDP_OK;
    }
    case LLAMA_INIT_ONES:
        for (size_t k = 0; k < n; k++) dst[k] = 1.0f;
        return FSDP_OK;
    }
    return fsdp_err_set(err, FSDP_E_INVALID, "llama init: %s: unknown init rule %d", p->name,
                        (int)r->kind);
}

int llama_init_rows_f32(const llama_param *p, uint64_t seed, int64_t r0, int64_t r1, float *dst,
                        fsdp_err *err) {
    int rc = check_rows(p, r0, r1, dst, err);
    if (rc || r1 == r0) return rc;
    uint64_t start = (uint64_t)(r0 * p->row_numel);
    size_t n = (size_t)((r1 - r0) * p->row_numel);
    return fill_elems(p, seed, llama_init_stream(p), start, n, dst, err);
}

int llama_init_rows_bf16(const llama_param *p, uint64_t seed, int64_t r0, int64_t r1,
                         uint16_t *dst, fsdp_err *err) {
    int rc = check_rows(p, r0, r1, dst, err);
    if (rc || r1 == r0) return rc;
    uint64_t start = (uint64_t)(r0 * p->row_numel);
    size_t n = (size_t)((r1 - r0) * p->row_numel);
    size_t cap = n < INIT_BF16_CHUNK ? n : INIT_BF16_CHUNK;
    float *tmp = malloc(cap * sizeof *tmp);
    if (!tmp)
        return fsdp_err_set(err, FSDP_E_NOMEM, "llama init: out of memory for %s", p->name);
    const uint64_t stream = llama_init_stream(p);
    for (size_t done = 0; done < n && !rc; done += cap) {
        size_t m = n - done < cap ? n - done : cap;
        rc = fill_elems(p, seed, stream, start + done, m, tmp, err);
        if (rc) break;
        const int64_t mm = (int64_t)m;
#pragma omp parallel for schedule(static) if (mm >= 65536)
        for (int64_t k = 0; k < mm; k++) dst[done + (size_t)k] = fsdp_f32_to_bf16(tmp[k]);
    }
    free(tmp);
    return rc;
}

int llama_init_model_f32(const llama_params *t, uint64_t seed, float *flat, fsdp_err *err) {
    if (!t || (t->n > 0 && (!t->p || !flat)))
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no table or no output buffer");
    for (int i = 0; i < t->n; i++) {
        const llama_param *p = &t->p[i];
        int rc = llama_init_rows_f32(p, seed, 0, p->shape[0], flat + p->offset, err);
        if (rc) return rc;
    }
    return FSDP_OK;
}

int llama_init_model_bf16(const llama_params *t, uint64_t seed, uint16_t *flat, fsdp_err *err) {
    if (!t || (t->n > 0 && (!t->p || !flat)))
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no table or no output buffer");
    for (int i = 0; i < t->n; i++) {
        const llama_param *p = &t->p[i];
        int rc = llama_init_rows_bf16(p, seed, 0, p->shape[0], flat + p->offset, err);
        if (rc) return rc;
    }
    return FSDP_OK;
}
