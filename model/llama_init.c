/* Llama-3 parameter init (see llama_init.h). */
#include "model/llama_init.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/tensor.h"

/* Jobs are cut into pieces of this many elements of a parameter (aligned to it within the
 * parameter's stream, so that the fills write whole chunks); the pieces of all jobs are shared
 * out among the threads. */
#define INIT_PIECE ((int64_t)RNG_CHUNK * 64)

uint64_t llama_init_stream(const llama_param *p) { return rng_fnv1a64(p->name); }

int llama_init_dist(const llama_param *p, rng_dist *d, fsdp_err *err) {
    const llama_init_rule *r = &p->init;
    int rc;
    switch (r->kind) {
    case LLAMA_INIT_NORMAL:
        rc = rng_dist_normal(d, r->mean, r->std, err);
        return rc ? fsdp_err_prefix(err, "llama init: %s", p->name) : FSDP_OK;
    case LLAMA_INIT_TRUNC_NORMAL:
        rc = rng_dist_trunc_normal(d, r->mean, r->std, r->a, r->b, err);
        return rc ? fsdp_err_prefix(err, "llama init: %s", p->name) : FSDP_OK;
    case LLAMA_INIT_ONES:
        rng_dist_const(d, 1.0f);
        return FSDP_OK;
    }
    return fsdp_err_set(err, FSDP_E_INVALID, "llama init: %s: unknown init rule %d", p->name, (int)r->kind);
}

static int check_rows(const llama_param *p, int64_t r0, int64_t r1, const void *dst, fsdp_err *err) {
    if (!p) return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no parameter given");
    if (r0 < 0 || r1 < r0 || r1 > p->shape[0])
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: rows [%lld, %lld) are outside [0, %lld) of %s",
                            (long long)r0, (long long)r1, (long long)p->shape[0], p->name);
    if (r1 > r0 && !dst) return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no output buffer for %s", p->name);
    if (p->row_numel <= 0 || p->shape[0] > INT64_MAX / p->row_numel)
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: bad shape of %s", p->name);
    return FSDP_OK;
}

static float round_bf16(float v) { return fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)); }

/* A job's elements [e0, e1) (flat indices in the parameter; the job starts at element s). */
static void run_piece(const llama_init_job *j, const rng_dist *d, uint64_t seed, uint64_t stream, int64_t s,
                      int64_t e0, int64_t e1) {
    const size_t n = (size_t)(e1 - e0);
    if (j->f32) {
        float *dst = j->f32 + (e0 - s);
        rng_fill_dist_serial(d, dst, seed, stream, (uint64_t)e0, n);
        if (j->round_bf16)
            for (size_t k = 0; k < n; k++) dst[k] = round_bf16(dst[k]);
        return;
    }
    float buf[INIT_PIECE];
    uint16_t *dst = j->bf16 + (e0 - s);
    rng_fill_dist_serial(d, buf, seed, stream, (uint64_t)e0, n);
    for (size_t k = 0; k < n; k++) dst[k] = fsdp_f32_to_bf16(buf[k]);
}

