/* The decoder family's parameter init (see decoder_init.h). */
#include "decoder/decoder_init.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/tensor.h"
#include "model/init_fill.h"

uint64_t decoder_init_stream(const decoder_param *p) { return init_stream(p->name); }

int decoder_init_dist(const decoder_param *p, rng_dist *d, fsdp_err *err) {
    int64_t shape[2] = {p->shape[0], p->shape[1]};
    char what[DECODER_PARAM_NAME_MAX + 16];
    snprintf(what, sizeof what, "decoder init: %s", p->name);
    return init_rule_dist(&p->init, p->ndim, shape, what, d, err);
}

static int check_rows(const decoder_param *p, int64_t r0, int64_t r1, const void *dst, fsdp_err *err) {
    if (!p) return fsdp_err_set(err, FSDP_E_INVALID, "decoder init: no parameter given");
    if (r0 < 0 || r1 < r0 || r1 > p->shape[0])
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder init: rows [%lld, %lld) are outside [0, %lld) of %s",
                            (long long)r0, (long long)r1, (long long)p->shape[0], p->name);
    if (r1 > r0 && !dst) return fsdp_err_set(err, FSDP_E_INVALID, "decoder init: no output buffer for %s", p->name);
    if (p->row_numel <= 0 || p->shape[0] > INT64_MAX / p->row_numel)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder init: bad shape of %s", p->name);
    return FSDP_OK;
}

int decoder_init_jobs(const decoder_init_job *jobs, int n, uint64_t seed, fsdp_err *err) {
    if (n < 0 || (n > 0 && !jobs)) return fsdp_err_set(err, FSDP_E_INVALID, "decoder init: no jobs given");
    if (n == 0) return FSDP_OK;
    init_job *g = calloc((size_t)n, sizeof *g);
    if (!g) return fsdp_err_set(err, FSDP_E_NOMEM, "decoder init: out of memory for %d jobs", n);
    int rc = FSDP_OK;
    for (int i = 0; i < n && !rc; i++) {
        const decoder_init_job *j = &jobs[i];
        rc = check_rows(j->p, j->r0, j->r1, j->f32 ? (const void *)j->f32 : (const void *)j->bf16, err);
        if (!rc) rc = decoder_init_dist(j->p, &g[i].dist, err);
        if (!rc) rc = init_rule_zero_range(&j->p->init, j->p->ndim, j->p->shape, 0, INT64_MAX, j->p->name,
                                           &g[i].zero_e0, &g[i].zero_e1, err);
        g[i].stream = decoder_init_stream(j->p);
        g[i].e0 = j->r0 * j->p->row_numel;
        g[i].n = (j->r1 - j->r0) * j->p->row_numel;
        g[i].f32 = j->f32;
        g[i].half = j->f32 ? NULL : j->bf16;
        g[i].dtype = (!j->f32 || j->round_bf16) ? FSDP_DT_BF16 : FSDP_DT_F32;
    }
    if (!rc) rc = init_fill_jobs(g, n, seed, "decoder init", err);
    free(g);
    return rc;
}

int decoder_init_rows_f32(const decoder_param *p, uint64_t seed, int64_t r0, int64_t r1, float *dst, fsdp_err *err) {
    const decoder_init_job j = {p, r0, r1, dst, NULL, 0};
    int rc = check_rows(p, r0, r1, dst, err);
    return rc ? rc : decoder_init_jobs(&j, 1, seed, err);
}

int decoder_init_rows_bf16(const decoder_param *p, uint64_t seed, int64_t r0, int64_t r1, uint16_t *dst,
                         fsdp_err *err) {
    const decoder_init_job j = {p, r0, r1, NULL, dst, 0};
    int rc = check_rows(p, r0, r1, dst, err);
    return rc ? rc : decoder_init_jobs(&j, 1, seed, err);
}

/* Every parameter of t, as jobs, into f32 or bf16. */
static int init_model(const decoder_params *t, uint64_t seed, float *f32, uint16_t *bf16, fsdp_err *err) {
    if (!t || (t->n > 0 && (!t->p || (!f32 && !bf16))))
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder init: no table or no output buffer");
    if (t->n <= 0) return t->n == 0 ? FSDP_OK : fsdp_err_set(err, FSDP_E_INVALID, "decoder init: bad table");
    decoder_init_job *jobs = calloc((size_t)t->n, sizeof *jobs);
    if (!jobs) return fsdp_err_set(err, FSDP_E_NOMEM, "decoder init: out of memory for %d jobs", t->n);
    for (int i = 0; i < t->n; i++) {
        const decoder_param *p = &t->p[i];
        jobs[i].p = p;
        jobs[i].r0 = 0;
        jobs[i].r1 = p->shape[0];
        if (f32) jobs[i].f32 = f32 + p->offset;
        else jobs[i].bf16 = bf16 + p->offset;
    }
    int rc = decoder_init_jobs(jobs, t->n, seed, err);
    free(jobs);
    return rc;
}

int decoder_init_model_f32(const decoder_params *t, uint64_t seed, float *flat, fsdp_err *err) {
    return init_model(t, seed, flat, NULL, err);
}

int decoder_init_model_bf16(const decoder_params *t, uint64_t seed, uint16_t *flat, fsdp_err *err) {
    return init_model(t, seed, NULL, flat, err);
}