int llama_init_jobs(const llama_init_job *jobs, int n, uint64_t seed, fsdp_err *err) {
    if (n < 0 || (n > 0 && !jobs)) return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no jobs given");
    if (n == 0) return FSDP_OK;
    rng_dist *dist = malloc((size_t)n * sizeof *dist);
    int64_t *first = malloc(((size_t)n + 1) * sizeof *first); /* first piece of each job */
    uint64_t *streams = malloc((size_t)n * sizeof *streams);
    if (!dist || !first || !streams) {
        free(dist), free(first), free(streams);
        return fsdp_err_set(err, FSDP_E_NOMEM, "llama init: out of memory for %d jobs", n);
    }
    int rc = FSDP_OK;
    first[0] = 0;
    for (int i = 0; i < n && !rc; i++) {
        const llama_init_job *j = &jobs[i];
        rc = check_rows(j->p, j->r0, j->r1, j->f32 ? (const void *)j->f32 : (const void *)j->bf16, err);
        if (!rc) rc = llama_init_dist(j->p, &dist[i], err);
        if (rc) break;
        streams[i] = llama_init_stream(j->p);
        const int64_t s = j->r0 * j->p->row_numel, e = j->r1 * j->p->row_numel;
        const int64_t pieces = e > s ? (e - 1) / INIT_PIECE - s / INIT_PIECE + 1 : 0;
        if (first[i] > INT64_MAX - pieces) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "llama init: too much work");
            break;
        }
        first[i + 1] = first[i] + pieces;
    }
    if (!rc) {
        const int64_t total = first[n];
#pragma omp parallel for schedule(static) if (total > 1)
        for (int64_t q = 0; q < total; q++) {
            int lo = 0, hi = n - 1; /* the job holding piece q: first[lo] <= q < first[lo + 1] */
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (first[mid] <= q) lo = mid;
                else hi = mid - 1;
            }
            const llama_init_job *j = &jobs[lo];
            const int64_t s = j->r0 * j->p->row_numel, e = j->r1 * j->p->row_numel;
            int64_t e0 = (s / INIT_PIECE + (q - first[lo])) * INIT_PIECE, e1 = e0 + INIT_PIECE;
            if (e0 < s) e0 = s;
            if (e1 > e) e1 = e;
            run_piece(j, &dist[lo], seed, streams[lo], s, e0, e1);
        }
    }
    free(dist), free(first), free(streams);
    return rc;
}

int llama_init_rows_f32(const llama_param *p, uint64_t seed, int64_t r0, int64_t r1, float *dst, fsdp_err *err) {
    const llama_init_job j = {p, r0, r1, dst, NULL, 0};
    int rc = check_rows(p, r0, r1, dst, err);
    return rc ? rc : llama_init_jobs(&j, 1, seed, err);
}

int llama_init_rows_bf16(const llama_param *p, uint64_t seed, int64_t r0, int64_t r1, uint16_t *dst,
                         fsdp_err *err) {
    const llama_init_job j = {p, r0, r1, NULL, dst, 0};
    int rc = check_rows(p, r0, r1, dst, err);
    return rc ? rc : llama_init_jobs(&j, 1, seed, err);
}

/* Every parameter of t, as jobs, into f32 or bf16. */
static int init_model(const llama_params *t, uint64_t seed, float *f32, uint16_t *bf16, fsdp_err *err) {
    if (!t || (t->n > 0 && (!t->p || (!f32 && !bf16))))
        return fsdp_err_set(err, FSDP_E_INVALID, "llama init: no table or no output buffer");
    if (t->n <= 0) return t->n == 0 ? FSDP_OK : fsdp_err_set(err, FSDP_E_INVALID, "llama init: bad table");
    llama_init_job *jobs = calloc((size_t)t->n, sizeof *jobs);
    if (!jobs) return fsdp_err_set(err, FSDP_E_NOMEM, "llama init: out of memory for %d jobs", t->n);
    for (int i = 0; i < t->n; i++) {
        const llama_param *p = &t->p[i];
        jobs[i].p = p;
        jobs[i].r0 = 0;
        jobs[i].r1 = p->shape[0];
        if (f32) jobs[i].f32 = f32 + p->offset;
        else jobs[i].bf16 = bf16 + p->offset;
    }
    int rc = llama_init_jobs(jobs, t->n, seed, err);
    free(jobs);
    return rc;
}

int llama_init_model_f32(const llama_params *t, uint64_t seed, float *flat, fsdp_err *err) {
    return init_model(t, seed, flat, NULL, err);
}

int llama_init_model_bf16(const llama_params *t, uint64_t seed, uint16_t *flat, fsdp_err *err) {
    return init_model(t, seed, NULL, flat, err);
}
